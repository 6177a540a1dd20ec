"""Which client-chosen event ids (ULIDs) the Event API takes: canonical form, and a time window.

A ULID's first 48 bits are its time in milliseconds, and everything downstream orders by it: the
inbox sorts on it, mark-all-read moves a watermark ULID to "now", the dedup keys live 30 days.
An id from the far future (year 10889) would stay above every watermark, unread forever; an id
older than the dedup window could be delivered twice after its keys expired. So a client's id
must lie between ``now - DEDUP_WINDOW`` and ``now + MAX_FUTURE``.

The OpenAPI document states that window as a regular expression over the ULID's ten time
characters (``ulid_time_range_pattern``), computed when the document is served: JSON Schema has
no clock, and a pattern is the one constraint it can check on a string.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from reference_impl.dedup_key import DEDUP_TTL_SECONDS

# Crockford's base 32, the ULID alphabet; canonical ULIDs are upper case, and the first of the
# 26 characters is at most 7 (128 bits).
ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
ULID_PATTERN = r"^[0-7][0-9A-HJKMNP-TV-Z]{25}$"
TIME_CHARS = 10
MAX_FUTURE = timedelta(minutes=5)
DEDUP_WINDOW = timedelta(seconds=DEDUP_TTL_SECONDS)
_ULID = re.compile(ULID_PATTERN)
_ANY = "[" + ALPHABET + "]"


def canonical_ulid(value: object) -> bool:
    """26 upper-case Crockford characters within 128 bits (what ``str(ULID())`` gives)."""
    return isinstance(value, str) and bool(_ULID.fullmatch(value))


def ulid_milliseconds(value: str) -> int:
    """The time part of a canonical ULID (see ``canonical_ulid``)."""
    ms = 0
    for char in value[:TIME_CHARS]:
        ms = ms * 32 + ALPHABET.index(char)
    return ms


def time_window_problem(milliseconds: int, now: datetime) -> str | None:
    """Why a ULID time is refused, or None when it lies in ``[now - 30 days, now + 5 min]``."""
    now_ms = int(now.timestamp() * 1000)
    if milliseconds > now_ms + MAX_FUTURE // timedelta(milliseconds=1):
        return "its time is more than 5 minutes in the future"
    if milliseconds < now_ms - DEDUP_WINDOW // timedelta(milliseconds=1):
        return "its time is older than the 30-day dedup window"
    return None


def _digits(milliseconds: int) -> list[int]:
    digits = []
    for _ in range(TIME_CHARS):
        milliseconds, digit = divmod(milliseconds, 32)
        digits.append(digit)
    return digits[::-1]


def _one_of(low: int, high: int) -> str:
    if low == high:
        return ALPHABET[low]
    return "[" + ALPHABET[low : high + 1] + "]"


def _any(count: int) -> str:
    return "" if count == 0 else _ANY + ("" if count == 1 else f"{{{count}}}")


def _at_least(digits: list[int]) -> str:
    """Digit strings of this width that are >= ``digits``."""
    if not digits or all(d == 0 for d in digits):
        return _any(len(digits))
    first, rest = digits[0], digits[1:]
    options = [_one_of(first, first) + _at_least(rest)]
    if first < 31:
        options.append(_one_of(first + 1, 31) + _any(len(rest)))
    return "(?:" + "|".join(options) + ")"


def _at_most(digits: list[int]) -> str:
    """Digit strings of this width that are <= ``digits``."""
    if not digits or all(d == 31 for d in digits):
        return _any(len(digits))
    first, rest = digits[0], digits[1:]
    options = [_one_of(first, first) + _at_most(rest)]
    if first > 0:
        options.append(_one_of(0, first - 1) + _any(len(rest)))
    return "(?:" + "|".join(options) + ")"


def _between(low: list[int], high: list[int]) -> str:
    if not low:
        return ""
    if low[0] == high[0]:
        return _one_of(low[0], low[0]) + _between(low[1:], high[1:])
    options = [_one_of(low[0], low[0]) + _at_least(low[1:])]
    if high[0] - low[0] > 1:
        options.append(_one_of(low[0] + 1, high[0] - 1) + _any(len(low) - 1))
    options.append(_one_of(high[0], high[0]) + _at_most(high[1:]))
    return "(?:" + "|".join(options) + ")"


def ulid_time_range_pattern(low_ms: int, high_ms: int) -> str:
    """A regular expression matching exactly the canonical ULIDs whose time lies in
    ``[low_ms, high_ms]`` (both within 48 bits, low <= high)."""
    if not 0 <= low_ms <= high_ms < 2**48:
        raise ValueError(f"bad ULID time range {low_ms}..{high_ms}")
    return "^" + _between(_digits(low_ms), _digits(high_ms)) + _any(26 - TIME_CHARS) + "$"


def served_event_id_pattern(now: datetime, margin: timedelta = timedelta(hours=1)) -> str:
    """The event_id pattern for a document served at ``now``: the window, its old end moved in
    by ``margin`` so that an id the document allows stays acceptable for that long after."""
    now_ms = int(now.timestamp() * 1000)
    low = now_ms - (DEDUP_WINDOW - margin) // timedelta(milliseconds=1)
    high = now_ms + MAX_FUTURE // timedelta(milliseconds=1)
    return ulid_time_range_pattern(low, high)
