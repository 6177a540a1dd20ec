"""Email, in-app and SMS consumers: the Lambdas behind the ``email``, ``in_app``, ``sms`` queues.

Seed 000: one SQS queue per channel, each job with its tenant as a message attribute, a DLQ
after 3 receives, channel-specific consumers, SES for email, SNS for SMS. Each channel reaches
one recipient per job and runs the shared protocol (:mod:`reference_impl.job_consumer`) over
each SQS batch: parse (poison queue for a malformed job), preferences through the cache, the
channel's gates, then dedup claim -> send -> 'sent' mark, retries on 429/5xx/transport errors
by leaving the job in the queue.

* email: consent first (``email_consent {granted_at, version}``, default deny: email is a
  consent-bearing channel like push), then the ``channels.email`` switch (default on), then the
  address (``email`` in the preferences; none: ``no_address``). No quiet hours: an email does
  not buzz. Dedup recipient ``user#email:<sha256(address)[:16]>``; the trail names the address
  by its SHA-256 only. SES's MessageRejected (e.g. a suppressed address) is definite: audited
  ``rejected``, acknowledged.
* in-app: the ``channels.in_app`` switch (default on); no consent (the user is inside the app)
  and no quiet hours. ``post_to_connection`` on ``<tenant>:<user>``; 410 Gone means the user is
  offline: audited ``offline`` and acknowledged, the inbox row already holds the notification.
  Dedup recipient ``user#inapp``. No durable dedup fallback: the seed grants that to
  consent-bearing channels, so in-app fails closed for a whole dedup-store outage.
* SMS, as push: consent (``sms_consent``, default deny), the ``channels.sms`` switch, the number
  (``phone``, E.164; none: ``no_phone``), then quiet hours in the user's IANA zone (inside the
  window or an unknown zone: re-enqueued with a delay until it ends, audited ``deferred``), then
  SNS's opt-out list: CheckIfPhoneNumberIsOptedOut before every send, because SNS accepts a
  Publish to an opted-out number (a MessageId, nothing delivered); an opted-out number is
  audited ``suppressed`` and acknowledged. Then the send-once protocol like every channel (a
  consent-bearing channel: it may fall back to the DynamoDB dedup store) and SNS ``Publish``
  with ``PhoneNumber``, ``AWS.SNS.SMS.SMSType`` (Transactional) and ``AWS.SNS.SMS.SenderID``.
  Dedup recipient ``user#sms:<sha256(number)[:16]>``; the trail names the number by its SHA-256.

Run: ``python -m reference_impl.channel_consumer --channel email|in_app|sms --config FILE
[--ready-file PATH]``; on Lambda: :func:`email_handler`, :func:`in_app_handler`,
:func:`sms_handler` (or :func:`handler` with ``FANOUT_CHANNEL``).
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar

from reference_impl.audit import AuditSink
from reference_impl.channel_providers import InAppClient, SesClient, SmsClient, connection_id
from reference_impl.config import Config, ConfigError
from reference_impl.consent import email_consent_granted, sms_consent_granted
from reference_impl.dead_tokens import DeadTokens
from reference_impl.dedup import Claim
from reference_impl.dedup_key import email_recipient, inapp_recipient, sms_recipient
from reference_impl.ids import valid_phone
from reference_impl.job_consumer import Delivery, JobConsumer, JobState, serve
from reference_impl.providers import ProviderGate, SendResult
from reference_impl.quiet_hours import decide, parse_window

log = logging.getLogger("reference_impl.channel_consumer")


@dataclass(frozen=True)
class Target:
    """Where one job goes: the dedup recipient, how to name it in the trail, how to send."""

    recipient: str
    audit_fields: dict[str, Any]
    send: Callable[[], SendResult]


class ChannelConsumer(JobConsumer):
    """A channel with one recipient per job. Subclasses set ``scope`` (the provider the gate
    paces and pauses) and ``provider_client``, and implement :meth:`target`."""

    scope: ClassVar[str] = ""
    log: ClassVar[logging.Logger] = log
    # The channel's provider client, built from the config as ``self.provider``.
    provider_client: ClassVar[Callable[[Config], Any]]

    def __init__(
        self,
        config: Config,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        redis_client: Any = None,
        gate: ProviderGate | None = None,
        audit_sink: AuditSink | None = None,
        dead_tokens: DeadTokens | None = None,
    ) -> None:
        # First: a config the client refuses (in-app without the gateway's URL) fails before
        # any AWS call is made.
        self.provider = type(self).provider_client(config)
        super().__init__(config, clock, redis_client, gate, audit_sink, dead_tokens)

    def target(self, job: dict[str, Any], prefs: dict[str, Any] | None) -> Target | None:
        """The job's target, or None after auditing why there is none."""
        raise NotImplementedError

    def audit(self, outcome: str, job: dict[str, Any], **extra: Any) -> None:
        # Every record says its channel: the trail of a notification spans several.
        super().audit(outcome, job, channel=self.channel, **extra)

    def switched_off(self, job: dict[str, Any], prefs: dict[str, Any] | None) -> bool:
        if "channel_switch_ignored" in self.defects:  # the defect: the channel's switch unread
            return False
        if prefs and (prefs.get("channels") or {}).get(self.channel) is False:
            self.audit("opted_out", job)
            return True
        return False

    def plan(self, states: Sequence[JobState]) -> None:
        self.each(states, self.plan_job)

    def plan_job(self, state: JobState) -> None:
        job = state.job
        target = self.target(job, self.preferences(job["tenant_id"], job["recipient_user_id"]))
        if target is None:
            state.finish()
            return
        paused = self.gate.paused_for(self.scope)
        if paused > 0:  # Retry-After from an earlier answer: do not even try
            self.audit("paused", job, **target.audit_fields, retry_in=paused)
            state.later(paused)
            state.finish()
            return
        state.deliveries.append(
            Delivery(target.recipient, self.scope, target.send, target.audit_fields)
        )

    def claim_many(self, keys: Sequence[str]) -> list[Claim | Exception]:
        if "channel_dedup_skipped" in self.defects:
            return ["won"] * len(keys)  # the defect: only push was given the dedup claim
        return super().claim_many(keys)


class EmailConsumer(ChannelConsumer):
    channel = "email"
    component = "email-consumer"
    scope = "ses"
    provider_client = SesClient
    provider: SesClient

    def target(self, job: dict[str, Any], prefs: dict[str, Any] | None) -> Target | None:
        granted = email_consent_granted(prefs)
        if "consent_ignores_revoked_at" in self.defects and prefs:  # the defect: granted once
            granted = bool((prefs.get("email_consent") or {}).get("granted_at"))
        if not granted:
            self.audit("denied_consent", job)
            return None
        if self.switched_off(job, prefs):
            return None
        address = (prefs or {}).get("email")
        if not isinstance(address, str) or "@" not in address:
            self.audit("no_address", job)
            return None
        return Target(
            email_recipient(job["recipient_user_id"], address),
            {"address_sha256": hashlib.sha256(address.encode()).hexdigest()},
            lambda: self.provider.send(address, job),
        )


class InAppConsumer(ChannelConsumer):
    channel = "in_app"
    component = "in-app-consumer"
    scope = "inapp"
    durable_fallback = False
    provider_client = InAppClient
    provider: InAppClient

    def target(self, job: dict[str, Any], prefs: dict[str, Any] | None) -> Target | None:
        if self.switched_off(job, prefs):
            return None
        connection = connection_id(job["tenant_id"], job["recipient_user_id"])
        return Target(
            inapp_recipient(job["recipient_user_id"]),
            {"connection_id": connection},
            lambda: self.provider.send(connection, job),
        )


def phone_of(prefs: dict[str, Any] | None) -> str | None:
    """The user's SMS number when it is a valid E.164 one."""
    number = (prefs or {}).get("phone")
    return number if valid_phone(number) else None


class SmsConsumer(ChannelConsumer):
    """SMS through SNS (module docstring): consent, switch, number, quiet hours, opt-out list."""

    channel = "sms"
    component = "sms-consumer"
    scope = "sns-sms"
    provider_client = SmsClient
    provider: SmsClient

    def target(self, job: dict[str, Any], prefs: dict[str, Any] | None) -> Target | None:
        if not sms_consent_granted(prefs):
            self.audit("denied_consent", job)
            return None
        if self.switched_off(job, prefs):
            return None
        number = phone_of(prefs)
        if number is None:
            self.audit("no_phone", job)
            return None
        return Target(
            sms_recipient(job["recipient_user_id"], number),
            {"phone_sha256": hashlib.sha256(number.encode()).hexdigest()},
            lambda: self.provider.send(number, job),
        )

    def deferred(self, job: dict[str, Any], prefs: dict[str, Any] | None) -> bool:
        """Quiet hours in the user's own zone, failing closed (an unknown zone or an unreadable
        window defers): True after the job was re-enqueued for the window's end and audited."""
        zone = prefs.get("zone") if prefs else None
        try:
            window = parse_window(prefs.get("quiet_hours") if prefs else None)
        except ValueError:
            window, zone = None, None
        if "quiet_hours_in_utc" in self.defects and zone is not None:
            zone = "UTC"
        decision = decide(self.clock(), zone, window)
        if decision.send:
            return False
        assert decision.release_at is not None
        self.defer(job, decision.release_at)
        self.audit("deferred", job, reason=decision.reason, until=decision.release_at.isoformat())
        return True

    def plan_job(self, state: JobState) -> None:
        job = state.job
        prefs = self.preferences(job["tenant_id"], job["recipient_user_id"])
        target = self.target(job, prefs)
        if target is None or self.deferred(job, prefs):
            state.finish()
            return
        fields = target.audit_fields
        paused = self.gate.paused_for(self.scope)
        if paused > 0:  # Retry-After from an earlier answer: do not even try
            self.audit("paused", job, **fields, retry_in=paused)
            state.later(paused)
            state.finish()
            return
        if "sms_ignores_opt_out" not in self.defects:
            number = phone_of(prefs)
            assert number is not None
            answer = self.provider.opted_out(number)
            if answer.error is not None:
                self.unanswered(state, fields, answer.error)
                return
            if answer.opted_out:
                self.audit("suppressed", job, **fields, reason="opted_out")
                state.finish()
                return
        state.deliveries.append(Delivery(target.recipient, self.scope, target.send, fields))

    def unanswered(self, state: JobState, fields: dict[str, Any], error: SendResult) -> None:
        """The opt-out list could not be read: a throttled or failed call comes back later (no
        send without an answer), a refused number is definite."""
        job = state.job
        if error.outcome == "retry":
            retry_in = 0.0
            if error.retry_after and "ignore_retry_after" not in self.defects:
                self.gate.pause(self.scope, error.retry_after)
                retry_in = error.retry_after
            self.audit("retry", job, **fields, status=error.status, reason=error.reason)
            state.later(retry_in)
        else:
            self.audit("rejected", job, **fields, status=error.status, reason=error.reason)
        state.finish()


CONSUMERS: dict[str, type[ChannelConsumer]] = {
    "email": EmailConsumer,
    "in_app": InAppConsumer,
    "sms": SmsConsumer,
}
_consumers: dict[str, ChannelConsumer] = {}


def _handle(channel: str, event: dict[str, Any], context: Any) -> dict[str, Any]:
    consumer = _consumers.get(channel)
    if consumer is None:
        consumer = _consumers[channel] = CONSUMERS[channel](Config.load())
    return consumer.handle_and_flush(event, context)


def email_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Lambda entry point of the email queue (SQS trigger with ReportBatchItemFailures)."""
    return _handle("email", event, context)


def in_app_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Lambda entry point of the in-app queue (SQS trigger with ReportBatchItemFailures)."""
    return _handle("in_app", event, context)


def sms_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Lambda entry point of the SMS queue (SQS trigger with ReportBatchItemFailures)."""
    return _handle("sms", event, context)


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """One deployment package for every channel function: ``FANOUT_CHANNEL`` names the channel."""
    channel = os.environ.get("FANOUT_CHANNEL", "")
    if channel not in CONSUMERS:
        raise ConfigError(f"FANOUT_CHANNEL must be one of {', '.join(CONSUMERS)}, got {channel!r}")
    return _handle(channel, event, context)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="reference email / in-app / SMS consumer (SQS poller)"
    )
    parser.add_argument("--channel", required=True, choices=sorted(CONSUMERS))
    parser.add_argument("--config", help="config JSON (default: $FANOUT_CONFIG)")
    parser.add_argument("--ready-file", help="written once the pollers run")
    args = parser.parse_args(argv)
    config = Config.load_for_main(args.config)
    if config is None:
        return 2
    cls = CONSUMERS[args.channel]
    gate = ProviderGate(config.provider_max_in_flight, config.provider_max_rate_per_s)
    sink = AuditSink.from_config(config, cls.component)
    dead = DeadTokens()  # shared by the process's pollers
    try:
        consumers = [
            cls(config, gate=gate, audit_sink=sink, dead_tokens=dead)
            for _ in range(config.consumer_threads)
        ]
    except ValueError as exc:  # e.g. no inapp_url
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return serve(consumers, args.ready_file)


if __name__ == "__main__":
    sys.exit(main())
