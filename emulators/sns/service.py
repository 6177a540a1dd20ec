"""Publish and its consequences: delivery to APNs / FCM, SMS, topics, application events.

**Publish to a platform endpoint is synchronous here**: the endpoint's provider is called while
the Publish waits, and the answer reflects that first attempt. What the publisher gets:

* the provider delivered (200): ``MessageId``;
* the provider said the token is dead (APNs 410 Unregistered, 400 BadDeviceToken /
  DeviceTokenNotForTopic; FCM UNREGISTERED, SENDER_ID_MISMATCH, INVALID_ARGUMENT for the token):
  ``MessageId``, as AWS accepts the publish; the endpoint's ``Enabled`` becomes ``false`` and the
  application's ``EventEndpointUpdated`` and ``EventDeliveryFailure`` topics get the events
  (FailureType ``InvalidPlatformToken``). Every later Publish to it fails with
  ``EndpointDisabled`` (HTTP 400) and sends nothing, until SetEndpointAttributes enables it;
* another 4xx (payload too large, bad payload, bad credentials): ``MessageId`` and an
  ``EventDeliveryFailure`` event (FailureType the provider's reason): a permanent failure of
  this message that AWS would report the same way;
* the provider throttled (429): ``Throttling`` / "Rate exceeded" (HTTP 400), the error SNS
  answers a throttled Publish with, with ``Retry-After`` copied from the provider's answer (our
  extension; AWS sends none). botocore and the JavaScript SDK retry it with back-off;
* a provider 5xx: ``InternalError`` (HTTP 500; for a 503 ``ServiceUnavailable``, HTTP 503), and
  no answer at all (refused, reset, timed out): ``InternalError``. The SDKs retry both.

Why not AWS's own asynchronous retries: SNS accepts a mobile push and retries a failing
delivery itself (its delivery policy for customer-managed endpoints: 50 attempts over 6 hours,
with back-off), invisible to the publisher. Here the publisher sees throttling and provider
errors and retries them (the SDK's retry, then its own, e.g. an SQS redelivery), so every
attempt stays visible in the providers' ledgers and the back-pressure the design relies on is
the publisher's to honour, which is what the harness checks.

SMS (``PhoneNumber``) is recorded in the SMS ledger (a simulated carrier); an opted-out number
gets a ``MessageId`` and nothing is delivered (AWS: you cannot send to an opted-out number; its
delivery status says so). Topic publishes (Publish and PublishBatch, standard and FIFO topics)
are :mod:`emulators.sns.fanout`'s.

One :class:`SnsModel` per region (the region of a request's SigV4 scope), created on first use,
all of one account; ledgers, faults and transports are shared.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Awaitable
from typing import Any

from emulators.sns import batch
from emulators.sns import messages as msg
from emulators.sns.credentials import FcmCredential
from emulators.sns.delivery import (
    ApnsTransport,
    FcmTransport,
    ProviderAnswer,
    SqsTransport,
    TransportError,
)
from emulators.sns.errors import (
    SnsError,
    endpoint_disabled,
    internal_error,
    invalid_parameter,
    parameter_value_invalid,
    service_unavailable,
    throttling,
)
from emulators.sns.fanout import Fanout
from emulators.sns.faults import FaultState
from emulators.sns.http_delivery import HttpTransport
from emulators.sns.ledger import RowLog
from emulators.sns.model import (
    SMS_TYPES,
    EndpointChange,
    PlatformApplication,
    SnsModel,
    check_sender_id,
    valid_phone_number,
)
from emulators.sns.notifications import NotificationSigner, iso_now
from emulators.sns.topics import Published, Topic, check_fifo_parameters

log = logging.getLogger(__name__)

OPT_OUT_KEYWORDS = frozenset(
    {"ARRET", "CANCEL", "END", "OPT-OUT", "OPTOUT", "QUIT", "REMOVE", "STOP", "TD", "UNSUBSCRIBE"}
)
DEAD_TOKEN_MESSAGE = "Platform token associated with the endpoint is not valid"


class SnsService:
    """The endpoint's behaviour over its model, ledgers, faults and transports."""

    def __init__(
        self,
        model: SnsModel,
        faults: FaultState,
        *,
        apns: ApnsTransport,
        fcm: FcmTransport,
        sqs: SqsTransport,
        http: HttpTransport | None = None,
        base_url: str = "http://127.0.0.1",
    ) -> None:
        self.model = model  # the default region's
        self.models: dict[str, SnsModel] = {model.region: model}
        self.faults = faults
        self.apns = apns
        self.fcm = fcm
        self.sqs = sqs
        self.http = http or HttpTransport()
        self.base_url = base_url
        self.ledger = RowLog()
        self.sms_ledger = RowLog()
        self.deliveries = RowLog()
        # Every change to an endpoint, by the API or by a provider's dead answer: what a
        # checker needs to tell "SNS turned it off" from "the publisher turned it back on".
        self.endpoint_events = RowLog()
        self.signer = NotificationSigner()
        self.fanout = Fanout(self)
        self._tasks: set[asyncio.Task[None]] = set()

    def model_for(self, region: str) -> SnsModel:
        """The region's state (created on first use: every region exists, empty)."""
        model = self.models.get(region)
        if model is None:
            base = self.model
            model = self.models[region] = SnsModel(region, base.clock, base.account_id)
        return model

    # -- Publish -------------------------------------------------------------------------------
    async def publish(self, params: dict[str, Any], model: SnsModel | None = None) -> Published:
        model = model or self.model
        message = msg.check_message(params.get("Message"), msg.MAX_TOPIC_MESSAGE_BYTES)
        attributes = msg.message_attributes(params.get("MessageAttributes") or {})
        targets = [k for k in ("TopicArn", "TargetArn", "PhoneNumber") if params.get(k)]
        if not targets:
            raise invalid_parameter(
                "Invalid parameter: TopicArn or TargetArn Reason: no value for required parameter"
            )
        if len(targets) > 1:
            raise invalid_parameter(
                f"Invalid parameter: {targets[1]} Reason: Only one of TopicArn, TargetArn or "
                "PhoneNumber may be specified"
            )
        if targets[0] == "TopicArn":
            topic = model.topics.topic(params["TopicArn"])
            entry = self.check_topic_entry(topic, params, message, attributes)
            fault = self.faults.throttle(topic.arn)
            if fault is not None:
                raise throttling()
            return await self.fanout.publish(model, topic, message, **entry)
        msg.check_message(message)  # 256 KiB: the larger limit is a topic's only
        if targets[0] == "PhoneNumber":
            per_protocol = msg.structured(message, params.get("MessageStructure"))
            number = str(params["PhoneNumber"])
            return Published(
                self.publish_sms(number, message, per_protocol, attributes, model=model)
            )
        message_id = await self.publish_to_endpoint(
            params["TargetArn"],
            message,
            None,
            attributes,
            model=model,
            structure=params.get("MessageStructure"),
        )
        return Published(message_id)

    def check_topic_entry(
        self,
        topic: Topic,
        params: dict[str, Any],
        message: str,
        attributes: dict[str, msg.Attribute],
    ) -> dict[str, Any]:
        """What Publish (or one PublishBatch entry) to ``topic`` says, checked: the keyword
        arguments of :meth:`Fanout.publish` beside the message."""
        per_protocol = msg.structured(message, params.get("MessageStructure"))
        if per_protocol is not None and not isinstance(per_protocol.get("default"), str):
            raise invalid_parameter(
                "Invalid parameter: Message Structure - No default entry in JSON message body"
            )
        subject = self._subject(params.get("Subject"))
        if msg.publish_size(message, attributes) > topic.max_message_size:
            raise invalid_parameter("Invalid parameter: Message too long")
        group_id = params.get("MessageGroupId")
        dedup_id = params.get("MessageDeduplicationId")
        check_fifo_parameters(topic, group_id, dedup_id)
        return {
            "per_protocol": per_protocol,
            "subject": subject,
            "attributes": attributes,
            "group_id": group_id,
            "deduplication_id": dedup_id,
        }

    async def publish_batch(
        self, model: SnsModel, topic_arn: object, entries: list[dict[str, Any]]
    ) -> tuple[list[dict[str, str]], list[dict[str, Any]]]:
        """(Successful, Failed) of a PublishBatch. A malformed entry fails the whole batch, as
        on AWS; an entry the throttle fault refuses is a Failed entry (``Throttling``, not the
        sender's fault), which the caller must retry: what a batch publisher has to handle."""
        topic = model.topics.topic(topic_arn)
        batch.check_entries(entries)
        checked = []
        total = 0
        for entry in entries:
            message = msg.check_message(entry.get("Message"), msg.MAX_TOPIC_MESSAGE_BYTES)
            attributes = msg.message_attributes(entry.get("MessageAttributes") or {})
            total += msg.publish_size(message, attributes)
            checked.append(
                (entry["Id"], message, self.check_topic_entry(topic, entry, message, attributes))
            )
        if total > topic.max_message_size:
            raise batch.too_long()
        successful: list[dict[str, str]] = []
        failed: list[dict[str, Any]] = []
        for entry_id, message, args in checked:
            if self.faults.throttle(topic.arn) is not None:
                failed.append(batch.throttled(entry_id))
                continue
            published = await self.fanout.publish(model, topic, message, **args)
            result = {"Id": entry_id, "MessageId": published.message_id}
            if published.sequence_number is not None:
                result["SequenceNumber"] = published.sequence_number
            successful.append(result)
        return successful, failed

    @staticmethod
    def _subject(subject: object) -> str | None:
        """AWS: UTF-8 text with no line breaks or control characters, less than 100 characters
        (an empty one is refused too)."""
        if subject is None:
            return None
        text = str(subject)
        if not text or len(text) > 100 or not text.isprintable():
            raise invalid_parameter("Invalid parameter: Subject")
        return text

    async def publish_to_endpoint(
        self,
        target_arn: object,
        message: str,
        per_protocol: dict[str, Any] | None,
        attributes: dict[str, msg.Attribute],
        *,
        model: SnsModel | None = None,
        structure: object = None,
    ) -> str:
        """Publish to a platform endpoint. ``structure``: Publish's ``MessageStructure``, read
        here after the endpoint is found, so a disabled endpoint answers ``EndpointDisabled``
        whatever the message (AWS's order)."""
        model = model or self.model
        model._own(target_arn, "TargetArn")
        endpoint = model.endpoints.get(target_arn)  # type: ignore[arg-type]
        if endpoint is None:
            raise invalid_parameter(
                "Invalid parameter: TargetArn Reason: No endpoint found for the target arn "
                "specified"
            )
        app = model.applications[endpoint.application_arn]
        platform = app.platform
        refused: SnsError | None = None
        try:
            if structure is not None:
                per_protocol = msg.structured(message, structure)
            text = msg.platform_message(message, per_protocol, platform)
            if text is None:
                raise invalid_parameter(
                    "Invalid parameter: Message Structure - No default entry in JSON message body"
                )
        except SnsError as exc:
            refused, text, per_protocol = exc, "", None
        message_id = str(uuid.uuid4())
        is_platform = per_protocol is not None and platform in per_protocol
        tenant_id, notification_id = msg.payload_ids(text, platform, is_platform)
        row: dict[str, Any] = {
            "received_at": model.clock(),
            "provider": "fcm" if platform == "GCM" else "apns",
            "message_id": message_id,
            "endpoint_arn": endpoint.arn,
            "application_arn": app.arn,
            "platform": platform,
            "token": endpoint.token,
            "delivered": False,
            "endpoint_disabled": False,
            # Known before anything is sent: a refused publish is still attributed.
            "tenant_id": tenant_id or msg.text_attribute(attributes, "tenant_id"),
            "notification_id": notification_id or msg.text_attribute(attributes, "notification_id"),
        }
        fault = self.faults.throttle(app.arn)
        if fault is not None:
            self.ledger.append(**row, outcome=msg.SNS_THROTTLED, answer="Throttling", fault=fault)
            raise throttling()
        if not endpoint.enabled:
            self.ledger.append(**row, outcome=msg.ENDPOINT_DISABLED, answer="EndpointDisabled")
            raise endpoint_disabled()
        if refused is not None:
            raise refused
        published_at = row["received_at"]
        credential = app.credential
        if platform == "GCM":
            assert isinstance(credential, FcmCredential)
            request = msg.fcm_request(
                project_id=credential.project_id,
                token=endpoint.token,
                text=text,
                is_platform_payload=is_platform,
                attributes=attributes,
            )
            row["project"] = credential.project_id
            configured = self.fcm.configured()
        else:
            assert not isinstance(credential, FcmCredential)
            request = msg.apns_request(
                platform=platform,
                token=endpoint.token,
                text=text,
                is_platform_payload=is_platform,
                attributes=attributes,
                default_topic=credential.topic,
                bearer=credential.bearer(published_at),
                message_id=message_id,
                published_at=published_at,
            )
            row["apns_id"] = message_id
            configured = self.apns.configured(platform)
        row.update(
            collapse_id=request.collapse_id,
            tenant_id=request.tenant_id or row["tenant_id"],
            notification_id=request.notification_id or row["notification_id"],
        )
        if not configured:
            self.ledger.append(**row, outcome=msg.NOT_CONFIGURED, answer="InternalError")
            raise internal_error(f"no {row['provider']} URL is configured for {platform}")
        try:
            if platform == "GCM":
                answer: ProviderAnswer = await self.fcm.send(credential, request)  # type: ignore[arg-type]
            else:
                answer = await self.apns.send(
                    platform,
                    request,
                    credential.connection_group,  # type: ignore[union-attr]
                )
        except TransportError as exc:
            self.ledger.append(
                **row, outcome=msg.UNREACHABLE, answer="InternalError", reason=str(exc)[:200]
            )
            raise internal_error(
                f"Internal Error (the {row['provider']} provider: {exc})"
            ) from None
        outcome = msg.classify(row["provider"], answer.status, answer.headers, answer.body)
        row.update(
            status=answer.status,
            reason=outcome.reason,
            delivered=outcome.kind == msg.DELIVERED,
            retry_after=outcome.retry_after,
            outcome=outcome.kind,
        )
        if outcome.kind == msg.THROTTLED:
            self.ledger.append(**row, answer="Throttling")
            raise throttling(outcome.retry_after)
        if outcome.kind == msg.PROVIDER_ERROR:
            error = service_unavailable() if answer.status == 503 else internal_error()
            error.retry_after = outcome.retry_after
            self.ledger.append(**row, answer=error.code)
            raise error
        if outcome.kind == msg.TOKEN_INVALID:
            change = model.disable_endpoint(endpoint)
            row["endpoint_disabled"] = change is not None
            self.ledger.append(**row, answer=None)
            if change is not None:
                self.endpoint_changed(change, reason="InvalidPlatformToken", model=model)
            self._delivery_failure(
                model, app, endpoint.arn, message_id, "InvalidPlatformToken", DEAD_TOKEN_MESSAGE
            )
            return message_id
        self.ledger.append(**row, answer=None)
        if outcome.kind == msg.REJECTED:
            failure = outcome.reason or f"HTTP{answer.status}"
            self._delivery_failure(
                model,
                app,
                endpoint.arn,
                message_id,
                failure,
                f"The {row['provider']} provider refused the message: {answer.status} {failure}",
            )
        return message_id

    # -- SMS -----------------------------------------------------------------------------------
    def publish_sms(
        self,
        number: str,
        message: str,
        per_protocol: dict[str, Any] | None,
        attributes: dict[str, msg.Attribute],
        *,
        model: SnsModel | None = None,
        faults: bool = True,
    ) -> str:
        """Text ``number`` (the SMS ledger). ``faults``: whether the SMS throttle applies (a
        topic's SMS subscriptions are delivered by SNS, not published by the caller)."""
        model = model or self.model
        number = valid_phone_number(number)
        text = msg.platform_message(message, per_protocol, "sms")
        if text is None:
            raise invalid_parameter(
                "Invalid parameter: Message Structure - No default entry in JSON message body"
            )
        if len(text.encode("utf-8")) > msg.MAX_SMS_CHARS:
            raise invalid_parameter("Invalid parameter: Message too long")
        defaults = model.sms_attributes
        sender = msg.text_attribute(attributes, msg.SMS_SENDER_ID) or defaults.get(
            "DefaultSenderID"
        )
        if sender is not None:
            try:
                check_sender_id(sender, msg.SMS_SENDER_ID)
            except SnsError as exc:
                raise parameter_value_invalid(exc.message) from None
        sms_type = msg.text_attribute(attributes, msg.SMS_TYPE) or defaults.get(
            "DefaultSMSType", "Promotional"
        )
        if sms_type not in SMS_TYPES:
            raise parameter_value_invalid(
                f"The message attribute '{msg.SMS_TYPE}' has an invalid value '{sms_type}': one "
                f"of {', '.join(SMS_TYPES)}."
            )
        origination = msg.text_attribute(attributes, msg.SMS_ORIGINATION)
        if origination is not None:
            try:
                valid_phone_number(origination)
            except SnsError:
                raise parameter_value_invalid(
                    f"The message attribute '{msg.SMS_ORIGINATION}' must be an E.164 number."
                ) from None
        max_price = msg.text_attribute(attributes, msg.SMS_MAX_PRICE)
        encoding, parts = msg.sms_parts(text)
        message_id = str(uuid.uuid4())
        row: dict[str, Any] = {
            "provider": "sms",
            "token": number,
            "message_id": message_id,
            "message": text,
            "sender_id": sender,
            "sms_type": sms_type,
            "origination_number": origination,
            "max_price": max_price,
            "encoding": encoding,
            "parts": parts,
            "tenant_id": msg.text_attribute(attributes, "tenant_id"),
            "notification_id": msg.text_attribute(attributes, "notification_id"),
        }
        fault = self.faults.throttle("sms") if faults else None
        if fault is not None:
            self.sms_ledger.append(
                **row, status=None, delivered=False, reason="THROTTLED", fault=fault,
                answer="Throttling",
            )  # fmt: skip
            raise throttling()
        if number in model.opted_out:
            self.sms_ledger.append(
                **row, status=400, delivered=False, reason="OPTED_OUT", answer=None
            )
        else:
            self.sms_ledger.append(**row, status=200, delivered=True, answer=None)
        return message_id

    def handset_reply(self, number: str, text: str) -> bool:
        """A reply from a handset: an opt-out keyword opts the number out. True if it did."""
        if text.strip().upper() in OPT_OUT_KEYWORDS:
            self.model.opt_out(number)
            return True
        valid_phone_number(number)
        return False

    # -- application events ----------------------------------------------------------------------
    def endpoint_changed(
        self,
        change: EndpointChange | None,
        reason: str | None = None,
        model: SnsModel | None = None,
    ) -> None:
        """Record a created / updated / deleted endpoint in the endpoint log and tell the
        application's event topic. ``reason`` set: SNS itself changed it (a provider's dead
        answer), else a caller of the API did."""
        if change is None or (change.event == "EventEndpointUpdated" and not change.changed):
            return
        endpoint = change.endpoint
        self.endpoint_events.append(
            provider="sns",
            event=change.event[len("EventEndpoint") :].lower(),
            by="sns" if reason is not None else "api",
            reason=reason,
            endpoint_arn=endpoint.arn,
            application_arn=endpoint.application_arn,
            token=endpoint.token,
            enabled=endpoint.enabled,
            changed=dict(change.changed),
        )
        model = model or self.model
        app = model.applications.get(change.endpoint.application_arn)
        if app is None:
            return
        extra: dict[str, Any] = {}
        if change.changed:
            extra["Attributes"] = dict(change.changed)
        if reason is not None:
            extra["FailureType"] = reason
            extra["FailureMessage"] = DEAD_TOKEN_MESSAGE
        self._app_event(model, app, change.event, change.endpoint.arn, extra)

    def _delivery_failure(
        self,
        model: SnsModel,
        app: PlatformApplication,
        endpoint_arn: str,
        message_id: str,
        failure_type: str,
        failure_message: str,
    ) -> None:
        self._app_event(
            model,
            app,
            "EventDeliveryFailure",
            endpoint_arn,
            {
                "DeliveryAttempts": 1,
                "FailureMessage": failure_message,
                "FailureType": failure_type,
                "MessageId": message_id,
            },
        )

    def _app_event(
        self,
        model: SnsModel,
        app: PlatformApplication,
        event: str,
        endpoint_arn: str,
        extra: dict[str, Any],
    ) -> None:
        topic_arn = app.event_topic(event)
        if topic_arn is None:
            return
        topic = model.topics.get(topic_arn)
        event_type = event[len("Event") :]
        if topic is None or topic.fifo:
            log.warning(
                "sns: %s event for %s: topic %s does not exist or is FIFO",
                event_type,
                app.arn,
                topic_arn,
            )
            return
        body = {
            "EndpointArn": endpoint_arn,
            "EventType": event_type,
            **extra,
            "Resource": app.arn,
            "Service": "SNS",
            "Time": iso_now(),
        }
        subject = f"{event_type} event for app {app.name} ({app.platform})"
        self.background(
            self.fanout.publish(
                model,
                topic,
                json.dumps(body, separators=(",", ":")),
                None,
                subject,
                {},
                wait=False,
                event_type=event_type,
                endpoint_arn=endpoint_arn,
            )
        )

    # -- housekeeping --------------------------------------------------------------------------
    def background(self, coro: Awaitable[Any]) -> None:
        """Run ``coro`` on its own, counted in :attr:`pending_deliveries` until it ends."""
        task = asyncio.get_running_loop().create_task(coro)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @property
    def pending_deliveries(self) -> int:
        return len(self._tasks)

    def reset(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        self.model.reset()
        self.models = {self.model.region: self.model}
        self.ledger.reset()
        self.sms_ledger.reset()
        self.deliveries.reset()
        self.endpoint_events.reset()

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        self.apns.close()
        self.fcm.close()
        await self.sqs.close()
        await self.http.close()
