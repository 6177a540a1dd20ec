"""Deadlines by key, shared by every thread and forked process of a consumer.

What one poller learns from a provider answer must hold for every poller of the consumer at
once: a token that answered dead (:mod:`reference_impl.dead_tokens`), a scope paused by a
Retry-After (:class:`reference_impl.providers.ProviderGate`). Threads share memory; the forked
worker processes share this table, an anonymous shared memory map made before the fork. Each
check is a lookup (a few microseconds, no I/O), so it can sit right before every send.

Open addressing over ``slots`` slots of (64-bit fingerprint of the key, deadline on the
monotonic clock, which Linux keeps system-wide); writers take a lock, readers do not (a torn
read can only miss an entry written in that same microsecond). A full neighbourhood overwrites
its earliest deadline.
"""

from __future__ import annotations

import hashlib
import mmap
import multiprocessing
import struct
import time
from collections.abc import Callable

PROBES = 8
_SLOT = struct.Struct("<Qd")  # fingerprint (0 = empty), deadline (monotonic seconds)


def fingerprint(key: str) -> int:
    """A nonzero 64-bit fingerprint of ``key``."""
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") or 1


class SharedDeadlines:
    """Make one before forking; every thread and forked child then shares it."""

    def __init__(self, slots: int = 1 << 16, clock: Callable[[], float] = time.monotonic) -> None:
        self.slots = slots
        self.clock = clock
        self._map = mmap.mmap(-1, slots * _SLOT.size)  # anonymous, MAP_SHARED: kept over fork
        self._lock = multiprocessing.get_context("fork").Lock()

    def extend(self, key: str, deadline: float) -> None:
        """Set ``key``'s deadline to ``deadline``, unless it already runs later."""
        fp = fingerprint(key)
        with self._lock:
            target, current = self._slot_for(fp, self.clock())
            if current is not None and current >= deadline:
                return
            self._write(target, fp, deadline)

    def reserve(self, key: str, interval: float) -> float:
        """The next free instant of a pace kept under ``key``: now, or the instant the last
        reservation left free if that is later; the one after is ``interval`` later. Every
        thread and process of the consumer draws from the same pace, so that together they
        keep to one rate (a provider's quota is the consumer's, not each process's)."""
        fp = fingerprint(key)
        now = self.clock()
        with self._lock:
            target, current = self._slot_for(fp, now)
            at = now if current is None else max(now, current)
            self._write(target, fp, at + interval)
            return at

    def _slot_for(self, fp: int, now: float) -> tuple[int, float | None]:
        """The slot for fingerprint ``fp`` (the lock held): its own, with its deadline; else an
        empty or expired one in its neighbourhood, else the one with the earliest deadline."""
        target, earliest = -1, float("inf")
        for probe in range(PROBES):
            slot = (fp + probe) % self.slots
            found, until = _SLOT.unpack_from(self._map, slot * _SLOT.size)
            if found == fp:
                return slot, until
            if found == 0 or until <= now:
                return slot, None
            if until < earliest:
                target, earliest = slot, until
        return target, None

    def _write(self, slot: int, fp: int, deadline: float) -> None:
        # The deadline first, then the fingerprint: a reader sees a whole entry or none.
        struct.pack_into("<d", self._map, slot * _SLOT.size + 8, deadline)
        struct.pack_into("<Q", self._map, slot * _SLOT.size, fp)

    def deadline(self, key: str) -> float:
        """``key``'s deadline; 0.0 when it has none."""
        fp = fingerprint(key)
        for probe in range(PROBES):
            slot = (fp + probe) % self.slots
            found, until = _SLOT.unpack_from(self._map, slot * _SLOT.size)
            if found == fp:
                return until
            if found == 0:
                return 0.0
        return 0.0

    def left(self, key: str) -> float:
        """Seconds until ``key``'s deadline; 0.0 when it has passed or there is none."""
        return max(0.0, self.deadline(key) - self.clock())
