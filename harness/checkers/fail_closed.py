"""Fail-closed dedup: no provider delivery without a dedup decision while the store is out.

With the DynamoDB fallback off, a delivery inside a dedup-store outage window (after a short
grace for sends whose decision was taken just before the outage began) is a violation. With the
fallback on, deliveries during the outage are allowed (the fallback decided them), and what must
hold is that none of them is duplicated across the outage and the recovery.
"""

from __future__ import annotations

import pandas as pd

from harness.checkers.verdict import Verdict
from harness.checkers.windows import deliveries, fault_windows

OUTAGES = ("dedup-outage", "dedup-blackhole", "dedup-crash")
KEY = ["tenant_id", "notification_id", "token"]


def check(history: pd.DataFrame, grace_s: float = 0.5, fallback: bool = False) -> Verdict:
    windows = fault_windows(history, OUTAGES)
    delivered = deliveries(history)
    inside = pd.Series(False, index=delivered.index)
    for window in windows:
        inside |= (delivered["time"] > window.start + grace_s) & (delivered["time"] < window.stop)
    during = delivered[inside]
    keys_during = set(during[KEY].itertuples(index=False, name=None))
    per_key = delivered.groupby(KEY, dropna=False).size()
    duplicated_across = int(
        sum(n - 1 for key, n in per_key.items() if n > 1 and tuple(key) in keys_during)
    )
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
