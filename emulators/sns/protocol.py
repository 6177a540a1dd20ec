"""The AWS query protocol of SNS (what boto3 and every AWS SDK speak for SNS), onto the model.

botocore's SNS model (``sns/2010-03-31``) declares ``"protocols": ["query"]`` only: a request is
``POST /`` with a form-encoded body (``Action=Publish&Version=2010-03-31&...``; a GET with the
same parameters in the URL works too), maps as ``Attributes.entry.N.key`` /
``Attributes.entry.N.value`` (``MessageAttributes.entry.N.Name`` / ``.Value.DataType`` /
``.Value.StringValue`` / ``.Value.BinaryValue``), lists as ``name.member.N``. Answers are XML
(``<PublishResponse><PublishResult>...</PublishResult><ResponseMetadata><RequestId>``), errors
``<ErrorResponse><Error><Type>Sender</Type><Code>...</Code><Message>...</Message></Error>
<RequestId>...</RequestId></ErrorResponse>`` with the error's HTTP status. Signatures are not
checked; a request's region is its SigV4 scope's (:func:`emulators.sns.query.request_region`),
and each region has its own state. Topic operations are :mod:`emulators.sns.topic_api`'s.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl

from emulators.http_server import Request, Response
from emulators.sns.errors import SnsError, throttled
from emulators.sns.model import Endpoint, EndpointChange, PlatformApplication, SnsModel
from emulators.sns.query import (
    e,
    map_xml,
    next_token_xml,
    query_list,
    query_map,
    request_region,
    required,
)
from emulators.sns.service import SnsService
from emulators.sns.topic_api import TopicApi

XMLNS = "http://sns.amazonaws.com/doc/2010-03-31/"
CONTENT_TYPE = "text/xml"

Handler = Callable[[dict[str, Any], SnsModel], Awaitable[str | None]]


class _Ids:
    """Cheap unique request ids shaped like UUIDs (a random prefix and a counter)."""

    def __init__(self) -> None:
        self.prefix = os.urandom(10).hex()
        self.counter = itertools.count(1)

    def next(self) -> str:
        p = self.prefix
        return f"{p[:8]}-{p[8:12]}-{p[12:16]}-{p[16:20]}-{next(self.counter):012x}"


class SnsProtocol:
    """Request handler for the SNS API."""

    def __init__(self, service: SnsService) -> None:
        self.service = service
        self.ids = _Ids()
        self.topics = TopicApi(service)
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
            **self.topics.operations(),
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
            f'<ErrorResponse xmlns="{XMLNS}"><Error><Type>{kind}</Type><Code>{e(err.code)}</Code>'
            f"<Message>{e(err.message)}</Message></Error><RequestId>{request_id}</RequestId>"
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
        region = request_region(request.headers, self.service.model.region)
        try:
            return self._ok(action, await handler(params, self.service.model_for(region)))
        except SnsError as err:
            return self.error(err)

    # -- platform applications -----------------------------------------------------------------
    async def create_platform_application(self, p: dict[str, Any], model: SnsModel) -> str:
        app = model.create_platform_application(
            required(p, "Name"), required(p, "Platform"), query_map(p, "Attributes")
        )
        return f"<PlatformApplicationArn>{e(app.arn)}</PlatformApplicationArn>"

    async def get_platform_application_attributes(self, p: dict[str, Any], model: SnsModel) -> str:
        app = model.application(required(p, "PlatformApplicationArn"))
        return map_xml("Attributes", app.public_attributes())

    async def set_platform_application_attributes(self, p: dict[str, Any], model: SnsModel) -> None:
        model.set_platform_application_attributes(
            required(p, "PlatformApplicationArn"), query_map(p, "Attributes")
        )

    async def delete_platform_application(self, p: dict[str, Any], model: SnsModel) -> None:
        model.delete_platform_application(required(p, "PlatformApplicationArn"))

    async def list_platform_applications(self, p: dict[str, Any], model: SnsModel) -> str:
        apps, token = model.list_platform_applications(p.get("NextToken"))
        return f"<PlatformApplications>{''.join(_app_member(a) for a in apps)}</PlatformApplications>{next_token_xml('NextToken', token)}"

    # -- endpoints -----------------------------------------------------------------------------
    async def create_platform_endpoint(self, p: dict[str, Any], model: SnsModel) -> str:
        endpoint, created = model.create_platform_endpoint(
            required(p, "PlatformApplicationArn"),
            required(p, "Token"),
            p.get("CustomUserData"),
            query_map(p, "Attributes"),
        )
        if created:
            self.service.endpoint_changed(
                EndpointChange("EventEndpointCreated", endpoint), model=model
            )
        return f"<EndpointArn>{e(endpoint.arn)}</EndpointArn>"

    async def get_endpoint_attributes(self, p: dict[str, Any], model: SnsModel) -> str:
        endpoint = model.endpoint(required(p, "EndpointArn"))
        return map_xml("Attributes", endpoint.attributes())

    async def set_endpoint_attributes(self, p: dict[str, Any], model: SnsModel) -> None:
        change = model.set_endpoint_attributes(
            required(p, "EndpointArn"), query_map(p, "Attributes")
        )
        self.service.endpoint_changed(change, model=model)

    async def delete_endpoint(self, p: dict[str, Any], model: SnsModel) -> None:
        self.service.endpoint_changed(
            model.delete_endpoint(required(p, "EndpointArn")), model=model
        )

    async def list_endpoints_by_platform_application(
        self, p: dict[str, Any], model: SnsModel
    ) -> str:
        endpoints, token = model.list_endpoints(
            required(p, "PlatformApplicationArn"), p.get("NextToken")
        )
        members = "".join(_endpoint_member(e) for e in endpoints)
        return f"<Endpoints>{members}</Endpoints>{next_token_xml('NextToken', token)}"

    # -- SMS -----------------------------------------------------------------------------------
    async def set_sms_attributes(self, p: dict[str, Any], model: SnsModel) -> str:
        self._sms_throttle()
        model.set_sms_attributes(query_map(p, "attributes"))
        return ""

    async def get_sms_attributes(self, p: dict[str, Any], model: SnsModel) -> str:
        self._sms_throttle()
        return map_xml("attributes", model.get_sms_attributes(query_list(p, "attributes")))

    async def check_if_phone_number_is_opted_out(self, p: dict[str, Any], model: SnsModel) -> str:
        self._sms_throttle()
        opted_out = model.is_opted_out(required(p, "phoneNumber", "phoneNumber"))
        return f"<isOptedOut>{'true' if opted_out else 'false'}</isOptedOut>"

    async def list_phone_numbers_opted_out(self, p: dict[str, Any], model: SnsModel) -> str:
        self._sms_throttle()
        numbers, token = model.list_opted_out(p.get("nextToken"))
        members = "".join(f"<member>{e(n)}</member>" for n in numbers)
        return f"<phoneNumbers>{members}</phoneNumbers>{next_token_xml('nextToken', token)}"

    async def opt_in_phone_number(self, p: dict[str, Any], model: SnsModel) -> str:
        self._sms_throttle()
        model.opt_in(required(p, "phoneNumber", "phoneNumber"))
        return ""

    def _sms_throttle(self) -> None:
        """The SMS settings operations answer ``Throttled`` (HTTP 429) under an SMS throttle."""
        if self.service.faults.throttle("sms") is not None:
            raise throttled()


def _app_member(app: PlatformApplication) -> str:
    return (
        f"<member><PlatformApplicationArn>{e(app.arn)}</PlatformApplicationArn>"
        f"{map_xml('Attributes', app.public_attributes())}</member>"
    )


def _endpoint_member(endpoint: Endpoint) -> str:
    return (
        f"<member><EndpointArn>{e(endpoint.arn)}</EndpointArn>"
        f"{map_xml('Attributes', endpoint.attributes())}</member>"
    )
