"""DLQ accountability: every expected notification ends delivered, or its job sits in a
dead-letter queue where an operator can see and redrive it. Anything else vanished.

Suppressions with a reason (no consent, quiet hours still on, dead token, no device) come from
the oracle and are reported beside it; ``dlq`` rows are the dead-letter queues' contents that
the runner records at the end of the run.
"""

from __future__ import annotations

import json

import pandas as pd

from harness.checkers.verdict import Verdict
from harness.checkers.windows import deliveries
from harness.oracle import Expectation

KEY = ["tenant_id", "notification_id", "token"]


def check(expectation: Expectation, history: pd.DataFrame) -> Verdict:
    delivered = set(deliveries(history)[KEY].itertuples(index=False, name=None))
    dlq_rows = history[history["kind"] == "dlq"]
    parked = {
        (row.tenant_id, row.notification_id, json.loads(row.detail).get("recipient_user_id"))
        for row in dlq_rows.itertuples(index=False)
    }
    in_dlq = vanished = 0
    examples = []
    for row in expectation.deliveries.itertuples(index=False):
        if (row.tenant_id, row.notification_id, row.token) in delivered:
            continue
        if (row.tenant_id, row.notification_id, row.user_id) in parked:
            in_dlq += 1
            continue
        vanished += 1
        if len(examples) < 5:
            examples.append(
                {
                    "tenant_id": row.tenant_id,
                    "notification_id": row.notification_id,
                    "user_id": row.user_id,
                }
            )
    counts = {
        "expected": int(len(expectation.deliveries)),
        "delivered": int(len(expectation.deliveries)) - in_dlq - vanished,
        "in_dlq": in_dlq,
        "vanished": vanished,
        "dlq_messages": int(len(dlq_rows)),
        **{f"suppressed_{k}": int(v) for k, v in sorted(expectation.suppressed.items())},
    }
    return Verdict("dlq_accountability", vanished == 0, counts, {"vanished_examples": examples})
