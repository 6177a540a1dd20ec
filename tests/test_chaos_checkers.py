"""fail_closed, dead_tokens and backpressure over hand-built histories: each must be able to fail."""

from __future__ import annotations

import json

import pytest
from engines import engine  # noqa: F401 - the fixture, pandas and DuckDB

from harness.checkers import backpressure, dead_tokens, fail_closed
from harness.model.history import History

pytestmark = pytest.mark.usefixtures("engine")


def _fault(history, name, start, stop, window="w1", **record):
    for phase, at in (("start", start), ("stop", stop)):
        detail = {"window": window, "fault": name, "phase": phase, "params": {}, **record}
        history.append("fault", time=at, detail=json.dumps(detail))


def _request(
    history,
    at,
    token="t1",
    status=200,
    provider="apns",
    reason=None,
    retry_after=None,
    nid="n1",
    project=None,
    tenant="acme",
):
    history.extend_provider(
        [
            {
                "received_at": at,
                "tenant_id": tenant,
                "notification_id": nid,
                "token": token,
                "provider": provider,
                "project": project,
                "status": status,
                "reason": reason,
                "delivered": status == 200,
                "retry_after": retry_after,
            }
        ]
    )


def _inject(history, at, nid, tenant="acme"):
    history.append("inject", time=at, tenant_id=tenant, author_id="a", notification_id=nid)


def test_fail_closed_flags_a_delivery_inside_an_outage():
    history = History()
    _fault(history, "dedup-outage", 100.0, 110.0)
    for nid in ("before", "in-grace", "after", "backlog", "inside", "stale"):
        _inject(history, 98.0, nid)
    _request(history, 99.0, nid="before")
    _request(history, 100.2, nid="in-grace")  # decided just before the outage began
    _request(history, 111.0, nid="after")
    # Decided before the cut, sent 1.1 s into it (a loaded machine): no violation.
    _request(history, 101.1, nid="backlog")
    verdict = fail_closed.check(history.frame(), grace_s=0.5)
    assert verdict.valid
    assert verdict.counts["deliveries_during_outage"] == 1
    assert verdict.counts["decided_during_outage"] == verdict.counts["backlog_sent_late"] == 0
    # A notification injected after the cut: its decision was surely taken with the store out.
    _inject(history, 102.0, "fresh")
    _request(history, 102.5, nid="fresh")
    verdict = fail_closed.check(history.frame(), grace_s=0.5)
    assert not verdict.valid
    assert verdict.counts["decided_during_outage"] == 1
    assert verdict.counts["deliveries_during_outage"] == 2
    assert verdict.counts["outage_windows"] == 1
    assert [e["notification_id"] for e in verdict.details["examples"]] == ["fresh"]


def test_fail_closed_flags_a_backlog_send_later_than_any_decision_waits():
    history = History()
    _fault(history, "dedup-outage", 100.0, 110.0)
    _inject(history, 98.0, "stale")
    _request(history, 104.9, nid="stale")
    assert fail_closed.check(history.frame(), grace_s=0.5, decision_lag_s=5.0).valid
    verdict = fail_closed.check(history.frame(), grace_s=0.5, decision_lag_s=4.0)
    assert not verdict.valid and verdict.counts["backlog_sent_late"] == 1
    # A notification the harness never injected has no lower bound: judged as a backlog.
    _request(history, 106.0, nid="unknown")
    verdict = fail_closed.check(history.frame(), grace_s=0.5, decision_lag_s=5.0)
    assert not verdict.valid and verdict.counts["backlog_sent_late"] == 1
    assert verdict.counts["decided_during_outage"] == 0


def _publish(history, at, nid, token="t1", tenant="acme", reason=None):
    history.append(
        "sns_publish", time=at, tenant_id=tenant, notification_id=nid, token=token,
        provider="sns", reason=reason,
    )  # fmt: skip


def test_fail_closed_judges_a_push_through_sns_by_when_sns_accepted_it():
    """SNS's own delivery is no decision of the system's: a push published before the cut and
    delivered seconds into the outage is not judged; one published inside it is, late or not."""
    history = History()
    _fault(history, "dedup-outage", 100.0, 110.0)
    for nid in ("queued", "published-late", "refused-then-late"):
        _inject(history, 98.0, nid)
    _publish(history, 99.5, "queued")
    _request(history, 107.0, nid="queued")  # SNS's wait, not the system's
    verdict = fail_closed.check(history.frame(), grace_s=0.5, decision_lag_s=5.0)
    assert verdict.valid and verdict.counts["deliveries_during_outage"] == 0
    _publish(history, 106.0, "published-late")
    _request(history, 106.2, nid="published-late")
    # A publish SNS refused hands nothing off: the accepted one later is the bound.
    _publish(history, 99.0, "refused-then-late", reason="Throttling")
    _publish(history, 108.0, "refused-then-late")
    _request(history, 108.1, nid="refused-then-late")
    verdict = fail_closed.check(history.frame(), grace_s=0.5, decision_lag_s=5.0)
    assert not verdict.valid
    assert verdict.counts["backlog_sent_late"] == 2
    assert verdict.counts["deliveries_during_outage"] == 2
    # A second delivery of the same push is bound by the latest publish before it.
    _publish(history, 109.0, "queued")
    _request(history, 109.5, nid="queued")
    verdict = fail_closed.check(history.frame(), grace_s=0.5, decision_lag_s=5.0)
    assert verdict.counts["backlog_sent_late"] == 3


def test_fail_closed_with_fallback_counts_duplicates_across_the_outage():
    history = History()
    _fault(history, "dedup-outage", 100.0, 110.0)
    _request(history, 105.0, nid="decided-by-fallback")
    assert fail_closed.check(history.frame(), fallback=True).valid
    _request(history, 115.0, nid="decided-by-fallback")  # sent again after recovery
    verdict = fail_closed.check(history.frame(), fallback=True)
    assert not verdict.valid
    assert verdict.counts["duplicated_across_outage"] == 1


@pytest.mark.parametrize(
    ("name", "record", "outage"),
    [
        # What the fault's record says it took away decides, not its name.
        ("dedup-blackhole", {"unavailable": "dedup"}, True),
        ("proxy-timeout", {"unavailable": "dedup"}, True),  # the dedup store's proxy
        ("proxy-down", {"unavailable": "dedup"}, True),
        ("my-own-partition", {"unavailable": "dedup"}, True),
        ("proxy-timeout", {"unavailable": "datastore"}, False),  # another dependency
        ("dedup-slow", {"unavailable": None}, False),  # slow, but it answers
        ("dedup-outage", {"unavailable": None}, False),
        # Histories written before faults said so: the catalogue's names then.
        ("dedup-blackhole", {}, True),
        ("dedup-crash", {}, True),
        ("proxy-timeout", {}, False),
    ],
)
def test_fail_closed_judges_every_fault_that_took_the_dedup_store_away(name, record, outage):
    """A store that black-holes (only the client's timeout ends a call) is an outage as a
    refusing one is: a consumer failing open on a timeout is caught the same way."""
    history = History()
    _fault(history, name, 100.0, 110.0, **record)
    _inject(history, 102.0, "fresh")
    _request(history, 102.5, nid="fresh")
    verdict = fail_closed.check(history.frame(), grace_s=0.5)
    assert verdict.counts["outage_windows"] == int(outage)
    assert verdict.counts["decided_during_outage"] == int(outage)
    assert verdict.valid is False  # caught, or (no outage at all) never a pass


def test_fail_closed_without_any_outage_is_not_a_pass():
    history = History()
    _request(history, 1.0)
    assert not fail_closed.check(history.frame()).valid


def test_dead_tokens_flags_sends_after_410_or_unregistered():
    history = History()
    _request(history, 10.0, token="dead", status=410, reason="Unregistered")
    _request(history, 10.02, token="dead", status=410, reason="Unregistered", nid="n2")  # in flight
    _request(history, 11.0, token="fcm-dead", provider="fcm", status=404, reason="UNREGISTERED")
    verdict = dead_tokens.check(history.frame())
    assert verdict.valid and verdict.counts["in_flight_forgiven"] == 1
    _request(history, 10.8, token="dead", status=410, reason="Unregistered", nid="n3")
    _request(
        history, 30.0, token="fcm-dead", provider="fcm", status=404, reason="UNREGISTERED", nid="n4"
    )
    verdict = dead_tokens.check(history.frame())
    assert not verdict.valid
    assert verdict.counts["dead_tokens"] == 2 and verdict.counts["sends_after_dead"] == 2


def test_dead_tokens_forgives_sends_to_a_token_reinstalled_not_those_before():
    """reinstall-devices brought the token back at 20 s (the app installed again, registered
    again): sends from then on are a correct system delivering again; one at 15 s, after the
    410 and before the reinstall, is still a send to a dead token. Another tenant's same token
    was not reinstalled: its send after 20 s is not forgiven."""
    history = History()
    _request(history, 10.0, token="dead", status=410, reason="Unregistered")
    _request(history, 10.0, token="dead", status=410, reason="Unregistered", tenant="other")
    detail = {"change": "reinstall", "tokens": ["dead"], "ok": True}
    history.append("change", time=20.0, end=20.1, tenant_id="acme", user_id="u1",
                   detail=json.dumps(detail))  # fmt: skip
    _request(history, 21.0, token="dead", nid="n2")
    _request(history, 25.0, token="dead", nid="n3")
    verdict = dead_tokens.check(history.frame())
    assert verdict.valid, verdict.counts
    assert verdict.counts["sends_after_reinstall"] == 2
    _request(history, 15.0, token="dead", status=410, reason="Unregistered", nid="n4")
    _request(history, 22.0, token="dead", status=410, reason="Unregistered", nid="n5",
             tenant="other")  # fmt: skip
    verdict = dead_tokens.check(history.frame())
    assert not verdict.valid
    assert verdict.counts["sends_after_dead"] == 2 and verdict.counts["sends_after_reinstall"] == 2


def test_dead_tokens_reads_apns_400_bad_device_token_as_dead():
    """400 BadDeviceToken is APNs's other invalid-token answer; a 400 for the request itself
    (here BadCollapseId) says nothing of the token."""
    history = History()
    _request(history, 10.0, token="bad", status=400, reason="BadDeviceToken")
    _request(history, 10.0, token="fine", status=400, reason="BadCollapseId")
    _request(history, 30.0, token="fine", nid="n2")
    verdict = dead_tokens.check(history.frame())
    assert verdict.valid and verdict.counts["dead_tokens"] == 1
    _request(history, 30.0, token="bad", status=400, reason="BadDeviceToken", nid="n3")
    verdict = dead_tokens.check(history.frame())
    assert not verdict.valid and verdict.counts["sends_after_dead"] == 1


def test_dead_tokens_measures_from_when_the_dead_answer_left():
    """A provider that holds its answer (a latency fault) leaves requests in flight meanwhile:
    they are forgiven; one that arrives after the answer left is not, however soon."""
    history = History()
    history.extend_provider(
        [
            {
                "received_at": 10.0,
                "answered_at": 12.0,
                "tenant_id": "acme",
                "notification_id": "n1",
                "token": "dead",
                "provider": "apns",
                "project": None,
                "status": 410,
                "reason": "Unregistered",
            }
        ]
    )
    _request(history, 11.5, token="dead", status=410, reason="Unregistered", nid="n2")
    assert dead_tokens.check(history.frame()).valid
    _request(history, 12.7, token="dead", status=410, reason="Unregistered", nid="n3")
    verdict = dead_tokens.check(history.frame())
    assert not verdict.valid and verdict.counts["sends_after_dead"] == 1


def test_backpressure_flags_requests_inside_retry_after_per_scope():
    history = History()
    _request(history, 10.0, status=429, retry_after=2.0, nid="a")
    _request(history, 10.1, nid="in-flight")  # within the slack
    _request(history, 12.5, nid="after")
    _request(history, 11.0, provider="fcm", project="p0", nid="other-scope")
    verdict = backpressure.check(history.frame(), slack_s=0.3)
    assert verdict.valid, verdict
    _request(history, 11.0, nid="ignored")
    verdict = backpressure.check(history.frame(), slack_s=0.3)
    assert not verdict.valid
    assert verdict.counts["requests_inside_retry_after"] == 1
    assert verdict.counts["furthest_inside_ms"] == 1000  # the answer at 10.0, the request at 11.0
    [example] = verdict.details["examples"]
    assert example["furthest_s"] == 1.0 and example["retry_after_s"] == 2.0


def test_backpressure_excuses_a_burst_read_after_a_silence_and_still_catches_a_client_that_goes_on():
    """A simulator starved of CPU (or a client starved before it read the 429) reads, after a
    silence, requests that may have been sent before the answer could be seen: the slack runs
    from that first read. A client that goes on sending is read at once after the answer."""
    history = History()
    _request(history, 10.0, status=429, retry_after=2.0, nid="a")
    for i, at in enumerate((10.5, 10.51, 10.52, 12.1)):  # silent for 0.5 s, then a burst
        _request(history, at, nid=f"burst{i}")
    verdict = backpressure.check(history.frame(), slack_s=0.3)
    assert verdict.valid, verdict
    assert verdict.counts["requests_inside_retry_after"] == 0
    assert verdict.counts["excused_after_silence"] == 3
    _request(history, 11.0, nid="past the burst's slack")
    verdict = backpressure.check(history.frame(), slack_s=0.3)
    assert not verdict.valid and verdict.counts["requests_inside_retry_after"] == 1
    history = History()
    _request(history, 20.0, status=429, retry_after=2.0, nid="b")
    for i in range(1, 40):  # every 50 ms through the pause
        _request(history, 20.0 + i * 0.05, nid=f"on{i}")
    verdict = backpressure.check(history.frame(), slack_s=0.3)
    assert not verdict.valid
    # Read 50 ms after the answer: the slack runs from the answer, 20.35 .. 21.95 inside.
    assert verdict.counts["requests_inside_retry_after"] == 33
    assert verdict.counts["excused_after_silence"] == 0


def test_backpressure_rate_cap():
    history = History()
    for i in range(12):
        _request(history, 50.0 + i / 100, nid=f"n{i}")
    assert backpressure.check(history.frame(), cap_per_s=20).valid
    verdict = backpressure.check(history.frame(), cap_per_s=10)
    assert not verdict.valid
    assert verdict.counts["seconds_over_cap"] == 1
    assert verdict.counts["peak_requests_per_s"] == 12


def _population_with_shared_device():
    from datetime import UTC, datetime

    from harness.model.population import PopulationSpec, generate

    spec = PopulationSpec(
        users_per_tenant=30, celebrity_followers=20, regular_authors=1, shared_token_fraction=1.0
    )
    return generate(4, datetime(2026, 11, 22, 12, tzinfo=UTC), spec)


def test_consent_flags_a_delivery_to_a_user_without_consent():
    from harness.checkers import consent

    population = _population_with_shared_device()
    granted = next(
        u for u in population.users if u.consent and population.devices_of(u.tenant_id, u.user_id)
    )
    denied = next(
        u
        for u in population.users
        if u.consent is None and population.devices_of(u.tenant_id, u.user_id)
    )
    history = History()
    _request(
        history,
        1.0,
        token=population.devices_of(granted.tenant_id, granted.user_id)[0].token,
        tenant=granted.tenant_id,
    )
    assert consent.check(population, history.frame()).valid
    denied_device = population.devices_of(denied.tenant_id, denied.user_id)[0]
    _request(history, 2.0, token=denied_device.token, tenant=denied.tenant_id, nid="n2")
    verdict = consent.check(population, history.frame())
    assert not verdict.valid
    assert verdict.counts["deliveries_without_consent"] == 1


def test_tenant_isolation_flags_a_delivery_to_another_tenants_device():
    from harness.checkers import tenant_isolation
    from harness.model.oracle import expected_deliveries

    population = _population_with_shared_device()
    history = History()
    history.append(
        "inject",
        tenant_id="tenant-0",
        author_id="u000000",
        notification_id="01JSHARED00000000000000000",
    )
    history.append(
        "inject",
        tenant_id="tenant-1",
        author_id="u000000",
        notification_id="01JSHARED00000000000000000",
    )
    expectation = expected_deliveries(population, history.frame().query("kind == 'inject'"))
    for row in expectation.deliveries.itertuples():
        _request(history, 1.0, token=row.token, tenant=row.tenant_id, nid=row.notification_id)
    verdict = tenant_isolation.check(population, expectation, history.frame())
    assert verdict.valid, verdict
    assert verdict.counts["ids_minted_by_several_tenants"] == 1
    assert verdict.counts["devices_shared_by_tenants"] > 0
    # A device only tenant-0 has, receiving tenant-1's notification.
    only_zero = next(
        d
        for d in population.devices
        if d.tenant_id == "tenant-0"
        and not any(e.token == d.token for e in population.devices if e.tenant_id == "tenant-1")
    )
    _request(
        history, 2.0, token=only_zero.token, tenant="tenant-1", nid="01JSHARED00000000000000000"
    )
    verdict = tenant_isolation.check(population, expectation, history.frame())
    assert not verdict.valid
    assert verdict.counts["deliveries_to_foreign_devices"] == 1


def test_dlq_accountability_tells_parked_jobs_from_vanished_ones():
    from harness.checkers import dlq_accountability
    from harness.model.oracle import expected_deliveries

    population = _population_with_shared_device()
    history = History()
    history.append(
        "inject",
        tenant_id="tenant-0",
        author_id="u000000",
        notification_id="01JACCOUNT0000000000000000",
    )
    expectation = expected_deliveries(population, history.frame().query("kind == 'inject'"))
    rows = list(expectation.deliveries.itertuples())
    assert len(rows) >= 3
    for row in rows[2:]:
        _request(history, 1.0, token=row.token, tenant=row.tenant_id, nid=row.notification_id)
    history.append(
        "dlq",
        tenant_id=rows[0].tenant_id,
        notification_id=rows[0].notification_id,
        detail=json.dumps({"queue": "fanout-push-dlq", "recipient_user_id": rows[0].user_id}),
    )
    verdict = dlq_accountability.check(expectation, history.frame())
    same_user_as_first = sum(1 for r in rows[:2] if r.user_id == rows[0].user_id)
    assert verdict.counts["in_dlq"] == same_user_as_first
    assert verdict.counts["vanished"] == 2 - same_user_as_first
    assert verdict.valid == (same_user_as_first == 2)
    history.append(
        "dlq",
        tenant_id=rows[1].tenant_id,
        notification_id=rows[1].notification_id,
        detail=json.dumps({"queue": "fanout-push-dlq", "recipient_user_id": rows[1].user_id}),
    )
    verdict = dlq_accountability.check(expectation, history.frame())
    assert verdict.valid
    assert verdict.counts["in_dlq"] == 2 and verdict.counts["vanished"] == 0
