"""Users the run changes mid-run: the oracle's timeline, the quiet-window evaluation it uses, and
the preference_changes and erasure checkers over hand-made histories."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.checkers import erasure, preference_changes
from harness.checkers.evidence import evidence_from
from harness.checkers.registry import known, run_probe
from harness.checkers.store import HistoryStore
from harness.model import local_time
from harness.model.history import History
from harness.model.population import (
    PopulationSpec,
    consent_stands,
    generate,
    preferences_body,
)
from harness.model.system import SystemPolicy
from harness.model.timeline import from_history
from harness.run.actions import (
    UNKNOWN_ZONE,
    UNREADABLE_WINDOW,
    ActionError,
    kinds_for,
    preference_change,
    validate,
    zone_covering,
)

START = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)
T0 = START.timestamp()
SPEC = PopulationSpec(tenants=1, users_per_tenant=40, celebrity_followers=30, regular_authors=1)


def test_a_window_wrapping_midnight_in_the_users_zone():
    window = {"start": "22:00", "end": "07:00"}
    tokyo = ZoneInfo("Asia/Tokyo")
    at = datetime(2026, 11, 24, 23, 30, tzinfo=tokyo).timestamp()
    assert local_time.inside(window, "Asia/Tokyo", at)
    end = local_time.window_end(window, "Asia/Tokyo", at)
    assert end == datetime(2026, 11, 25, 7, 0, tzinfo=tokyo).timestamp()
    # The classic bug: the same instant in UTC is 14:30, outside.
    assert not local_time.inside(window, "UTC", at)
    assert local_time.window_end(window, "Asia/Tokyo", at + 9 * 3600) is None


@given(st.integers(min_value=0, max_value=2**31), st.sampled_from(["Asia/Kathmandu", "UTC",
       "America/St_Johns", "Pacific/Chatham"]))  # fmt: skip
def test_the_oracles_evaluation_agrees_with_the_planned_quiet_states(seed, zone):
    population = generate(seed % 1000, START, SPEC)
    for user in population.users:
        if user.quiet_state == "whole_run":
            assert local_time.inside(user.quiet_hours, user.zone, T0 + 60)
        elif user.quiet_state == "ends_during_run":
            assert local_time.window_end(user.quiet_hours, user.zone, T0) == user.quiet_until
        elif user.quiet_state == "outside":
            assert not local_time.inside(user.quiet_hours, user.zone, T0 + 60)
    assert zone in ("Asia/Kathmandu", "UTC", "America/St_Johns", "Pacific/Chatham")


def test_a_zone_change_that_puts_the_present_inside_the_window():
    population = generate(5, START, SPEC)
    user = next(u for u in population.users if u.quiet_state == "outside")
    zone = zone_covering(user.quiet_hours, T0, T0 + 3600)
    assert zone is not None
    assert local_time.inside(user.quiet_hours, zone, T0)
    assert local_time.window_end(user.quiet_hours, zone, T0) > T0 + 3600
    body = preference_change("change_zone", user, T0, T0 + 3600)
    assert body == {**preferences_body(user), "zone": zone}


def _scene():
    population = generate(5, START, SPEC)
    author = next(a for a in population.authors if a.celebrity)
    user = next(
        population.user("tenant-0", f)
        for f in author.followers
        if population.user("tenant-0", f).consent is not None
        and population.user("tenant-0", f).quiet_state == "none"
        and any(not d.dead for d in population.devices_of("tenant-0", f))
    )
    device = next(d for d in population.devices_of("tenant-0", user.user_id) if not d.dead)
    return population, author, user, device


def _change(history, user, sent, acked, **detail):
    history.append("change", time=sent, end=acked, tenant_id=user.tenant_id,
                   user_id=user.user_id, detail=json.dumps({"ok": True, **detail}))  # fmt: skip


def _inject(history, author, nid, at):
    history.append("inject", time=at, end=at + 0.01, tenant_id=author.tenant_id,
                   author_id=author.user_id, notification_id=nid, detail="post")  # fmt: skip


def _deliver(history, device, nid, at):
    history.extend_provider([{"received_at": at, "tenant_id": device.tenant_id,
                              "notification_id": nid, "token": device.token,
                              "provider": device.platform, "project": None, "status": 200,
                              "reason": None}])  # fmt: skip


def test_a_withdrawal_allows_no_delivery_after_the_bound_and_makes_the_oracle_unsure_before():
    population, author, user, device = _scene()
    history = History()
    withdrawn = {**preferences_body(user), "push_consent": None}
    _change(history, user, T0 + 10, T0 + 10.1, change="preferences", preferences=withdrawn)
    _inject(history, author, "before", T0 + 5)  # may: the old state is still possible
    _inject(history, author, "after", T0 + 30)  # must not
    evidence = evidence_from(population, history.frame(), bound_s=5)

    def of_user(frame):
        return set(frame.loc[frame["user_id"] == user.user_id, "notification_id"])

    optional = of_user(evidence.expectation.optional)
    expected = of_user(evidence.expectation.deliveries)
    assert optional == {"before"} and not expected
    _deliver(history, device, "before", T0 + 12)  # the cache may still answer: allowed
    assert preference_changes.check(evidence_from(population, history.frame(), bound_s=5)).valid
    _deliver(history, device, "after", T0 + 31)
    verdict = preference_changes.check(evidence_from(population, history.frame(), bound_s=5))
    assert not verdict.valid and verdict.counts["after_withdrawal"] == 1


@pytest.mark.parametrize(
    ("kind", "reason"),
    [("revoke_consent", "after_withdrawal"), ("switch_off_push", "after_push_switched_off")],
)
def test_a_revoked_record_or_push_switched_off_allows_no_delivery_after_the_bound(kind, reason):
    # Two ways to say "no more pushes" that keep a consent record: its revoked_at set (the
    # proof it was once given stays), or the app's push switch off with consent untouched.
    population, author, user, device = _scene()
    body = preference_change(kind, user, T0 + 10, T0 + 3600)
    assert body is not None and body["push_consent"]
    if kind == "revoke_consent":
        assert body["push_consent"]["revoked_at"] > body["push_consent"]["granted_at"]
    else:
        assert body["channels"]["push"] is False
    history = History()
    _change(history, user, T0 + 10, T0 + 10.1, change="preferences", what=kind,
            preferences=body)  # fmt: skip
    _inject(history, author, "before", T0 + 5)
    _inject(history, author, "after", T0 + 30)
    evidence = evidence_from(population, history.frame(), bound_s=5)
    assert not (evidence.expectation.deliveries["user_id"] == user.user_id).any()
    _deliver(history, device, "before", T0 + 12)  # within the bound: allowed
    assert preference_changes.check(evidence_from(population, history.frame(), bound_s=5)).valid
    _deliver(history, device, "after", T0 + 31)
    verdict = preference_changes.check(evidence_from(population, history.frame(), bound_s=5))
    assert not verdict.valid and verdict.counts[reason] == 1


def _celebrity_follower_without_consent():
    """A celebrity's follower with no push consent, no quiet hours and a live device."""
    population = generate(5, START, SPEC)
    author = next(a for a in population.authors if a.celebrity)
    user = next(
        population.user("tenant-0", f)
        for f in author.followers
        if population.user("tenant-0", f).consent is None
        and population.user("tenant-0", f).quiet_state == "none"
        and any(not d.dead for d in population.devices_of("tenant-0", f))
    )
    return population, author, user


def test_a_granted_consent_makes_later_notifications_due():
    population, author, user = _celebrity_follower_without_consent()
    granted = {**preferences_body(user), "push_consent": {"granted_at": "x", "version": "1"}}
    history = History()
    _change(history, user, T0 + 10, T0 + 10.1, change="preferences", preferences=granted)
    _inject(history, author, "after", T0 + 30)
    verdict = preference_changes.check(evidence_from(population, history.frame(), bound_s=5))
    assert not verdict.valid and verdict.counts["missed"] >= 1


def test_a_consent_given_again_after_a_withdrawal_makes_later_notifications_due():
    """Given, withdrawn, given again: the record keeps its older ``revoked_at``, and the consent
    stands (a system that reads any ``revoked_at`` as a withdrawal misses the notification)."""
    population, author, user = _celebrity_follower_without_consent()
    again = preference_change("regrant_consent", user, T0, T0 + 3600)
    assert again is not None and again["push_consent"]["revoked_at"]
    history = History()
    _change(history, user, T0 + 10, T0 + 10.1, change="preferences", preferences=again)
    _inject(history, author, "after", T0 + 30)
    verdict = preference_changes.check(evidence_from(population, history.frame(), bound_s=5))
    assert not verdict.valid and verdict.counts["missed"] >= 1


# -- the stream stopped: write-through alone for API changes, the cache's TTL for table writes --


def _stream_stopped(history, start, stop, unavailable="preferences_stream"):
    """A fault window as the nemesis records it: what it took away is in its rows."""
    for phase, at in (("start", start), ("stop", stop)):
        detail = {"window": "w1", "fault": "invalidator-stop", "phase": phase, "params": {},
                  "unavailable": unavailable}  # fmt: skip
        history.append("fault", time=at, detail=json.dumps(detail))


def _withdrawn_in_window(via, window=(T0 + 5, T0 + 60), unavailable="preferences_stream"):
    population, author, user, device = _scene()
    history = History()
    if window is not None:
        _stream_stopped(history, *window, unavailable=unavailable)
    withdrawn = {**preferences_body(user), "push_consent": None}
    _change(history, user, T0 + 10, T0 + 10.1, change="preferences", via=via,
            preferences=withdrawn)  # fmt: skip
    _inject(history, author, "after", T0 + 30)
    _deliver(history, device, "after", T0 + 31)  # 21 s after the acknowledgement
    return population, history


def test_an_api_change_while_the_stream_is_stopped_must_take_effect_within_the_bound():
    """Write-through alone holds the promise for an API change: the stream being stopped
    excuses nothing."""
    population, history = _withdrawn_in_window("api")
    verdict = preference_changes.check(evidence_from(population, history.frame(), bound_s=5))
    assert not verdict.valid and verdict.counts["after_withdrawal"] == 1
    assert verdict.counts["api_changes_while_stream_stopped"] == 1
    assert verdict.counts["ttl_bounded_changes"] == 0
    assert verdict.details["stream_stopped"] == [[T0 + 5, T0 + 60]]


def test_a_table_change_while_the_stream_is_stopped_is_bounded_by_the_cache_ttl():
    """Only the stream could tell the system of a table write: stopped, the cache's TTL bounds
    it. The same delivery with the stream at work, or with a window that took something else
    away, is a violation."""
    population, history = _withdrawn_in_window("table")
    verdict = preference_changes.check(evidence_from(population, history.frame(), bound_s=5))
    assert verdict.valid, verdict
    assert verdict.counts["ttl_bounded_changes"] == 1 and verdict.counts["deliveries_judged"] == 1
    assert verdict.details["cache_ttl_s"] == 300.0
    for window, unavailable in [(None, None), ((T0 + 5, T0 + 60), "dedup")]:
        population, history = _withdrawn_in_window("table", window, unavailable)
        verdict = preference_changes.check(evidence_from(population, history.frame(), bound_s=5))
        assert not verdict.valid and verdict.counts["after_withdrawal"] == 1
        assert verdict.counts["ttl_bounded_changes"] == 0


@pytest.mark.parametrize(
    ("window", "bounded"),
    [
        ((T0 + 12, T0 + 20), True),  # stopped inside the bound after the acknowledgement
        ((T0 + 1, T0 + 10.05), True),  # stopped until just after it was sent
        ((T0 + 15.2, T0 + 20), False),  # stopped after the stream had its bound to deliver it
        ((T0 + 1, T0 + 9.9), False),  # back before the change was sent
    ],
)
def test_a_table_change_is_ttl_bounded_only_when_the_stream_could_have_been_stopped_for_it(
    window, bounded
):
    population, history = _withdrawn_in_window("table", window)
    verdict = preference_changes.check(evidence_from(population, history.frame(), bound_s=5))
    assert verdict.valid is bounded
    assert verdict.counts["ttl_bounded_changes"] == int(bounded)


def test_the_ttl_bound_is_the_systems_stated_one_and_it_ends():
    population, history = _withdrawn_in_window("table")
    short = SystemPolicy(preferences_cache_ttl_s=15.0)  # the delivery came 21 s after: too late
    verdict = preference_changes.check(evidence_from(population, history.frame(), short, 5))
    assert not verdict.valid and verdict.counts["after_withdrawal"] == 1
    _, author, _, device = _scene()
    _inject(history, author, "much-later", T0 + 400)
    _deliver(history, device, "much-later", T0 + 401)  # past the default 300 s and the bound
    verdict = preference_changes.check(evidence_from(population, history.frame(), bound_s=5))
    assert not verdict.valid and verdict.counts["after_withdrawal"] == 1


@pytest.mark.parametrize(("via", "missed"), [("api", 1), ("table", 0)])
def test_a_grant_written_while_the_stream_is_stopped_is_due_only_through_the_api(via, missed):
    population, author, user = _celebrity_follower_without_consent()
    granted = {**preferences_body(user), "push_consent": {"granted_at": "x", "version": "1"}}
    history = History()
    _stream_stopped(history, T0 + 5, T0 + 60)
    _change(history, user, T0 + 10, T0 + 10.1, change="preferences", via=via,
            preferences=granted)  # fmt: skip
    _inject(history, author, "after", T0 + 30)
    verdict = preference_changes.check(evidence_from(population, history.frame(), bound_s=5))
    assert verdict.valid is (missed == 0) and verdict.counts["missed"] == missed


@pytest.mark.parametrize(
    ("record", "stands"),
    [
        ({"granted_at": "2026-11-01T00:00:00+00:00", "version": "1"}, True),
        ({"granted_at": "2026-01-01T00:00:00+00:00", "version": "1",
          "revoked_at": "2026-06-01T00:00:00+00:00"}, False),
        ({"granted_at": "2026-11-01T00:00:00+00:00", "version": "1",
          "revoked_at": "2026-06-01T00:00:00+00:00"}, True),
        ({"granted_at": "2026-06-01T00:00:00+00:00", "version": "1",
          "revoked_at": "2026-06-01T00:00:00+00:00"}, False),
        ({"granted_at": "2026-11-01T00:00:00+00:00", "version": "1", "revoked_at": "soon"}, False),
        (None, False),
    ],
)  # fmt: skip
def test_a_consent_stands_unless_revoked_since_it_was_granted(record, stands):
    assert consent_stands(record) is stands


def test_a_zone_no_tz_database_knows_defers_every_push_whatever_the_window():
    # Seed 000: "if the user's timezone ... is unavailable, we defer rather than send". The
    # user has no window at all: only the unknown zone can hold their pushes.
    population, author, user, device = _scene()
    body = preference_change("unknown_zone", user, T0, T0 + 3600)
    assert body == {**preferences_body(user), "zone": UNKNOWN_ZONE} and not body["quiet_hours"]
    assert not local_time.known_zone(UNKNOWN_ZONE) and local_time.known_zone(user.zone)
    history = History()
    _change(history, user, T0 + 10, T0 + 10.1, change="preferences", via="table",
            what="unknown_zone", preferences=body)  # fmt: skip
    _inject(history, author, "before", T0 + 5)  # the old zone may still be acted on
    _inject(history, author, "after", T0 + 30)
    evidence = evidence_from(population, history.frame(), bound_s=5)
    mine = evidence.expectation.deliveries["user_id"] == user.user_id
    assert not mine.any()
    assert evidence.expectation.changed_suppressed["unknown_zone"] >= 1
    _deliver(history, device, "before", T0 + 12)  # within the bound: allowed
    assert preference_changes.check(evidence_from(population, history.frame(), bound_s=5)).valid
    _deliver(history, device, "after", T0 + 31)  # sent now, or as if the zone were UTC
    verdict = preference_changes.check(evidence_from(population, history.frame(), bound_s=5))
    assert not verdict.valid and verdict.counts["to_an_unknown_zone"] == 1


def test_a_window_no_clock_can_read_defers_every_push():
    # Seed 004: quiet hours fail closed "when the preference cannot be resolved".
    population, author, user, device = _scene()
    body = preference_change("unreadable_quiet_hours", user, T0, T0 + 3600)
    assert body == {**preferences_body(user), "quiet_hours": UNREADABLE_WINDOW}
    assert not local_time.readable(UNREADABLE_WINDOW) and local_time.readable(None)
    history = History()
    _change(history, user, T0 + 10, T0 + 10.1, change="preferences", via="table",
            what="unreadable_quiet_hours", preferences=body)  # fmt: skip
    _inject(history, author, "after", T0 + 30)
    evidence = evidence_from(population, history.frame(), bound_s=5)
    assert evidence.expectation.changed_suppressed["unreadable_quiet_hours"] >= 1
    _deliver(history, device, "after", T0 + 31)  # read as "no window"
    verdict = preference_changes.check(evidence_from(population, history.frame(), bound_s=5))
    assert not verdict.valid and verdict.counts["despite_unreadable_quiet_hours"] == 1


def test_an_unknown_zone_is_written_to_the_table_only():
    assert not {"unknown_zone", "unreadable_quiet_hours"} & set(kinds_for({"via": "api"}))
    assert "unknown_zone" in kinds_for({"via": "mixed"})
    validate("change-preferences", {"via": "mixed"})
    with pytest.raises(ActionError, match="table"):
        validate("change-preferences", {"via": "api", "kinds": ["unknown_zone"]})


def test_a_refused_change_never_happened():
    population, author, user, _ = _scene()
    history = History()
    history.append("change", time=T0 + 10, tenant_id=user.tenant_id, user_id=user.user_id,
                   detail=json.dumps({"ok": False, "change": "erasure"}))  # fmt: skip
    assert not from_history(population, history.frame()).erasures


def test_after_an_erasure_no_delivery_an_empty_inbox_and_the_reused_id_delivered_once():
    population, author, user, device = _scene()
    history = History()
    _inject(history, author, "probe", T0 + 1)
    _deliver(history, device, "probe", T0 + 2)
    _change(history, user, T0 + 10, T0 + 10.5, change="erasure")
    history.append("read", time=T0 + 11, end=T0 + 11.1, tenant_id=user.tenant_id,
                   user_id=user.user_id, status=200, reason="page",
                   detail=json.dumps({"walk": "e", "page": 0, "ids": []}))  # fmt: skip
    _change(history, user, T0 + 20, T0 + 20.5, change="registration",
            follows=[[author.tenant_id, author.user_id]])  # fmt: skip
    _inject(history, author, "probe", T0 + 27)  # the same id again, after the bound
    _deliver(history, device, "probe", T0 + 28)
    evidence = evidence_from(population, history.frame(), bound_s=5)
    verdict = erasure.check(evidence)
    assert verdict.valid, verdict.counts
    assert verdict.counts["reused_id_required"] == 1 and verdict.counts["reads_after_erasure"] == 1
    # effectively_once leaves the new person's delivery to the erasure checker.
    assert (device.tenant_id, device.token) in evidence.expectation.reregistered


@pytest.mark.parametrize("what", ["delivered_after_erasure", "inbox", "reused_id_lost"])
def test_each_way_an_erasure_leaves_something_behind_is_caught(what):
    population, author, user, device = _scene()
    history = History()
    _inject(history, author, "probe", T0 + 1)
    _deliver(history, device, "probe", T0 + 2)
    _change(history, user, T0 + 10, T0 + 10.5, change="erasure")
    if what == "delivered_after_erasure":
        _inject(history, author, "later", T0 + 12)
        _deliver(history, device, "later", T0 + 18)
    page = ["probe"] if what == "inbox" else []
    history.append("read", time=T0 + 11, end=T0 + 11.1, tenant_id=user.tenant_id,
                   user_id=user.user_id, status=200, reason="page",
                   detail=json.dumps({"walk": "e", "page": 0, "ids": page}))  # fmt: skip
    _change(history, user, T0 + 20, T0 + 20.5, change="registration",
            follows=[[author.tenant_id, author.user_id]])  # fmt: skip
    _inject(history, author, "probe", T0 + 27)
    if what != "reused_id_lost":
        _deliver(history, device, "probe", T0 + 28)
    verdict = erasure.check(evidence_from(population, history.frame(), bound_s=5))
    assert not verdict.valid
    key = {"inbox": "inbox_items_after_erasure"}.get(what, what)
    assert verdict.counts[key] == 1


@pytest.mark.parametrize("own_mark", [False, True])
def test_read_state_the_erased_person_left_shows_on_the_new_persons_inbox(own_mark):
    """The erased person had read the probe; the person registered again sees it read before
    marking anything themselves: the erasure left the read state behind. Once the new person
    marks items read, their flags are theirs and are not judged."""
    population, author, user, device = _scene()
    history = History()
    _inject(history, author, "probe", T0 + 1)
    _deliver(history, device, "probe", T0 + 2)
    history.append("read", time=T0 + 5, end=T0 + 5.1, tenant_id=user.tenant_id,
                   user_id=user.user_id, status=200, reason="read_all",
                   detail=json.dumps({}))  # fmt: skip
    _change(history, user, T0 + 10, T0 + 10.5, change="erasure")
    _change(history, user, T0 + 20, T0 + 20.5, change="registration",
            follows=[[author.tenant_id, author.user_id]])  # fmt: skip
    _inject(history, author, "probe", T0 + 27)
    _deliver(history, device, "probe", T0 + 28)
    if own_mark:
        history.append("read", time=T0 + 30, end=T0 + 30.1, tenant_id=user.tenant_id,
                       user_id=user.user_id, status=200, reason="mark_read",
                       notification_id="probe", detail=json.dumps({}))  # fmt: skip
    history.append("read", time=T0 + 33, end=T0 + 33.1, tenant_id=user.tenant_id,
                   user_id=user.user_id, status=200, reason="page",
                   detail=json.dumps({"walk": "r", "page": 0, "ids": ["probe"],
                                      "read": [True]}))  # fmt: skip
    verdict = erasure.check(evidence_from(population, history.frame(), bound_s=5))
    if own_mark:
        assert verdict.valid, verdict.counts
        assert verdict.counts["pages_after_registration"] == 0
    else:
        assert not verdict.valid
        assert verdict.counts["read_state_survived"] == 1
        assert verdict.counts["items_after_registration"] == 1


def _erasure_history(population, author, user, device):
    history = History()
    _inject(history, author, "probe", T0 + 1)
    _deliver(history, device, "probe", T0 + 2)
    _change(history, user, T0 + 10, T0 + 10.5, change="erasure")
    _inject(history, author, "later", T0 + 12)
    _deliver(history, device, "later", T0 + 18)
    _change(history, user, T0 + 20, T0 + 20.5, change="registration",
            follows=[[author.tenant_id, author.user_id]])  # fmt: skip
    _inject(history, author, "probe", T0 + 27)
    _deliver(history, device, "probe", T0 + 28)
    _deliver(history, device, "probe", T0 + 29)
    return history


def _withdrawal_history(population, author, user, device):
    history = History()
    withdrawn = {**preferences_body(user), "push_consent": None}
    _change(history, user, T0 + 10, T0 + 10.1, change="preferences", preferences=withdrawn)
    _inject(history, author, "before", T0 + 5)
    _inject(history, author, "after", T0 + 30)
    _deliver(history, device, "before", T0 + 12)
    _deliver(history, device, "after", T0 + 31)
    return history


@pytest.mark.parametrize("expected_on_disk", [False, True])
@pytest.mark.parametrize("scene", [_erasure_history, _withdrawal_history])
def test_every_checker_judges_changed_users_alike_on_both_engines(
    tmp_path, scene, expected_on_disk
):
    """Users the run changed, judged in memory and with the history on disk (and the expected
    deliveries too): the re-registered device left out of effectively_once, the changed users'
    provider rows and expected deliveries handed to the checkers that read them as frames."""
    population, author, user, device = _scene()
    frame = scene(population, author, user, device).frame()
    evidence = evidence_from(population, frame, bound_s=5)
    expectation = evidence.expectation
    expected = None
    if expected_on_disk:
        expected = tmp_path / "expected.parquet"
        expectation.deliveries.to_parquet(expected, index=False)
        expectation = dataclasses.replace(expectation, deliveries=expectation.deliveries.iloc[:0])
    frame.to_parquet(tmp_path / "history.parquet", index=False)
    with HistoryStore(
        tmp_path / "history.parquet", expectation, expected=expected, workdir=tmp_path / "db"
    ) as store:
        on_disk = dataclasses.replace(evidence, expectation=expectation, store=store)
        failed = set()
        for name in known():
            in_memory, out_of_core = (run_probe(name, {}, e) for e in (evidence, on_disk))
            assert out_of_core.to_dict() == in_memory.to_dict(), name
            if in_memory.valid is False:
                failed.add(name)
    assert {
        "effectively_once",
        "erasure" if scene is _erasure_history else "preference_changes",
    } <= failed


@pytest.mark.parametrize("emails_after_registration", [1, 0, 2])
def test_a_mention_posted_again_must_reach_the_new_persons_email_once(emails_after_registration):
    """Red team 3: an erasure that purged the push dedup keys only left the email (and SMS)
    keys; the mention posted again with the same id then reaches the new person's devices but
    not their address. The erasure checker expects the oracle's email for them, once."""
    from harness.run.channel_ledgers import append_channel_rows

    population, author, _, _ = _scene()
    user = next(
        population.user("tenant-0", f)
        for f in author.followers
        if population.user("tenant-0", f).email
        and population.user("tenant-0", f).email_consent
        and not (population.user("tenant-0", f).channels_off or ())
    )
    history = History()

    def mention(at: float) -> None:
        history.append("inject", time=at, end=at + 0.01, tenant_id=author.tenant_id,
                       author_id=author.user_id, notification_id="probe", detail="mention")  # fmt: skip

    def email(at: float) -> None:
        append_channel_rows(history, [{"received_at": at, "tenant_id": user.tenant_id,
                                       "notification_id": "probe", "token": user.email,
                                       "provider": "ses", "status": 200}])  # fmt: skip

    mention(T0 + 1)
    email(T0 + 2)
    _change(history, user, T0 + 10, T0 + 10.5, change="erasure")
    _change(history, user, T0 + 20, T0 + 20.5, change="registration",
            follows=[[author.tenant_id, author.user_id]])  # fmt: skip
    mention(T0 + 27)
    for device in population.devices_of(user.tenant_id, user.user_id):
        _deliver(history, device, "probe", T0 + 28)  # push reaches the new person: judged apart
    for n in range(emails_after_registration):
        email(T0 + 28 + n)
    verdict = erasure.check(evidence_from(population, history.frame(), bound_s=5))
    assert verdict.counts["reused_id_channel_required"] == 1
    assert verdict.counts["reused_id_channel_lost"] == int(emails_after_registration == 0)
    assert verdict.counts["reused_id_channel_duplicated"] == max(0, emails_after_registration - 1)
    assert (verdict.valid is True) == (emails_after_registration == 1)


def test_a_dead_device_reinstalled_is_due_its_pushes_from_the_registration_and_bound_on():
    """reinstall-devices: a follower's dead token is revived and registered again at 10 s. An
    event injected before is not due to it (may: the system may already act on the new
    registration), nor when posted again with its id after; one injected after the bound is
    due, on that device alone; a delivery to it then is allowed."""
    population = generate(5, START, SPEC)
    author = next(a for a in population.authors if a.celebrity)
    user, dead = next(
        (population.user("tenant-0", f), d)
        for f in author.followers
        for d in population.devices_of("tenant-0", f)
        if d.dead and population.user("tenant-0", f).consent is not None
        and population.user("tenant-0", f).quiet_state == "none"
    )  # fmt: skip
    history = History()
    _inject(history, author, "before", T0 + 5)
    _change(history, user, T0 + 10, T0 + 10.1, change="reinstall", tokens=[dead.token])
    _inject(history, author, "after", T0 + 30)
    # Posted again with its id after the reinstall: the notification the system settled when
    # the token was dead; it may dedup it for the device.
    _inject(history, author, "before", T0 + 31)
    expectation = evidence_from(population, history.frame(), bound_s=5).expectation

    def on_device(frame):
        return set(frame.loc[frame["token"] == dead.token, "notification_id"])

    assert on_device(expectation.deliveries) == {"after"}
    assert on_device(expectation.optional) == {"before"}
    _deliver(history, dead, "before", T0 + 11)
    _deliver(history, dead, "after", T0 + 31)
    assert preference_changes.check(evidence_from(population, history.frame(), bound_s=5)).valid


def test_reinstall_picks_only_dead_tokens_no_other_device_shares():
    """Reviving a token two tenants' devices share would bring the other's dead device back
    too (the simulator knows tokens, not tenants): such users are never picked."""
    from harness.run.actions import reinstallable

    spec = dataclasses.replace(SPEC, tenants=2, dead_token_fraction=0.3, shared_token_fraction=0.9)
    population = generate(3, START, spec)
    users = [population.user(u.tenant_id, u.user_id) for u in population.users]
    picked = reinstallable(population, users)
    uses: dict[str, int] = {}
    for device in population.devices:
        uses[device.token] = uses.get(device.token, 0) + 1
    shared_dead = {(d.tenant_id, d.user_id) for d in population.devices if d.dead}
    shared_dead_only = {
        key for key in shared_dead
        if all(uses[d.token] > 1 for d in population.devices_of(*key) if d.dead)
    }  # fmt: skip
    assert picked and shared_dead_only  # the population has both kinds
    assert not {(u.tenant_id, u.user_id) for u in picked} & shared_dead_only
    assert all(
        any(d.dead and uses[d.token] == 1 for d in population.devices_of(u.tenant_id, u.user_id))
        for u in picked
    )
