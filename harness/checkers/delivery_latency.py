"""Delivery latency: every push the oracle expects reaches its device within the stated bound.

Seed 000 sizes the fan-out for a 60 s SLA; the system states its bound as policy
``delivery_bound_s`` (default 60). For every required delivery (``Expectation.deliveries``:
a rate-limited or otherwise optional one is not judged, see ``limited.py``), the latency is the
time from the event's acceptance (the ``inject`` row's answered time, ``end``) to the first
provider request that delivered it (provider ledger rows: a 200, or accepted then error). It
must arrive by ``allowed_by``:

* measured from the acceptance, or from the end of the recipient's quiet window when the oracle
  deferred it there (``quiet_until``), or from the operator's redrive when its job waited in a
  dead-letter queue (a ``redriven`` row for its notification and recipient, before it arrived:
  seed 004 parks a job after 3 receives, and the time it waits there is the operator's, not the
  system's; how it got there is ``dlq_accountability``'s), whichever is latest, plus the bound;
* a delivery whose allowance overlaps a stated fault window (history ``fault`` rows) may instead
  arrive up to ``recovery_s`` after that fault ended: ``max(start + bound, fault end +
  recovery_s)``, chained when the extended allowance meets the next fault.

A notification posted more than once with the same id (an idempotent retry, a probe posted
again) is measured from the latest post sent before its first delivery: the most generous one.

Counts: ``expected``, ``judged`` (delivered, so measured), ``late``, ``deferred`` (judged from
a quiet window's end), ``redriven`` (judged from a DLQ redrive), ``extended_by_fault`` (judged with a fault's allowance),
``not_delivered``, ``no_acceptance`` (delivered, but no post of it was accepted: not judged),
and the judged latencies' ``worst_latency_ms``, ``p50_latency_ms``, ``p99_latency_ms``. A
delivery that never arrived is ``effectively_once``'s business (``lost``): counted here, never
failed on. Nothing judged is *unknown*, never a pass. The first few late deliveries are the
``examples`` (tenant, notification, token, accepted, measured_from, delivered, allowed_by).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from harness.checkers.evidence import Evidence
from harness.checkers.keys import joint_keys, member, sorted_unique
from harness.checkers.registry import checker
from harness.checkers.store import HistoryStore
from harness.checkers.verdict import Verdict
from harness.checkers.windows import Window, delivery_rows, fault_windows
from harness.model.oracle import Expectation

NAME = "delivery_latency"
KEY = ["tenant_id", "notification_id", "token"]
PAIR = ["tenant_id", "notification_id"]
# Seed 000: "materialised within a t = 60 s SLA".
DEFAULT_BOUND_S = 60.0
DEFAULT_RECOVERY_S = 30.0
EXAMPLES = 5
NOT_DELIVERED = (
    "deliveries that never arrived are effectively_once's (lost): counted, not judged here"
)


def allowance(
    start: np.ndarray, bound_s: float, recovery_s: float, windows: list[Window]
) -> tuple[np.ndarray, np.ndarray]:
    """Per delivery, the instant it must arrive by, and whether a fault extended it: ``start``
    plus the bound, or ``recovery_s`` past the end of a fault window that overlaps the
    allowance so far (windows in order of their start, so one extension can meet the next).
    :func:`check_store` applies the same rule, one UPDATE per window."""
    allowed = start + bound_s
    base = allowed.copy()
    for window in sorted(windows, key=lambda w: w.start):
        overlaps = (window.start <= allowed) & (window.stop >= start)
        allowed = np.where(overlaps, np.maximum(allowed, window.stop + recovery_s), allowed)
    return allowed, allowed > base


def _posts(pair: np.ndarray, sent: np.ndarray, answered: np.ndarray) -> pd.DataFrame:
    """One row per (pair, instant sent): its acceptance (the answer, else the send), the
    earliest when one instant holds several; sorted by the send."""
    accepted = np.where(np.isnan(answered), sent, answered)
    posts = pd.DataFrame({"pair": pair, "sent": sent, "accepted": accepted})
    posts = posts.groupby(["pair", "sent"], as_index=False)["accepted"].min()
    return posts.sort_values(["sent", "pair"], kind="stable").reset_index(drop=True)


def acceptance(pair: np.ndarray, first_time: np.ndarray, posts: pd.DataFrame) -> np.ndarray:
    """Per expected delivery: the acceptance of the latest post of its notification sent at or
    before its first delivery (the earliest post when none was, or it never arrived); NaN when
    the notification was never accepted."""
    out = np.full(len(pair), np.nan)
    if not len(posts) or not len(pair):
        return out
    earliest = posts.drop_duplicates("pair", keep="first").set_index("pair")["accepted"]
    out = earliest.reindex(pair).to_numpy(dtype=float, na_value=np.nan, copy=True)
    arrived = np.flatnonzero(~np.isnan(first_time))
    if len(arrived):
        left = pd.DataFrame({"at": first_time[arrived], "pair": pair[arrived], "i": arrived})
        left = left.sort_values("at", kind="stable")
        matched = pd.merge_asof(
            left, posts, left_on="at", right_on="sent", by="pair", direction="backward"
        )
        found = matched["accepted"].to_numpy(dtype=float, na_value=np.nan)
        rows = matched["i"].to_numpy()
        out[rows] = np.where(np.isnan(found), out[rows], found)
    return out


def redriven_at(
    expected: pd.DataFrame, history: pd.DataFrame, first_time: np.ndarray
) -> np.ndarray:
    """Per expected delivery: the latest redrive of its job (a ``redriven`` row of its tenant
    and notification, naming its recipient or no one) at or before its first arrival; NaN when
    none. A redrive after the push arrived is not what it waited for."""
    out = np.full(len(expected), np.nan)
    moved = history.loc[
        history["kind"] == "redriven", ["tenant_id", "notification_id", "user_id", "time"]
    ]
    if not len(moved) or not len(expected):
        return out
    left = expected[["tenant_id", "notification_id", "user_id"]].astype(object).copy()
    left["i"] = np.arange(len(expected))
    left["first"] = first_time
    moved = moved.astype({"tenant_id": object, "notification_id": object, "user_id": object})
    named = moved[moved["user_id"].notna()]
    anyone = moved[moved["user_id"].isna()].drop(columns="user_id")
    found = pd.concat(
        [
            left.merge(named, on=["tenant_id", "notification_id", "user_id"]),
            left.merge(anyone, on=["tenant_id", "notification_id"]),
        ]
    )
    found = found[found["time"].astype(float) <= found["first"]]
    latest = found.groupby("i")["time"].max()
    out[latest.index.to_numpy(dtype=np.int64)] = latest.to_numpy(dtype=float)
    return out


def _figures(latency: np.ndarray) -> dict[str, int]:
    """Worst, median and 99th percentile of the judged latencies, in whole milliseconds (0
    when nothing was judged: the verdict is then unknown)."""
    if not len(latency):
        return {"worst_latency_ms": 0, "p50_latency_ms": 0, "p99_latency_ms": 0}
    p50, p99 = np.percentile(latency, [50, 99])
    return {
        "worst_latency_ms": round(float(latency.max()) * 1000),
        "p50_latency_ms": round(float(p50) * 1000),
        "p99_latency_ms": round(float(p99) * 1000),
    }


def _verdict(
    counts: dict[str, int],
    latency: np.ndarray,
    examples: list[dict[str, Any]],
    bound_s: float,
    recovery_s: float,
    windows: list[Window],
) -> Verdict:
    counts = {**counts, **_figures(latency)}
    details: dict[str, Any] = {
        "bound_s": bound_s,
        "recovery_s": recovery_s,
        "fault_windows": len(windows),
        "not_delivered_note": NOT_DELIVERED,
        "examples": examples,
    }
    if counts["expected"] == 0:
        return Verdict(NAME, None, counts, {**details, "unknown": "the oracle expected no push"})
    if counts["judged"] == 0:
        why = "no expected push arrived: nothing to measure (effectively_once counts them lost)"
        return Verdict(NAME, None, counts, {**details, "unknown": why})
    return Verdict(NAME, counts["late"] == 0, counts, details)


def _example(
    record: Mapping[str, Any], accepted: float, start: float, delivered: float, allowed: float
) -> dict[str, Any]:
    return {
        **record,
        "accepted": round(float(accepted), 3),
        "measured_from": round(float(start), 3),
        "delivered": round(float(delivered), 3),
        "allowed_by": round(float(allowed), 3),
        "latency_s": round(float(delivered - start), 3),
    }


def check(
    expectation: Expectation,
    history: pd.DataFrame,
    bound_s: float = DEFAULT_BOUND_S,
    recovery_s: float = DEFAULT_RECOVERY_S,
) -> Verdict:
    """The verdict over a history in memory: the required deliveries of ``expectation``."""
    expected = expectation.deliveries
    times = history["time"].to_numpy(dtype=float, na_value=np.nan)
    rows = delivery_rows(history)
    expected_keys, history_keys = joint_keys([expected, history], KEY)
    related = rows[member(history_keys[rows], sorted_unique(expected_keys))]
    first = pd.Series(times[related]).groupby(history_keys[related]).min()
    found = first.index.get_indexer(expected_keys)
    first_time = np.append(first.to_numpy(dtype=float), np.nan)[found]
    expected_pairs, history_pairs = joint_keys([expected, history], PAIR)
    injects = np.flatnonzero((history["kind"] == "inject").to_numpy(dtype=bool, na_value=False))
    answered = history["end"].to_numpy(dtype=float, na_value=np.nan)[injects]
    posts = _posts(history_pairs[injects], times[injects], answered)
    accepted = acceptance(expected_pairs, first_time, posts)
    quiet_until = expected["quiet_until"].to_numpy(dtype=float, na_value=np.nan)
    until = np.where(np.isnan(quiet_until), -np.inf, quiet_until)
    windows = fault_windows(history)
    redrive = redriven_at(expected, history, first_time)
    waited = np.where(np.isnan(redrive), -np.inf, redrive)
    start = np.maximum(np.maximum(accepted, until), waited)  # NaN when never accepted
    allowed, extended = allowance(start, bound_s, recovery_s, windows)
    arrived = ~np.isnan(first_time)
    judged = arrived & ~np.isnan(accepted)
    late = judged & (first_time > allowed)
    counts = {
        "expected": len(expected),
        "judged": int(judged.sum()),
        "late": int(late.sum()),
        "deferred": int((judged & (until > accepted)).sum()),
        "redriven": int((judged & (waited > np.maximum(accepted, until))).sum()),
        "extended_by_fault": int((judged & extended).sum()),
        "not_delivered": int((~arrived).sum()),
        "no_acceptance": int((arrived & np.isnan(accepted)).sum()),
    }
    late_at = np.flatnonzero(late)[:EXAMPLES]
    records = expected[KEY].iloc[late_at].astype(object).to_dict("records")
    examples = [
        _example(
            {k: (None if pd.isna(v) else v) for k, v in record.items()},
            accepted[i], start[i], first_time[i], allowed[i],
        )
        for record, i in zip(records, late_at, strict=True)
    ]  # fmt: skip
    latency = (first_time - start)[judged]
    return _verdict(counts, latency, examples, bound_s, recovery_s, windows)


def check_store(
    store: HistoryStore, bound_s: float = DEFAULT_BOUND_S, recovery_s: float = DEFAULT_RECOVERY_S
) -> Verdict:
    """:func:`check` over a history on disk: per expected delivery its first arrival, its
    acceptance (an as-of join on its notification's posts) and its allowance, in DuckDB; only
    the judged latencies come out, for the percentiles."""
    store.require_decided()
    faults = store.rows(["fault"], ["kind", "time", "detail"])
    windows = fault_windows(faults, end=store.end_time)
    store.run(
        """CREATE OR REPLACE TABLE latency_posts AS
        SELECT t.code AS tenant, n.code AS nid, o.time AS sent,
               min(coalesce(o."end", o.time)) AS accepted
        FROM other o
        JOIN tenants t ON t.value IS NOT DISTINCT FROM o.tenant_id
        JOIN nids n ON n.value IS NOT DISTINCT FROM o.notification_id
        WHERE o.kind = 'inject' AND o.time IS NOT NULL
        GROUP BY t.code, n.code, o.time"""
    )
    bound = float(bound_s)
    store.run(
        f"""CREATE OR REPLACE TABLE latency AS
        WITH d AS (
            SELECT e.pos, e.key, e.tenant, e.nid, e.user_id, e.quiet_until, f.first_time
            FROM exp e LEFT JOIN {store.delivered_keys()} f ON f.key = e.key),
        moved AS (
            SELECT t.code AS tenant, n.code AS nid, o.user_id, o.time
            FROM other o
            JOIN tenants t ON t.value IS NOT DISTINCT FROM o.tenant_id
            JOIN nids n ON n.value IS NOT DISTINCT FROM o.notification_id
            WHERE o.kind = 'redriven' AND o.time IS NOT NULL),
        r AS (
            SELECT d.pos, max(m.time) AS redriven_at
            FROM d JOIN moved m
                ON m.tenant = d.tenant AND m.nid = d.nid
                AND (m.user_id IS NULL OR m.user_id = d.user_id) AND m.time <= d.first_time
            GROUP BY d.pos),
        earliest AS (
            SELECT tenant, nid, arg_min(accepted, sent) AS accepted
            FROM latency_posts GROUP BY tenant, nid),
        a AS (
            SELECT d.pos, d.key, d.quiet_until, d.first_time, r.redriven_at,
                   coalesce(p.accepted, f.accepted) AS accepted
            FROM d
            LEFT JOIN r ON r.pos = d.pos
            ASOF LEFT JOIN latency_posts p
                ON p.tenant = d.tenant AND p.nid = d.nid AND d.first_time >= p.sent
            LEFT JOIN earliest f ON f.tenant = d.tenant AND f.nid = d.nid),
        s AS (
            SELECT *, CASE WHEN accepted IS NULL THEN NULL
                           ELSE greatest(accepted, coalesce(quiet_until, '-inf'::DOUBLE),
                                         coalesce(redriven_at, '-inf'::DOUBLE)) END
                      AS start
            FROM a)
        SELECT *, start + {bound} AS allowed, start + {bound} AS base FROM s"""
    )
    for window in sorted(windows, key=lambda w: w.start):
        store.run(
            "UPDATE latency SET allowed = greatest(allowed, ?) WHERE ? <= allowed AND ? >= start",
            [window.stop + float(recovery_s), window.start, window.stop],
        )
    judged = "first_time IS NOT NULL AND accepted IS NOT NULL"
    late = f"{judged} AND first_time > allowed"
    expected, judged_n, late_n, deferred, redriven, extended, missing, no_acceptance = store.one(
        f"""SELECT count(*), count(*) FILTER ({judged}), count(*) FILTER ({late}),
                   count(*) FILTER ({judged} AND quiet_until > accepted),
                   count(*) FILTER ({judged} AND redriven_at >
                                    greatest(accepted, coalesce(quiet_until, '-inf'::DOUBLE))),
                   count(*) FILTER ({judged} AND allowed > base),
                   count(*) FILTER (first_time IS NULL),
                   count(*) FILTER (first_time IS NOT NULL AND accepted IS NULL)
            FROM latency"""
    )
    counts = {
        "expected": int(expected),
        "judged": int(judged_n),
        "late": int(late_n),
        "deferred": int(deferred),
        "redriven": int(redriven),
        "extended_by_fault": int(extended),
        "not_delivered": int(missing),
        "no_acceptance": int(no_acceptance),
    }
    first = store.sql(
        f"""SELECT key, accepted, start, first_time, allowed FROM latency WHERE {late}
        ORDER BY pos LIMIT {EXAMPLES}"""
    ).fetchall()
    examples = [
        _example(record, *figures)
        for record, (_, *figures) in zip(
            store.decode_keys([row[0] for row in first]), first, strict=True
        )
    ]
    found = store.sql(f"SELECT first_time - start AS latency FROM latency WHERE {judged}")
    latency = np.asarray(found.fetchnumpy()["latency"], dtype=float)
    return _verdict(counts, latency, examples, bound_s, recovery_s, windows)


@checker(
    NAME,
    summary="every expected push reaches its device within the stated bound (seed 000: 60 s)",
    tolerances={"bound_s": None, "recovery_s": DEFAULT_RECOVERY_S},
    out_of_core=True,
)
def probe(evidence: Evidence, tolerance: Mapping[str, Any]) -> Verdict:
    """``bound_s`` None: the system's stated ``delivery_bound_s``."""
    bound = tolerance["bound_s"]
    bound_s = float(evidence.policy.delivery_bound_s if bound is None else bound)
    recovery_s = float(tolerance["recovery_s"])
    if evidence.store is not None:
        return check_store(evidence.store, bound_s, recovery_s)
    return check(evidence.expectation, evidence.history, bound_s, recovery_s)
