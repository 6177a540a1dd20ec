"""Rate limits: the pure decisions, the Redis scripts against a real redis-server, the checker on
histories with known violations, and the reference on a real stack with a small limit."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from engines import engine  # noqa: F401 - the fixture, pandas and DuckDB
from helpers import TenantClient, apns_token, fcm_token
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ulid import ULID

from harness.checkers import rate_limit as checker
from harness.model.history import History, to_frame
from harness.model.oracle import expected_deliveries
from harness.model.population import Author, Device, Population, PopulationSpec, User
from harness.stack.supervisor import Stack, wait_until
from reference_impl.config import Config, ConfigError
from reference_impl.push_consumer import PoisonJob, PushConsumer, parse_job
from reference_impl.rate_limit import (
    RateLimiter,
    RateLimits,
    WindowLog,
    daily_key,
    day_key_expires_at,
    digest_closes_at_ms,
    digest_collapse_id,
    digest_notification_id,
    digest_text,
    held_member,
    local_day,
    parse_digest_collapse_id,
    parse_held_member,
    to_ms,
    window_floor_ms,
    window_keys,
)

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
CONSENT = {"granted_at": "2026-01-01T00:00:00+00:00", "version": "1"}


# -- pure decisions --------------------------------------------------------------------------


def test_limits_validate_and_zero_means_off():
    assert not RateLimits().window_on and not RateLimits().daily_on
    limits = RateLimits(per_window=3, window_seconds=5, daily_per_device_type=2)
    assert limits.window_on and limits.daily_on and limits.window_ms == 5000
    for bad in ({"per_window": -1}, {"window_seconds": 0}, {"daily_per_device_type": True}):
        with pytest.raises(ValueError):
            RateLimits(**bad)


def test_config_defaults_leave_every_scenario_unlimited_and_refuse_bad_values():
    config = Config()
    assert config.rate_limit_per_window == 0 and config.daily_limit_per_device_type == 0
    assert Config.from_mapping({"rate_limit_per_window": 5}).rate_limit_per_window == 5
    for bad in ({"rate_limit_per_window": -1}, {"rate_limit_window_seconds": 0}):
        with pytest.raises(ConfigError):
            Config.from_mapping(bad)
    assert Config.from_mapping({"defects": ["rate_limit_counts_redeliveries"]}).defects


def test_window_arithmetic_is_half_open():
    assert to_ms(T0) == 1_777_636_800_000
    with pytest.raises(ValueError):
        to_ms(datetime(2026, 5, 1, 12))
    # (now - window, now]: an admission exactly one window old has slid out.
    assert window_floor_ms(10_000, 4_000) == 6_000
    assert digest_closes_at_ms(6_000, 4_000) == 10_000


def test_window_log_admits_the_limit_then_holds_the_rest_in_one_digest_window():
    log = WindowLog.empty(RateLimits(per_window=2, window_seconds=10))
    decisions = [log.decide(f"n{i}", f"n{i}\tlike\ta{i}", 1_000 + i) for i in range(5)]
    assert [d.admitted for d in decisions] == [True, True, False, False, False]
    assert {d.digest_start_ms for d in decisions[2:]} == {1_002}
    assert [d.opened for d in decisions[2:]] == [True, False, False]
    assert [d.schedules_digest for d in decisions] == [False, False, True, False, False]
    assert log.close(1_002) == sorted(f"n{i}\tlike\ta{i}" for i in (2, 3, 4))


def test_window_log_answers_a_redelivery_the_same_without_counting_it():
    log = WindowLog.empty(RateLimits(per_window=1, window_seconds=10))
    assert log.decide("n1", "n1\tlike\ta", 0).admitted
    again = log.decide("n1", "n1\tlike\ta", 5)
    assert again.admitted and again.repeat
    held = log.decide("n2", "n2\tlike\tb", 6)
    copy = log.decide("n2", "n2\tlike\tb", 7)
    assert (copy.admitted, copy.digest_start_ms, copy.repeat) == (False, held.digest_start_ms, True)
    # The copy may be the one whose opener died before queueing the digest: it queues it too.
    assert copy.schedules_digest


def test_window_log_slides_and_opens_a_new_digest_window_after_the_first_closes():
    log = WindowLog.empty(RateLimits(per_window=1, window_seconds=10))
    assert log.decide("n1", "n1", 0).admitted
    first = log.decide("n2", "n2", 1)
    assert not log.decide("n3", "n3", 9_999).admitted  # n1 (scored 0) is in (-1, 9999]
    assert log.decide("n4", "n4", 10_000).admitted  # ... and has slid out of (0, 10000]
    later = log.decide("n5", "n5", 10_001)  # n4 fills the window; the digest window closed
    assert later.opened and later.digest_start_ms == 10_001 != first.digest_start_ms
    assert log.close(first.digest_start_ms) == ["n2", "n3"]


def test_local_day_is_the_users_calendar_day():
    instant = datetime(2026, 5, 1, 18, 30, tzinfo=UTC)
    assert local_day(instant, "UTC") == date(2026, 5, 1)
    assert local_day(instant, "Asia/Kathmandu") == date(2026, 5, 2)  # 00:15 at +05:45
    assert local_day(instant, "Pacific/Honolulu") == date(2026, 5, 1)
    assert local_day(instant, "Mars/Olympus") == date(2026, 5, 1)  # unknown zone: UTC bucket
    with pytest.raises(ValueError):
        local_day(datetime(2026, 5, 1), "UTC")


def test_day_keys_expire_a_day_after_the_local_day_ends():
    instant = datetime(2026, 5, 1, 18, 30, tzinfo=UTC)
    # Kathmandu's 2026-05-02 ends at 2026-05-02T18:15Z.
    end = datetime(2026, 5, 2, 18, 15, tzinfo=UTC) + timedelta(days=1)
    assert day_key_expires_at(instant, "Asia/Kathmandu") == end.timestamp()
    # Santiago skips 2025-09-07 00:00 (00:00 -> 01:00): that day starts at 04:00Z.
    saturday = datetime(2025, 9, 6, 16, 0, tzinfo=UTC)
    starts = datetime(2025, 9, 7, 4, 0, tzinfo=UTC)
    assert (
        day_key_expires_at(saturday, "America/Santiago") == (starts + timedelta(days=1)).timestamp()
    )


def test_digest_identity_is_deterministic_tenant_scoped_and_carries_its_window():
    nid = digest_notification_id("t1", "u1", "push", 1_777_636_800_000)
    assert nid == digest_notification_id("t1", "u1", "push", 1_777_636_800_000)
    assert ULID.from_str(nid).milliseconds == 1_777_636_800_000
    others = {
        digest_notification_id("t2", "u1", "push", 1_777_636_800_000),
        digest_notification_id("t1", "u2", "push", 1_777_636_800_000),
        digest_notification_id("t1", "u1", "email", 1_777_636_800_000),
        digest_notification_id("t1", "u1", "push", 1_777_636_800_001),
    }
    assert nid not in others and len(others) == 4
    collapse = digest_collapse_id(1_777_636_800_000, 7)
    assert parse_digest_collapse_id(collapse) == (1_777_636_800_000, 7)
    assert checker.parse_digest(collapse) == (1_777_636_800_000, 7)
    for junk in (None, "01JD5V3KX9B9Q0ZC4S6Y2M8N7P", "digest-1", "digest-a-2", "digest-1-2-3"):
        assert parse_digest_collapse_id(junk) is None and checker.parse_digest(junk) is None


def test_digest_text_counts_people_and_falls_back_for_a_mix():
    assert digest_text([("like", f"a{i}") for i in range(5)]) == "5 people liked your post"
    assert digest_text([("like", "a"), ("like", "a")]) == "1 person liked your post"
    assert digest_text([("mention", "a"), ("mention", "b")]) == "2 people mentioned you"
    assert digest_text([("like", "a"), ("comment", "b"), ("comment", "a")]) == (
        "3 new notifications from 2 people"
    )
    with pytest.raises(ValueError):
        digest_text([])


def test_keys_are_tenant_prefixed_with_the_user_as_hash_tag():
    keys = window_keys("t1", "u1", "push")
    assert [keys.sent, keys.held, keys.open] == [
        "t1:rl:{u1}:push:sent",
        "t1:rl:{u1}:push:held",
        "t1:rl:{u1}:push:open",
    ]
    assert daily_key("t1", "u1", "d1", "like", date(2026, 5, 2)) == (
        "t1:rld:{u1}:d1:like:2026-05-02"
    )
    assert parse_held_member(held_member("n1", "like", "a1").encode()) == ("n1", "like", "a1")


def test_malformed_digest_jobs_are_poison():
    nid = str(ULID())
    body = {
        "tenant_id": "t1",
        "notification_id": nid,
        "recipient_user_id": "u1",
        "author_id": "digest",
        "kind": "digest",
    }
    attrs = {"tenant_id": {"stringValue": "t1"}}
    good = {"channel": "push", "window_start_ms": 1, "closes_at_ms": 2}
    record = {"body": json.dumps({**body, "digest": good}), "messageAttributes": attrs}
    assert parse_job(record)["digest"] == good
    for bad in ({"channel": "push"}, {**good, "closes_at_ms": "2"}, [1]):
        with pytest.raises(PoisonJob):
            parse_job({"body": json.dumps({**body, "digest": bad}), "messageAttributes": attrs})


# -- the Redis scripts -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def bare_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[redis.Redis]:
    with Stack(tmp_path_factory.mktemp("rl-redis"), parts=["redis"], with_workers=False) as s:
        yield redis.Redis.from_url(s.info.redis_url)


def _tenant() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


@pytest.mark.integration
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    steps=st.lists(
        st.tuples(st.integers(0, 7), st.integers(0, 1_500), st.booleans()), min_size=1, max_size=30
    ),
    per_window=st.integers(1, 4),
)
def test_the_lua_window_follows_the_python_specification(bare_redis, steps, per_window):
    """Random jobs (ids repeat: redeliveries), clock advances and digest closes: the script
    and ``WindowLog`` give the same answers and hold the same ids for each digest."""
    limits = RateLimits(per_window=per_window, window_seconds=1)
    limiter = RateLimiter(bare_redis, limits)
    model = WindowLog.empty(limits)
    tenant, now = _tenant(), T0
    opened: list[int] = []
    for n, advance_ms, close in steps:
        now += timedelta(milliseconds=advance_ms)
        nid = f"n{n}"
        got = limiter.window(tenant, "u1", "push", nid, "like", f"a{n}", now)
        want = model.decide(nid, held_member(nid, "like", f"a{n}"), to_ms(now))
        assert got == want
        if got.opened:
            opened.append(got.digest_start_ms)
        if close and opened and to_ms(now) >= opened[0] + limits.window_ms:
            start = opened.pop(0)
            items = limiter.close_digest(tenant, "u1", "push", start)
            expected = [parse_held_member(m)[1:] for m in model.close(start)]
            assert sorted(items) == sorted(expected) and items


@pytest.mark.integration
def test_redelivered_jobs_do_not_spend_the_window_but_counted_receives_do(bare_redis):
    limits = RateLimits(per_window=3, window_seconds=60)
    tenant = _tenant()
    limiter = RateLimiter(bare_redis, limits)
    for _ in range(3):
        assert limiter.window(tenant, "u1", "push", "n1", "like", "a", T0).admitted
    assert bare_redis.zcard(window_keys(tenant, "u1", "push").sent) == 1
    assert bare_redis.ttl(window_keys(tenant, "u1", "push").sent) > 0

    defective = RateLimiter(bare_redis, limits, count_receives=True)
    answers = [defective.window(tenant, "u2", "push", "n1", "like", "a", T0) for _ in range(4)]
    assert [a.admitted for a in answers] == [True, True, True, False]
    assert bare_redis.zcard(window_keys(tenant, "u2", "push").sent) == 3


@pytest.mark.integration
def test_a_closed_digest_window_takes_no_more_jobs_and_closing_again_is_harmless(bare_redis):
    limits = RateLimits(per_window=1, window_seconds=10)
    tenant = _tenant()
    limiter = RateLimiter(bare_redis, limits)
    assert limiter.window(tenant, "u1", "push", "n1", "like", "a1", T0).admitted
    held = limiter.window(tenant, "u1", "push", "n2", "like", "a2", T0)
    start = held.digest_start_ms
    assert held.opened and start == to_ms(T0)
    assert limiter.close_digest(tenant, "u1", "push", start) == [("like", "a2")]
    # A job after the close opens a window of its own, even a skewed clock's "too early" one.
    late = limiter.window(tenant, "u1", "push", "n3", "like", "a3", T0 + timedelta(seconds=1))
    assert late.opened and late.digest_start_ms != start
    assert limiter.close_digest(tenant, "u1", "push", start) == [("like", "a2")]


@pytest.mark.integration
def test_daily_cap_is_per_device_kind_and_local_day_and_event_based(bare_redis):
    limits = RateLimits(daily_per_device_type=2)
    tenant = _tenant()
    limiter = RateLimiter(bare_redis, limits)
    zone = "Asia/Kathmandu"
    now = datetime.now(UTC)  # the keys expire at real instants: the clock must be today's

    def allowed(nid: str, device: str = "d1", kind: str = "like", at: datetime = now) -> bool:
        return limiter.daily(tenant, "u1", device, kind, nid, at, zone)

    assert [allowed("n1"), allowed("n2"), allowed("n3")] == [True, True, False]
    assert allowed("n1")  # a redelivery of an admitted notification is not a third one
    assert allowed("n3", device="d2") and allowed("n3", kind="comment")
    key = daily_key(tenant, "u1", "d1", "like", local_day(now, zone))
    assert bare_redis.scard(key) == 2
    assert bare_redis.expiretime(key) == day_key_expires_at(now, zone)
    # After local midnight: a new day's budget, but yesterday's ids are still recognised.
    tomorrow = now + timedelta(days=1)
    assert allowed("n1", at=tomorrow)
    assert [allowed("n4", at=tomorrow), allowed("n5", at=tomorrow)] == [True, True]
    assert not allowed("n6", at=tomorrow)

    defective = RateLimiter(bare_redis, limits, count_receives=True)
    answers = [defective.daily(tenant, "u2", "d1", "like", "n1", now, zone) for _ in range(3)]
    assert answers == [True, True, False]


# -- the checker on made-up histories --------------------------------------------------------

TENANT, FAN, TOKEN = "t", "fan", "tok-fan"


def _population(authors: int, *, zone: str = "UTC", devices: tuple[str, ...] = (TOKEN,)):
    users = [User(TENANT, FAN, zone, None, CONSENT, "none", None)]
    users += [User(TENANT, f"a{i}", "UTC", None, CONSENT, "none", None) for i in range(authors)]
    return Population(
        seed=0,
        started_at=T0.timestamp(),
        spec=PopulationSpec(),
        users=users,
        devices=[Device(TENANT, FAN, "fcm", token, False) for token in devices],
        authors=[Author(TENANT, f"a{i}", False, (FAN,)) for i in range(authors)],
    )


class _Run:
    """A history written by hand: injected notifications and the provider requests."""

    def __init__(self, authors: int, **population: Any) -> None:
        self.population = _population(authors, **population)
        self.rows: list[dict[str, Any]] = []
        self.ids = [str(ULID()) for _ in range(authors)]
        for i, nid in enumerate(self.ids):
            self.rows.append(
                {
                    "kind": "inject",
                    "time": T0.timestamp(),
                    "tenant_id": TENANT,
                    "author_id": f"a{i}",
                    "notification_id": nid,
                    "detail": "like",
                }
            )

    def inject_at(self, at: float) -> None:
        """Every notification injected at ``at`` seconds after T0 instead of at T0."""
        for row in self.rows:
            if row["kind"] == "inject":
                row["time"] = T0.timestamp() + at

    def inject_each(self, *at: float) -> None:
        """Notification i injected at ``at[i]`` seconds after T0."""
        rows = [row for row in self.rows if row["kind"] == "inject"]
        for row, when in zip(rows, at, strict=True):
            row["time"] = T0.timestamp() + when

    def request(self, nid: str, at: float, *, collapse: str | None = None, token: str = TOKEN):
        self.rows.append(
            {
                "kind": "provider",
                "time": T0.timestamp() + at,
                "tenant_id": TENANT,
                "notification_id": nid,
                "token": token,
                "provider": "fcm",
                "status": 200,
                "delivered": True,
                "collapse_id": collapse or nid,
            }
        )

    def publish(self, i: int, at: float, token: str = TOKEN) -> None:
        """What SNS's own ledger adds for a system that publishes through it."""
        self.rows.append(
            {
                "kind": "sns_publish",
                "time": T0.timestamp() + at,
                "tenant_id": TENANT,
                "notification_id": self.ids[i],
                "token": token,
                "provider": "sns",
            }
        )

    def send(self, *indexes: int, at: float = 0.1, token: str = TOKEN) -> None:
        for n, i in enumerate(indexes):
            self.request(self.ids[i], at + n * 0.01, token=token)

    def digest(self, opened_at: float, count: int, at: float, token: str = TOKEN) -> None:
        start = int((T0.timestamp() + opened_at) * 1000)
        nid = digest_notification_id(TENANT, FAN, "push", start)
        self.request(nid, at, collapse=digest_collapse_id(start, count), token=token)

    def check(self, per_window: int = 2, window_seconds: float = 10, **kw: Any):
        history = to_frame([{"seq": n, **row} for n, row in enumerate(self.rows)])
        injected = history[history["kind"] == "inject"]
        expectation = expected_deliveries(self.population, injected)
        return checker.check(
            self.population, expectation, history, per_window, window_seconds, **kw
        )


@pytest.mark.usefixtures("engine")
def test_checker_passes_limit_sends_plus_one_digest_per_device():
    run = _Run(5, devices=(TOKEN, "tok-2"))
    for token in (TOKEN, "tok-2"):
        run.send(0, 1, token=token)
        run.digest(opened_at=0.2, count=3, at=10.5, token=token)
    verdict = run.check()
    assert verdict.valid, verdict
    assert verdict.counts["admitted"] == 2 and verdict.counts["held"] == 3
    assert (verdict.counts["digests_expected"], verdict.counts["digests_delivered"]) == (1, 1)


@pytest.mark.usefixtures("engine")
def test_checker_fails_a_send_over_the_limit():
    run = _Run(3)
    run.send(0, 1, 2)
    verdict = run.check()
    assert not verdict.valid and verdict.counts["over_limit_sent"] == 1


@pytest.mark.usefixtures("engine")
def test_checker_allows_admissions_a_window_apart():
    run = _Run(4)
    run.send(0, 1, at=0.1)
    run.send(2, 3, at=10.2)
    assert run.check().valid


@pytest.mark.usefixtures("engine")
def test_checker_takes_an_earlier_sns_publish_as_the_admission():
    """Through SNS the publish is a later bound on the limiter's decision than the provider's
    request: three notifications injected at 0 and handed over by SNS ten seconds later may
    have been decided ten seconds apart, but published within 0.2 s they were not."""
    run = _Run(3)
    run.send(0, at=9.5)
    run.send(1, 2, at=10.2)
    assert run.check().counts["over_limit_sent"] == 0
    run.publish(0, at=0.1)
    run.publish(1, at=0.15)
    run.publish(2, at=0.2)
    verdict = run.check()
    assert not verdict.valid and verdict.counts["over_limit_sent"] == 1


@pytest.mark.usefixtures("engine")
def test_checker_does_not_blame_the_limiter_for_a_late_send():
    """Two admitted at once but sent 1.5 s late (a loaded machine), the third admitted when the
    window rolled and sent at once: the first attempts alone crowd one window, the decisions
    need not. The same attempts of notifications injected after the window opened are over."""
    run = _Run(3)
    run.send(0, 1, at=2.0)
    run.send(2, at=10.6)
    verdict = run.check(slack_s=1.0)
    assert verdict.counts["over_limit_sent"] == 0
    run.inject_at(1.7)  # all three sent by the harness at 1.7: their decisions share a window
    verdict = run.check(slack_s=1.0)
    assert not verdict.valid and verdict.counts["over_limit_sent"] == 1


@pytest.mark.usefixtures("engine")
def test_checker_fails_held_notifications_without_a_digest():
    run = _Run(5)
    run.send(0, 1)
    verdict = run.check()
    assert not verdict.valid
    assert verdict.counts["digests_missing"] == 1 and verdict.counts["digest_undercount"] == 3


@pytest.mark.usefixtures("engine")
def test_checker_fails_a_digest_delivered_twice_and_two_digests_for_one_window():
    run = _Run(5)
    run.send(0, 1)
    run.digest(opened_at=0.2, count=3, at=10.5)
    run.digest(opened_at=0.2, count=3, at=11.0)
    assert run.check().counts["duplicate_digests"] == 1
    run = _Run(5)
    run.send(0, 1)
    run.digest(opened_at=0.2, count=2, at=10.5)
    run.digest(opened_at=1.2, count=1, at=11.5)  # opened while the first was still open
    verdict = run.check()
    assert not verdict.valid and verdict.counts["duplicate_digests"] == 1


@pytest.mark.usefixtures("engine")
def test_checker_fails_a_digest_that_counts_more_than_was_held():
    run = _Run(3)
    run.send(0, 1)
    run.digest(opened_at=0.2, count=2, at=10.5)  # only one notification was held
    verdict = run.check()
    assert not verdict.valid and verdict.counts["digest_overcount"] == 1


@pytest.mark.usefixtures("engine")
def test_checker_fails_a_digest_opened_while_the_window_had_room():
    """What counting receives looks like: a redelivered copy of the first notification took
    the second slot, so the second notification went into a digest."""
    run = _Run(2)
    run.send(0)
    run.digest(opened_at=0.3, count=1, at=10.5)
    verdict = run.check()
    assert not verdict.valid and verdict.counts["redeliveries_counted"] == 1
    assert verdict.details["redelivery_examples"][0]["admitted_before"] == 1


@pytest.mark.usefixtures("engine")
@pytest.mark.parametrize(
    ("late_at", "injected_late", "counted"),
    [
        # CI at load ~20: admitted before the digest opened, sent seconds after it.
        (3.0, 0.0, 0),
        # Sent only when a later window could admit it: the digest opened with room.
        (10.5, 0.0, 1),
        # Injected after the digest opened: it cannot have spent the window before.
        (3.0, 0.6, 1),
    ],
)
def test_a_send_late_after_its_admission_is_not_a_redelivery(late_at, injected_late, counted):
    """Window 10 s, limit 2: the first notification sent at once, the second after the third
    opened a digest at 0.5 s."""
    run = _Run(3)
    run.inject_each(0.0, injected_late, 0.0)
    run.send(0, at=0.1)
    run.request(run.ids[1], late_at)
    run.digest(opened_at=0.5, count=1, at=10.6)
    verdict = run.check(per_window=2, window_seconds=10)
    assert verdict.counts["redeliveries_counted"] == counted, verdict.counts


@pytest.mark.usefixtures("engine")
def test_checker_daily_cap_per_device_kind_and_local_day():
    run = _Run(3, zone="Asia/Kathmandu")
    run.send(0, 1)
    verdict = run.check(per_window=0, daily_limit=1)
    assert not verdict.valid and verdict.counts["over_daily_limit"] == 1
    # The third notification, blocked on its only device by a full bucket, is not "lost".
    run = _Run(2)
    run.send(0)
    assert run.check(per_window=5, daily_limit=1).valid


@pytest.mark.usefixtures("engine")
@pytest.mark.parametrize(
    ("first_s", "second_s", "over"),
    [
        # 18:10 and 18:20 UTC on 1 May: one UTC day, but Kathmandu (+05:45) turns 2 May at
        # 18:15 UTC: two local days, so the second is within the cap.
        (6 * 3600 + 600, 6 * 3600 + 1200, 0),
        # 23:50 and 00:10 UTC: two UTC days, one local day (05:35 and 05:55 on 2 May).
        (11 * 3600 + 3000, 12 * 3600 + 600, 1),
    ],
)
def test_checker_daily_cap_buckets_by_the_recipients_local_day_not_utc(first_s, second_s, over):
    run = _Run(2, zone="Asia/Kathmandu")
    run.send(0, at=first_s)
    run.send(1, at=second_s)
    # Each decided within a second of its send: its day is certain.
    run.inject_each(first_s - 1, second_s - 1)
    verdict = run.check(per_window=0, daily_limit=1)
    assert verdict.counts["over_daily_limit"] == over
    assert verdict.counts["daily_buckets_at_limit"] == 2 - over


# -- the daily cap on a moved clock (harness/contract/clock.py) -------------------------------

# The system's clock shows this offset ahead of real time: T0 + 2 s reads as midnight in the
# zone named (T0 is 12:00 UTC on 1 May).
UTC_MIDNIGHT_AT_2S = 12 * 3600 - 2  # 00:00 UTC on 2 May
KOLKATA_MIDNIGHT_AT_2S = 6 * 3600 + 1800 - 2  # 00:00 in Kolkata (+05:30) = 18:30 UTC


@pytest.mark.usefixtures("engine")
@pytest.mark.parametrize(
    ("zone", "offset", "over"),
    [
        # UTC's midnight between the two sends: a new day for a UTC user, not for Kolkata's
        # (05:29:59 and 05:30:01 on 2 May): a cap that reset at UTC midnight sent one too many.
        ("UTC", UTC_MIDNIGHT_AT_2S, 0),
        ("Asia/Kolkata", UTC_MIDNIGHT_AT_2S, 1),
        # Kolkata's own midnight between them: a new day there.
        ("Asia/Kolkata", KOLKATA_MIDNIGHT_AT_2S, 0),
        # The real clock: 17:30 in Kolkata, one day.
        ("Asia/Kolkata", 0, 1),
    ],
)
def test_checker_takes_the_cap_day_on_the_systems_clock(zone, offset, over):
    run = _Run(2, zone=zone)
    run.send(0, at=1.0)
    run.send(1, at=3.0)
    run.inject_each(0.5, 2.5)
    verdict = run.check(per_window=0, daily_limit=1, clock_offset_s=offset)
    assert verdict.counts["over_daily_limit"] == over
    assert verdict.counts["withheld_below_daily_limit"] == 0


@pytest.mark.usefixtures("engine")
def test_checker_lets_a_send_decided_across_midnight_count_on_either_day():
    """Injected before midnight, first sent after: its decision may lie on either day, so it
    is put on the one with room (the day after), whatever the order the system counted in."""
    run = _Run(2, zone="UTC")
    run.send(0, at=1.0)
    run.send(1, at=2.2)
    run.inject_each(0.5, 1.8)
    assert run.check(per_window=0, daily_limit=1, clock_offset_s=UTC_MIDNIGHT_AT_2S).valid
    # Both certainly after midnight: one too many.
    run.inject_each(2.1, 2.1)
    run.rows = [
        r for r in run.rows if not (r["kind"] == "provider" and r["time"] < T0.timestamp() + 2)
    ]
    run.send(0, at=2.3)
    verdict = run.check(per_window=0, daily_limit=1, clock_offset_s=UTC_MIDNIGHT_AT_2S)
    assert verdict.counts["over_daily_limit"] == 1


@pytest.mark.usefixtures("engine")
@pytest.mark.parametrize(
    ("zone", "injected", "offset", "withheld"),
    [
        # After the user's midnight the cap is empty again: withholding is the cap's fault.
        ("UTC", 2.5, UTC_MIDNIGHT_AT_2S, 1),
        # Injected before midnight: it may have been decided on the full day.
        ("UTC", 1.5, UTC_MIDNIGHT_AT_2S, 0),
        # Kolkata's day did not change at UTC midnight: still full.
        ("Asia/Kolkata", 2.5, UTC_MIDNIGHT_AT_2S, 0),
        ("Asia/Kolkata", 2.5, KOLKATA_MIDNIGHT_AT_2S, 1),
        ("UTC", 2.5, 0, 0),
    ],
)
def test_checker_counts_sends_withheld_after_the_users_midnight(zone, injected, offset, withheld):
    run = _Run(2, zone=zone)
    run.send(0, at=1.0)
    run.inject_each(0.5, injected)
    verdict = run.check(per_window=0, daily_limit=1, clock_offset_s=offset)
    assert verdict.counts["withheld_below_daily_limit"] == withheld
    assert verdict.valid == (withheld == 0)
    if withheld:
        [example] = verdict.details["withheld_examples"]
        assert example["notification_id"] == run.ids[1] and example["token"] == TOKEN


@pytest.mark.usefixtures("engine")
@pytest.mark.parametrize(("second", "withheld"), [((1.8, 2.2), 0), ((1.0, 1.5), 1)])
def test_checker_lets_the_cap_fill_with_a_send_decided_across_midnight(second, withheld):
    """Seen in a clean day-boundary run: one send before midnight, one injected before and
    sent after it, one after; the fourth withheld. The system may have counted the second on
    the new day, filling it (cap 2): withholding the fourth is then right. Only when the second
    surely fell on the old day is the new day's cap short."""
    run = _Run(4, zone="UTC")
    run.send(0, at=1.0)
    run.send(1, at=second[1])
    run.send(2, at=2.7)
    run.inject_each(0.5, second[0], 2.5, 3.0)
    verdict = run.check(per_window=0, daily_limit=2, clock_offset_s=UTC_MIDNIGHT_AT_2S)
    assert verdict.counts["withheld_below_daily_limit"] == withheld
    assert verdict.counts["over_daily_limit"] == 0


@pytest.mark.usefixtures("engine")
def test_checker_reads_a_digest_window_opened_on_the_systems_clock():
    """The collapse id names the window's start on the system's clock: read back in real
    time, the digest's window holds the two admitted sends (no redelivery counted)."""
    offset = UTC_MIDNIGHT_AT_2S
    run = _Run(5)
    run.send(0, 1)
    start = int((T0.timestamp() + 0.2 + offset) * 1000)
    nid = digest_notification_id(TENANT, FAN, "push", start)
    run.request(nid, 10.5, collapse=digest_collapse_id(start, 3))
    assert run.check(clock_offset_s=offset).valid
    verdict = run.check(clock_offset_s=0)
    assert verdict.counts["redeliveries_counted"] == 1


@pytest.mark.usefixtures("engine")
@pytest.mark.parametrize(("filled_at", "counted"), [(0.1, 0), (5.0, 1)])
def test_a_window_slot_spent_on_a_capped_notification_is_not_a_redelivery(filled_at, counted):
    """Window 2, cap 1: the first notification fills the device's bucket; the second, admitted
    by the window, is blocked by the cap (never sent); the third is held in a digest. The
    digest opened with one send in the window, but the capped one may have spent the other
    slot: not a redelivery. Unless the bucket filled only after the digest opened."""
    run = _Run(3)
    run.send(0, at=filled_at)
    run.digest(opened_at=0.3, count=1, at=10.5)
    verdict = run.check(per_window=2, daily_limit=1)
    assert verdict.counts["redeliveries_counted"] == counted, verdict.counts
    assert verdict.counts["over_daily_limit"] == 0


@pytest.mark.usefixtures("engine")
def test_checker_with_the_limits_off_judges_nothing():
    run = _Run(3)
    run.send(0, 1, 2)
    verdict = run.check(per_window=0)
    assert verdict.valid and verdict.counts["over_limit_sent"] == 0
    assert verdict.counts["digests_expected"] == 0


# -- the reference on a real stack -----------------------------------------------------------

# The window must outlast the burst's own spread from post to consumer: at 3 s a loaded machine
# (load average ~20) spread seven likes over two windows, and the test saw more sends than LIMIT.
LIMIT, WINDOW_S = 3, 8


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    overrides = {
        "rate_limit_per_window": LIMIT,
        "rate_limit_window_seconds": WINDOW_S,
        # In-flight copies of one job retry after half a lease: keep the redelivery test short.
        "dedup_lease_seconds": 4,
    }
    with Stack(tmp_path_factory.mktemp("rl-stack"), reference_overrides=overrides) as running:
        yield running


def _queue_idle(stack: Stack) -> bool:
    sqs = stack.info.aws_client("sqs")
    url = sqs.get_queue_url(QueueName="fanout-push")["QueueUrl"]
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    names = ("", "NotVisible", "Delayed")
    return sum(int(attrs[f"ApproximateNumberOfMessages{n}"]) for n in names) == 0


def _evidence(
    t: TenantClient,
    fan: str,
    tokens: list[tuple[str, str]],
    jobs: dict[str, str],
    posted_at: float | None = None,
):
    """Population, expectation and history of one test's tenant, for the checker; the jobs
    injected at ``posted_at`` (default now: a test that judges no window's timing)."""
    authors = sorted(set(jobs.values()))
    population = Population(
        seed=0,
        started_at=T0.timestamp(),
        spec=PopulationSpec(),
        users=[User(t.tenant, fan, "UTC", None, CONSENT, "none", None)],
        devices=[Device(t.tenant, fan, p, token, False) for p, token in tokens],
        authors=[Author(t.tenant, a, False, (fan,)) for a in authors],
    )
    history = History()
    for nid, author in jobs.items():
        history.append(
            "inject", tenant_id=t.tenant, author_id=author, notification_id=nid, detail="like",
            **({} if posted_at is None else {"time": posted_at}),
        )  # fmt: skip
    history.extend_provider(t.ledger())
    frame = history.frame()
    expectation = expected_deliveries(population, frame[frame["kind"] == "inject"])
    return population, expectation, frame


@pytest.mark.integration
def test_a_burst_from_many_authors_gives_limit_sends_and_one_digest(limited):
    t = TenantClient(limited)
    tokens = [("fcm", fcm_token(1, t.tenant)), ("apns", apns_token(2, t.tenant))]
    t.user("fan", devices=tokens)
    authors = [f"a{i}" for i in range(LIMIT + 4)]
    for author in authors:
        t.follow(author, ["fan"])
    posted_at = time.time()  # when the burst was injected: the limiter decided after it
    jobs = {t.post(author, kind="like"): author for author in authors}
    # LIMIT individual pushes and one digest, to each of the two devices.
    wait_until(lambda: len(t.ledger()) >= 2 * (LIMIT + 1), 60, "the sends and the digest")
    wait_until(lambda: _queue_idle(limited), 20, "the push queue to drain")
    rows = t.ledger()
    assert {r["status"] for r in rows} == {200}
    individual = [r for r in rows if r["notification_id"] in jobs]
    digests = [r for r in rows if r["notification_id"] not in jobs]
    assert len({r["notification_id"] for r in individual}) == LIMIT
    assert len(individual) == 2 * LIMIT
    assert sorted(r["token"] for r in digests) == sorted(token for _, token in tokens)
    collapse = {parse_digest_collapse_id(r["collapse_id"]) for r in digests}
    assert len(collapse) == 1
    [(start, count)] = collapse
    assert count == len(authors) - LIMIT
    assert {r["notification_id"] for r in digests} == {
        digest_notification_id(t.tenant, "fan", "push", start)
    }
    verdict = checker.check(*_evidence(t, "fan", tokens, jobs, posted_at), LIMIT, WINDOW_S)
    assert verdict.valid, verdict
    assert verdict.counts["digests_delivered"] == 1 and verdict.counts["held"] == count


def _job(tenant: str, user: str, author: str, nid: str) -> dict[str, Any]:
    return {
        "tenant_id": tenant,
        "author_id": author,
        "kind": "like",
        "object_id": "o1",
        "notification_id": nid,
        "accepted_at": datetime.now(UTC).isoformat(),
        "recipient_user_id": user,
        "channel": "push",
    }


@pytest.mark.integration
def test_redelivered_jobs_do_not_consume_the_limit(limited):
    t = TenantClient(limited)
    tokens = [("fcm", fcm_token(1, t.tenant))]
    t.user("fan", devices=tokens)
    jobs = {str(ULID()): f"a{i}" for i in range(LIMIT)}
    # Each notification arrives as many times as its position: 1 + 2 + 3 receives, 3 ids.
    copies = [nid for i, nid in enumerate(jobs) for _ in range(i + 1)]
    sqs = limited.info.aws_client("sqs")
    url = sqs.get_queue_url(QueueName="fanout-push")["QueueUrl"]
    sqs.send_message_batch(
        QueueUrl=url,
        Entries=[
            {
                "Id": str(n),
                "MessageBody": json.dumps(_job(t.tenant, "fan", jobs[nid], nid)),
                "MessageAttributes": {"tenant_id": {"DataType": "String", "StringValue": t.tenant}},
            }
            for n, nid in enumerate(copies)
        ],
    )
    wait_until(lambda: len(t.ledger()) >= LIMIT, 30, "the three sends")
    wait_until(lambda: _queue_idle(limited), 30, "every copy to be processed")
    rows = t.ledger()
    assert sorted(r["notification_id"] for r in rows) == sorted(jobs)  # each once, no digest
    cache = redis.Redis.from_url(limited.info.redis_url)
    assert cache.zcard(window_keys(t.tenant, "fan", "push").sent) == LIMIT
    assert not cache.exists(window_keys(t.tenant, "fan", "push").held)
    assert checker.check(*_evidence(t, "fan", tokens, jobs), LIMIT, WINDOW_S).valid


@pytest.mark.integration
def test_the_checker_fails_a_consumer_that_counts_redeliveries(limited):
    """The defect ``rate_limit_counts_redeliveries`` in a consumer of our own: a redelivered
    copy of the first notification takes the second slot, so the second is digested."""
    values = json.loads(Path(limited.info.reference_config).read_text())
    config = Config.from_mapping(
        {
            **values,
            "defects": ["rate_limit_counts_redeliveries"],
            "rate_limit_per_window": 2,
            "rate_limit_window_seconds": 2,
        }
    )
    consumer = PushConsumer(config)
    t = TenantClient(limited)
    tokens = [("fcm", fcm_token(1, t.tenant))]
    t.user("fan", devices=tokens)
    first, second = str(ULID()), str(ULID())
    jobs = {first: "a0", second: "a1"}
    try:
        for nid in (first, first, second):
            assert consumer.deliver(_job(t.tenant, "fan", jobs[nid], nid)) is None
    finally:
        consumer.apns.close()
        consumer.fcm.close()
    # The digest job went to the stack's queue; the stack's consumer sends it when it closes.
    wait_until(lambda: len(t.ledger()) >= 2, 20, "the first send and the digest")
    rows = t.ledger()
    assert [r["notification_id"] for r in rows if r["notification_id"] in jobs] == [first]
    verdict = checker.check(*_evidence(t, "fan", tokens, jobs), 2, 2)
    assert not verdict.valid
    assert verdict.counts["redeliveries_counted"] == 1


# -- what a stated limit withheld is not lost (harness/checkers/limited.py) ------------------


def _evidence_of(run: _Run, **policy: Any):
    from harness.checkers.evidence import evidence_from
    from harness.model.system import SystemPolicy

    history = to_frame([{"seq": n, **row} for n, row in enumerate(run.rows)])
    return evidence_from(run.population, history, SystemPolicy(**policy)), history


def test_pushes_a_full_daily_cap_withheld_are_optional_not_lost():
    """A clean reference with a cap of one a day failed effectively_once on smoke (52 lost)
    before: the oracle required every expected push, the cap's excess included."""
    from harness.checkers import effectively_once

    run = _Run(3)
    run.send(0)
    evidence, history = _evidence_of(run, daily_limit_per_device_type=1)
    expectation = evidence.expectation
    assert len(expectation.deliveries) == 1 and len(expectation.limited) == 2
    assert set(expectation.optional["why"]) == {"limited"}
    verdict = effectively_once.check(expectation, history)
    assert verdict.valid and verdict.counts["lost"] == 0, verdict
    # The same history judged as if no limit were stated: two lost.
    unlimited, _ = _evidence_of(run)
    assert effectively_once.check(unlimited.expectation, history).counts["lost"] == 2
    # rate_limit still sees the withheld pushes: the same verdict either way.
    for expected in (expectation, unlimited.expectation):
        limit = checker.check(run.population, expected, history, 0, 10, daily_limit=1)
        assert limit.valid and limit.counts["daily_buckets_at_limit"] == 1


def test_a_cap_not_yet_full_leaves_a_missing_push_lost():
    from harness.checkers import effectively_once

    run = _Run(3)
    run.send(0)
    evidence, history = _evidence_of(run, daily_limit_per_device_type=2)
    assert len(evidence.expectation.limited) == 0
    assert effectively_once.check(evidence.expectation, history).counts["lost"] == 2
    limit = checker.check(run.population, evidence.expectation, history, 0, 10, daily_limit=2)
    assert limit.counts["withheld_below_daily_limit"] == 2


def test_pushes_a_busy_window_held_for_a_digest_are_optional_not_lost():
    from harness.checkers import effectively_once

    run = _Run(5)
    run.send(0, 1)
    run.digest(opened_at=0.2, count=3, at=10.5)
    evidence, history = _evidence_of(run, rate_limit_per_window=2, rate_limit_window_seconds=10)
    assert len(evidence.expectation.limited) == 3
    assert effectively_once.check(evidence.expectation, history).valid
    # A user under the window's count keeps every push required.
    quiet = _Run(5)
    quiet.send(0)
    evidence, history = _evidence_of(quiet, rate_limit_per_window=2)
    assert effectively_once.check(evidence.expectation, history).counts["lost"] == 4
