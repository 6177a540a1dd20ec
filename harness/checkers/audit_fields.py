"""Audit record fields against the oracle (seed 000, NIST AU-3: a record says what happened,
when, and why). ``audit_complete`` finds a record per outcome; this checker reads what the
records say:

* a quiet-hours deferral (``deferred``, reason ``inside_window``) names when the push will be
  released (``until``): it must be an instant (an ISO 8601 time with its UTC offset; a wall-clock
  time without one names no instant an auditor can place: ``until_not_an_instant``) and the end
  of the recipient's window as the oracle computes it in their IANA zone, within ``slack_s``
  (``until_wrong``). Deferrals of users the run changed, or whom the oracle does not put in a
  window at the record's instant, are counted apart (``deferrals_not_judged``);
* every record of a notification the harness injected is timestamped (``at``) no earlier than
  the instant the harness sent that event, less ``slack_s`` (``records_before_injection``), and
  carries a readable time at all (``records_without_time``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import numpy as np
import pandas as pd

from harness.checkers.evidence import Evidence
from harness.checkers.registry import checker, unknown_verdict
from harness.checkers.verdict import Verdict
from harness.model import local_time
from harness.model.population import Population

EXAMPLES = 5
QUIET_REASON = "inside_window"


def instant(value: Any) -> float | None:
    """Epoch seconds of an ISO 8601 time that carries its UTC offset, else None."""
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed.timestamp() if parsed.tzinfo is not None else None


def window_end_at(population: Population, tenant: str, user: str, at: float) -> float | None:
    """The end of the quiet window the oracle puts ``user`` in at ``at`` (in their IANA zone),
    or None (not in one, or not a user of the population)."""
    try:
        person = population.user(tenant, user)
    except KeyError:
        return None
    return local_time.window_end(person.quiet_hours, person.zone, at)


def check(
    history: pd.DataFrame,
    population: Population,
    changed: set[tuple[str, str]],
    slack_s: float,
    clock_offset_s: float = 0.0,
) -> Verdict:
    """``clock_offset_s``: how far the system's clock ran ahead of real time. Its records are
    stamped on its clock: back in real time before they are compared with an injection; its
    quiet windows and their ``until`` are read on its clock."""
    audit = history[history["kind"] == "audit"]
    if audit.empty:
        return unknown_verdict("audit_fields", "the run read no audit record")
    injected = history[history["kind"].isin(["inject", "inject_info"])]
    first_sent = injected.groupby("notification_id")["time"].min().to_dict()
    counts = dict.fromkeys(
        (
            "records", "records_judged", "records_without_time", "records_before_injection",
            "deferrals", "deferrals_not_judged", "until_not_an_instant", "until_wrong",
        ),
        0,
    )  # fmt: skip
    examples: list[dict[str, Any]] = []
    for row in audit.itertuples(index=False):
        counts["records"] += 1
        nid = row.notification_id if isinstance(row.notification_id, str) else None
        sent = first_sent.get(nid) if nid else None
        if sent is None:
            continue  # a record of no notification the harness sent (a digest, a poison job)
        counts["records_judged"] += 1
        at = float(row.time) if not pd.isna(row.time) else np.nan
        if np.isnan(at):
            counts["records_without_time"] += 1
        elif at - clock_offset_s < sent - slack_s:
            counts["records_before_injection"] += 1
            if len(examples) < EXAMPLES:
                examples.append({"notification_id": nid, "outcome": row.reason, "at": at,
                                 "sent": sent})  # fmt: skip
        if row.reason != "deferred":
            continue
        detail = json.loads(str(row.detail))
        if detail.get("reason") != QUIET_REASON:
            continue
        counts["deferrals"] += 1
        user = (detail.get("decrypted") or {}).get("recipient_user_id") or detail.get(
            "recipient_user_id"
        )
        end = None
        if isinstance(user, str) and (row.tenant_id, user) not in changed and not np.isnan(at):
            # Stamped just after a decision taken at the window's last instant: look back too.
            end = window_end_at(population, str(row.tenant_id), user, at) or window_end_at(
                population, str(row.tenant_id), user, at - slack_s
            )
        if end is None:
            counts["deferrals_not_judged"] += 1
            continue
        until = instant(detail.get("until"))
        if until is None:
            counts["until_not_an_instant"] += 1
        elif abs(until - end) > slack_s:
            counts["until_wrong"] += 1
        else:
            continue
        if len(examples) < EXAMPLES:
            examples.append({"notification_id": nid, "user_id": user,
                             "until": detail.get("until"), "window_end": end})  # fmt: skip
    wrong = ("records_without_time", "records_before_injection", "until_not_an_instant",
             "until_wrong")  # fmt: skip
    return Verdict(
        "audit_fields",
        all(counts[k] == 0 for k in wrong),
        counts,
        {"slack_s": slack_s, "examples": examples},
    )


@checker(
    "audit_fields",
    summary="audit records say when (after the event) and, for a deferral, the window's end",
    tolerances={"slack_s": 1.0},
    needs=("audit_trail",),
    # With the history on disk: only the audit records and the injections, not the provider
    # rows (the bulk of a large history).
    reads=("audit", "inject", "inject_info"),
)
def probe(evidence: Evidence, tolerance: Mapping[str, Any]) -> Verdict:
    changed: set[tuple[str, str]] = set()
    if evidence.timeline is not None:
        timeline = evidence.timeline
        changed = set(timeline.states) | set(timeline.erasures) | set(timeline.registrations)
    return check(
        evidence.history,
        evidence.population,
        changed,
        float(tolerance["slack_s"]),
        evidence.clock_offset_s,
    )
