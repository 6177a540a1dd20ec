"""What the strict FCM simulator remembers between sends: its switch, the project quota, the
per-project and per-device counts, and the secret its OAuth2 access tokens are signed with.

Google's documented limits (Firebase docs, "FCM throttling and quotas"):

* per project: 600,000 messages a minute by default (``--project-quota-per-minute`` or
  ``PUT /_sim/project-quota`` scale it); "quotas are per-minute, but these minutes are not
  aligned to the clock", so a project's minute starts with its first message after the last
  one ended;
* per device (registration token): 240 messages a minute and 5,000 an hour, each a window
  that starts with the device's first message after the last window ended; a message refused
  by a window is not counted;
* collapsible messages: "a burst of 20 messages per app per device, with a refill of 1
  message every 3 minutes" (a token bucket). Google delays a collapsible message over the
  burst rather than refusing it; a delayed message does not take the refill here (it may well
  be collapsed into a later one before it goes out).

Two stores of the same behaviour: :class:`LocalLimits` (one process, in memory) and
:class:`SharedLimits` (every serving process of one simulator: a file ``fcm-limits`` in the
simulator's :class:`~emulators.providers.shared.SharedDir`, mapped by each process and changed
under ``flock``). The shared counters of :meth:`SharedDir.count_in_window` do not fit: fixed
windows on one origin for all keys, no token bucket, and 4,096 slots for every key, where a
fan-out meets one key per device. A reset (``POST /_sim/reset``) starts a new epoch of the
shared directory: the file's table is emptied and its settings return to the start-up ones the
first time a process sees the new epoch.
"""

from __future__ import annotations

import fcntl
import hashlib
import math
import mmap
import os
import secrets
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from emulators.providers.shared import SharedDir

MINUTE = 60.0
HOUR = 3600.0
DEFAULT_PROJECT_QUOTA_PER_MINUTE = 600_000
DEVICE_PER_MINUTE = 240
DEVICE_PER_HOUR = 5_000
COLLAPSIBLE_BURST = 20
COLLAPSIBLE_REFILL_SECONDS = 180.0

# the answers of LocalLimits.admit_device / SharedLimits.admit_device
SENT = "sent"
#: over 240 in the device's minute: refused
DEVICE_MINUTE = "device_minute"
#: over 5,000 in the device's hour: refused
DEVICE_HOUR = "device_hour"
#: accepted, but over the collapsible burst: Google delivers it late (or collapses it)
COLLAPSIBLE_THROTTLED = "collapsible_throttled"

LIMITS_FILE = "fcm-limits"
SECRET_FILE = "fcm-oauth-secret"
SECRET_BYTES = 32

# An entry: minute window (start, count), hour window (start, count), collapsible bucket's
# theoretical arrival time (GCRA: the bucket is full when it is not after now).
_EMPTY = (-math.inf, 0.0, -math.inf, 0.0, -math.inf)
_T = TypeVar("_T")


@dataclass(frozen=True)
class Settings:
    """What the switch and the project quota say now."""

    strict: bool
    project_quota_per_minute: int


def _updated(settings: Settings, strict: bool | None, quota: int | None) -> Settings:
    return Settings(
        settings.strict if strict is None else strict,
        settings.project_quota_per_minute if quota is None else quota,
    )


def _roll(entry: list[float], at: int, now: float, length: float) -> None:
    """Start a new window at ``now`` when the one at ``entry[at]`` has ended."""
    if now - entry[at] >= length:
        entry[at] = now
        entry[at + 1] = 0.0


def take_project(entry: list[float], now: float, limit: int) -> bool:
    """Count one message of a project against its minute; False (not counted) when over."""
    _roll(entry, 0, now, MINUTE)
    if entry[1] >= limit:
        return False
    entry[1] += 1
    return True


def take_device(entry: list[float], now: float, collapsible: bool) -> str:
    """Count one message to a device: :data:`SENT`, :data:`COLLAPSIBLE_THROTTLED` (both
    counted) or :data:`DEVICE_MINUTE` / :data:`DEVICE_HOUR` (refused, not counted)."""
    _roll(entry, 0, now, MINUTE)
    _roll(entry, 2, now, HOUR)
    if entry[1] >= DEVICE_PER_MINUTE:
        return DEVICE_MINUTE
    if entry[3] >= DEVICE_PER_HOUR:
        return DEVICE_HOUR
    entry[1] += 1
    entry[3] += 1
    if not collapsible:
        return SENT
    arrival = max(entry[4], now) + COLLAPSIBLE_REFILL_SECONDS
    if arrival - now > COLLAPSIBLE_BURST * COLLAPSIBLE_REFILL_SECONDS:
        return COLLAPSIBLE_THROTTLED
    entry[4] = arrival
    return SENT


def _idle(entry: tuple[float, ...] | list[float], now: float) -> bool:
    """Nothing in the entry still counts: it may be forgotten."""
    return now - entry[0] >= MINUTE and now - entry[2] >= HOUR and entry[4] <= now


class LocalLimits:
    """The limits of a simulator that is one process (a state made in-process)."""

    def __init__(self, settings: Settings) -> None:
        self.defaults = settings
        self._settings = settings
        self._entries: dict[str, list[float]] = {}
        self._lock = threading.Lock()

    def settings(self) -> Settings:
        return self._settings

    def update(
        self, *, strict: bool | None = None, project_quota_per_minute: int | None = None
    ) -> Settings:
        """Change the switch and/or the project quota until the next reset; the settings now."""
        with self._lock:
            self._settings = _updated(self._settings, strict, project_quota_per_minute)
            return self._settings

    def reset(self) -> None:
        """A simulator reset: counts forgotten, the start-up settings again."""
        with self._lock:
            self._entries.clear()
            self._settings = self.defaults

    def _entry(self, key: str, now: float) -> list[float]:
        entry = self._entries.get(key)
        if entry is None:
            if len(self._entries) >= 100_000:  # forget what no longer counts
                for old in [k for k, e in self._entries.items() if _idle(e, now)]:
                    del self._entries[old]
            entry = self._entries[key] = list(_EMPTY)
        return entry

    def admit_project(self, project: str, now: float, limit: int) -> bool:
        with self._lock:
            return take_project(self._entry(f"p\0{project}", now), now, limit)

    def admit_device(self, token: str, now: float, collapsible: bool) -> str:
        with self._lock:
            return take_device(self._entry(f"d\0{token}", now), now, collapsible)


# -- the shared file ------------------------------------------------------------------------------
_U64 = struct.Struct("<Q")
_MAGIC = 0x53494D46434D4C49  # "SIMFCMLI"
HEADER_SIZE = 4096
OFF_MAGIC = 0
OFF_TABLE_EPOCH = 8  # the shared epoch the table's counts belong to
OFF_SETTINGS_EPOCH = 16  # the shared epoch the settings below were set in, plus one (0: none)
OFF_STRICT = 24
OFF_QUOTA = 32
_SLOT = struct.Struct("<Qddddd")  # key hash, then the entry
SLOTS = 1 << 18  # 12 MiB, a sparse file: pages are only taken as keys land on them
PROBES = 32


def _key_hash(key: str) -> int:
    digest = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")
    return digest or 1  # 0 marks a free slot


class SharedLimits:
    """The limits shared by every serving process of one simulator (see the module doc).

    The table is open addressing over :data:`SLOTS` slots; a slot whose entry no longer
    counts is reused. Past that (more than about 260,000 devices active within an hour), the
    least recently active of the probed slots is forgotten: counting is exact below that."""

    def __init__(self, shared: SharedDir, defaults: Settings) -> None:
        self.shared = shared
        self.defaults = defaults
        self._fd = os.open(shared.path / LIMITS_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        self._lock = threading.Lock()
        size = HEADER_SIZE + SLOTS * _SLOT.size
        with self._locked():
            if os.fstat(self._fd).st_size < size:
                os.ftruncate(self._fd, size)  # a sparse file of zeros
            self.map = mmap.mmap(self._fd, size)
            if self._get(OFF_MAGIC) != _MAGIC:
                self._clear_table()
                self._set(OFF_SETTINGS_EPOCH, 0)
                self._set(OFF_MAGIC, _MAGIC)

    def close(self) -> None:
        self.map.close()
        os.close(self._fd)

    def _get(self, offset: int) -> int:
        return _U64.unpack_from(self.map, offset)[0]

    def _set(self, offset: int, value: int) -> None:
        _U64.pack_into(self.map, offset, value)

    def _locked(self) -> _FileLock:
        return _FileLock(self._lock, self._fd)

    def _clear_table(self) -> None:
        """Empty the table (lock held) without touching its pages: cut the file to its header
        and grow it back; no process reads the table without the lock."""
        os.ftruncate(self._fd, HEADER_SIZE)
        os.ftruncate(self._fd, HEADER_SIZE + SLOTS * _SLOT.size)
        self._set(OFF_TABLE_EPOCH, self.shared.epoch())

    # -- settings (read without the lock: only a reset or a control call changes them) ------------
    def settings(self) -> Settings:
        if self._get(OFF_SETTINGS_EPOCH) != self.shared.epoch() + 1:
            return self.defaults  # none set since the last reset
        return Settings(bool(self._get(OFF_STRICT)), self._get(OFF_QUOTA))

    def update(
        self, *, strict: bool | None = None, project_quota_per_minute: int | None = None
    ) -> Settings:
        """Change the switch and/or the project quota for every process until the next reset;
        the settings now."""
        with self._locked():
            settings = _updated(self.settings(), strict, project_quota_per_minute)
            self._set(OFF_STRICT, int(settings.strict))
            self._set(OFF_QUOTA, settings.project_quota_per_minute)
            self._set(OFF_SETTINGS_EPOCH, self.shared.epoch() + 1)
            return settings

    def reset(self) -> None:
        """Nothing to do here: a reset is a new epoch of the shared directory, which every
        process notices on its own (see the module doc)."""

    # -- counting ---------------------------------------------------------------------------------
    def _take(self, key: str, now: float, take: Callable[[list[float]], _T]) -> _T:
        digest = _key_hash(key)
        size = _SLOT.size
        with self._locked():
            if self._get(OFF_TABLE_EPOCH) != self.shared.epoch():
                self._clear_table()
            index = digest % SLOTS
            at = free = victim = -1
            victim_last = math.inf
            entry = list(_EMPTY)
            for _ in range(PROBES):
                here = HEADER_SIZE + index * size
                slot = _SLOT.unpack_from(self.map, here)
                if slot[0] == digest:
                    at, entry = here, list(slot[1:])
                    break
                if slot[0] == 0:  # never used: the key is not further on
                    at = here if free < 0 else free
                    break
                if free < 0:
                    if _idle(slot[1:], now):
                        free = here
                    elif max(slot[1], slot[3]) < victim_last:
                        victim, victim_last = here, max(slot[1], slot[3])
                index = (index + 1) % SLOTS
            if at < 0:
                at = free if free >= 0 else victim
            answer = take(entry)
            _SLOT.pack_into(self.map, at, digest, *entry)
            return answer

    def admit_project(self, project: str, now: float, limit: int) -> bool:
        return self._take(f"p\0{project}", now, lambda e: take_project(e, now, limit))

    def admit_device(self, token: str, now: float, collapsible: bool) -> str:
        return self._take(f"d\0{token}", now, lambda e: take_device(e, now, collapsible))


class _FileLock:
    """This process's threads (a lock), then the other processes (``flock`` on the file)."""

    __slots__ = ("lock", "fd")

    def __init__(self, lock: threading.Lock, fd: int) -> None:
        self.lock = lock
        self.fd = fd

    def __enter__(self) -> None:
        self.lock.acquire()
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        self.lock.release()


def forget_shared_limits(state_dir: Path) -> None:
    """Remove what an earlier simulator left in ``state_dir`` (its counts and switch), before a
    new one starts there; the token secret stays, so its tokens stay valid, as Google's do."""
    (Path(state_dir) / LIMITS_FILE).unlink(missing_ok=True)


# -- the OAuth2 token secret ------------------------------------------------------------------------
_PROCESS_SECRET = secrets.token_bytes(SECRET_BYTES)


def token_secret(shared: SharedDir | None) -> bytes:
    """The key access tokens are signed with: the same in every process of one simulator.

    With a shared directory, a file in it, made once (written aside, then linked into place,
    so a process never reads it half written); else this process's own random secret."""
    if shared is None:
        return _PROCESS_SECRET
    path = shared.path / SECRET_FILE
    for _ in range(3):
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            pass
        else:
            if len(data) == SECRET_BYTES:
                return data
            raise RuntimeError(f"{path} is not a token secret ({len(data)} bytes)")
        aside = shared.path / f".{SECRET_FILE}.{os.getpid()}.{secrets.token_hex(4)}"
        fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, secrets.token_bytes(SECRET_BYTES))
        finally:
            os.close(fd)
        try:
            os.link(aside, path)  # fails when another process made it first: read theirs
        except FileExistsError:
            pass
        finally:
            aside.unlink()
    raise RuntimeError(f"could not make or read {path}")
