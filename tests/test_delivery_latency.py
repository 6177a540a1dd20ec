"""delivery_latency over hand-made histories: each violation it names is counted, a correct
history passes, a fault window and a quiet window move the allowance, and nothing judged is
never a pass. Every test runs on both engines (the history in memory, and on disk in DuckDB)."""

from __future__ import annotations

import json
import random

import pandas as pd
import pytest
from engines import on_store

from harness.checkers import delivery_latency, registry
from harness.checkers.evidence import Evidence
from harness.model.history import History
from harness.model.oracle import EXPECTED_COLUMNS, OPTIONAL_COLUMNS, Expectation
from harness.model.population import Population, PopulationSpec
from harness.model.system import SystemPolicy


@pytest.fixture(params=("pandas", "duckdb"), autouse=True)
def engine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "duckdb":
        check = on_store(delivery_latency.check, delivery_latency.check_store)
        monkeypatch.setattr(delivery_latency, "check", check)
    return request.param


def _inject(history, sent, answered, nid, tenant="acme"):
    history.append(
        "inject", time=sent, end=answered, tenant_id=tenant, author_id="a", notification_id=nid
    )


def _push(history, at, nid, token="t1", status=200, tenant="acme"):
    history.extend_provider(
        [
            {
                "received_at": at,
                "tenant_id": tenant,
                "notification_id": nid,
                "token": token,
                "provider": "apns",
                "status": status,
                "delivered": status == 200,
            }
        ]
    )


def _fault(history, start, stop, window="w1", name="apns-status"):
    for phase, at in (("start", start), ("stop", stop)):
        detail = {"window": window, "fault": name, "phase": phase, "params": {}}
        history.append("fault", time=at, detail=json.dumps(detail))


def _expect(*rows, optional=()):
    """(nid, token) or (nid, token, quiet_until) per required delivery, tenant acme."""
    full = [(r + (None,))[:3] for r in rows]
    deliveries = pd.DataFrame(
        [("acme", nid, token, "u1", until) for nid, token, until in full], columns=EXPECTED_COLUMNS
    )
    maybe = pd.DataFrame(
        [("acme", nid, token, "u1", "limited") for nid, token in optional], columns=OPTIONAL_COLUMNS
    )
    return Expectation(deliveries, optional=maybe)


def _check(expectation, history, **kwargs):
    return delivery_latency.check(expectation, history.frame(), **kwargs)


def test_a_history_within_the_bound_passes_with_its_figures():
    history = History()
    _inject(history, 100.0, 100.5, "n1")
    _inject(history, 110.0, 110.5, "n2")
    _push(history, 102.5, "n1", "t1")
    _push(history, 160.0, "n1", "t2")  # 59.5 s: inside
    _push(history, 111.5, "n2", "t1")
    verdict = _check(_expect(("n1", "t1"), ("n1", "t2"), ("n2", "t1")), history)
    assert verdict.valid is True
    assert verdict.counts == {
        "expected": 3, "judged": 3, "late": 0, "deferred": 0, "redriven": 0,
        "extended_by_fault": 0,
        "not_delivered": 0, "no_acceptance": 0, "worst_latency_ms": 59_500,
        "p50_latency_ms": 2_000, "p99_latency_ms": 58_350,
    }  # fmt: skip
    assert verdict.details["bound_s"] == 60.0 and verdict.details["examples"] == []


def test_a_late_delivery_is_counted_with_its_example():
    history = History()
    _inject(history, 100.0, 100.5, "n1")
    _push(history, 161.0, "n1", "t1")  # 60.5 s after the answer
    _push(history, 130.0, "n1", "t2")
    verdict = _check(_expect(("n1", "t1"), ("n1", "t2")), history)
    assert verdict.valid is False
    assert verdict.counts["late"] == 1 and verdict.counts["judged"] == 2
    assert verdict.counts["worst_latency_ms"] == 60_500
    assert verdict.details["examples"] == [
        {
            "tenant_id": "acme", "notification_id": "n1", "token": "t1", "accepted": 100.5,
            "measured_from": 100.5, "delivered": 161.0, "allowed_by": 160.5, "latency_s": 60.5,
        }
    ]  # fmt: skip
    # A looser bound (the system's own, or the scenario's) lets it through.
    assert _check(_expect(("n1", "t1"), ("n1", "t2")), history, bound_s=61.0).valid is True


def test_latency_runs_from_the_answer_not_the_request():
    """Acceptance is the answered time: an Event API that took 5 s to answer is not blamed for
    them; and a delivery exactly at the bound is in time."""
    history = History()
    _inject(history, 100.0, 105.0, "n1")
    _push(history, 165.0, "n1")
    assert _check(_expect(("n1", "t1")), history).valid is True
    history = History()
    _inject(history, 100.0, 105.0, "n1")
    _push(history, 165.01, "n1")
    assert _check(_expect(("n1", "t1")), history).counts["late"] == 1


def test_the_first_successful_request_is_the_delivery():
    """Refused attempts before it do not count; a duplicate after it changes nothing."""
    history = History()
    _inject(history, 100.0, 100.0, "n1")
    _push(history, 101.0, "n1", status=429)
    _push(history, 150.0, "n1")
    _push(history, 400.0, "n1")  # a duplicate: effectively_once's
    verdict = _check(_expect(("n1", "t1")), history)
    assert verdict.valid is True and verdict.counts["worst_latency_ms"] == 50_000
    history = History()
    _inject(history, 100.0, 100.0, "n1")
    _push(history, 101.0, "n1", status=503)
    _push(history, 170.0, "n1")
    assert _check(_expect(("n1", "t1")), history).counts["late"] == 1


def test_a_fault_window_extends_the_allowance_to_its_end_plus_recovery():
    history = History()
    _inject(history, 100.0, 100.0, "n1")
    _inject(history, 100.0, 100.0, "n2")
    _fault(history, 130.0, 200.0)  # inside n1's 60 s: allowed until 200 + 30
    _push(history, 225.0, "n1")
    _push(history, 235.0, "n2")
    verdict = _check(_expect(("n1", "t1"), ("n2", "t1")), history, recovery_s=30.0)
    assert verdict.counts["extended_by_fault"] == 2
    assert verdict.counts["late"] == 1
    [example] = verdict.details["examples"]
    assert example["notification_id"] == "n2" and example["allowed_by"] == 230.0
    assert _check(_expect(("n1", "t1"), ("n2", "t1")), history, recovery_s=40.0).valid is True
    # Without the fault both are late: the window is what let n1 through.
    bare = History()
    _inject(bare, 100.0, 100.0, "n1")
    _push(bare, 225.0, "n1")
    assert _check(_expect(("n1", "t1")), bare).counts["late"] == 1


def test_a_fault_after_the_allowance_ran_out_excuses_nothing_and_faults_chain():
    history = History()
    _inject(history, 100.0, 100.0, "n1")
    _fault(history, 170.0, 200.0, window="after")  # n1 was due at 160: already late
    _push(history, 175.0, "n1")
    verdict = _check(_expect(("n1", "t1")), history)
    assert verdict.counts["late"] == 1 and verdict.counts["extended_by_fault"] == 0
    # A fault before the event that ended before it: nothing to recover from.
    history = History()
    _fault(history, 10.0, 20.0, window="before")
    _inject(history, 100.0, 100.0, "n1")
    _push(history, 175.0, "n1")
    assert _check(_expect(("n1", "t1")), history).counts["late"] == 1
    # One fault's recovery runs into the next: allowed until the second's end plus recovery.
    history = History()
    _inject(history, 100.0, 100.0, "n1")
    _fault(history, 150.0, 180.0, window="one")  # allowed until 210 ...
    _fault(history, 200.0, 260.0, window="two")  # ... which meets this one: until 290
    _push(history, 285.0, "n1")
    verdict = _check(_expect(("n1", "t1")), history)
    assert verdict.valid is True and verdict.counts["extended_by_fault"] == 1
    # A fault still open at the end of the history closes there.
    history = History()
    _inject(history, 100.0, 100.0, "n1")
    history.append(
        "fault",
        time=150.0,
        detail=json.dumps({"window": "w", "fault": "x", "phase": "start", "params": {}}),
    )
    _push(history, 185.0, "n1")
    assert _check(_expect(("n1", "t1")), history).valid is True  # open until 185: 215


def test_a_quiet_hours_deferral_is_measured_from_the_window_end():
    history = History()
    _inject(history, 100.0, 100.0, "n1")
    _inject(history, 100.0, 100.0, "n2")
    _push(history, 540.0, "n1")  # 40 s after the window ended at 500
    _push(history, 570.0, "n2")  # 70 s after it: late
    verdict = _check(_expect(("n1", "t1", 500.0), ("n2", "t1", 500.0)), history)
    assert verdict.counts["deferred"] == 2 and verdict.counts["late"] == 1
    assert verdict.counts["worst_latency_ms"] == 70_000
    [example] = verdict.details["examples"]
    assert example["measured_from"] == 500.0 and example["allowed_by"] == 560.0
    assert example["accepted"] == 100.0
    # A window that ended before the event changes nothing: measured from the acceptance.
    history = History()
    _inject(history, 100.0, 100.0, "n1")
    _push(history, 170.0, "n1")
    verdict = _check(_expect(("n1", "t1", 50.0)), history)
    assert verdict.counts["late"] == 1 and verdict.counts["deferred"] == 0


def _redriven(history, at, nid, user="u1", tenant="acme"):
    history.append("redriven", time=at, tenant_id=tenant, notification_id=nid, user_id=user)


def test_a_push_whose_job_waited_in_the_dlq_is_measured_from_the_operators_redrive():
    """Seed 004 parks a job after 3 receives (a consumer killed twice while holding it); the
    time it waits there is the operator's: measured from the redrive of its job, never from a
    redrive of another recipient's job, nor one after it arrived."""
    history = History()
    for nid in ("n1", "n2", "n3", "n4"):
        _inject(history, 100.0, 100.0, nid)
    _redriven(history, 150.0, "n1")  # its own job: 40 s after the redrive, in time
    _push(history, 190.0, "n1")
    _redriven(history, 150.0, "n2", user=None)  # a job that names no recipient: its whole post
    _push(history, 195.0, "n2")
    _redriven(history, 150.0, "n3", user="someone else")  # not its job: 90 s late
    _push(history, 190.0, "n3")
    _push(history, 170.0, "n4")  # arrived 70 s after acceptance, before its redrive: late
    _redriven(history, 180.0, "n4")
    verdict = _check(_expect(*((n, "t1") for n in ("n1", "n2", "n3", "n4"))), history)
    assert verdict.counts["redriven"] == 2
    assert verdict.counts["late"] == 2
    late = {e["notification_id"]: e for e in verdict.details["examples"]}
    assert set(late) == {"n3", "n4"}
    assert late["n3"]["measured_from"] == 100.0 and late["n4"]["measured_from"] == 100.0


def test_an_undelivered_push_is_counted_not_failed_and_optional_ones_are_not_judged():
    history = History()
    _inject(history, 100.0, 100.0, "n1")
    _inject(history, 100.0, 100.0, "n2")
    _push(history, 101.0, "n1")
    _push(history, 900.0, "n2", token="limited")  # optional: never judged, late or not
    verdict = _check(_expect(("n1", "t1"), ("n2", "t1"), optional=[("n2", "limited")]), history)
    assert verdict.valid is True
    assert verdict.counts["not_delivered"] == 1 and verdict.counts["judged"] == 1
    assert "effectively_once" in verdict.details["not_delivered_note"]


def test_nothing_to_judge_is_unknown_never_a_pass():
    history = History()
    _inject(history, 100.0, 100.0, "n1")
    _push(history, 101.0, "n1")
    verdict = _check(_expect(), history)  # the oracle expected nothing
    assert verdict.valid is None and "expected no push" in verdict.details["unknown"]
    history = History()
    _inject(history, 100.0, 100.0, "n1")
    verdict = _check(_expect(("n1", "t1")), history)  # expected, never arrived
    assert verdict.valid is None and verdict.counts["not_delivered"] == 1
    assert verdict.status == "unknown"


def test_a_notification_posted_again_is_measured_from_the_post_before_its_delivery():
    """A probe posted again with its id (a device registered again in between): the push after
    the second post is measured from it; one that came of the first post, from the first."""
    history = History()
    _inject(history, 100.0, 100.0, "n1")
    _push(history, 110.0, "n1", "t1")
    _inject(history, 300.0, 300.5, "n1")
    _push(history, 310.0, "n1", "t2")
    verdict = _check(_expect(("n1", "t1"), ("n1", "t2")), history)
    assert verdict.valid is True and verdict.counts["worst_latency_ms"] == 10_000
    # Late for both posts: measured from the later one sent before it.
    _push(history, 400.0, "n1", "t3")
    verdict = _check(_expect(("n1", "t1"), ("n1", "t2"), ("n1", "t3")), history)
    assert verdict.counts["late"] == 1
    assert verdict.details["examples"][0]["accepted"] == 300.5


def test_the_bound_is_the_systems_stated_policy():
    history = History()
    _inject(history, 100.0, 100.0, "n1")
    _push(history, 180.0, "n1")
    evidence = Evidence(
        Population(0, 0.0, PopulationSpec()), _expect(("n1", "t1")), history.frame()
    )
    assert registry.run_probe("delivery_latency", {}, evidence).valid is False
    stated = Evidence(
        Population(0, 0.0, PopulationSpec()),
        _expect(("n1", "t1")),
        history.frame(),
        SystemPolicy.from_mapping({"delivery_bound_s": 90}),
    )
    verdict = registry.run_probe("delivery_latency", {}, stated)
    assert verdict.valid is True and verdict.details["bound_s"] == 90.0
    # A scenario may state its own bound over the system's.
    assert registry.run_probe("delivery_latency", {"bound_s": 60}, stated).valid is False
    assert registry.get("delivery_latency").needs == frozenset()
    with pytest.raises(ValueError, match="delivery_bound_s"):
        SystemPolicy.from_mapping({"delivery_bound_s": 0})
    assert SystemPolicy().to_dict()["delivery_bound_s"] == 60.0


def _reference(expected, rows, bound_s, recovery_s):
    """Row by row: what the checker counts, from its definition."""
    posts, firsts, windows, opened = {}, {}, [], {}
    end = max(r["time"] for r in rows)
    for r in rows:
        if r["kind"] == "inject":
            answer = r["end"] if r["end"] == r["end"] else r["time"]
            posts.setdefault((r["tenant_id"], r["notification_id"]), []).append((r["time"], answer))
        elif r["kind"] == "provider" and r["status"] == 200:
            key = (r["tenant_id"], r["notification_id"], r["token"])
            firsts[key] = min(firsts.get(key, r["time"]), r["time"])
        elif r["kind"] == "fault":
            detail = json.loads(r["detail"])
            if detail["phase"] == "start":
                opened[detail["window"]] = r["time"]
            else:
                windows.append((opened.pop(detail["window"]), r["time"]))
    windows += [(start, end) for start in opened.values()]
    late = judged = 0
    for tenant, nid, token, _, until in expected:
        first = firsts.get((tenant, nid, token))
        if first is None:
            continue
        sent = sorted(posts[(tenant, nid)])
        before = [p for p in sent if p[0] <= first]
        accepted = min(a for s, a in sent if s == (before or sent)[-1 if before else 0][0])
        start = max(accepted, until if until is not None else -1e18)
        allowed = start + bound_s
        for w_start, w_stop in sorted(windows):
            if w_start <= allowed and w_stop >= start:
                allowed = max(allowed, w_stop + recovery_s)
        judged += 1
        late += first > allowed
    return {"judged": judged, "late": late}


@pytest.mark.parametrize("seed", range(6))
def test_counts_equal_a_row_by_row_reference(seed):
    rng = random.Random(seed)
    history, expected = History(), []
    for i in range(40):
        nid = f"n{i}"
        for _ in range(rng.choice([1, 1, 1, 2])):  # now and then posted again
            sent = rng.uniform(0, 300)
            _inject(history, sent, sent + rng.choice([0.2, float("nan")]), nid)
        for token in ("t1", "t2", "t3"):
            until = rng.choice([None, None, rng.uniform(0, 400)])
            expected.append(("acme", nid, token, "u1", until))
            for _ in range(rng.choice([0, 1, 1, 2])):
                _push(history, rng.uniform(0, 500), nid, token, rng.choice([200, 200, 429]))
    for w in range(rng.randint(0, 3)):
        start = rng.uniform(0, 400)
        _fault(history, start, start + rng.uniform(1, 60), window=f"w{w}")
    frame = history.frame()
    rows = [
        {k: (None if v is pd.NA else v) for k, v in r.items()} for r in frame.to_dict("records")
    ]
    expectation = Expectation(pd.DataFrame(expected, columns=EXPECTED_COLUMNS))
    verdict = delivery_latency.check(expectation, frame, bound_s=60.0, recovery_s=30.0)
    reference = _reference(expected, rows, 60.0, 30.0)
    assert {k: verdict.counts[k] for k in reference} == reference
    assert 0 < reference["late"] < reference["judged"]  # each seed holds both
