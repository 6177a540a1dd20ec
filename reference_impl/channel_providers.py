"""SES v2, API Gateway Management API and SNS (SMS) clients: one call per recipient, classified.

All go through boto3 (``sesv2``, ``apigatewaymanagementapi``, ``sns``), as a Lambda on AWS
would, with the SDK's own retries off: a throttled or failed call leaves the job in its queue,
where the consumer's backoff, the dead-letter redrive and the dedup lease already govern
retries. An SDK retry inside the lease would be a second, unaudited attempt.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from botocore.config import Config as BotoConfig
from botocore.exceptions import BotoCoreError, ClientError

from reference_impl.aws import client
from reference_impl.config import Config
from reference_impl.providers import SendResult

# SES message tags take only letters, digits, '_' and '-' (tenant ids may also hold '.').
_TAG_SAFE = re.compile(r"^[A-Za-z0-9_-]{1,256}$")
TENANT_HEADER = "X-Fanout-Tenant-Id"
NOTIFICATION_HEADER = "X-Fanout-Notification-Id"
# SES errors that clear with time (throttling, a paused account, the daily quota); the rest
# (MessageRejected, BadRequestException, ...) are definite for this message.
_SES_RETRIABLE = frozenset(
    {"TooManyRequestsException", "LimitExceededException", "SendingPausedException"}
)


def _boto_config(config: Config) -> BotoConfig:
    timeout = config.provider_timeout_seconds
    return BotoConfig(
        retries={"total_max_attempts": 1},
        connect_timeout=timeout,
        read_timeout=timeout,
        max_pool_connections=config.provider_max_in_flight,
    )


def _retry_after(error: ClientError) -> float | None:
    headers = error.response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
    try:
        value = headers.get("retry-after")
        return float(value) if value is not None else None
    except ValueError:
        return None


def _classify(error: ClientError, retriable: frozenset[str], gone: str | None) -> SendResult:
    code = error.response.get("Error", {}).get("Code")
    status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    if gone is not None and code == gone:
        return SendResult("offline", status, code)
    if code in retriable or status == 429 or (status is not None and status >= 500):
        return SendResult("retry", status, code, _retry_after(error))
    return SendResult("rejected", status, code)


def email_content(job: dict[str, Any]) -> dict[str, Any]:
    """The SendEmail ``Content``: a generic body (the content is read after signing in, as for
    a locked device's push) and the ids as headers, which any id survives."""
    return {
        "Simple": {
            "Subject": {"Data": "New activity", "Charset": "UTF-8"},
            "Body": {
                "Text": {
                    "Data": f"{job['author_id']} {job['kind']}. Open the app to see it.",
                    "Charset": "UTF-8",
                }
            },
            "Headers": [
                {"Name": TENANT_HEADER, "Value": job["tenant_id"]},
                {"Name": NOTIFICATION_HEADER, "Value": job["notification_id"]},
            ],
        }
    }


def email_tags(job: dict[str, Any]) -> list[dict[str, str]]:
    """Message tags for SES event publishing (bounces, complaints carry them), where legal."""
    return [
        {"Name": name, "Value": job[name]}
        for name in ("tenant_id", "notification_id", "kind")
        if _TAG_SAFE.match(job[name])
    ]


class SesClient:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.ses = client(config, "sesv2", _boto_config(config))

    def send(self, address: str, job: dict[str, Any]) -> SendResult:
        kwargs: dict[str, Any] = {
            "FromEmailAddress": self.config.ses_from_address,
            "Destination": {"ToAddresses": [address]},
            "Content": email_content(job),
            "EmailTags": email_tags(job),
        }
        if self.config.ses_configuration_set:
            kwargs["ConfigurationSetName"] = self.config.ses_configuration_set
        try:
            self.ses.send_email(**kwargs)
        except ClientError as exc:
            if "ses_5xx_rejected" in self.config.defects:
                # The defect: only SES's throttling codes retried, a 500 / 503 acknowledged.
                code = exc.response.get("Error", {}).get("Code")
                if code not in _SES_RETRIABLE:
                    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
                    return SendResult("rejected", status, code)
            return _classify(exc, _SES_RETRIABLE, None)
        except BotoCoreError as exc:
            return SendResult("retry", None, f"transport: {type(exc).__name__}")
        return SendResult("sent", 200)


def connection_id(tenant_id: str, user_id: str) -> str:
    """The user's WebSocket connection id: ``<tenant>:<user>``. A simplification: API Gateway
    mints opaque ids at $connect, which a real system stores per user (one row per open
    connection); the reference derives one per user so that no connect handler is needed."""
    return f"{tenant_id}:{user_id}"


def inapp_payload(job: dict[str, Any]) -> bytes:
    return json.dumps(
        {
            "type": "notification",
            "tenant_id": job["tenant_id"],
            "notification_id": job["notification_id"],
            "author_id": job["author_id"],
            "kind": job["kind"],
            "object_id": job.get("object_id"),
        },
        separators=(",", ":"),
    ).encode()


class InAppClient:
    def __init__(self, config: Config) -> None:
        if not config.inapp_url:
            # The Management API has no regional default: it is the WebSocket API's own stage.
            raise ValueError("inapp_url is required: https://<api-id>.execute-api.<region>/<stage>")
        self.gateway = client(config, "apigatewaymanagementapi", _boto_config(config))

    def send(self, connection: str, job: dict[str, Any]) -> SendResult:
        try:
            self.gateway.post_to_connection(ConnectionId=connection, Data=inapp_payload(job))
        except ClientError as exc:
            return _classify(exc, frozenset({"LimitExceededException"}), "GoneException")
        except BotoCoreError as exc:
            return SendResult("retry", None, f"transport: {type(exc).__name__}")
        return SendResult("sent", 200)


# SNS errors that clear with time: Publish's throttling (HTTP 400 "Rate exceeded"), the SMS
# settings calls' (429), and the service's own failures. InvalidParameter (a number SNS cannot
# publish to), AuthorizationError and the rest are definite for this message.
_SNS_RETRIABLE = frozenset(
    {"Throttling", "Throttled", "ThrottledException", "InternalError", "ServiceUnavailable"}
)
SMS_TYPE_ATTRIBUTE = "AWS.SNS.SMS.SMSType"
SMS_SENDER_ATTRIBUTE = "AWS.SNS.SMS.SenderID"


def sms_text(job: dict[str, Any]) -> str:
    """The SMS body: who did what, nothing of the content (read after signing in, as for an
    email); short and GSM-7 so that it is one part."""
    return f"{job['author_id']} {job['kind']}. Open the app to see it."


def sms_attributes(config: Config, job: dict[str, Any]) -> dict[str, Any]:
    """Publish's MessageAttributes: the SMS settings SNS reads, and the job's ids (carried as
    custom attributes, which SNS keeps with the message and its delivery status logs)."""
    attributes = {
        SMS_TYPE_ATTRIBUTE: {"DataType": "String", "StringValue": config.sms_type},
        "tenant_id": {"DataType": "String", "StringValue": job["tenant_id"]},
        "notification_id": {"DataType": "String", "StringValue": job["notification_id"]},
    }
    if config.sms_sender_id:
        attributes[SMS_SENDER_ATTRIBUTE] = {
            "DataType": "String",
            "StringValue": config.sms_sender_id,
        }
    return attributes


@dataclass(frozen=True)
class OptOutAnswer:
    """CheckIfPhoneNumberIsOptedOut's answer: ``opted_out``, or ``error`` when SNS did not say
    (a retriable or a definite failure, classified as a send's)."""

    opted_out: bool
    error: SendResult | None = None


class SmsClient:
    """SMS through SNS. SNS accepts a Publish to an opted-out number (it answers a MessageId and
    delivers nothing), so the sender asks first: :meth:`opted_out`, then :meth:`send`."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.sns = client(config, "sns", _boto_config(config))

    def opted_out(self, number: str) -> OptOutAnswer:
        try:
            answer = self.sns.check_if_phone_number_is_opted_out(phoneNumber=number)
        except ClientError as exc:
            return OptOutAnswer(False, _classify(exc, _SNS_RETRIABLE, None))
        except BotoCoreError as exc:
            return OptOutAnswer(
                False, SendResult("retry", None, f"transport: {type(exc).__name__}")
            )
        return OptOutAnswer(bool(answer.get("isOptedOut")))

    def send(self, number: str, job: dict[str, Any]) -> SendResult:
        try:
            self.sns.publish(
                PhoneNumber=number,
                Message=sms_text(job),
                MessageAttributes=sms_attributes(self.config, job),
            )
        except ClientError as exc:
            return _classify(exc, _SNS_RETRIABLE, None)
        except BotoCoreError as exc:
            return SendResult("retry", None, f"transport: {type(exc).__name__}")
        return SendResult("sent", 200)
