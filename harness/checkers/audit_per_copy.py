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

from collections import Counter
from collections.abc import Mapping
from typing import Any

import pandas as pd

from harness.checkers.audit_complete import record_detail
from harness.checkers.evidence import Evidence
from harness.checkers.registry import checker, unknown_verdict
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

Copy = tuple[str, int]  # message id, receive count
Subject = tuple[str, ...]


def _count(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def copy_of(detail: Mapping[str, Any]) -> Copy | None:
    """The copy an audit record names, or None (a record that names none)."""
    message_id, count = detail.get("sqs_message_id"), _count(detail.get("receive_count"))
    if not isinstance(message_id, str) or not message_id or count is None:
        return None
    return message_id, count


def subject_of(outcome: str, detail: Mapping[str, Any], row_seq: int) -> Subject | None:
    """What the record settles: ``("job",)``, ``("device", <id>)``, a subject of its own for a
    device record whose device cannot be read, or None when it is no outcome."""
    if outcome in NOT_OUTCOMES:
        return None
    readable = detail.get("decrypted")
    fields = readable if isinstance(readable, dict) else detail
    named = next((fields[f] for f in SUBJECT_FIELDS if isinstance(fields.get(f), str)), None)
    if outcome in JOB_OUTCOMES:
        return ("job",)
    if named is not None:
        return ("device", named)
    if outcome in DEVICE_OUTCOMES or detail.get("key_destroyed"):
        return ("unreadable", str(row_seq))  # its device cannot be read: a subject of its own
    return ("job",)  # an outcome this checker does not know, naming no device


def check(history: pd.DataFrame, max_unaudited_copies: int = 0) -> Verdict:
    receives = history[history["kind"] == "receive"]
    if receives.empty:
        return unknown_verdict(
            "audit_per_copy",
            "no SQS receive log in the history (the system's queues are not the harness's "
            "SQS endpoint): nothing to hold the trail against",
        )
    handouts: Counter[Copy] = Counter()
    seen: dict[Copy, dict[str, Any]] = {}
    for row in receives[["time", "detail"]].itertuples(index=False):
        detail = record_detail(row.detail)
        count = _count(detail.get("receive_count"))
        if not isinstance(detail.get("message_id"), str) or count is None:
            continue
        key = (detail["message_id"], count)
        handouts[key] += 1
        seen.setdefault(key, {"queue": detail.get("queue"), "time": float(row.time)})

    records: dict[Copy, Counter[Subject]] = {}
    outcomes_of: dict[tuple[Copy, Subject], list[str]] = {}
    unknown: list[dict[str, Any]] = []
    outcome_records = 0
    audits = history[history["kind"] == "audit"]
    for row in audits[["seq", "reason", "notification_id", "detail"]].itertuples(index=False):
        if pd.isna(row.reason):
            continue
        detail = record_detail(row.detail)
        key = copy_of(detail)
        if key is None:
            continue
        outcome = str(row.reason)
        subject = subject_of(outcome, detail, int(row.seq))
        if subject is None:
            continue
        outcome_records += 1
        if key not in handouts:
            unknown.append({"message_id": key[0], "receive_count": key[1], "outcome": outcome})
            continue
        records.setdefault(key, Counter())[subject] += 1
        outcomes_of.setdefault((key, subject), []).append(outcome)

    copies = sum(handouts.values())
    unaudited = [key for key in handouts if key not in records]
    unaudited_copies = sum(handouts[key] for key in unaudited)
    doubles = [
        (key, subject)
        for key, subjects in records.items()
        for subject, n in subjects.items()
        if n > handouts[key]
    ]
    redelivered = sum(n for key, n in handouts.items() if key[1] > 1)
    unaudited_redelivered = sum(handouts[key] for key in unaudited if key[1] > 1)
    counts = {
        "copies": copies,
        "audited_copies": copies - unaudited_copies,
        "unaudited_copies": unaudited_copies,
        "double_outcomes": len(doubles),
        "unknown_copy_records": len(unknown),
        "redelivered_copies": redelivered,
        "unaudited_redelivered_copies": unaudited_redelivered,
        "outcome_records": outcome_records,
    }
    examples = {
        "unaudited_copies": [
            {"message_id": key[0], "receive_count": key[1], **seen[key]}
            for key in sorted(unaudited, key=lambda k: seen[k]["time"])[:EXAMPLES]
        ],
        "double_outcomes": [
            {
                "message_id": key[0],
                "receive_count": key[1],
                "subject": list(subject),
                "outcomes": outcomes_of[(key, subject)],
            }
            for key, subject in doubles[:EXAMPLES]
        ],
        "unknown_copy_records": unknown[:EXAMPLES],
    }
    valid = unaudited_copies <= max_unaudited_copies and not doubles and not unknown
    return Verdict(
        "audit_per_copy",
        valid,
        counts,
        {"examples": {k: v for k, v in examples.items() if v}},
    )


@checker(
    "audit_per_copy",
    summary="every copy SQS handed out ends in exactly one audit outcome per subject",
    tolerances={"max_unaudited_copies": 0},
    needs=("audit_trail", "sqs_log"),
    # With the history on disk these kinds come as a frame (see registry.in_memory_for).
    reads=("receive", "audit"),
)
def probe(evidence: Evidence, tolerance: Mapping[str, Any]) -> Verdict:
    return check(evidence.history, max_unaudited_copies=int(tolerance["max_unaudited_copies"]))
