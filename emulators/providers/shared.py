"""State that the processes of one simulator share: a lock, a meta page, a control journal.

A simulator run with ``--processes N`` (:mod:`emulators.providers.serving`) is N processes
serving one port; each keeps its own :class:`~emulators.providers.ledger.ProviderState`. What
must hold for all of them lives in one directory (the ``--state-dir``):

* ``lock``: ``flock`` serialises every change below (and the ledger files' appends).
* ``meta``: one page, mapped by every process: the committed length of the control journal,
  the next ledger ``seq``, the ledger epoch (bumped by a reset), and one slot per process for
  the ledger flush barrier (:meth:`SharedDir.wait_flushed`). The hot path reads one integer
  of it per request (has the journal grown?), no system call.
* ``journal.jsonl``: the control events (reset, unregistered tokens, faults started and
  stopped), appended under the lock; every process replays what it has not applied before it
  answers its next request, so a control call answered by one process holds for all of them
  from the next request on.
* ``counters``: shared per-window counters (the FCM ``quota`` fault counts one project's
  requests across every process).
* ``ledger/e<epoch>/*.arrow``: the ledger, one Arrow IPC stream per process
  (:mod:`emulators.providers.ledger_files`).

Written by hand because the pieces are small and specific: the standard library's
``multiprocessing`` objects need the processes to be its own children, and granian starts its
workers itself; a directory of plain files works for any process that is told its path.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import mmap
import os
import shutil
import struct
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

META_SIZE = 4096
MAGIC = 0x53494D4C45444752  # "SIMLEDGR"
_U64 = struct.Struct("<Q")
# meta offsets
OFF_MAGIC = 0
OFF_JOURNAL_LEN = 8
OFF_LEDGER_NEXT = 16
OFF_EPOCH = 24
SLOTS_AT = 64
SLOT_SIZE = 32  # pid, dirty generation, flushed generation, unused
MAX_SLOTS = (META_SIZE - SLOTS_AT) // SLOT_SIZE
# counters: open addressing on an 8-byte key hash; slot = hash, window, count
COUNTER_SLOTS = 4096
_COUNTER = struct.Struct("<QqQ")

STATE_DIR_ENV = "SIM_STATE_DIR"


class SharedStateError(RuntimeError):
    """The state directory is missing, foreign or full."""


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class SharedDir:
    """One simulator's shared directory, opened by one process.

    :meth:`create` makes it (the parent of the serving processes); every serving process
    opens it with the constructor and claims a slot.
    """

    def __init__(self, directory: Path | str) -> None:
        self.path = Path(directory)
        meta = self.path / "meta"
        if not meta.is_file():
            raise SharedStateError(f"{self.path} is not a simulator state directory (no meta)")
        self._lock_fd = os.open(self.path / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        self._meta_fd = os.open(meta, os.O_RDWR)
        self.meta = mmap.mmap(self._meta_fd, META_SIZE)
        if self._get(OFF_MAGIC) != MAGIC:
            raise SharedStateError(f"{meta} is not a simulator meta page")
        self._journal_fd = os.open(self.path / "journal.jsonl", os.O_RDWR | os.O_CREAT, 0o600)
        self._counters_fd = os.open(self.path / "counters", os.O_RDWR)
        self.counters = mmap.mmap(self._counters_fd, COUNTER_SLOTS * _COUNTER.size)
        self.slot: int | None = None
        self._locked = 0

    @classmethod
    def create(cls, directory: Path | str) -> SharedDir:
        """Make (or take over, emptied) ``directory`` as a fresh state directory and open it."""
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        page = bytearray(META_SIZE)
        _U64.pack_into(page, OFF_MAGIC, MAGIC)
        (path / "meta").write_bytes(bytes(page))
        (path / "journal.jsonl").write_bytes(b"")
        (path / "counters").write_bytes(bytes(COUNTER_SLOTS * _COUNTER.size))
        shutil.rmtree(path / "ledger", ignore_errors=True)  # a restarted simulator starts empty
        (path / "ledger").mkdir()
        (path / "ledger" / "e0").mkdir(exist_ok=True)
        return cls(path)

    def close(self) -> None:
        if self.slot is not None:
            self._set(self._slot_at(self.slot), 0)
            self.slot = None
        self.meta.close()
        self.counters.close()
        for fd in (self._lock_fd, self._meta_fd, self._journal_fd, self._counters_fd):
            os.close(fd)

    # -- meta page ----------------------------------------------------------------------------
    def _get(self, offset: int) -> int:
        return _U64.unpack_from(self.meta, offset)[0]

    def _set(self, offset: int, value: int) -> None:
        _U64.pack_into(self.meta, offset, value)

    def journal_length(self) -> int:
        """Committed bytes of the control journal (one unlocked read: the hot path's check)."""
        return _U64.unpack_from(self.meta, OFF_JOURNAL_LEN)[0]

    def epoch(self) -> int:
        return self._get(OFF_EPOCH)

    def ledger_next(self) -> int:
        return self._get(OFF_LEDGER_NEXT)

    def publish_ledger_next(self, value: int) -> None:
        """Rows below ``value`` are on disk (lock held: the writer that took them)."""
        assert self._locked, "publish_ledger_next needs the lock"
        self._set(OFF_LEDGER_NEXT, value)

    def ledger_dir(self, epoch: int | None = None) -> Path:
        return self.path / "ledger" / f"e{self.epoch() if epoch is None else epoch}"

    def new_epoch(self) -> int:
        """Start a new, empty ledger (a reset): ``seq`` counts from 0 again. Lock held."""
        assert self._locked, "new_epoch needs the lock"
        epoch = self._get(OFF_EPOCH) + 1
        self.ledger_dir(epoch).mkdir(parents=True, exist_ok=True)
        self._set(OFF_LEDGER_NEXT, 0)
        self._set(OFF_EPOCH, epoch)
        self.counters[:] = bytes(len(self.counters))
        return epoch

    # -- lock ---------------------------------------------------------------------------------
    @contextmanager
    def locked(self) -> Iterator[None]:
        """The directory's exclusive lock (re-entrant within this object)."""
        if self._locked:
            self._locked += 1
            try:
                yield
            finally:
                self._locked -= 1
            return
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        self._locked = 1
        try:
            yield
        finally:
            self._locked = 0
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    # -- per-process slots (ledger flush barrier) ------------------------------------------------
    def _slot_at(self, index: int) -> int:
        return SLOTS_AT + index * SLOT_SIZE

    def claim_slot(self) -> int:
        """This process's slot: a free one, or one whose process is gone."""
        pid = os.getpid()
        with self.locked():
            for index in range(MAX_SLOTS):
                at = self._slot_at(index)
                owner = self._get(at)
                if owner == pid or not _pid_alive(owner):
                    self._set(at, pid)
                    self._set(at + 8, 0)
                    self._set(at + 16, 0)
                    self.slot = index
                    return index
        raise SharedStateError(f"more than {MAX_SLOTS} processes share {self.path}")

    def mark_dirty(self) -> int:
        """This process buffered ledger rows not yet written; returns that generation."""
        assert self.slot is not None
        at = self._slot_at(self.slot) + 8
        generation = self._get(at) + 1
        self._set(at, generation)
        return generation

    def mark_flushed(self, generation: int) -> None:
        assert self.slot is not None
        self._set(self._slot_at(self.slot) + 16, generation)

    def wait_flushed(
        self, timeout: float = 2.0, sleep: Callable[[float], None] = time.sleep
    ) -> bool:
        """Until every live process has written the ledger rows it had buffered when this was
        called (each flushes within its flush interval). False when ``timeout`` ran out."""
        wanted: list[tuple[int, int, int]] = []
        for index in range(MAX_SLOTS):
            at = self._slot_at(index)
            pid = self._get(at)
            if pid:
                wanted.append((at, pid, self._get(at + 8)))
        deadline = time.monotonic() + timeout
        delay = 0.001
        while True:
            behind = [
                (at, pid, gen)
                for at, pid, gen in wanted
                if self._get(at) == pid and self._get(at + 16) < gen and _pid_alive(pid)
            ]
            if not behind:
                return True
            if time.monotonic() > deadline:
                return False
            sleep(delay)  # the processes flush on their own timers; bounded by the deadline
            delay = min(delay * 2, 0.01)
            wanted = behind

    def live_processes(self) -> list[int]:
        pids = []
        for index in range(MAX_SLOTS):
            pid = self._get(self._slot_at(index))
            if pid and _pid_alive(pid):
                pids.append(pid)
        return pids

    # -- control journal ------------------------------------------------------------------------
    def append_event(self, event: dict[str, Any]) -> None:
        """Append one control event (lock held); committed once the length is published."""
        assert self._locked, "append_event needs the lock"
        line = json.dumps(event, separators=(",", ":")).encode() + b"\n"
        end = self._get(OFF_JOURNAL_LEN)
        os.pwrite(self._journal_fd, line, end)
        self._set(OFF_JOURNAL_LEN, end + len(line))

    def read_events(self, start: int, end: int | None = None) -> tuple[list[dict[str, Any]], int]:
        """Committed events from byte ``start`` (to ``end``, default all); returns them and the
        offset after them."""
        end = self.journal_length() if end is None else end
        if end <= start:
            return [], start
        data = os.pread(self._journal_fd, end - start, start)
        return [json.loads(line) for line in data.splitlines() if line], start + len(data)

    # -- shared counters ----------------------------------------------------------------------------
    def count_in_window(self, key: str, window: int) -> int:
        """Add one to ``key``'s count in ``window`` (a new window starts at 1); returns it."""
        digest = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")
        digest = digest or 1  # 0 marks a free slot
        size = _COUNTER.size
        with self.locked():
            index = digest % COUNTER_SLOTS
            for _ in range(COUNTER_SLOTS):
                at = index * size
                slot_hash, slot_window, count = _COUNTER.unpack_from(self.counters, at)
                if slot_hash in (0, digest):
                    count = count + 1 if slot_hash == digest and slot_window == window else 1
                    _COUNTER.pack_into(self.counters, at, digest, window, count)
                    return count
                index = (index + 1) % COUNTER_SLOTS
        raise SharedStateError(f"more than {COUNTER_SLOTS} shared counters in {self.path}")
