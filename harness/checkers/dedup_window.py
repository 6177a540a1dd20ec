"""The dedup window (seed 000): a delivery's dedup key lives 30 days, longer than any provider's
retry horizon ("the classic bug is a dedup window shorter than the provider's own retry
timeout"), and no longer (the TTL bounds retention).

A run lasts minutes: a key set with an hour's TTL never expires inside it, so no duplicate
shows the bug. The runner reads every dedup key's remaining TTL once the system has settled
(:mod:`harness.run.dedup_keys`, one ``dedup_sample`` row). From the oracle: every notification
a user was due and got (an expected (notification, device) delivered) left at least one key
per (tenant, notification, user), however the system names its recipients (per user or per
device): that many keys must still have nearly the whole window to live, ``window - elapsed -
slack_s`` seconds (``elapsed``: since the run began, before any key was set). Users erased
during the run are left out (erasure deletes their keys).

Keys that existed before the run began (a long-lived store's earlier runs) are left out
(:func:`harness.run.dedup_keys.existing_keys`), or never read where the pattern names the run's
own tenants (``${tenant_prefix}``). With no expected delivery arrived the verdict is unknown.

Counts: ``keys`` read, ``required`` (the lower bound above), ``full_window`` (keys with the
window left), ``short_lived`` (keys with less, leases included), ``never_expire`` (no TTL: the
retention bound broken), ``missing_full_window`` (required - full_window, when positive).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pandas as pd
import pyarrow as pa

from harness.checkers.evidence import Evidence
from harness.checkers.registry import checker, unknown_verdict
from harness.checkers.store import HistoryStore
from harness.checkers.verdict import Verdict
from harness.checkers.windows import delivery_rows

KEY = ["tenant_id", "notification_id", "token"]


def _erased(evidence: Evidence) -> set[tuple[str, str]]:
    return set(evidence.timeline.erasures) if evidence.timeline is not None else set()


def required_keys(
    expected: pd.DataFrame, history: pd.DataFrame, erased: set[tuple[str, str]]
) -> int:
    """Distinct (tenant, notification, user) among expected deliveries that arrived."""
    rows = history.iloc[delivery_rows(history)]
    delivered = set(rows[KEY].astype(str).itertuples(index=False, name=None))
    due = {
        (str(t), str(n), str(u))
        for t, n, k, u in expected[[*KEY, "user_id"]].itertuples(index=False, name=None)
        if (str(t), str(n), str(k)) in delivered and (str(t), str(u)) not in erased
    }
    return len(due)


def required_keys_store(store: HistoryStore, erased: set[tuple[str, str]]) -> int:
    """:func:`required_keys` over the store."""
    store.register(
        "erased_users",
        pa.table(
            {
                "tenant_id": pa.array([t for t, _ in erased], pa.string()),
                "user_id": pa.array([u for _, u in erased], pa.string()),
            }
        ),
    )
    (count,) = store.one(
        f"""SELECT count(*) FROM (
            SELECT DISTINCT e.tenant, e.nid, e.user_id FROM exp e
            JOIN {store.delivered_keys()} d ON d.key = e.key
            JOIN tenants t ON t.code = e.tenant
            ANTI JOIN erased_users x ON x.tenant_id = t.value AND x.user_id = e.user_id)"""
    )
    return int(count)


def judge(samples: pd.DataFrame, required: int, window_s: float, slack_s: float) -> Verdict | None:
    """The verdict from the last ``dedup_sample`` row; None when the run recorded none."""
    if samples.empty:
        return None
    detail = json.loads(str(samples["detail"].iloc[-1]))
    ttls = {int(k): int(v) for k, v in detail["ttls"].items()}
    floor = window_s - float(detail["elapsed_s"]) - slack_s
    keys = sum(ttls.values())
    never = ttls.get(-1, 0)
    full = sum(n for ttl, n in ttls.items() if ttl >= floor)
    missing = max(0, required - full) if detail["complete"] else 0
    counts = {
        "keys": keys,
        "required": required,
        "full_window": full,
        "short_lived": keys - full - never,
        "never_expire": never,
        "missing_full_window": missing,
    }
    lived = [ttl for ttl in ttls if ttl >= 0]
    details = {
        "pattern": detail["pattern"],
        "complete": detail["complete"],
        # Keys a long-lived store kept from earlier runs: left out, never judged as this run's.
        "earlier_keys_left_out": detail.get("earlier_keys_left_out", 0),
        "window_s": window_s,
        "floor_s": round(floor, 3),
        "longest_ttl_s": max(lived) if lived else None,
    }
    return Verdict("dedup_window", never == 0 and missing == 0, counts, details)


@checker(
    "dedup_window",
    summary="every delivery's dedup key has the design's 30-day window left, none lives forever",
    tolerances={"slack_s": 120.0},
    needs=("dedup_store",),
    out_of_core=True,
)
def probe(evidence: Evidence, tolerance: Mapping[str, Any]) -> Verdict:
    erased = _erased(evidence)
    if evidence.store is not None:
        samples = evidence.store.rows(["dedup_sample"], ["kind", "detail"])
        required = required_keys_store(evidence.store, erased)
    else:
        history = evidence.history
        samples = history[history["kind"] == "dedup_sample"]
        required = required_keys(evidence.expectation.deliveries, history, erased)
    verdict = judge(
        samples, required, evidence.policy.dedup_window_seconds, float(tolerance["slack_s"])
    )
    if verdict is None:
        return unknown_verdict("dedup_window", "the run read no TTLs from the dedup store")
    if required == 0 and verdict.valid:
        # No delivery of this run to hold a key against: nothing proves the window.
        return unknown_verdict(
            "dedup_window",
            "no expected delivery arrived: no key of this run to judge",
            **verdict.counts,
        )
    return verdict
