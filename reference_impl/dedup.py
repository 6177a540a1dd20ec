"""The dedup store: Redis ``SET NX`` with a short lease, then a 30-day 'sent' mark.

The seed's protocol is ``SET key 1 NX EX 2592000`` then send. Taken literally, a send that
fails with a 5xx after the key is set would suppress the retry forever, and a crash between the
SET and the send would lose the notification. So the key is first written as a lease that
expires (``pending:<owner>``); after a definite provider outcome it becomes ``sent`` for 30 days;
after a retriable failure the owner deletes it. A crash between the provider's acceptance and
the ``sent`` mark leaves a lease that expires, and the redelivered job then sends again: that is
the residual duplicate the seed means by *effectively* once.

A consumer works on a whole SQS batch at once: every claim of the batch in one pipeline, every
'sent' mark and release in another (one round trip per node each, on a cluster too). The batch
methods answer per key: a key whose node failed gets the RedisError, so the caller fails closed
(no send, no ack) for exactly the jobs without a decision. The single-key methods raise it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeVar

import redis as redis_lib

from reference_impl.dedup_key import DEDUP_TTL_SECONDS
from reference_impl.redis_store import Command, LuaScript, pipelined, script_command

Claim = Literal["won", "already_sent", "in_flight"]
_SENT = b"sent"
# Delete only our own lease: another consumer may hold the key by now.
_RELEASE = LuaScript(
    """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
)
_T = TypeVar("_T")


def claim_from_replies(set_reply: Any, get_reply: Any) -> Claim | Exception | None:
    """The claim a ``SET key pending NX EX lease`` and the ``GET key`` after it (in one
    pipeline) decide: None when the lease expired between the two (claim again), the SET's
    error when there is no decision."""
    if isinstance(set_reply, Exception):
        return set_reply
    if set_reply:
        return "won"
    if isinstance(get_reply, Exception):
        return get_reply
    if get_reply == _SENT:
        return "already_sent"
    if get_reply is not None:
        return "in_flight"
    return None


def claim_from_set_get(reply: Any) -> Claim | Exception:
    """The claim one ``SET key pending NX GET EX lease`` decides (Redis 7.0+: the reply is the
    value the key had, nil when the SET happened), or its error."""
    if isinstance(reply, Exception):
        return reply
    if reply is None:
        return "won"
    if reply == _SENT:
        return "already_sent"
    return "in_flight"


def set_nx_get_supported(version: str) -> bool:
    """Whether a server of this ``redis_version`` takes SET with both NX and GET (7.0+)."""
    try:
        return int(version.split(".", 1)[0]) >= 7
    except ValueError:
        return False


def _raise_or_return(result: _T | Exception) -> _T:
    if isinstance(result, Exception):
        raise result
    return result


def _attempt(step: Callable[..., _T], *args: Any) -> _T | Exception:
    """A per-key step of a batch: its error belongs to that key's job, not to the batch."""
    try:
        return step(*args)
    except Exception as exc:
        return exc


class _OneKey:
    """The one-key protocol as one-key batches: a store implements the batch methods only."""

    def claim_many(self, keys: Sequence[str], owner: str) -> list[Claim | Exception]:
        raise NotImplementedError

    def settle_many(
        self, sent: Sequence[str], released: Sequence[str], owner: str
    ) -> dict[str, Exception]:
        raise NotImplementedError

    def claim(self, key: str, owner: str) -> Claim:
        return _raise_or_return(self.claim_many([key], owner)[0])

    def mark_sent(self, key: str) -> None:
        for error in self.settle_many([key], [], "").values():
            raise error

    def release(self, key: str, owner: str) -> None:
        for error in self.settle_many([], [key], owner).values():
            raise error


class DedupStore(_OneKey):
    def __init__(self, redis: Any, lease_seconds: int, ttl_seconds: int = DEDUP_TTL_SECONDS):
        self.redis = redis
        self.lease_seconds = lease_seconds
        self.ttl_seconds = ttl_seconds
        # Whether the store takes SET NX GET: asked once (INFO server), None until known.
        self.set_nx_get: bool | None = None

    def _knows_set_nx_get(self) -> bool:
        if self.set_nx_get is None:
            try:
                version = str(self.redis.info("server").get("redis_version", ""))
            except Exception:  # unreachable now: the two-command claim, and ask again later
                return False
            self.set_nx_get = set_nx_get_supported(version)
        return self.set_nx_get

    def claim_many(self, keys: Sequence[str], owner: str) -> list[Claim | Exception]:
        """One claim per key, in order, in one pipeline: ``SET NX GET`` of every key on Redis
        7.0+ (one command: half the commands of a batch's claims), else ``SET NX`` then
        ``GET``."""
        if keys and self._knows_set_nx_get():
            lease = (("nx", True), ("get", True), ("ex", self.lease_seconds))
            commands = [Command("set", (key, f"pending:{owner}"), lease) for key in keys]
            return [claim_from_set_get(r) for r in pipelined(self.redis, commands)]
        results: list[Claim | Exception] = ["in_flight"] * len(keys)
        todo = list(range(len(keys)))
        for _ in range(2):  # once more for the keys whose lease expired between SET and GET
            commands = []
            for i in todo:
                lease = (("nx", True), ("ex", self.lease_seconds))
                commands += [
                    Command("set", (keys[i], f"pending:{owner}"), lease),
                    Command("get", (keys[i],)),
                ]
            replies = pipelined(self.redis, commands)
            again = []
            for n, i in enumerate(todo):
                claim = claim_from_replies(replies[2 * n], replies[2 * n + 1])
                if claim is None:
                    again.append(i)
                else:
                    results[i] = claim
            todo = again
            if not todo:
                break
        return results

    def settle_many(
        self, sent: Sequence[str], released: Sequence[str], owner: str
    ) -> dict[str, Exception]:
        """The 'sent' marks and our leases' releases of a batch in one pipeline; the keys
        whose command failed, with the error."""
        commands = [Command("set", (key, "sent"), (("ex", self.ttl_seconds),)) for key in sent]
        commands += [script_command(_RELEASE, [key], [f"pending:{owner}"]) for key in released]
        replies = pipelined(self.redis, commands)
        keys = [*sent, *released]
        return {k: r for k, r in zip(keys, replies, strict=True) if isinstance(r, Exception)}


class FallbackDedup(_OneKey):
    """Redis first; on a sustained Redis outage, a DynamoDB conditional put (seed: consent-
    bearing channels fall back to a durable second store).

    * ``errors_to_fallback`` Redis errors in a row switch this process to the fallback for
      ``hold_seconds``; fewer errors fail closed (the caller does not send and does not ack).
      A batch pipeline that fails (for one key or all) is one error, like one failed call.
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
        sent_ttl: bool = True,
    ) -> None:
        self.primary = primary
        self.sent_ttl = sent_ttl  # False: the defect fallback_sent_without_ttl
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
        item = {
            "pk": {"S": key},
            "state": {"S": "sent"},
            "expires_at": {"N": str(int(self.clock() + self.primary.ttl_seconds))},
        }
        if not self.sent_ttl:
            del item["expires_at"]  # the defect: a 'sent' mark that lives forever
        self.ddb.put_item(TableName=self.table, Item=item)

    def _ddb_release(self, key: str, owner: str) -> None:
        from botocore.exceptions import ClientError

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

    # -- the protocol -----------------------------------------------------------------------

    def claim_many(self, keys: Sequence[str], owner: str) -> list[Claim | Exception]:
        if self.in_fallback:
            return [_attempt(self._ddb_claim, key, owner) for key in keys]
        results = self.primary.claim_many(keys, owner)
        failed = [i for i, r in enumerate(results) if isinstance(r, self._redis_errors)]
        if failed:
            if self._redis_failed():
                for i in failed:
                    results[i] = _attempt(self._ddb_claim, keys[i], owner)
        else:
            self._consecutive_errors = 0
        if self.recheck:
            won = [i for i, r in enumerate(results) if r == "won" and i not in failed]
            self._recheck(keys, owner, results, won)
        return results

    def _recheck(
        self, keys: Sequence[str], owner: str, results: list[Claim | Exception], won: list[int]
    ) -> None:
        """Won Redis claims against the fallback table: what it decided during an outage
        stands. Its answers go back to Redis in one pipeline."""
        marks: list[int] = []
        releases: list[int] = []
        for i in won:
            state = _attempt(self._ddb_state, keys[i])
            if isinstance(state, Exception):
                results[i] = state
            elif state == "already_sent":
                marks.append(i)
            elif state == "in_flight":
                releases.append(i)
        if not marks and not releases:
            return
        errors = self.primary.settle_many(
            [keys[i] for i in marks], [keys[i] for i in releases], owner
        )
        for i in marks:
            results[i] = errors.get(keys[i], "already_sent")
        for i in releases:
            results[i] = errors.get(keys[i], "in_flight")

    def settle_many(
        self, sent: Sequence[str], released: Sequence[str], owner: str
    ) -> dict[str, Exception]:
        errors: dict[str, Exception] = {}
        for key in sent:
            error = _attempt(self._ddb_mark_sent, key)
            if error is not None:
                errors[key] = error
        to_ddb = list(released)
        if not self.in_fallback:
            marks = [key for key in sent if key not in errors]
            failed = self.primary.settle_many(marks, released, owner)
            if any(isinstance(e, self._redis_errors) for e in failed.values()):
                self._redis_failed()
            # A failed 'sent' mark is in the fallback table already: not an error.
            to_ddb = [key for key in released if key in failed]
        for key in to_ddb:
            error = _attempt(self._ddb_release, key, owner)
            if error is not None:
                errors[key] = error
        return errors
