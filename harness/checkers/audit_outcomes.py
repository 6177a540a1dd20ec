"""Audit outcomes the providers can back (seed 000: the trail proves why each device was or was
not reached; NIST AU-3: a record says what happened, not what was hoped).

``audit_complete`` asks whether every send and suppression has a record; this asks whether a
``sent`` record claims more than happened. Per (tenant, notification, device), the push
``sent`` records in the trail may not outnumber the acceptances the oracle saw for it:

* a request the provider answered 200 (its ledger: the system sends straight to APNs or FCM);
* a Publish SNS accepted for that device (its own ledger, ``sns_publish`` rows without an
  error: through SNS, 'sent' means the publish was accepted).

A system that writes ``sent`` before it knows the answer (a 429, a 5xx, a timeout, later
retried) leaves more ``sent`` records than acceptances: ``sent_beyond_acceptance``. A ``sent``
record also says *when* (``at``, NIST AU-3): it cannot be stamped before the first request for
its device left (the provider's or SNS's receive time, ``clock_slack_s`` aside; one machine,
one clock): ``sent_before_request`` counts the devices whose first ``sent`` record is (red team
3: a trail stamped with the event's acceptance time, not the attempt's, passed every checker). Devices
are matched as ``audit_complete`` matches them (``token_sha256``, from the fields the
collector decrypted when it could open the record). A record the collector could not tie to a
device (an erased user's) is not judged; identical records (a batch stored twice) count once.

With the history on disk (``Evidence.store``) the trail is read as in memory (it is the audit
rows only) and the acceptances are counted in DuckDB, only for the devices the trail names: the
provider rows are never read into memory. Both paths count through the same functions.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd
import pyarrow as pa

from harness.checkers.audit_complete import record_detail, token_sha256
from harness.checkers.evidence import Evidence
from harness.checkers.json_fields import json_object, json_push_channel, json_string, key_text
from harness.checkers.registry import checker
from harness.checkers.store import HistoryStore
from harness.checkers.verdict import Verdict

EXAMPLES = 5
PUSH_PROVIDERS = ("apns", "fcm")
Key = tuple[str, str, str]  # tenant, notification, token SHA-256


def _device_of(detail: dict[str, Any], token: Any) -> str | None:
    """The record's device digest: decrypted, else in clear, else from a token in clear."""
    opened = detail.get("decrypted")
    if isinstance(opened, dict) and isinstance(opened.get("token_sha256"), str):
        return str(opened["token_sha256"])
    if isinstance(detail.get("token_sha256"), str):
        return str(detail["token_sha256"])
    return token_sha256(token) if isinstance(token, str) else None


def sent_records(history: pd.DataFrame) -> Counter[Key]:
    """Push ``sent`` records per device key, identical records once."""
    rows = history[(history["kind"] == "audit") & (history["reason"] == "sent")]
    rows = rows[["tenant_id", "notification_id", "token", "detail"]].drop_duplicates()
    out: Counter[Key] = Counter()
    for row in rows.itertuples(index=False):
        detail = record_detail(row.detail)
        if detail.get("channel", "push") != "push":
            continue
        device = _device_of(detail, row.token)
        if device is not None:
            out[(str(row.tenant_id), str(row.notification_id), device)] += 1
    return out


def first_sent(history: pd.DataFrame) -> dict[Key, float]:
    """Per device key, the time of its earliest push ``sent`` record."""
    rows = history[(history["kind"] == "audit") & (history["reason"] == "sent")]
    out: dict[Key, float] = {}
    for row in rows[["tenant_id", "notification_id", "token", "detail", "time"]].itertuples(
        index=False
    ):
        detail = record_detail(row.detail)
        if detail.get("channel", "push") != "push" or pd.isna(row.time):
            continue
        device = _device_of(detail, row.token)
        if device is not None:
            key = (str(row.tenant_id), str(row.notification_id), device)
            out[key] = min(out.get(key, float(row.time)), float(row.time))
    return out


def first_requests(history: pd.DataFrame) -> dict[Key, float]:
    """Per device key, when the first request for it reached APNs or FCM, or SNS (a publish,
    accepted or not): the earliest instant a send could have been known to happen."""
    provider = history[(history["kind"] == "provider") & history["provider"].isin(PUSH_PROVIDERS)]
    published = history[history["kind"] == "sns_publish"]
    return earliest_per_device(
        row
        for frame in (provider, published)
        for row in frame[["tenant_id", "notification_id", "token", "time"]].itertuples(
            index=False, name=None
        )
    )


def earliest_per_device(rows: Iterable[tuple[Any, Any, Any, Any]]) -> dict[Key, float]:
    """(tenant, notification, token, time): the earliest time per device key (both engines)."""
    out: dict[Key, float] = {}
    digests: dict[str, str] = {}
    for tenant, nid, token, at in rows:
        if not isinstance(token, str) or at is None or pd.isna(at):
            continue
        if token not in digests:
            digests[token] = token_sha256(token)
        key = (str(tenant), str(nid), digests[token])
        out[key] = min(out.get(key, float(at)), float(at))
    return out


def acceptances(history: pd.DataFrame) -> Counter[Key]:
    """Per device key: requests a push provider answered 200, plus publishes SNS accepted."""
    provider = history[
        (history["kind"] == "provider")
        & history["provider"].isin(PUSH_PROVIDERS)
        & (history["status"] == 200).fillna(False).astype(bool)
    ]
    published = history[(history["kind"] == "sns_publish") & history["reason"].isna()]
    return per_device(
        (tenant, nid, token, 1)
        for frame in (provider, published)
        for tenant, nid, token in frame[["tenant_id", "notification_id", "token"]].itertuples(
            index=False, name=None
        )
    )


def per_device(rows: Iterable[tuple[Any, Any, Any, int]]) -> Counter[Key]:
    """(tenant, notification, token, how many) summed per device key; a token that is not a
    string names no device (both engines count through this)."""
    out: Counter[Key] = Counter()
    digests: dict[str, str] = {}
    for tenant, nid, token, n in rows:
        if not isinstance(token, str):
            continue
        if token not in digests:
            digests[token] = token_sha256(token)
        out[(str(tenant), str(nid), digests[token])] += int(n)
    return out


def acceptances_in_store(store: HistoryStore, digests: Iterable[str]) -> Counter[Key]:
    """:func:`acceptances` over a history on disk, for the devices whose token hashes to one
    of ``digests`` only (no other key can meet a ``sent`` record): the provider's 200s counted
    per key in DuckDB, then the tokens of the few keys left hashed as in memory."""
    wanted = sorted(set(digests))
    if not wanted:
        return Counter()
    store.register("outcomes_digests", pa.table({"digest": pa.array(wanted, pa.string())}))
    providers = ", ".join(f"'{p}'" for p in PUSH_PROVIDERS)
    found = store.frame(
        f"""WITH named AS (
            SELECT code, value FROM tokens
            WHERE value IS NOT NULL AND sha256(value) IN (SELECT digest FROM outcomes_digests)),
        published AS (
            SELECT tenant_id, notification_id, token FROM other
            WHERE kind = 'sns_publish' AND reason IS NULL AND token IS NOT NULL)
        SELECT tv.value AS tenant_id, nv.value AS notification_id, k.value AS token, p.n
        FROM (SELECT tenant, nid, tok, count(*) AS n FROM prov
              WHERE provider IN ({providers}) AND status = 200
                AND tok IN (SELECT code FROM named)
              GROUP BY tenant, nid, tok) p
        JOIN named k ON k.code = p.tok
        JOIN tenants tv ON tv.code = p.tenant
        JOIN nids nv ON nv.code = p.nid
        UNION ALL
        SELECT tenant_id, notification_id, token, count(*) FROM published
        WHERE token IN (SELECT DISTINCT token FROM published
                        WHERE sha256(token) IN (SELECT digest FROM outcomes_digests))
        GROUP BY tenant_id, notification_id, token"""
    )
    # Strings as the history frame holds them (a missing tenant reads <NA> in both paths).
    keys = found[["tenant_id", "notification_id", "token"]].astype("string")
    return per_device(
        zip(keys["tenant_id"], keys["notification_id"], keys["token"], found["n"], strict=True)
    )


def judge(
    sent: Counter[Key],
    accepted: Counter[Key],
    sent_at: Mapping[Key, float] | None = None,
    requested_at: Mapping[Key, float] | None = None,
    clock_slack_s: float = 0.05,
) -> tuple[dict[str, int], list[dict]]:
    """Counts and examples: every key whose ``sent`` records outnumber its acceptances, and
    every key whose first ``sent`` record is stamped before its first request left."""
    over = {key: n - accepted.get(key, 0) for key, n in sent.items() if n > accepted.get(key, 0)}
    sent_at, requested_at = sent_at or {}, requested_at or {}
    early = sorted(
        key
        for key, at in sent_at.items()
        if key in requested_at and at < requested_at[key] - clock_slack_s
    )
    counts = {
        "sent_records": sum(sent.values()),
        "devices_judged": len(sent),
        "sent_beyond_acceptance": sum(over.values()),
        "devices_over": len(over),
        "sent_before_request": len(early),
    }
    examples = [
        {"tenant_id": t, "notification_id": n, "token_sha256": d, "sent": sent[(t, n, d)],
         "accepted": accepted.get((t, n, d), 0)}
        for (t, n, d) in sorted(over)[:EXAMPLES]
    ]  # fmt: skip
    examples += [
        {"tenant_id": t, "notification_id": n, "token_sha256": d,
         "sent_at": sent_at[(t, n, d)], "first_request_at": requested_at[(t, n, d)]}
        for (t, n, d) in early[:EXAMPLES]
    ]  # fmt: skip
    return counts, examples


def check(history: pd.DataFrame, clock_slack_s: float = 0.05) -> Verdict:
    return _verdict(
        *judge(
            sent_records(history),
            acceptances(history),
            first_sent(history),
            first_requests(history),
            clock_slack_s,
        )
    )


def check_store(store: HistoryStore, clock_slack_s: float = 0.05) -> Verdict:
    """:func:`check` over a history on disk: the push ``sent`` records' keys, and the
    acceptances and first requests of the devices they name, counted in DuckDB."""
    sent, sent_at = sent_in_store(store)
    digests = {device for _, _, device in sent}
    accepted = acceptances_in_store(store, digests)
    requested = first_requests_in_store(store, digests)
    return _verdict(*judge(sent, accepted, sent_at, requested, clock_slack_s))


def sent_in_store(store: HistoryStore) -> tuple[Counter[Key], dict[Key, float]]:
    """:func:`sent_records` and :func:`first_sent` over a history on disk: the device of each
    push ``sent`` record read from its JSON in DuckDB, so that only keys come back (the
    records, millions at a million deliveries, stay on disk)."""
    d = "d"
    decrypted = f"json_extract({d}, '$.decrypted')"
    device = f"""coalesce(
        CASE WHEN json_type({d}, '$.decrypted') = 'OBJECT'
             THEN {json_string(decrypted, "token_sha256")} END,
        {json_string(d, "token_sha256")},
        sha256(token))"""
    push = json_push_channel(d)
    sent = "SELECT * FROM other WHERE kind = 'audit' AND reason = 'sent'"
    records = f"""SELECT tenant_id, notification_id, {device} AS device, {push} AS push, time
        FROM (SELECT *, {json_object("detail")} AS {d} FROM ({{rows}}))"""
    counted: Counter[Key] = Counter()
    for tenant, nid, digest, n in store.sql(
        f"""SELECT tenant_id, notification_id, device, count(*) FROM ({
            records.format(
                rows=f"SELECT DISTINCT tenant_id, notification_id, token, detail, NULL AS time "
                f"FROM ({sent})"
            )
        }) WHERE push AND device IS NOT NULL GROUP BY ALL"""
    ).fetchall():
        counted[(key_text(tenant), key_text(nid), digest)] += int(n)
    earliest: dict[Key, float] = {
        (key_text(tenant), key_text(nid), digest): float(at)
        for tenant, nid, digest, at in store.sql(
            f"""SELECT tenant_id, notification_id, device, min(time) FROM ({
                records.format(rows=sent)
            }) WHERE push AND device IS NOT NULL AND time IS NOT NULL GROUP BY ALL"""
        ).fetchall()
    }
    return counted, earliest


def first_requests_in_store(store: HistoryStore, digests: Iterable[str]) -> dict[Key, float]:
    """:func:`first_requests` over a history on disk, for the devices whose token hashes to
    one of ``digests`` only."""
    wanted = sorted(set(digests))
    if not wanted:
        return {}
    store.register("requests_digests", pa.table({"digest": pa.array(wanted, pa.string())}))
    providers = ", ".join(f"'{p}'" for p in PUSH_PROVIDERS)
    found = store.frame(
        f"""WITH named AS (
            SELECT code, value FROM tokens
            WHERE value IS NOT NULL AND sha256(value) IN (SELECT digest FROM requests_digests))
        SELECT tv.value AS tenant_id, nv.value AS notification_id, k.value AS token,
               min(p.time) AS at
        FROM prov p
        JOIN named k ON k.code = p.tok
        JOIN tenants tv ON tv.code = p.tenant
        JOIN nids nv ON nv.code = p.nid
        WHERE p.provider IN ({providers})
        GROUP BY tv.value, nv.value, k.value
        UNION ALL
        SELECT tenant_id, notification_id, token, min(time) FROM other
        WHERE kind = 'sns_publish' AND token IS NOT NULL
          AND sha256(token) IN (SELECT digest FROM requests_digests)
        GROUP BY tenant_id, notification_id, token"""
    )
    keys = found[["tenant_id", "notification_id", "token"]].astype("string")
    return earliest_per_device(
        zip(keys["tenant_id"], keys["notification_id"], keys["token"], found["at"], strict=True)
    )


def _verdict(counts: dict[str, int], examples: list[dict]) -> Verdict:
    valid = counts["sent_beyond_acceptance"] == 0 and counts["sent_before_request"] == 0
    return Verdict("audit_outcomes", valid, counts, {"examples": examples})


@checker(
    "audit_outcomes",
    summary="no more 'sent' records per device than the provider (or SNS) accepted sends, "
    "none stamped before its first request",
    tolerances={"clock_slack_s": 0.05},
    needs=("audit_trail",),
    out_of_core=True,
)
def probe(evidence: Evidence, tolerance: Mapping[str, Any]) -> Verdict:
    slack = float(tolerance["clock_slack_s"])
    if evidence.store is not None:
        return check_store(evidence.store, slack)
    return check(evidence.history, slack)
