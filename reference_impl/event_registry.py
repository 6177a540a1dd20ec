"""The event registry: one DynamoDB item per accepted event id, so that nothing accepted is lost.

Every row downstream is keyed by the notification id (the inbox's sort key, the dedup keys), so
two different events under one id would overwrite each other: the first would vanish from the
inbox after it had been answered 202. The Event API therefore claims ``tenant#event_id`` with a
conditional put that carries a hash of the event's content before it publishes:

* a new id, or the same id with the same content (an idempotent retry): the put succeeds, and
  the event is published (again: the fan-out and the dedup are idempotent, and a retry after a
  failed publish must still deliver);
* the same id with different content: the condition fails and the API answers 409; nothing is
  replaced.

Items carry ``expires_at`` (a DynamoDB TTL attribute): the id's own time plus the dedup window
and a day, since ids older than the window are refused anyway (``reference_impl.ulid_window``).
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timedelta
from typing import Any

from botocore.exceptions import ClientError

from reference_impl.ids import user_key
from reference_impl.ulid_window import DEDUP_WINDOW

REGISTRY_TABLE = "event_registry"
_KEEP_AFTER_WINDOW = timedelta(days=1)


def content_sha256(tenant_id: str, author_id: str, kind: str, object_id: str) -> str:
    """What makes two posts under one id "the same event"."""
    canonical = json.dumps([tenant_id, author_id, kind, object_id], separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


class EventRegistry:
    def __init__(self, ddb: Any, table: str) -> None:
        self.ddb = ddb
        self.table = table

    def claim(
        self, tenant_id: str, event_id: str, digest: str, event_time: datetime, now: datetime
    ) -> bool:
        """True when ``event_id`` is now registered with ``digest`` (new, or registered with
        the same digest before); False when it is taken by other content (nothing written)."""
        expires = event_time + DEDUP_WINDOW + _KEEP_AFTER_WINDOW
        try:
            self.ddb.put_item(
                TableName=self.table,
                Item={
                    "pk": {"S": user_key(tenant_id, event_id)},
                    "content_sha256": {"S": digest},
                    "accepted_at": {"S": now.isoformat()},
                    "expires_at": {"N": str(int(expires.timestamp()))},
                },
                ConditionExpression="attribute_not_exists(pk) OR content_sha256 = :digest",
                ExpressionAttributeValues={":digest": {"S": digest}},
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
                return False
            raise
        return True
