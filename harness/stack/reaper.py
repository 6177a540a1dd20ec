"""No orphans: every process group a run starts (the stack's parts, the load generator and its
Locust workers) is recorded in an ownership file beside its owner's identity, and is stopped
when the owner goes, however it goes.

* An ownership file (``.stack/owned/<pid>-<start>.json``) names the owner (the harness process:
  pid and kernel start time, so a reused pid is never mistaken for it) and each group (name,
  leader pid and start time). Written atomically at every change.
* A watchdog process (``python -m harness.stack.reaper watch FILE``, in a session of its own)
  polls the owner five times a second; when the owner is gone (kill -9 included), it stops every
  recorded group (SIGTERM, then SIGKILL after a grace) and removes the file.
* ``reap_orphans`` does the same for every file whose owner is gone: ``stack down`` and every
  run call it first, so even a watchdog that was itself killed leaves nothing behind for long.

Why by hand: a process that outlives its parent is what PR_SET_PDEATHSIG is for, but Linux
sends that signal when the *thread* that forked the child exits, and parts are restarted from
the nemesis's thread (a consumer crash): its end would kill them. A watchdog has no such edge.
Detached stacks (``stack up``) are meant to outlive the command and are not recorded here; the
stack file is their record.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OWNED_DIR = ROOT / ".stack" / "owned"
POLL_S = 0.2
GRACE_S = 2.0


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22), or
    None when there is no such process (or it is a zombie, as good as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: the fields follow the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":
        return None
    return int(fields[19])


def alive(pid: int, started: int | None) -> bool:
    return started is not None and start_time(pid) == started


class Ownership:
    """The record of what one owner started; a watchdog reaps it if the owner dies."""

    def __init__(self, directory: Path = OWNED_DIR, owner: int | None = None) -> None:
        self.owner = owner if owner is not None else os.getpid()
        self.owner_start = start_time(self.owner)
        self.path = Path(directory) / f"{self.owner}-{self.owner_start}.json"
        self.groups: dict[int, dict[str, object]] = {}
        self._watchdog: subprocess.Popen[bytes] | None = None

    def add(self, name: str, pid: int) -> None:
        self.groups[pid] = {"name": name, "pid": pid, "start": start_time(pid)}
        self._write()
        if self._watchdog is None:
            self._start_watchdog()

    def remove(self, pid: int) -> None:
        if self.groups.pop(pid, None) is not None:
            self._write()

    def close(self) -> None:
        """Everything recorded was stopped by its owner: no record, no watchdog."""
        self.groups.clear()
        self.path.unlink(missing_ok=True)
        if self._watchdog is not None:
            self._watchdog.terminate()
            self._watchdog.wait(5)
            self._watchdog = None

    def _write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        record = {"owner": self.owner, "owner_start": self.owner_start,
                  "groups": list(self.groups.values())}  # fmt: skip
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        tmp.replace(self.path)

    def _start_watchdog(self) -> None:
        self._watchdog = subprocess.Popen(
            [sys.executable, "-m", "harness.stack.reaper", "watch", str(self.path)],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )


def stop_groups(groups: Iterable[dict[str, object]], grace_s: float = GRACE_S) -> list[str]:
    """SIGTERM every recorded group that is still the process it was, then SIGKILL whatever
    has not gone after ``grace_s``; return the names stopped."""
    live = [g for g in groups if alive(int(g["pid"]), g.get("start"))]  # type: ignore[arg-type]
    for group in live:
        _signal(int(group["pid"]), signal.SIGTERM)  # type: ignore[call-overload]
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(
        alive(int(g["pid"]), g.get("start"))
        for g in live  # type: ignore[arg-type]
    ):
        time.sleep(0.05)
    for group in live:
        _signal(int(group["pid"]), signal.SIGKILL)  # type: ignore[call-overload]
    return [str(g["name"]) for g in live]


def _signal(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _read(path: Path) -> dict[str, object] | None:
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return record if isinstance(record, dict) else None


def reap(path: Path) -> list[str]:
    """Stop what ``path`` records and remove it (the owner is gone)."""
    record = _read(path)
    stopped = stop_groups(record.get("groups", [])) if record else []  # type: ignore[arg-type]
    path.unlink(missing_ok=True)
    return stopped


def reap_orphans(directory: Path = OWNED_DIR) -> list[str]:
    """Reap every ownership file whose owner is gone; return what was stopped."""
    stopped: list[str] = []
    for path in sorted(Path(directory).glob("*.json")):
        record = _read(path)
        if record is None:
            continue
        if alive(int(record.get("owner", -1)), record.get("owner_start")):  # type: ignore[arg-type]
            continue
        stopped += reap(path)
    return stopped


def watch(path: Path, poll_s: float = POLL_S) -> int:
    """Until ``path`` goes (its owner stopped everything) or its owner dies (then reap)."""
    record = _read(path)
    if record is None:
        return 0
    owner, started = int(record["owner"]), record.get("owner_start")  # type: ignore[arg-type]
    while path.exists():
        if not alive(owner, started):  # type: ignore[arg-type]
            reap(path)
            return 0
        time.sleep(poll_s)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.stack.reaper")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("watch").add_argument("path", type=Path)
    sub.add_parser("orphans").add_argument("--dir", type=Path, default=OWNED_DIR)
    args = parser.parse_args(argv)
    if args.command == "watch":
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        return watch(args.path)
    for name in reap_orphans(args.dir):
        print(f"stopped orphan {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
