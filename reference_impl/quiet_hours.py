"""Quiet hours evaluated in the user's local time (DESIGN.md section 4, push consumer step 3).

The classic bug is comparing a "22:00-07:00" window against the clock in UTC, which shifts the
window by the user's UTC offset. Here the window is always evaluated in the user's IANA time
zone, and quiet hours fail closed: when the zone cannot be resolved, the push is deferred.

Pure logic: the current instant is always passed in. The only side effect is zoneinfo reading
its (cached) tz database.

Model
-----
A window ``[start, end)`` is a set of local wall-clock times. Each local night it becomes one
contiguous interval of real time, ``[resolve(start), resolve(end))``, where ``end`` falls on the
same local date as ``start`` or, when ``start > end``, on the next local date. ``resolve`` maps a
local wall-clock time on a given date to a UTC instant:

* a time that does not exist (skipped by a spring-forward gap, e.g. 02:30 in America/New_York
  on 2026-03-08) resolves to the first instant after the gap (03:00 EDT = 07:00 UTC);
* an ambiguous time (repeated by a fall-back, e.g. 01:30 in America/New_York on 2026-11-01)
  resolves to its first occurrence (``fold=0``, 01:30 EDT = 05:30 UTC).

Away from DST transitions this is exactly ``is_inside(local_wall_time, window)``. Around a
transition it keeps each night's window contiguous: after the window has ended at the first
occurrence of an ambiguous ``end``, the repeated hour does not re-enter the window, and once an
ambiguous ``start`` has passed, the clock jumping back does not leave it.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

__all__ = [
    "DEFAULT_UNKNOWN_ZONE_RETRY",
    "QuietDecision",
    "QuietWindow",
    "decide",
    "is_inside",
    "parse_window",
    "resolve_zone",
]

DEFAULT_UNKNOWN_ZONE_RETRY = dt.timedelta(minutes=15)

REASON_OUTSIDE = "outside_window"
REASON_INSIDE = "inside_window"
REASON_UNKNOWN_ZONE = "unknown_zone"
REASON_NO_WINDOW = "no_window"

# Keys that zoneinfo can load but that are not IANA location names (system aliases / the
# "zone not configured" placeholder). Treated as unknown so that they fail closed.
_NON_IANA_KEYS = frozenset({"localtime", "posixrules", "Factory"})

_TIME_RE = re.compile(r"(?P<h>[01]\d|2[0-3]):(?P<m>[0-5]\d)(?::(?P<s>[0-5]\d))?", re.ASCII)

_UTC = dt.UTC
_MICROSECOND = dt.timedelta(microseconds=1)


@dataclass(frozen=True)
class QuietWindow:
    """Local wall-clock quiet window ``[start, end)``.

    ``start == end`` means no window; ``start > end`` means the window crosses midnight.
    """

    start: dt.time
    end: dt.time

    def __post_init__(self) -> None:
        for name in ("start", "end"):
            value = getattr(self, name)
            if not isinstance(value, dt.time):
                raise ValueError(f"QuietWindow.{name} must be a datetime.time, got {value!r}")
            if value.tzinfo is not None:
                raise ValueError(
                    f"QuietWindow.{name} must be a naive local wall-clock time, got {value!r}"
                )

    @property
    def is_empty(self) -> bool:
        return self.start == self.end

    @property
    def crosses_midnight(self) -> bool:
        return self.start > self.end


@dataclass(frozen=True)
class QuietDecision:
    """Outcome of the quiet-hours gate.

    ``reason`` is one of "outside_window", "inside_window", "unknown_zone", "no_window".
    ``release_at`` (UTC, tz-aware) is set only when ``send`` is False.
    """

    send: bool
    release_at: dt.datetime | None
    reason: str


def _parse_time(field: str, value: object) -> dt.time:
    if not isinstance(value, str):
        raise ValueError(f"quiet hours {field!r} must be a string 'HH:MM[:SS]', got {value!r}")
    match = _TIME_RE.fullmatch(value)
    if match is None:
        raise ValueError(
            f"quiet hours {field!r} must be 'HH:MM' or 'HH:MM:SS' (24-hour, 00:00-23:59:59), "
            f"got {value!r}"
        )
    return dt.time(int(match["h"]), int(match["m"]), int(match["s"] or 0))


def parse_window(spec: Mapping[str, str] | None) -> QuietWindow | None:
    """Parse ``{"start": "22:00", "end": "07:00"}`` (seconds optional) into a QuietWindow.

    ``None`` -> ``None`` (no quiet hours configured). Extra keys are ignored. Anything else that
    is not a mapping with two valid ``HH:MM[:SS]`` strings raises ValueError. ``start == end``
    is returned as an (empty) QuietWindow, which ``decide`` treats as no window.
    """
    if spec is None:
        return None
    if not isinstance(spec, Mapping):
        raise ValueError(f"quiet hours spec must be a mapping or None, got {type(spec).__name__}")
    missing = [key for key in ("start", "end") if key not in spec]
    if missing:
        raise ValueError(f"quiet hours spec is missing {', '.join(missing)}: {dict(spec)!r}")
    return QuietWindow(
        start=_parse_time("start", spec["start"]), end=_parse_time("end", spec["end"])
    )


def is_inside(local_time: dt.time, window: QuietWindow) -> bool:
    """Whether a local wall-clock time falls in the half-open window ``[start, end)``.

    Any tzinfo/fold on ``local_time`` is ignored (it is taken as a wall-clock reading).
    """
    t = local_time.replace(tzinfo=None, fold=0)
    if window.start == window.end:
        return False
    if window.start < window.end:
        return window.start <= t < window.end
    return t >= window.start or t < window.end


def resolve_zone(zone: str | None) -> ZoneInfo | None:
    """Load an IANA zone, or None when it is missing, malformed, or unknown."""
    if not isinstance(zone, str) or not zone or zone in _NON_IANA_KEYS:
        return None
    return _load_zone(zone)


# zoneinfo keeps only the last 8 zones it loaded: a population of many zones read the tz file
# again for most users (a tenth of the bulk load's CPU). The tz database does not change while
# a process runs, so the answer, found or not, is kept.
@functools.lru_cache(maxsize=2048)
def _load_zone(zone: str) -> ZoneInfo | None:
    try:
        return ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        # Not found, not a normalized relative key, or a directory such as "America".
        return None


def _wall_to_utc(day: dt.date, wall: dt.time, tz: dt.tzinfo) -> dt.datetime:
    """Resolve a local wall-clock time on ``day`` to a UTC instant.

    Ambiguous (fall-back) -> first occurrence (fold=0). Non-existent (spring-forward gap) ->
    the first instant after the gap, i.e. the transition instant itself.
    """
    naive = dt.datetime.combine(day, wall.replace(tzinfo=None, fold=0))
    first = naive.replace(tzinfo=tz).astimezone(_UTC)  # fold=0: offset before any transition
    if first.astimezone(tz).replace(tzinfo=None) == naive:
        return first
    # Non-existent: fold=0 used the offset before the gap (lands after the transition), fold=1
    # the offset after it (lands before the transition). Bisect for the transition instant.
    lo = naive.replace(tzinfo=tz, fold=1).astimezone(_UTC)
    hi = first
    after_offset = hi.astimezone(tz).utcoffset()
    if lo >= hi:  # defensive; cannot happen for a real gap
        return hi
    while hi - lo > _MICROSECOND:
        mid = lo + (hi - lo) // 2
        if mid.astimezone(tz).utcoffset() == after_offset:
            hi = mid
        else:
            lo = mid
    return hi


def _intervals(
    today: dt.date, window: QuietWindow, tz: dt.tzinfo
) -> list[tuple[dt.datetime, dt.datetime]]:
    """The window's real-time intervals for nights starting around ``today``, merged."""
    raw: list[tuple[dt.datetime, dt.datetime]] = []
    for delta in range(-2, 2):
        day = today + dt.timedelta(days=delta)
        end_day = day + dt.timedelta(days=1) if window.crosses_midnight else day
        begin = _wall_to_utc(day, window.start, tz)
        finish = _wall_to_utc(end_day, window.end, tz)
        if begin < finish:
            raw.append((begin, finish))
    raw.sort()
    merged: list[tuple[dt.datetime, dt.datetime]] = []
    for begin, finish in raw:
        if merged and begin <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], finish))
        else:
            merged.append((begin, finish))
    return merged


def decide(
    now_utc: dt.datetime,
    zone: str | None,
    window: QuietWindow | None,
    unknown_zone_retry: dt.timedelta = DEFAULT_UNKNOWN_ZONE_RETRY,
    standard_time: bool = False,
) -> QuietDecision:
    """Quiet-hours gate for one push delivery.

    * ``now_utc`` must be timezone-aware (any offset; only the instant matters), else ValueError.
    * Unknown zone (None, empty, not a string, not an IANA key such as "Mars/Olympus"): do not
      send; ``release_at = now + unknown_zone_retry``, reason "unknown_zone". This applies even
      when ``window`` is None: the caller cannot always tell "no quiet hours" from "preference
      not loaded", so quiet hours fail closed (seed: "if the user's timezone or preference is
      unavailable, we defer rather than send"). Consequence: a user must have a resolvable zone
      to receive push at all; the caller should alert on repeated "unknown_zone" deferrals.
    * No window (None or start == end): send, reason "no_window".
    * Inside the window: do not send; ``release_at`` is the UTC instant the window ends (see the
      module docstring for how DST gaps and repeats are resolved), reason "inside_window".
      The window is half-open, so at exactly ``release_at`` the push may be sent.
    * Otherwise: send, reason "outside_window".

    ``release_at`` is always in UTC and strictly after ``now_utc``.
    """
    if not isinstance(now_utc, dt.datetime):
        raise ValueError(f"now_utc must be a datetime, got {type(now_utc).__name__}")
    if now_utc.tzinfo is None or now_utc.utcoffset() is None:
        raise ValueError("now_utc must be timezone-aware")
    if unknown_zone_retry <= dt.timedelta(0):
        raise ValueError(f"unknown_zone_retry must be positive, got {unknown_zone_retry!r}")
    now = now_utc.astimezone(_UTC)

    tz: dt.tzinfo | None = resolve_zone(zone)
    if tz is None:
        return QuietDecision(False, now + unknown_zone_retry, REASON_UNKNOWN_ZONE)
    if standard_time:  # the deliberate defect quiet_hours_ignore_dst: the offset without DST
        local = now.astimezone(tz)
        offset = local.utcoffset() or dt.timedelta(0)
        tz = dt.timezone(offset - (local.dst() or dt.timedelta(0)))
    if window is None or window.is_empty:
        return QuietDecision(True, None, REASON_NO_WINDOW)

    today = now.astimezone(tz).date()
    for begin, finish in _intervals(today, window, tz):
        if begin <= now < finish:
            return QuietDecision(False, finish, REASON_INSIDE)
    return QuietDecision(True, None, REASON_OUTSIDE)
