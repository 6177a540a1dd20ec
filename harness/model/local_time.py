"""Quiet windows evaluated in a user's own IANA zone: the oracle's own evaluation, written from
the design's rule (seed 000: quiet hours are local wall-clock times in the user's zone, never
UTC), independent of any system's code.

A window ``{"start": "22:00", "end": "07:00"}`` covers local times in ``[start, end)``, wrapping
midnight when start > end; start == end covers nothing. Seconds are optional (``HH:MM`` or
``HH:MM:SS``).
"""

from __future__ import annotations

from datetime import datetime, time, timedelta
from functools import cache
from zoneinfo import ZoneInfo, available_timezones

# Bounded: a window's end is at most a day and a DST shift away.
_MAX_DAYS_AHEAD = 3
# Names the tz database may hold that are no place's zone: a user naming one has no known zone.
_NOT_A_PLACE = frozenset({"Factory", "localtime", "posixrules"})


def parse_clock(value: str) -> time:
    parts = [int(p) for p in value.split(":")]
    if len(parts) not in (2, 3):
        raise ValueError(f"a local time is HH:MM or HH:MM:SS, not {value!r}")
    return time(*parts)


@cache
def _zone(name: str) -> ZoneInfo:
    return ZoneInfo(name)


@cache
def _known_zones() -> frozenset[str]:
    return frozenset(available_timezones()) - _NOT_A_PLACE


def known_zone(name: object) -> bool:
    """Whether ``name`` is an IANA zone of this machine's tz database. A user whose zone is not
    (a name written straight to a system's table, say "Mars/Olympus_Mons") has no local time:
    the design defers their pushes (seed 000: quiet hours fail closed)."""
    return isinstance(name, str) and name in _known_zones()


def readable(window: dict[str, str] | None) -> bool:
    """Whether a window (None: no window) names two wall-clock times a clock can show. One that
    does not ("25:00", written straight to a system's table) cannot be resolved: the design
    defers such a user's pushes (seed 004: quiet hours fail closed when the preference cannot
    be resolved)."""
    if window is None:
        return True
    try:
        parse_clock(window["start"])
        parse_clock(window["end"])
    except (KeyError, TypeError, ValueError):
        return False
    return True


def inside(window: dict[str, str] | None, zone: str, instant: float) -> bool:
    """Whether ``instant`` (epoch seconds) falls inside the window, in the zone's local time."""
    if not window:
        return False
    start, end = parse_clock(window["start"]), parse_clock(window["end"])
    local = datetime.fromtimestamp(instant, _zone(zone)).time().replace(tzinfo=None)
    if start == end:
        return False
    if start < end:
        return start <= local < end
    return local >= start or local < end


def window_end(window: dict[str, str] | None, zone: str, instant: float) -> float | None:
    """The epoch second the window containing ``instant`` ends at, or None when ``instant`` is
    outside it. A wall-clock end that a DST gap skips ends at the first instant after the gap."""
    if not inside(window, zone, instant):
        return None
    assert window is not None
    end = parse_clock(window["end"])
    tz = _zone(zone)
    local = datetime.fromtimestamp(instant, tz)
    for days in range(_MAX_DAYS_AHEAD):
        candidate = datetime.combine(local.date() + timedelta(days=days), end, tzinfo=tz)
        at = candidate.timestamp()
        if at > instant:
            return float(at)
    raise ValueError(f"no end of {window} in {zone} within {_MAX_DAYS_AHEAD} days")  # unreachable
