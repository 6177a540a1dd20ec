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

A freshly minted id cannot collide (80 random bits, and no client knows it before its 202), so
its claim needs no condition: concurrent requests' minted claims are group-committed, one
BatchWriteItem for all the claims that arrived while the previous one was being written (the
way audit batches are committed before acks), and each request still answers only once its own
claim is stored. On the hot path (the load generators post without ids) that is a fraction of a
DynamoDB call per event instead of one.

Items carry ``expires_at`` (a DynamoDB TTL attribute): the id's own time plus the dedup window
and a day, since ids older than the window are refused anyway (``reference_impl.ulid_window``).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from botocore.exceptions import ClientError

from reference_impl.aws import batch_write
from reference_impl.ids import user_key
from reference_impl.ulid_window import DEDUP_WINDOW

REGISTRY_TABLE = "event_registry"
_KEEP_AFTER_WINDOW = timedelta(days=1)


def content_sha256(tenant_id: str, author_id: str, kind: str, object_id: str) -> str:
    """What makes two posts under one id "the same event"."""
    canonical = json.dumps([tenant_id, author_id, kind, object_id], separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def registry_item(
    tenant_id: str, event_id: str, digest: str, event_time: datetime, now: datetime
) -> dict[str, Any]:
    expires = event_time + DEDUP_WINDOW + _KEEP_AFTER_WINDOW
    return {
        "pk": {"S": user_key(tenant_id, event_id)},
        "content_sha256": {"S": digest},
        "accepted_at": {"S": now.isoformat()},
        "expires_at": {"N": str(int(expires.timestamp()))},
    }


@dataclass
class _Claim:
    item: dict[str, Any]
    done: bool = False
    error: BaseException | None = None
    written_with: int = 0


class EventRegistry:
    def __init__(self, ddb: Any, table: str, wait_seconds: float = 60.0) -> None:
        self.ddb = ddb
        self.table = table
        self.wait_seconds = wait_seconds
        self._changed = threading.Condition()
        self._queue: list[_Claim] = []
        self._writing = False

    def claim_minted(self, tenant_id: str, event_id: str, digest: str, now: datetime) -> int:
        """Register an id minted by this process (no condition: it is new). Returns once it is
        stored: the number of claims written in the same BatchWriteItem round (1 = alone).
        Whichever waiting thread finds no write in progress writes everything queued."""
        claim = _Claim(registry_item(tenant_id, event_id, digest, now, now))
        deadline = time.monotonic() + self.wait_seconds
        with self._changed:
            self._queue.append(claim)
            while not claim.done:
                if not self._writing:
                    batch, self._queue, self._writing = self._queue, [], True
                    break
                if not self._changed.wait(max(0.0, deadline - time.monotonic())):
                    raise TimeoutError("the event registry write did not finish in time")
            else:
                batch = []
        if batch:
            error: BaseException | None = None
            try:
                batch_write(self.ddb, self.table, [{"PutRequest": {"Item": c.item}} for c in batch])
            except BaseException as exc:  # every waiter of this round gets the failure
                error = exc
            with self._changed:
                for waiting in batch:
                    waiting.done, waiting.error, waiting.written_with = True, error, len(batch)
                self._writing = False
                self._changed.notify_all()
        if claim.error is not None:
            raise claim.error
        return claim.written_with

    def claim(
        self, tenant_id: str, event_id: str, digest: str, event_time: datetime, now: datetime
    ) -> bool:
        """True when ``event_id`` is now registered with ``digest`` (new, or registered with
        the same digest before); False when it is taken by other content (nothing written)."""
        try:
            self.ddb.put_item(
                TableName=self.table,
                Item=registry_item(tenant_id, event_id, digest, event_time, now),
                ConditionExpression="attribute_not_exists(pk) OR content_sha256 = :digest",
                ExpressionAttributeValues={":digest": {"S": digest}},
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
                return False
            raise
        return True
