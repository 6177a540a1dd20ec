"""A run interrupted as game days are (Ctrl-C, a cancelled CI job, an OOM kill) leaves no
process behind and a history that says what happened; its verdict is incomplete, never pass
or fail.

Whole runs through the CLI, a real stack and a Locust load generator with its own process group.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT

from harness.model.history import STREAM_FILE, read_partial
from harness.stack.reaper import OWNED_DIR

pytestmark = [pytest.mark.integration, pytest.mark.wholerun]


def _start(out: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness",
            "run",
            "read-side",
            "--seed",
            "3",
            "--out",
            str(out),
            "--no-report",
        ],  # fmt: skip
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_for_fault(proc: subprocess.Popen[str], timeout: float = 120) -> list[str]:
    """Read the run's progress until the Locust load is under way and its fault is on."""
    lines = []
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if "start kinesis-shard-hold" in line:
            return lines
        assert time.monotonic() < deadline, "".join(lines)
    raise AssertionError("the run ended before its fault started:\n" + "".join(lines))


def _groups(run_dir: Path) -> dict[str, int]:
    """Every process group the run recorded starting (stack parts, the load generator)."""
    return _recorded_groups(read_partial(run_dir / STREAM_FILE))


def _recorded_groups(history) -> dict[str, int]:
    groups: dict[str, int] = {}
    for detail in history.loc[history["kind"] == "phase", "detail"].dropna():
        if detail.startswith("{"):
            data = json.loads(detail)
            groups |= data.get("stack_up", {})
            if "loadgen" in data:
                groups["loadgen"] = data["loadgen"]
    return groups


def _alive(groups: dict[str, int]) -> list[str]:
    alive = []
    for name, pgid in groups.items():
        try:
            os.killpg(pgid, 0)
            alive.append(name)
        except ProcessLookupError:
            pass
    return alive


def test_kill_9_of_the_harness_leaves_no_process_and_a_readable_history(tmp_path):
    proc = _start(tmp_path)
    _wait_for_fault(proc)
    time.sleep(1.5)  # the history streams every second
    proc.kill()
    proc.wait(10)
    [run_dir] = [p for p in tmp_path.iterdir() if p.is_dir()]
    groups = _groups(run_dir)
    assert "loadgen" in groups and "push-consumer" in groups and "redis" in groups
    deadline = time.monotonic() + 5
    while _alive(groups) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _alive(groups) == []
    assert not any(OWNED_DIR.glob(f"{proc.pid}-*.json"))
    history = read_partial(run_dir / STREAM_FILE)
    kinds = set(history["kind"])
    assert {"inject", "provider", "read", "fault"} <= kinds, kinds
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["verdict"] == "incomplete"
    report = subprocess.run(
        [sys.executable, "-m", "harness", "report", str(run_dir)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert report.returncode == 0, report.stderr
    md = (run_dir / "report.md").read_text()
    assert md.startswith("# INCOMPLETE") and "Partial report" in md


def _wait_for(proc: subprocess.Popen[str], text: str, timeout: float = 30) -> list[str]:
    lines = []
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if text in line:
            return lines
        assert time.monotonic() < deadline, "".join(lines)
    raise AssertionError(f"the run ended before {text!r}:\n" + "".join(lines))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_sigint_and_sigterm_stop_the_run_within_five_seconds(tmp_path, sig):
    proc = _start(tmp_path)
    _wait_for_fault(proc)
    if sig == signal.SIGINT:
        # The first Ctrl-C during the load is the safety lever (the drill is ended, drained
        # and judged); the second quits at once.
        proc.send_signal(sig)
        _wait_for(proc, "STOP: safety lever (Ctrl-C)")
    sent = time.monotonic()
    proc.send_signal(sig)
    output, _ = proc.communicate(timeout=30)
    took = time.monotonic() - sent
    assert took < 5, output
    assert proc.returncode == 3, output
    assert f"interrupted by {sig.name}" in output and "verdict: INCOMPLETE" in output
    [run_dir] = [p for p in tmp_path.iterdir() if p.is_dir()]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["verdict"] == "incomplete" and summary["error"] == f"interrupted by {sig.name}"
    assert (run_dir / "history.parquet").exists()
    from harness.model.history import read

    history = read(run_dir / "history.parquet")
    groups = _recorded_groups(history)
    assert "loadgen" in groups and _alive(groups) == []
    # The faults were undone: every fault window that started also stopped.
    faults = [json.loads(d) for d in history.loc[history["kind"] == "fault", "detail"]]
    started = {f["window"] for f in faults if f["phase"] == "start"}
    stopped = {f["window"] for f in faults if f["phase"] == "stop"}
    assert started and started == stopped


def test_one_ctrl_c_during_the_load_ends_the_drill_judged_and_aborted(tmp_path):
    # The safety lever: the load stops, the faults roll back, what was accepted is drained and
    # judged, and the run ends aborted (exit 4) naming the lever, with no process left.
    proc = _start(tmp_path)
    _wait_for_fault(proc)
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 4, output
    [run_dir] = [p for p in tmp_path.iterdir() if p.is_dir()]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["verdict"] == "aborted", output
    assert summary["stopped"]["condition"] == "safety lever (Ctrl-C)"
    assert summary["checkers"] and summary["error"] is None, output
    from harness.model.history import read

    history = read(run_dir / "history.parquet")
    faults = [json.loads(d) for d in history.loc[history["kind"] == "fault", "detail"]]
    started = {f["window"] for f in faults if f["phase"] == "start"}
    stopped = {f["window"] for f in faults if f["phase"] == "stop"}
    assert started and started == stopped
    groups = _recorded_groups(history)
    assert "loadgen" in groups and _alive(groups) == []
