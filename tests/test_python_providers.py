"""A scenario that names a team's own Python functions (defined below, in this module) for a
fault, an action, a rollback and probes runs through ``python -m harness run``: the fault is
started with the chaos targets and undone by what it returned, its window is in the history like
a catalogue fault's, the action gets the run's context, and each probe's verdict is in
summary.json (a value judged by its Chaos Toolkit tolerance, a Verdict, a failure, a crash).
"""

from __future__ import annotations

import json
import os
import ssl
from pathlib import Path

import httpx
import pandas as pd
import pytest
import yaml
from conftest import ROOT, run_cli

from chaos.faults import ChaosTargets
from harness.checkers.verdict import Verdict
from harness.model import history as history_mod

MODULE = "test_python_providers"
SLOW_MS = 300

# -- the team's functions -----------------------------------------------------------------------


def slow_apns(targets: ChaosTargets, ms: int) -> object:
    """APNs answers ``ms`` late: through the simulator's fault API, as a team's own tool would."""
    assert isinstance(targets, ChaosTargets)
    verify = (
        ssl.create_default_context(cafile=targets.apns_ca_file) if targets.apns_ca_file else True
    )
    client = httpx.Client(base_url=targets.apns_url, verify=verify, timeout=10)
    answer = client.post("/_sim/faults", json={"fault": "latency", "params": {"ms": ms}})
    answer.raise_for_status()
    fault_id = answer.json()["id"]

    def undo() -> None:
        client.delete(f"/_sim/faults/{fault_id}").raise_for_status()
        client.close()

    return undo


def count_users(context, label: str) -> str:
    return f"{label}: {len(context.population.users)} users"


def _window(history: pd.DataFrame, fault: str) -> tuple[float, float] | None:
    rows = history[history["kind"] == "fault"]
    times = {json.loads(r.detail)["phase"]: float(r.time) for r in rows.itertuples()
             if json.loads(r.detail)["fault"] == fault}  # fmt: skip
    return (times["start"], times["stop"]) if {"start", "stop"} <= set(times) else None


def late_share(evidence, fault: str, ms: int) -> float:
    """The share of APNs requests received inside the fault's window answered ``ms`` late."""
    start, stop = _window(evidence.history, fault)
    h = evidence.history
    apns = h[(h["kind"] == "provider") & (h["provider"] == "apns")]
    inside = apns[(apns["time"] >= start) & (apns["time"] <= stop - ms / 1000)]
    if not len(inside):
        return 0.0
    return float(((inside["end"] - inside["time"]) >= ms / 1000 * 0.9).mean())


def window_recorded(evidence, tolerance, fault: str) -> Verdict:
    window = _window(evidence.history, fault)
    length = window[1] - window[0] if window else 0.0
    valid = window is not None and length >= tolerance["min_s"]
    return Verdict("ignored", valid, {"windows": int(window is not None)}, {"seconds": length})


def users(evidence) -> int:
    return len(evidence.population.users)


def explodes(evidence) -> bool:
    raise RuntimeError("the team's probe has a bug")


# -- the run ------------------------------------------------------------------------------------


def _python(func: str, **arguments: object) -> dict:
    return {"type": "python", "module": MODULE, "func": func, "arguments": arguments}


SCENARIO = {
    "title": "team-functions",
    "description": "a team's fault, action and probes, named by module and function",
    "configuration": {"timeout_s": 90},
    "steady-state-hypothesis": {
        "title": "the team's promises",
        "probes": [
            {"name": "effectively_once"},
            {
                "name": "answers-were-late",
                "provider": _python("late_share", fault="slow-apns", ms=SLOW_MS),
                "tolerance": {"type": "range", "range": [0.9, 1.0]},
            },
            {
                "name": "window-recorded",
                "provider": _python("window_recorded", fault="slow-apns"),
                "tolerance": {"min_s": 9},
            },
            {"name": "few-users", "provider": _python("users"), "tolerance": [0, 10]},
            {"name": "buggy", "provider": _python("explodes")},
        ],
    },
    "method": [
        {"type": "load", "regular_posts": 1, "celebrity_posts": 1},
        {
            "type": "fault",
            "name": "slow-apns",
            "offset_s": 0,
            "duration_s": 10,
            "provider": _python("slow_apns", ms=SLOW_MS),
        },
        {
            "type": "action",
            "name": "count",
            "offset_s": 1,
            "provider": _python("count_users", label="mid-run"),
        },
    ],
    "rollbacks": [
        {"type": "action", "name": "count-again", "provider": _python("count_users", label="end")}
    ],
}


@pytest.mark.integration
@pytest.mark.wholerun
def test_a_run_calls_the_teams_functions_and_judges_their_probes(tmp_path: Path):
    path = tmp_path / "team.yaml"
    path.write_text(yaml.safe_dump(SCENARIO, sort_keys=False))
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    out = tmp_path / "runs"
    result = run_cli(
        "run", str(path), "--seed", "5", "--out", str(out), "--no-report", env=env, timeout=400
    )
    output = result.stdout + result.stderr
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    summary = json.loads((run_dir / "summary.json").read_text())
    checkers = summary["checkers"]
    # One probe fails by design (240 users is not in [0, 10]): the run fails, exit 1.
    assert result.returncode == 1, output
    assert summary["verdict"] == "fail" and summary["error"] is None, output
    assert checkers["effectively_once"]["valid"] is True
    late = checkers["answers-were-late"]
    assert late["valid"] is True and late["value"] >= 0.9, late
    assert late["provider"] == f"{MODULE}.late_share"
    recorded = checkers["window-recorded"]
    assert recorded["valid"] is True and recorded["windows"] == 1 and recorded["seconds"] >= 9
    assert checkers["few-users"]["valid"] is False and checkers["few-users"]["value"] == 240
    assert checkers["buggy"]["valid"] is None
    assert "RuntimeError: the team's probe has a bug" in checkers["buggy"]["unknown"]

    history = history_mod.read(run_dir / "history.parquet")
    faults = [json.loads(d) for d in history[history["kind"] == "fault"]["detail"]]
    assert [(f["fault"], f["phase"]) for f in faults] == [
        ("slow-apns", "start"),
        ("slow-apns", "stop"),
    ]
    assert faults[0]["origin"] == f"{MODULE}.slow_apns" and faults[0]["params"] == {"ms": SLOW_MS}
    actions = list(history[history["kind"] == "action"]["detail"])
    assert "count: mid-run: 240 users" in actions
    assert "rollback count-again: end: 240 users" in actions
    assert "stop slow-apns" in output  # the nemesis's log line: the undo ran at the window's end
