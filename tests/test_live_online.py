"""The live checks (harness.live.online) and stop conditions (harness.live.stop) over hand-made
histories: each violation they name, the cases the final checkers excuse, and the promise that
every live violation is also a final one (hypothesis over random histories)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.checkers import backpressure, dead_tokens, duplicate_causes, fail_closed
from harness.live.online import INJECT_SETTLE_S, OnlineChecks
from harness.live.stop import StopConditionError, first_fired, parse_stop_condition
from harness.model.history import History


def _fault(history: History, name: str, start: float, stop: float | None, **record) -> None:
    phases = [("start", start)] + ([("stop", stop)] if stop is not None else [])
    for phase, at in phases:
        detail = {"window": f"{name}-{start}", "fault": name, "phase": phase, **record}
        history.append("fault", time=at, detail=json.dumps(detail))


def _send(history: History, at: float, nid: str = "n1", token: str = "t1", status: int = 200,
          collapse: str | None = None) -> None:  # fmt: skip
    history.extend_provider(
        [
            {
                "received_at": at,
                "tenant_id": "acme",
                "notification_id": nid,
                "token": token,
                "provider": "apns",
                "status": status,
                "delivered": status in (200, 500),
                "collapse_id": collapse,
            }
        ]
    )


def _inject(history: History, at: float, nid: str) -> None:
    history.append("inject", time=at, tenant_id="acme", author_id="a", notification_id=nid)


def _live(history: History, **options) -> OnlineChecks:
    checks = OnlineChecks(**options)
    checks.feed(history.frame().to_dict("records"))
    checks.finish()
    return checks


def test_a_second_delivery_to_a_device_is_a_live_duplicate_visible_unless_collapsed():
    history = History()
    _send(history, 10.0, nid="plain")
    _send(history, 11.0, nid="plain")
    _send(history, 10.0, nid="collapsed", collapse="c1")
    _send(history, 12.0, nid="collapsed", collapse="c1")
    _send(history, 10.0, nid="other-device", token="t2")
    _send(history, 10.5, nid="other-device", token="t3")  # two devices, once each: fine
    checks = _live(history)
    assert checks.counts["duplicates"] == 2
    assert checks.counts["visible_duplicates"] == 1
    first = checks.first["visible_duplicates"]
    assert first.evidence["notification_id"] == "plain" and first.time == 11.0


def test_a_duplicate_the_design_admits_is_not_a_live_one():
    history = History()
    _send(history, 10.0, nid="accepted-then-error", status=500)
    _send(history, 11.0, nid="accepted-then-error")
    _send(history, 20.0, nid="across-a-kill")
    _fault(history, "consumer-crash", 21.0, 22.0)
    _send(history, 23.0, nid="across-a-kill")
    checks = _live(history)
    assert checks.counts["duplicates"] == 0


def test_a_delivery_decided_during_a_dedup_outage_is_seen_once_its_injection_is_in():
    history = History()
    _fault(history, "dedup-outage", 100.0, None, unavailable="dedup")
    _inject(history, 98.0, "before")
    _send(history, 100.8, nid="before")  # decided before the cut: no violation
    _send(history, 102.5, nid="fresh")  # its injection's row comes after (written on the answer)
    _inject(history, 102.0, "fresh")
    checks = OnlineChecks()
    rows = history.frame().to_dict("records")
    assert checks.feed(rows) == []  # not judged before every injection can be in
    checks.feed([{"kind": "phase", "time": 102.5 + INJECT_SETTLE_S}])
    assert checks.counts["decided_during_outage"] == 1
    assert checks.first["decided_during_outage"].evidence["notification_id"] == "fresh"
    # With a fallback store stated, deliveries during the outage are allowed.
    assert _live(history, fallback=True).counts["decided_during_outage"] == 0


def test_an_outage_by_another_dependency_or_after_it_ended_is_not_judged():
    history = History()
    _fault(history, "proxy-down", 100.0, 105.0, unavailable="kinesis")
    _fault(history, "dedup-outage", 200.0, 205.0, unavailable="dedup")
    _inject(history, 101.0, "kinesis")
    _send(history, 102.0, nid="kinesis")
    _inject(history, 203.0, "after")
    _send(history, 206.0, nid="after")
    assert _live(history).counts["decided_during_outage"] == 0


@pytest.mark.parametrize(
    ("text", "counts", "fires"),
    [
        ("duplicates > 0", {"duplicates": 1}, True),
        ("duplicates > 0", {"duplicates": 0}, False),
        ("decided_during_outage >= 3", {"decided_during_outage": 3}, True),
        ("visible_duplicates>2", {"visible_duplicates": 2}, False),
    ],
)
def test_a_stop_condition_fires_past_its_threshold(text, counts, fires):
    condition = parse_stop_condition(text)
    assert (first_fired([condition], counts) is condition) is fires


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("lost > 0", "no live check 'lost'"),
        ("duplicates", "write it as"),
        ("duplicates < 3", "write it as"),
        ("duplicates > -1", "write it as"),
    ],
)
def test_an_unreadable_stop_condition_says_what_is_wrong(text, message):
    with pytest.raises(StopConditionError, match=message):
        parse_stop_condition(text)


# -- every live violation is a final one --------------------------------------------------------

_deliveries = st.lists(
    st.tuples(
        st.sampled_from(["n1", "n2", "n3"]),
        st.sampled_from(["t1", "t2"]),
        st.floats(0, 40, allow_nan=False),
        st.sampled_from([200, 200, 200, 500, 429, 410]),
        st.sampled_from([None, "c"]),
        st.floats(0.01, 1.5, allow_nan=False),  # until the collector's poll read it
    ),
    min_size=3,
    max_size=25,
)
_faults = st.lists(
    st.tuples(
        st.sampled_from(["consumer-crash", "dedup-outage", "dedup-crash"]),
        st.floats(0, 30, allow_nan=False),
        st.floats(0.5, 20, allow_nan=False),
    ),
    min_size=1,
    max_size=3,
)
_injects = st.fixed_dictionaries(
    {
        nid: st.tuples(st.floats(0, 40, allow_nan=False), st.floats(0, 3, allow_nan=False))
        for nid in ("n1", "n2", "n3")
    }
)


@settings(max_examples=60, deadline=None)
@given(_deliveries, _faults, _injects)
def test_every_live_violation_is_also_a_final_one(deliveries, faults, injects):
    """Rows in the order a run writes them (a fault's at its instant, a provider's when the
    collector's next poll reads it, an injection when its answer came back), fed to the live
    checks; what they report is never more than the final checkers find. A delivery's time
    counts from its event's posting: no provider gets a push before the harness posted the
    event (one drawn before it, inside an outage that began at 0, read as decided there live
    and not by the final checker, which bounds a decision below by the posting)."""
    events: list[tuple[float, str, tuple]] = []
    for nid, token, after_post, status, collapse, read_after in deliveries:
        at = injects[nid][0] + after_post
        events.append((at + read_after, "send", (at, nid, token, status, collapse)))
    for name, start, length in faults:
        record = {"unavailable": "dedup"} if name != "consumer-crash" else {}
        events.append((start, "fault", (name, "start", f"w{start}", record)))
        events.append((start + length, "fault", (name, "stop", f"w{start}", record)))
    for nid, (at, answered_after) in injects.items():
        events.append((at + answered_after, "inject", (nid, at)))
    history = History()
    for at, kind, data in sorted(events, key=lambda e: e[0]):
        if kind == "send":
            sent, nid, token, status, collapse = data
            _send(history, sent, nid=nid, token=token, status=status, collapse=collapse)
        elif kind == "fault":
            name, phase, window, record = data
            detail = {"window": window, "fault": name, "phase": phase, **record}
            history.append("fault", time=at, detail=json.dumps(detail))
        else:
            _inject(history, data[1], data[0])
    frame = history.frame()
    live = _live(history)
    causes = duplicate_causes.attribute(frame, durable=True)
    unattributed = causes[causes["cause"] == duplicate_causes.UNATTRIBUTED]
    assert live.counts["duplicates"] <= len(unattributed)
    assert live.counts["visible_duplicates"] <= live.counts["duplicates"]
    final = fail_closed.check(frame, grace_s=live.grace_s)
    assert live.counts["decided_during_outage"] <= final.counts["decided_during_outage"]
    dead = dead_tokens.check(frame, transit_s=live.transit_s)
    assert live.counts["sends_after_dead"] <= dead.counts["sends_after_dead"]


def test_a_send_after_a_token_answered_dead_is_seen_unless_it_was_brought_back():
    history = History()
    history.extend_provider(
        [
            {"received_at": 10.0, "answered_at": 10.1, "tenant_id": "acme", "token": "gone",
             "notification_id": "n1", "provider": "apns", "status": 410, "delivered": False},
            {"received_at": 10.3, "tenant_id": "acme", "token": "gone", "notification_id": "n2",
             "provider": "apns", "status": 410, "delivered": False},  # in flight: forgiven
            {"received_at": 12.0, "tenant_id": "acme", "token": "gone", "notification_id": "n3",
             "provider": "apns", "status": 410, "delivered": False},
            {"received_at": 12.0, "tenant_id": "other", "token": "gone", "notification_id": "n3",
             "provider": "apns", "status": 200},  # another tenant's app: not told dead
        ]
    )  # fmt: skip
    checks = _live(history)
    assert checks.counts["sends_after_dead"] == 1
    assert checks.first["sends_after_dead"].evidence == {
        "tenant_id": "acme",
        "token": "gone",
        "dead_at": 10.1,
    }
    detail = json.dumps({"change": "reinstall", "tokens": ["gone"], "ok": True})
    history.append("change", time=11.0, tenant_id="acme", detail=detail)
    assert _live(history).counts["sends_after_dead"] == 0


def test_a_device_registered_again_after_an_erasure_is_a_new_persons_from_then_on():
    """gdpr-erasure posts a probe again to the person registered again on the same device: the
    second delivery is theirs (the erasure checker's), not a duplicate of the first (a loaded
    run's live view called it one while effectively_once passed)."""
    history = History()
    _send(history, 10.0, nid="probe")
    _send(history, 30.0, nid="probe")
    assert _live(history).counts["duplicates"] == 1
    detail = {"change": "registration", "tokens": ["t1"], "ok": True}
    history.append("change", time=20.0, tenant_id="acme", user_id="u", detail=json.dumps(detail))
    assert _live(history).counts["duplicates"] == 0
    # A registration the system refused never happened.
    refused = History()
    _send(refused, 10.0, nid="probe")
    _send(refused, 30.0, nid="probe")
    refused.append(
        "change", time=20.0, tenant_id="acme", user_id="u",
        detail=json.dumps({**detail, "ok": False}),
    )  # fmt: skip
    assert _live(refused).counts["duplicates"] == 1


def test_deliveries_inside_a_whole_run_quiet_window_or_without_consent_are_seen_live():
    # A generated population; the final quiet_hours and consent checkers count the same
    # deliveries the live checks name, one by one, the moment each is seen.
    from datetime import UTC, datetime

    from harness.checkers import consent, quiet_hours
    from harness.checkers.evidence import evidence_from
    from harness.model.population import generate

    population = generate(3, datetime(2026, 11, 29, 12, tzinfo=UTC))
    all_refused = consent.refused_devices(population)
    quiet = sorted(quiet_hours.quiet_all_run(population) - all_refused)
    refused = sorted(all_refused - quiet_hours.quiet_all_run(population))
    free = sorted({(d.tenant_id, d.token) for d in population.devices} - set(quiet) - set(refused))
    assert quiet and refused and free
    history, at = History(), population.started_at + 5
    picked = [*quiet[:2], *refused[:3], *free[:4]]
    for n, (tenant, token) in enumerate(picked):
        history.extend_provider(
            [{"received_at": at + n, "tenant_id": tenant, "notification_id": f"n{n}",
              "token": token, "provider": "apns", "status": 200, "delivered": True}]
        )  # fmt: skip
    checks = OnlineChecks()
    checks.watch_population(
        frozenset(quiet_hours.quiet_all_run(population)), frozenset(all_refused)
    )
    frame = history.frame()
    seen = checks.feed(frame.to_dict("records")[:3])  # judged as they come, not at the end
    assert [v.check for v in seen] == ["in_quiet_hours", "in_quiet_hours", "without_consent"]
    checks.feed(frame.to_dict("records")[3:])
    checks.finish()
    evidence = evidence_from(population, frame)
    final_quiet = quiet_hours.check(population, evidence.expectation, frame)
    final_consent = consent.check(population, frame)
    assert checks.counts["in_quiet_hours"] == final_quiet.counts["delivered_inside_window"] == 2
    assert checks.counts["without_consent"] == final_consent.counts[
        "deliveries_without_consent"
    ] == 3  # fmt: skip
    assert OnlineChecks().feed(frame.to_dict("records")) == []  # off unless watched


_requests = st.lists(
    st.tuples(
        st.floats(0, 30, allow_nan=False).map(lambda t: round(t, 2)),  # the request's time
        st.sampled_from([("apns", None), ("fcm", "p1"), ("fcm", "p2")]),
        st.one_of(st.none(), st.floats(0.1, 8, allow_nan=False)),  # its answer's Retry-After
        st.floats(0, 2.5, allow_nan=False),  # read this long after it
    ),
    max_size=40,
)


@settings(max_examples=100, deadline=None)
@given(_requests)
def test_a_request_inside_a_retry_after_is_seen_live_once_and_counted_finally(requests):
    history = History()
    history.extend_provider(
        [{"received_at": at, "tenant_id": "acme", "notification_id": "n", "token": "t",
          "provider": provider, "project": project, "status": 429 if retry_after else 200,
          "retry_after": retry_after, "delivered": retry_after is None}
         for at, (provider, project), retry_after, _ in sorted(requests, key=lambda r: r[0] + r[3])]
    )  # fmt: skip
    frame = history.frame()
    live = _live(history)
    final = backpressure.check(frame, slack_s=live.slack_s)
    assert live.counts["inside_retry_after"] <= final.counts["requests_inside_retry_after"]
    # Exactly the requests inside any window of their own scope (brute force): the slack runs
    # from the answer, or from the scope's first request after it when none came within it.
    slack = live.slack_s

    def opens(t: float, scope: tuple) -> float:
        first = min((at for at, other, _, _ in requests if other == scope and at > t), default=t)
        return (first if first > t + slack else t) + slack

    inside = sum(
        any(
            scope == other and opens(t, other) < at < t + r
            for t, other, r, _ in requests
            if r is not None
        )
        for at, scope, _, _ in requests
    )
    assert live.counts["inside_retry_after"] == inside
    # The final checker counts a request once per answer whose window holds it.
    per_answer = sum(
        opens(t, other) < at < t + r
        for t, other, r, _ in requests
        if r is not None
        for at, scope, _, _ in requests
        if scope == other
    )
    assert final.counts["requests_inside_retry_after"] == per_answer


def _latency_population():
    from datetime import UTC, datetime

    from harness.model.population import PopulationSpec, generate

    spec = PopulationSpec(users_per_tenant=40, celebrity_followers=20, regular_authors=2)
    return generate(5, datetime(2026, 11, 29, 12, tzinfo=UTC), spec)


def _latency_checks(population, bound_s=60.0, recovery_s=30.0) -> OnlineChecks:
    from harness.model.oracle import required_push_recipients

    checks = OnlineChecks()
    followers = {(a.tenant_id, a.user_id): frozenset(a.followers) for a in population.authors}
    checks.watch_latency(required_push_recipients(population), followers, bound_s, recovery_s)
    return checks


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from([5.0, 45.0, 59.0, 61.0, 75.0, 100.0, 140.0]), min_size=6, max_size=6),
    st.lists(st.tuples(st.floats(0, 150), st.floats(0, 40)), max_size=2),  # faults (start, length)
    st.lists(st.tuples(st.integers(0, 5), st.floats(0, 150)), max_size=2),  # redrives (row, at)
)
def test_a_late_delivery_seen_live_is_exactly_the_final_checkers(latencies, faults, redrives):
    """Six required pushes of one post, each delivered after its latency; fault windows and
    DLQ redrives in between: the live ``late_delivery`` count is delivery_latency's ``late``,
    and every live one is a final one."""
    from harness.checkers import delivery_latency
    from harness.checkers.evidence import evidence_from
    from harness.model.oracle import required_push_recipients

    population = _latency_population()
    recipients = required_push_recipients(population)
    author = next(a for a in population.authors if not a.celebrity)
    targets = [
        (token, user)
        for (tenant, token), users in sorted(recipients.items())
        for user, until in users
        if tenant == author.tenant_id and user in author.followers and until is None
    ][:6]
    assert len(targets) == 6
    history, posted = History(), population.started_at + 10
    history.append("inject", time=posted, end=posted + 0.2, tenant_id=author.tenant_id,
                   author_id=author.user_id, notification_id="n1")  # fmt: skip
    for n, (start, length) in enumerate(faults):
        _fault(history, f"f{n}", posted + start, posted + start + length)
    for row, at in redrives:
        token, user = targets[row]
        history.append("redriven", time=posted + at, tenant_id=author.tenant_id,
                       notification_id="n1", user_id=user)  # fmt: skip
    for (token, _), latency in zip(targets, latencies, strict=True):
        history.extend_provider(
            [{"received_at": posted + 0.2 + latency, "tenant_id": author.tenant_id,
              "notification_id": "n1", "token": token, "provider": "apns", "status": 200,
              "delivered": True}]
        )  # fmt: skip
    frame = history.frame().sort_values("time", kind="stable")
    checks = _latency_checks(population)
    checks.feed(frame.to_dict("records"))
    checks.finish()
    expectation = evidence_from(population, frame).expectation
    final = delivery_latency.check(expectation, frame, 60.0, 30.0)
    mine = expectation.deliveries[expectation.deliveries["notification_id"] == "n1"]
    assert len(mine) >= 6  # the six are required (others of the post never arrived)
    assert checks.counts["late_delivery"] == final.counts["late"]


def test_late_delivery_is_judged_only_for_the_pushes_the_oracle_requires():
    """A device of a user without consent, one quiet all run, a dead token, and a user who does
    not follow the author: none is judged, however late; a quiet window's end moves the start."""
    from harness.checkers import consent, quiet_hours

    population = _latency_population()
    author = next(a for a in population.authors if not a.celebrity)
    tenant = author.tenant_id
    refused = sorted(t for te, t in consent.refused_devices(population) if te == tenant)
    quiet = sorted(t for te, t in quiet_hours.quiet_all_run(population) if te == tenant)
    dead = sorted(d.token for d in population.devices if d.tenant_id == tenant and d.dead)
    strangers = sorted(
        d.token for d in population.devices
        if d.tenant_id == tenant and d.user_id not in author.followers and not d.dead
    )  # fmt: skip
    history, posted = History(), population.started_at + 10
    history.append("inject", time=posted, end=posted, tenant_id=tenant, author_id=author.user_id,
                   notification_id="n1")  # fmt: skip
    for token in [*refused[:1], *quiet[:1], *dead[:1], *strangers[:1]]:
        _send_to(history, tenant, token, posted + 500)
    checks = _latency_checks(population)
    checks.feed(history.frame().to_dict("records"))
    checks.finish()
    assert checks.counts["late_delivery"] == 0
    assert OnlineChecks().feed(history.frame().to_dict("records")) == []  # off unless watched


def _send_to(history: History, tenant: str, token: str, at: float, nid: str = "n1") -> None:
    history.extend_provider(
        [{"received_at": at, "tenant_id": tenant, "notification_id": nid, "token": token,
          "provider": "apns", "status": 200, "delivered": True}]
    )  # fmt: skip


def test_a_late_delivery_is_seen_once_its_posts_are_surely_in():
    population = _latency_population()
    from harness.model.oracle import required_push_recipients

    author = next(a for a in population.authors if not a.celebrity)
    tenant = author.tenant_id
    token = next(
        t for (te, t), users in sorted(required_push_recipients(population).items())
        if te == tenant and any(u in author.followers and q is None for u, q in users)
    )  # fmt: skip
    history, posted = History(), population.started_at + 10
    history.append("inject", time=posted, end=posted + 1, tenant_id=tenant,
                   author_id=author.user_id, notification_id="n1")  # fmt: skip
    _send_to(history, tenant, token, posted + 70)  # 69 s after its acceptance
    checks = _latency_checks(population)
    rows = history.frame().to_dict("records")
    assert checks.feed(rows, now=posted + 70.5) == []  # a post sent before may be on its way
    [late] = checks.feed([], now=posted + 70 + INJECT_SETTLE_S + 0.1)
    assert late.check == "late_delivery" and late.time == posted + 70
    assert late.evidence["measured_from"] == round(posted + 1, 3)
    assert late.evidence["allowed_by"] == round(posted + 61, 3)
