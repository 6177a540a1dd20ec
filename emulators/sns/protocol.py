"""The AWS query protocol of SNS (what boto3 and every AWS SDK speak for SNS), onto the model.

botocore's SNS model (``sns/2010-03-31``) declares ``"protocols": ["query"]`` only: a request is
``POST /`` with a form-encoded body (``Action=Publish&Version=2010-03-31&...``; a GET with the
same parameters in the URL works too), maps as ``Attributes.entry.N.key`` /
``Attributes.entry.N.value`` (``MessageAttributes.entry.N.Name`` / ``.Value.DataType`` /
``.Value.StringValue`` / ``.Value.BinaryValue``), lists as ``name.member.N``. Answers are XML
(``<PublishResponse><PublishResult>...</PublishResult><ResponseMetadata><RequestId>``), errors
``<ErrorResponse><Error><Type>Sender</Type><Code>...</Code><Message>...</Message></Error>
<RequestId>...</RequestId></ErrorResponse>`` with the error's HTTP status. Signatures are not
checked.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl
from xml.sax.saxutils import escape

from emulators.http_server import Request, Response
from emulators.sns.errors import SnsError, throttled, validation_error
from emulators.sns.model import (
    ACCOUNT_ID,
    Endpoint,
    EndpointChange,
    PlatformApplication,
    Subscription,
)
from emulators.sns.service import SnsService

XMLNS = "http://sns.amazonaws.com/doc/2010-03-31/"
CONTENT_TYPE = "text/xml"
MAX_ENTRIES = 1000

Handler = Callable[[dict[str, Any]], Awaitable[str | None]]


class _Ids:
    """Cheap unique request ids shaped like UUIDs (a random prefix and a counter)."""

    def __init__(self) -> None:
        self.prefix = os.urandom(10).hex()
        self.counter = itertools.count(1)

    def next(self) -> str:
        p = self.prefix
        return f"{p[:8]}-{p[8:12]}-{p[12:16]}-{p[16:20]}-{next(self.counter):012x}"


def _e(value: object) -> str:
    return escape(str(value))


def _map_xml(name: str, mapping: dict[str, str]) -> str:
    entries = "".join(
        f"<entry><key>{_e(k)}</key><value>{_e(v)}</value></entry>" for k, v in mapping.items()
    )
    return f"<{name}>{entries}</{name}>"


def _next_token(name: str, token: str | None) -> str:
    return f"<{name}>{_e(token)}</{name}>" if token else ""


def query_map(
    params: dict[str, str], prefix: str, key: str = "key", value: str = "value"
) -> dict[str, str]:
    """``prefix.entry.N.key`` / ``prefix.entry.N.value`` pairs as a dict (N from 1, contiguous)."""
    out: dict[str, str] = {}
    for i in range(1, MAX_ENTRIES + 1):
        name = params.get(f"{prefix}.entry.{i}.{key}")
        if name is None:
            break
        out[name] = params.get(f"{prefix}.entry.{i}.{value}", "")
    return out


def message_attribute_entries(params: dict[str, str]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for i in range(1, MAX_ENTRIES + 1):
        base = f"MessageAttributes.entry.{i}"
        name = params.get(f"{base}.Name")
        if name is None:
            break
        entry = {}
        for field in ("DataType", "StringValue", "BinaryValue"):
            value = params.get(f"{base}.Value.{field}")
            if value is not None:
                entry[field] = value
        out[name] = entry
    return out


def query_list(params: dict[str, str], prefix: str) -> list[str]:
    out = []
    for i in range(1, MAX_ENTRIES + 1):
        value = params.get(f"{prefix}.member.{i}")
        if value is None:
            break
        out.append(value)
    return out


def _required(params: dict[str, str], name: str, member: str | None = None) -> str:
    value = params.get(name)
    if value is None:
        raise validation_error(member or name[0].lower() + name[1:])
    return value


class SnsProtocol:
    """Request handler for the SNS API."""

    def __init__(self, service: SnsService) -> None:
        self.service = service
        self.model = service.model
        self.ids = _Ids()
        self.operations: dict[str, Handler] = {
            "CreatePlatformApplication": self.create_platform_application,
            "GetPlatformApplicationAttributes": self.get_platform_application_attributes,
            "SetPlatformApplicationAttributes": self.set_platform_application_attributes,
            "DeletePlatformApplication": self.delete_platform_application,
            "ListPlatformApplications": self.list_platform_applications,
            "CreatePlatformEndpoint": self.create_platform_endpoint,
            "GetEndpointAttributes": self.get_endpoint_attributes,
            "SetEndpointAttributes": self.set_endpoint_attributes,
            "DeleteEndpoint": self.delete_endpoint,
            "ListEndpointsByPlatformApplication": self.list_endpoints_by_platform_application,
            "Publish": self.publish,
            "CreateTopic": self.create_topic,
            "DeleteTopic": self.delete_topic,
            "ListTopics": self.list_topics,
            "GetTopicAttributes": self.get_topic_attributes,
            "Subscribe": self.subscribe,
            "Unsubscribe": self.unsubscribe,
            "ListSubscriptionsByTopic": self.list_subscriptions_by_topic,
            "GetSubscriptionAttributes": self.get_subscription_attributes,
            "SetSubscriptionAttributes": self.set_subscription_attributes,
            "SetSMSAttributes": self.set_sms_attributes,
            "GetSMSAttributes": self.get_sms_attributes,
            "CheckIfPhoneNumberIsOptedOut": self.check_if_phone_number_is_opted_out,
            "ListPhoneNumbersOptedOut": self.list_phone_numbers_opted_out,
            "OptInPhoneNumber": self.opt_in_phone_number,
        }

    # -- responses -----------------------------------------------------------------------------
    def _ok(self, action: str, result: str | None) -> Response:
        inner = "" if result is None else f"<{action}Result>{result}</{action}Result>"
        request_id = self.ids.next()
        body = (
            f'<{action}Response xmlns="{XMLNS}">{inner}<ResponseMetadata><RequestId>'
            f"{request_id}</RequestId></ResponseMetadata></{action}Response>"
        )
        headers = {"content-type": CONTENT_TYPE, "x-amzn-requestid": request_id}
        return Response(200, headers, body.encode("utf-8"))

    def error(self, err: SnsError) -> Response:
        kind = "Sender" if err.sender else "Receiver"
        request_id = self.ids.next()
        body = (
            f'<ErrorResponse xmlns="{XMLNS}"><Error><Type>{kind}</Type><Code>{_e(err.code)}</Code>'
            f"<Message>{_e(err.message)}</Message></Error><RequestId>{request_id}</RequestId>"
            "</ErrorResponse>"
        )
        headers = {"content-type": CONTENT_TYPE, "x-amzn-requestid": request_id}
        if err.retry_after is not None:
            headers["retry-after"] = str(max(0, int(err.retry_after + 0.999)))
        return Response(err.status, headers, body.encode("utf-8"))

    # -- dispatch ------------------------------------------------------------------------------
    async def handle(self, request: Request) -> Response:
        if request.method not in ("POST", "GET"):
            return self.error(SnsError("InvalidAction", "SNS takes POST (or GET) requests.", 405))
        params: dict[str, Any] = dict(request.query)
        if request.body:
            try:
                params.update(parse_qsl(request.body.decode("utf-8"), keep_blank_values=True))
            except UnicodeDecodeError:
                return self.error(SnsError("MalformedQueryString", "The body is not UTF-8."))
        action = params.get("Action")
        if not action:
            return self.error(
                SnsError(
                    "MissingAction", "The request is missing an action or a required parameter."
                )
            )
        handler = self.operations.get(action)
        if handler is None:
            return self.error(
                SnsError("InvalidAction", f"The action {action} is not valid for this web service.")
            )
        try:
            return self._ok(action, await handler(params))
        except SnsError as err:
            return self.error(err)

    # -- platform applications -----------------------------------------------------------------
    async def create_platform_application(self, p: dict[str, Any]) -> str:
        app = self.model.create_platform_application(
            _required(p, "Name"), _required(p, "Platform"), query_map(p, "Attributes")
        )
        return f"<PlatformApplicationArn>{_e(app.arn)}</PlatformApplicationArn>"

    async def get_platform_application_attributes(self, p: dict[str, Any]) -> str:
        app = self.model.application(_required(p, "PlatformApplicationArn"))
        return _map_xml("Attributes", app.public_attributes())

    async def set_platform_application_attributes(self, p: dict[str, Any]) -> None:
        self.model.set_platform_application_attributes(
            _required(p, "PlatformApplicationArn"), query_map(p, "Attributes")
        )

    async def delete_platform_application(self, p: dict[str, Any]) -> None:
        self.model.delete_platform_application(_required(p, "PlatformApplicationArn"))

    async def list_platform_applications(self, p: dict[str, Any]) -> str:
        apps, token = self.model.list_platform_applications(p.get("NextToken"))
        return f"<PlatformApplications>{''.join(_app_member(a) for a in apps)}</PlatformApplications>{_next_token('NextToken', token)}"

    # -- endpoints -----------------------------------------------------------------------------
    async def create_platform_endpoint(self, p: dict[str, Any]) -> str:
        endpoint, created = self.model.create_platform_endpoint(
            _required(p, "PlatformApplicationArn"),
            _required(p, "Token"),
            p.get("CustomUserData"),
            query_map(p, "Attributes"),
        )
        if created:
            self.service.endpoint_changed(EndpointChange("EventEndpointCreated", endpoint))
        return f"<EndpointArn>{_e(endpoint.arn)}</EndpointArn>"

    async def get_endpoint_attributes(self, p: dict[str, Any]) -> str:
        endpoint = self.model.endpoint(_required(p, "EndpointArn"))
        return _map_xml("Attributes", endpoint.attributes())

    async def set_endpoint_attributes(self, p: dict[str, Any]) -> None:
        change = self.model.set_endpoint_attributes(
            _required(p, "EndpointArn"), query_map(p, "Attributes")
        )
        self.service.endpoint_changed(change)

    async def delete_endpoint(self, p: dict[str, Any]) -> None:
        self.service.endpoint_changed(self.model.delete_endpoint(_required(p, "EndpointArn")))

    async def list_endpoints_by_platform_application(self, p: dict[str, Any]) -> str:
        endpoints, token = self.model.list_endpoints(
            _required(p, "PlatformApplicationArn"), p.get("NextToken")
        )
        members = "".join(_endpoint_member(e) for e in endpoints)
        return f"<Endpoints>{members}</Endpoints>{_next_token('NextToken', token)}"

    # -- publish -------------------------------------------------------------------------------
    async def publish(self, p: dict[str, Any]) -> str:
        _required(p, "Message")
        p["MessageAttributes"] = message_attribute_entries(p)
        message_id = await self.service.publish(p)
        return f"<MessageId>{message_id}</MessageId>"

    # -- topics --------------------------------------------------------------------------------
    async def create_topic(self, p: dict[str, Any]) -> str:
        topic = self.model.create_topic(_required(p, "Name"), query_map(p, "Attributes"))
        return f"<TopicArn>{_e(topic.arn)}</TopicArn>"

    async def delete_topic(self, p: dict[str, Any]) -> None:
        self.model.delete_topic(_required(p, "TopicArn"))

    async def list_topics(self, p: dict[str, Any]) -> str:
        topics, token = self.model.list_topics(p.get("NextToken"))
        members = "".join(f"<member><TopicArn>{_e(t.arn)}</TopicArn></member>" for t in topics)
        return f"<Topics>{members}</Topics>{_next_token('NextToken', token)}"

    async def get_topic_attributes(self, p: dict[str, Any]) -> str:
        topic = self.model.topic(_required(p, "TopicArn"))
        subs = len(topic.subscriptions)
        attributes = {
            **topic.attributes,
            "TopicArn": topic.arn,
            "Owner": ACCOUNT_ID,
            "DisplayName": topic.attributes.get("DisplayName", ""),
            "SubscriptionsConfirmed": str(subs),
            "SubscriptionsPending": "0",
            "SubscriptionsDeleted": "0",
        }
        return _map_xml("Attributes", attributes)

    async def subscribe(self, p: dict[str, Any]) -> str:
        sub = self.model.subscribe(
            _required(p, "TopicArn"),
            _required(p, "Protocol"),
            p.get("Endpoint"),
            query_map(p, "Attributes"),
        )
        return f"<SubscriptionArn>{_e(sub.arn)}</SubscriptionArn>"

    async def unsubscribe(self, p: dict[str, Any]) -> None:
        self.model.unsubscribe(_required(p, "SubscriptionArn"))

    async def list_subscriptions_by_topic(self, p: dict[str, Any]) -> str:
        subs, token = self.model.list_subscriptions_by_topic(
            _required(p, "TopicArn"), p.get("NextToken")
        )
        members = "".join(_subscription_member(s) for s in subs)
        return f"<Subscriptions>{members}</Subscriptions>{_next_token('NextToken', token)}"

    async def get_subscription_attributes(self, p: dict[str, Any]) -> str:
        sub = self.model.subscription(_required(p, "SubscriptionArn"))
        return _map_xml("Attributes", sub.attributes())

    async def set_subscription_attributes(self, p: dict[str, Any]) -> None:
        self.model.set_subscription_attribute(
            _required(p, "SubscriptionArn"), _required(p, "AttributeName"), p.get("AttributeValue")
        )

    # -- SMS -----------------------------------------------------------------------------------
    async def set_sms_attributes(self, p: dict[str, Any]) -> str:
        self._sms_throttle()
        self.model.set_sms_attributes(query_map(p, "attributes"))
        return ""

    async def get_sms_attributes(self, p: dict[str, Any]) -> str:
        self._sms_throttle()
        return _map_xml("attributes", self.model.get_sms_attributes(query_list(p, "attributes")))

    async def check_if_phone_number_is_opted_out(self, p: dict[str, Any]) -> str:
        self._sms_throttle()
        opted_out = self.model.is_opted_out(_required(p, "phoneNumber", "phoneNumber"))
        return f"<isOptedOut>{'true' if opted_out else 'false'}</isOptedOut>"

    async def list_phone_numbers_opted_out(self, p: dict[str, Any]) -> str:
        self._sms_throttle()
        numbers, token = self.model.list_opted_out(p.get("nextToken"))
        members = "".join(f"<member>{_e(n)}</member>" for n in numbers)
        return f"<phoneNumbers>{members}</phoneNumbers>{_next_token('nextToken', token)}"

    async def opt_in_phone_number(self, p: dict[str, Any]) -> str:
        self._sms_throttle()
        self.model.opt_in(_required(p, "phoneNumber", "phoneNumber"))
        return ""

    def _sms_throttle(self) -> None:
        """The SMS settings operations answer ``Throttled`` (HTTP 429) under an SMS throttle."""
        if self.service.faults.throttle("sms") is not None:
            raise throttled()


def _app_member(app: PlatformApplication) -> str:
    return (
        f"<member><PlatformApplicationArn>{_e(app.arn)}</PlatformApplicationArn>"
        f"{_map_xml('Attributes', app.public_attributes())}</member>"
    )


def _endpoint_member(endpoint: Endpoint) -> str:
    return (
        f"<member><EndpointArn>{_e(endpoint.arn)}</EndpointArn>"
        f"{_map_xml('Attributes', endpoint.attributes())}</member>"
    )


def _subscription_member(sub: Subscription) -> str:
    return (
        f"<member><SubscriptionArn>{_e(sub.arn)}</SubscriptionArn><Owner>{ACCOUNT_ID}</Owner>"
        f"<Protocol>{_e(sub.protocol)}</Protocol><Endpoint>{_e(sub.endpoint)}</Endpoint>"
        f"<TopicArn>{_e(sub.topic_arn)}</TopicArn></member>"
    )
