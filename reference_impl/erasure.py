"""GDPR erasure (Art. 17): ``DELETE /v1/tenants/{tenant}/users/{user}``.

Purges the user's inbox rows, read state, preferences, devices, follow edges, cache entries and
the dedup keys of every push, email, in-app and SMS message the user could have been sent. Dedup
keys are hashes of (tenant, notification, recipient), so no index is needed to find them: the
user's own inbox (with the followed celebrities' posts merged in, 90 days, longer than the keys'
30) names every notification, the user's record (preferences and devices in one item) every
device and the email address and phone number (an address or number changed within the last 30
days leaves the old one's keys to expire on their TTL).

Order matters for a retry: the keys are computed first (they need the inbox and devices), the
Redis keys go next (a Redis error stops the erasure before anything else is gone, so a retry
computes the same keys again), and the DynamoDB rows last (deleting them twice is harmless).

The audit trail cannot be deleted (Object Lock, COMPLIANCE): erasure reaches it by destroying the
user's audit data key (:mod:`reference_impl.audit_keys`), the first of the DynamoDB rows to go,
so that jobs still in flight stop naming the user as soon as the dedup keys are gone. Nothing
the dedup keys need comes from it, and deleting it again is harmless: a retried erasure ends
with the key gone too.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from reference_impl.audit_keys import AuditKeys
from reference_impl.aws import batch_write, client
from reference_impl.config import Config
from reference_impl.dedup_key import dedup_key, email_recipient, inapp_recipient, sms_recipient
from reference_impl.ids import preferences_cache_key, user_key
from reference_impl.inbox import Inbox
from reference_impl.user_record import devices_of, preferences_of

MAX_INBOX_PAGES = 10_000  # bounded: 100 per page, a million notifications


def _query_all(ddb: Any, table: str, pk: str) -> Iterator[dict[str, Any]]:
    start: dict[str, Any] | None = None
    while True:
        kwargs: dict[str, Any] = {
            "TableName": table,
            "KeyConditionExpression": "pk = :pk",
            "ExpressionAttributeValues": {":pk": {"S": pk}},
            "ConsistentRead": True,
        }
        if start:
            kwargs["ExclusiveStartKey"] = start
        response = ddb.query(**kwargs)
        yield from response.get("Items", [])
        start = response.get("LastEvaluatedKey")
        if not start:
            return


def notification_ids(inbox: Inbox, tenant: str, user: str) -> list[str]:
    """Every notification in the user's merged inbox, newest first."""
    ids: list[str] = []
    cursor = None
    for _ in range(MAX_INBOX_PAGES):
        page = inbox.page(tenant, user, 100, cursor)
        ids += [item["notification_id"] for item in page["items"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    return ids


def user_dedup_keys(
    tenant: str, user: str, notifications: list[str], device_ids: list[str]
) -> list[str]:
    """The dedup keys the consumer would have set for this user (see push_consumer)."""
    return [dedup_key(tenant, n, f"{user}#{d}") for n in notifications for d in device_ids]


def channel_dedup_keys(
    tenant: str, user: str, notifications: list[str], email: str | None, phone: str | None = None
) -> list[str]:
    """The keys the email, in-app and SMS consumers would have set (see channel_consumer)."""
    recipients = [inapp_recipient(user)] + ([email_recipient(user, email)] if email else [])
    recipients += [sms_recipient(user, phone)] if phone else []
    return [dedup_key(tenant, n, r) for n in notifications for r in recipients]


def _email_of(prefs: dict[str, Any] | None) -> str | None:
    email = prefs.get("email") if isinstance(prefs, dict) else None
    return email if isinstance(email, str) and email else None


def _phone_of(prefs: dict[str, Any] | None) -> str | None:
    phone = prefs.get("phone") if isinstance(prefs, dict) else None
    return phone if isinstance(phone, str) and phone else None


def _delete_rows(ddb: Any, table: str, keys: list[dict[str, Any]]) -> int:
    batch_write(ddb, table, [{"DeleteRequest": {"Key": k}} for k in keys])
    return len(keys)


def erase_user(config: Config, ddb: Any, redis: Any, tenant: str, user: str) -> dict[str, int]:
    """Erase one user of one tenant; returns what was removed, by kind."""
    pk = user_key(tenant, user)
    inbox = Inbox(config, ddb, redis)
    record = ddb.get_item(
        TableName=config.table("preferences"), Key={"pk": {"S": pk}}, ConsistentRead=True
    ).get("Item")
    try:
        prefs = preferences_of(record)
        email, phone = _email_of(prefs), _phone_of(prefs)
    except ValueError:  # an unreadable record: its devices still name their keys
        email, phone = None, None
    device_ids = [d["device_id"] for d in devices_of(record)]
    notifications = notification_ids(inbox, tenant, user)
    keys = user_dedup_keys(tenant, user, notifications, device_ids)
    if "erasure_skips_channel_keys" not in config.defects:  # the defect: push keys only
        keys += channel_dedup_keys(tenant, user, notifications, email, phone)
    # The authors the user follows: the per-edge rows kept below the threshold, and the
    # tenant's celebrities whose follower pages hold the user (read before the cache goes).
    following = list(_query_all(ddb, config.table("following"), pk))
    authors = {f["sk"]["S"] for f in following}
    if "erasure_skips_celebrity_pages" not in config.defects:  # the defect: per-edge rows only
        authors |= set(inbox.followed_celebrities(tenant, user))

    counts: dict[str, int] = {"devices": len(device_ids)}  # they go with the record

    def drop_keys() -> None:
        removed = 0
        for start in range(0, len(keys), 500):
            removed += int(redis.delete(*keys[start : start + 500]))
        redis.delete(preferences_cache_key(tenant, user), f"{tenant}:celebs-followed:{user}")
        counts["dedup_keys"] = removed

    def drop_rows() -> None:
        counts["audit_keys"] = 0
        if "erasure_keeps_audit_key" not in config.defects:  # the defect: the trail stays readable
            counts["audit_keys"] = int(
                AuditKeys(ddb, config.table("audit_keys")).destroy(tenant, user)
            )
        _delete_rows(ddb, config.table("dedup_fallback"), [{"pk": {"S": k}} for k in keys])
        counts["follows"] = sum(
            inbox.pages.remove(tenant, author, user) for author in sorted(authors)
        )
        _delete_rows(
            ddb, config.table("following"), [{"pk": {"S": pk}, "sk": f["sk"]} for f in following]
        )
        for table in ("inbox", "reads"):
            rows = [
                {"pk": {"S": pk}, "sk": r["sk"]} for r in _query_all(ddb, config.table(table), pk)
            ]
            counts[f"{table}_rows"] = _delete_rows(ddb, config.table(table), rows)
        # The user's SNS platform endpoints hold their tokens: deleted (DeleteEndpoint is
        # idempotent) before the record that names them, so a retry still finds them.
        arns = [d["endpoint_arn"] for d in devices_of(record) if d.get("endpoint_arn")]
        if arns:
            sns = client(config, "sns")
            for arn in arns:
                sns.delete_endpoint(EndpointArn=arn)
        counts["endpoints"] = len(arns)
        for table in ("preferences", "read_state"):
            ddb.delete_item(TableName=config.table(table), Key={"pk": {"S": pk}})

    if "erasure_rows_first" in config.defects:
        # The defect: the rows that name the keys go first; a Redis error then leaves keys that
        # a retry can no longer compute.
        drop_rows()
        drop_keys()
    else:
        # Redis first: an error here raises before any row is gone.
        drop_keys()
        drop_rows()
    counts["notifications_seen"] = len(notifications)
    return counts
