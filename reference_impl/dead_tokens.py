"""Recently dead tokens, shared by every poller of a consumer: threads and forked processes.

A token that answered dead is deactivated in its user's record, and every batch reads the
records afresh, so the next batch does not try it. But pollers run side by side: a batch that
read the record just before another poller's dead answer would send to the token again, after
the answer left the provider, and that send is one a dead token must never get. So each poller
also remembers the dead answers of the last :data:`REMEMBER_SECONDS` here, and checks right
before every send (a few microseconds, no I/O). After that, the deactivated record decides (a
token registered again is tried again).

The table lives in an anonymous shared memory map, made before the consumer forks its worker
processes, so a dead answer in one worker stops the sends of the others too. Open addressing
over :data:`SLOTS` slots of (fingerprint, expiry); writers take a lock, readers do not (a torn
read can only miss an entry written in that same microsecond).
"""

from __future__ import annotations

import hashlib
import mmap
import multiprocessing
import struct
import time
from collections.abc import Callable

SLOTS = 1 << 16
PROBES = 8
REMEMBER_SECONDS = 60.0
_SLOT = struct.Struct("<Qd")  # fingerprint (0 = empty), expiry (monotonic seconds)


def fingerprint(tenant_id: str, recipient: str) -> int:
    """A nonzero 64-bit fingerprint of a (tenant, recipient) pair."""
    digest = hashlib.blake2b(f"{tenant_id}\x00{recipient}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") or 1


class DeadTokens:
    """Make one before forking; every thread and forked child then shares it."""

    def __init__(
        self,
        remember_seconds: float = REMEMBER_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # CLOCK_MONOTONIC is system-wide on Linux: one clock for every process sharing the map.
        self.remember_seconds = remember_seconds
        self.clock = clock
        self._map = mmap.mmap(-1, SLOTS * _SLOT.size)  # anonymous, MAP_SHARED: kept over fork
        self._lock = multiprocessing.get_context("fork").Lock()

    def add(self, tenant_id: str, recipient: str) -> None:
        """Remember that this recipient's token answered dead."""
        key = fingerprint(tenant_id, recipient)
        expiry = self.clock() + self.remember_seconds
        now = self.clock()
        with self._lock:
            oldest, oldest_at = 0, float("inf")
            for probe in range(PROBES):
                slot = (key + probe) % SLOTS
                found, until = _SLOT.unpack_from(self._map, slot * _SLOT.size)
                if found in (0, key) or until <= now:
                    oldest = slot
                    break
                if until < oldest_at:
                    oldest, oldest_at = slot, until
            # Expiry first, then the fingerprint: a reader sees a whole entry or none.
            struct.pack_into("<d", self._map, oldest * _SLOT.size + 8, expiry)
            struct.pack_into("<Q", self._map, oldest * _SLOT.size, key)

    def dead(self, tenant_id: str, recipient: str) -> bool:
        """Whether this recipient's token answered dead in the last ``remember_seconds``."""
        key = fingerprint(tenant_id, recipient)
        now = self.clock()
        for probe in range(PROBES):
            slot = (key + probe) % SLOTS
            found, until = _SLOT.unpack_from(self._map, slot * _SLOT.size)
            if found == key:
                return until > now
            if found == 0:
                return False
        return False
