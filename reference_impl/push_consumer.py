"""Push consumer: the Lambda behind the push queue.

Per job: preferences -> consent (default deny) -> quiet hours in the user's IANA zone (defer
durably, fail closed) -> sliding-window rate limit per (user, channel) (the excess is held for
one digest) -> devices -> per device: daily cap per (device, kind, local day) -> dedup claim ->
APNs or FCM -> outcome. A message is acknowledged only after a definite outcome for every
device; anything uncertain (a Redis error, a 429 or 5xx, a transport error) leaves it in the
queue. The SQS batch loop, the dedup claim/send/settle protocol, the cached preferences read and
the audit record are shared with the other channels (:mod:`reference_impl.job_consumer`).

A digest job (``kind: digest``, queued by the job that opened a digest window, delayed until the
window closes) goes through the same consent and quiet-hours gates, closes its window, and sends
one push per device under its own deterministic id, deduplicated like any notification.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, ClassVar

import redis as redis_lib
from ulid import ULID

from reference_impl.audit import AuditSink, token_sha256
from reference_impl.config import Config, ConfigError
from reference_impl.consent import push_consent_granted
from reference_impl.ids import user_key
from reference_impl.job_consumer import JOB_FIELDS, JobConsumer, PoisonJob, serve
from reference_impl.job_consumer import parse_job as parse_base_job
from reference_impl.providers import (
    ApnsClient,
    FcmClient,
    ProviderGate,
    SendResult,
    fcm_project_for,
)
from reference_impl.quiet_hours import decide, parse_window
from reference_impl.rate_limit import (
    DIGEST_AUTHOR,
    DIGEST_KIND,
    RateLimiter,
    RateLimits,
    WindowDecision,
    digest_closes_at_ms,
    digest_collapse_id,
    digest_notification_id,
    digest_text,
    to_ms,
)

log = logging.getLogger("reference_impl.push_consumer")
MAX_SQS_DELAY_SECONDS = 900
__all__ = ["JOB_FIELDS", "PoisonJob", "PushConsumer", "handler", "main", "parse_job"]


def parse_job(record: dict[str, Any]) -> dict[str, Any]:
    """The shared checks (:func:`reference_impl.job_consumer.parse_job`), plus a digest's."""
    job = parse_base_job(record)
    if "digest" in job:
        spec = job["digest"]
        if not (
            isinstance(spec, dict)
            and isinstance(spec.get("channel"), str)
            and all(
                isinstance(spec.get(f), int) and not isinstance(spec.get(f), bool)
                for f in ("window_start_ms", "closes_at_ms")
            )
        ):
            raise PoisonJob("digest must hold channel, window_start_ms and closes_at_ms")
    return job


class PushConsumer(JobConsumer):
    channel = "push"
    component = "push-consumer"
    log: ClassVar[logging.Logger] = log

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
        super().__init__(config, clock, redis_client, gate, audit_sink)
        self.apns = ApnsClient(config)
        self.fcm = FcmClient(config)
        self.limits = RateLimits(
            config.rate_limit_per_window,
            config.rate_limit_window_seconds,
            config.daily_limit_per_device_type,
        )
        self.limiter = RateLimiter(
            self.redis,
            self.limits,
            count_receives="rate_limit_counts_redeliveries" in self.defects,
        )

    def parse(self, record: dict[str, Any]) -> dict[str, Any]:
        return parse_job(record)

    # -- reads ------------------------------------------------------------------------------

    def registered_devices(self, tenant_id: str, user_id: str) -> list[dict[str, Any]]:
        """Every device row of the user, deactivated ones included (``active`` False)."""
        items = self.ddb.query(
            TableName=self.config.table("devices"),
            KeyConditionExpression="pk = :pk",
            ExpressionAttributeValues={":pk": {"S": user_key(tenant_id, user_id)}},
            ConsistentRead=True,
        ).get("Items", [])
        return [
            {
                "device_id": i["sk"]["S"],
                "token": i["token"]["S"],
                "platform": i["platform"]["S"],
                "active": i.get("active", {}).get("BOOL", True),
            }
            for i in items
        ]

    def active_devices(self, job: dict[str, Any]) -> list[dict[str, Any]] | None:
        """The devices to send to; None (after auditing why) when there are none. A device
        deactivated by an earlier 410 is not tried again, but the trail still says, for this
        notification, that it was skipped as a dead token."""
        registered = self.registered_devices(job["tenant_id"], job["recipient_user_id"])
        for device in registered:
            if not device["active"]:
                self.audit("dead_token", job, device=device, reason="deactivated")
        active = [d for d in registered if d["active"]]
        if not registered:
            self.audit("no_device", job)
        return active or None

    # -- writes -----------------------------------------------------------------------------

    def deactivate(self, tenant_id: str, user_id: str, device_id: str) -> None:
        self.ddb.update_item(
            TableName=self.config.table("devices"),
            Key={"pk": {"S": user_key(tenant_id, user_id)}, "sk": {"S": device_id}},
            UpdateExpression="SET active = :f, deactivated_at = :t",
            ExpressionAttributeValues={
                ":f": {"BOOL": False},
                ":t": {"S": self.clock().isoformat()},
            },
        )

    def defer(self, job: dict[str, Any], release_at: datetime) -> None:
        """Re-enqueue with a delay (SQS caps it at 15 minutes; a longer wait hops again)."""
        seconds = math.ceil((release_at - self.clock()).total_seconds())
        delay = max(1, min(MAX_SQS_DELAY_SECONDS, seconds))
        self.sqs.send_message(
            QueueUrl=self.queue,
            MessageBody=json.dumps({**job, "deferred_until": release_at.isoformat()}),
            DelaySeconds=delay,
            MessageAttributes={
                "tenant_id": {"DataType": "String", "StringValue": job["tenant_id"]}
            },
        )

    def audit(
        self,
        outcome: str,
        job: dict[str, Any],
        device: dict[str, Any] | None = None,
        **extra: Any,
    ) -> None:
        """The shared record (:meth:`JobConsumer.audit`); a device is named by its id and the
        token's SHA-256, never by the token itself."""
        named = (
            {"device_id": device["device_id"], "token_sha256": token_sha256(device["token"])}
            if device is not None
            else {}
        )
        super().audit(outcome, job, **named, **extra)

    # -- delivery ---------------------------------------------------------------------------

    def scope(self, job: dict[str, Any], device: dict[str, Any]) -> str:
        if device["platform"] == "apns":
            return "apns"
        return "fcm/" + fcm_project_for(job["recipient_user_id"], self.config.fcm_projects)

    def send(
        self, job: dict[str, Any], device: dict[str, Any], digest: tuple[str, str] | None = None
    ) -> SendResult:
        """``digest``: the (text, collapse id) of a digest push instead of the job's own."""
        nid = job["notification_id"]
        text, collapse_id = digest or (f"{job['author_id']} {job['kind']}", nid)
        if device["platform"] == "apns":
            payload = {
                "aps": {"alert": {"title": "New activity", "body": text}},
                "tenant_id": job["tenant_id"],
                "notification_id": nid,
            }
            apns_id = str(ULID.from_str(nid).to_uuid())
            collapse = None if "no_collapse_id" in self.defects else collapse_id
            return self.apns.send(device["token"], payload, apns_id, collapse_id=collapse)
        message = {
            "token": device["token"],
            "notification": {"title": "New activity", "body": text},
            "data": {"tenant_id": job["tenant_id"], "notification_id": nid},
        }
        if "no_collapse_id" not in self.defects:
            message["android"] = {"collapse_key": collapse_id}
            message["apns"] = {"headers": {"apns-collapse-id": collapse_id}}
        project = fcm_project_for(job["recipient_user_id"], self.config.fcm_projects)
        return self.fcm.send(project, message)

    def deliver(self, job: dict[str, Any]) -> float | None:
        """Process one job: None when it may be acknowledged, else the seconds to wait before
        it is retried (Retry-After, a paused provider, a lease held by another consumer)."""
        tenant, user = job["tenant_id"], job["recipient_user_id"]
        prefs = self.preferences(tenant, user)
        if not push_consent_granted(prefs):
            self.audit("denied_consent", job)
            return None
        if prefs and prefs.get("channels", {}).get("push") is False:
            self.audit("opted_out", job)
            return None
        zone = prefs.get("zone") if prefs else None
        try:
            window = parse_window(prefs.get("quiet_hours") if prefs else None)
        except ValueError:
            window = None
            zone = None  # an unreadable preference fails closed, like an unknown zone
        user_zone = zone
        if "quiet_hours_in_utc" in self.defects and zone is not None:
            zone = "UTC"
        decision = decide(self.clock(), zone, window)
        if not decision.send:
            assert decision.release_at is not None
            self.defer(job, decision.release_at)
            self.audit(
                "deferred", job, reason=decision.reason, until=decision.release_at.isoformat()
            )
            return None
        if "digest" in job:
            return self.deliver_digest(job)
        # The limits sit after consent and quiet hours and before the dedup claim. After: a job
        # that is denied or deferred must not spend the user's budget, and a deferred one is
        # counted when it is released, in the window in which it is actually shown. Before: the
        # limit decides whether to send at all, the dedup claim only guards the send it allows
        # (a held job takes no lease and leaves no 'sent' mark). Both count notification ids,
        # so a redelivered job passes both again without being counted twice.
        if self.limits.window_on:
            held = self.rate_limit(job)
            if held is not None:
                if held.schedules_digest:
                    assert held.digest_start_ms is not None
                    self.schedule_digest(job, held.digest_start_ms)
                self.audit(
                    "rate_limited",
                    job,
                    digest_window=held.digest_start_ms,
                    opened=held.opened,
                    repeat=held.repeat,
                )
                return None
        devices = self.active_devices(job)
        if devices is None:
            return None
        return self.send_to_devices(job, devices, user_zone)

    def rate_limit(self, job: dict[str, Any]) -> WindowDecision | None:
        """The window's decision when the job is held, None when it may be sent."""
        try:
            decision = self.limiter.window(
                job["tenant_id"],
                job["recipient_user_id"],
                job.get("channel", "push"),
                job["notification_id"],
                job["kind"],
                job["author_id"],
                self.clock(),
            )
        except redis_lib.RedisError:
            if not self.config.dedup_fallback:
                raise  # fail closed, as for the dedup store the limiter shares
            # With the fallback on, sends go on through a store outage: the limit is suspended
            # rather than the delivery (the limit guards attention, the dedup guards duplicates).
            self.audit("rate_limit_unavailable", job)
            return None
        return None if decision.admitted else decision

    def schedule_digest(self, job: dict[str, Any], start_ms: int) -> None:
        """Queue the digest job, delayed until its window closes (defer hops past SQS's
        15-minute cap). Its id is derived from (tenant, user, channel, window start), so every
        copy of it names the same digest."""
        tenant, user = job["tenant_id"], job["recipient_user_id"]
        channel = job.get("channel", "push")
        closes = digest_closes_at_ms(start_ms, self.limits.window_ms)
        digest = {
            "tenant_id": tenant,
            "notification_id": digest_notification_id(tenant, user, channel, start_ms),
            "recipient_user_id": user,
            "author_id": DIGEST_AUTHOR,
            "kind": DIGEST_KIND,
            "channel": channel,
            "digest": {"channel": channel, "window_start_ms": start_ms, "closes_at_ms": closes},
        }
        self.defer(digest, datetime.fromtimestamp(closes / 1000, UTC))
        self.audit("digest_scheduled", digest, window_start=start_ms)

    def deliver_digest(self, job: dict[str, Any]) -> float | None:
        """Close the window, then one push per device with the held count. The window is
        closed before it is read, so the count is final and every retry sends the same text
        and collapse id."""
        tenant, user = job["tenant_id"], job["recipient_user_id"]
        spec = job["digest"]
        closes = spec["closes_at_ms"]
        if to_ms(self.clock()) < closes:  # early (a skewed clock): only a closed window counts
            self.defer(job, datetime.fromtimestamp(closes / 1000, UTC))
            return None
        start = spec["window_start_ms"]
        items = self.limiter.close_digest(tenant, user, spec["channel"], start)
        if not items:
            self.audit("digest_empty", job)
            return None
        devices = self.active_devices(job)
        if devices is None:
            return None
        text = digest_text(items)
        self.audit("digest", job, window_start=start, count=len(items))
        return self.send_to_devices(
            job, devices, None, digest=(text, digest_collapse_id(start, len(items)))
        )

    def send_to_devices(
        self,
        job: dict[str, Any],
        devices: list[dict[str, Any]],
        zone: str | None,
        digest: tuple[str, str] | None = None,
    ) -> float | None:
        tenant, user = job["tenant_id"], job["recipient_user_id"]
        retry_in: float | None = None

        def later(seconds: float) -> None:
            nonlocal retry_in
            retry_in = max(retry_in or 0.0, seconds)

        for device in devices:
            scope = self.scope(job, device)
            paused = self.gate.paused_for(scope)
            if paused > 0:
                later(paused)  # Retry-After from an earlier answer: do not even try
                continue
            # Digests are exempt from the daily cap: a digest already is the collapsed excess,
            # at most one per window, and capping it would drop notifications it stands for.
            if digest is None and self.limits.daily_on and not self.daily_allows(job, device, zone):
                self.audit("daily_limited", job, device=device)
                continue

            def deactivate_dead(result: SendResult, device: dict[str, Any] = device) -> None:
                if result.outcome == "dead_token":
                    self.deactivate(tenant, user, device["device_id"])

            wait = self.send_once(
                job,
                f"{user}#{device['device_id']}",
                scope,
                lambda device=device: self.send(job, device, digest),
                {"device": device},
                on_definite=deactivate_dead,
            )
            if wait is not None:
                later(wait)
        return retry_in

    def daily_allows(self, job: dict[str, Any], device: dict[str, Any], zone: str | None) -> bool:
        try:
            return self.limiter.daily(
                job["tenant_id"],
                job["recipient_user_id"],
                device["device_id"],
                job["kind"],
                job["notification_id"],
                self.clock(),
                zone,
            )
        except redis_lib.RedisError:
            if not self.config.dedup_fallback:
                raise
            self.audit("rate_limit_unavailable", job, device=device)
            return True


_consumer: PushConsumer | None = None


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """The Lambda entry point (SQS trigger with ReportBatchItemFailures)."""
    global _consumer
    if _consumer is None:
        _consumer = PushConsumer(Config.load())
    return _consumer.handle_and_flush(event, context)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="reference push consumer (SQS poller)")
    parser.add_argument("--config", help="config JSON (default: $FANOUT_CONFIG)")
    parser.add_argument("--ready-file", help="written once the pollers run")
    args = parser.parse_args(argv)
    try:
        config = Config.load(args.config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # One consumer per poller thread: its HTTP/2 connections are not shared across threads.
    gate = ProviderGate(config.provider_max_in_flight, config.provider_max_rate_per_s)
    sink = AuditSink.from_config(config, PushConsumer.component)
    consumers = [
        PushConsumer(config, gate=gate, audit_sink=sink) for _ in range(config.consumer_threads)
    ]
    return serve(consumers, args.ready_file)


if __name__ == "__main__":
    sys.exit(main())
