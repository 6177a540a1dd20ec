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

from collections.abc import Mapping
from datetime import datetime
from typing import Any

import duckdb
import pandas as pd

from harness.checkers.evidence import Evidence
from harness.checkers.json_fields import json_object, json_string, rows_table
from harness.checkers.registry import checker, unknown_verdict
from harness.checkers.store import HistoryStore
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


def _judge(
    con: duckdb.DuckDBPyConnection,
    audits: str,
    injected: str,
    population: Population,
    changed: set[tuple[str, str]],
    slack_s: float,
    clock_offset_s: float,
) -> Verdict:
    """The verdict over two relations: ``audits`` (pos, tenant_id, notification_id, time,
    reason, detail) and ``injected`` (notification_id, time). The times are judged in SQL;
    only quiet-hours deferrals come back to Python, for their window in the user's zone."""
    detail = json_object("detail::VARCHAR")
    decrypted = "json_extract(d, '$.decrypted')"
    user = (
        f"coalesce(CASE WHEN json_type(d, '$.decrypted') = 'OBJECT' "
        f"THEN nullif({json_string(decrypted, 'recipient_user_id')}, '') END, "
        f"{json_string('d', 'recipient_user_id')})"
    )
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE af_judged AS
        SELECT a.pos, a.tenant_id::VARCHAR AS tenant_id, a.nid, a.time, a.reason, s.sent
        FROM (SELECT pos, tenant_id, notification_id::VARCHAR AS nid, time,
                     reason::VARCHAR AS reason FROM {audits}) a
        JOIN (SELECT notification_id::VARCHAR AS nid, min(time) AS sent FROM {injected}
              GROUP BY notification_id) s ON a.nid = s.nid"""
    )
    (records,) = con.execute(f"SELECT count(*) FROM {audits}").fetchone()
    judged, without_time, early = con.execute(
        f"""SELECT count(*), count(*) FILTER (WHERE time IS NULL),
                   count(*) FILTER (WHERE time - {float(clock_offset_s)} < sent - {float(slack_s)})
        FROM af_judged"""
    ).fetchone()
    examples: list[tuple[int, dict[str, Any]]] = [
        (pos, {"notification_id": nid, "outcome": reason, "at": at, "sent": sent})
        for pos, nid, reason, at, sent in con.execute(
            f"""SELECT pos, nid, reason, time, sent FROM af_judged
            WHERE time - {float(clock_offset_s)} < sent - {float(slack_s)}
            ORDER BY pos LIMIT {EXAMPLES}"""
        ).fetchall()
    ]
    deferrals = con.execute(
        f"""SELECT j.pos, j.tenant_id, j.nid, j.time, {user} AS user_id,
                   {json_string("d", "until")} AS until
        FROM af_judged j
        JOIN (SELECT pos, {detail} AS d FROM {audits} WHERE reason = 'deferred') a
          ON a.pos = j.pos
        WHERE {json_string("d", "reason")} = '{QUIET_REASON}'
        ORDER BY j.pos"""
    ).fetchall()
    con.execute("DROP TABLE af_judged")
    counts = {
        "records": int(records),
        "records_judged": int(judged),
        "records_without_time": int(without_time),
        "records_before_injection": int(early),
        "deferrals": len(deferrals),
        "deferrals_not_judged": 0,
        "until_not_an_instant": 0,
        "until_wrong": 0,
    }
    for pos, tenant, nid, at, user, until_text in deferrals:
        end = None
        if isinstance(user, str) and (tenant, user) not in changed and at is not None:
            # Stamped just after a decision taken at the window's last instant: look back too.
            end = window_end_at(population, str(tenant), user, at) or window_end_at(
                population, str(tenant), user, at - slack_s
            )
        if end is None:
            counts["deferrals_not_judged"] += 1
            continue
        until = instant(until_text)
        if until is None:
            counts["until_not_an_instant"] += 1
        elif abs(until - end) > slack_s:
            counts["until_wrong"] += 1
        else:
            continue
        examples.append(
            (pos, {"notification_id": nid, "user_id": user, "until": until_text,
                   "window_end": end})
        )  # fmt: skip
    wrong = ("records_without_time", "records_before_injection", "until_not_an_instant",
             "until_wrong")  # fmt: skip
    return Verdict(
        "audit_fields",
        all(counts[k] == 0 for k in wrong),
        counts,
        {"slack_s": slack_s, "examples": [e for _, e in sorted(examples)[:EXAMPLES]]},
    )


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
    rows = history[history["kind"].isin(["audit", "inject", "inject_info"])]
    if not (rows["kind"] == "audit").any():
        return unknown_verdict("audit_fields", "the run read no audit record")
    table = rows_table(rows, ["kind", "tenant_id", "notification_id", "reason", "detail"])
    with duckdb.connect() as con:
        con.register("af_rows", table)
        return _judge(
            con,
            "(SELECT * FROM af_rows WHERE kind = 'audit')",
            "(SELECT * FROM af_rows WHERE kind IN ('inject', 'inject_info'))",
            population, changed, slack_s, clock_offset_s,
        )  # fmt: skip


def check_store(
    store: HistoryStore,
    population: Population,
    changed: set[tuple[str, str]],
    slack_s: float,
    clock_offset_s: float = 0.0,
) -> Verdict:
    """:func:`check` over a history on disk: the same query over the file's rows."""
    (audits,) = store.one("SELECT count(*) FROM other WHERE kind = 'audit'")
    if not audits:
        return unknown_verdict("audit_fields", "the run read no audit record")
    return _judge(
        store.con,
        "(SELECT * FROM other WHERE kind = 'audit')",
        "(SELECT * FROM other WHERE kind IN ('inject', 'inject_info'))",
        population, changed, slack_s, clock_offset_s,
    )  # fmt: skip


@checker(
    "audit_fields",
    summary="audit records say when (after the event) and, for a deferral, the window's end",
    tolerances={"slack_s": 1.0},
    needs=("audit_trail",),
    out_of_core=True,
)
def probe(evidence: Evidence, tolerance: Mapping[str, Any]) -> Verdict:
    changed: set[tuple[str, str]] = set()
    if evidence.timeline is not None:
        timeline = evidence.timeline
        changed = set(timeline.states) | set(timeline.erasures) | set(timeline.registrations)
    arguments = (evidence.population, changed, float(tolerance["slack_s"]))
    if evidence.store is not None:
        return check_store(evidence.store, *arguments, evidence.clock_offset_s)
    return check(evidence.history, *arguments, evidence.clock_offset_s)
