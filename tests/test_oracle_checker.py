"""effectively_once over hand-built histories: it must see duplicates, losses and strays."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pandas as pd
import pytest
from engines import engine  # noqa: F401 - the fixture, pandas and DuckDB

from harness.checkers import effectively_once, quiet_hours
from harness.model.history import History
from harness.model.oracle import expected_deliveries
from harness.model.population import PopulationSpec, generate

pytestmark = pytest.mark.usefixtures("engine")

START = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
SPEC = PopulationSpec(tenants=2, users_per_tenant=30, celebrity_followers=20, regular_authors=1)


def _population():
    return generate(11, START, SPEC)


def _history_with_injection(population, tenant="tenant-0"):
    history = History()
    author = next(a for a in population.authors if a.tenant_id == tenant and a.celebrity)
    history.append(
        "inject",
        tenant_id=tenant,
        author_id=author.user_id,
        notification_id="01JNOTIFICATION0000000000",
    )
    return history


def _deliver(history, rows, status=200):
    history.extend_provider(
        [
            {
                "received_at": 1.0,
                "tenant_id": r.tenant_id,
                "notification_id": r.notification_id,
                "token": r.token,
                "provider": "apns",
                "project": None,
                "status": status,
                "reason": None,
            }
            for r in rows
        ]
    )


def _expectation(population, history):
    injected = history.frame().query("kind == 'inject'")
    return expected_deliveries(population, injected)


def test_every_expected_delivery_once_passes():
    population = _population()
    history = _history_with_injection(population)
    expectation = _expectation(population, history)
    assert len(expectation.deliveries) > 5
    _deliver(history, list(expectation.deliveries.itertuples()))
    verdict = effectively_once.check(expectation, history.frame())
    assert verdict.valid
    assert verdict.counts["expected"] == verdict.counts["delivered"] == len(expectation.deliveries)
    assert verdict.counts["duplicated"] == verdict.counts["lost"] == 0


def test_a_duplicate_and_a_loss_fail_with_counts():
    population = _population()
    history = _history_with_injection(population)
    expectation = _expectation(population, history)
    rows = list(expectation.deliveries.itertuples())
    _deliver(history, rows[1:])  # the first one is lost
    _deliver(history, rows[2:3])  # the third one arrives twice
    verdict = effectively_once.check(expectation, history.frame())
    assert not verdict.valid
    assert verdict.counts["lost"] == 1
    assert verdict.counts["duplicated"] == 1
    assert verdict.counts["delivered"] == len(rows) - 1
    assert verdict.details["lost_examples"][0]["token"] == rows[0].token


def test_non_200_answers_are_not_deliveries():
    population = _population()
    history = _history_with_injection(population)
    expectation = _expectation(population, history)
    rows = list(expectation.deliveries.itertuples())
    _deliver(history, rows, status=503)
    verdict = effectively_once.check(expectation, history.frame())
    assert verdict.counts["lost"] == len(rows)
    assert verdict.counts["delivered"] == 0


def test_delivery_to_another_tenant_or_suppressed_user_is_unexpected():
    population = _population()
    history = _history_with_injection(population)
    expectation = _expectation(population, history)
    rows = list(expectation.deliveries.itertuples())
    _deliver(history, rows)
    stray = rows[0]._replace(tenant_id="tenant-1")
    no_consent = next(
        u
        for u in population.users
        if u.consent is None and population.devices_of(u.tenant_id, u.user_id)
    )
    device = population.devices_of(no_consent.tenant_id, no_consent.user_id)[0]
    denied = rows[0]._replace(tenant_id=device.tenant_id, token=device.token)
    _deliver(history, [stray, denied])
    verdict = effectively_once.check(expectation, history.frame())
    assert not verdict.valid
    assert verdict.counts["unexpected"] == 2


def test_suppressed_reasons_come_from_the_population():
    population = _population()
    history = _history_with_injection(population)
    expectation = _expectation(population, history)
    author = next(a for a in population.authors if a.tenant_id == "tenant-0" and a.celebrity)
    expected_no_consent = sum(
        len(population.devices_of("tenant-0", f))
        for f in author.followers
        if population.user("tenant-0", f).consent is None
    )
    assert expectation.suppressed["no_consent"] == expected_no_consent
    total_devices = sum(len(population.devices_of("tenant-0", f)) for f in author.followers)
    suppressed_devices = sum(v for k, v in expectation.suppressed.items() if k != "no_device")
    assert len(expectation.deliveries) + suppressed_devices == total_devices


def test_history_round_trips_through_parquet(tmp_path):
    population = _population()
    history = _history_with_injection(population)
    history.write(tmp_path / "history.parquet")
    frame = pd.read_parquet(tmp_path / "history.parquet")
    assert list(frame["kind"]) == ["inject"]
    assert frame["notification_id"].iloc[0] == "01JNOTIFICATION0000000000"


def _deferred_row(population, expectation):
    return next(r for r in expectation.deliveries.itertuples() if r.quiet_until == r.quiet_until)


def _at(history, row, when):
    history.extend_provider(
        [
            {
                "received_at": when,
                "tenant_id": row.tenant_id,
                "notification_id": row.notification_id,
                "token": row.token,
                "provider": "fcm",
                "project": "p",
                "status": 200,
                "reason": None,
            }
        ]
    )


def test_quiet_hours_passes_when_deferred_ones_arrive_after_the_window():
    population = _population()
    history = _history_with_injection(population)
    expectation = _expectation(population, history)
    deferred = [r for r in expectation.deliveries.itertuples() if r.quiet_until == r.quiet_until]
    for row in deferred:
        _at(history, row, row.quiet_until + 1.5)
    verdict = quiet_hours.check(population, expectation, history.frame())
    assert verdict.valid
    assert verdict.counts["deferred_delivered"] == len(deferred) > 0
    assert verdict.details["max_release_delay_seconds"] == 1.5


def test_quiet_hours_fails_when_a_deferred_notification_never_comes_out():
    population = _population()
    history = _history_with_injection(population)
    expectation = _expectation(population, history)
    deferred = [r for r in expectation.deliveries.itertuples() if r.quiet_until == r.quiet_until]
    for row in deferred[1:]:
        _at(history, row, row.quiet_until + 1.0)
    verdict = quiet_hours.check(population, expectation, history.frame())
    assert not verdict.valid
    assert verdict.counts["deferred_never_released"] == 1
    assert verdict.counts["delivered_inside_window"] == verdict.counts["released_late"] == 0
    assert verdict.details["never_released_examples"][0]["token"] == deferred[0].token


def test_quiet_hours_fails_on_a_delivery_inside_the_window_or_a_late_release():
    population = _population()
    history = _history_with_injection(population)
    expectation = _expectation(population, history)
    deferred = [r for r in expectation.deliveries.itertuples() if r.quiet_until == r.quiet_until]
    assert len(deferred) >= 2
    _at(history, deferred[0], deferred[0].quiet_until - 0.5)
    _at(history, deferred[1], deferred[1].quiet_until + 31)
    verdict = quiet_hours.check(population, expectation, history.frame(), release_bound_seconds=30)
    assert not verdict.valid
    assert verdict.counts["delivered_inside_window"] == 1
    assert verdict.counts["released_late"] == 1


@pytest.mark.parametrize(
    ("fault", "late"),
    [(None, 1), ({"stopped_part": "push-consumer"}, 0), ({"unavailable": None}, 1)],
    ids=["no-fault", "consumer-stopped", "degrading-fault"],
)
def test_a_release_due_while_a_consumer_was_stopped_may_come_after_its_recovery(fault, late):
    # A killed consumer's jobs come back when their visibility runs out: a release due while
    # it was down may arrive up to recovery_s after the fault ended. A fault that only degrades
    # (latency, errors) excuses nothing.
    population = _population()
    history = _history_with_injection(population)
    expectation = _expectation(population, history)
    deferred = [r for r in expectation.deliveries.itertuples() if r.quiet_until == r.quiet_until]
    row = deferred[0]
    if fault is not None:
        for phase, at in (("start", row.quiet_until - 5), ("stop", row.quiet_until + 10)):
            detail = {"window": "w1", "fault": "f", "phase": phase, **fault}
            history.append("fault", time=at, detail=json.dumps(detail))
    _at(history, row, row.quiet_until + 50)  # 10 s + 40 s recovery: within, not past the bound
    for other in deferred[1:]:
        _at(history, other, other.quiet_until + 1)
    verdict = quiet_hours.check(
        population, expectation, history.frame(), release_bound_seconds=30, recovery_s=45
    )
    assert verdict.counts["released_late"] == late
    # Every release due inside the stopped window is judged with its allowance, none else.
    assert (verdict.counts["extended_by_fault"] > 0) is (late == 0)
    assert verdict.valid is (late == 0)


def test_quiet_hours_fails_on_any_delivery_to_a_user_quiet_all_run():
    population = _population()
    history = _history_with_injection(population)
    expectation = _expectation(population, history)
    user = next(
        u
        for u in population.users
        if u.quiet_state == "whole_run" and population.devices_of(u.tenant_id, u.user_id)
    )
    device = population.devices_of(user.tenant_id, user.user_id)[0]
    row = next(expectation.deliveries.itertuples())._replace(
        tenant_id=user.tenant_id, token=device.token
    )
    _at(history, row, 5.0)
    verdict = quiet_hours.check(population, expectation, history.frame())
    assert verdict.counts["delivered_inside_window"] == 1
    assert not verdict.valid


def _deliver_with_collapse(history, rows, collapse):
    history.extend_provider(
        [
            {
                "received_at": 2.0,
                "tenant_id": r.tenant_id,
                "notification_id": r.notification_id,
                "token": r.token,
                "provider": "apns",
                "project": None,
                "status": 500,  # accepted, then answered 5xx
                "delivered": True,
                "reason": "InternalServerError",
                "collapse_id": collapse(r),
            }
            for r in rows
        ]
    )


def test_a_redelivery_with_the_same_collapse_id_is_collapsed_not_visible():
    population = _population()
    history = _history_with_injection(population)
    expectation = _expectation(population, history)
    rows = list(expectation.deliveries.itertuples())
    _deliver_with_collapse(history, rows, lambda r: r.notification_id)
    _deliver_with_collapse(history, rows[:2], lambda r: r.notification_id)
    verdict = effectively_once.check(expectation, history.frame())
    assert verdict.valid
    assert verdict.counts["duplicated"] == 2
    assert verdict.counts["collapsed"] == 2
    assert verdict.counts["visible_duplicates"] == 0
    # A scenario that gates on the raw count still fails.
    assert not effectively_once.check(expectation, history.frame(), max_duplicated=0).valid


def test_a_redelivery_without_collapse_id_is_a_visible_duplicate():
    population = _population()
    history = _history_with_injection(population)
    expectation = _expectation(population, history)
    rows = list(expectation.deliveries.itertuples())
    _deliver_with_collapse(history, rows, lambda r: None)
    _deliver_with_collapse(history, rows[:1], lambda r: None)
    verdict = effectively_once.check(expectation, history.frame())
    assert not verdict.valid
    assert verdict.counts["visible_duplicates"] == 1


def test_notifications_sharing_a_collapse_id_on_one_device_hide_all_but_the_last():
    # Two posts of one author, each delivered once, under the author's id as collapse id: the
    # second replaces the first on the device, which the user never sees.
    population = _population()
    history = _history_with_injection(population)
    author = next(a for a in population.authors if a.tenant_id == "tenant-0" and a.celebrity)
    history.append("inject", tenant_id="tenant-0", author_id=author.user_id,
                   notification_id="01JNOTIFICATION0000000001")  # fmt: skip
    expectation = _expectation(population, history)
    rows = list(expectation.deliveries.itertuples())
    devices = {r.token for r in rows}
    _deliver_with_collapse(history, rows, lambda r: r.notification_id)
    fair = effectively_once.check(expectation, history.frame())
    assert fair.valid and fair.counts["hidden_by_collapse"] == 0
    history = _history_with_injection(population)
    history.append("inject", tenant_id="tenant-0", author_id=author.user_id,
                   notification_id="01JNOTIFICATION0000000001")  # fmt: skip
    _deliver_with_collapse(history, rows, lambda r: f"author-{author.user_id}")
    verdict = effectively_once.check(expectation, history.frame())
    assert not verdict.valid
    assert verdict.counts["hidden_by_collapse"] == len(devices)
    assert verdict.counts["lost"] == 0 and verdict.counts["duplicated"] == 0
    example = verdict.details["hidden_by_collapse_examples"][0]
    assert example["collapse_id"] == f"author-{author.user_id}" and example["notifications"] == 2


def _deliver_at(history, row, at, status=200, delivered=None, collapse_id=None):
    history.extend_provider(
        [
            {
                "received_at": at,
                "tenant_id": row.tenant_id,
                "notification_id": row.notification_id,
                "token": row.token,
                "provider": "apns",
                "project": None,
                "status": status,
                "reason": None,
                "delivered": status == 200 if delivered is None else delivered,
                "collapse_id": collapse_id,
            }
        ]
    )


def _fault(history, name, start, stop):
    import json

    for phase, at in (("start", start), ("stop", stop)):
        detail = {"window": name, "fault": name, "phase": phase, "params": {}}
        history.append("fault", time=at, detail=json.dumps(detail))


def _all_once(population):
    history = _history_with_injection(population)
    expectation = _expectation(population, history)
    rows = list(expectation.deliveries.itertuples())
    for row in rows:
        _deliver_at(history, row, 10.0, collapse_id=f"c-{row.token[:8]}")
    return history, expectation, rows


def test_a_duplicate_with_the_first_sends_collapse_id_still_fails_when_no_cause_admits_it():
    population = _population()
    history, expectation, rows = _all_once(population)
    history_rows = history.frame()
    first = history_rows[history_rows["kind"] == "provider"].iloc[0]
    _deliver_at(history, rows[0], 12.0, collapse_id=first["collapse_id"])
    verdict = effectively_once.check(expectation, history.frame())
    assert not verdict.valid
    assert verdict.counts["duplicated"] == 1 and verdict.counts["unattributed_duplicates"] == 1
    assert verdict.details["unattributed_examples"][0]["token"] == rows[0].token


def test_accepted_then_error_is_an_admitted_cause():
    population = _population()
    history = _history_with_injection(population)
    expectation = _expectation(population, history)
    rows = list(expectation.deliveries.itertuples())
    _deliver_at(history, rows[0], 10.0, status=500, delivered=True, collapse_id="c1")
    for row in rows:
        _deliver_at(history, row, 11.0, collapse_id="c1")
    verdict = effectively_once.check(expectation, history.frame())
    assert verdict.valid, verdict.counts
    assert verdict.counts["duplicates_accepted_then_error"] == 1
    assert verdict.counts["unattributed_duplicates"] == 0


def test_a_kill_between_send_and_mark_is_admitted_only_right_after_the_send():
    population = _population()
    history, expectation, rows = _all_once(population)
    _fault(history, "consumer-crash", 11.0, 13.0)
    _deliver_at(history, rows[0], 20.0, collapse_id=f"c-{rows[0].token[:8]}")  # kill at 11.0
    admitted = effectively_once.check(expectation, history.frame())
    assert admitted.counts["duplicates_consumer_killed"] == 1 and admitted.valid
    late = effectively_once.check(expectation, history.frame(), kill_window_s=0.5)
    assert late.counts["unattributed_duplicates"] == 1 and not late.valid


def test_a_send_the_provider_read_after_the_kill_was_recorded_is_the_killed_consumers():
    """Between the kill and the restart no consumer runs: a request reaching the provider then
    was written by the killed process (a loaded provider read it late), so its duplicate after
    the restart is the kill's. One reaching the provider after the restart is not."""
    population = _population()
    history = _history_with_injection(population)
    expectation = _expectation(population, history)
    rows = list(expectation.deliveries.itertuples())
    _fault(history, "consumer-crash", 11.0, 13.0)
    for row in rows:
        _deliver_at(history, row, 10.0 if row is not rows[0] else 11.3, collapse_id="c1")
    _deliver_at(history, rows[0], 20.0, collapse_id="c1")
    admitted = effectively_once.check(expectation, history.frame())
    assert admitted.counts["duplicates_consumer_killed"] == 1 and admitted.valid, admitted.counts
    history = _history_with_injection(population)
    _fault(history, "consumer-crash", 11.0, 13.0)
    for row in rows:
        _deliver_at(history, row, 10.0 if row is not rows[0] else 13.5, collapse_id="c1")
    _deliver_at(history, rows[0], 20.0, collapse_id="c1")
    after_restart = effectively_once.check(expectation, history.frame())
    assert after_restart.counts["unattributed_duplicates"] == 1 and not after_restart.valid


def test_a_volatile_store_crash_is_admitted_only_for_a_volatile_store():
    population = _population()
    history, expectation, rows = _all_once(population)
    _fault(history, "dedup-crash", 15.0, 16.0)
    _deliver_at(history, rows[1], 20.0, collapse_id=f"c-{rows[1].token[:8]}")
    volatile = effectively_once.check(expectation, history.frame(), durable=False)
    assert volatile.valid and volatile.counts["duplicates_volatile_store_failover"] == 1
    durable = effectively_once.check(expectation, history.frame(), durable=True)
    assert not durable.valid and durable.counts["unattributed_duplicates"] == 1


def test_a_push_claimed_before_a_volatile_store_crash_and_read_during_it_is_the_crashs():
    """CI: pushes claimed before the dedup store crashed reached the provider 10-100 ms after
    the crash was recorded; the store came back empty, so their second send is the failover's.
    One first delivered after the store came back is not."""
    population = _population()
    expectation = _expectation(population, _history_with_injection(population))
    rows = list(expectation.deliveries.itertuples())
    for first, admitted in ((15.1, True), (16.5, False)):
        history = _history_with_injection(population)
        _fault(history, "dedup-crash", 15.0, 16.0)
        for row in rows:
            _deliver_at(history, row, 10.0 if row is not rows[0] else first, collapse_id="c1")
        _deliver_at(history, rows[0], 20.0, collapse_id="c1")
        verdict = effectively_once.check(expectation, history.frame(), durable=False)
        assert verdict.counts["duplicates_volatile_store_failover"] == int(admitted)
        assert verdict.valid is admitted, verdict.counts


def test_optional_deliveries_are_neither_lost_nor_unexpected_but_never_twice():
    import pandas as pd

    from harness.model.oracle import Expectation

    population = _population()
    history = _history_with_injection(population)
    injected = history.frame().query("kind == 'inject'")
    unknown = expected_deliveries(population, injected.iloc[0:0], indeterminate=injected)
    assert unknown.deliveries.empty and len(unknown.optional) > 2
    assert set(unknown.optional["why"]) == {"indeterminate"}
    # Its suppressions are not held against the audit trail: the event may not exist.
    assert not unknown.suppressed and sum(unknown.changed_suppressed.values()) > 0
    rows = list(unknown.optional.itertuples())
    _deliver_at(history, rows[0], 10.0)  # one arrives, the others never do
    verdict = effectively_once.check(unknown, history.frame())
    assert verdict.valid and verdict.counts["lost"] == 0 and verdict.counts["unexpected"] == 0
    assert verdict.counts["optional_delivered"] == 1
    _deliver_at(history, rows[0], 11.0)
    assert not effectively_once.check(unknown, history.frame()).valid
    assert isinstance(unknown, Expectation) and isinstance(unknown.optional, pd.DataFrame)
