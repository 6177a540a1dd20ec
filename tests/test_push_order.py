"""push_order over hand-made histories: each device gets an author's pushes in the order the
author posted them, judged only where the order was surely the system's to keep. Both engines
(pandas, and DuckDB over the history on disk)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from engines import engine  # noqa: F401 - the fixture, pandas and DuckDB

from harness.checkers import push_order
from harness.model.history import History
from harness.model.oracle import EXPECTED_COLUMNS, Expectation

pytestmark = pytest.mark.usefixtures("engine")

T = "acme"


def _post(history, nid, at, author="alice", answered_s=0.1, kind="inject"):
    history.append(
        kind, time=at, end=at + answered_s, tenant_id=T, author_id=author, notification_id=nid
    )


def _push(history, nid, at, token="dev-1", status=200):
    history.extend_provider(
        [
            {
                "received_at": at,
                "tenant_id": T,
                "notification_id": nid,
                "token": token,
                "provider": "apns",
                "status": status,
                "retry_after": 1.0 if status == 429 else None,
            }
        ]
    )


def _expect(*rows, reregistered=None):
    """(notification, token[, quiet_until]) rows the oracle requires."""
    frame = pd.DataFrame(
        [(T, r[0], r[1], "bob", r[2] if len(r) > 2 else None) for r in rows],
        columns=EXPECTED_COLUMNS,
    )
    return Expectation(frame, reregistered=dict(reregistered or {}))


def _fault(history, start, stop, name="sqs-duplicate-delivery"):
    for phase, at in (("start", start), ("stop", stop)):
        detail = {"window": "w1", "fault": name, "phase": phase, "params": {}}
        history.append("fault", time=at, detail=json.dumps(detail))


def _in_order(history, token="dev-9", author="carol"):
    """A pair of another author, posted 5 s apart and delivered in order: judged, passes."""
    _post(history, f"{author}-1", 0.0, author=author)
    _post(history, f"{author}-2", 5.0, author=author)
    _push(history, f"{author}-1", 1.0, token=token)
    _push(history, f"{author}-2", 6.0, token=token)
    return [(f"{author}-1", token), (f"{author}-2", token)]


def test_pushes_in_the_order_posted_pass():
    history = History()
    _post(history, "m", 0.0)
    _post(history, "n", 5.0)
    _push(history, "m", 1.0)
    _push(history, "n", 6.0)
    verdict = push_order.check(_expect(("m", "dev-1"), ("n", "dev-1")), history.frame())
    assert verdict.valid is True
    assert verdict.counts["pairs"] == verdict.counts["pairs_judged"] == 1
    assert verdict.counts["later_delivered_first"] == 0


def test_a_later_post_delivered_first_to_a_device_is_caught():
    history = History()
    _post(history, "m", 0.0)
    _post(history, "n", 5.0)
    _push(history, "n", 6.0)
    _push(history, "m", 9.0)  # held back 9 s: the author's next post overtook it
    _push(history, "m", 9.0, token="dev-2")
    _push(history, "n", 6.5, token="dev-2")
    expectation = _expect(("m", "dev-1"), ("n", "dev-1"), ("m", "dev-2"), ("n", "dev-2"))
    verdict = push_order.check(expectation, history.frame())
    assert verdict.valid is False
    assert verdict.counts["later_delivered_first"] == 2
    assert verdict.counts["device_authors_out_of_order"] == 2
    assert verdict.counts["worst_inversion_ms"] == 3000
    [first, second] = verdict.details["examples"]
    assert (first["earlier"], first["later"], first["inversion_s"]) == ("m", "n", 3.0)
    assert second["inversion_s"] == 2.5


def test_order_is_per_device_and_per_author():
    """n before m on another device, or another author's post first: no inversion."""
    history = History()
    _post(history, "m", 0.0)
    _post(history, "n", 5.0)
    _post(history, "x", 5.0, author="dave")
    _push(history, "m", 1.0)
    _push(history, "x", 0.5)  # dave's, before alice's m: not alice's order
    _push(history, "n", 6.0, token="dev-2")
    _push(history, "m", 9.0, token="dev-3")  # m on dev-3 only: no pair there
    expectation = _expect(("m", "dev-1"), ("x", "dev-1"), ("n", "dev-2"), ("m", "dev-3"))
    verdict = push_order.check(expectation, history.frame())
    assert verdict.valid is None  # no author has two notifications on one device
    assert verdict.counts["pairs"] == 0
    assert "no author had two notifications" in verdict.details["unknown"]


def test_no_author_with_two_notifications_to_one_device_is_unknown_not_a_pass():
    history = History()
    _post(history, "m", 0.0)
    _push(history, "m", 1.0)
    verdict = push_order.check(_expect(("m", "dev-1")), history.frame())
    assert verdict.valid is None and verdict.counts["pairs_judged"] == 0
    empty = push_order.check(_expect(), History().frame())
    assert empty.valid is None


@pytest.mark.parametrize(
    ("case", "count", "excused"),
    [
        ("close_together", "close_together", 1),
        ("within_slack", None, 0),
        ("earlier_retried", "earlier_retried", 1),
        ("earlier_in_fault", "earlier_in_fault", 1),
        ("deferred", "deferred", 1),
        ("posted_again", "posted_again", 1),
        ("reregistered", "reregistered", 2),  # both of the device's deliveries
        ("earlier_lost", None, 0),
    ],
)
def test_inversions_the_design_allows_are_not_judged(case, count, excused):
    """n's first push before m's, each time for a reason the design admits: posted 1 s apart,
    a jitter under slack_s, m retried after a 429, m on its way during a fault, m deferred by
    quiet hours, m posted again with its id, the device registered again, m never delivered
    (effectively_once's). Another author's pair keeps the verdict decided (a pass)."""
    history = History()
    rows = _in_order(history)
    _post(history, "m", 0.0)
    _post(history, "n", 1.0 if case == "close_together" else 5.0)
    if case == "posted_again":
        _post(history, "m", 20.0)
    if case == "earlier_retried":
        _push(history, "m", 1.0, status=429)
    if case == "earlier_in_fault":
        _fault(history, 2.0, 3.0)
    if case != "earlier_lost":
        _push(history, "m", 6.5 if case == "within_slack" else 9.0)
    _push(history, "n", 6.0)
    quiet = 8.0 if case == "deferred" else None
    again = {(T, "dev-1"): 15.0} if case == "reregistered" else None
    expectation = _expect(("m", "dev-1", quiet), ("n", "dev-1"), *rows, reregistered=again)
    verdict = push_order.check(expectation, history.frame())
    assert verdict.valid is True, verdict.counts
    assert verdict.counts["later_delivered_first"] == 0
    if count is not None:
        assert verdict.counts[count] == excused
    judged = 2 if case == "within_slack" else 1
    assert verdict.counts["pairs_judged"] == judged


def test_tolerances_move_what_is_judged():
    history = History()
    _post(history, "m", 0.0)
    _post(history, "n", 1.5)
    _push(history, "n", 2.0)
    _push(history, "m", 2.6)
    expectation = _expect(("m", "dev-1"), ("n", "dev-1"))
    assert push_order.check(expectation, history.frame()).valid is None  # close together
    verdict = push_order.check(expectation, history.frame(), apart_s=1.0, slack_s=0.5)
    assert verdict.valid is False and verdict.counts["later_delivered_first"] == 1
    # A fault ended just before m was posted: inside settle_s, m's path is excused.
    _fault(history, -3.0, -1.0)
    verdict = push_order.check(expectation, history.frame(), apart_s=1.0, slack_s=0.5)
    assert verdict.counts["earlier_in_fault"] == 1 and verdict.valid is None
    verdict = push_order.check(expectation, history.frame(), apart_s=1.0, slack_s=0.5, settle_s=0.5)
    assert verdict.valid is False


def test_an_earlier_attempt_refused_then_retried_is_not_the_first_delivery():
    """A post whose request the system answered 503 and which it took on the retry: its
    ``sent`` is the first request (the system may have taken it then)."""
    history = History()
    _post(history, "m", 0.0)
    _post(history, "n", 1.5, kind="inject_info")  # answered 503
    _post(history, "n", 3.0)  # the producer's retry, accepted
    _push(history, "n", 3.5)
    _push(history, "m", 5.0)
    expectation = _expect(("m", "dev-1"), ("n", "dev-1"))
    verdict = push_order.check(expectation, history.frame())
    assert verdict.counts["close_together"] == 1 and verdict.valid is None


def test_device_author_groups_paired_in_batches_count_the_same(monkeypatch):
    """Pairs grow with the square of an author's posts to one device: the groups are paired a
    batch at a time, and every count (the worst inversion a maximum) is the same."""
    history = History()
    rows = _in_order(history)
    for i, nid in enumerate(("m", "n", "o")):
        _post(history, nid, 5.0 * i)
    for token, times in (("dev-1", (12.0, 6.0, 11.5)), ("dev-2", (1.0, 9.0, 7.0))):
        for nid, at in zip(("m", "n", "o"), times, strict=True):
            _push(history, nid, at, token=token)
    expected = [(nid, token) for token in ("dev-1", "dev-2") for nid in ("m", "n", "o")]
    expectation = _expect(*expected, *rows)
    whole = push_order.check(expectation, history.frame())
    monkeypatch.setattr(push_order, "PAIRS_PER_BATCH", 1)
    batched = push_order.check(expectation, history.frame())
    assert batched.counts == whole.counts and batched.details == whole.details
    assert whole.counts["later_delivered_first"] == 2  # (m, n) on dev-1, (n, o) on dev-2
    assert whole.counts["device_authors_out_of_order"] == 2
    assert whole.counts["worst_inversion_ms"] == 6000


def test_registered_with_its_tolerances_and_unknown_without_data():
    """Through the registry as a scenario runs it: an empty run has no pair, never a pass."""
    from datetime import UTC, datetime

    from harness.checkers import Evidence, registry, run_probe
    from harness.model.oracle import expected_deliveries
    from harness.model.population import PopulationSpec, generate

    spec = registry.get("push_order")
    assert spec.out_of_core and not spec.needs
    assert dict(spec.tolerances) == {"apart_s": 3.0, "slack_s": 1.0, "settle_s": 2.0}
    population = generate(1, datetime(2026, 11, 24, 12, tzinfo=UTC), PopulationSpec())
    injected = pd.DataFrame(columns=["tenant_id", "author_id", "notification_id"])
    evidence = Evidence(population, expected_deliveries(population, injected), History().frame())
    verdict = run_probe("push_order", {}, evidence)
    assert verdict.valid is None and "unknown" in verdict.details, verdict
