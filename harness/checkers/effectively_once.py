"""Effectively-once delivery: every expected (notification, device) delivered exactly once.

Deliveries are the provider ledger rows answered 200; the expectation comes from the oracle.
A delivery the oracle did not expect (no consent, still in quiet hours, a dead token, another
tenant's device, an id never injected) counts as unexpected.
"""

from __future__ import annotations

import pandas as pd

from harness.checkers.verdict import Verdict
from harness.oracle import Expectation

KEY = ["tenant_id", "notification_id", "token"]


def check(expectation: Expectation, history: pd.DataFrame) -> Verdict:
    provider = history[(history["kind"] == "provider") & (history["status"] == 200)]
    delivered_counts = provider.groupby(KEY, dropna=False).size().rename("n").reset_index()
    expected = expectation.deliveries[KEY].drop_duplicates()
    merged = expected.merge(delivered_counts, on=KEY, how="outer", indicator=True)
    both = merged[merged["_merge"] == "both"]
    lost = int((merged["_merge"] == "left_only").sum())
    unexpected_rows = merged[merged["_merge"] == "right_only"]
    delivered = int(len(both))
    duplicated = int((both["n"] - 1).sum()) + int((unexpected_rows["n"] - 1).clip(lower=0).sum())
    unexpected = int(unexpected_rows["n"].sum())
    counts = {
        "expected": int(len(expected)),
        "delivered": delivered,
        "duplicated": duplicated,
        "lost": lost,
        "unexpected": unexpected,
    }
    suppressed = {f"suppressed_{k}": int(v) for k, v in sorted(expectation.suppressed.items())}
    examples = {
        "lost_examples": merged[merged["_merge"] == "left_only"][KEY].head(5).to_dict("records"),
        "duplicate_examples": both[both["n"] > 1][KEY + ["n"]].head(5).to_dict("records"),
        "unexpected_examples": unexpected_rows[KEY].head(5).to_dict("records"),
    }
    valid = duplicated == 0 and lost == 0 and unexpected == 0
    return Verdict("effectively_once", valid, {**counts, **suppressed}, examples)
