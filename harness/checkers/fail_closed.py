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


@checker(
    "fail_closed",
    summary="no delivery without a dedup decision while the dedup store is out",
    tolerances={"grace_s": 0.5},
)
def probe(evidence: Evidence, tolerance: Mapping[str, Any]) -> Verdict:
    return check(
        evidence.history,
        grace_s=float(tolerance["grace_s"]),
        fallback=evidence.policy.dedup_fallback,
    )
