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
import pyarrow as pa

from harness.checkers.evidence import Evidence
from harness.checkers.keys import joint_keys, member, rows_with, sorted_unique
from harness.checkers.registry import checker
from harness.checkers.store import HistoryStore
from harness.checkers.verdict import Verdict
from harness.checkers.windows import delivery_rows
from harness.model.oracle import Expectation

KEY = ["tenant_id", "notification_id", "token"]


def parked_jobs(dlq_rows: pd.DataFrame) -> set[tuple[Any, Any, Any]]:
    """(tenant, notification, recipient user) of every job in a dead-letter queue."""
    return {
        (row.tenant_id, row.notification_id, json.loads(row.detail).get("recipient_user_id"))
        for row in dlq_rows.itertuples(index=False)
    }


def check(expectation: Expectation, history: pd.DataFrame) -> Verdict:
    rows = delivery_rows(history)
    dlq_rows = history[history["kind"] == "dlq"]
    parked = parked_jobs(dlq_rows)
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


def check_store(store: HistoryStore) -> Verdict:
    """:func:`check` over a history on disk."""
    store.require_decided()
    expectation = store.expectation
    dlq_rows = store.rows(["dlq"], ["tenant_id", "notification_id", "detail"])
    parked = [
        (t, n, u)
        for t, n, u in parked_jobs(dlq_rows)
        if isinstance(t, str) and isinstance(n, str) and (u is None or isinstance(u, str))
    ]
    store.register(
        "parked",
        pa.table(
            {
                "tenant_id": pa.array([t for t, _, _ in parked], pa.string()),
                "notification_id": pa.array([n for _, n, _ in parked], pa.string()),
                "user_id": pa.array([u for _, _, u in parked], pa.string()),
            }
        ),
    )
    nulls = [store.null_code(d) for d in ("tenants", "nids", "tokens")]
    # A missing value in an expected key never matched a delivery (as in memory).
    store.run(
        f"""CREATE OR REPLACE TABLE dlq_missing AS
        SELECT e.pos, e.tenant, e.nid, e.user_id, EXISTS (
                SELECT 1 FROM parked p JOIN tenants t ON t.value = p.tenant_id
                JOIN nids n ON n.value = p.notification_id
                WHERE t.code = e.tenant AND n.code = e.nid
                  AND p.user_id IS NOT DISTINCT FROM e.user_id) AS is_parked
        FROM exp e
        WHERE e.key NOT IN (SELECT key FROM {store.delivered_keys()})
           OR e.tenant = {nulls[0]} OR e.nid = {nulls[1]} OR e.tok = {nulls[2]}"""
    )
    in_dlq, vanished = store.one(
        "SELECT count(*) FILTER (is_parked), count(*) FILTER (NOT is_parked) FROM dlq_missing"
    )
    (expected,) = store.one("SELECT count(*) FROM exp")
    first = store.sql(
        "SELECT tenant, nid, user_id FROM dlq_missing WHERE NOT is_parked ORDER BY pos LIMIT 5"
    ).fetchall()
    examples = [
        {"tenant_id": t, "notification_id": n, "user_id": u}
        for t, n, (_, _, u) in zip(
            store.decode("tenants", [r[0] for r in first]),
            store.decode("nids", [r[1] for r in first]),
            first,
            strict=True,
        )
    ]
    counts = {
        "expected": int(expected),
        "delivered": int(expected) - int(in_dlq) - int(vanished),
        "in_dlq": int(in_dlq),
        "vanished": int(vanished),
        "dlq_messages": int(len(dlq_rows)),
        **{f"suppressed_{k}": int(v) for k, v in sorted(expectation.suppressed.items())},
    }
    return Verdict("dlq_accountability", vanished == 0, counts, {"vanished_examples": examples})


@checker(
    "dlq_accountability",
    summary="every expected notification delivered or parked in a dead-letter queue",
    needs=("queues",),
    out_of_core=True,
)
def probe(evidence: Evidence, tolerance: Mapping[str, Any]) -> Verdict:
    if evidence.store is not None:
        return check_store(evidence.store)
    return check(evidence.expectation, evidence.history)
