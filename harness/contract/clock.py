"""A system clock the harness can move: the optional contract capability ``clock``.

Jepsen's clock nemesis wraps a node's binary with libfaketime; so does this. A system declares
an *offset file*: its processes run under libfaketime (``LD_PRELOAD``) with
``FAKETIME_TIMESTAMP_FILE`` naming that file, and libfaketime re-reads it every second
(``FAKETIME_CACHE_DURATION=1``). The harness writes ``+<seconds>s`` there: from then on the
system's wall clock (``time.time``, ``datetime.now``, ``clock_gettime(CLOCK_REALTIME)``) reads
real time plus that offset, while its monotonic clock (``DONT_FAKE_MONOTONIC=1``: timeouts,
sleeps) runs true. Only the system's own processes are wrapped, never the emulators: they stand
for AWS and APNs, whose clocks are true.

The offset is always forward and under a day and a half: a system's ULID window (ids minted by
the harness in real time must not look like the future to it) and the absolute expiries it
hands a true-clocked store (Redis ``EXPIREAT``, S3 Object Lock) then stay sane.

The harness records the offset it set in the history (a ``phase`` row, :data:`PHASE_KEY`); the
oracle judges every calendar and time-of-day promise (the daily cap's day, quiet hours, audit
times) in *system time*, real time plus that offset (:func:`offset_of`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pandas as pd

# The key of the history's ``phase`` row that records the clock's offset.
PHASE_KEY = "clock"
# How often libfaketime re-reads the offset file (seconds); the harness waits longer than this
# after writing it.
CACHE_SECONDS = 1
# Where Debian's libfaketime package puts the library (``apt-get install libfaketime``).
_DEBIAN_LIBRARY = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")


@dataclass(frozen=True)
class SystemClock:
    """The offset file a system's processes read their clock offset from (libfaketime)."""

    offset_file: Path

    def set_offset(self, seconds: int) -> None:
        """The system's clock from now on (within :data:`CACHE_SECONDS`): real + ``seconds``."""
        path = Path(self.offset_file)
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_text(offset_spec(seconds) + "\n")
        os.replace(temporary, path)  # a reader never sees half a line


def offset_spec(seconds: int) -> str:
    """libfaketime's relative offset: ``+3600s``."""
    if isinstance(seconds, bool) or not isinstance(seconds, int) or seconds < 0:
        raise ValueError("a clock offset is a whole number of seconds >= 0")
    return f"+{seconds}s"


def faketime_library() -> Path | None:
    """libfaketime's shared library: ``FAKETIME_LIBRARY`` if set, else the one PyPI's
    ``libfaketime`` package builds (a project dependency), else Debian's; None when none is."""
    given = os.environ.get("FAKETIME_LIBRARY")
    candidates = [Path(given)] if given else []
    try:
        import libfaketime

        vendored = Path(libfaketime.__file__).parent / "vendor" / "libfaketime" / "src"
        candidates.append(vendored / "libfaketime.so.1")
    except ImportError:
        pass
    candidates.append(_DEBIAN_LIBRARY)
    return next((p for p in candidates if p.is_file()), None)


def faked_environment(env: Mapping[str, str], offset_file: Path, library: Path) -> dict[str, str]:
    """``env`` for a process whose wall clock reads ``offset_file``'s offset, monotonic true."""
    preload = env.get("LD_PRELOAD")
    return {
        **env,
        "LD_PRELOAD": f"{library}:{preload}" if preload else str(library),
        "FAKETIME_TIMESTAMP_FILE": str(offset_file),
        "FAKETIME_CACHE_DURATION": str(CACHE_SECONDS),
        "DONT_FAKE_MONOTONIC": "1",
        # File times stay true: the system's own logs and files are no calendar decision.
        "NO_FAKE_STAT": "1",
    }


def offset_to_midnight(real_instant: float, zone: str) -> int:
    """Whole seconds to add to real time so that the system's clock shows the first midnight
    in ``zone`` at or after ``real_instant`` (epoch) within a second of it: at least 0, under
    a day and a half (a DST day is 25 hours)."""
    tz = ZoneInfo(zone)
    local = datetime.fromtimestamp(real_instant, UTC).astimezone(tz)
    for days in range(3):
        midnight = datetime.combine(local.date() + timedelta(days=days), time(0), tzinfo=tz)
        if midnight.timestamp() >= real_instant:
            return math.ceil(midnight.timestamp() - real_instant)
    raise ValueError(f"no midnight in {zone} within three days")  # unreachable


def midnight_at(offset_s: int, real_instant: float, zone: str) -> float:
    """The real instant (epoch) at which the system's clock, ``offset_s`` ahead, shows the
    midnight in ``zone`` that :func:`offset_to_midnight` aimed at from ``real_instant``."""
    tz = ZoneInfo(zone)
    shown = datetime.fromtimestamp(real_instant + offset_s, UTC).astimezone(tz)
    midnight = datetime.combine(shown.date(), time(0), tzinfo=tz)
    return midnight.timestamp() - offset_s


def phase_detail(offset_s: int, midnight: str, boundary: float) -> str:
    """The history's record of the clock: its offset, the zone whose midnight was aimed at,
    and the real instant (epoch) the system's clock shows that midnight."""
    return json.dumps(
        {PHASE_KEY: {"offset_s": offset_s, "midnight": midnight, "boundary": boundary}}
    )


def recorded(history: pd.DataFrame) -> dict[str, float | str] | None:
    """The clock the run set (:func:`phase_detail`), None when it set none."""
    if "kind" not in history or "detail" not in history:
        return None
    phases = history.loc[history["kind"] == "phase", "detail"]
    for detail in phases[phases.astype(str).str.contains(f'"{PHASE_KEY}"', regex=False)]:
        try:
            value = json.loads(detail).get(PHASE_KEY)
        except (ValueError, AttributeError):
            continue
        if isinstance(value, dict):
            return value
    return None


def offset_of(history: pd.DataFrame) -> float:
    """Seconds the system's clock ran ahead of real time during the run (0: not moved)."""
    clock = recorded(history)
    return float(clock["offset_s"]) if clock else 0.0


def summary(history: pd.DataFrame) -> dict[str, object] | None:
    """The run summary's ``clock``: the offset, the midnight aimed at (on the system's clock and
    in real time), and how many injected events came before and after it (both > 0: the day
    boundary fell inside the load). None when the run did not move the clock."""
    clock = recorded(history)
    if clock is None:
        return None
    boundary, offset = float(clock["boundary"]), float(clock["offset_s"])
    injected = history.loc[history["kind"] == "inject", "time"].astype(float)
    return {
        "offset_s": offset,
        "midnight": clock["midnight"],
        "system_shows": datetime.fromtimestamp(
            boundary + offset, ZoneInfo(str(clock["midnight"]))
        ).isoformat(),
        "at_real": datetime.fromtimestamp(boundary, UTC).isoformat(),
        "injected_before": int((injected < boundary).sum()),
        "injected_after": int((injected >= boundary).sum()),
    }
