"""Per-user audit data keys: crypto-shredding for a trail nobody can delete.

The audit trail sits in an S3 bucket under Object Lock in COMPLIANCE mode (seed 000): no one can
delete or alter a record inside the retention, yet GDPR erasure (Art. 17) must reach it. So the
personal fields of every record are sealed (AES-256-GCM, :func:`reference_impl.audit.seal_record`)
under a data key of the person they name, and erasure destroys the key: the WORM records stay
intact and say nothing about that person any more.

The ``audit_keys`` table, one item per (tenant, user)::

    pk          tenant#user
    kid         the key's id, random (uuid4 hex): records name their key by it, never by user
    key         32 random bytes (binary). On AWS, wrap it with a KMS key (GenerateDataKey)
                and store the ciphertext; here the table's access policy is the only guard
    created_at  ISO 8601

* created when the user is registered: the Event API makes the key where missing whenever it
  stores a user's preferences, a device or a ``users:batch`` entry (:meth:`AuditKeys.ensure`),
  so a first notification's fan-out only reads keys. Still created lazily, on the first record
  that needs one, for a user registered without (before this, or when that creation failed).
  Either way by a conditional put (``attribute_not_exists(pk)``): two writers racing never end
  with two keys, the loser re-reads the winner's (a consistent read);
* read per batch (one BatchGetItem per 100 users, or inside a BatchGetItem the batch makes
  anyway, :meth:`AuditKeys.requests`), never cached past the batch: a destroyed key must not
  keep being used;
* destroyed by erasure (:meth:`AuditKeys.destroy`, idempotent). A user registered again under
  the same id gets a new key with a new ``kid``: their old records stay unreadable;
* the fan-out puts the recipient's ``kid`` in each job (``audit_kid``): a consumer that finds
  that key gone, or another one in its place, seals nothing for that job (the record says whose
  key it was, withheld) rather than create a key for someone who was just erased.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import ClientError

from reference_impl.aws import batch_get
from reference_impl.ids import user_key

KEY_BYTES = 32
# Key creations of one fan-out page in parallel: the first post to a million followers creates
# their keys, a conditional put each (BatchWriteItem has no conditions).
CREATE_THREADS = 8

User = tuple[str, str]  # tenant, user


@dataclass(frozen=True)
class DataKey:
    kid: str
    key: bytes


def new_data_key() -> DataKey:
    # uuid4's bytes and the key in one read of the system's randomness: a first notification
    # makes a key per recipient, and each os.urandom is a system call.
    raw = os.urandom(16 + KEY_BYTES)
    return DataKey(uuid.UUID(bytes=raw[:16], version=4).hex, raw[16:])


def item_of(user: User, key: DataKey, created_at: str) -> dict[str, Any]:
    return {
        "pk": {"S": user_key(*user)},
        "kid": {"S": key.kid},
        "key": {"B": key.key},
        "created_at": {"S": created_at},
    }


def key_of(item: Mapping[str, Any] | None) -> DataKey | None:
    """The data key of a table item; None for no item (or one without a usable key)."""
    if not item:
        return None
    try:
        kid, raw = item["kid"]["S"], item["key"]["B"]
    except (KeyError, TypeError):
        return None
    raw = bytes(raw)
    return DataKey(kid, raw) if len(raw) == KEY_BYTES else None


class AuditKeys:
    """The ``audit_keys`` table: read per batch, created at registration (or lazily),
    destroyed by erasure."""

    def __init__(
        self,
        ddb: Any,
        table: str,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.ddb = ddb
        self.table = table
        self.clock = clock

    def requests(self, users: Iterable[User]) -> list[dict[str, Any]]:
        """The keys to ask for in a BatchGetItem on this table."""
        return [{"pk": {"S": user_key(*user)}} for user in dict.fromkeys(users)]

    def found(self, items: Iterable[Mapping[str, Any]]) -> dict[User, DataKey]:
        """The data keys of the items a BatchGetItem returned, by (tenant, user)."""
        out: dict[User, DataKey] = {}
        for item in items:
            key = key_of(item)
            tenant, _, user = item["pk"]["S"].partition("#")
            if key is not None:
                out[(tenant, user)] = key
        return out

    def read(self, users: Iterable[User]) -> dict[User, DataKey]:
        """The existing keys of ``users``: consistent BatchGetItems, one per 100."""
        keys = self.requests(users)
        return self.found(batch_get(self.ddb, self.table, keys)) if keys else {}

    def create(self, user: User) -> DataKey:
        """The user's key: a new one, or the one a racing writer stored first (re-read)."""
        key = new_data_key()
        try:
            self.ddb.put_item(
                TableName=self.table,
                Item=item_of(user, key, self.clock().isoformat()),
                ConditionExpression="attribute_not_exists(pk)",
            )
            return key
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise
        item = self.ddb.get_item(
            TableName=self.table, Key={"pk": {"S": user_key(*user)}}, ConsistentRead=True
        ).get("Item")
        winner = key_of(item)
        if winner is None:  # destroyed between the two calls: an erasure won the race
            raise RuntimeError(f"the audit key of {user_key(*user)} vanished while created")
        return winner

    def create_many(self, users: Sequence[User]) -> dict[User, DataKey]:
        """:meth:`create` for each user, ``CREATE_THREADS`` at a time."""
        if len(users) <= 1:
            return {user: self.create(user) for user in users}
        with ThreadPoolExecutor(min(CREATE_THREADS, len(users))) as pool:
            return dict(zip(users, pool.map(self.create, users), strict=True))

    def ensure(self, users: Iterable[User]) -> dict[User, DataKey]:
        """Every user's key, read in one BatchGetItem per 100 and created where missing."""
        wanted = list(dict.fromkeys(users))
        keys = self.read(wanted)
        keys.update(self.create_many([u for u in wanted if u not in keys]))
        return keys

    def destroy(self, tenant: str, user: str) -> bool:
        """Erasure: the key is gone, and with it every record's personal fields; True when
        there was one. Deleting a key already gone succeeds, so a retried erasure ends in the
        same state."""
        old = self.ddb.delete_item(
            TableName=self.table,
            Key={"pk": {"S": user_key(tenant, user)}},
            ReturnValues="ALL_OLD",
        )
        return bool(old.get("Attributes"))
