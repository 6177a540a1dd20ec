"""Poison queue routing (seed 004): "after 3 failed receives, transient failures redrive to
source; malformed payloads route to a separate poison DLQ", and "every job ends delivered,
suppressed with a reason, or in a DLQ".

The oracle is what the harness itself put on the work queues: ``malformed`` rows (the action
``inject-malformed-jobs``), each with an id of its own that the body carries. At the end of the
run the runner reads every dead-letter and poison queue the contract names (``dlq`` rows, with
the malformed id found in a message's body). Counts:

* ``injected``: malformed jobs the harness sent; ``in_poison``: those with a copy in a poison
  queue (a copy handed out twice by SQS may be parked twice: one is enough);
* ``redriven_to_dead``: in a retry dead-letter queue and in no poison queue (retried as if
  transient, the operator's redrive would send them round again);
* ``dropped``: in neither queue (acknowledged and forgotten, or still circulating);
* ``delivered``: a provider or channel ledger row carries a malformed job's id (a consumer that
  skipped validation sent it);
* ``well_formed_in_poison``: a poison-queue message that is not the harness's and names a
  notification (a job a retry could have delivered, parked where nobody retries it);
  ``unidentified_in_poison``: one that names nothing the contract's job reader can read
  (reported, not judged: the harness cannot tell what it was).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pandas as pd

from harness.checkers.evidence import Evidence
from harness.checkers.registry import checker
from harness.checkers.store import HistoryStore
from harness.checkers.verdict import Verdict, switched_off

EXAMPLES = 5


def check(history: pd.DataFrame) -> Verdict:
    malformed = history[history["kind"] == "malformed"]
    if malformed.empty:
        # Nothing to judge (the system's poison queues do not exist, or the scenario injects
        # none): said so, never a pass.
        return switched_off("poison_queue", "not judged: no malformed job was injected")
    injected = {
        str(n): str(c)
        for n, c in zip(malformed["notification_id"], malformed["detail"], strict=True)
    }
    parked = history[history["kind"] == "dlq"]
    in_poison: set[str] = set()
    in_dead: set[str] = set()
    well_formed: list[dict[str, Any]] = []
    unidentified = 0
    for row in parked.itertuples(index=False):
        detail = json.loads(str(row.detail))
        marker = detail.get("malformed_id")
        poison = detail.get("kind") == "poison"
        if marker:
            (in_poison if poison else in_dead).add(marker)
        elif poison and isinstance(row.notification_id, str):
            well_formed.append({"queue": detail.get("queue"), "notification_id": row.notification_id,
                                "tenant_id": row.tenant_id})  # fmt: skip
        elif poison:
            unidentified += 1
    sent = history[history["kind"].isin(["provider", "channel"])]
    delivered = set(sent["notification_id"].dropna().astype(str)) & set(injected)
    markers = set(injected)
    redriven = (in_dead - in_poison) & markers
    dropped = markers - in_poison - in_dead
    counts = {
        "injected": len(markers),
        "in_poison": len(in_poison & markers),
        "redriven_to_dead": len(redriven),
        "dropped": len(dropped),
        "delivered": len(delivered),
        "well_formed_in_poison": len(well_formed),
        "unidentified_in_poison": unidentified,
    }
    examples: list[dict[str, Any]] = [
        {"malformed_id": m, "ended": "retry dead-letter queue", **json.loads(injected[m])}
        for m in sorted(redriven)[:EXAMPLES]
    ]
    examples += [
        {"malformed_id": m, "ended": "in no dead-letter queue", **json.loads(injected[m])}
        for m in sorted(dropped)[:EXAMPLES]
    ]
    examples += [{"malformed_id": m, "ended": "delivered"} for m in sorted(delivered)[:EXAMPLES]]
    examples += well_formed[:EXAMPLES]
    valid = not redriven and not dropped and not delivered and not well_formed
    return Verdict("poison_queue", valid, counts, {"examples": examples})


def check_store(store: HistoryStore) -> Verdict:
    """:func:`check` over a history on disk: its few malformed, dead-letter and channel rows,
    and only the provider rows that carry a malformed job's id."""
    columns = ["kind", "tenant_id", "notification_id", "detail"]
    rows = store.rows(["malformed", "dlq", "channel"], columns)
    markers = sorted(set(rows.loc[rows["kind"] == "malformed", "notification_id"].dropna()))
    quoted = "'" + str(store.history_path).replace("'", "''") + "'"
    sent = store.frame(
        f"SELECT {', '.join(columns)} FROM read_parquet({quoted}) "
        "WHERE kind = 'provider' AND notification_id IN (SELECT unnest(?))",
        [markers],
    )
    return check(pd.concat([rows, sent.astype(rows.dtypes.to_dict())], ignore_index=True))


@checker(
    "poison_queue",
    summary="malformed jobs end in the poison queue, well-formed ones never do",
    needs=("queues", "poison_queue"),
    out_of_core=True,
)
def probe(evidence: Evidence, tolerance: Mapping[str, Any]) -> Verdict:
    if evidence.store is not None:
        return check_store(evidence.store)
    return check(evidence.history)
