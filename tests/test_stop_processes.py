"""Stopping a part: a part that stores what it buffered on SIGTERM gets to finish within the
grace, and one that does not stop in time is killed and named, so a run can say that its
buffer was lost instead of blaming the system under test for the missing records."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from harness.stack.supervisor import stop_processes, wait_until


def _start(script: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-c", script], start_new_session=True, stdout=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"  # handler set
    return proc


def test_a_part_that_flushes_slowly_on_sigterm_finishes_within_the_grace(tmp_path: Path):
    flushed = tmp_path / "flushed"
    slow_flush = (
        "import signal, sys, time\n"
        "def stop(*_):\n"
        "    time.sleep(1.5)  # a slow audit flush\n"
        f"    open({str(flushed)!r}, 'w').write('all of it')\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = _start(slow_flush)
    assert stop_processes([proc], timeout=20.0) == []
    assert flushed.read_text() == "all of it"
    assert proc.returncode == 0


def test_a_part_that_ignores_sigterm_is_killed_and_named():
    deaf = (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    quick = "import time\nprint('ready', flush=True)\ntime.sleep(60)\n"
    stubborn, polite = _start(deaf), _start(quick)
    assert stop_processes([stubborn, polite], timeout=1.0) == [stubborn]
    assert stubborn.returncode is not None and polite.returncode is not None


def test_a_reference_worker_killed_for_hanging_leaves_its_threads_tracebacks(tmp_path: Path):
    # A poller that never looks at its stop keeps run_pollers joining it past the grace: the
    # supervisor's SIGUSR1 before the kill makes the worker write where each thread was.
    ready, log = tmp_path / "ready", tmp_path / "worker.log"
    hung = (
        "import time\n"
        "from reference_impl.event_source import run_pollers\n"
        "def stuck_in_a_call(stop):\n"
        "    time.sleep(60)\n"
        f"run_pollers('hung', [stuck_in_a_call], {str(ready)!r})\n"
    )
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", hung], start_new_session=True, stderr=err,
            stdout=subprocess.DEVNULL, cwd=Path(__file__).resolve().parents[1],
        )  # fmt: skip
        wait_until(ready.exists, 20.0, "the worker to be ready")
        assert stop_processes([proc], timeout=1.0, dump=[proc]) == [proc]
    assert "stuck_in_a_call" in log.read_text()
