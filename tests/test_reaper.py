"""The reaper: what an owner recorded is stopped when the owner dies, however it dies; a reused
pid is never mistaken for the process that was recorded."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from harness.model.history import History, read_partial
from harness.stack.reaper import Ownership, alive, reap_orphans, start_time

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


def _wait(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.05)


def _owner_script(directory: Path) -> str:
    return (
        "import subprocess, sys, time\n"
        "from pathlib import Path\n"
        "from harness.stack.reaper import Ownership\n"
        f"own = Ownership(Path({str(directory)!r}))\n"
        f"child = subprocess.Popen({SLEEPER!r}, start_new_session=True)\n"
        "own.add('sleeper', child.pid)\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(120)\n"
    )


def test_the_watchdog_stops_what_a_killed_owner_started(tmp_path):
    owner = subprocess.Popen(
        [sys.executable, "-c", _owner_script(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    child = int(owner.stdout.readline())
    started = start_time(child)
    assert alive(child, started)
    owner.kill()
    owner.wait()
    _wait(lambda: not alive(child, started), timeout=5)
    _wait(lambda: not any(tmp_path.glob("*.json")), timeout=5)


def test_reap_orphans_stops_the_groups_of_an_owner_that_is_gone(tmp_path):
    child = subprocess.Popen(SLEEPER, start_new_session=True)
    owner = subprocess.Popen([sys.executable, "-c", "pass"])
    owner.wait()
    record = Ownership(tmp_path, owner=os.getpid())
    record.owner, record.owner_start = owner.pid, 1  # an owner that no longer exists
    record.path = tmp_path / f"{owner.pid}-1.json"
    record.groups[child.pid] = {"name": "sleeper", "pid": child.pid, "start": start_time(child.pid)}
    record._write()
    assert reap_orphans(tmp_path) == ["sleeper"]
    assert child.wait(5) == -signal.SIGTERM
    assert not record.path.exists()


def test_a_reused_pid_is_not_the_recorded_process(tmp_path):
    child = subprocess.Popen(SLEEPER, start_new_session=True)
    try:
        assert alive(child.pid, start_time(child.pid))
        assert not alive(child.pid, (start_time(child.pid) or 0) + 1)
    finally:
        child.kill()
        child.wait()


def test_a_live_owners_record_is_left_alone(tmp_path):
    child = subprocess.Popen(SLEEPER, start_new_session=True)
    own = Ownership(tmp_path)
    try:
        own.add("sleeper", child.pid)
        assert reap_orphans(tmp_path) == []
        assert child.poll() is None
    finally:
        own.close()
        child.kill()
        child.wait()
    assert not own.path.exists()


def test_a_torn_history_stream_keeps_every_whole_batch(tmp_path):
    history = History()
    path = tmp_path / "history.arrows"
    history.stream_to(path, interval_s=60)
    for n in range(3):
        history.append("inject", tenant_id="t", notification_id=f"n{n}")
        history.flush()
    torn = tmp_path / "torn.arrows"
    torn.write_bytes(path.read_bytes()[:-10])  # killed in the middle of the last batch
    assert list(read_partial(path)["notification_id"]) == ["n0", "n1", "n2"]
    assert list(read_partial(torn)["notification_id"]) == ["n0", "n1"]
    history.close_stream()
