"""Audit completeness (seed 000, NIST AU-2): the trail proves, per notification, who the system
tried to notify and why each device was or was not reached.

Ground truth is the provider ledgers and the population, never the system's own logs; the
``audit`` rows are what :func:`harness.audit_trail.collect_audit` read from the WORM bucket.
Devices are matched by ``token_sha256`` (hex SHA-256 of the token), the field the audit record
format names a device by (a record carrying the token in clear is matched by that too).

* every delivery (a provider row with ``delivered`` true) has a ``sent`` record for that
  (tenant, notification, device); a device that got the push only through "accepted, then
  5xx" (no 200 for it) may instead have the ``retry`` record of that answer. The reference
  buffers records in memory, so a consumer killed with -9 loses those it had not stored: all
  of them by default, only the batch in flight with ``audit_flush_before_ack``. A send of
  that batch is audited ``deduped`` when its job is redelivered; such sends are counted apart
  (``sent_records_lost``) and tolerated up to ``max_lost_sent_records`` (crash scenarios); a
  send with no record at all never is;
* every suppression the oracle knows (no consent, quiet hours for the whole run, dead token,
  no device) has its record: ``denied_consent``, ``deferred``, ``dead_token`` for the device
  (or a rate-limit record that held the job or the device first), ``no_device`` (or the gate
  before it);
* every job the oracle expects the fan-out to create has an ``enqueued`` record;
* every job left in a dead-letter queue (not the poison queue) has a ``dlq`` record or another
  final outcome. The consumer cannot see SQS's own move to the DLQ: it audits a job that fails
  on its last allowed receive. A job whose last receive died with its consumer (kill -9) is
  dead-lettered without a record; ``max_unaudited_dlq`` tolerates that in crash scenarios.

The suppressions are expanded from the population with the oracle's rules (the oracle keeps
only their counts); the expansion must agree with those counts, or the verdict fails with
``oracle_mismatch`` rather than judge against a different oracle.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from typing import Any

import pandas as pd

from harness.checkers.verdict import Verdict
from harness.checkers.windows import deliveries
from harness.oracle import Expectation
from harness.population import Population

UNREADABLE = "unreadable"
# Records that do not settle a job: it was still on its way.
NOT_FINAL = frozenset({"enqueued", "retry", "dedup_unavailable", "rate_limit_unavailable"})
# Per oracle reason: (records accepted for the job, records accepted for the device).
ACCEPTED: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "no_consent": (frozenset({"denied_consent"}), frozenset()),
    "quiet_hours_pending": (frozenset({"deferred"}), frozenset()),
    "dead_token": (frozenset({"rate_limited"}), frozenset({"dead_token", "daily_limited"})),
    "no_device": (
        frozenset({"no_device", "denied_consent", "opted_out", "deferred", "rate_limited"}),
        frozenset(),
    ),
}

JobKey = tuple[str, str, str]  # tenant, notification, recipient user
DeviceKey = tuple[str, str, str]  # tenant, notification, token SHA-256


def token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def expected_suppressions(population: Population, injected: pd.DataFrame) -> pd.DataFrame:
    """One row per (notification, device) the oracle expects suppressed (one per user for
    ``no_device``), with the oracle's reason; the same rules, in the same order, as
    :func:`harness.oracle.expected_deliveries`."""
    rows: list[tuple[str, str, str, str | None, str]] = []
    for event in injected.itertuples(index=False):
        author = population.author(event.tenant_id, event.author_id)
        for follower in author.followers:
            user = population.user(event.tenant_id, follower)
            devices = population.devices_of(event.tenant_id, follower)
            if not devices:
                rows.append((event.tenant_id, event.notification_id, follower, None, "no_device"))
                continue
            for device in devices:
                reason = (
                    "no_consent"
                    if user.consent is None
                    else "quiet_hours_pending"
                    if user.quiet_state == "whole_run"
                    else "dead_token"
                    if device.dead
                    else None
                )
                if reason is not None:
                    rows.append(
                        (event.tenant_id, event.notification_id, follower, device.token, reason)
                    )
    return pd.DataFrame(
        rows, columns=["tenant_id", "notification_id", "user_id", "token", "reason"]
    )


class _Trail:
    """The audit rows indexed by job and by device."""

    def __init__(self, history: pd.DataFrame) -> None:
        self.by_job: dict[JobKey, set[str]] = {}
        self.by_device: dict[DeviceKey, set[str]] = {}
        self.outcomes: Counter[str] = Counter()
        self.unreadable = 0
        rows = history[history["kind"] == "audit"]
        for row in rows[["tenant_id", "notification_id", "token", "reason", "detail"]].itertuples(
            index=False
        ):
            if row.reason == UNREADABLE or pd.isna(row.reason):
                self.unreadable += 1
                continue
            outcome = str(row.reason)
            self.outcomes[outcome] += 1
            detail = _detail(row.detail)
            if detail.get("channel", "push") != "push":
                # An email or in-app record must not stand in for the push job's own record
                # (same tenant, notification and user).
                continue
            tenant, nid = str(row.tenant_id), str(row.notification_id)
            user = detail.get("recipient_user_id")
            if isinstance(user, str):
                self.by_job.setdefault((tenant, nid, user), set()).add(outcome)
            hashes = {detail.get("token_sha256")}
            if isinstance(row.token, str):
                hashes.add(token_sha256(row.token))
            for digest in hashes - {None}:
                self.by_device.setdefault((tenant, nid, str(digest)), set()).add(outcome)

    def job(self, tenant: str, nid: str, user: str) -> set[str]:
        return self.by_job.get((tenant, nid, user), set())

    def device(self, tenant: str, nid: str, digest: str) -> set[str]:
        return self.by_device.get((tenant, nid, digest), set())


def _detail(value: Any) -> dict[str, Any]:
    if not isinstance(value, str):
        return {}
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def check(
    expectation: Expectation,
    history: pd.DataFrame,
    population: Population,
    max_unaudited_dlq: int = 0,
    max_lost_sent_records: int = 0,
) -> Verdict:
    trail = _Trail(history)
    hashes: dict[str, str] = {}

    def digest(token: str) -> str:
        if token not in hashes:
            hashes[token] = token_sha256(token)
        return hashes[token]

    examples: dict[str, list[dict[str, Any]]] = {}

    def example(kind: str, **fields: Any) -> None:
        bucket = examples.setdefault(kind, [])
        if len(bucket) < 5:
            bucket.append(fields)

    # Deliveries: any 200 for the device needs 'sent'; 'accepted then 5xx' alone needs the
    # record of that answer.
    delivered = deliveries(history)[["tenant_id", "notification_id", "token", "status"]]
    got_200: dict[tuple[str, str, str], bool] = {}
    for tenant, nid, token, status in delivered.itertuples(index=False, name=None):
        key = (str(tenant), str(nid), str(token))
        got_200[key] = got_200.get(key, False) or status == 200
    audited_sends = unaudited_sends = accepted_then_failed = sent_records_lost = 0
    for (tenant, nid, token), ok in got_200.items():
        outcomes = trail.device(tenant, nid, digest(token))
        if not ok:
            accepted_then_failed += 1
        if "sent" in outcomes or (not ok and "retry" in outcomes):
            audited_sends += 1
            continue
        unaudited_sends += 1
        if "deduped" in outcomes:
            sent_records_lost += 1
        example(
            "unaudited_sends",
            tenant_id=tenant,
            notification_id=nid,
            token=token,
            later_deduped="deduped" in outcomes,
        )

    # Suppressions the oracle knows of.
    injected = history[history["kind"] == "inject"]
    suppressions = expected_suppressions(population, injected)
    expanded = Counter(suppressions["reason"])
    oracle_mismatch = sum(
        abs(expanded.get(reason, 0) - expectation.suppressed.get(reason, 0)) for reason in ACCEPTED
    )
    unaudited_suppressions: Counter[str] = Counter()
    for tenant, nid, user, token, reason in suppressions.itertuples(index=False, name=None):
        for_job, for_device = ACCEPTED[reason]
        if trail.job(tenant, nid, user) & for_job:
            continue
        if isinstance(token, str) and trail.device(tenant, nid, digest(token)) & for_device:
            continue
        unaudited_suppressions[reason] += 1
        example(
            "unaudited_suppressions",
            tenant_id=tenant,
            notification_id=nid,
            user_id=user,
            reason=reason,
        )

    # Every job the fan-out had to create.
    job_columns = ["tenant_id", "notification_id", "user_id"]
    jobs: set[JobKey] = set()
    for frame in (expectation.deliveries, suppressions):
        jobs.update(frame[job_columns].itertuples(index=False, name=None))
    unaudited_enqueues = 0
    for tenant, nid, user in sorted(jobs):
        if "enqueued" not in trail.job(tenant, nid, user):
            unaudited_enqueues += 1
            example("unaudited_enqueues", tenant_id=tenant, notification_id=nid, user_id=user)

    # Jobs parked in a dead-letter queue (the poison queue holds jobs too malformed to name).
    parked = unaudited_dlq = 0
    for row in history[history["kind"] == "dlq"].itertuples(index=False):
        detail = _detail(row.detail)
        if str(detail.get("queue", "")).endswith("-poison"):
            continue
        parked += 1
        user = detail.get("recipient_user_id")
        outcomes = trail.job(str(row.tenant_id), str(row.notification_id), str(user))
        if outcomes - NOT_FINAL:
            continue
        unaudited_dlq += 1
        example(
            "unaudited_dlq",
            tenant_id=str(row.tenant_id),
            notification_id=str(row.notification_id),
            user_id=user,
        )

    counts = {
        "audit_records": sum(trail.outcomes.values()),
        "unreadable_records": trail.unreadable,
        "deliveries": len(got_200),
        "audited_sends": audited_sends,
        "unaudited_sends": unaudited_sends,
        "sent_records_lost": sent_records_lost,
        "accepted_then_failed": accepted_then_failed,
        "suppressions": int(len(suppressions)),
        "unaudited_suppressions": sum(unaudited_suppressions.values()),
        **{f"unaudited_{r}": n for r, n in sorted(unaudited_suppressions.items())},
        "jobs": len(jobs),
        "unaudited_enqueues": unaudited_enqueues,
        "parked_jobs": parked,
        "unaudited_dlq": unaudited_dlq,
        "oracle_mismatch": oracle_mismatch,
        **{f"records_{o}": n for o, n in sorted(trail.outcomes.items())},
    }
    valid = (
        unaudited_sends == sent_records_lost
        and sent_records_lost <= max_lost_sent_records
        and not unaudited_suppressions
        and unaudited_enqueues == 0
        and unaudited_dlq <= max_unaudited_dlq
        and oracle_mismatch == 0
        and trail.unreadable == 0
    )
    return Verdict("audit_complete", valid, counts, {"examples": examples})
