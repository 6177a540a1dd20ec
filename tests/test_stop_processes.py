"""Stopping a part: a part that stores what it buffered on SIGTERM gets to finish within the
grace, and one that does not stop in time is killed and named, so a run can say that its
buffer was lost instead of blaming the system under test for the missing records."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from harness.stack.supervisor import stop_processes


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
