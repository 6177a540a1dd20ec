"""Fail-closed dedup: no provider delivery without a dedup decision while the store is out.

With the DynamoDB fallback off, a delivery inside a dedup-store outage window (after a short
grace for sends whose decision was taken just before the outage began) is a violation. With the
fallback on, deliveries during the outage are allowed (the fallback decided them), and what must
hold is that none of them is duplicated across the outage and the recovery.
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
from harness.checkers.windows import delivery_rows, fault_windows

OUTAGES = ("dedup-outage", "dedup-blackhole", "dedup-crash")
KEY = ["tenant_id", "notification_id", "token"]


def check(history: pd.DataFrame, grace_s: float = 0.5, fallback: bool = False) -> Verdict:
    windows = fault_windows(history, OUTAGES)
    rows = delivery_rows(history)
    times = history["time"].to_numpy(dtype=float, na_value=np.nan)[rows]
    inside = np.zeros(len(rows), dtype=bool)
    for window in windows:
        inside |= (times > window.start + grace_s) & (times < window.stop)
    during = history[KEY + ["time"]].iloc[rows[inside]]
    (history_keys,) = joint_keys([history], KEY)
    delivered_keys = history_keys[rows]
    keys_during = sorted_unique(delivered_keys[inside])
    # Every delivery of a key delivered during the outage, less the first of each such key.
    duplicated_across = int(member(delivered_keys, keys_during).sum()) - len(keys_during)
    counts = {
        "outage_windows": len(windows),
        "outage_seconds": round(sum(w.stop - w.start for w in windows)),
        "deliveries_during_outage": int(len(during)),
        "duplicated_across_outage": duplicated_across,
    }
    valid = duplicated_across == 0 if fallback else counts["deliveries_during_outage"] == 0
    details = {
        "grace_s": grace_s,
        "fallback": fallback,
        "examples": during[KEY + ["time"]].head(5).to_dict("records"),
    }
    return Verdict("fail_closed", valid and bool(windows), counts, details)


def check_store(store: HistoryStore, grace_s: float = 0.5, fallback: bool = False) -> Verdict:
    """:func:`check` over a history on disk."""
    store.require_decided()
    faults = store.rows(["fault"], ["kind", "time", "detail"])
    windows = fault_windows(faults, OUTAGES, end=store.end_time)
    store.register(
        "outage_windows",
        pd.DataFrame(
            {"start": [w.start + grace_s for w in windows], "stop": [w.stop for w in windows]},
            dtype=float,
        ),
    )
    store.run(
        """CREATE OR REPLACE TABLE during_outage AS
        SELECT p.pos, p.key, p.time FROM prov p
        WHERE p.got AND EXISTS (
            SELECT 1 FROM outage_windows w WHERE p.time > w.start AND p.time < w.stop)"""
    )
    (during,) = store.one("SELECT count(*) FROM during_outage")
    (duplicated_across,) = store.one(
        """SELECT count(*) - (SELECT count(DISTINCT key) FROM during_outage) FROM prov
        WHERE got AND key IN (SELECT key FROM during_outage)"""
    )
    counts = {
        "outage_windows": len(windows),
        "outage_seconds": round(sum(w.stop - w.start for w in windows)),
        "deliveries_during_outage": int(during),
        "duplicated_across_outage": int(duplicated_across),
    }
    valid = duplicated_across == 0 if fallback else counts["deliveries_during_outage"] == 0
    first = store.sql("SELECT key, time FROM during_outage ORDER BY pos LIMIT 5").fetchall()
    examples = [
        {**record, "time": time}
        for record, (_, time) in zip(store.decode_keys([k for k, _ in first]), first, strict=True)
    ]
    details = {"grace_s": grace_s, "fallback": fallback, "examples": examples}
    return Verdict("fail_closed", valid and bool(windows), counts, details)


@checker(
    "fail_closed",
    summary="no delivery without a dedup decision while the dedup store is out",
    tolerances={"grace_s": 0.5},
    out_of_core=True,
)
def probe(evidence: Evidence, tolerance: Mapping[str, Any]) -> Verdict:
    if evidence.store is not None:
        return check_store(
            evidence.store,
            grace_s=float(tolerance["grace_s"]),
            fallback=evidence.policy.dedup_fallback,
        )
    return check(
        evidence.history,
        grace_s=float(tolerance["grace_s"]),
        fallback=evidence.policy.dedup_fallback,
    )
