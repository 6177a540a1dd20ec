"""DLQ accountability: every expected notification ends delivered, or its job sits in a
dead-letter queue where an operator can see and redrive it. Anything else vanished.

Suppressions with a reason (no consent, quiet hours still on, dead token, no device) come from
the oracle and are reported beside it; ``dlq`` rows are the dead-letter queues' contents that
the runner records at the end of the run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from harness.checkers.evidence import Evidence
from harness.checkers.keys import joint_keys, member, rows_with, sorted_unique
from harness.checkers.registry import checker
from harness.checkers.verdict import Verdict
from harness.checkers.windows import delivery_rows
from harness.model.oracle import Expectation

KEY = ["tenant_id", "notification_id", "token"]


def check(expectation: Expectation, history: pd.DataFrame) -> Verdict:
    rows = delivery_rows(history)
    dlq_rows = history[history["kind"] == "dlq"]
    parked = {
        (row.tenant_id, row.notification_id, json.loads(row.detail).get("recipient_user_id"))
        for row in dlq_rows.itertuples(index=False)
    }
    expected = expectation.deliveries
    expected_keys, history_keys = joint_keys([expected, history], KEY)
    delivered = sorted_unique(history_keys[rows])
    # The expected keys never delivered are few; only their rows are looked at one by one.
    never = sorted_unique(expected_keys)
    never = never[~member(never, delivered, ordered=True)]
    # A missing value in an expected key never matched a delivery: the history's is pd.NA,
    # the expectation's NaN or None.
    incomplete = expected[KEY].isna().any(axis=1).to_numpy(dtype=bool)
    missing = np.flatnonzero(member(expected_keys, never) | incomplete)
    nids = {nid for _, nid, _ in parked}
    suspects = missing[rows_with(expected, "notification_id", nids)[missing]]
    found = expected[["tenant_id", "notification_id", "user_id"]].iloc[suspects]
    is_parked = np.zeros(len(expected), dtype=bool)
    is_parked[suspects] = [row in parked for row in found.itertuples(index=False, name=None)]
    in_dlq = int(is_parked.sum())
    vanished_rows = missing[~is_parked[missing]]
    vanished = len(vanished_rows)
    examples = [
        {"tenant_id": row.tenant_id, "notification_id": row.notification_id, "user_id": row.user_id}
        for row in expected.iloc[vanished_rows[:5]].itertuples(index=False)
    ]
    counts = {
        "expected": int(len(expectation.deliveries)),
        "delivered": int(len(expectation.deliveries)) - in_dlq - vanished,
        "in_dlq": in_dlq,
        "vanished": vanished,
        "dlq_messages": int(len(dlq_rows)),
        **{f"suppressed_{k}": int(v) for k, v in sorted(expectation.suppressed.items())},
    }
    return Verdict("dlq_accountability", vanished == 0, counts, {"vanished_examples": examples})


@checker(
    "dlq_accountability",
    summary="every expected notification delivered or parked in a dead-letter queue",
    needs=("queues",),
)
def probe(evidence: Evidence, tolerance: Mapping[str, Any]) -> Verdict:
    return check(evidence.expectation, evidence.history)
