"""Effectively-once delivery: every expected (notification, device) delivered exactly once.

Deliveries are the provider ledger rows the device got (a 200, or "accepted then 5xx"); the
expectation comes from the oracle. A delivery the oracle did not expect (no consent, still in
quiet hours, a dead token, another tenant's device, an id never injected) counts as unexpected.

``duplicated`` counts every delivery beyond the first. Of those, ``collapsed`` carried the same
collapse id as the first (APNs ``apns-collapse-id``, FCM ``collapse_key``): the device shows
them as one notification. ``visible_duplicates`` = duplicated - collapsed is what a user sees,
and what the verdict gates on by default; a scenario may also gate on the raw count
(``max_duplicated``), and both figures are always reported so the raw rate stays honest.
"""

from __future__ import annotations

import pandas as pd

from harness.checkers.verdict import Verdict
from harness.checkers.windows import deliveries
from harness.oracle import Expectation

KEY = ["tenant_id", "notification_id", "token"]


def check(
    expectation: Expectation,
    history: pd.DataFrame,
    max_visible_duplicates: int = 0,
    max_lost: int = 0,
    max_duplicated: int | None = None,
) -> Verdict:
    """Tolerances default to none: a scenario may accept a residual (e.g. a volatile dedup
    store losing its keys in a crash) and still see the figure reported."""
    provider = deliveries(history)
    grouped = provider.groupby(KEY, dropna=False)
    delivered_counts = grouped.size().rename("n").reset_index()
    collapsed_counts = (
        grouped["collapse_id"]
        .agg(lambda ids: int(len(ids) - 1) if ids.notna().all() and ids.nunique() == 1 else 0)
        .rename("collapsed")
        .reset_index()
    )
    delivered_counts = delivered_counts.merge(collapsed_counts, on=KEY, how="left")
    expected = expectation.deliveries[KEY].drop_duplicates()
    merged = expected.merge(delivered_counts, on=KEY, how="outer", indicator=True)
    both = merged[merged["_merge"] == "both"]
    lost = int((merged["_merge"] == "left_only").sum())
    unexpected_rows = merged[merged["_merge"] == "right_only"]
    delivered = int(len(both))
    duplicated = int((both["n"] - 1).sum()) + int((unexpected_rows["n"] - 1).clip(lower=0).sum())
    unexpected = int(unexpected_rows["n"].sum())
    collapsed = int(both["collapsed"].sum()) if len(both) else 0
    visible_duplicates = duplicated - collapsed
    counts = {
        "expected": int(len(expected)),
        "delivered": delivered,
        "duplicated": duplicated,
        "collapsed": collapsed,
        "visible_duplicates": visible_duplicates,
        "lost": lost,
        "unexpected": unexpected,
    }
    duplicate_rate = duplicated / delivered * 1_000_000 if delivered else 0.0
    suppressed = {f"suppressed_{k}": int(v) for k, v in sorted(expectation.suppressed.items())}
    examples = {
        "duplicates_per_million": round(duplicate_rate, 1),
        "tolerance": {
            "max_visible_duplicates": max_visible_duplicates,
            "max_lost": max_lost,
            "max_duplicated": max_duplicated,
        },
        "lost_examples": merged[merged["_merge"] == "left_only"][KEY].head(5).to_dict("records"),
        "duplicate_examples": both[both["n"] > 1][KEY + ["n"]].head(5).to_dict("records"),
        "unexpected_examples": unexpected_rows[KEY].head(5).to_dict("records"),
    }
    valid = (
        visible_duplicates <= max_visible_duplicates
        and lost <= max_lost
        and unexpected == 0
        and (max_duplicated is None or duplicated <= max_duplicated)
    )
    return Verdict("effectively_once", valid, {**counts, **suppressed}, examples)
