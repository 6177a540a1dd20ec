"""Audit completeness (seed 000, NIST AU-2): the trail proves, per notification, who the system
tried to notify and why each device was or was not reached.

Ground truth is the provider ledgers and the population, never the system's own logs; the
``audit`` rows are what :func:`harness.run.audit_trail.collect_audit` read from the WORM bucket.
Devices are matched by ``token_sha256`` (hex SHA-256 of the token), the field the audit record
format names a device by (a record carrying the token in clear is matched by that too).
``recipient_user_id`` and ``token_sha256`` are read from the fields the collector decrypted
(``decrypted``) when it could open the record's envelopes, else from the record's top level.

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
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from harness.checkers.evidence import Evidence
from harness.checkers.json_fields import json_object, json_push_channel, json_string, key_text
from harness.checkers.keys import (
    first_rows,
    joint_keys,
    member,
    rows_with,
    sorted_unique,
    values_at,
)
from harness.checkers.registry import checker
from harness.checkers.store import HistoryStore
from harness.checkers.verdict import Verdict
from harness.checkers.windows import delivery_rows
from harness.model.oracle import Expectation
from harness.model.population import Population

UNREADABLE = "unreadable"
# Records that do not settle a job: it was still on its way.
NOT_FINAL = frozenset(
    {
        "enqueued",
        "retry",
        "dedup_unavailable",
        "rate_limit_unavailable",
        "in_flight",
        "paused",
        "failed",
    }
)
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
REASONS = tuple(ACCEPTED)

JobKey = tuple[str, str, str]  # tenant, notification, recipient user
DeviceKey = tuple[str, str, str]  # tenant, notification, token SHA-256


def token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class _Expansion:
    """The suppressions the oracle expects, without one Python object per row: each author's
    followers are expanded once (``follower_*``, a block per author) and each event repeats its
    author's block. Row ``i`` is event ``event[i]`` and follower entry ``follower[i]``."""

    def __init__(
        self,
        population: Population,
        injected: pd.DataFrame,
        skip: set[tuple[str, str]] | frozenset[tuple[str, str]] = frozenset(),
    ) -> None:
        self.tenants: list[Any] = []
        self.nids: list[Any] = []
        users: list[str] = []
        tokens: list[str | None] = []
        reasons: list[int] = []
        blocks: dict[tuple[Any, Any], tuple[int, int]] = {}
        block_of_event: list[tuple[int, int]] = []
        for event in injected.itertuples(index=False):
            key = (event.tenant_id, event.author_id)
            if key not in blocks:
                start = len(users)
                author = population.author(event.tenant_id, event.author_id)
                for follower in author.followers:
                    if (event.tenant_id, follower) in skip:
                        continue  # a user the run changed: no fixed reason to expect
                    user = population.user(event.tenant_id, follower)
                    devices = population.devices_of(event.tenant_id, follower)
                    if not devices:
                        users.append(follower)
                        tokens.append(None)
                        reasons.append(REASONS.index("no_device"))
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
                            users.append(follower)
                            tokens.append(device.token)
                            reasons.append(REASONS.index(reason))
                blocks[key] = (start, len(users) - start)
            self.tenants.append(event.tenant_id)
            self.nids.append(event.notification_id)
            block_of_event.append(blocks[key])
        self.follower_user = np.array(users, dtype=object)
        self.follower_token = np.array(tokens, dtype=object)
        self.follower_reason = np.array(reasons, dtype=np.int64)
        starts = np.array([b[0] for b in block_of_event], dtype=np.int64)
        lengths = np.array([b[1] for b in block_of_event], dtype=np.int64)
        self.event = np.repeat(np.arange(len(lengths)), lengths)
        offsets = np.cumsum(lengths) - lengths
        self.follower = np.repeat(starts - offsets, lengths) + np.arange(int(lengths.sum()))
        self.reason = self.follower_reason[self.follower]

    def __len__(self) -> int:
        return len(self.event)

    def row(self, i: int) -> tuple[Any, Any, str, str | None, str]:
        e, f = int(self.event[i]), int(self.follower[i])
        return (
            self.tenants[e],
            self.nids[e],
            self.follower_user[f],
            self.follower_token[f],
            REASONS[self.follower_reason[f]],
        )

    def jobs(self) -> pd.DataFrame:
        """(tenant, notification, user) per row, as Arrow-backed strings."""
        event = pa.array(self.event)
        columns = {
            "tenant_id": _strings(self.tenants).take(event),
            "notification_id": _strings(self.nids).take(event),
            "user_id": _strings(self.follower_user.tolist()).take(pa.array(self.follower)),
        }
        return pd.DataFrame(
            {name: pd.arrays.ArrowExtensionArray(values) for name, values in columns.items()}
        )

    def job_tables(self) -> dict[str, pa.Table]:
        """The jobs as three small tables and one of integers, for a store to join: events
        (``i``, tenant_id, notification_id), follower entries (``i``, user_id) and rows
        (``event``, ``follower``)."""
        return {
            "events": pa.table(
                {
                    "i": pa.array(range(len(self.tenants)), pa.int64()),
                    "tenant_id": _strings(self.tenants),
                    "notification_id": _strings(self.nids),
                }
            ),
            "followers": pa.table(
                {
                    "i": pa.array(range(len(self.follower_user)), pa.int64()),
                    "user_id": _strings(self.follower_user.tolist()),
                }
            ),
            "rows": pa.table({"event": pa.array(self.event), "follower": pa.array(self.follower)}),
        }


def _strings(values: list[Any]) -> pa.Array:
    return pa.array([v if isinstance(v, str) else None for v in values], pa.large_string())


def expected_suppressions(population: Population, injected: pd.DataFrame) -> pd.DataFrame:
    """One row per (notification, device) the oracle expects suppressed (one per user for
    ``no_device``), with the oracle's reason; the same rules, in the same order, as
    :func:`harness.model.oracle.expected_deliveries`."""
    expansion = _Expansion(population, injected)
    return pd.DataFrame(
        [expansion.row(i) for i in range(len(expansion))],
        columns=["tenant_id", "notification_id", "user_id", "token", "reason"],
    )


class _Trail:
    """The audit rows indexed by job and by device."""

    def __init__(self, history: pd.DataFrame | None) -> None:
        self.by_job: dict[JobKey, set[str]] = {}
        self.by_device: dict[DeviceKey, set[str]] = {}
        self.outcomes: Counter[str] = Counter()
        self.unreadable = 0
        if history is None:
            return
        rows = history[history["kind"] == "audit"]
        for row in rows[["tenant_id", "notification_id", "token", "reason", "detail"]].itertuples(
            index=False
        ):
            if row.reason == UNREADABLE or pd.isna(row.reason):
                self.add(None, False, "", "", None, None)
                continue
            detail = record_detail(row.detail)
            hashes = {_personal(detail, "token_sha256")}
            if isinstance(row.token, str):
                hashes.add(token_sha256(row.token))
            self.add(
                str(row.reason),
                detail.get("channel", "push") == "push",
                str(row.tenant_id),
                str(row.notification_id),
                _personal(detail, "recipient_user_id"),
                hashes,
            )

    @classmethod
    def from_store(cls, store: HistoryStore) -> _Trail:
        """The trail of a history on disk: each record's outcome, channel, user and device
        read from its JSON in DuckDB, a batch at a time; the records stay on disk (millions
        at a million deliveries, gigabytes parsed in Python)."""
        trail = cls(None)
        d, decrypted = "d", "json_extract(d, '$.decrypted')"

        def personal(field: str) -> str:
            return f"""CASE WHEN json_type({d}, '$.decrypted') = 'OBJECT'
                AND json_exists({decrypted}, '$."{field}"')
                THEN {json_string(decrypted, field)} ELSE {json_string(d, field)} END"""

        push = json_push_channel(d)
        result = store.sql(
            f"""SELECT reason, {push}, tenant_id, notification_id,
                       {personal("recipient_user_id")}, {personal("token_sha256")},
                       CASE WHEN token IS NOT NULL THEN sha256(token) END
            FROM (SELECT *, {json_object("detail")} AS {d} FROM other WHERE kind = 'audit')"""
        )
        while batch := result.fetchmany(50_000):
            for reason, is_push, tenant, nid, user, digest, token_digest in batch:
                if reason is None or reason == UNREADABLE:
                    trail.add(None, False, "", "", None, None)
                    continue
                trail.add(
                    reason,
                    bool(is_push),
                    key_text(tenant),
                    key_text(nid),
                    user,
                    {digest, token_digest},
                )
        return trail

    def add(
        self,
        outcome: str | None,
        push: bool,
        tenant: str,
        nid: str,
        user: Any,
        hashes: set[Any] | None,
    ) -> None:
        """One record: its outcome (None: unreadable), whether it is the push channel's, and
        the user and device digests it names."""
        if outcome is None:
            self.unreadable += 1
            return
        self.outcomes[outcome] += 1
        if not push:
            # An email or in-app record must not stand in for the push job's own record
            # (same tenant, notification and user).
            return
        if isinstance(user, str):
            self.by_job.setdefault((tenant, nid, user), set()).add(outcome)
        for digest in (hashes or set()) - {None}:
            self.by_device.setdefault((tenant, nid, str(digest)), set()).add(outcome)

    def job(self, tenant: str, nid: str, user: str) -> set[str]:
        return self.by_job.get((tenant, nid, user), set())

    def device(self, tenant: str, nid: str, digest: str) -> set[str]:
        return self.by_device.get((tenant, nid, digest), set())


def _personal(detail: dict[str, Any], field: str) -> Any:
    """A personal field of a record: from what the auditor decrypted of it when the collector
    could open its envelopes, else from the record's top level (a system writing it in clear)."""
    opened = detail.get("decrypted")
    if isinstance(opened, dict) and field in opened:
        return opened[field]
    return detail.get(field)


def record_detail(value: Any) -> dict[str, Any]:
    """An audit row's ``detail`` as a mapping; {} when it is not a JSON object (the audit
    checkers' one reading of it)."""
    if not isinstance(value, str):
        return {}
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


class _Examples:
    """Up to five examples per kind of violation."""

    def __init__(self) -> None:
        self.by_kind: dict[str, list[dict[str, Any]]] = {}

    def add(self, kind: str, **fields: Any) -> None:
        bucket = self.by_kind.setdefault(kind, [])
        if len(bucket) < 5:
            bucket.append(fields)


class _Digests:
    """SHA-256 of tokens, each hashed once."""

    def __init__(self) -> None:
        self._hashes: dict[str, str] = {}

    def __call__(self, token: str) -> str:
        if token not in self._hashes:
            self._hashes[token] = token_sha256(token)
        return self._hashes[token]


def _send_audited(
    trail: _Trail, tenant: Any, nid: Any, token: Any, got_200: bool, digest: _Digests
) -> tuple[bool, bool]:
    """Whether a send has its record ('sent', or for a device that got no 200 the 'retry' of
    its answer), and whether the trail says it was deduplicated later (both engines)."""
    outcomes = trail.device(str(tenant), str(nid), digest(str(token)))
    return "sent" in outcomes or (not got_200 and "retry" in outcomes), "deduped" in outcomes


def _judge_suppressions(
    trail: _Trail,
    suppressions: _Expansion,
    expectation: Expectation,
    digest: _Digests,
    examples: _Examples,
) -> tuple[dict[str, int], int]:
    """Unaudited suppressions by reason, and how far the expansion is from the oracle's counts
    (both engines)."""
    expanded = np.bincount(suppressions.reason, minlength=len(REASONS))
    oracle_mismatch = sum(
        abs(int(expanded[i]) - expectation.suppressed.get(reason, 0))
        for i, reason in enumerate(REASONS)
    )
    unaudited = np.ones(len(suppressions), dtype=bool)
    job_users = {user for _, _, user in trail.by_job}
    digests = {d for _, _, d in trail.by_device}
    if (job_users or digests) and len(suppressions):
        # Only a follower named in the trail, or whose token hashes to a digest in it, can
        # have a record.
        may_have = np.array(
            [
                user in job_users or (isinstance(token, str) and digest(token) in digests)
                for user, token in zip(
                    suppressions.follower_user, suppressions.follower_token, strict=True
                )
            ],
            dtype=bool,
        )
        for i in np.flatnonzero(may_have[suppressions.follower]):
            tenant, nid, user, token, reason = suppressions.row(int(i))
            for_job, for_device = ACCEPTED[reason]
            if trail.job(tenant, nid, user) & for_job or (
                isinstance(token, str) and trail.device(tenant, nid, digest(token)) & for_device
            ):
                unaudited[i] = False
    missing = np.bincount(suppressions.reason[unaudited], minlength=len(REASONS))
    unaudited_suppressions = {r: int(n) for r, n in zip(REASONS, missing, strict=True) if n}
    for i in np.flatnonzero(unaudited)[:5]:
        tenant, nid, user, _, reason = suppressions.row(int(i))
        examples.add(
            "unaudited_suppressions",
            tenant_id=tenant,
            notification_id=nid,
            user_id=user,
            reason=reason,
        )
    return unaudited_suppressions, oracle_mismatch


def _judge_dead_letters(
    trail: _Trail,
    dlq_rows: pd.DataFrame,
    erased: set[tuple[str, str]] | frozenset[tuple[str, str]],
    examples: _Examples,
) -> tuple[int, int]:
    """Jobs parked in a dead-letter queue (the poison queue holds jobs too malformed to name),
    and those without a final record."""
    parked = unaudited_dlq = 0
    for row in dlq_rows.itertuples(index=False):
        detail = record_detail(row.detail)
        if str(detail.get("queue", "")).endswith("-poison"):
            continue
        user = detail.get("recipient_user_id")
        if (str(row.tenant_id), str(user)) in erased:
            continue
        parked += 1
        outcomes = trail.job(str(row.tenant_id), str(row.notification_id), str(user))
        if outcomes - NOT_FINAL:
            continue
        unaudited_dlq += 1
        examples.add(
            "unaudited_dlq",
            tenant_id=str(row.tenant_id),
            notification_id=str(row.notification_id),
            user_id=user,
        )
    return parked, unaudited_dlq


def _verdict(
    trail: _Trail,
    sends: dict[str, int],
    suppressions: int,
    unaudited_suppressions: dict[str, int],
    jobs: int,
    unaudited_enqueues: int,
    parked: int,
    unaudited_dlq: int,
    oracle_mismatch: int,
    examples: _Examples,
    max_unaudited_dlq: int,
    max_lost_sent_records: int,
) -> Verdict:
    counts = {
        "audit_records": sum(trail.outcomes.values()),
        "unreadable_records": trail.unreadable,
        "deliveries": sends["deliveries"],
        "audited_sends": sends["audited_sends"],
        "unaudited_sends": sends["deliveries"] - sends["audited_sends"],
        "sent_records_lost": sends["sent_records_lost"],
        "accepted_then_failed": sends["accepted_then_failed"],
        "suppressions": suppressions,
        "unaudited_suppressions": sum(unaudited_suppressions.values()),
        **{f"unaudited_{r}": n for r, n in sorted(unaudited_suppressions.items())},
        "jobs": jobs,
        "unaudited_enqueues": unaudited_enqueues,
        "parked_jobs": parked,
        "unaudited_dlq": unaudited_dlq,
        "oracle_mismatch": oracle_mismatch,
        **{f"records_{o}": n for o, n in sorted(trail.outcomes.items())},
    }
    valid = (
        counts["unaudited_sends"] == counts["sent_records_lost"]
        and counts["sent_records_lost"] <= max_lost_sent_records
        and not unaudited_suppressions
        and unaudited_enqueues == 0
        and unaudited_dlq <= max_unaudited_dlq
        and oracle_mismatch == 0
        and trail.unreadable == 0
    )
    return Verdict("audit_complete", valid, counts, {"examples": examples.by_kind})


def check(
    expectation: Expectation,
    history: pd.DataFrame,
    population: Population,
    max_unaudited_dlq: int = 0,
    max_lost_sent_records: int = 0,
    changed: set[tuple[str, str]] | frozenset[tuple[str, str]] = frozenset(),
    erased: set[tuple[str, str]] | frozenset[tuple[str, str]] = frozenset(),
) -> Verdict:
    """``changed``: users the run changed (their suppressions have no fixed reason to audit);
    ``erased``: users the run erased, whose records no longer say who they were (by design),
    so their sends, jobs and dead letters cannot be matched and are left out."""
    trail = _Trail(history)
    erased_tokens = {(d.tenant_id, d.token) for key in erased for d in population.devices_of(*key)}
    digest = _Digests()
    examples = _Examples()

    # Deliveries: any 200 for the device needs 'sent'; 'accepted then 5xx' alone needs the
    # record of that answer. One entry per (tenant, notification, token), in first-row order.
    positions = delivery_rows(history)
    (row_keys,) = joint_keys([history], ["tenant_id", "notification_id", "token"])
    keys = row_keys[positions]
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    new_key = np.r_[True, ordered[1:] != ordered[:-1]] if len(keys) else np.zeros(0, bool)
    starts = np.flatnonzero(new_key)
    status = history["status"].iloc[positions]
    is_200 = (status == 200).to_numpy(dtype=bool, na_value=False)
    status_na = status.isna().to_numpy(dtype=bool)
    if status_na.any():
        # A null status before the device's first 200 leaves "did it get a 200?" unknown:
        # fail as testing pd.NA for truth always has, rather than guess.
        group = np.cumsum(new_key) - 1
        seen_200 = np.maximum.accumulate(np.where(is_200[order], np.arange(len(order)), -1))
        if (status_na[order] & (seen_200 < starts[group])).any():
            raise TypeError("boolean value of NA is ambiguous")
    got_200 = np.logical_or.reduceat(is_200[order], starts) if len(keys) else np.zeros(0, bool)
    first = order[starts] if len(keys) else np.zeros(0, np.int64)
    by_first = np.argsort(first, kind="stable")
    first, got_200 = positions[first[by_first]], got_200[by_first]
    if erased_tokens and len(first):
        pairs = zip(history["tenant_id"].iloc[first], history["token"].iloc[first], strict=True)
        keep = np.fromiter(
            ((str(t), str(k)) not in erased_tokens for t, k in pairs), bool, len(first)
        )
        first, got_200 = first[keep], got_200[keep]
    audited = np.zeros(len(first), dtype=bool)
    lost = np.zeros(len(first), dtype=bool)
    digests = {d for _, _, d in trail.by_device}
    if digests and len(first):
        # Only a device whose token hashes to a digest in the trail can have a record.
        tokens = values_at(history, "token", first).to_pylist()
        wanted = [t for t in tokens if digest(str(t) if t is not None else "<NA>") in digests]
        (candidates,) = np.nonzero(rows_with(history, "token", wanted)[first])
        tenants = history["tenant_id"].iloc[first[candidates]].tolist()
        nids = history["notification_id"].iloc[first[candidates]].tolist()
        tokens = history["token"].iloc[first[candidates]].tolist()
        for i, tenant, nid, token in zip(candidates, tenants, nids, tokens, strict=True):
            audited[i], lost[i] = _send_audited(trail, tenant, nid, token, got_200[i], digest)
    sends = {
        "deliveries": len(first),
        "audited_sends": int(audited.sum()),
        "sent_records_lost": int((lost & ~audited).sum()),
        "accepted_then_failed": int((~got_200).sum()),
    }
    for i in np.flatnonzero(~audited)[:5]:
        row = int(first[i])
        examples.add(
            "unaudited_sends",
            tenant_id=str(history["tenant_id"].iloc[row]),
            notification_id=str(history["notification_id"].iloc[row]),
            token=str(history["token"].iloc[row]),
            later_deduped=bool(lost[i]),
        )

    # Suppressions the oracle knows of.
    injected = history[history["kind"] == "inject"]
    suppressions = _Expansion(population, injected, skip=changed)
    unaudited_suppressions, oracle_mismatch = _judge_suppressions(
        trail, suppressions, expectation, digest, examples
    )

    # Every job the fan-out had to create, in sorted order (the keys sort as the tuples do).
    job_columns = ["tenant_id", "notification_id", "user_id"]
    expected_jobs = expectation.deliveries[job_columns]
    if erased:
        mine = [
            (t, u) not in erased
            for t, u in zip(expected_jobs["tenant_id"], expected_jobs["user_id"], strict=True)
        ]
        expected_jobs = expected_jobs[mine]
    suppressed_jobs = suppressions.jobs()
    enqueued_jobs = _enqueued_jobs(trail)
    expected_keys, suppressed_keys, enqueued_keys = joint_keys(
        [expected_jobs, suppressed_jobs, enqueued_jobs], job_columns
    )
    all_keys = np.concatenate([expected_keys, suppressed_keys])
    jobs = sorted_unique(all_keys)
    not_enqueued = jobs[~member(jobs, sorted_unique(enqueued_keys))]
    for row in first_rows(all_keys, not_enqueued[:5]):
        frame, row = (
            (expected_jobs, row)
            if row < len(expected_keys)
            else (suppressed_jobs, row - len(expected_keys))
        )
        tenant, nid, user = (frame[c].iloc[int(row)] for c in job_columns)
        examples.add("unaudited_enqueues", tenant_id=tenant, notification_id=nid, user_id=user)

    parked, unaudited_dlq = _judge_dead_letters(
        trail, history[history["kind"] == "dlq"], erased, examples
    )
    return _verdict(
        trail, sends, int(len(suppressions)), unaudited_suppressions, len(jobs),
        len(not_enqueued), parked, unaudited_dlq, oracle_mismatch, examples,
        max_unaudited_dlq, max_lost_sent_records,
    )  # fmt: skip


def _enqueued_jobs(trail: _Trail) -> pd.DataFrame:
    enqueued = [key for key, outcomes in trail.by_job.items() if "enqueued" in outcomes]
    return pd.DataFrame(
        {
            name: pd.arrays.ArrowExtensionArray(_strings([key[i] for key in enqueued]))
            for i, name in enumerate(["tenant_id", "notification_id", "user_id"])
        }
    )


def check_store(
    store: HistoryStore,
    population: Population,
    max_unaudited_dlq: int = 0,
    max_lost_sent_records: int = 0,
    changed: set[tuple[str, str]] | frozenset[tuple[str, str]] = frozenset(),
    erased: set[tuple[str, str]] | frozenset[tuple[str, str]] = frozenset(),
) -> Verdict:
    """:func:`check` over a history on disk: deliveries per device and the jobs counted in
    DuckDB, the audit trail, suppressions and dead letters judged as in memory."""
    store.require_decided()
    expectation = store.expectation
    trail = _Trail.from_store(store)
    digest = _Digests()
    examples = _Examples()
    erased_tokens = {(d.tenant_id, d.token) for key in erased for d in population.devices_of(*key)}
    store.device_table("audit_erased_devices", erased_tokens)
    # One entry per delivered (tenant, notification, token), shared with the other checkers:
    # its first row, whether any of its deliveries was a 200, and where a null status would
    # leave that unknown.
    sends_table = store.delivered_keys()
    (unknown,) = store.one(
        f"SELECT count(*) FROM {sends_table} WHERE first_null < coalesce(first_200, first_null + 1)"
    )
    if unknown:
        raise TypeError("boolean value of NA is ambiguous")
    n_nid, n_tok = max(store.sizes["nids"], 1), max(store.sizes["tokens"], 1)
    kept = f"""FROM (SELECT *, key // {n_nid * n_tok} AS tenant, (key // {n_tok}) % {n_nid} AS nid,
                     key % {n_tok} AS tok FROM {sends_table}) s
              WHERE NOT EXISTS (SELECT 1 FROM audit_erased_devices d
              WHERE d.tenant = s.tenant AND d.tok = s.tok)"""
    deliveries, accepted_then_failed = store.one(
        f"SELECT count(*), count(*) FILTER (NOT got_200) {kept}"
    )
    digests = sorted({d for _, _, d in trail.by_device})
    store.register("audit_digests", pa.table({"digest": pa.array(digests, pa.string())}))
    decoded = """SELECT s.first_pos, tv.value, nv.value, kv.value, s.got_200 FROM
        ({sends}) s JOIN tenants tv ON tv.code = s.tenant JOIN nids nv ON nv.code = s.nid
        JOIN tokens kv ON kv.code = s.tok ORDER BY s.first_pos"""
    # Only a device whose token hashes to a digest in the trail can have a record: the
    # tokens are hashed once each, and only when the trail has digests.
    candidates = []
    if digests:
        candidates = store.sql(
            decoded.format(
                sends=f"""SELECT * {kept} AND s.tok IN (SELECT code FROM tokens
                WHERE sha256(coalesce(value, '<NA>')) IN (SELECT digest FROM audit_digests))"""
            )
        ).fetchall()
    audited_at: dict[int, tuple[bool, bool]] = {}
    for first_pos, tenant, nid, token, got_200 in candidates:
        audited_at[first_pos] = _send_audited(trail, tenant, nid, token, got_200, digest)
    sends = {
        "deliveries": int(deliveries),
        "audited_sends": sum(a for a, _ in audited_at.values()),
        "sent_records_lost": sum(lost and not a for a, lost in audited_at.values()),
        "accepted_then_failed": int(accepted_then_failed),
    }
    shown = 0
    first = f"SELECT * {kept} ORDER BY first_pos LIMIT {5 + len(audited_at)}"
    for first_pos, tenant, nid, token, _ in store.sql(decoded.format(sends=first)).fetchall():
        audited, lost = audited_at.get(first_pos, (False, False))
        if audited or shown >= 5:
            continue
        shown += 1
        examples.add("unaudited_sends", tenant_id=str(tenant), notification_id=str(nid),
                     token=str(token), later_deduped=bool(lost))  # fmt: skip

    injected = store.rows(["inject"], ["tenant_id", "author_id", "notification_id"])
    suppressions = _Expansion(population, injected, skip=changed)
    unaudited_suppressions, oracle_mismatch = _judge_suppressions(
        trail, suppressions, expectation, digest, examples
    )

    # Every job the fan-out had to create: the expected deliveries' (less erased users') and
    # the suppressed ones', each (tenant, notification, user) once, in sorted order.
    for name, table in suppressions.job_tables().items():
        store.register(f"audit_suppressed_{name}", table)
    store.register(
        "audit_erased_users",
        pa.table(
            {
                "tenant_id": pa.array([t for t, _ in erased], pa.string()),
                "user_id": pa.array([u for _, u in erased], pa.string()),
            }
        ),
    )
    enqueued = _enqueued_jobs(trail)
    store.register(
        "audit_enqueued",
        pa.table({c: pa.array(enqueued[c].tolist(), pa.string()) for c in enqueued.columns}),
    )
    store.run(
        """CREATE OR REPLACE TABLE audit_jobs AS
        SELECT DISTINCT tenant, nid, user_id FROM (
            SELECT e.tenant, e.nid, e.user_id FROM exp e
            WHERE NOT EXISTS (SELECT 1 FROM audit_erased_users x JOIN tenants t
                              ON t.value = x.tenant_id
                              WHERE t.code = e.tenant AND x.user_id = e.user_id)
            UNION ALL
            SELECT t.code, n.code, f.user_id FROM audit_suppressed_rows r
            JOIN audit_suppressed_events v ON v.i = r.event
            JOIN audit_suppressed_followers f ON f.i = r.follower
            JOIN tenants t ON t.value IS NOT DISTINCT FROM v.tenant_id
            JOIN nids n ON n.value IS NOT DISTINCT FROM v.notification_id)"""
    )
    not_enqueued_jobs = """FROM audit_jobs j WHERE NOT EXISTS (
            SELECT 1 FROM audit_enqueued q JOIN tenants t ON t.value = q.tenant_id
            JOIN nids n ON n.value = q.notification_id
            WHERE t.code = j.tenant AND n.code = j.nid AND q.user_id IS NOT DISTINCT FROM j.user_id)"""
    jobs, not_enqueued = store.one(
        f"SELECT (SELECT count(*) FROM audit_jobs), (SELECT count(*) {not_enqueued_jobs})"
    )
    for tenant, nid, user in store.sql(
        f"""SELECT tv.value, nv.value, j.user_id FROM (SELECT j.* {not_enqueued_jobs}
        ORDER BY j.tenant, j.nid, j.user_id NULLS LAST LIMIT 5) j
        JOIN tenants tv ON tv.code = j.tenant JOIN nids nv ON nv.code = j.nid
        ORDER BY j.tenant, j.nid, j.user_id NULLS LAST"""
    ).fetchall():
        examples.add("unaudited_enqueues", tenant_id=tenant, notification_id=nid, user_id=user)

    dlq_rows = store.rows(["dlq"], ["tenant_id", "notification_id", "detail"])
    parked, unaudited_dlq = _judge_dead_letters(trail, dlq_rows, erased, examples)
    return _verdict(
        trail, sends, int(len(suppressions)), unaudited_suppressions, int(jobs),
        int(not_enqueued), parked, unaudited_dlq, oracle_mismatch, examples,
        max_unaudited_dlq, max_lost_sent_records,
    )  # fmt: skip


@checker(
    "audit_complete",
    summary="every delivery, suppression, job and dead letter has its audit record",
    tolerances={"max_unaudited_dlq": 0, "max_lost_sent_records": 0},
    needs=("audit_trail",),
    out_of_core=True,
)
def probe(evidence: Evidence, tolerance: Mapping[str, Any]) -> Verdict:
    if evidence.store is not None:
        return check_store(
            evidence.store,
            evidence.population,
            max_unaudited_dlq=int(tolerance["max_unaudited_dlq"]),
            max_lost_sent_records=int(tolerance["max_lost_sent_records"]),
            changed=evidence.timeline.changed_users() if evidence.timeline else frozenset(),
            erased=set(evidence.timeline.erasures) if evidence.timeline else frozenset(),
        )
    return check(
        evidence.expectation,
        evidence.history,
        evidence.population,
        max_unaudited_dlq=int(tolerance["max_unaudited_dlq"]),
        max_lost_sent_records=int(tolerance["max_lost_sent_records"]),
        changed=evidence.timeline.changed_users() if evidence.timeline else frozenset(),
        erased=set(evidence.timeline.erasures) if evidence.timeline else frozenset(),
    )
