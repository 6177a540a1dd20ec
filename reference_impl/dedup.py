"""The dedup store: Redis ``SET NX`` with a short lease, then a 30-day 'sent' mark.

The seed's protocol is ``SET key 1 NX EX 2592000`` then send. Taken literally, a send that
fails with a 5xx after the key is set would suppress the retry forever, and a crash between the
SET and the send would lose the notification. So the key is first written as a lease that
expires (``pending:<owner>``); after a definite provider outcome it becomes ``sent`` for 30 days;
after a retriable failure the owner deletes it. A crash between the provider's acceptance and
the ``sent`` mark leaves a lease that expires, and the redelivered job then sends again: that is
the residual duplicate the seed means by *effectively* once.

Every Redis error propagates: the consumer fails closed (no send, no ack).
"""

from __future__ import annotations

from typing import Any, Literal

from reference_impl.dedup_key import DEDUP_TTL_SECONDS

Claim = Literal["won", "already_sent", "in_flight"]
_SENT = b"sent"
# Delete only our own lease: another consumer may hold the key by now.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class DedupStore:
    def __init__(self, redis: Any, lease_seconds: int, ttl_seconds: int = DEDUP_TTL_SECONDS):
        self.redis = redis
        self.lease_seconds = lease_seconds
        self.ttl_seconds = ttl_seconds
        self._release = redis.register_script(_RELEASE)

    def claim(self, key: str, owner: str) -> Claim:
        for _ in range(2):
            if self.redis.set(key, f"pending:{owner}", nx=True, ex=self.lease_seconds):
                return "won"
            value = self.redis.get(key)
            if value == _SENT:
                return "already_sent"
            if value is not None:
                return "in_flight"
            # The lease expired between SET and GET: try once more.
        return "in_flight"

    def mark_sent(self, key: str) -> None:
        self.redis.set(key, "sent", ex=self.ttl_seconds)

    def release(self, key: str, owner: str) -> None:
        self._release(keys=[key], args=[f"pending:{owner}"])


class FallbackDedup:
    """Redis first; on a sustained Redis outage, a DynamoDB conditional put (seed: consent-
    bearing channels fall back to a durable second store).

    * ``errors_to_fallback`` Redis errors in a row switch this process to the fallback for
      ``hold_seconds``; fewer errors fail closed (the caller does not send and does not ack).
    * While Redis is healthy, a won Redis claim is checked against the fallback table, so a key
      written there during an outage still dedups after Redis returns.
    * Every 'sent' mark is also written to the fallback table (write-through): a job sent just
      before an outage and redelivered during it is then deduplicated by the fallback too. That
      doubles the dedup writes of the channels that use it: the price of a durable second store.
    """

    def __init__(
        self,
        primary: DedupStore,
        ddb: Any,
        table: str,
        clock: Any,
        errors_to_fallback: int = 3,
        hold_seconds: float = 5.0,
        recheck: bool = True,
    ) -> None:
        import redis as redis_lib

        self.primary = primary
        self.ddb = ddb
        self.table = table
        self.clock = clock  # () -> epoch seconds
        self.errors_to_fallback = errors_to_fallback
        self.hold_seconds = hold_seconds
        self.recheck = recheck
        self._redis_errors = redis_lib.RedisError
        self._consecutive_errors = 0
        self._fallback_until = 0.0

    @property
    def in_fallback(self) -> bool:
        return self.clock() < self._fallback_until

    def _redis_failed(self) -> bool:
        """Count a Redis error; True when this process should now use the fallback."""
        self._consecutive_errors += 1
        if self._consecutive_errors >= self.errors_to_fallback:
            self._fallback_until = self.clock() + self.hold_seconds
            return True
        return False

    # -- the fallback table -----------------------------------------------------------------

    def _ddb_claim(self, key: str, owner: str) -> Claim:
        from botocore.exceptions import ClientError

        now = self.clock()
        try:
            self.ddb.put_item(
                TableName=self.table,
                Item={
                    "pk": {"S": key},
                    "state": {"S": "pending"},
                    "owner": {"S": owner},
                    "lease_until": {"N": f"{now + self.primary.lease_seconds:.3f}"},
                    "expires_at": {"N": str(int(now + self.primary.ttl_seconds))},
                },
                ConditionExpression="attribute_not_exists(pk) OR (#s = :pending AND lease_until < :now)",
                ExpressionAttributeNames={"#s": "state"},
                ExpressionAttributeValues={
                    ":pending": {"S": "pending"},
                    ":now": {"N": f"{now:.3f}"},
                },
            )
            return "won"
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise
        return self._ddb_state(key) or "in_flight"

    def _ddb_state(self, key: str) -> Claim | None:
        item = self.ddb.get_item(
            TableName=self.table, Key={"pk": {"S": key}}, ConsistentRead=True
        ).get("Item")
        if not item:
            return None
        if item["state"]["S"] == "sent":
            return "already_sent"
        if float(item.get("lease_until", {}).get("N", "0")) < self.clock():
            return None  # an abandoned lease
        return "in_flight"

    def _ddb_mark_sent(self, key: str) -> None:
        self.ddb.put_item(
            TableName=self.table,
            Item={
                "pk": {"S": key},
                "state": {"S": "sent"},
                "expires_at": {"N": str(int(self.clock() + self.primary.ttl_seconds))},
            },
        )

    # -- the protocol -----------------------------------------------------------------------

    def claim(self, key: str, owner: str) -> Claim:
        if self.in_fallback:
            return self._ddb_claim(key, owner)
        try:
            claim = self.primary.claim(key, owner)
        except self._redis_errors:
            if self._redis_failed():
                return self._ddb_claim(key, owner)
            raise
        self._consecutive_errors = 0
        if claim != "won" or not self.recheck:
            return claim
        state = self._ddb_state(key)
        if state == "already_sent":
            self.primary.mark_sent(key)
            return "already_sent"
        if state == "in_flight":
            self.primary.release(key, owner)
            return "in_flight"
        return "won"

    def mark_sent(self, key: str) -> None:
        self._ddb_mark_sent(key)
        if not self.in_fallback:
            try:
                self.primary.mark_sent(key)
            except self._redis_errors:
                self._redis_failed()

    def release(self, key: str, owner: str) -> None:
        from botocore.exceptions import ClientError

        if not self.in_fallback:
            try:
                self.primary.release(key, owner)
                return
            except self._redis_errors:
                self._redis_failed()
        try:
            self.ddb.delete_item(
                TableName=self.table,
                Key={"pk": {"S": key}},
                ConditionExpression="#o = :owner",
                ExpressionAttributeNames={"#o": "owner"},
                ExpressionAttributeValues={":owner": {"S": owner}},
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise
