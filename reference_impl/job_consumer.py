"""What every channel consumer shares: the SQS batch loop and the send-once protocol.

A channel consumer (push, email, in-app) is a Lambda behind its channel's queue. Per batch
(:meth:`JobConsumer.__call__`): parse each record (a job no retry can fix goes to the channel's
poison queue), deliver the batch, and report the jobs that must come back in
``batchItemFailures``, with the retry delay set on the message (Retry-After, or an exponential
backoff by receive count). A job failing on its last allowed receive is audited ``dlq``: SQS
moves it to the dead-letter queue out of the consumer's sight.

The jobs of a batch go through each phase together, so that every phase that touches Redis is
one pipeline, one round trip per node (a cluster client splits it by slot), however many jobs
the batch holds (:meth:`JobConsumer.deliver_batch`):

1. preferences (:meth:`JobConsumer.load_preferences`): the cached ones in one read; the misses'
   user records from DynamoDB in one BatchGetItem (the batch's audit keys, and for push the
   devices, in the same call), written back to the cache in one write;
2. the channel's gates (:meth:`JobConsumer.plan`): consent, switches, quiet hours and, for push,
   the rate limits (the windows in one pipeline, the daily caps in another). Each job ends with
   an outcome or with its deliveries (a recipient, and how to send to it);
3. the send-once protocol over every delivery (:meth:`JobConsumer.send_all`): the dedup claims
   (leases) in one pipeline, the sends, then in one pipeline the 30-day 'sent' marks after a
   definite answer and the releases after a retriable one.

A Redis error fails closed (no send, no ack) for the jobs it leaves without a decision; the
rest of the batch goes on. Deliveries sharing a dedup key (copies of one job in one batch) take
step 3 in successive rounds: a copy then finds the first one's 'sent' mark, as it would in the
next batch. Within a batch, an answer changes what the next send does as it did job by job: a
Retry-After pauses the scope for the batch's remaining sends (their leases go back), and a token
that answered dead is not tried again. A 'sent' mark that fails (the store died after the
sends) is kept and written before the consumer's next claims, however long the store was gone:
a later copy of that job must find the key 'sent', not a lease that ran out meanwhile.

Also shared: the audit record, and the poller wiring of a consumer process (:func:`serve`).
"""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, ClassVar

import redis as redis_lib
from ulid import ULID

from reference_impl.audit import AuditSink, seal_record, sealing_for
from reference_impl.audit_keys import AuditKeys, DataKey
from reference_impl.aws import batch_get_tables, client, queue_url, to_poison
from reference_impl.config import Config
from reference_impl.dead_tokens import DeadTokens, registration_key
from reference_impl.dedup import Claim, DedupStore, FallbackDedup
from reference_impl.dedup_key import DEDUP_TTL_SECONDS, dedup_key
from reference_impl.event_source import SqsPoller, run_pollers
from reference_impl.ids import PREFERENCES_CACHE_SECONDS, preferences_cache_key, user_key, valid_id
from reference_impl.providers import ProviderGate, SendResult
from reference_impl.redis_store import Command, connect_redis, pipelined
from reference_impl.user_record import preferences_of

JOB_FIELDS = ("tenant_id", "notification_id", "recipient_user_id", "author_id", "kind")


class PoisonJob(ValueError):
    """A job that no retry can fix: it goes to the poison DLQ, not the retry DLQ."""


def parse_job(record: dict[str, Any]) -> dict[str, Any]:
    """The job of an SQS record, or PoisonJob. The ``tenant_id`` message attribute is mandatory
    and must name the body's tenant: no consumer acts on a job without knowing whose it is."""
    try:
        job = json.loads(record["body"])
    except (json.JSONDecodeError, TypeError) as exc:
        raise PoisonJob(f"body is not JSON: {exc}") from exc
    if not isinstance(job, dict):
        raise PoisonJob("body is not a JSON object")
    missing = [f for f in JOB_FIELDS if not isinstance(job.get(f), str) or not job.get(f)]
    if missing:
        raise PoisonJob(f"missing field(s): {', '.join(missing)}")
    attribute = (record.get("messageAttributes") or {}).get("tenant_id") or {}
    if attribute.get("stringValue") != job["tenant_id"]:
        raise PoisonJob("tenant_id message attribute missing or different from the body")
    if not valid_id(job["tenant_id"]) or not valid_id(job["recipient_user_id"]):
        raise PoisonJob("tenant_id or recipient_user_id is not a valid id")
    try:
        ULID.from_str(job["notification_id"])
    except ValueError as exc:
        raise PoisonJob("notification_id is not a ULID") from exc
    return job


def receive_count(record: dict[str, Any]) -> int:
    return int((record.get("attributes") or {}).get("ApproximateReceiveCount", "1"))


def copy_identity(record: dict[str, Any]) -> dict[str, Any]:
    """The audit fields naming the copy of a job an SQS record is: its MessageId and that
    receive's ApproximateReceiveCount (absent from the record: left out, never guessed)."""
    identity: dict[str, Any] = {}
    if isinstance(record.get("messageId"), str):
        identity["sqs_message_id"] = record["messageId"]
    count = (record.get("attributes") or {}).get("ApproximateReceiveCount")
    if count is not None:
        try:
            identity["receive_count"] = int(count)
        except (TypeError, ValueError):
            pass
    return identity


@dataclass
class Delivery:
    """One send a job asks for: its dedup recipient, the scope the provider gate paces and
    pauses, the send, how the trail names it, and what follows a definite answer (after the
    'sent' mark, before the audit: e.g. a dead token's deactivation)."""

    recipient: str
    scope: str
    send: Callable[[], SendResult]
    audit_fields: dict[str, Any]
    on_definite: Callable[[SendResult], None] | None = None
    # Which registration of the recipient (push: the device's registered_at): a dead answer
    # is remembered for it alone, so a device registered again is tried again at once.
    registration: str | None = None

    @property
    def dead_key(self) -> str:
        return registration_key(self.recipient, self.registration)


@dataclass
class JobState:
    """One job on its way through the phases of a batch: open, decided (``done``), or failed
    (``error``: no ack). ``retry_in`` set: not acknowledged, retried after that long."""

    job: dict[str, Any]
    deliveries: list[Delivery] = field(default_factory=list)
    retry_in: float | None = None
    error: Exception | None = None
    done: bool = False

    @property
    def open(self) -> bool:
        return not self.done and self.error is None

    def later(self, seconds: float) -> None:
        self.retry_in = max(self.retry_in or 0.0, seconds)

    def finish(self) -> None:
        self.done = True

    def fail(self, error: Exception) -> None:
        if self.error is None:
            self.error = error


def rounds(keys: Sequence[str]) -> list[list[int]]:
    """The indexes of ``keys`` in rounds in which no key appears twice, each in the given order:
    the n-th occurrence of a key goes to round n."""
    seen: dict[str, int] = {}
    out: list[list[int]] = []
    for i, key in enumerate(keys):
        n = seen.get(key, 0)
        seen[key] = n + 1
        if n == len(out):
            out.append([])
        out[n].append(i)
    return out


def timed_out(answer: object) -> bool:
    """Whether a store's answer is a timeout (redis-py's, or a socket's): the store took the
    command, or never answered, and the client gave up waiting; a refusal is not one."""
    return isinstance(answer, redis_lib.TimeoutError | TimeoutError)


@dataclass(frozen=True)
class PendingRecord:
    """An audit record waiting for its recipient's key: ``recipient`` (tenant, user), None when
    the record names no one; ``expected_kid`` the key the job was enqueued under, if named."""

    record: dict[str, Any]
    recipient: tuple[str, str] | None
    expected_kid: str | None


MAX_LATE_MARKS = 10_000
# SQS's longest message delay: a deferral past it hops again when it comes back.
MAX_SQS_DELAY_SECONDS = 900
# What a won claim led to: the provider's answer, or no send (the lease goes back).
_PAUSED = "paused"
_DEAD = "dead"


class JobConsumer:
    """Base of the channel consumers: subclasses set ``channel`` and ``component`` and
    implement :meth:`plan` (each job's outcome, or its deliveries).

    ``durable_fallback``: whether the channel may fall back to the DynamoDB dedup store when
    ``config.dedup_fallback`` is on. The seed grants that to consent-bearing channels (push,
    email); the others fail closed for the whole outage.
    """

    channel: ClassVar[str] = ""
    component: ClassVar[str] = ""
    durable_fallback: ClassVar[bool] = True
    state_type: ClassVar[type[JobState]] = JobState
    # What of a user record the batch read brings: the preferences (and the key). A channel
    # that reads more of the record in the same batch (push: the devices) reads it whole.
    record_projection: ClassVar[str | None] = "pk, prefs"
    log: ClassVar[logging.Logger] = logging.getLogger("reference_impl.job_consumer")

    def __init__(
        self,
        config: Config,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        redis_client: Any = None,
        gate: ProviderGate | None = None,
        audit_sink: AuditSink | None = None,
        dead_tokens: DeadTokens | None = None,
    ) -> None:
        """``audit_sink``: shared by the consumers of one process (``main``); without one, a
        consumer makes its own when the config names an audit bucket. ``dead_tokens``: shared
        by every poller of the consumer (threads and forked processes); else its own."""
        self.config = config
        self.dead_tokens = dead_tokens or DeadTokens()
        self.clock = clock
        self.ddb = client(config, "dynamodb")
        self.sqs = client(config, "sqs")
        self.queue = queue_url(self.sqs, config.queue_name(self.channel))
        self.poison_queue = queue_url(self.sqs, config.queue_name(self.channel, "-poison"))
        self.redis = redis_client or connect_redis(config)
        # The defect dedup_window_one_hour: EX 3600, shorter than a provider's retry horizon.
        ttl = 3600 if "dedup_window_one_hour" in config.defects else DEDUP_TTL_SECONDS
        primary = DedupStore(self.redis, config.dedup_lease_seconds, ttl)
        self.dedup: DedupStore | FallbackDedup = primary
        if config.dedup_fallback and self.durable_fallback:
            self.dedup = FallbackDedup(
                primary,
                self.ddb,
                config.table("dedup_fallback"),
                clock=lambda: self.clock().timestamp(),
                errors_to_fallback=config.dedup_fallback_errors,
                hold_seconds=config.dedup_fallback_hold_seconds,
                recheck="fallback_no_recheck" not in config.defects,
                sent_ttl="fallback_sent_without_ttl" not in config.defects,
            )
        self.gate = gate or ProviderGate(
            config.provider_max_in_flight, config.provider_max_rate_per_s
        )
        self.owner = uuid.uuid4().hex[:12]
        self.defects = frozenset(config.defects)
        # Preferences of the batch in hand (cache key -> JSON), loaded for all its jobs at once.
        self._batch_prefs: dict[str, bytes] = {}
        # User records the batch in hand read (pk -> item, {} for none): one read per batch.
        self._batch_records: dict[str, dict[str, Any]] = {}
        # 'sent' marks a failed settlement left behind (key -> monotonic deadline). Marks wait
        # for the end of a batch, so a store that dies mid-batch leaves every send of it
        # unmarked, not one; the next settlement writes them, before the leases run out and a
        # redelivered job wins the key again and sends a second time.
        self._late_marks: dict[str, float] = {}
        self.audit_sink = (
            audit_sink if audit_sink is not None else AuditSink.from_config(config, self.component)
        )
        # The copy each job of the batch in hand came from (id of the job dict -> its audit
        # fields): every record a job's copy leads to names that copy. Cleared after the batch,
        # while the job dicts are still alive (an id is only unique among live objects).
        self._copies: dict[int, dict[str, Any]] = {}
        # The batch's records wait here for their recipients' audit keys, read once for the
        # whole batch (:meth:`store_audit`), then go to the sink sealed.
        self.audit_keys = (
            AuditKeys(self.ddb, config.table("audit_keys"), clock)
            if self.audit_sink is not None
            else None
        )
        self._pending_audit: list[PendingRecord] = []
        # Keys a read of the batch already brought (e.g. with the devices), and whose keys that
        # read asked for (found or not). Never kept past the batch: a destroyed key is not used.
        self._batch_keys: dict[tuple[str, str], DataKey] = {}
        self._keys_read: set[tuple[str, str]] = set()

    # -- to implement -----------------------------------------------------------------------

    def plan(self, states: Sequence[JobState]) -> None:
        """Take every open job of the batch through the channel's gates: each ends decided
        (audited, ``finish``), failed, or open with its ``deliveries``."""
        raise NotImplementedError

    def parse(self, record: dict[str, Any]) -> dict[str, Any]:
        return parse_job(record)

    # -- helpers for plan -------------------------------------------------------------------

    def new_state(self, job: dict[str, Any]) -> JobState:
        return self.state_type(job)

    @staticmethod
    def each(states: Sequence[JobState], step: Callable[[Any], None]) -> None:
        """``step`` for every open job; an error fails that job only (no ack)."""
        for state in states:
            if state.open:
                try:
                    step(state)
                except Exception as exc:
                    state.fail(exc)

    # -- reads ------------------------------------------------------------------------------

    def stored_preferences(self, tenant_id: str, user_id: str) -> dict[str, Any] | None:
        item = self.ddb.get_item(
            TableName=self.config.table("preferences"),
            Key={"pk": {"S": user_key(tenant_id, user_id)}},
            ProjectionExpression="prefs",
            ConsistentRead=True,
        ).get("Item")
        return preferences_of(item)

    def defer(self, job: dict[str, Any], release_at: datetime) -> None:
        """Re-enqueue with a delay (durable: it survives a consumer crash; SQS caps
        the delay at 15 minutes, a longer wait hops again)."""
        seconds = math.ceil((release_at - self.clock()).total_seconds())
        delay = max(1, min(MAX_SQS_DELAY_SECONDS, seconds))
        if "deferral_acks_without_requeue" in self.defects:
            return  # the defect: the job is acknowledged and nothing comes back
        self.sqs.send_message(
            QueueUrl=self.queue,
            MessageBody=json.dumps({**job, "deferred_until": release_at.isoformat()}),
            DelaySeconds=delay,
            MessageAttributes={
                "tenant_id": {"DataType": "String", "StringValue": job["tenant_id"]}
            },
        )

    def preferences(self, tenant_id: str, user_id: str) -> dict[str, Any] | None:
        """Through the Redis cache (5-minute TTL as a backstop; every change through the API
        drops the entry). A missing record is cached too: consent stays denied until it is
        written. A cache error falls through to DynamoDB: the cache is never the authority.
        Inside a batch, what :meth:`load_preferences` read for it."""
        key = preferences_cache_key(tenant_id, user_id)
        if key in self._batch_prefs:
            return json.loads(self._batch_prefs[key])
        try:
            cached = self.redis.get(key)
            if cached is not None:
                return json.loads(cached)
        except redis_lib.RedisError:
            cached = None
        prefs = self.stored_preferences(tenant_id, user_id)
        try:
            self.redis.set(key, json.dumps(prefs), ex=PREFERENCES_CACHE_SECONDS)
        except redis_lib.RedisError:
            pass
        return prefs

    def load_preferences(self, jobs: Sequence[dict[str, Any]]) -> None:
        """The preferences of every job of the batch: the cached ones in one pipelined read per
        node; the misses' user records in one consistent BatchGetItem per 100 (which also brings
        the batch's audit keys, and the whole records a channel reads more of, e.g. the push
        devices: :attr:`record_projection`), written back to the cache in one pipelined write
        per node. A cache error falls through to DynamoDB; an entry whose read failed is not
        written back (its node just failed: a write would wait out the same timeout). A
        DynamoDB error leaves the jobs to read for themselves, and fail on their own."""
        users = list(dict.fromkeys((j["tenant_id"], j["recipient_user_id"]) for j in jobs))
        keys = [preferences_cache_key(tenant, user) for tenant, user in users]
        try:
            replies = pipelined(self.redis, [Command("get", (key,)) for key in keys])
        except Exception as exc:  # e.g. a cluster without a node for a slot
            replies = [exc] * len(keys)
        loaded: dict[str, bytes] = {}
        misses = []
        for user, key, reply in zip(users, keys, replies, strict=True):
            if reply is not None and not isinstance(reply, Exception):
                loaded[key] = reply
            else:
                misses.append((user, key, reply))
        if misses:
            try:
                records = self.read_records([user for user, _, _ in misses], key_users=users)
            except Exception:
                records = None
            fills = []
            for (tenant, user), key, reply in misses if records is not None else ():
                value = json.dumps(preferences_of(records.get(user_key(tenant, user)))).encode()
                loaded[key] = value
                if reply is None:
                    fills.append(Command("set", (key, value), (("ex", PREFERENCES_CACHE_SECONDS),)))
            try:
                pipelined(self.redis, fills)
            except Exception:
                pass  # the cache is never the authority: the next read goes to DynamoDB again
        self._batch_prefs = loaded

    def read_records(
        self, users: Sequence[tuple[str, str]], key_users: Sequence[tuple[str, str]] = ()
    ) -> dict[str, dict[str, Any]]:
        """The user records of ``users`` (consistent BatchGetItems, one per 100 keys), by pk,
        kept for the rest of the batch (:attr:`_batch_records`); the audit keys of
        ``key_users`` not read yet in this batch ride in the same calls. Raises what the
        read raised."""
        table = self.config.table("preferences")
        requests: dict[str, list[dict[str, Any]]] = {
            table: [{"pk": {"S": user_key(t, u)}} for t, u in users]
        }
        projections = {table: self.record_projection} if self.record_projection else {}
        wanted_keys = [u for u in dict.fromkeys(key_users) if u not in self._keys_read]
        if self.audit_keys is not None and wanted_keys:
            requests[self.audit_keys.table] = self.audit_keys.requests(wanted_keys)
        tables = batch_get_tables(self.ddb, requests, projections)
        if self.audit_keys is not None and wanted_keys:
            self._batch_keys.update(self.audit_keys.found(tables.get(self.audit_keys.table, [])))
            self._keys_read.update(wanted_keys)
        records = {user_key(t, u): {} for t, u in users}  # found or not: read
        records.update({item["pk"]["S"]: item for item in tables[table]})
        self._batch_records.update(records)
        return records

    def prefetch_preferences(self, records: list[dict[str, Any]]) -> None:
        """:meth:`load_preferences` for the parseable records of a batch."""
        jobs = []
        for record in records:
            try:
                jobs.append(self.parse(record))
            except PoisonJob:
                continue
        self.load_preferences(jobs)

    # -- audit ------------------------------------------------------------------------------

    def audit(
        self,
        outcome: str,
        job: dict[str, Any],
        *,
        copy_of: dict[str, Any] | None = None,
        **extra: Any,
    ) -> None:
        """One log line per outcome and, with an audit bucket, one record in the WORM trail.
        The record names the SQS copy of ``job`` (or of ``copy_of``: a record about another
        job, e.g. the digest a job scheduled) being handled."""
        copy = self._copies.get(id(copy_of if copy_of is not None else job), {})
        at = self.clock().isoformat()
        if "audit_at_event_time" in self.defects and isinstance(job.get("accepted_at"), str):
            at = job["accepted_at"]  # the defect: when the event was accepted, not the attempt
        record = {
            "audit": outcome,
            "at": at,
            "tenant_id": job.get("tenant_id"),
            "notification_id": job.get("notification_id"),
            "recipient_user_id": job.get("recipient_user_id"),
            **copy,
            **extra,
        }
        self.log.info("%s", json.dumps(record))
        if "audit_first_copy_only" in self.defects and copy.get("receive_count", 1) > 1:
            return  # the defect: a redelivered copy leaves no trail
        if self.audit_sink is not None:
            fields = {k: v for k, v in record.items() if k != "audit"}
            tenant, user = job.get("tenant_id"), job.get("recipient_user_id")
            recipient = (tenant, user) if valid_id(tenant) and valid_id(user) else None
            kid = job.get("audit_kid")
            self._pending_audit.append(
                PendingRecord(
                    {"outcome": outcome, **fields}, recipient, kid if isinstance(kid, str) else None
                )
            )

    def store_audit(self) -> None:
        """Seal the batch's records and hand them to the sink. The keys come from the batch's
        own reads where one brought them, else from one BatchGetItem per 100 recipients; a key
        is created only for a job that names none (a job the fan-out sealed for names its key,
        and its absence means the recipient was erased). Keys are dropped afterwards. A key read
        that fails keeps the records for the next batch's call, and raises with
        ``audit_flush_before_ack`` (the batch must not be acknowledged before its trail)."""
        pending, self._pending_audit = self._pending_audit, []
        batch_keys, self._batch_keys = self._batch_keys, {}
        keys_read, self._keys_read = self._keys_read, set()
        if not pending or self.audit_sink is None or self.audit_keys is None:
            return
        try:
            users = {r.recipient for r in pending if r.recipient is not None}
            keys = {u: k for u, k in batch_keys.items() if u in users}
            keys.update(self.audit_keys.read(users - keys_read))
            unnamed = {r.recipient for r in pending if r.expected_kid is None}
            keys.update(self.audit_keys.create_many(sorted(u for u in unnamed & users - set(keys))))
        except Exception as exc:
            self._pending_audit = pending + self._pending_audit
            self.log.warning("audit keys unavailable (%s): %d record(s) kept", exc, len(pending))
            if self.config.audit_flush_before_ack:
                raise
            return
        for r in pending:
            key = keys.get(r.recipient) if r.recipient is not None else None
            self.audit_sink.add(seal_record(r.record, sealing_for(key, r.expected_kid)))

    # -- the send-once protocol -------------------------------------------------------------

    def dedup_key_for(self, job: dict[str, Any], recipient: str) -> str:
        key_tenant = "-" if "dedup_key_without_tenant" in self.defects else job["tenant_id"]
        return dedup_key(key_tenant, job["notification_id"], recipient)

    def claim_many(self, keys: Sequence[str]) -> list[Claim | Exception]:
        """One claim per key from one pipeline; a key without a decision gets its error, and
        the caller fails closed for it."""
        if "skip_dedup" in self.defects:
            return ["won"] * len(keys)
        try:
            claims = self.dedup.claim_many(keys, self.owner)
        except Exception as exc:
            claims = [exc] * len(keys)
        if "dedup_fail_open" in self.defects:
            # The defect: send without a dedup decision.
            claims = ["won" if isinstance(c, redis_lib.RedisError) else c for c in claims]
        if "dedup_fail_open_on_timeout" in self.defects:
            # The defect: a store that does not answer in time is taken for one that has no
            # key (send); a refused connection still fails closed.
            claims = ["won" if timed_out(c) else c for c in claims]
        return claims

    def settle_many(self, sent: Sequence[str], released: Sequence[str]) -> dict[str, Exception]:
        """The 'sent' marks and lease releases of a round in one pipeline: the keys whose
        command failed, with the error."""
        try:
            errors = self.dedup.settle_many(sent, released, self.owner)
        except Exception as exc:
            errors = {key: exc for key in [*sent, *released]}
        if "dedup_fail_open" in self.defects:
            marks = set(sent)
            errors = {
                k: e
                for k, e in errors.items()
                if not (k in marks and isinstance(e, redis_lib.RedisError))
            }
        if "dedup_fail_open_on_timeout" in self.defects:
            marks = set(sent)  # the defect: a 'sent' mark that timed out taken as written
            errors = {k: e for k, e in errors.items() if not (k in marks and timed_out(e))}
        return errors

    def late_marks(self) -> list[str]:
        """The 'sent' marks a dead store refused, still to write. Kept past the lease: a send
        that happened must be marked whenever the store comes back, or the next copy of the job
        (a redelivery, a DLQ redrive) finds no key and sends again. Kept up to the key's own
        30-day life."""
        now = time.monotonic()
        self._late_marks = {k: t for k, t in self._late_marks.items() if t > now}
        return list(self._late_marks)

    def idle(self) -> None:
        """Called by the poller after an empty receive: the 'sent' marks a dead store refused
        go in as soon as it answers, not at this consumer's next batch. The job's next copy
        may reach another consumer first: it would find the lease run out and send again."""
        late = self.late_marks()
        if late:
            self.remember_marks(late, self.settle_many(late, []))

    def remember_marks(self, marks: Sequence[str], errors: dict[str, Exception]) -> None:
        deadline = time.monotonic() + DEDUP_TTL_SECONDS
        for key in marks:
            if isinstance(errors.get(key), redis_lib.RedisError):
                self._late_marks.setdefault(key, deadline)
            else:
                self._late_marks.pop(key, None)
        while len(self._late_marks) > MAX_LATE_MARKS:
            del self._late_marks[next(iter(self._late_marks))]

    def send_all(self, states: Sequence[JobState]) -> None:
        """Claim, send, settle and audit every delivery of the open jobs."""
        pending: list[tuple[JobState, Delivery, str]] = []
        for state in states:
            for delivery in state.deliveries if state.open else ():
                try:
                    pending.append(
                        (state, delivery, self.dedup_key_for(state.job, delivery.recipient))
                    )
                except Exception as exc:
                    state.fail(exc)
        dead: set[tuple[str, str]] = set()
        for indexes in rounds([key for _, _, key in pending]):
            self.send_round([pending[i] for i in indexes], dead)

    def send_round(
        self, pending: Sequence[tuple[JobState, Delivery, str]], dead: set[tuple[str, str]]
    ) -> None:
        """Deliveries with distinct dedup keys: claims, sends, settlement. ``dead``: the
        (tenant, recipient) pairs whose token answered dead earlier in the batch."""
        # Marks a dead store refused go in before any claim: a copy of a job whose send
        # happened must find its key 'sent', not absent (its lease may have run out).
        late = self.late_marks()
        if late:
            self.remember_marks(late, self.settle_many(late, []))
        claims = self.claim_many([key for _, _, key in pending])
        sent: list[str] = []
        released: list[str] = []
        answered: list[tuple[JobState, Delivery, str, SendResult | str]] = []
        for (state, delivery, key), claim in zip(pending, claims, strict=True):
            if isinstance(claim, Exception):
                state.fail(claim)  # no dedup decision: no send
                continue
            if claim == "already_sent":
                self.audit("deduped", state.job, **delivery.audit_fields)
                continue
            if claim == "in_flight":
                # Another copy holds the lease: this one comes back, and says so.
                self.audit("in_flight", state.job, **delivery.audit_fields)
                state.later(self.config.dedup_lease_seconds / 2)
                continue
            try:
                answer = self.send_won(state, delivery, dead)
            except Exception as exc:
                state.fail(exc)  # the provider's answer is unknown: the lease runs out
                continue
            if isinstance(answer, SendResult) and answer.outcome != "retry":
                sent.append(key)
            else:
                released.append(key)  # a retriable answer, or no send: the lease goes back
            answered.append((state, delivery, key, answer))
        # Late marks ride along when the store answered the claims (when it did not, they
        # would only wait out the same timeout again).
        errors = self.settle_many(sent, released)
        self.remember_marks(sent, errors)
        for state, delivery, key, answer in answered:
            # The answer is audited whether or not its key settled: a send that happened is in
            # the trail even when its mark is late (the job comes back and is audited
            # 'deduped' then).
            try:
                self.settled(state, delivery, answer)
            except Exception as exc:
                state.fail(exc)
            if key in errors:
                state.fail(errors[key])

    def send_won(
        self, state: JobState, delivery: Delivery, dead: set[tuple[str, str]]
    ) -> SendResult | str:
        """The send a won claim allows, unless this batch already learnt not to try it."""
        paused = self.gate.paused_for(delivery.scope)
        if paused > 0:  # Retry-After from an answer earlier in this batch: do not even try
            state.later(paused)
            return _PAUSED
        tenant = state.job["tenant_id"]
        # Dead earlier in this batch, or (another poller's answer) since this batch read it.
        if (tenant, delivery.dead_key) in dead or self.dead_tokens.dead(tenant, delivery.dead_key):
            return _DEAD
        with self.gate.slot(delivery.scope):
            # Asked again once the slot is ours: waiting for it can outlast another poller's
            # dead answer for the same token, or its Retry-After for the same scope (an
            # apns-429-storm run on the direct transport saw a request 0.39 s after a 429).
            if self.dead_tokens.dead(tenant, delivery.dead_key):
                return _DEAD
            paused = self.gate.paused_for(delivery.scope)
            if paused > 0:
                state.later(paused)
                return _PAUSED
            result = delivery.send()
        if result.outcome == "dead_token":
            dead.add((tenant, delivery.dead_key))
            if "dead_token_kept" not in self.defects:  # the defect: nothing remembers it
                self.dead_tokens.add(tenant, delivery.dead_key)
        if result.outcome == "retry":
            retry_in = 0.0
            if result.retry_after and "ignore_retry_after" not in self.defects:
                self.gate.pause(delivery.scope, result.retry_after)
                retry_in = result.retry_after
            state.later(retry_in)
        return result

    def settled(self, state: JobState, delivery: Delivery, answer: SendResult | str) -> None:
        """The audit (and the definite answer's follow-up) of a won claim's answer."""
        job, fields = state.job, delivery.audit_fields
        if answer == _PAUSED:
            self.audit("paused", job, **fields, retry_in=state.retry_in)
        elif answer == _DEAD:
            self.audit("dead_token", job, **fields, reason="deactivated")
        elif isinstance(answer, SendResult):
            if answer.outcome == "retry":
                # The defect: the outcome written before the answer was read (a 429 'sent').
                outcome = "sent" if "audit_sent_before_answer" in self.defects else "retry"
                self.audit(outcome, job, **fields, status=answer.status)
                return
            if delivery.on_definite is not None:
                delivery.on_definite(answer)
            self.audit(answer.outcome, job, **fields, status=answer.status, reason=answer.reason)

    # -- the batch --------------------------------------------------------------------------

    def deliver_batch(self, states: Sequence[JobState]) -> None:
        """Every job of the batch through the phases (module docstring)."""
        try:
            self.load_preferences([state.job for state in states])
            self.plan(states)
            self.send_all(states)
        finally:
            self._batch_prefs = {}
            self._batch_records = {}

    def deliver(self, job: dict[str, Any]) -> float | None:
        """One job as a batch of its own: None when it may be acknowledged, else the seconds
        to wait before it is retried. Raises what failed it."""
        state = self.new_state(job)
        try:
            self.deliver_batch([state])
        finally:
            self.store_audit()
        if state.error is not None:
            raise state.error
        return state.retry_in

    def to_poison(self, record: dict[str, Any], reason: str) -> None:
        to_poison(self.sqs, self.poison_queue, record, reason)

    def backoff(self, record: dict[str, Any], hint: float) -> int:
        """Seconds until a failed job is retried: the hint (e.g. Retry-After) or an exponential
        backoff by receive count, whichever is longer, capped."""
        exponential = 2 ** min(receive_count(record), 10)
        cap = self.config.retry_backoff_max_seconds
        if "slow_consumer" in self.defects:
            cap = max(cap, math.ceil(hint))  # the defect's hold is its own, not a retry's
        return int(min(cap, max(math.ceil(hint), exponential)))

    def retry_delay(self, record: dict[str, Any], state: JobState) -> float | None:
        """None: acknowledge. A failed job is audited (a Redis error: ``dedup_unavailable``,
        it failed closed) and retried."""
        if state.error is None:
            return state.retry_in
        if isinstance(state.error, redis_lib.RedisError):
            self.audit("dedup_unavailable", state.job, error=type(state.error).__name__)
        else:
            self.log.error("job %s failed", record.get("messageId"), exc_info=state.error)
            self.audit("failed", state.job, error=type(state.error).__name__)
        return 0.0

    def __call__(self, event: dict[str, Any], context: Any) -> dict[str, Any]:
        records = event.get("Records", [])
        if "delete_before_send" in self.defects:
            # The defect: acknowledge on receipt, so a crash or a failed send loses the jobs.
            for record in records:
                self.sqs.delete_message(QueueUrl=self.queue, ReceiptHandle=record["receiptHandle"])
        batch: list[tuple[dict[str, Any], JobState]] = []
        retried: list[dict[str, str]] = []
        try:
            for record in records:
                try:
                    state = self.new_state(self.parse(record))
                except PoisonJob as exc:
                    if "poison_retried" in self.defects:
                        # The defect: a parse error handled like any failure, retried until SQS
                        # moves it to the retry DLQ (where a redrive sends it round again).
                        retried.append({"itemIdentifier": record["messageId"]})
                        continue
                    self.to_poison(record, str(exc))
                    self.log.error("poison job %s: %s", record.get("messageId"), exc)
                    self.audit_poison(record, str(exc))
                    continue
                self._copies[id(state.job)] = copy_identity(record)
                batch.append((record, state))
            self.deliver_batch([state for _, state in batch])
            failures = self.settle_batch(batch)
        finally:
            self._copies = {}
            # Also when the batch raised: its records say what did happen, and the keys read
            # for it must not outlive it.
            self.store_audit()
        if self.config.audit_flush_before_ack and self.audit_sink is not None:
            # Raises on an S3 error: the whole batch is retried (and audited again) rather than
            # acknowledged with its trail still in memory.
            self.audit_sink.flush()
        return {"batchItemFailures": failures + retried}

    def audit_poison(self, record: dict[str, Any], reason: str) -> None:
        """A malformed copy's record: what of the body can be named safely (a tenant and a
        notification id that are valid ids), never the rest of a body no one could parse."""
        try:
            body = json.loads(record.get("body") or "")
        except (json.JSONDecodeError, TypeError):
            body = None
        body = body if isinstance(body, dict) else {}
        named = {f: body[f] for f in ("tenant_id", "notification_id") if valid_id(body.get(f))}
        job = {"tenant_id": named.get("tenant_id"), "notification_id": named.get("notification_id")}
        self._copies[id(job)] = copy_identity(record)
        self.audit("poison", job, reason=reason[:200])

    def settle_batch(
        self, batch: Sequence[tuple[dict[str, Any], JobState]]
    ) -> list[dict[str, str]]:
        """The batch's ``batchItemFailures``, each failed job's retry delay set on its message."""
        failures = []
        for record, state in batch:
            retry_in = self.retry_delay(record, state)
            if retry_in is None:
                continue
            failures.append({"itemIdentifier": record["messageId"]})
            receives = receive_count(record)
            if receives >= self.config.max_receive_count:
                # SQS moves a message to the DLQ on the receive after its last allowed one, out
                # of the consumer's sight: this failed receive is the last moment it can say so.
                self.audit(
                    "dlq",
                    state.job,
                    receive_count=receives,
                    reason="failed on its last allowed receive: the queue dead-letters it next",
                )
            try:
                self.sqs.change_message_visibility(
                    QueueUrl=self.queue,
                    ReceiptHandle=record["receiptHandle"],
                    VisibilityTimeout=self.backoff(record, retry_in),
                )
            except Exception as exc:  # the queue's own visibility timeout still applies
                self.log.warning(
                    "could not set the retry delay of %s: %s", record["messageId"], exc
                )
        return failures

    def handle_and_flush(self, event: dict[str, Any], context: Any) -> dict[str, Any]:
        """A Lambda invocation: the batch, then its trail stored before the batch is
        acknowledged (a frozen or reclaimed environment gets no signal to flush on), whatever
        audit_flush_before_ack says; an S3 error raises and the batch is retried."""
        result = self(event, context)
        if self.audit_sink is not None:
            self.audit_sink.flush()
        return result


def serve(
    consumers: Sequence[JobConsumer],
    ready_file: str | None,
    extra: Sequence[tuple[JobConsumer, str, Callable[..., dict[str, Any]]]] = (),
) -> int:
    """Run one SQS poller per consumer (one per unit of reserved concurrency) until SIGTERM;
    the audit sink they share stores what it buffered before the process exits. ``extra``:
    (consumer, queue URL, handler) of other queues the process polls too."""
    first = consumers[0]
    arn = first.sqs.get_queue_attributes(QueueUrl=first.queue, AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    name = first.component
    pollers = [SqsPoller(c.sqs, c.queue, arn, c, name, wait_seconds=1).run for c in consumers]
    for consumer, url, handler in extra:
        pollers.append(SqsPoller(consumer.sqs, url, url, handler, name, wait_seconds=1).run)
    consumers = [*consumers, *(c for c, _, _ in extra)]
    sink = first.audit_sink

    def stop() -> None:
        for consumer in consumers:  # records a failed key read held back, if any
            try:
                consumer.store_audit()
            except Exception as exc:
                consumer.log.error("audit records not sealed at stop: %s", exc)
        if sink is not None:
            sink.close()

    return run_pollers(name, pollers, ready_file, on_stop=stop)
