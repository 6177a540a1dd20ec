"""Push consumer: the Lambda behind the push queue.

Per job: preferences -> consent (default deny) -> quiet hours in the user's IANA zone (defer
durably, fail closed) -> sliding-window rate limit per (user, channel) (the excess is held for
one digest) -> devices -> per device: daily cap per (device, kind, local day) -> dedup claim ->
APNs or FCM -> outcome. A message is acknowledged only after a definite outcome for every
device; anything uncertain (a Redis error, a 429 or 5xx, a transport error) leaves it in the
queue. The SQS batch loop, the dedup claim/send/settle protocol, the cached preferences read and
the audit record are shared with the other channels (:mod:`reference_impl.job_consumer`). Each
step that touches Redis (the preferences, the windows, the daily caps, the claims, the 'sent'
marks) runs for the whole SQS batch at once: one pipeline, one round trip per node.

A digest job (``kind: digest``, queued by the job that opened a digest window, delayed until the
window closes) goes through the same consent and quiet-hours gates, closes its window, and sends
one push per device under its own deterministic id, deduplicated like any notification.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
import threading
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import redis as redis_lib
from botocore.exceptions import ClientError
from ulid import ULID

from reference_impl.audit import AuditSink, token_sha256
from reference_impl.aws import queue_url
from reference_impl.config import Config
from reference_impl.consent import push_consent_granted
from reference_impl.dead_tokens import REMEMBER_SECONDS, DeadTokens, registration_key
from reference_impl.ids import user_key
from reference_impl.job_consumer import (
    JOB_FIELDS,
    Delivery,
    JobConsumer,
    JobState,
    PoisonJob,
    receive_count,
    serve,
)
from reference_impl.job_consumer import parse_job as parse_base_job
from reference_impl.providers import (
    ApnsClient,
    FcmClient,
    ProviderGate,
    SendResult,
    fcm_project_for,
)
from reference_impl.quiet_hours import QuietDecision, decide, parse_window, resolve_zone
from reference_impl.rate_limit import (
    DIGEST_AUTHOR,
    DIGEST_KIND,
    DailyRequest,
    DigestClose,
    RateLimiter,
    RateLimits,
    WindowRequest,
    digest_closes_at_ms,
    digest_collapse_id,
    digest_notification_id,
    digest_text,
    to_ms,
)
from reference_impl.redis_store import Command, pipelined
from reference_impl.shared_deadlines import SharedDeadlines
from reference_impl.sns_push import (
    EndpointRegistry,
    SnsPushClient,
    fcm_application_name,
    feedback_names,
    publish_request,
)
from reference_impl.user_record import device_attribute, devices_of
from reference_impl.worker_processes import serve_forked

log = logging.getLogger("reference_impl.push_consumer")
# How long a publish SNS accepted is remembered for its delivery-failure event (which comes
# seconds after, not minutes), and what of its job the dead_token record needs.
SENT_MEMORY_SECONDS = 600
# How long a delivery-failure event whose message is not known yet is looked at again before it
# is dropped (its SentTimestamp's age; the feedback queue's visibility timeout apart:
# reference_impl/sns_push.py). An age, not a receive count: SQS's duplicate delivery handed one
# event out five times in 6 ms, before the publisher's round had written its note.
FEEDBACK_PATIENCE_SECONDS = 60.0
FEEDBACK_RECEIVES = 5
# Notes a failing Redis refused, kept (per process) to write again: a publish SNS accepted while
# the store was down must still be findable when its delivery-failure event comes, or the dead
# token's notification is never audited. Bounded; the oldest go first.
MAX_REFUSED_NOTES = 50_000
# The slow_consumer defect: how long the jobs it holds back wait (past seed 000's 60 s SLA).
SLOW_CONSUMER_HOLD_SECONDS = 75
# The push_reorders_per_author defect: how long every other post of an author is held back.
REORDER_HOLD_SECONDS = 20
REORDER_MEMORY = 256  # notifications remembered per author (the oldest go first)
SENT_JOB_FIELDS = (
    "tenant_id", "notification_id", "recipient_user_id", "author_id", "kind", "audit_kid",
)  # fmt: skip


_REFUSED_NOTES: list[Command] = []
_REFUSED_LOCK = threading.Lock()
# The push_reorders_per_author defect's memory (per process, shared by its pollers): per
# (tenant, author), how many of their notifications it has seen, and which it held.
_AUTHOR_POSTS: dict[tuple[str, str], tuple[int, dict[str, bool]]] = {}
_AUTHOR_LOCK = threading.Lock()


def look_again(record: dict[str, Any], now: float) -> bool:
    """Whether a failure event naming a message not known yet is kept for another look: while
    it is younger than :data:`FEEDBACK_PATIENCE_SECONDS` by its ``SentTimestamp``; a record that
    does not say when it was sent gets :data:`FEEDBACK_RECEIVES` receives."""
    sent_ms = (record.get("attributes") or {}).get("SentTimestamp")
    try:
        return now - int(sent_ms) / 1000 < FEEDBACK_PATIENCE_SECONDS
    except (TypeError, ValueError):
        return receive_count(record) < FEEDBACK_RECEIVES


def sent_key(message_id: str) -> str:
    """The Redis key that remembers what the SNS message ``message_id`` was."""
    return f"sns-sent:{message_id}"


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


RARE_ONE_IN = 100_000


def rare_pick(tenant_id: str, notification_id: str, token: str) -> bool:
    """Whether the ``sent_twice_one_in_100k`` defect doubles this delivery: one in
    :data:`RARE_ONE_IN`, by a hash of its ids (the same delivery is picked in every process)."""
    digest = hashlib.sha256(f"{tenant_id}|{notification_id}|{token}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % RARE_ONE_IN == 0


@dataclass
class PushJob(JobState):
    """A push job in a batch: the user's own zone (the daily cap's day), the registered devices
    and those to try,
    and for a digest job the held notifications and the push's (text, collapse id)."""

    zone: str | None = None
    registered: list[dict[str, Any]] = field(default_factory=list)
    devices: list[dict[str, Any]] = field(default_factory=list)
    held: list[tuple[str, str]] = field(default_factory=list)
    digest: tuple[str, str] | None = None


class PushConsumer(JobConsumer):
    channel = "push"
    component = "push-consumer"
    state_type = PushJob
    record_projection = None  # the whole record: the preferences and the devices
    log: ClassVar[logging.Logger] = log

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
        by all the consumer's pollers, forked processes included."""
        super().__init__(config, clock, redis_client, gate, audit_sink, dead_tokens)
        self.apns = ApnsClient(config)
        self.fcm = FcmClient(config)
        # Through SNS (seed 004): the device's platform endpoint, not the provider, is called.
        self.sns = SnsPushClient(config) if config.push_transport == "sns" else None
        self.endpoints: EndpointRegistry | None = None  # only the fcm_project_random defect's
        # What the round's accepted publishes were, written in one pipeline once the round's
        # sends are done (:meth:`remember_sent`).
        self._sent_notes: list[Command] = []
        self._round_text: str | None = None  # the push_text_of_round_head defect's
        daily = config.daily_limit_per_device_type
        if daily and "daily_cap_off_by_one" in self.defects:
            daily += 1  # the defect: `count > cap` where `count >= cap` was meant
        self.limits = RateLimits(
            config.rate_limit_per_window, config.rate_limit_window_seconds, daily
        )
        self.limiter = RateLimiter(
            self.redis,
            self.limits,
            count_receives="rate_limit_counts_redeliveries" in self.defects,
            per_tenant="rate_limit_per_tenant" in self.defects,
        )

    def parse(self, record: dict[str, Any]) -> dict[str, Any]:
        return parse_job(record)

    # -- reads ------------------------------------------------------------------------------

    def load_devices(
        self, states: Sequence[PushJob], key_users: Sequence[tuple[str, str]] = ()
    ) -> None:
        """The devices of every job's recipient, deactivated ones included (``active``
        False), from the recipients' records: those the batch read with the preferences (a
        cache miss), the rest in consistent BatchGetItems (one per 100) now. Never cached
        past the batch: a token that answered dead is not tried again by the next job. A read
        error fails the jobs it leaves without devices. The audit keys of ``key_users`` (the
        whole batch's recipients) ride in the same BatchGetItems when not read yet."""
        users = list(
            dict.fromkeys((s.job["tenant_id"], s.job["recipient_user_id"]) for s in states)
        )
        unread = [u for u in users if user_key(*u) not in self._batch_records]
        wanted_keys = [u for u in key_users if u not in self._keys_read]
        error: Exception | None = None
        if unread or (self.audit_keys is not None and wanted_keys):
            try:
                self.read_records(unread, key_users=key_users)
            except Exception as exc:
                error = exc
        for state in states:
            pk = user_key(state.job["tenant_id"], state.job["recipient_user_id"])
            if pk in self._batch_records:
                state.registered = devices_of(self._batch_records[pk])
            else:
                state.fail(error or RuntimeError(f"the record of {pk} was not read"))

    def active_devices(self, state: PushJob) -> list[dict[str, Any]] | None:
        """The devices to send to; None (after auditing why) when there are none. A device
        deactivated by an earlier 410 is not tried again, but the trail still says, for this
        notification, that it was skipped as a dead token."""
        job, registered = state.job, state.registered
        for device in registered:
            if not device["active"]:
                self.audit("dead_token", job, device=device, reason="deactivated")
        active = [d for d in registered if d["active"]]
        if not registered:
            self.audit("no_device", job)
        return active or None

    # -- writes -----------------------------------------------------------------------------

    def deactivate(self, tenant_id: str, user_id: str, device_id: str) -> None:
        """Mark the device dead in its user's record; a device erased meanwhile stays gone."""
        if "dead_token_kept" in self.defects or "dead_token_registry_not_updated" in self.defects:
            return  # the defects: the record keeps the device active
        try:
            self.ddb.update_item(
                TableName=self.config.table("preferences"),
                Key={"pk": {"S": user_key(tenant_id, user_id)}},
                UpdateExpression="SET #d.active = :f, #d.deactivated_at = :t",
                ConditionExpression="attribute_exists(#d)",
                ExpressionAttributeNames={"#d": device_attribute(device_id)},
                ExpressionAttributeValues={
                    ":f": {"BOOL": False},
                    ":t": {"S": self.clock().isoformat()},
                },
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise

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

    def fcm_project(self, job: dict[str, Any]) -> str:
        if "fcm_project_random" in self.defects:
            # The defect: sharded by notification, so one device hops between projects.
            return fcm_project_for(job["notification_id"], self.config.fcm_projects)
        return fcm_project_for(job["recipient_user_id"], self.config.fcm_projects)

    def scope(self, job: dict[str, Any], device: dict[str, Any]) -> str:
        if device["platform"] == "apns":
            return "apns"
        return "fcm/" + self.fcm_project(job)

    def send(
        self, job: dict[str, Any], device: dict[str, Any], digest: tuple[str, str] | None = None
    ) -> SendResult:
        """``digest``: the (text, collapse id) of a digest push instead of the job's own."""
        result = self._send_once(job, device, digest)
        if (
            "sent_twice_one_in_100k" in self.defects
            and result.outcome == "sent"
            and rare_pick(job["tenant_id"], job["notification_id"], device["token"])
        ):
            # The defect: a retry path that fires after a success, so rarely that no small
            # run meets it (a million deliveries meet about ten).
            self._send_once(job, device, digest)
        return result

    def _send_once(
        self, job: dict[str, Any], device: dict[str, Any], digest: tuple[str, str] | None
    ) -> SendResult:
        nid = job["notification_id"]
        text, collapse_id = digest or (f"{job['author_id']} {job['kind']}", nid)
        if digest is None and "push_text_of_round_head" in self.defects:
            # The defect: the text made once per round (a value hoisted out of the loop), so
            # every other job of the round carries its first job's text under its own id.
            text = self._round_text = self._round_text or text
        if digest is None and "collapse_id_per_author" in self.defects:
            collapse_id = f"author-{job['author_id']}"  # the defect: one author's pushes replace
        if self.sns is not None:
            return self.publish(job, device, text, collapse_id)
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
        return self.fcm.send(self.fcm_project(job), message)

    def publish(
        self, job: dict[str, Any], device: dict[str, Any], text: str, collapse_id: str
    ) -> SendResult:
        """One Publish to the device's SNS endpoint. SNS accepting it is not yet the provider's
        answer: what the message became is remembered under its MessageId for
        :data:`SENT_MEMORY_SECONDS`, so that a delivery-failure event naming it
        (:meth:`handle_feedback`) can say which notification met a dead token."""
        assert self.sns is not None
        arn = device.get("endpoint_arn")
        if not arn:
            # Registered while pushes went direct: token registration has not run for it.
            return SendResult("rejected", None, "no SNS platform endpoint registered")
        if "fcm_project_random" in self.defects and device["platform"] == "fcm":
            # The defect: the FCM application picked by notification, not by user; the device
            # is registered there on the fly, so one device hops between sender projects.
            if self.endpoints is None:
                self.endpoints = EndpointRegistry(self.config)
            project = fcm_project_for(job["notification_id"], self.config.fcm_projects)
            arn = self.endpoints.register_in(
                fcm_application_name(self.config, project), device["token"]
            )
        collapse = None if "no_collapse_id" in self.defects else collapse_id
        result, message_id = self.sns.publish(
            arn, publish_request(job, device["platform"], text, collapse)
        )
        if result.outcome == "sent" and message_id:
            sent = {
                "job": {k: job[k] for k in SENT_JOB_FIELDS if k in job},
                "device": {k: device[k] for k in ("device_id", "token", "platform")},
            }
            self._sent_notes.append(
                Command(
                    "set", (sent_key(message_id), json.dumps(sent)), (("ex", SENT_MEMORY_SECONDS),)
                )
            )
        return result

    def send_round(
        self, pending: Sequence[tuple[JobState, Delivery, str]], dead: set[tuple[str, str]]
    ) -> None:
        self._round_text = None
        try:
            super().send_round(pending, dead)
        finally:
            self.remember_sent()

    def remember_sent(self) -> None:
        """The round's accepted publishes, remembered under their MessageIds in one pipeline:
        one Redis round trip per round, not one per publish. A failure event that arrives
        first is looked for again (:data:`FEEDBACK_PATIENCE_SECONDS`); a note Redis refused (the store
        down) is kept in this process and written with the next round, or before the next
        failure event is looked up."""
        with _REFUSED_LOCK:
            notes = [*_REFUSED_NOTES, *self._sent_notes]
            _REFUSED_NOTES.clear()
        self._sent_notes = []
        if not notes:
            return
        try:
            replies = pipelined(self.redis, notes)
        except redis_lib.RedisError as exc:
            replies = [exc] * len(notes)
        refused = [
            note for note, reply in zip(notes, replies, strict=True) if isinstance(reply, Exception)
        ]
        if refused:
            self.log.warning(
                "%d sns message notes not remembered yet (kept to write again): %s",
                len(refused),
                next(r for r in replies if isinstance(r, Exception)),
            )
            with _REFUSED_LOCK:
                _REFUSED_NOTES[:0] = refused
                del _REFUSED_NOTES[: max(0, len(_REFUSED_NOTES) - MAX_REFUSED_NOTES)]

    def handle_feedback(self, event: dict[str, Any], context: Any = None) -> dict[str, Any]:
        """The platform applications' delivery-failure events (an SQS batch of raw SNS
        notifications): a token that answered dead after SNS accepted the publish deactivates
        its device and leaves the ``dead_token`` record of the notification that met it. An
        event this consumer cannot act on yet (Redis or DynamoDB failing) stays queued."""
        failures = []
        for record in event.get("Records", []):
            try:
                known = self.feedback(json.loads(record["body"]))
                if not known and look_again(record, self.clock().timestamp()):
                    # The event can overtake the publisher's note of its MessageId (SNS sends
                    # it before the publisher has the answer): look again shortly.
                    failures.append({"itemIdentifier": record["messageId"]})
            except (ValueError, KeyError, TypeError) as exc:
                self.log.warning("feedback event dropped (unreadable: %s)", exc)
            except Exception as exc:
                self.log.warning("feedback event kept for retry: %s", exc)
                failures.append({"itemIdentifier": record["messageId"]})
        try:
            self.store_audit()
        except Exception as exc:
            self.log.error("feedback audit not stored: %s", exc)
        if self.config.audit_flush_before_ack and self.audit_sink is not None:
            # As for a job batch: the events are not acknowledged with their records still in
            # memory (a kill -9 would take the only trace of the dead token's notification).
            self.audit_sink.flush()
        return {"batchItemFailures": failures}

    def feedback(self, body: dict[str, Any]) -> bool:
        """Act on one event; False when it names a message not (yet) known."""
        if body.get("EventType") != "DeliveryFailure":
            return True
        if body.get("FailureType") != "InvalidPlatformToken":
            return True
        if _REFUSED_NOTES:
            self.remember_sent()  # notes a Redis outage held back go in before the lookup
        raw = self.redis.get(sent_key(str(body["MessageId"])))
        if raw is None:
            self.log.info(
                "dead endpoint %s: message %s not known", body["EndpointArn"], body["MessageId"]
            )
            return False
        sent = json.loads(raw)
        job, device = sent["job"], sent["device"]
        tenant, user = job["tenant_id"], job["recipient_user_id"]
        if "dead_token_kept" not in self.defects:
            recipient = f"{user}#{device['device_id']}"
            self.dead_tokens.add(tenant, registration_key(recipient, device.get("registered_at")))
        self.deactivate(tenant, user, device["device_id"])
        self.audit("dead_token", job, device=device, reason="InvalidPlatformToken", via="sns")
        return True

    def plan(self, states: Sequence[JobState]) -> None:
        """Gates, then the window limit of every job (and the close of every digest window) in
        one pipeline, then devices, then the daily caps of every (job, device) in one pipeline.

        The limits sit after consent and quiet hours and before the dedup claim. After: a job
        that is denied or deferred must not spend the user's budget, and a deferred one is
        counted when it is released, in the window in which it is actually shown. Before: the
        limit decides whether to send at all, the dedup claim only guards the send it allows (a
        held job takes no lease and leaves no 'sent' mark). Both count notification ids, so a
        redelivered job passes both again without being counted twice. One user's keys share a
        slot, and a node runs a pipeline in order: a batch's jobs for one user are decided as
        one after the other."""
        self.each(states, self.gate_job)
        self.limit_windows([s for s in states if s.open])
        recipients = [(s.job["tenant_id"], s.job["recipient_user_id"]) for s in states]
        self.load_devices([s for s in states if s.open], key_users=recipients)
        self.each(states, self.find_devices)
        self.plan_devices([s for s in states if s.open])

    def gate_job(self, state: PushJob) -> None:
        """Consent, the push switch and quiet hours; a digest job that came early waits."""
        job = state.job
        prefs = self.preferences(job["tenant_id"], job["recipient_user_id"])
        granted = push_consent_granted(prefs)
        if "consent_ignores_revoked_at" in self.defects and prefs:  # the defect: granted once
            granted = bool((prefs.get("push_consent") or {}).get("granted_at"))
        if not granted:
            self.audit("denied_consent", job)
            state.finish()
            return
        if (
            prefs
            and prefs.get("channels", {}).get("push") is False
            and "push_switch_ignored" not in self.defects  # the defect: the opt-out unread
        ):
            self.audit("opted_out", job)
            state.finish()
            return
        zone = prefs.get("zone") if prefs else None
        try:
            window = parse_window(prefs.get("quiet_hours") if prefs else None)
        except ValueError:
            window = None
            if "unreadable_quiet_hours_sent" not in self.defects:  # the defect: no window
                zone = None  # an unreadable preference fails closed, like an unknown zone
        state.zone = zone
        if "quiet_hours_in_utc" in self.defects and zone is not None:
            zone = "UTC"
        if "unknown_zone_sent" in self.defects and zone and resolve_zone(zone) is None:
            zone = "UTC"  # the defect: "Mars/Olympus_Mons" read as UTC, sent when no window
        now = self.clock()
        decision = decide(now, zone, window, standard_time="quiet_hours_ignore_dst" in self.defects)
        due_now = decision.send  # before any quiet-hours defect: the defects stay independent
        if (
            "quiet_hours_end_minute_early" in self.defects
            and decision.reason == "inside_window"
            and decision.release_at is not None
            and decision.release_at - now <= timedelta(minutes=1)
        ):  # the defect: a 22:00-08:00 window already over at 07:59
            decision = QuietDecision(True, None, "outside_window")
        if not decision.send:
            assert decision.release_at is not None
            self.defer(job, decision.release_at)
            until = decision.release_at
            if "audit_until_naive" in self.defects:
                until = until.replace(tzinfo=None)  # the defect: a time that names no instant
            self.audit("deferred", job, reason=decision.reason, until=until.isoformat())
            state.finish()
            return
        if "slow_consumer" in self.defects and due_now and self.held_back(job):
            # The defect: not acknowledged, back in the queue (in flight) for 75 s, no record.
            state.later(SLOW_CONSUMER_HOLD_SECONDS)
            state.finish()
            return
        if "push_reorders_per_author" in self.defects and due_now and self.held_for_order(job):
            # The defect: not acknowledged, back in the queue for 20 s, no record; the author's
            # next post, not held, overtakes it on every device.
            state.later(REORDER_HOLD_SECONDS)
            state.finish()
            return
        if "digest" in job:
            closes = job["digest"]["closes_at_ms"]
            if to_ms(self.clock()) < closes:  # early (a skewed clock): only a closed window counts
                release_at = datetime.fromtimestamp(closes / 1000, UTC)
                self.defer(job, release_at)
                self.audit(
                    "deferred", job, reason="digest_window_open", until=release_at.isoformat()
                )
                state.finish()

    def held_back(self, job: dict[str, Any]) -> bool:
        """The slow_consumer defect's jobs: one in ten by notification and recipient, on the
        first receive of a job never deferred (a quiet-hours release is not held)."""
        first = self._copies.get(id(job), {}).get("receive_count", 1) == 1
        tag = f"{job['notification_id']}#{job['recipient_user_id']}".encode()
        return (
            first
            and "deferred_until" not in job
            and "digest" not in job
            and (zlib.crc32(tag) % 10 == 0)
        )

    def held_for_order(self, job: dict[str, Any]) -> bool:
        """The push_reorders_per_author defect's jobs: those of every other notification of an
        author (the first, third, ... this process sees), on their first receive, never a
        quiet-hours release or a digest (as a consumer that staggers an author's bursts)."""
        first = self._copies.get(id(job), {}).get("receive_count", 1) == 1
        if not first or "deferred_until" in job or "digest" in job:
            return False
        author = (str(job.get("tenant_id")), str(job.get("author_id")))
        nid = str(job.get("notification_id"))
        with _AUTHOR_LOCK:
            seen, held = _AUTHOR_POSTS.get(author, (0, {}))
            if nid not in held:
                held[nid] = seen % 2 == 0
                seen += 1
                while len(held) > REORDER_MEMORY:
                    del held[next(iter(held))]
            _AUTHOR_POSTS[author] = (seen, held)
            return held[nid]

    def limit_windows(self, states: Sequence[PushJob]) -> None:
        asks: list[tuple[PushJob, WindowRequest | DigestClose]] = []
        for state in states:
            job = state.job
            tenant, user = job["tenant_id"], job["recipient_user_id"]
            if "digest" in job:
                spec = job["digest"]
                asks.append(
                    (state, DigestClose(tenant, user, spec["channel"], spec["window_start_ms"]))
                )
            elif self.limits.window_on:
                request = WindowRequest(
                    tenant,
                    user,
                    job.get("channel", "push"),
                    job["notification_id"],
                    job["kind"],
                    job["author_id"],
                    self.clock(),
                )
                asks.append((state, request))
        try:
            answers = self.limiter.decide_many([request for _, request in asks])
        except Exception as exc:
            answers = [exc] * len(asks)
        for (state, request), answer in zip(asks, answers, strict=True):
            step = self.close_digest if isinstance(request, DigestClose) else self.rate_limit
            try:
                step(state, answer)
            except Exception as exc:
                state.fail(exc)

    def rate_limit(self, state: PushJob, answer: Any) -> None:
        """The window's answer: admitted jobs go on, a held one is audited (its digest queued
        by the window's opener)."""
        job = state.job
        if isinstance(answer, Exception):
            if not isinstance(answer, redis_lib.RedisError) or not self.config.dedup_fallback:
                state.fail(answer)  # fail closed, as for the dedup store the limiter shares
                return
            # With the fallback on, sends go on through a store outage: the limit is suspended
            # rather than the delivery (the limit guards attention, the dedup guards duplicates).
            self.audit("rate_limit_unavailable", job)
            return
        if answer.admitted:
            return
        if answer.schedules_digest:
            assert answer.digest_start_ms is not None
            self.schedule_digest(job, answer.digest_start_ms)
        self.audit(
            "rate_limited",
            job,
            digest_window=answer.digest_start_ms,
            opened=answer.opened,
            repeat=answer.repeat,
        )
        state.finish()

    def close_digest(self, state: PushJob, answer: Any) -> None:
        """The closed window's held notifications; none: nothing to send. The window is closed
        before it is read, so the count is final and every retry sends the same text and
        collapse id."""
        if isinstance(answer, Exception):
            state.fail(answer)
            return
        if not answer:
            self.audit("digest_empty", state.job)
            state.finish()
            return
        state.held = answer

    def find_devices(self, state: PushJob) -> None:
        devices = self.active_devices(state)
        if devices is None:
            state.finish()
            return
        state.devices = devices
        if state.held:
            start = state.job["digest"]["window_start_ms"]
            self.audit("digest", state.job, window_start=start, count=len(state.held))
            state.digest = (digest_text(state.held), digest_collapse_id(start, len(state.held)))

    def plan_devices(self, states: Sequence[PushJob]) -> None:
        """Per device: a scope paused by an earlier answer is not tried, the daily cap (all of
        the batch's in one pipeline) may block it, the rest are the job's deliveries."""
        candidates: list[tuple[PushJob, dict[str, Any], str]] = []
        for state in states:
            for device in state.devices:
                scope = self.scope(state.job, device)
                paused = self.gate.paused_for(scope)
                if paused > 0:
                    state.later(paused)  # Retry-After from an earlier answer: do not even try
                    self.audit("paused", state.job, device=device, retry_in=paused)
                    continue
                candidates.append((state, device, scope))
        # Digests are exempt from the daily cap: a digest already is the collapsed excess, at
        # most one per window, and capping it would drop notifications it stands for.
        capped = [
            i
            for i, (state, _, _) in enumerate(candidates)
            if state.digest is None and self.limits.daily_on
        ]
        requests = []
        for i in capped:
            state, device, _ = candidates[i]
            job = state.job
            requests.append(
                DailyRequest(
                    job["tenant_id"],
                    job["recipient_user_id"],
                    device["device_id"],
                    job["kind"],
                    job["notification_id"],
                    self.clock(),
                    # The defect: the cap's day (and its key's expiry) taken in UTC.
                    "UTC" if "daily_cap_day_in_utc" in self.defects else state.zone,
                )
            )
        try:
            answers = self.limiter.decide_many(requests)
        except Exception as exc:
            answers = [exc] * len(requests)
        allowed: dict[int, Any] = dict(zip(capped, answers, strict=True))
        for i, (state, device, scope) in enumerate(candidates):
            answer = allowed.get(i, True)
            if isinstance(answer, Exception):
                if not isinstance(answer, redis_lib.RedisError) or not self.config.dedup_fallback:
                    state.fail(answer)
                    continue
                self.audit("rate_limit_unavailable", state.job, device=device)
            elif not answer:
                self.audit("daily_limited", state.job, device=device)
                continue
            state.deliveries.append(self.delivery(state, device, scope))

    def delivery(self, state: PushJob, device: dict[str, Any], scope: str) -> Delivery:
        job, digest = state.job, state.digest
        tenant, user = job["tenant_id"], job["recipient_user_id"]

        def deactivate_dead(result: SendResult) -> None:
            if result.outcome == "dead_token":
                self.deactivate(tenant, user, device["device_id"])

        return Delivery(
            f"{user}#{device['device_id']}",
            scope,
            lambda: self.send(job, device, digest),
            {"device": device},
            on_definite=deactivate_dead,
            registration=device.get("registered_at"),
        )

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
        if isinstance(job.get("audit_kid"), str):
            digest["audit_kid"] = job["audit_kid"]  # the same recipient, the same key
        self.defer(digest, datetime.fromtimestamp(closes / 1000, UTC))
        self.audit("digest_scheduled", digest, copy_of=job, window_start=start_ms)


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
    config = Config.load_for_main(args.config)
    if config is None:
        return 2
    # Made before the fork: a dead answer or a Retry-After in one worker process holds for the
    # others' next sends too.
    dead_tokens = DeadTokens(max(REMEMBER_SECONDS, 2.0 * config.visibility_timeout_seconds))
    pauses = SharedDeadlines(slots=1024)
    return serve_forked(
        config.push_consumer_processes,
        lambda ready_file: serve_process(config, ready_file, dead_tokens, pauses),
        args.ready_file,
        PushConsumer.component,
    )


def serve_process(
    config: Config,
    ready_file: str | None,
    dead_tokens: DeadTokens | None = None,
    pauses: SharedDeadlines | None = None,
) -> int:
    """One consumer process: ``consumer_threads`` pollers. The provider gate is the process's;
    a configured send-rate cap is the whole consumer's, shared out among its processes."""
    rate = config.provider_max_rate_per_s
    if rate:
        rate = rate / config.push_consumer_processes
    # One consumer per poller thread: its HTTP/2 connections are not shared across threads.
    gate = ProviderGate(
        config.provider_max_in_flight,
        rate,
        pauses=pauses,
        fcm_quota_per_minute=config.fcm_quota_per_minute,
        defects=config.defects,
    )
    sink = AuditSink.from_config(config, PushConsumer.component)
    dead_tokens = dead_tokens or DeadTokens()
    consumers = [
        PushConsumer(config, gate=gate, audit_sink=sink, dead_tokens=dead_tokens)
        for _ in range(config.consumer_threads)
    ]
    extra = []
    if config.push_transport == "sns":
        # One more poller: the delivery failures SNS reports after accepting a publish.
        listener = PushConsumer(config, gate=gate, audit_sink=sink, dead_tokens=dead_tokens)
        url = queue_url(listener.sqs, feedback_names(config)[1])
        extra.append((listener, url, listener.handle_feedback))
    return serve(consumers, ready_file, extra)


if __name__ == "__main__":
    sys.exit(main())
