"""Fail-closed dedup: no provider delivery without a dedup decision while the store is out.

An outage window is that of any fault whose record says it took the dedup store away (the
fault's own property, ``unavailable: dedup``, not its name): the proxy refusing connections
(``dedup-outage``, ``proxy-down`` on the dedup proxy), a black hole that only the client's own
socket timeout ends (``dedup-blackhole``, ``proxy-timeout`` on it), the store killed
(``dedup-crash``). A consumer that fails closed on a refused connection and open on a timeout
is judged by the same rule in both.

With the DynamoDB fallback off, a delivery inside a dedup-store outage window is a violation
when its decision cannot have been taken before the outage began. The harness never sees a
decision, only bounds on it: it comes after the notification was injected (the harness's own
clock at the request) and before the provider got the request. So:

* ``decided_during_outage``: a delivery inside the window of a notification injected after the
  window opened (plus ``grace_s``, for the fault taking hold): its decision was surely taken
  with the store out, whatever the machine's load;
* ``backlog_sent_late``: a delivery inside the window of a notification injected before it,
  more than ``decision_lag_s`` after the window opened: a decision taken before the outage
  does not wait that long for its send (a clean run on a loaded 2-core machine sent a batch
  decided just before the cut 1.1 s into the outage, past the old fixed 0.5 s grace).

``deliveries_during_outage`` counts every delivery inside the window past ``grace_s`` (both
kinds, and the backlog sent within the lag): what the window saw, not the verdict.

A delivery's instant is when the system handed it off: the Publish SNS accepted for it when
it went through SNS (SNS's own delivery to the provider is no decision of the system's, and on
a loaded machine it put pushes published before the cut seconds into the outage), the
provider's request otherwise (:func:`windows.handoff_times`).

With the fallback on, deliveries during the outage are allowed (the fallback decided them),
and what must hold is that none of them is duplicated across the outage and the recovery.
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
from harness.checkers.windows import (
    delivery_rows,
    handoff_times,
    injection_times,
    unavailable_windows,
)

KEY = ["tenant_id", "notification_id", "token"]
# The longest a decision taken before an outage may wait for its send: a batch's sends after
# its claims, on a machine loaded well past its cores.
DECISION_LAG_S = 5.0


def check(
    history: pd.DataFrame,
    grace_s: float = 0.5,
    fallback: bool = False,
    decision_lag_s: float = DECISION_LAG_S,
) -> Verdict:
    windows = unavailable_windows(history)
    rows = delivery_rows(history)
    times = handoff_times(history, rows)
    injects = history.loc[history["kind"] == "inject", ["tenant_id", "notification_id", "time"]]
    injected_at = injection_times(injects)
    (history_keys,) = joint_keys([history], KEY)
    delivered_keys = history_keys[rows]
    pairs = pd.MultiIndex.from_frame(history[["tenant_id", "notification_id"]].iloc[rows])
    injected = injected_at.reindex(pairs).to_numpy(dtype=float, na_value=np.nan)
    inside = np.zeros(len(rows), dtype=bool)
    decided = np.zeros(len(rows), dtype=bool)
    late = np.zeros(len(rows), dtype=bool)
    for window in windows:
        within = (times > window.start + grace_s) & (times < window.stop)
        inside |= within
        after_cut = injected > window.start + grace_s  # NaN (not injected by us): before
        decided |= within & after_cut
        late |= within & ~after_cut & (times > window.start + decision_lag_s)
    during = history[KEY + ["time"]].iloc[rows[inside]]
    keys_during = sorted_unique(delivered_keys[inside])
    # Every delivery of a key delivered during the outage, less the first of each such key.
    duplicated_across = int(member(delivered_keys, keys_during).sum()) - len(keys_during)
    counts = {
        "outage_windows": len(windows),
        "outage_seconds": round(sum(w.stop - w.start for w in windows)),
        "deliveries_during_outage": int(len(during)),
        "decided_during_outage": int(decided.sum()),
        "backlog_sent_late": int(late.sum()),
        "duplicated_across_outage": duplicated_across,
    }
    violations = history[KEY + ["time"]].iloc[rows[decided | late]]
    details = {
        "grace_s": grace_s,
        "decision_lag_s": decision_lag_s,
        "fallback": fallback,
        "examples": violations.head(5).to_dict("records"),
    }
    return Verdict("fail_closed", _valid(counts, fallback) and bool(windows), counts, details)


def _valid(counts: Mapping[str, int], fallback: bool) -> bool:
    if fallback:
        return counts["duplicated_across_outage"] == 0
    return counts["decided_during_outage"] == 0 and counts["backlog_sent_late"] == 0


def check_store(
    store: HistoryStore,
    grace_s: float = 0.5,
    fallback: bool = False,
    decision_lag_s: float = DECISION_LAG_S,
) -> Verdict:
    """:func:`check` over a history on disk."""
    store.require_decided()
    faults = store.rows(["fault"], ["kind", "time", "detail"])
    windows = unavailable_windows(faults, end=store.end_time)
    store.register(
        "outage_windows",
        pd.DataFrame(
            {
                "start": [w.start + grace_s for w in windows],
                "lag_end": [w.start + decision_lag_s for w in windows],
                "stop": [w.stop for w in windows],
            },
            dtype=float,
        ),
    )
    # When each injected notification was sent, by the prov table's codes (see windows.injection_times).
    store.run(
        """CREATE OR REPLACE TABLE injected_at AS
        SELECT t.code AS tenant, n.code AS nid, min(o.time) AS at FROM other o
        JOIN tenants t ON t.value = o.tenant_id JOIN nids n ON n.value = o.notification_id
        WHERE o.kind = 'inject' GROUP BY t.code, n.code"""
    )
    # Publishes SNS accepted, the hand-off of a push through SNS (see windows.handoff_times).
    store.run(
        """CREATE OR REPLACE TABLE published AS
        SELECT t.code AS tenant, n.code AS nid, k.code AS tok, o.time AS at FROM other o
        JOIN tenants t ON t.value = o.tenant_id JOIN nids n ON n.value = o.notification_id
        JOIN tokens k ON k.value = o.token
        WHERE o.kind = 'sns_publish' AND o.reason IS NULL AND o.time IS NOT NULL"""
    )
    store.run(
        """CREATE OR REPLACE TABLE during_outage AS
        WITH handed AS (
            SELECT p.pos, p.key, p.time, p.tenant, p.nid, coalesce(s.at, p.time) AS at
            FROM (SELECT * FROM prov WHERE got) p
            ASOF LEFT JOIN published s
            ON p.tenant = s.tenant AND p.nid = s.nid AND p.tok = s.tok AND p.time >= s.at
        )
        SELECT h.pos, h.key, h.time,
               bool_or(coalesce(i.at > w.start, false)) AS decided,
               bool_or(NOT coalesce(i.at > w.start, false) AND h.at > w.lag_end) AS late
        FROM handed h
        JOIN outage_windows w ON h.at > w.start AND h.at < w.stop
        LEFT JOIN injected_at i ON i.tenant = h.tenant AND i.nid = h.nid
        GROUP BY h.pos, h.key, h.time"""
    )
    (during, decided, late) = store.one(
        "SELECT count(*), count(*) FILTER (decided), count(*) FILTER (late) FROM during_outage"
    )
    (duplicated_across,) = store.one(
        """SELECT count(*) - (SELECT count(DISTINCT key) FROM during_outage) FROM prov
        WHERE got AND key IN (SELECT key FROM during_outage)"""
    )
    counts = {
        "outage_windows": len(windows),
        "outage_seconds": round(sum(w.stop - w.start for w in windows)),
        "deliveries_during_outage": int(during),
        "decided_during_outage": int(decided),
        "backlog_sent_late": int(late),
        "duplicated_across_outage": int(duplicated_across),
    }
    first = store.sql(
        "SELECT key, time FROM during_outage WHERE decided OR late ORDER BY pos LIMIT 5"
    ).fetchall()
    examples = [
        {**record, "time": time}
        for record, (_, time) in zip(store.decode_keys([k for k, _ in first]), first, strict=True)
    ]
    details = {
        "grace_s": grace_s,
        "decision_lag_s": decision_lag_s,
        "fallback": fallback,
        "examples": examples,
    }
    return Verdict("fail_closed", _valid(counts, fallback) and bool(windows), counts, details)


@checker(
    "fail_closed",
    summary="no delivery without a dedup decision while the dedup store is out",
    tolerances={"grace_s": 0.5, "decision_lag_s": DECISION_LAG_S},
    out_of_core=True,
)
def probe(evidence: Evidence, tolerance: Mapping[str, Any]) -> Verdict:
    if evidence.store is not None:
        return check_store(
            evidence.store,
            grace_s=float(tolerance["grace_s"]),
            fallback=evidence.policy.dedup_fallback,
            decision_lag_s=float(tolerance["decision_lag_s"]),
        )
    return check(
        evidence.history,
        grace_s=float(tolerance["grace_s"]),
        fallback=evidence.policy.dedup_fallback,
        decision_lag_s=float(tolerance["decision_lag_s"]),
    )
