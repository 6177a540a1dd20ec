"""The shipped scenarios run unchanged under Chaos Toolkit's own runner (``chaos run``, PyPI
``chaostoolkit``) with the harness as its extension: the journal shows every steady-state
probe's verdict (the checker, valid, its counts) and the run directory is the harness's own.
Whole runs through the ``chaos`` command, as a Chaos Toolkit user runs them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import ROOT

from harness.chaostoolkit.control import run_options
from harness.chaostoolkit.session import action_record, fault_window, verdict_output
from harness.model.history import to_frame
from harness.model.scenarios import SCENARIO_DIR

CHAOS = shutil.which("chaos", path=str(Path(sys.executable).parent))


def _chaos_run(experiment: Path, tmp_path: Path, seed: int) -> tuple[int, dict, Path, str]:
    journal = tmp_path / "journal.json"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "HARNESS_OUT": str(tmp_path / "runs"),
        "HARNESS_SEED": str(seed),
        "HARNESS_NO_REPORT": "1",
    }
    result = subprocess.run(
        [CHAOS, "--no-log-file", "run", "--journal-path", str(journal), str(experiment)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=500,
    )
    output = result.stdout + result.stderr
    runs = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    assert len(runs) == 1, output
    return result.returncode, json.loads(journal.read_text()), runs[0], output


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.integration
@pytest.mark.wholerun
@pytest.mark.skipif(CHAOS is None, reason="chaostoolkit is not installed (pip install .[test])")
def test_chaos_run_runs_the_smoke_scenario_and_its_journal_shows_the_verdicts(tmp_path):
    code, journal, run_dir, output = _chaos_run(SCENARIO_DIR / "smoke.yaml", tmp_path, seed=3)
    assert code == 0, output
    assert journal["status"] == "completed" and journal["deviated"] is False, output
    assert journal["steady_states"]["before"] is None  # after-method-only, as the file says
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["verdict"] == "pass" and summary["seed"] == 3
    probes = journal["steady_states"]["after"]["probes"]
    assert [p["activity"]["name"] for p in probes] == list(summary["checkers"])
    for probe in probes:
        output_ = probe["output"]
        assert probe["status"] == "succeeded" and probe["tolerance_met"] is True
        assert output_["checker"] == probe["activity"]["name"]
        assert output_["verdict"] == "pass" and output_["valid"] is True
        assert output_ == {"checker": output_["checker"], "verdict": "pass",
                           **summary["checkers"][output_["checker"]]}  # fmt: skip
    once = probes[0]["output"]
    assert once["checker"] == "effectively_once" and once["expected"] > 0 and once["lost"] == 0
    # The load, then smoke's timed actions (malformed jobs at 1 s, probes posted again at 12 s).
    load, malformed, probes_again = journal["run"]
    assert load["output"]["run_dir"] == str(run_dir) and load["output"]["seed"] == 3
    assert malformed["activity"]["name"] == "inject-malformed-jobs at 1 s"
    assert malformed["status"] == "succeeded"
    assert probes_again["activity"]["name"] == "post-probes at 12 s"
    assert probes_again["status"] == "succeeded"
    stop = journal["rollbacks"][-1]
    assert stop["activity"]["name"] == "stop the harness run"
    assert stop["output"]["verdict"] == "pass" and stop["output"]["run_dir"] == str(run_dir)
    # The run left its record, and nothing running: not the run, not one part of its stack.
    assert (run_dir / "experiment.yaml").exists() and (run_dir / "harness.log").exists()
    assert _gone(load["output"]["pid"])
    history = pd.read_parquet(run_dir / "history.parquet")
    phases = [json.loads(d) for d in history[history["kind"] == "phase"]["detail"] if "{" in d]
    pids = next(p["stack_up"] for p in phases if "stack_up" in p)
    assert pids and all(_gone(pid) for pid in pids.values())


@pytest.mark.integration
@pytest.mark.wholerun
@pytest.mark.skipif(CHAOS is None, reason="chaostoolkit is not installed (pip install .[test])")
def test_a_broken_system_makes_the_chaos_toolkit_experiment_deviate(tmp_path):
    data = yaml.safe_load((SCENARIO_DIR / "smoke.yaml").read_text())
    data["configuration"]["reference"] = {"defects": ["deferral_acks_without_requeue"]}
    path = tmp_path / "smoke-broken.yaml"
    path.write_text(yaml.safe_dump(data))
    code, journal, run_dir, output = _chaos_run(path, tmp_path, seed=3)
    assert code == 1, output
    assert journal["deviated"] is True and journal["status"] == "completed", output
    # Chaos Toolkit stops at the first probe out of tolerance; the summary has them all.
    failed = journal["steady_states"]["after"]["probes"][-1]
    assert failed["tolerance_met"] is False and failed["output"]["verdict"] == "fail"
    assert failed["output"]["valid"] is False
    summary = journal["rollbacks"][-1]["output"]
    assert summary["verdict"] == "fail" and summary["run_dir"] == str(run_dir)
    assert summary["checkers"]["quiet_hours"]["deferred_never_released"] > 0


@pytest.mark.integration
@pytest.mark.wholerun
@pytest.mark.skipif(CHAOS is None, reason="chaostoolkit is not installed (pip install .[test])")
def test_sigterm_to_chaos_stops_the_run_and_plays_the_rollbacks(tmp_path):
    journal = tmp_path / "journal.json"
    log = tmp_path / "chaos.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HARNESS_OUT": str(tmp_path / "runs"),
           "HARNESS_SEED": "4", "HARNESS_NO_REPORT": "1"}  # fmt: skip
    argv = [CHAOS, "--no-log-file", "run", "--journal-path", str(journal),
            str(SCENARIO_DIR / "memorydb-outage.yaml")]  # fmt: skip
    with open(log, "w") as out:
        chaos = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=out, stderr=out)
    try:
        deadline = time.monotonic() + 120
        while "start dedup-outage" not in log.read_text():  # the fault is on: mid-experiment
            assert chaos.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)
        chaos.send_signal(signal.SIGTERM)
        assert chaos.wait(120) == 1, log.read_text()
    finally:
        if chaos.poll() is None:
            chaos.kill()
    result = json.loads(journal.read_text())
    assert result["status"] == "interrupted", log.read_text()
    assert result["steady_states"]["after"] is None  # nothing judged after an interruption
    stop = result["rollbacks"][-1]["output"]
    assert stop["verdict"] == "incomplete" and "SIGTERM" in stop["error"]
    run_dir = Path(stop["run_dir"])
    assert _gone(result["run"][0]["output"]["pid"])
    history = pd.read_parquet(run_dir / "history.parquet")
    phases = [json.loads(d) for d in history[history["kind"] == "phase"]["detail"] if "{" in d]
    pids = next(p["stack_up"] for p in phases if "stack_up" in p)
    assert pids and all(_gone(pid) for pid in pids.values())
    faults = [json.loads(d)["phase"] for d in history[history["kind"] == "fault"]["detail"]]
    assert faults == ["start", "stop"]  # the outage was undone


# -- what the activities read (pure) -------------------------------------------------------------


def _history(rows: list[dict]) -> pd.DataFrame:
    return to_frame([{"seq": i, "mono": 0.0, **r} for i, r in enumerate(rows)])


def _fault(window: str, name: str, phase: str, at: float) -> dict:
    detail = {"window": window, "fault": name, "phase": phase, "params": {}}
    return {"kind": "fault", "time": at, "detail": json.dumps(detail)}


def test_a_fault_step_finds_its_own_window_once_it_closed():
    rows = [
        _fault("a", "consumer-crash", "start", 100.0),
        _fault("a", "consumer-crash", "stop", 103.0),
        _fault("b", "consumer-crash", "start", 106.0),
    ]
    assert fault_window(_history(rows), "consumer-crash", 0)["duration_s"] == 3.0
    assert fault_window(_history(rows), "consumer-crash", 1) is None  # still open
    rows.append(_fault("b", "consumer-crash", "stop", 109.5))
    second = fault_window(_history(rows), "consumer-crash", 1)
    assert second["window"] == "b" and second["duration_s"] == 3.5
    assert fault_window(_history(rows), "dedup-outage", 0) is None


def test_an_action_step_finds_its_record_and_a_rollback_its_own():
    rows = [
        {"kind": "action", "time": 1.0, "detail": "redrive-dlq: moved 2 message(s) back ({})"},
        {"kind": "action", "time": 9.0, "detail": "rollback redrive-dlq: moved 0 message(s) back"},
    ]
    frame = _history(rows)
    assert action_record(frame, "redrive-dlq", 0)["result"].startswith("moved 2")
    assert action_record(frame, "redrive-dlq", 1) is None
    assert action_record(frame, "rollback redrive-dlq", 0)["result"].startswith("moved 0")


def test_a_probe_output_carries_the_verdict_the_tolerance_judges():
    summary = {"checkers": {"consent": {"valid": False, "deliveries_without_consent": 2}}}
    assert verdict_output("consent", summary) == {
        "checker": "consent",
        "verdict": "fail",
        "valid": False,
        "deliveries_without_consent": 2,
    }
    crashed = {"checkers": {}, "error": "stack part redis died"}
    assert verdict_output("consent", crashed)["verdict"] == "unknown"
    assert "redis died" in verdict_output("consent", crashed)["unknown"]


def test_the_environment_names_where_and_how_the_run_goes():
    env = {"HARNESS_OUT": "/tmp/x", "HARNESS_SEED": "9", "HARNESS_NO_REPORT": "1"}
    options = run_options(env, out="elsewhere", seed=1)
    assert options == {"out": Path("/tmp/x"), "seed": 9, "reports": False, "target": None}
    assert run_options({}, out="elsewhere")["out"] == Path("elsewhere")
    assert run_options({})["out"] == Path("reports") and run_options({})["seed"] is None
