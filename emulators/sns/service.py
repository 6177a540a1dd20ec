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
delivery status says so). Topic publishes are delivered to the topic's ``sqs`` subscriptions
in the background (SNS's envelope, or raw with ``RawMessageDelivery``), with up to 3 attempts.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import logging
import uuid
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID

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
from emulators.sns.faults import FaultState
from emulators.sns.ledger import RowLog
from emulators.sns.model import (
    SMS_TYPES,
    EndpointChange,
    PlatformApplication,
    SnsModel,
    Subscription,
    Topic,
    check_sender_id,
    valid_phone_number,
)

log = logging.getLogger(__name__)

SQS_ATTEMPTS = 3
SQS_BACKOFF = (0.2, 1.0)
OPT_OUT_KEYWORDS = frozenset(
    {"ARRET", "CANCEL", "END", "OPT-OUT", "OPTOUT", "QUIT", "REMOVE", "STOP", "TD", "UNSUBSCRIBE"}
)
DEAD_TOKEN_MESSAGE = "Platform token associated with the endpoint is not valid"


def iso_now() -> str:
    now = datetime.datetime.now(datetime.UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"


class NotificationSigner:
    """Signs topic notifications as SNS does (SignatureVersion 1: SHA1withRSA over AWS's
    canonical string) with a key made at start; the certificate is served at
    ``/_sns/SimpleNotificationService.pem``."""

    def __init__(self) -> None:
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sns.local")])
        now = datetime.datetime.now(datetime.UTC)
        self.certificate_pem = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=365))
            .sign(self.key, hashes.SHA256())
            .public_bytes(serialization.Encoding.PEM)
        )

    def sign(self, envelope: dict[str, Any]) -> str:
        keys = ["Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type"]
        text = "".join(f"{k}\n{envelope[k]}\n" for k in keys if envelope.get(k) is not None)
        signature = self.key.sign(text.encode("utf-8"), padding.PKCS1v15(), hashes.SHA1())
        return base64.b64encode(signature).decode()


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
        base_url: str = "http://127.0.0.1",
    ) -> None:
        self.model = model
        self.faults = faults
        self.apns = apns
        self.fcm = fcm
        self.sqs = sqs
        self.base_url = base_url
        self.ledger = RowLog()
        self.sms_ledger = RowLog()
        self.deliveries = RowLog()
        # Every change to an endpoint, by the API or by a provider's dead answer: what a
        # checker needs to tell "SNS turned it off" from "the publisher turned it back on".
        self.endpoint_events = RowLog()
        self.signer = NotificationSigner()
        self._tasks: set[asyncio.Task[None]] = set()

    # -- Publish -------------------------------------------------------------------------------
    async def publish(self, params: dict[str, Any]) -> str:
        message = msg.check_message(params.get("Message"))
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
        per_protocol = msg.structured(message, params.get("MessageStructure"))
        if targets[0] == "PhoneNumber":
            return self.publish_sms(str(params["PhoneNumber"]), message, per_protocol, attributes)
        if targets[0] == "TopicArn":
            topic = self.model.topic(params["TopicArn"])
            subject = self._subject(params.get("Subject"))
            if per_protocol is not None and "default" not in per_protocol:
                raise invalid_parameter(
                    "Invalid parameter: Message Structure - No default entry in JSON message body"
                )
            fault = self.faults.throttle(topic.arn)
            if fault is not None:
                raise throttling()
            return self.publish_to_topic(topic, message, per_protocol, subject, attributes)
        return await self.publish_to_endpoint(
            params["TargetArn"], message, per_protocol, attributes
        )

    @staticmethod
    def _subject(subject: object) -> str | None:
        if subject is None or subject == "":
            return None
        text = str(subject)
        if len(text) > 100 or not text.isprintable() or not text.isascii():
            raise invalid_parameter(
                "Invalid parameter: Subject Reason: at most 100 printable ASCII characters"
            )
        return text

    async def publish_to_endpoint(
        self,
        target_arn: object,
        message: str,
        per_protocol: dict[str, Any] | None,
        attributes: dict[str, msg.Attribute],
    ) -> str:
        self.model._own(target_arn, "TargetArn")
        endpoint = self.model.endpoints.get(target_arn)  # type: ignore[arg-type]
        if endpoint is None:
            raise invalid_parameter(
                "Invalid parameter: TargetArn Reason: No endpoint found for the target arn "
                "specified"
            )
        app = self.model.applications[endpoint.application_arn]
        platform = app.platform
        text = msg.platform_message(message, per_protocol, platform)
        if text is None:
            raise invalid_parameter(
                "Invalid parameter: Message Structure - No default entry in JSON message body"
            )
        message_id = str(uuid.uuid4())
        is_platform = per_protocol is not None and platform in per_protocol
        tenant_id, notification_id = msg.payload_ids(text, platform, is_platform)
        row: dict[str, Any] = {
            "received_at": self.model.clock(),
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
                answer = await self.apns.send(platform, request)
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
            change = self.model.disable_endpoint(endpoint)
            row["endpoint_disabled"] = change is not None
            self.ledger.append(**row, answer=None)
            if change is not None:
                self.endpoint_changed(change, reason="InvalidPlatformToken")
            self._delivery_failure(
                app, endpoint.arn, message_id, "InvalidPlatformToken", DEAD_TOKEN_MESSAGE
            )
            return message_id
        self.ledger.append(**row, answer=None)
        if outcome.kind == msg.REJECTED:
            failure = outcome.reason or f"HTTP{answer.status}"
            self._delivery_failure(
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
    ) -> str:
        number = valid_phone_number(number)
        text = msg.platform_message(message, per_protocol, "sms")
        if text is None:
            raise invalid_parameter(
                "Invalid parameter: Message Structure - No default entry in JSON message body"
            )
        if len(text.encode("utf-8")) > msg.MAX_SMS_CHARS:
            raise invalid_parameter("Invalid parameter: Message too long")
        defaults = self.model.sms_attributes
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
        fault = self.faults.throttle("sms")
        if fault is not None:
            self.sms_ledger.append(
                **row, status=None, delivered=False, reason="THROTTLED", fault=fault,
                answer="Throttling",
            )  # fmt: skip
            raise throttling()
        if number in self.model.opted_out:
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

    # -- topics and events -----------------------------------------------------------------------
    def publish_to_topic(
        self,
        topic: Topic,
        message: str,
        per_protocol: dict[str, Any] | None,
        subject: str | None,
        attributes: dict[str, msg.Attribute],
        *,
        event_type: str | None = None,
        endpoint_arn: str | None = None,
    ) -> str:
        """Hand the message to every subscription in the background; returns its MessageId."""
        message_id = str(uuid.uuid4())
        text = msg.platform_message(message, per_protocol, "sqs") or message
        timestamp = iso_now()
        for sub in self.model.topic_subscriptions(topic):
            body, sqs_attributes = self._sqs_message(
                sub, topic, message_id, text, subject, attributes, timestamp
            )
            self._background(
                self._deliver_to_sqs(
                    sub, message_id, body, sqs_attributes, event_type, endpoint_arn
                )
            )
        return message_id

    def _sqs_message(
        self,
        sub: Subscription,
        topic: Topic,
        message_id: str,
        text: str,
        subject: str | None,
        attributes: dict[str, msg.Attribute],
        timestamp: str,
    ) -> tuple[str, dict[str, Any] | None]:
        if sub.raw:
            sqs_attributes = {}
            for name, attr in attributes.items():
                if isinstance(attr.value, bytes):
                    value = {"BinaryValue": base64.b64encode(attr.value).decode()}
                else:
                    value = {"StringValue": attr.value}
                sqs_attributes[name] = {"DataType": attr.data_type, **value}
            return text, sqs_attributes or None
        envelope: dict[str, Any] = {
            "Type": "Notification",
            "MessageId": message_id,
            "TopicArn": topic.arn,
        }
        if subject is not None:
            envelope["Subject"] = subject
        envelope.update(
            {
                "Message": text,
                "Timestamp": timestamp,
                "SignatureVersion": "1",
            }
        )
        envelope["Signature"] = self.signer.sign(envelope)
        envelope["SigningCertURL"] = f"{self.base_url}/_sns/SimpleNotificationService.pem"
        envelope["UnsubscribeURL"] = (
            f"{self.base_url}/?Action=Unsubscribe&SubscriptionArn={sub.arn}"
        )
        if attributes:
            envelope["MessageAttributes"] = {
                name: {
                    "Type": attr.data_type,
                    "Value": base64.b64encode(attr.value).decode()
                    if isinstance(attr.value, bytes)
                    else attr.value,
                }
                for name, attr in attributes.items()
            }
        return json.dumps(envelope, ensure_ascii=False), None

    async def _deliver_to_sqs(
        self,
        sub: Subscription,
        message_id: str,
        body: str,
        attributes: dict[str, Any] | None,
        event_type: str | None,
        endpoint_arn: str | None,
    ) -> None:
        error: str | None = None
        sqs_id: str | None = None
        attempts = 0
        for attempts in range(1, SQS_ATTEMPTS + 1):
            try:
                sqs_id = await self.sqs.send_message(sub.target, body, attributes)
                error = None
                break
            except TransportError as exc:
                error = str(exc)[:300]
                if attempts < SQS_ATTEMPTS:
                    await asyncio.sleep(SQS_BACKOFF[attempts - 1])
        if error is not None:
            log.warning("sns: delivery to %s failed: %s", sub.endpoint, error)
        self.deliveries.append(
            provider="sqs",
            topic_arn=sub.topic_arn,
            subscription_arn=sub.arn,
            queue_url=self.sqs.queue_url(sub.target) if self.sqs.configured() else None,
            message_id=message_id,
            sqs_message_id=sqs_id,
            event_type=event_type,
            endpoint_arn=endpoint_arn,
            delivered=error is None,
            error=error,
            attempts=attempts,
        )

    def endpoint_changed(self, change: EndpointChange | None, reason: str | None = None) -> None:
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
        app = self.model.applications.get(change.endpoint.application_arn)
        if app is None:
            return
        extra: dict[str, Any] = {}
        if change.changed:
            extra["Attributes"] = dict(change.changed)
        if reason is not None:
            extra["FailureType"] = reason
            extra["FailureMessage"] = DEAD_TOKEN_MESSAGE
        self._app_event(app, change.event, change.endpoint.arn, extra)

    def _delivery_failure(
        self,
        app: PlatformApplication,
        endpoint_arn: str,
        message_id: str,
        failure_type: str,
        failure_message: str,
    ) -> None:
        self._app_event(
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
        self, app: PlatformApplication, event: str, endpoint_arn: str, extra: dict[str, Any]
    ) -> None:
        topic_arn = app.event_topic(event)
        if topic_arn is None:
            return
        topic = self.model.topics.get(topic_arn)
        event_type = event[len("Event") :]
        if topic is None:
            log.warning(
                "sns: %s event for %s: topic %s does not exist", event_type, app.arn, topic_arn
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
        self.publish_to_topic(
            topic,
            json.dumps(body, separators=(",", ":")),
            None,
            subject,
            {},
            event_type=event_type,
            endpoint_arn=endpoint_arn,
        )

    # -- housekeeping --------------------------------------------------------------------------
    def _background(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @property
    def pending_deliveries(self) -> int:
        return len(self._tasks)

    def reset(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        self.model.reset()
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
