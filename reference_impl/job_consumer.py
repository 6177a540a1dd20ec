"""What every channel consumer shares: the SQS batch loop and the send-once protocol.

A channel consumer (push, email, in-app) is a Lambda behind its channel's queue. Per batch
(:meth:`JobConsumer.__call__`): parse each record (a job no retry can fix goes to the channel's
poison queue), deliver it, and report the jobs that must come back in ``batchItemFailures``,
with the retry delay set on the message (Retry-After, or an exponential backoff by receive
count). A job failing on its last allowed receive is audited ``dlq``: SQS moves it to the
dead-letter queue out of the consumer's sight.

Per recipient (:meth:`JobConsumer.send_once`): dedup claim (a lease), send, then either the
30-day 'sent' mark after a definite answer or the lease released after a retriable one. A Redis
error propagates: the caller fails closed (no send, no ack).

Also shared: the preferences read through the Redis cache, the audit record, and the poller
wiring of a consumer process (:func:`serve`).
"""

from __future__ import annotations

import json
import logging
import math
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, ClassVar

import redis as redis_lib
from ulid import ULID

from reference_impl.audit import AuditSink
from reference_impl.aws import client, queue_url
from reference_impl.config import Config
from reference_impl.dedup import DedupStore, FallbackDedup
from reference_impl.dedup_key import dedup_key
from reference_impl.event_source import SqsPoller, run_pollers
from reference_impl.ids import PREFERENCES_CACHE_SECONDS, preferences_cache_key, user_key, valid_id
from reference_impl.providers import ProviderGate, SendResult
from reference_impl.redis_store import connect_redis

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


class JobConsumer:
    """Base of the channel consumers: subclasses set ``channel`` and ``component`` and
    implement :meth:`deliver` (None: acknowledge; seconds: retry after that long).

    ``durable_fallback``: whether the channel may fall back to the DynamoDB dedup store when
    ``config.dedup_fallback`` is on. The seed grants that to consent-bearing channels (push,
    email); the others fail closed for the whole outage.
    """

    channel: ClassVar[str] = ""
    component: ClassVar[str] = ""
    durable_fallback: ClassVar[bool] = True
    log: ClassVar[logging.Logger] = logging.getLogger("reference_impl.job_consumer")

    def __init__(
        self,
        config: Config,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        redis_client: Any = None,
        gate: ProviderGate | None = None,
        audit_sink: AuditSink | None = None,
    ) -> None:
        """``audit_sink``: shared by the consumers of one process (``main``); without one, a
        consumer makes its own when the config names an audit bucket."""
        self.config = config
        self.clock = clock
        self.ddb = client(config, "dynamodb")
        self.sqs = client(config, "sqs")
        self.queue = queue_url(self.sqs, config.queue_name(self.channel))
        self.poison_queue = queue_url(self.sqs, config.queue_name(self.channel, "-poison"))
        self.redis = redis_client or connect_redis(config)
        primary = DedupStore(self.redis, config.dedup_lease_seconds)
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
            )
        self.gate = gate or ProviderGate(
            config.provider_max_in_flight, config.provider_max_rate_per_s
        )
        self.owner = uuid.uuid4().hex[:12]
        self.defects = frozenset(config.defects)
        # Cached preferences of the batch in hand, read in one pipelined round trip per node.
        self._batch_prefs: dict[str, bytes] = {}
        self.audit_sink = (
            audit_sink if audit_sink is not None else AuditSink.from_config(config, self.component)
        )

    # -- to implement -----------------------------------------------------------------------

    def deliver(self, job: dict[str, Any]) -> float | None:
        raise NotImplementedError

    def parse(self, record: dict[str, Any]) -> dict[str, Any]:
        return parse_job(record)

    # -- reads ------------------------------------------------------------------------------

    def preferences(self, tenant_id: str, user_id: str) -> dict[str, Any] | None:
        """Through the Redis cache (5-minute TTL as a backstop; every change through the API
        drops the entry). A missing record is cached too: consent stays denied until it is
        written. A cache error falls through to DynamoDB: the cache is never the authority."""
        key = preferences_cache_key(tenant_id, user_id)
        if key in self._batch_prefs:
            return json.loads(self._batch_prefs[key])
        try:
            cached = self.redis.get(key)
            if cached is not None:
                return json.loads(cached)
        except redis_lib.RedisError:
            cached = None
        item = self.ddb.get_item(
            TableName=self.config.table("preferences"),
            Key={"pk": {"S": user_key(tenant_id, user_id)}},
            ConsistentRead=True,
        ).get("Item")
        prefs = json.loads(item["prefs"]["S"]) if item else None
        try:
            self.redis.set(key, json.dumps(prefs), ex=PREFERENCES_CACHE_SECONDS)
        except redis_lib.RedisError:
            pass
        return prefs

    def prefetch_preferences(self, records: list[dict[str, Any]]) -> None:
        """The batch's cached preferences in one pipelined round trip per Redis node (a
        cluster client splits the pipeline by node). A miss or an error leaves each job to read
        for itself, as without the prefetch."""
        self._batch_prefs = {}
        keys = set()
        for record in records:
            try:
                job = self.parse(record)
            except PoisonJob:
                continue
            keys.add(preferences_cache_key(job["tenant_id"], job["recipient_user_id"]))
        if not keys:
            return
        ordered = sorted(keys)
        try:
            pipe = self.redis.pipeline(transaction=False)
            for key in ordered:
                pipe.get(key)
            values = pipe.execute()
        except redis_lib.RedisError:
            return
        self._batch_prefs = {k: v for k, v in zip(ordered, values, strict=True) if v is not None}

    # -- audit ------------------------------------------------------------------------------

    def audit(self, outcome: str, job: dict[str, Any], **extra: Any) -> None:
        """One log line per outcome and, with an audit bucket, one record in the WORM trail."""
        record = {
            "audit": outcome,
            "at": self.clock().isoformat(),
            "tenant_id": job.get("tenant_id"),
            "notification_id": job.get("notification_id"),
            "recipient_user_id": job.get("recipient_user_id"),
            **extra,
        }
        self.log.info("%s", json.dumps(record))
        if self.audit_sink is not None:
            fields = {k: v for k, v in record.items() if k != "audit"}
            self.audit_sink.add({"outcome": outcome, **fields})

    # -- the send-once protocol -------------------------------------------------------------

    def claim(self, tenant_id: str, notification_id: str, recipient: str) -> tuple[str, str]:
        """(dedup key, claim). Raises the Redis error: the caller fails closed."""
        key_tenant = "-" if "dedup_key_without_tenant" in self.defects else tenant_id
        key = dedup_key(key_tenant, notification_id, recipient)
        try:
            claim = "won" if "skip_dedup" in self.defects else self.dedup.claim(key, self.owner)
        except redis_lib.RedisError:
            if "dedup_fail_open" not in self.defects:
                raise
            claim = "won"  # the defect: send without a dedup decision
        return key, claim

    def send_once(
        self,
        job: dict[str, Any],
        recipient: str,
        scope: str,
        send: Callable[[], SendResult],
        audit_fields: dict[str, Any],
        on_definite: Callable[[SendResult], None] | None = None,
    ) -> float | None:
        """Claim, send, settle, audit. None when settled (sent, or another definite answer,
        or already sent by someone), else the seconds to wait before the job is retried.
        ``on_definite`` runs after the 'sent' mark, before the audit (e.g. a device's
        deactivation after a 410)."""
        key, claim = self.claim(job["tenant_id"], job["notification_id"], recipient)
        if claim == "already_sent":
            self.audit("deduped", job, **audit_fields)
            return None
        if claim == "in_flight":
            return self.config.dedup_lease_seconds / 2
        with self.gate.slot(scope):
            result = send()
        if result.outcome == "retry":
            self.dedup.release(key, self.owner)
            retry_in = 0.0
            if result.retry_after and "ignore_retry_after" not in self.defects:
                self.gate.pause(scope, result.retry_after)
                retry_in = result.retry_after
            self.audit("retry", job, **audit_fields, status=result.status)
            return retry_in
        try:
            self.dedup.mark_sent(key)
        except redis_lib.RedisError:
            if "dedup_fail_open" not in self.defects:
                raise
        if on_definite is not None:
            on_definite(result)
        self.audit(result.outcome, job, **audit_fields, status=result.status, reason=result.reason)
        return None

    # -- the batch --------------------------------------------------------------------------

    def to_poison(self, record: dict[str, Any], reason: str) -> None:
        self.sqs.send_message(
            QueueUrl=self.poison_queue,
            MessageBody=record.get("body") or "",
            MessageAttributes={"reason": {"DataType": "String", "StringValue": reason[:256]}},
        )

    def backoff(self, record: dict[str, Any], hint: float) -> int:
        """Seconds until a failed job is retried: the hint (e.g. Retry-After) or an exponential
        backoff by receive count, whichever is longer, capped."""
        exponential = 2 ** min(receive_count(record), 10)
        return int(min(self.config.retry_backoff_max_seconds, max(math.ceil(hint), exponential)))

    def __call__(self, event: dict[str, Any], context: Any) -> dict[str, Any]:
        failures = []
        if "delete_before_send" in self.defects:
            # The defect: acknowledge on receipt, so a crash or a failed send loses the jobs.
            for record in event.get("Records", []):
                self.sqs.delete_message(QueueUrl=self.queue, ReceiptHandle=record["receiptHandle"])
        self.prefetch_preferences(event.get("Records", []))
        for record in event.get("Records", []):
            try:
                job = self.parse(record)
            except PoisonJob as exc:
                self.to_poison(record, str(exc))
                self.log.error("poison job %s: %s", record.get("messageId"), exc)
                continue
            try:
                retry_in = self.deliver(job)
            except redis_lib.RedisError as exc:
                # Fail closed: no dedup decision, no send, no ack.
                self.audit("dedup_unavailable", job, error=type(exc).__name__)
                retry_in = 0.0
            except Exception:
                self.log.exception("job %s failed", record.get("messageId"))
                retry_in = 0.0
            if retry_in is None:
                continue
            failures.append({"itemIdentifier": record["messageId"]})
            receives = receive_count(record)
            if receives >= self.config.max_receive_count:
                # SQS moves a message to the DLQ on the receive after its last allowed one, out
                # of the consumer's sight: this failed receive is the last moment it can say so.
                self.audit(
                    "dlq",
                    job,
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
        self._batch_prefs = {}
        if self.config.audit_flush_before_ack and self.audit_sink is not None:
            # Raises on an S3 error: the whole batch is retried (and audited again) rather than
            # acknowledged with its trail still in memory.
            self.audit_sink.flush()
        return {"batchItemFailures": failures}

    def handle_and_flush(self, event: dict[str, Any], context: Any) -> dict[str, Any]:
        """A Lambda invocation: the batch, then its trail stored before the batch is
        acknowledged (a frozen or reclaimed environment gets no signal to flush on), whatever
        audit_flush_before_ack says; an S3 error raises and the batch is retried."""
        result = self(event, context)
        if self.audit_sink is not None:
            self.audit_sink.flush()
        return result


def serve(consumers: Sequence[JobConsumer], ready_file: str | None) -> int:
    """Run one SQS poller per consumer (one per unit of reserved concurrency) until SIGTERM;
    the audit sink they share stores what it buffered before the process exits."""
    first = consumers[0]
    arn = first.sqs.get_queue_attributes(QueueUrl=first.queue, AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    name = first.component
    pollers = [SqsPoller(c.sqs, c.queue, arn, c, name, wait_seconds=1).run for c in consumers]
    sink = first.audit_sink
    return run_pollers(name, pollers, ready_file, on_stop=sink.close if sink else None)
