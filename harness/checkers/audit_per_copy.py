"""Audit per copy (seed 000, NIST AU-2; issue 11): SQS Standard is at-least-once, so one job can
be handed out several times, and the trail must account for every copy, not only the first.

Ground truth is the SQS endpoint's own log of what it handed out (``receive`` rows, read by
:func:`harness.run.sqs_receives.collect_receives`): each row is one copy, named by the message's
``message_id`` and that receive's ``receive_count``. The ``audit`` rows name the copy a record
came from by ``sqs_message_id`` and ``receive_count`` (the audit record format). A copy must end
in exactly one outcome record per subject:

* no copy without any outcome record (``unaudited_copies``, tolerated up to
  ``max_unaudited_copies``: a consumer killed with -9 (the ``consumer-crash`` fault) takes the
  records of the batch in its hands with it, and copies handed out to it just before the kill);
* no (copy, subject) with two outcome records (``double_outcomes``): one copy, one decision;
* no record naming a copy the endpoint never handed out (``unknown_copy_records``).

Which outcomes settle what, from the reference's consumers (``reference_impl/job_consumer.py``,
``push_consumer.py``, ``channel_consumer.py``):

* per device (push: the device; email: the address; SMS: the number; in-app: the connection),
  the records that name one (``device_id``, ``token_sha256``, ``address_sha256``,
  ``phone_sha256``, ``connection_id``): ``sent``, ``suppressed`` (SMS: the number opted out),
  ``rejected``, ``offline`` and ``dead_token`` (the provider's definite answer, or a device found
  deactivated), ``retry`` (a 429/5xx/transport error), ``deduped`` (its 'sent' mark was there),
  ``in_flight`` (another copy holds the dedup lease), ``paused`` (a Retry-After paused the
  provider: not tried), ``daily_limited`` (the device's daily cap);
* per job: ``denied_consent``, ``opted_out``, ``deferred`` (quiet hours, or a digest whose window
  is still open: re-enqueued as a new message), ``no_device``, ``no_address``, ``no_phone``, ``rate_limited``,
  ``digest_empty``, ``dedup_unavailable`` (a Redis error failed the job closed), ``failed``
  (another error), ``poison`` (malformed: parked in the poison queue);
* not outcomes, they accompany one: ``dlq`` (the job failed on its last allowed receive; its
  device or job records say why), ``digest`` (the digest's count, before its sends),
  ``digest_scheduled`` (a record about the digest job a rate-limited job opened),
  ``rate_limit_unavailable`` (the limit was skipped; the send's own outcome follows), and the
  fan-out's ``enqueued`` (it names no copy).

A job-level failure beside device outcomes (say ``sent`` for one device, then
``dedup_unavailable`` when the batch's 'sent' marks failed) is one outcome per subject, not a
double. An outcome name the checker does not know is judged by its shape: per device when it
names a device, else per job. A device is named by the record's ``decrypted`` fields when the
harness could open them (the reference seals personal fields under a per-user key), else by the
top-level ones; a record whose key was destroyed (an erased user) names no readable device and
counts as a subject of its own, so it is never a double.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import duckdb
import pandas as pd

from harness.checkers.evidence import Evidence
from harness.checkers.json_fields import (
    json_object,
    json_string,
    json_truthy,
    json_whole_number,
    rows_table,
)
from harness.checkers.registry import checker, unknown_verdict
from harness.checkers.store import HistoryStore
from harness.checkers.verdict import Verdict

DEVICE_OUTCOMES = frozenset(
    {
        "sent",
        "rejected",
        "offline",
        "dead_token",
        "retry",
        "deduped",
        "in_flight",
        "paused",
        "daily_limited",
        "suppressed",
    }
)
JOB_OUTCOMES = frozenset(
    {
        "denied_consent",
        "opted_out",
        "deferred",
        "no_device",
        "no_address",
        "no_phone",
        "rate_limited",
        "digest_empty",
        "dedup_unavailable",
        "failed",
        "poison",
    }
)
NOT_OUTCOMES = frozenset(
    {"enqueued", "dlq", "digest", "digest_scheduled", "rate_limit_unavailable", "unreadable"}
)
SUBJECT_FIELDS = ("device_id", "token_sha256", "address_sha256", "phone_sha256", "connection_id")
EXAMPLES = 5


# Why SQL and not a loop over parsed records: at a million deliveries the trail is millions of
# records beside millions of receives; parsed into Python they took gigabytes. DuckDB reads the
# few fields it needs from the JSON and keeps only counts, on disk or in memory alike (one
# query for both: the in-memory frame is handed to it as an Arrow table).


def _listed(names: frozenset[str]) -> str:
    return ", ".join("'" + n.replace("'", "''") + "'" for n in sorted(names))


def _subject(doc: str) -> str:
    """The subject kind and id a record settles, as the module's docstring says: two
    columns."""
    fields = f"(CASE WHEN json_type({doc}, '$.decrypted') = 'OBJECT' THEN json_extract({doc}, '$.decrypted') ELSE {doc} END)"
    named = "coalesce(" + ", ".join(json_string(fields, f) for f in SUBJECT_FIELDS) + ")"
    return f"""CASE
            WHEN reason IN ({_listed(NOT_OUTCOMES)}) THEN NULL
            WHEN reason IN ({_listed(JOB_OUTCOMES)}) THEN 'job'
            WHEN {named} IS NOT NULL THEN 'device'
            WHEN reason IN ({_listed(DEVICE_OUTCOMES)}) OR {json_truthy(doc, "key_destroyed")}
                THEN 'unreadable'
            ELSE 'job' END AS subject_kind,
        CASE
            WHEN reason IN ({_listed(JOB_OUTCOMES)}) THEN NULL
            WHEN {named} IS NOT NULL THEN {named}
            ELSE CAST(seq AS VARCHAR) END AS subject_id"""


def _judge(
    con: duckdb.DuckDBPyConnection, receives: str, audits: str, max_unaudited_copies: int
) -> Verdict:
    """The verdict over two relations: ``receives`` (pos, time, detail) and ``audits`` (pos,
    seq, reason, detail), ``pos`` their order in the history."""
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE apc_handouts AS
        SELECT mid, cnt, count(*) AS n, arg_min(queue, pos) AS queue,
               arg_min(time, pos) AS time, min(pos) AS first
        FROM (SELECT pos, time, {json_string("d", "message_id")} AS mid,
                     {json_whole_number("d", "receive_count")} AS cnt,
                     json_extract_string(d, '$.queue') AS queue
              FROM (SELECT pos, time, {json_object("detail::VARCHAR")} AS d FROM {receives}))
        WHERE mid IS NOT NULL AND cnt IS NOT NULL
        GROUP BY mid, cnt"""
    )
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE apc_outcomes AS
        SELECT * FROM (
            SELECT pos, reason, mid, cnt, {_subject("d")}
            FROM (SELECT pos, seq, reason::VARCHAR AS reason,
                         {json_string("d", "sqs_message_id")} AS mid,
                         {json_whole_number("d", "receive_count")} AS cnt, d
                  FROM (SELECT pos, seq, reason, {json_object("detail::VARCHAR")} AS d
                        FROM {audits}))
            WHERE reason IS NOT NULL AND mid IS NOT NULL AND mid <> '' AND cnt IS NOT NULL)
        WHERE subject_kind IS NOT NULL"""
    )
    con.execute(
        """CREATE OR REPLACE TEMP TABLE apc_subjects AS
        SELECT o.mid, o.cnt, o.subject_kind, o.subject_id, count(*) AS n,
               list(o.reason ORDER BY o.pos) AS outcomes, min(o.pos) AS first
        FROM apc_outcomes o SEMI JOIN apc_handouts h ON o.mid = h.mid AND o.cnt = h.cnt
        GROUP BY o.mid, o.cnt, o.subject_kind, o.subject_id"""
    )
    (outcome_records,) = con.execute("SELECT count(*) FROM apc_outcomes").fetchone()
    copies, redelivered = con.execute(
        "SELECT coalesce(sum(n), 0), coalesce(sum(n) FILTER (WHERE cnt > 1), 0) FROM apc_handouts"
    ).fetchone()
    unaudited = """(SELECT * FROM apc_handouts h
        ANTI JOIN (SELECT DISTINCT mid, cnt FROM apc_subjects) s ON h.mid = s.mid AND h.cnt = s.cnt)"""
    unaudited_copies, unaudited_redelivered = con.execute(
        f"SELECT coalesce(sum(n), 0), coalesce(sum(n) FILTER (WHERE cnt > 1), 0) FROM {unaudited}"
    ).fetchone()
    unaudited_examples = [
        {
            "message_id": mid,
            "receive_count": cnt,
            "queue": queue,
            "time": None if time is None else float(time),
        }
        for mid, cnt, queue, time in con.execute(
            f"SELECT mid, cnt, queue, time FROM {unaudited} ORDER BY time, first LIMIT {EXAMPLES}"
        ).fetchall()
    ]
    doubles = """(SELECT s.*, min(s.first) OVER (PARTITION BY s.mid, s.cnt) AS copy_first
        FROM apc_subjects s JOIN apc_handouts h ON s.mid = h.mid AND s.cnt = h.cnt
        WHERE s.n > h.n)"""
    (double_outcomes,) = con.execute(f"SELECT count(*) FROM {doubles}").fetchone()
    double_examples = [
        {
            "message_id": mid,
            "receive_count": cnt,
            "subject": [kind] if subject is None else [kind, subject],
            "outcomes": list(outcomes),
        }
        for mid, cnt, kind, subject, outcomes in con.execute(
            f"""SELECT mid, cnt, subject_kind, subject_id, outcomes FROM {doubles}
            ORDER BY copy_first, first LIMIT {EXAMPLES}"""
        ).fetchall()
    ]
    unknown = """(SELECT o.* FROM apc_outcomes o
        ANTI JOIN apc_handouts h ON o.mid = h.mid AND o.cnt = h.cnt)"""
    (unknown_records,) = con.execute(f"SELECT count(*) FROM {unknown}").fetchone()
    unknown_examples = [
        {"message_id": mid, "receive_count": cnt, "outcome": outcome}
        for mid, cnt, outcome in con.execute(
            f"SELECT mid, cnt, reason FROM {unknown} ORDER BY pos LIMIT {EXAMPLES}"
        ).fetchall()
    ]
    for table in ("apc_handouts", "apc_outcomes", "apc_subjects"):
        con.execute(f"DROP TABLE {table}")
    counts = {
        "copies": int(copies),
        "audited_copies": int(copies - unaudited_copies),
        "unaudited_copies": int(unaudited_copies),
        "double_outcomes": int(double_outcomes),
        "unknown_copy_records": int(unknown_records),
        "redelivered_copies": int(redelivered),
        "unaudited_redelivered_copies": int(unaudited_redelivered),
        "outcome_records": int(outcome_records),
    }
    examples = {
        "unaudited_copies": unaudited_examples,
        "double_outcomes": double_examples,
        "unknown_copy_records": unknown_examples,
    }
    valid = unaudited_copies <= max_unaudited_copies and not double_outcomes and not unknown_records
    return Verdict(
        "audit_per_copy",
        valid,
        counts,
        {"examples": {k: v for k, v in examples.items() if v}},
    )


def _no_receive_log() -> Verdict:
    return unknown_verdict(
        "audit_per_copy",
        "no SQS receive log in the history (the system's queues are not the harness's "
        "SQS endpoint): nothing to hold the trail against",
    )


def check(history: pd.DataFrame, max_unaudited_copies: int = 0) -> Verdict:
    """The verdict over a history in memory."""
    rows = history[history["kind"].isin(["receive", "audit"])]
    if not (rows["kind"] == "receive").any():
        return _no_receive_log()
    table = rows_table(rows, ["kind", "reason", "detail"], integers=["seq"])
    with duckdb.connect() as con:
        con.register("apc_rows", table)
        return _judge(
            con,
            "(SELECT pos, time, detail FROM apc_rows WHERE kind = 'receive')",
            "(SELECT pos, seq, reason, detail FROM apc_rows WHERE kind = 'audit')",
            max_unaudited_copies,
        )


def check_store(store: HistoryStore, max_unaudited_copies: int = 0) -> Verdict:
    """The verdict over a history on disk: the same query over the file's rows."""
    (receives,) = store.one("SELECT count(*) FROM other WHERE kind = 'receive'")
    if not receives:
        return _no_receive_log()
    return _judge(
        store.con,
        "(SELECT pos, time, detail FROM other WHERE kind = 'receive')",
        "(SELECT pos, seq, reason, detail FROM other WHERE kind = 'audit')",
        max_unaudited_copies,
    )


@checker(
    "audit_per_copy",
    summary="every copy SQS handed out ends in exactly one audit outcome per subject",
    tolerances={"max_unaudited_copies": 0},
    needs=("audit_trail", "sqs_log"),
    out_of_core=True,
)
def probe(evidence: Evidence, tolerance: Mapping[str, Any]) -> Verdict:
    most = int(tolerance["max_unaudited_copies"])
    if evidence.store is not None:
        return check_store(evidence.store, most)
    return check(evidence.history, most)
