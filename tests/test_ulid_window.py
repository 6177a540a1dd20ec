"""Client event ids: the time window, and the pattern that states it in the OpenAPI document."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from hypothesis import example, given
from hypothesis import strategies as st
from ulid import ULID

from reference_impl.event_api import json_nesting_exceeds
from reference_impl.ulid_window import (
    canonical_ulid,
    served_event_id_pattern,
    time_window_problem,
    ulid_milliseconds,
    ulid_time_range_pattern,
)

MAX_MS = 2**48 - 1
NOW = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)


def ulid_at(ms: int, randomness: int = 0) -> str:
    return str(ULID.from_int((ms << 80) | randomness))


def _from_digits(digits: list[int]) -> int:
    value = 0
    for digit in digits:
        value = value * 32 + digit
    return value


# Times made of the edge digits (0, 1, 2, 29, 30, 31: where a range's branches split), so that two of
# them often share a prefix and differ at one of these digits; and plain random times.
EDGE_TIMES = st.builds(
    lambda first, rest: _from_digits([first, *rest]),
    st.sampled_from([0, 1, 2, 5, 6, 7]),
    st.lists(st.sampled_from([0, 1, 2, 29, 30, 31]), min_size=9, max_size=9),
)
TIMES = st.one_of(EDGE_TIMES, st.integers(0, MAX_MS))


@given(TIMES, TIMES, TIMES, st.integers(-(2**20), 2**20), st.integers(0, 2**80 - 1))
# A first digit between the ends' first digits; a 31 and a 0 right after a shared prefix.
@example(_from_digits([0] * 10), _from_digits([2] + [0] * 9), _from_digits([1] * 10), 0, 0)
@example(
    _from_digits([1, 3] + [0] * 8), _from_digits([5] * 10), _from_digits([1, 31] + [0] * 8), 0, 0
)
@example(
    _from_digits([1] * 10), _from_digits([5, 4] + [0] * 8), _from_digits([5, 0] + [0] * 8), 0, 0
)
def test_the_range_pattern_matches_exactly_the_times_inside(a, b, c, delta, randomness):
    low, high = min(a, b), max(a, b)
    pattern = re.compile(ulid_time_range_pattern(low, high))
    # A time anywhere, and times near either end.
    for t in (c, low + delta, high + delta):
        if 0 <= t <= MAX_MS:
            assert bool(pattern.fullmatch(ulid_at(t, randomness))) == (low <= t <= high), t
    # The ends themselves, to the millisecond.
    assert pattern.fullmatch(ulid_at(low)) and pattern.fullmatch(ulid_at(high))
    if low > 0:
        assert not pattern.fullmatch(ulid_at(low - 1))
    if high < MAX_MS:
        assert not pattern.fullmatch(ulid_at(high + 1))


def test_ulid_milliseconds_reads_the_time_part():
    ulid = ULID()
    assert ulid_milliseconds(str(ulid)) == ulid.milliseconds


def test_the_window_is_30_days_back_and_5_minutes_ahead():
    now_ms = int(NOW.timestamp() * 1000)
    day, minute = 86_400_000, 60_000
    assert time_window_problem(now_ms, NOW) is None
    assert time_window_problem(now_ms + 5 * minute, NOW) is None
    assert "future" in time_window_problem(now_ms + 5 * minute + 1, NOW)
    assert time_window_problem(now_ms - 30 * day, NOW) is None
    assert "30-day" in time_window_problem(now_ms - 30 * day - 1, NOW)
    # The id from the year 10889: the largest ULID time.
    assert "future" in time_window_problem(MAX_MS, NOW)


def test_the_served_pattern_is_inside_the_window_for_an_hour():
    pattern = re.compile(served_event_id_pattern(NOW))
    now_ms = int(NOW.timestamp() * 1000)
    allowed = [ulid_at(now_ms), ulid_at(now_ms + 5 * 60_000), ulid_at(now_ms - 29 * 86_400_000)]
    assert all(pattern.fullmatch(u) for u in allowed)
    refused = [ulid_at(now_ms + 5 * 60_000 + 1), ulid_at(now_ms - 30 * 86_400_000), "7" + "Z" * 25]
    assert not any(pattern.fullmatch(u) for u in refused)
    # Whatever the document allows, the API still takes an hour later.
    later = NOW + timedelta(hours=1)
    oldest_allowed = now_ms - 30 * 86_400_000 + 3_600_000
    assert pattern.fullmatch(ulid_at(oldest_allowed))
    assert time_window_problem(oldest_allowed, later) is None


def test_canonical_ulids_are_upper_case_and_within_128_bits():
    ulid = str(ULID())
    assert canonical_ulid(ulid)
    assert not canonical_ulid(ulid.lower())
    assert not canonical_ulid("8" + ulid[1:])  # 130 bits
    assert not canonical_ulid(ulid + "\n")
    assert not canonical_ulid(ulid[:-1] + "U")  # not in Crockford's alphabet


def test_json_nesting_is_bounded_before_parsing():
    assert json_nesting_exceeds("[" * 1000 + "]" * 1000, 32)
    assert json_nesting_exceeds('{"a":' * 33 + "1" + "}" * 33, 32)
    assert not json_nesting_exceeds('{"a":' * 32 + "1" + "}" * 32, 32)
    # Brackets inside strings (escaped quotes too) are text, not nesting.
    assert not json_nesting_exceeds(json_text := '{"s": "' + "[{" * 500 + '\\"[["}', 32)
    assert json_text.count("[") > 32
