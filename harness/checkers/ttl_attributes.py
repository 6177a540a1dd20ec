"""TTL attributes (seed 000): inbox rows expire 90 days after their notification was accepted,
the fallback dedup store's items after the dedup window (30 days), each as a number of epoch
seconds (what DynamoDB's TTL reads; an item without it, or in milliseconds, lives forever).

The oracle is the harness's own clock: each notification it injected was accepted between the
instant its request left (``inject`` row ``time``) and the answer (``end``), so an inbox row of
that notification must expire inside [time + ttl - slack, end + ttl + slack]. An item the
harness cannot tie to a notification of its own (the fallback store's, keyed by dedup key) was
written between the first event sent and the end of the run. The
expiries come from ``ttl_sample`` rows (:mod:`harness.run.ttl_items`). Counts per purpose:
``<purpose>_items``, ``<purpose>_by_notification`` (those judged against their own
notification's acceptance), ``<purpose>_missing_attribute`` (none, or not a number),
``<purpose>_early`` and ``<purpose>_late`` (outside the bounds; milliseconds are ``late``).
A system whose clock the run moved writes its expiries on that clock: they are judged less the
offset (:mod:`harness.contract.clock`).

Right attributes expire nothing unless TTL is enabled on the table, on that attribute: the row
also holds the table's DescribeTimeToLive answer, and ``ttl_not_enabled`` counts the tables
whose TTL is off (DISABLED, DISABLING) or on another attribute. ENABLING counts as on: it is
AWS's state for up to an hour after UpdateTimeToLive, so a system deployed just before the run
is not wrong. A status that could not be read is ``ttl_status_unread`` (the verdict is then
unknown, never a pass, unless something else failed); an endpoint without DescribeTimeToLive
gets ``ttl_not_enabled`` switched off, said in ``ttl_status``, and the attributes are still
judged.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pandas as pd

from harness.checkers.evidence import Evidence
from harness.checkers.registry import checker, unknown_verdict
from harness.checkers.verdict import Verdict
from harness.contract.system import TTL_PURPOSES

EXAMPLES = 5
TTL_ON = ("ENABLED", "ENABLING")


def ttl_not_enabled(status: str | None, attribute: str | None, expected: str) -> bool:
    """Whether DynamoDB, as it describes the table's TTL, would never delete its items by the
    ``expected`` attribute (a status that was read: ``status`` not None)."""
    return status not in TTL_ON or attribute != expected


def ttl_status_counts(details: list[dict[str, Any]]) -> tuple[dict[str, int], dict[str, Any]]:
    """``ttl_not_enabled`` and ``ttl_status_unread`` over the rows' TTL statuses, and what
    each table said (or why the count is switched off)."""
    said = {
        d["table"]: {"status": d.get("ttl_status"), "attribute": d.get("ttl_attribute")}
        for d in details
    }
    unsupported = [d["table"] for d in details if d.get("ttl_unsupported")]
    if unsupported:
        why = (
            "switched off: the DynamoDB endpoint does not implement DescribeTimeToLive "
            f"({', '.join(unsupported)}): whether TTL is enabled was not judged"
        )
        return {}, {"ttl_status": why}
    counts = {"ttl_not_enabled": 0, "ttl_status_unread": 0}
    for detail in details:
        status = detail.get("ttl_status")
        if status is None:
            counts["ttl_status_unread"] += 1
            said[detail["table"]]["error"] = detail.get("ttl_error") or "not read"
        elif ttl_not_enabled(status, detail.get("ttl_attribute"), str(detail["attribute"])):
            counts["ttl_not_enabled"] += 1
    return counts, {"ttl_status": said}


def acceptance_bounds(history: pd.DataFrame, until: float) -> dict[str, tuple[float, float]]:
    """Per notification id the harness injected: (earliest send, latest answer) of its
    requests; ``until`` stands for an answer that never came."""
    rows = history[history["kind"].isin(["inject", "inject_info"])]
    if rows.empty:
        return {}
    ends = rows["end"].astype("float64").fillna(until)
    frame = pd.DataFrame(
        {"nid": rows["notification_id"].astype(str), "time": rows["time"], "end": ends}
    )
    grouped = frame.groupby("nid").agg(time=("time", "min"), end=("end", "max"))
    return {str(n): (float(r.time), float(r.end)) for n, r in grouped.iterrows()}


def check(
    history: pd.DataFrame, ttls: Mapping[str, float], slack_s: float, clock_offset_s: float = 0.0
) -> Verdict:
    """``clock_offset_s``: how far the system's clock ran ahead of real time; it writes its
    expiries on that clock, so they are read back in real time before they are judged."""
    samples = history[history["kind"] == "ttl_sample"]
    if samples.empty:
        return unknown_verdict("ttl_attributes", "the run read no table's TTL attributes")
    run_end = float(samples["time"].max())
    bounds = acceptance_bounds(history, run_end)
    # Nothing is written for a notification before the first one was sent.
    run_start = min((low for low, _ in bounds.values()), default=float(history["time"].min()))
    counts: dict[str, int] = {"tables": len(samples)}
    for purpose in TTL_PURPOSES:
        for what in ("items", "by_notification", "missing_attribute", "early", "late"):
            counts[f"{purpose}_{what}"] = 0
    examples: list[dict[str, Any]] = []
    details = [json.loads(str(d)) for d in samples["detail"]]
    status_counts, status_said = ttl_status_counts(details)
    counts.update(status_counts)
    for detail in details:
        purpose = detail["purpose"]
        ttl = float(ttls[purpose])
        counts[f"{purpose}_items"] += int(detail["items"])
        counts[f"{purpose}_missing_attribute"] += int(detail["missing"])
        if detail["missing"]:
            examples.append({"table": detail["table"], "missing_attribute": detail["missing"]})
        for ident, expiries in detail["expiries"].items():
            low, high = bounds.get(ident, (run_start, run_end))
            if ident in bounds:
                counts[f"{purpose}_by_notification"] += sum(expiries.values())
            for expiry, n in expiries.items():
                at = int(expiry) - clock_offset_s
                if at < low + ttl - slack_s:
                    counts[f"{purpose}_early"] += n
                elif at > high + ttl + slack_s:
                    counts[f"{purpose}_late"] += n
                else:
                    continue
                if len(examples) < EXAMPLES:
                    examples.append({
                        "table": detail["table"], "notification_id": ident or None,
                        "expires_at": int(expiry), "expected_from": round(low + ttl, 3),
                        "expected_until": round(high + ttl, 3), "items": n,
                    })  # fmt: skip
    wrong = counts.get("ttl_not_enabled", 0) + sum(
        counts[f"{p}_{w}"] for p in TTL_PURPOSES for w in ("missing_attribute", "early", "late")
    )
    details_out = {"ttl_seconds": dict(ttls), "slack_s": slack_s, "examples": examples}
    details_out.update(status_said)
    if wrong:
        return Verdict("ttl_attributes", False, counts, details_out)
    if not sum(counts[f"{p}_items"] for p in TTL_PURPOSES):
        return unknown_verdict("ttl_attributes", "the tables read held no item", counts=counts)
    if counts.get("ttl_status_unread"):
        return unknown_verdict(
            "ttl_attributes", "a table's TTL status could not be read", counts=counts, **status_said
        )
    return Verdict("ttl_attributes", True, counts, details_out)


@checker(
    "ttl_attributes",
    summary="inbox rows expire 90 days after acceptance, fallback dedup items after the window",
    tolerances={"slack_s": 5.0},
    needs=("ttl_tables",),
    reads=("ttl_sample", "inject", "inject_info"),
)
def probe(evidence: Evidence, tolerance: Mapping[str, Any]) -> Verdict:
    ttls = {
        "inbox": evidence.policy.inbox_ttl_seconds,
        "dedup_fallback": evidence.policy.dedup_window_seconds,
    }
    return check(evidence.history, ttls, float(tolerance["slack_s"]), evidence.clock_offset_s)
