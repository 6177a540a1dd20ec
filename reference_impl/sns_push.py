"""Pushes through SNS mobile push (seed 004, "Managed push transport with token lifecycle").

Two roles, kept apart as the design keeps them:

* **token registration** (:class:`EndpointRegistry`, the Event API's device registration): a
  device becomes a platform endpoint of one platform application: the APNs application, or for
  FCM the application of the user's sender project (``recipient_user_id mod K``, so a device
  stays with one project). AWS's documented registration: CreatePlatformEndpoint (idempotent
  for the same token), then GetEndpointAttributes, and SetEndpointAttributes when the token
  changed or SNS had turned the endpoint off. The endpoint's ARN is kept in the user's record
  beside the device;
* **publishing** (:class:`SnsPushClient`, the push consumer): one Publish per device to its
  endpoint ARN, classified into the same outcomes as a direct APNs/FCM call:
  ``EndpointDisabled`` (SNS turned the endpoint off after a dead answer) is a dead token,
  throttling and 5xx are retried (a ``Retry-After`` pauses the scope; SNS's own throttling,
  which names no time, pauses it for :data:`THROTTLE_PAUSE_SECONDS`), the rest is definite.

Publishing goes through a lean query-protocol client (:mod:`reference_impl.sns_query`; boto3
when ``aws_lean_client`` is off) with no retries, as SES goes through boto3 with its retries
off: a throttled or failed publish leaves the job in its queue, where the consumer's backoff,
the dead-letter redrive and the dedup lease govern retries; an SDK retry inside the lease would
be a second, unaudited attempt.

SNS accepts a publish to a token that has just died (the provider's answer comes after): the
publisher learns of it from the application's ``EventDeliveryFailure`` events, which the
platform applications send to the ``<queue_prefix>-push-feedback`` queue through a topic
(:func:`feedback_names`; :mod:`reference_impl.push_consumer` reads it).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Mapping
from typing import Any

from botocore.config import Config as BotoConfig
from botocore.exceptions import BotoCoreError, ClientError

from reference_impl.aws import client, credentials_of
from reference_impl.config import Config
from reference_impl.providers import SendResult, fcm_project_for
from reference_impl.sns_query import LeanPublisher

FEEDBACK_VISIBILITY_SECONDS = 1
APNS_COLLAPSE_ID = "AWS.SNS.MOBILE.APNS.COLLAPSE_ID"
APNS_PUSH_TYPE = "AWS.SNS.MOBILE.APNS.PUSH_TYPE"
# The platform of the APNs application: the stack's APNs simulator answers as production does.
APNS_PLATFORM = "APNS"
_RETRIABLE = frozenset(
    {"Throttling", "ThrottledException", "Throttled", "InternalError", "ServiceUnavailable"}
)
_THROTTLED = frozenset({"Throttling", "ThrottledException", "Throttled"})
THROTTLE_PAUSE_SECONDS = 1.0
# AWS's answer to CreatePlatformEndpoint for a token already registered with other attributes.
_EXISTING_ENDPOINT = re.compile(r"Endpoint (arn:aws[\w-]*:sns:\S+) already exists")


def apns_application_name(config: Config) -> str:
    return f"{config.sns_application_prefix}-apns"


def fcm_application_name(config: Config, project: str) -> str:
    return f"{config.sns_application_prefix}-fcm-{project}"


def feedback_names(config: Config) -> tuple[str, str]:
    """(topic, queue) the platform applications' delivery-failure events go to."""
    return (f"{config.sns_application_prefix}-push-feedback", config.queue_name("push-feedback"))


def application_name_for(config: Config, user_id: str, platform: str) -> str:
    """The platform application a user's device belongs to: the APNs one, or the FCM one of the
    user's sender project (sticky: ``recipient_user_id mod K``)."""
    if platform == "apns":
        return apns_application_name(config)
    return fcm_application_name(config, fcm_project_for(user_id, config.fcm_projects))


def publish_request(
    job: Mapping[str, Any], platform: str, text: str, collapse_id: str | None
) -> dict[str, Any]:
    """The Publish parameters (without ``TargetArn``): per-platform JSON payloads carrying the
    tenant and notification ids, the collapse id as SNS's reserved attribute (APNs) or the
    FCM v1 message's ``collapse_key``."""
    ids = {"tenant_id": job["tenant_id"], "notification_id": job["notification_id"]}
    attributes: dict[str, Any] = {}
    if platform == "apns":
        payload: dict[str, Any] = {
            "aps": {"alert": {"title": "New activity", "body": text}},
            **ids,
        }
        body = {APNS_PLATFORM: json.dumps(payload, separators=(",", ":"))}
        attributes[APNS_PUSH_TYPE] = {"DataType": "String", "StringValue": "alert"}
        if collapse_id:
            attributes[APNS_COLLAPSE_ID] = {"DataType": "String", "StringValue": collapse_id}
    else:
        message: dict[str, Any] = {
            "notification": {"title": "New activity", "body": text},
            "data": dict(ids),
        }
        if collapse_id:
            message["android"] = {"collapse_key": collapse_id}
            message["apns"] = {"headers": {"apns-collapse-id": collapse_id}}
        body = {"GCM": json.dumps({"fcmV1Message": {"message": message}}, separators=(",", ":"))}
    request: dict[str, Any] = {
        "Message": json.dumps({"default": text, **body}, separators=(",", ":")),
        "MessageStructure": "json",
    }
    if attributes:
        request["MessageAttributes"] = attributes
    return request


def _retry_after(error: ClientError) -> float | None:
    headers = error.response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
    value = headers.get("retry-after")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def classify_error(error: ClientError) -> SendResult:
    """A Publish's error as a send outcome: the endpoint SNS turned off (or deleted) is a dead
    token; throttling and SNS's or the provider's 5xx are retried; the rest is definite."""
    code = error.response.get("Error", {}).get("Code")
    message = str(error.response.get("Error", {}).get("Message", ""))
    status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    if code == "EndpointDisabled" or (
        code in ("InvalidParameter", "NotFound") and "No endpoint found" in message
    ):
        return SendResult("dead_token", status, code)
    if code in _RETRIABLE or status == 429 or (status is not None and status >= 500):
        retry_after = _retry_after(error)
        if retry_after is None and code in _THROTTLED:
            # SNS's own throttling says only "Rate exceeded": back off the application for a
            # moment, as the SDKs' retry would, rather than meet the limit again at once.
            retry_after = THROTTLE_PAUSE_SECONDS
        return SendResult("retry", status, code, retry_after)
    return SendResult("rejected", status, code)


def _publish_config(config: Config) -> BotoConfig:
    timeout = config.provider_timeout_seconds
    return BotoConfig(
        retries={"total_max_attempts": 1},
        connect_timeout=timeout,
        read_timeout=timeout,
        max_pool_connections=config.provider_max_in_flight,
    )


class SnsPushClient:
    """The push consumer's publisher: one Publish per device to its endpoint."""

    def __init__(self, config: Config) -> None:
        boto = client(config, "sns", _publish_config(config))
        credentials = credentials_of(config) if config.aws_lean_client else None
        # Publish through the lean query-protocol client (reference_impl/sns_query.py), the
        # boto3 client's endpoint, region and credentials; boto3 itself without credentials.
        self.sns: Any = (
            LeanPublisher(
                boto.meta.endpoint_url,
                boto.meta.region_name,
                credentials,
                connect_timeout=config.provider_timeout_seconds,
                read_timeout=config.provider_timeout_seconds,
            )
            if credentials is not None
            else boto
        )

    def publish(self, endpoint_arn: str, request: Mapping[str, Any]) -> tuple[SendResult, str]:
        """The outcome and, when SNS accepted it, the MessageId ("" otherwise)."""
        try:
            answer = self.sns.publish(TargetArn=endpoint_arn, **request)
        except ClientError as exc:
            return classify_error(exc), ""
        except BotoCoreError as exc:
            return SendResult("retry", None, f"transport: {type(exc).__name__}"), ""
        return SendResult("sent", 200), str(answer.get("MessageId", ""))


class EndpointRegistry:
    """Token registration: a device's platform endpoint, created or brought up to date."""

    def __init__(self, config: Config, sns: Any = None) -> None:
        self.config = config
        self.sns = sns if sns is not None else client(config, "sns")
        self._arns: dict[str, str] = {}
        self._lock = threading.Lock()

    def application_arn(self, name: str) -> str:
        """The ARN of the platform application ``name`` (looked up once, then remembered)."""
        with self._lock:
            if name in self._arns:
                return self._arns[name]
        found: dict[str, str] = {}
        for page in self.sns.get_paginator("list_platform_applications").paginate():
            for app in page.get("PlatformApplications", []):
                arn = app["PlatformApplicationArn"]
                found[arn.rsplit("/", 1)[-1]] = arn
        with self._lock:
            self._arns.update(found)
            if name not in self._arns:
                raise LookupError(
                    f"no SNS platform application named {name!r} (provision creates it)"
                )
            return self._arns[name]

    def register(self, user_id: str, token: str, platform: str) -> str:
        """The endpoint ARN of (user's application, token), enabled and holding ``token``."""
        return self.register_in(application_name_for(self.config, user_id, platform), token)

    def register_in(self, application: str, token: str) -> str:
        """The endpoint ARN of ``token`` in the platform application named ``application``."""
        app = self.application_arn(application)
        try:
            arn = self.sns.create_platform_endpoint(PlatformApplicationArn=app, Token=token)[
                "EndpointArn"
            ]
        except ClientError as exc:
            found = _EXISTING_ENDPOINT.search(str(exc.response.get("Error", {}).get("Message")))
            if found is None:
                raise
            arn = found.group(1)
        attributes = self.sns.get_endpoint_attributes(EndpointArn=arn)["Attributes"]
        # The defect (red team 3, 15): only a changed token is written, so an endpoint SNS
        # turned off on a dead answer stays off when the device registers again.
        stays_off = "reregistered_endpoint_stays_disabled" in self.config.defects
        if attributes.get("Token") != token or (
            attributes.get("Enabled") != "true" and not stays_off
        ):
            # A device registering again has a working token: the endpoint SNS turned off on a
            # dead answer is turned on with it (AWS's documented registration).
            self.sns.set_endpoint_attributes(
                EndpointArn=arn, Attributes={"Token": token, "Enabled": "true"}
            )
        return str(arn)


def simulator_credentials(config: Config, project: str | None) -> dict[str, str]:
    """Platform-application attributes with fresh keys for the stack's simulators: an APNs
    token key (ES256 .p8, team and key ids, the bundle id as topic), or an FCM v1 service
    account whose ``token_uri`` is the FCM simulator's. On real AWS a team creates the
    applications with its own credentials under the same names."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    def pem(key: Any) -> str:
        return key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode()

    if project is None:
        if config.apns_key_file and config.apns_key_id and config.apns_team_id:
            with open(config.apns_key_file) as handle:  # the team's key, as Apple knows it
                return {
                    "PlatformCredential": handle.read(),
                    "PlatformPrincipal": config.apns_key_id,
                    "ApplePlatformTeamID": config.apns_team_id,
                    "ApplePlatformBundleID": config.apns_topic,
                }
        return {
            "PlatformCredential": pem(ec.generate_private_key(ec.SECP256R1())),
            "PlatformPrincipal": "FANOUTKEY1",
            "ApplePlatformTeamID": "FANOUTTEAM",
            "ApplePlatformBundleID": config.apns_topic,
        }
    email = f"fanout-sns@{project}.iam.gserviceaccount.com"
    account = {
        "type": "service_account",
        "project_id": project,
        "private_key_id": "fanout-sns",
        "private_key": pem(rsa.generate_private_key(public_exponent=65537, key_size=2048)),
        "client_email": email,
        "client_id": "1",
        "token_uri": config.fcm_url.rstrip("/") + "/token",
    }
    return {"PlatformCredential": json.dumps(account)}


def provision_sns(config: Config, sqs: Any) -> dict[str, str]:
    """The platform applications (APNs, one FCM per sender project) and the delivery-failure
    feedback (a topic with the feedback queue subscribed, raw); return the applications' ARNs
    by name. Idempotent: CreatePlatformApplication and CreateTopic are (an existing
    application keeps its credentials)."""
    sns = client(config, "sns")
    topic_name, queue_name = feedback_names(config)
    topic_arn = sns.create_topic(Name=topic_name)["TopicArn"]
    # A short visibility timeout: an event that overtook its publisher is looked at again soon.
    queue_url = sqs.create_queue(
        QueueName=queue_name, Attributes={"VisibilityTimeout": str(FEEDBACK_VISIBILITY_SECONDS)}
    )["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    subscribed = {
        s["Endpoint"]
        for page in sns.get_paginator("list_subscriptions_by_topic").paginate(TopicArn=topic_arn)
        for s in page.get("Subscriptions", [])
    }
    if queue_arn not in subscribed:
        sns.subscribe(
            TopicArn=topic_arn,
            Protocol="sqs",
            Endpoint=queue_arn,
            Attributes={"RawMessageDelivery": "true"},
        )
    registry = EndpointRegistry(config, sns)
    wanted: list[tuple[str, str, str | None]] = [
        (apns_application_name(config), APNS_PLATFORM, None)
    ] + [(fcm_application_name(config, p), "GCM", p) for p in config.fcm_projects]
    arns: dict[str, str] = {}
    for name, platform, project in wanted:
        try:
            arns[name] = registry.application_arn(name)
        except LookupError:
            if not config.sns_endpoint:
                raise  # real AWS: the team's own credentials, never generated ones
            arns[name] = sns.create_platform_application(
                Name=name, Platform=platform, Attributes=simulator_credentials(config, project)
            )["PlatformApplicationArn"]
        sns.set_platform_application_attributes(
            PlatformApplicationArn=arns[name],
            Attributes={"EventDeliveryFailure": topic_arn},
        )
    return arns
