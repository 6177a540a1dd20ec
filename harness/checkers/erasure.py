"""GDPR erasure, checked from outside (seed 000: "Right-to-erasure purges ... the dedup keys, the
preference cache, and the audit log").

The run erases some users mid-run (retrying an erasure the system could not finish, for example
while its dedup store is cut), reads their inbox, registers them again with the same id and
device, follows the same authors, and posts again an event they had received before the erasure
(same id, same content: an idempotent retry to the system). Then:

* ``delivered_after_erasure``: no delivery to an erased user's devices once the erasure was
  acknowledged (``bound_s`` after it), until they registered again;
* ``inbox_items_after_erasure`` / ``unread_after_erasure``: their inbox reads come back empty;
* ``read_state_survived``: the erased person had read items (one by one, then all); once
  registered again, before the new person marks anything read, no item on their inbox pages
  may show as read (a per-item mark or a read-all watermark the erasure left would);
* ``reused_id_lost``: the event posted again reaches the person registered again (a dedup key
  that survived the erasure would suppress it: the system remembered the old person);
  ``reused_id_duplicated``: and only once; the same on the consent-bearing channels for a probe
  that is a mention (``reused_id_channel_lost`` / ``_duplicated``: the email and SMS the oracle
  expects the new person to get, from the channel ledgers; red team 3: an erasure that purged
  only the push keys passed while the probes were push-only posts). In-app is left out: it
  needs no consent, so a first probe's in-app job retried after the erasure may reach the
  connection before the new registration, which no erasure can prevent;
* the audit trail, when the system has one: it is WORM (Object Lock), so its records stay, but
  ``personal_ids_in_clear`` (the erased user's id, a token or its hash, in clear in any stored
  record of their tenant) and ``records_still_readable`` (a record from before the erasure that
  the auditor's keys still open to name them) must both be 0;
* ``erasures_unfinished``: every erasure the run asked for was acknowledged in the end.

Deliveries to the re-registered devices are judged here from the registration on (the same ids,
a new person in law); the ``effectively_once`` checker leaves them out.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from typing import Any

import pandas as pd

from harness.checkers.audit_personal import readable_personal_ids
from harness.checkers.evidence import Evidence
from harness.checkers.preference_changes import judge_deliveries
from harness.checkers.registry import checker
from harness.checkers.verdict import Verdict
from harness.checkers.windows import delivery_rows
from harness.model.oracle import expected_channel_deliveries

EXAMPLES = 5


def posted_again(injected: pd.DataFrame, tenant: str, since: float) -> pd.DataFrame:
    """The ``injected`` rows of ``tenant`` sent from ``since`` on whose notification id was
    already posted before it: the ids re-used after a person registered again."""
    of_tenant = injected["tenant_id"] == tenant
    earlier = set(injected.loc[of_tenant & (injected["time"] < since), "notification_id"])
    return injected[
        of_tenant & (injected["time"] >= since) & injected["notification_id"].isin(earlier)
    ]


def _reads_after_erasure(evidence: Evidence) -> tuple[int, int, int]:
    """(reads judged, inbox items seen, non-zero unread counts) of erased users between their
    erasure's acknowledgement and their registration again."""
    timeline = evidence.timeline
    assert timeline is not None
    history = evidence.history
    rows = history[(history["kind"] == "read") & (history["status"] == 200)]
    judged = items = unread = 0
    for row in rows.itertuples(index=False):
        key = (str(row.tenant_id), str(row.user_id))
        erasure = timeline.erasures.get(key)
        # Reads see the tables, not a send in flight: empty from the acknowledgement on.
        if erasure is None or float(row.time) <= erasure.acked:
            continue
        registration = timeline.registrations.get(key)
        if registration is not None and float(row.time) >= registration.sent:
            continue
        detail = json.loads(row.detail) if isinstance(row.detail, str) else {}
        if row.reason == "page":
            judged += 1
            items += len(detail.get("ids") or [])
        elif row.reason == "unread":
            judged += 1
            unread += int(bool(detail.get("unread")))
    return judged, items, unread


def _read_state_after_registration(evidence: Evidence) -> tuple[int, int, int]:
    """(inbox pages judged, items on them, items shown read) of users registered again, read
    after their registration and before they themselves marked anything read: the person
    registered again has read nothing, so an item shown read is the erased person's read
    state (a per-item mark, a read-all watermark) that the erasure left behind."""
    timeline = evidence.timeline
    assert timeline is not None
    history = evidence.history
    reads = history[(history["kind"] == "read") & (history["status"] == 200)]
    pages = items = shown_read = 0
    for (tenant, user), registration in timeline.registrations.items():
        theirs = reads[
            (reads["tenant_id"] == tenant)
            & (reads["user_id"] == user)
            & (reads["time"] >= registration.sent)
        ]
        marks = theirs.loc[theirs["reason"].isin(("mark_read", "read_all")), "time"]
        first_mark = float(marks.min()) if not marks.empty else float("inf")
        for row in theirs[theirs["reason"] == "page"].itertuples(index=False):
            if float(row.time) >= first_mark:
                continue
            detail = json.loads(row.detail) if isinstance(row.detail, str) else {}
            flags = [bool(f) for f in detail.get("read") or []]
            pages += 1
            items += len(flags)
            shown_read += sum(flags)
    return pages, items, shown_read


def _reused_ids(evidence: Evidence) -> tuple[int, int, int, list[dict[str, Any]]]:
    """(required, lost, duplicated, examples) for events posted again after a registration."""
    timeline = evidence.timeline
    assert timeline is not None
    history = evidence.history
    injected = history[history["kind"] == "inject"]
    got = history.iloc[delivery_rows(history)]
    required = lost = duplicated = 0
    examples: list[dict[str, Any]] = []
    for (tenant, user), registration in timeline.registrations.items():
        devices = evidence.population.devices_of(tenant, user)
        again = posted_again(injected, tenant, registration.sent)
        mine = got[(got["tenant_id"] == tenant) & (got["time"] >= registration.sent)]
        for event in again.itertuples(index=False):
            author = (tenant, str(event.author_id))
            for device in devices:
                states = timeline.seen_from(tenant, user, float(event.time))
                decisions = {timeline.decision(s, author, device, float(event.time))[0]
                             for s in states}  # fmt: skip
                if decisions - {"deliver", "defer"}:
                    continue
                required += 1
                n = int(
                    (
                        (mine["notification_id"] == event.notification_id)
                        & (mine["token"] == device.token)
                    ).sum()
                )
                lost += n == 0
                duplicated += max(0, n - 1)
                if n != 1 and len(examples) < EXAMPLES:
                    examples.append({"tenant_id": tenant, "user_id": user,
                                     "notification_id": str(event.notification_id),
                                     "deliveries": n})  # fmt: skip
    return required, lost, duplicated, examples


CONSENT_CHANNELS = ("email", "sms")


def _reused_channel_ids(evidence: Evidence) -> tuple[int, int, int, list[dict[str, Any]]]:
    """(required, lost, duplicated, examples) on email and SMS for events posted again after a
    registration: each (notification, address or number) the oracle expects for the person
    registered again, delivered exactly once from the registration on."""
    timeline = evidence.timeline
    assert timeline is not None
    history = evidence.history
    injected = history[history["kind"] == "inject"]
    channel = history[(history["kind"] == "channel") & history["delivered"].fillna(False)]
    channels_by_kind = evidence.policy.channels_by_kind
    required = lost = duplicated = 0
    examples: list[dict[str, Any]] = []
    for (tenant, user), registration in timeline.registrations.items():
        try:
            person = evidence.population.user(tenant, user)
        except KeyError:
            continue
        tokens = {t for t in (person.email, person.phone) if t}
        again = posted_again(injected, tenant, registration.sent)
        if again.empty or not tokens:
            continue
        wanted = expected_channel_deliveries(evidence.population, again, channels_by_kind)
        wanted = wanted[
            (wanted["tenant_id"] == tenant)
            & wanted["token"].isin(tokens)
            & wanted["channel"].isin(CONSENT_CHANNELS)
        ].drop_duplicates(["notification_id", "token"])
        mine = channel[(channel["tenant_id"] == tenant) & (channel["time"] >= registration.sent)]
        for nid, token in wanted[["notification_id", "token"]].itertuples(index=False):
            required += 1
            n = int(((mine["notification_id"] == nid) & (mine["token"] == token)).sum())
            lost += n == 0
            duplicated += max(0, n - 1)
            if n != 1 and len(examples) < EXAMPLES:
                examples.append({"tenant_id": tenant, "user_id": user, "notification_id": nid,
                                 "channel_deliveries": n})  # fmt: skip
    return required, lost, duplicated, examples


def _trail(evidence: Evidence) -> dict[str, int] | None:
    """What the audit trail still says of erased users; None without a trail."""
    timeline = evidence.timeline
    assert timeline is not None
    history = evidence.history
    audit = history[history["kind"] == "audit"]
    if audit.empty:
        return None
    tokens = {
        key: {d.token for d in evidence.population.devices_of(*key)} for key in timeline.erasures
    }
    in_clear = readable_personal_ids(history, set(timeline.erasures), tokens)
    readable = 0
    for row in audit[audit["tenant_id"].isin({t for t, _ in timeline.erasures})].itertuples(
        index=False
    ):
        detail = json.loads(row.detail) if isinstance(row.detail, str) else {}
        opened = detail.get("decrypted") if isinstance(detail, dict) else None
        if not isinstance(opened, dict):
            continue
        for field in ("recipient_user_id", "author_id"):
            erasure = timeline.erasures.get((str(row.tenant_id), str(opened.get(field))))
            if erasure is not None and float(row.time) < erasure.sent:
                readable += 1
                break
    return {"personal_ids_in_clear": len(in_clear), "records_still_readable": readable}


def check(evidence: Evidence) -> Verdict:
    timeline = evidence.timeline
    if timeline is None or not timeline.erasures:
        return Verdict("erasure", True, {"erasures": 0})
    history = evidence.history
    asked = history[history["kind"] == "change"]
    attempts: Counter[tuple[str, str]] = Counter()
    finished: set[tuple[str, str]] = set()
    for row in asked.itertuples(index=False):
        detail = json.loads(row.detail) if isinstance(row.detail, str) else {}
        if detail.get("change") != "erasure":
            continue
        key = (str(row.tenant_id), str(row.user_id))
        attempts[key] += 1
        if detail.get("ok") is not False and pd.notna(row.end):
            finished.add(key)
    violations, examples, judged = judge_deliveries(evidence, set(timeline.erasures))
    reads, items, unread = _reads_after_erasure(evidence)
    new_pages, new_items, survived = _read_state_after_registration(evidence)
    required, lost, duplicated, reuse_examples = _reused_ids(evidence)
    channel_required, channel_lost, channel_duplicated, channel_examples = _reused_channel_ids(
        evidence
    )
    reuse_examples += channel_examples
    trail = _trail(evidence)
    counts = {
        **(trail or {}),
        "erasures": len(attempts),
        "erasure_attempts": sum(attempts.values()),
        "erasures_unfinished": len(set(attempts) - finished),
        "registered_again": len(timeline.registrations),
        "deliveries_judged": judged,
        "delivered_after_erasure": sum(violations.values()),
        "reads_after_erasure": reads,
        "inbox_items_after_erasure": items,
        "unread_after_erasure": unread,
        "pages_after_registration": new_pages,
        "items_after_registration": new_items,
        "read_state_survived": survived,
        "reused_id_required": required,
        "reused_id_lost": lost,
        "reused_id_duplicated": duplicated,
        "reused_id_channel_required": channel_required,
        "reused_id_channel_lost": channel_lost,
        "reused_id_channel_duplicated": channel_duplicated,
    }
    valid = (
        not violations
        and items == 0
        and unread == 0
        and survived == 0
        and lost == 0
        and duplicated == 0
        and channel_lost == 0
        and channel_duplicated == 0
        and counts["erasures_unfinished"] == 0
        and not any((trail or {}).values())
    )
    details = {"bound_s": timeline.bound_s, "examples": examples, "reuse_examples": reuse_examples}
    return Verdict("erasure", valid, counts, details)


@checker(
    "erasure",
    summary="nothing of an erased user survives: no delivery, an empty inbox, no read state, no dedup key",
    needs=("erase_user",),
    # With the history on disk these kinds come as a frame (see registry.in_memory_for).
    reads=("inject", "inject_info", "read", "change", "audit", "provider", "channel"),
)
def probe(evidence: Evidence, tolerance: Mapping[str, Any]) -> Verdict:
    return check(evidence)
