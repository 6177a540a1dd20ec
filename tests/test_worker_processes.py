"""A part served by several forked worker processes (reference_impl/worker_processes.py): all in
the part's process group, ready once every worker is, a crashed worker replaced, SIGTERM stops
them all and waits for each, a worker that dies at start stops the part."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness.stack.supervisor import wait_until

ROOT = Path(__file__).resolve().parent.parent

WORKER = textwrap.dedent(
    """
    import json, os, signal, sys, time
    from pathlib import Path
    from reference_impl.worker_processes import serve_forked

    out = Path(sys.argv[1])
    mode = sys.argv[2]

    def run(ready):
        if mode == "die-at-start":
            return 3
        stop = []
        signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
        if ready:
            Path(ready).write_text(json.dumps({"threads": 2}))
        while not stop:  # a worker's poll loop, until SIGTERM
            time.sleep(0.05)
        (out / f"stopped-{os.getpid()}").write_text("")  # a clean stop's last word
        return 0

    sys.exit(serve_forked(2, run, str(out / "part.ready"), "test-part", min_uptime_s=1.0))
    """
)


def _start(tmp_path: Path, mode: str = "serve") -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, str(tmp_path), mode],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _group(pgid: int) -> set[int]:
    members = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.add(int(entry))
    return members


@pytest.mark.integration
def test_workers_run_in_the_group_are_replaced_and_stop_with_the_part(tmp_path: Path):
    proc = _start(tmp_path)
    try:
        ready = tmp_path / "part.ready"
        wait_until(ready.exists, 30, "the part's ready file")
        assert json.loads(ready.read_text()) == {
            "name": "test-part",
            "processes": 2,
            "threads": 4,
        }
        assert not list(tmp_path.glob("part.ready.*"))  # the workers' own files are gone
        workers = _group(proc.pid) - {proc.pid}
        assert len(workers) == 2
        time.sleep(1.2)  # past min_uptime_s: a crash now is replaced, not fatal
        victim = min(workers)
        os.kill(victim, signal.SIGKILL)
        wait_until(
            lambda: len(_group(proc.pid) - {proc.pid, victim}) == 2, 30, "a replacement worker"
        )
        workers = _group(proc.pid) - {proc.pid}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert {int(p.name.split("-")[1]) for p in tmp_path.glob("stopped-*")} == workers
        assert _group(proc.pid) == set()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@pytest.mark.integration
def test_a_worker_that_dies_at_start_stops_the_part(tmp_path: Path):
    proc = _start(tmp_path, "die-at-start")
    try:
        assert proc.wait(30) == 3
        assert not (tmp_path / "part.ready").exists()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@pytest.mark.integration
def test_kill_of_the_group_takes_every_worker(tmp_path: Path):
    """The consumer-crash fault's kill -9 of the part: nothing of it survives."""
    proc = _start(tmp_path)
    try:
        wait_until((tmp_path / "part.ready").exists, 30, "the part's ready file")
        assert len(_group(proc.pid)) == 3
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        wait_until(lambda: not _group(proc.pid), 10, "every worker gone")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def test_a_worker_ready_file_seen_before_its_write_is_not_ready_yet(tmp_path: Path):
    from reference_impl.worker_processes import _ready_threads

    first, second = tmp_path / "part.ready.0", tmp_path / "part.ready.1"
    first.write_text(json.dumps({"threads": 2}))
    second.write_text("")  # created, not yet written: what CI once read as 0 threads
    assert _ready_threads([first, second]) is None
    second.write_text(json.dumps({"threads": 2}))
    assert _ready_threads([first, second]) == 4
