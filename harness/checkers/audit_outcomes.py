"""Audit outcomes the providers can back (seed 000: the trail proves why each device was or was
not reached; NIST AU-3: a record says what happened, not what was hoped).

``audit_complete`` asks whether every send and suppression has a record; this asks whether a
``sent`` record claims more than happened. Per (tenant, notification, device), the push
``sent`` records in the trail may not outnumber the acceptances the oracle saw for it:

* a request the provider answered 200 (its ledger: the system sends straight to APNs or FCM);
* a Publish SNS accepted for that device (its own ledger, ``sns_publish`` rows without an
  error: through SNS, 'sent' means the publish was accepted).

A system that writes ``sent`` before it knows the answer (a 429, a 5xx, a timeout, later
retried) leaves more ``sent`` records than acceptances: ``sent_beyond_acceptance``. Devices
are matched as ``audit_complete`` matches them (``token_sha256``, from the fields the
collector decrypted when it could open the record). A record the collector could not tie to a
device (an erased user's) is not judged; identical records (a batch stored twice) count once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

import pandas as pd

from harness.checkers.audit_complete import record_detail, token_sha256
from harness.checkers.evidence import Evidence
from harness.checkers.registry import checker
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


def acceptances(history: pd.DataFrame) -> Counter[Key]:
    """Per device key: requests a push provider answered 200, plus publishes SNS accepted."""
    provider = history[
        (history["kind"] == "provider")
        & history["provider"].isin(PUSH_PROVIDERS)
        & (history["status"] == 200).fillna(False).astype(bool)
    ]
    published = history[(history["kind"] == "sns_publish") & history["reason"].isna()]
    out: Counter[Key] = Counter()
    digests: dict[str, str] = {}
    for frame in (provider, published):
        for tenant, nid, token in frame[["tenant_id", "notification_id", "token"]].itertuples(
            index=False, name=None
        ):
            if not isinstance(token, str):
                continue
            if token not in digests:
                digests[token] = token_sha256(token)
            out[(str(tenant), str(nid), digests[token])] += 1
    return out


def judge(sent: Counter[Key], accepted: Counter[Key]) -> tuple[dict[str, int], list[dict]]:
    """Counts and examples: every key whose ``sent`` records outnumber its acceptances."""
    over = {key: n - accepted.get(key, 0) for key, n in sent.items() if n > accepted.get(key, 0)}
    counts = {
        "sent_records": sum(sent.values()),
        "devices_judged": len(sent),
        "sent_beyond_acceptance": sum(over.values()),
        "devices_over": len(over),
    }
    examples = [
        {"tenant_id": t, "notification_id": n, "token_sha256": d, "sent": sent[(t, n, d)],
         "accepted": accepted.get((t, n, d), 0)}
        for (t, n, d) in sorted(over)[:EXAMPLES]
    ]  # fmt: skip
    return counts, examples


def check(history: pd.DataFrame) -> Verdict:
    counts, examples = judge(sent_records(history), acceptances(history))
    return Verdict(
        "audit_outcomes", counts["sent_beyond_acceptance"] == 0, counts, {"examples": examples}
    )


@checker(
    "audit_outcomes",
    summary="no more 'sent' records per device than the provider (or SNS) accepted sends",
    needs=("audit_trail",),
)
def probe(evidence: Evidence, tolerance: Mapping[str, Any]) -> Verdict:
    return check(evidence.history)
