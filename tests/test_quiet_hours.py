from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_impl.quiet_hours import (
    QuietDecision,
    QuietWindow,
    decide,
    is_inside,
    parse_window,
)

UTC = dt.UTC
NIGHT = QuietWindow(dt.time(22, 0), dt.time(7, 0))


def utc(*args: int) -> dt.datetime:
    return dt.datetime(*args, tzinfo=UTC)


def window(start: str, end: str) -> QuietWindow:
    parsed = parse_window({"start": start, "end": end})
    assert parsed is not None
    return parsed


def inside(release_at: dt.datetime) -> QuietDecision:
    return QuietDecision(send=False, release_at=release_at, reason="inside_window")


OUTSIDE = QuietDecision(send=True, release_at=None, reason="outside_window")


# --- parse_window ---------------------------------------------------------------------------


def test_parse_window_basic_and_seconds() -> None:
    assert parse_window({"start": "22:00", "end": "07:00"}) == QuietWindow(
        dt.time(22, 0), dt.time(7, 0)
    )
    assert parse_window({"start": "22:00:30", "end": "06:59:59"}) == QuietWindow(
        dt.time(22, 0, 30), dt.time(6, 59, 59)
    )
    assert parse_window({"start": "00:00", "end": "23:59:59", "enabled": "yes"}) == QuietWindow(
        dt.time(0, 0), dt.time(23, 59, 59)
    )


def test_parse_window_none_and_equal() -> None:
    assert parse_window(None) is None
    empty = parse_window({"start": "08:00", "end": "08:00"})
    assert empty == QuietWindow(dt.time(8), dt.time(8))
    assert empty is not None and empty.is_empty


@pytest.mark.parametrize(
    "spec",
    [
        {"start": "25:00", "end": "07:00"},
        {"start": "24:00", "end": "07:00"},
        {"start": "22:60", "end": "07:00"},
        {"start": "22:00:60", "end": "07:00"},
        {"start": "7:00", "end": "22:00"},
        {"start": "22:00 ", "end": "07:00"},
        {"start": "22h00", "end": "07:00"},
        {"start": "", "end": "07:00"},
        {"start": "\u0662\u0662:00", "end": "07:00"},  # Arabic-Indic digits
        {"start": 2200, "end": "07:00"},
        {"start": None, "end": "07:00"},
        {"start": "22:00"},
        {"end": "07:00"},
        {},
        "22:00-07:00",
        ["22:00", "07:00"],
    ],
)
def test_parse_window_malformed_raises(spec: object) -> None:
    with pytest.raises(ValueError, match="quiet hours"):
        parse_window(spec)  # type: ignore[arg-type]


def test_quiet_window_rejects_non_times() -> None:
    with pytest.raises(ValueError):
        QuietWindow("22:00", dt.time(7))  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        QuietWindow(dt.time(22, tzinfo=UTC), dt.time(7))


# --- is_inside ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("local", "expected"),
    [
        (dt.time(21, 59, 59, 999999), False),
        (dt.time(22, 0), True),
        (dt.time(23, 30), True),
        (dt.time(0, 0), True),
        (dt.time(3, 0), True),
        (dt.time(6, 59, 59, 999999), True),
        (dt.time(7, 0), False),
        (dt.time(12, 0), False),
    ],
)
def test_is_inside_across_midnight(local: dt.time, expected: bool) -> None:
    assert is_inside(local, NIGHT) is expected


@pytest.mark.parametrize(
    ("local", "expected"),
    [
        (dt.time(12, 59), False),
        (dt.time(13, 0), True),
        (dt.time(14, 0), True),
        (dt.time(14, 30), False),
        (dt.time(23, 0), False),
    ],
)
def test_is_inside_same_day(local: dt.time, expected: bool) -> None:
    assert is_inside(local, QuietWindow(dt.time(13), dt.time(14, 30))) is expected


def test_is_inside_empty_window_never() -> None:
    empty = QuietWindow(dt.time(8), dt.time(8))
    assert [is_inside(dt.time(h), empty) for h in (0, 7, 8, 9, 23)] == [False] * 5


# --- decide: midnight-crossing window in a fixed-offset zone -----------------------------------
# Asia/Tokyo is UTC+9 with no DST; 22:00-07:00 JST is 13:00-22:00 UTC.


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        # 23:30 JST on 06-15 -> ends 07:00 JST 06-16 = 22:00 UTC 06-15
        (utc(2026, 6, 15, 14, 30), inside(utc(2026, 6, 15, 22, 0))),
        # 03:00 JST on 06-16 -> same night, same end
        (utc(2026, 6, 15, 18, 0), inside(utc(2026, 6, 15, 22, 0))),
        # 22:00 JST exactly: start is inclusive
        (utc(2026, 6, 15, 13, 0), inside(utc(2026, 6, 15, 22, 0))),
        # 07:00 JST exactly: end is exclusive
        (utc(2026, 6, 15, 22, 0), OUTSIDE),
        # 06:59:59.999999 JST: still inside
        (utc(2026, 6, 15, 21, 59, 59, 999999), inside(utc(2026, 6, 15, 22, 0))),
        # 21:59 JST
        (utc(2026, 6, 15, 12, 59), OUTSIDE),
    ],
)
def test_decide_midnight_window_tokyo(now: dt.datetime, expected: QuietDecision) -> None:
    assert decide(now, "Asia/Tokyo", NIGHT) == expected


def test_decide_is_not_evaluated_in_utc() -> None:
    # 14:30 UTC is outside 22:00-07:00 if (wrongly) compared in UTC, but 23:30 in Tokyo.
    assert not is_inside(dt.time(14, 30), NIGHT)
    assert decide(utc(2026, 6, 15, 14, 30), "Asia/Tokyo", NIGHT).send is False
    # 23:30 UTC is inside in UTC, but 08:30 in Tokyo.
    assert decide(utc(2026, 6, 15, 23, 30), "Asia/Tokyo", NIGHT) == OUTSIDE
    assert decide(utc(2026, 6, 15, 23, 30), "UTC", NIGHT) == inside(utc(2026, 6, 16, 7, 0))


# --- decide: 15-minute offset difference (Kathmandu +05:45 vs Kolkata +05:30) ------------------


def test_kathmandu_inside_kolkata_outside_at_window_start() -> None:
    now = utc(2026, 6, 15, 16, 20)  # 22:05 in Kathmandu, 21:50 in Kolkata
    assert decide(now, "Asia/Kathmandu", NIGHT) == inside(utc(2026, 6, 16, 1, 15))
    assert decide(now, "Asia/Kolkata", NIGHT) == OUTSIDE


def test_kolkata_inside_kathmandu_outside_at_window_end() -> None:
    now = utc(2026, 6, 16, 1, 20)  # 07:05 in Kathmandu, 06:50 in Kolkata
    assert decide(now, "Asia/Kathmandu", NIGHT) == OUTSIDE
    assert decide(now, "Asia/Kolkata", NIGHT) == inside(utc(2026, 6, 16, 1, 30))


def test_kathmandu_window_ends_at_quarter_hour_utc() -> None:
    # 07:00 NPT == 01:15 UTC exactly: the release instant itself is outside.
    assert decide(utc(2026, 6, 16, 1, 14, 59), "Asia/Kathmandu", NIGHT) == inside(
        utc(2026, 6, 16, 1, 15)
    )
    assert decide(utc(2026, 6, 16, 1, 15), "Asia/Kathmandu", NIGHT) == OUTSIDE


# --- decide: America/New_York DST ------------------------------------------------------------
# 2026-03-08: 02:00 EST -> 03:00 EDT at 07:00 UTC. 2026-11-01: 02:00 EDT -> 01:00 EST at 06:00 UTC.

NY = "America/New_York"


def test_ny_spring_forward_nonexistent_end_resolves_after_gap() -> None:
    w = window("22:00", "02:30")  # 02:30 does not exist on 2026-03-08
    # 01:00 EST
    assert decide(utc(2026, 3, 8, 6, 0), NY, w) == inside(utc(2026, 3, 8, 7, 0))
    # 22:00 EST on 03-07 (start of the night)
    assert decide(utc(2026, 3, 8, 3, 0), NY, w) == inside(utc(2026, 3, 8, 7, 0))
    # 01:59:59 EST: still inside; 03:00 EDT: released
    assert decide(utc(2026, 3, 8, 6, 59, 59), NY, w) == inside(utc(2026, 3, 8, 7, 0))
    assert decide(utc(2026, 3, 8, 7, 0), NY, w) == OUTSIDE
    # The next night 02:30 exists again: 02:30 EDT = 06:30 UTC on 03-09
    assert decide(utc(2026, 3, 9, 3, 0), NY, w) == inside(utc(2026, 3, 9, 6, 30))


def test_ny_spring_forward_overnight_window_is_an_hour_shorter() -> None:
    # 00:00 EST on 03-08 -> 07:00 EDT = 11:00 UTC (a 9 h local window lasts 8 h that night)
    assert decide(utc(2026, 3, 8, 5, 0), NY, NIGHT) == inside(utc(2026, 3, 8, 11, 0))
    assert decide(utc(2026, 3, 8, 3, 0), NY, NIGHT) == inside(utc(2026, 3, 8, 11, 0))
    assert decide(utc(2026, 3, 8, 11, 0), NY, NIGHT) == OUTSIDE
    # 22:00 EST on 03-07 = 03:00 UTC; 21:59 EST is outside
    assert decide(utc(2026, 3, 8, 2, 59), NY, NIGHT) == OUTSIDE


def test_ny_spring_forward_nonexistent_start() -> None:
    w = window("02:30", "06:00")
    assert decide(utc(2026, 3, 8, 6, 59, 59), NY, w) == OUTSIDE  # 01:59:59 EST
    assert decide(utc(2026, 3, 8, 7, 0), NY, w) == inside(utc(2026, 3, 8, 10, 0))  # 03:00 EDT


def test_ny_fall_back_ambiguous_end_is_first_occurrence() -> None:
    w = window("22:00", "01:30")  # 01:30 happens twice on 2026-11-01
    # 01:00 EDT -> ends 01:30 EDT = 05:30 UTC (fold=0)
    assert decide(utc(2026, 11, 1, 5, 0), NY, w) == inside(utc(2026, 11, 1, 5, 30))
    assert decide(utc(2026, 11, 1, 2, 0), NY, w) == inside(utc(2026, 11, 1, 5, 30))
    assert decide(utc(2026, 11, 1, 5, 30), NY, w) == OUTSIDE
    # 01:15 EST (the repeated hour): the night's window has already ended.
    assert decide(utc(2026, 11, 1, 6, 15), NY, w) == OUTSIDE


def test_ny_fall_back_overnight_window_is_an_hour_longer() -> None:
    # 00:00 EDT on 11-01 -> 07:00 EST = 12:00 UTC (a 9 h local window lasts 10 h that night)
    assert decide(utc(2026, 11, 1, 4, 0), NY, NIGHT) == inside(utc(2026, 11, 1, 12, 0))
    assert decide(utc(2026, 11, 1, 6, 30), NY, NIGHT) == inside(utc(2026, 11, 1, 12, 0))
    assert decide(utc(2026, 11, 1, 11, 59, 59), NY, NIGHT) == inside(utc(2026, 11, 1, 12, 0))
    assert decide(utc(2026, 11, 1, 12, 0), NY, NIGHT) == OUTSIDE


def test_ny_fall_back_ambiguous_start() -> None:
    w = window("01:30", "07:00")
    assert decide(utc(2026, 11, 1, 5, 29), NY, w) == OUTSIDE  # 01:29 EDT
    assert decide(utc(2026, 11, 1, 5, 30), NY, w) == inside(utc(2026, 11, 1, 12, 0))  # 01:30 EDT
    # 01:10 EST: wall clock reads before 01:30 again, but the window already began.
    assert decide(utc(2026, 11, 1, 6, 10), NY, w) == inside(utc(2026, 11, 1, 12, 0))


def test_merged_nights_when_end_and_next_start_share_a_gap() -> None:
    # 02:45-02:30 (23h45m): on 2026-03-08 both 02:30 and 02:45 resolve to 03:00 EDT, so the
    # night of 03-07 runs straight into the night of 03-08; release is 02:30 EDT on 03-09.
    w = window("02:45", "02:30")
    assert decide(utc(2026, 3, 8, 6, 0), NY, w) == inside(utc(2026, 3, 9, 6, 30))
    assert decide(utc(2026, 3, 8, 7, 0), NY, w) == inside(utc(2026, 3, 9, 6, 30))


# --- decide: Europe/London --------------------------------------------------------------------
# 2026-03-29: 01:00 GMT -> 02:00 BST at 01:00 UTC. 2026-10-25: 02:00 BST -> 01:00 GMT at 01:00 UTC.

LONDON = "Europe/London"


def test_london_summer_uses_bst() -> None:
    # 21:30 UTC = 22:30 BST: inside, although 21:30 would be outside if compared in UTC.
    assert decide(utc(2026, 7, 1, 21, 30), LONDON, NIGHT) == inside(utc(2026, 7, 2, 6, 0))
    assert decide(utc(2026, 7, 1, 20, 59), LONDON, NIGHT) == OUTSIDE
    assert decide(utc(2026, 7, 2, 6, 0), LONDON, NIGHT) == OUTSIDE


def test_london_winter_is_utc() -> None:
    assert decide(utc(2026, 1, 15, 22, 0), LONDON, NIGHT) == inside(utc(2026, 1, 16, 7, 0))
    assert decide(utc(2026, 1, 15, 21, 59), LONDON, NIGHT) == OUTSIDE


def test_london_spring_forward() -> None:
    w = window("23:00", "01:30")  # 01:30 does not exist on 2026-03-29
    assert decide(utc(2026, 3, 29, 0, 30), LONDON, w) == inside(utc(2026, 3, 29, 1, 0))
    assert decide(utc(2026, 3, 29, 1, 0), LONDON, w) == OUTSIDE
    # 22:00-07:00 that night: 07:00 BST = 06:00 UTC
    assert decide(utc(2026, 3, 28, 22, 0), LONDON, NIGHT) == inside(utc(2026, 3, 29, 6, 0))


def test_london_fall_back() -> None:
    # 22:00 BST on 10-24 = 21:00 UTC; 07:00 GMT on 10-25 = 07:00 UTC
    assert decide(utc(2026, 10, 24, 21, 0), LONDON, NIGHT) == inside(utc(2026, 10, 25, 7, 0))
    assert decide(utc(2026, 10, 24, 20, 59), LONDON, NIGHT) == OUTSIDE
    w = window("22:00", "01:30")  # ambiguous end -> first occurrence, 01:30 BST = 00:30 UTC
    assert decide(utc(2026, 10, 24, 23, 0), LONDON, w) == inside(utc(2026, 10, 25, 0, 30))
    assert decide(utc(2026, 10, 25, 1, 15), LONDON, w) == OUTSIDE  # 01:15 GMT, repeated hour


# --- decide: unknown zone, no window, input validation ----------------------------------------


@pytest.mark.parametrize(
    "zone",
    ["Mars/Olympus", None, "", "America", "America/", "../etc/passwd", "/etc/localtime",
     "localtime", "Factory", "asia/tokyo_", 42],
)  # fmt: skip
@pytest.mark.parametrize("w", [NIGHT, None])
def test_unknown_zone_defers(zone: object, w: QuietWindow | None) -> None:
    now = utc(2026, 6, 15, 12, 0)
    expected = QuietDecision(False, utc(2026, 6, 15, 12, 15), "unknown_zone")
    assert decide(now, zone, w) == expected  # type: ignore[arg-type]


def test_unknown_zone_custom_retry_and_aware_input() -> None:
    now = dt.datetime(2026, 6, 15, 21, 0, tzinfo=dt.timezone(dt.timedelta(hours=9)))
    decision = decide(now, "Mars/Olympus", NIGHT, unknown_zone_retry=dt.timedelta(minutes=5))
    assert decision == QuietDecision(False, utc(2026, 6, 15, 12, 5), "unknown_zone")
    assert decision.release_at is not None and decision.release_at.utcoffset() == dt.timedelta(0)


@pytest.mark.parametrize("retry", [dt.timedelta(0), dt.timedelta(seconds=-1)])
def test_non_positive_retry_raises(retry: dt.timedelta) -> None:
    with pytest.raises(ValueError, match="unknown_zone_retry"):
        decide(utc(2026, 6, 15, 12, 0), "UTC", NIGHT, unknown_zone_retry=retry)


def test_no_window_sends() -> None:
    assert decide(utc(2026, 6, 15, 14, 30), "Asia/Tokyo", None) == QuietDecision(
        True, None, "no_window"
    )
    empty = QuietWindow(dt.time(22), dt.time(22))
    assert decide(utc(2026, 6, 15, 13, 0), "Asia/Tokyo", empty) == QuietDecision(
        True, None, "no_window"
    )


def test_naive_now_raises() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        decide(dt.datetime(2026, 6, 15, 14, 30), "Asia/Tokyo", NIGHT)
    with pytest.raises(ValueError, match="timezone-aware"):
        decide(dt.datetime(2026, 6, 15, 14, 30), None, None)


def test_release_at_is_utc_for_non_utc_input() -> None:
    now = dt.datetime(2026, 6, 15, 23, 30, tzinfo=ZoneInfo("Asia/Tokyo"))
    decision = decide(now, "Asia/Tokyo", NIGHT)
    assert decision == inside(utc(2026, 6, 15, 22, 0))
    assert decision.release_at is not None and decision.release_at.tzinfo is UTC


# --- properties ---------------------------------------------------------------------------------

DST_ZONES = [
    "America/New_York",
    "Europe/London",
    "Australia/Lord_Howe",  # 30-minute DST shift
    "America/Santiago",  # southern hemisphere, transitions at local midnight
    "America/Havana",  # transitions at local midnight
    "Pacific/Apia",  # skipped 2011-12-30 entirely
]
FIXED_ZONES = ["UTC", "Asia/Kolkata", "Asia/Kathmandu", "Asia/Tokyo", "Etc/GMT+5"]

times = st.builds(
    dt.time,
    st.integers(0, 23),
    st.integers(0, 59),
    st.sampled_from([0, 0, 0, 30, 59]),
)
windows = st.builds(QuietWindow, times, times)
instants = st.datetimes(
    min_value=dt.datetime(2000, 1, 1), max_value=dt.datetime(2037, 12, 31), timezones=st.just(UTC)
)
# Bias towards DST transition days so the interesting branches are exercised.
transition_instants = st.builds(
    lambda day, minutes: utc(*day) + dt.timedelta(minutes=minutes),
    st.sampled_from(
        [(2026, 3, 7), (2026, 3, 8), (2026, 10, 31), (2026, 11, 1), (2026, 3, 28), (2026, 3, 29),
         (2026, 10, 24), (2026, 10, 25), (2026, 4, 4), (2026, 9, 5), (2011, 12, 29),
         (2011, 12, 30)]
    ),
    st.integers(-12 * 60, 36 * 60),
)  # fmt: skip
any_instant = st.one_of(instants, transition_instants)


def _exists(day: dt.date, wall: dt.time, tz: ZoneInfo) -> bool:
    naive = dt.datetime.combine(day, wall)
    return naive.replace(tzinfo=tz).astimezone(UTC).astimezone(tz).replace(tzinfo=None) == naive


@settings(max_examples=400, deadline=None)
@given(now=any_instant, zone=st.sampled_from(DST_ZONES + FIXED_ZONES), w=windows)
def test_property_release_is_end_of_window(now: dt.datetime, zone: str, w: QuietWindow) -> None:
    decision = decide(now, zone, w)
    if w.is_empty:
        assert decision == QuietDecision(True, None, "no_window")
        return
    if decision.send:
        assert decision == OUTSIDE
        return
    tz = ZoneInfo(zone)
    release = decision.release_at
    assert decision.reason == "inside_window"
    assert release is not None and release.tzinfo is UTC
    # A night's deferral ends within a day, unless the open span [end, start) of a night lies
    # wholly inside a DST gap: the clock skips it, two nights' windows meet, and the deferral
    # runs on to the next night's end (e.g. 02:01-02:00 on the night New York springs forward).
    days = [now.astimezone(tz).date() + dt.timedelta(days=d) for d in range(-1, 3)]
    skipped = any(not _exists(d, w.end, tz) and not _exists(d, w.start, tz) for d in days)
    assert now < release <= now + dt.timedelta(hours=50 if skipped else 26)
    # The window is half-open: sendable at release, not a microsecond before.
    assert decide(release, zone, w).send is True
    assert decide(release - dt.timedelta(microseconds=1), zone, w) == decision
    # Everything in between is the same deferral.
    assert decide(now + (release - now) / 2, zone, w) == decision
    # The local clock at release shows `end`, or `end` was skipped and release is the gap's end.
    local = release.astimezone(tz)
    assert not is_inside(local.time(), w)
    if local.time() != w.end:
        assert not _exists(local.date(), w.end, tz)
        before = (release - dt.timedelta(microseconds=1)).astimezone(tz)
        assert before.utcoffset() != local.utcoffset()


@settings(max_examples=300, deadline=None)
@given(now=any_instant, zone=st.sampled_from(DST_ZONES + FIXED_ZONES), w=windows)
def test_property_agrees_with_wall_clock_away_from_transitions(
    now: dt.datetime, zone: str, w: QuietWindow
) -> None:
    tz = ZoneInfo(zone)
    offsets = {(now + dt.timedelta(hours=h)).astimezone(tz).utcoffset() for h in range(-50, 51)}
    if len(offsets) != 1:
        return  # a transition nearby; covered by the explicit DST tests and the property above
    local = now.astimezone(tz)
    decision = decide(now, zone, w)
    assert decision.send is (not is_inside(local.time(), w))
    if not decision.send:
        assert decision.release_at is not None
        assert decision.release_at.astimezone(tz).time() == w.end
        assert decision.release_at - now <= dt.timedelta(hours=24)


@settings(max_examples=200, deadline=None)
@given(
    now=any_instant,
    zone=st.sampled_from(DST_ZONES + FIXED_ZONES + ["Mars/Olympus"]),
    w=st.one_of(st.none(), windows),
    offset_minutes=st.integers(-14 * 60, 14 * 60),
    view_zone=st.sampled_from(DST_ZONES + FIXED_ZONES),
)
def test_property_stable_under_representation(
    now: dt.datetime, zone: str, w: QuietWindow | None, offset_minutes: int, view_zone: str
) -> None:
    expected = decide(now, zone, w)
    fixed = now.astimezone(dt.timezone(dt.timedelta(minutes=offset_minutes)))
    assert decide(fixed, zone, w) == expected
    assert decide(now.astimezone(ZoneInfo(view_zone)), zone, w) == expected


@settings(max_examples=100, deadline=None)
@given(now=any_instant, w=st.one_of(st.none(), windows))
def test_property_unknown_zone_always_defers(now: dt.datetime, w: QuietWindow | None) -> None:
    assert decide(now, "Mars/Olympus", w) == QuietDecision(
        False, now + dt.timedelta(minutes=15), "unknown_zone"
    )


@settings(max_examples=200, deadline=None)
@given(
    now=instants,
    zone=st.sampled_from(["Asia/Kolkata", "Asia/Kathmandu"]),
    w=windows,
)
def test_property_fixed_offset_zone_matches_shifted_utc(
    now: dt.datetime, zone: str, w: QuietWindow
) -> None:
    shift = {"Asia/Kolkata": dt.timedelta(hours=5, minutes=30)}.get(
        zone, dt.timedelta(hours=5, minutes=45)
    )
    wall = (now + shift).time()
    assert decide(now, zone, w).send is (w.is_empty or not is_inside(wall, w))


def test_a_night_whose_open_minute_the_clock_skips_runs_into_the_next_night():
    """02:01-02:00 leaves one open minute a night; the night New York springs forward skips
    02:00-03:00, so that night has none and the deferral runs to the next night's end."""
    now = dt.datetime(2026, 3, 8, tzinfo=UTC)  # 19:00 EST on the 7th
    decision = decide(now, "America/New_York", QuietWindow(dt.time(2, 1), dt.time(2, 0)))
    release = dt.datetime(2026, 3, 9, 6, 0, tzinfo=UTC)  # 02:00 EDT on the 9th
    assert decision == QuietDecision(False, release, "inside_window")
