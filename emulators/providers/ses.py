"""Amazon SES v2 simulator: ``SendEmail`` (``POST /v2/email/outbound-emails``), as boto3's
``sesv2`` client sends it (REST-JSON), with Amazon's error shape.

Run: ``python -m emulators.providers.ses --port N [--host 127.0.0.1]``; point the client at it
with ``endpoint_url``. Credentials and signatures are not checked.

* 200 ``{"MessageId": ...}``; one ledger row per recipient (To, Cc, Bcc), ``token`` = the
  address, ``delivered`` true.
* Errors are ``{"message": ...}`` with the code in ``x-amzn-ErrorType`` (where boto3 reads it):
  400 ``BadRequestException`` for a body that is not a JSON object, Content without exactly one
  of Simple / Raw / Template, a Simple message without Subject or Body, a missing Destination
  (a Raw message may name its recipients in its own To/Cc/Bcc headers instead), no recipient or
  more than 50, a malformed address, a missing FromEmailAddress (Simple / Template), a bad
  EmailTags entry (names and values: letters, digits, '_' and '-', at most 256) or a bad
  header; 400 ``MessageRejected`` when a recipient is marked bounced (simulated: SES v2 itself
  accepts a send to a suppressed address and reports the bounce as an event; an immediate
  rejection is what a sandboxed account answers for an unverified one); 404
  ``NotFoundException`` for another path.
* Ledger ``tenant_id`` / ``notification_id``: the message headers ``X-Fanout-Tenant-Id`` /
  ``X-Fanout-Notification-Id`` (Simple ``Headers``, or the Raw MIME headers), else the
  ``EmailTags`` named ``tenant_id`` / ``notification_id``.

Control API (:mod:`emulators.providers.ledger`): ``/_sim/health``, ``/_sim/ledger``,
``/_sim/reset``, ``/_sim/faults`` (``status`` 429 TooManyRequestsException / 500 InternalFailure
/ 503 ServiceUnavailable, with ``retry-after`` when the fault names one; ``accepted_then_error``;
``latency``), and ``POST
/_sim/addresses/bounced {"addresses": [...]}`` (case-insensitive; also
``/_sim/tokens/unregistered``), until reset.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import email
import email.policy
import email.utils
import json
import re
import sys
import time
import uuid
from typing import Any

from emulators.http_server import Request, Response, json_response, serve_forever
from emulators.providers.faults import Fault, finish
from emulators.providers.ledger import ProviderState, handle_control

PROVIDER = "ses"
SEND_PATH = "/v2/email/outbound-emails"
MAX_RECIPIENTS = 50
TENANT_HEADER = "x-fanout-tenant-id"
NOTIFICATION_HEADER = "x-fanout-notification-id"
_ADDRESS = re.compile(
    r"^[^@\s<>,;\"]{1,64}@[A-Za-z0-9](?:[A-Za-z0-9.\-]*[A-Za-z0-9])?\.[A-Za-z]{2,}$"
)
_TAG = re.compile(r"^[A-Za-z0-9_-]{1,256}$")
_HEADER_NAME = re.compile(r"^[!-9;-@A-~]{1,126}$")
_HEADER_VALUE = re.compile(r"^[ -~]{0,995}$")
FAULT_ERRORS = {
    429: ("TooManyRequestsException", "Maximum sending rate exceeded."),
    500: ("InternalFailure", "The request processing has failed because of an unknown error."),
    503: ("ServiceUnavailable", "Service is unavailable. Please try again later."),
}


def aws_error(status: int, code: str, message: str, retry_after: int | None = None) -> Response:
    """Amazon's REST-JSON error: the code in ``x-amzn-ErrorType``, ``{"message"}`` body."""
    headers = {"x-amzn-errortype": code, "x-amzn-requestid": str(uuid.uuid4())}
    if retry_after is not None:
        headers["retry-after"] = str(retry_after)
    return json_response(status, {"message": message}, headers)


class _Reject(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.response = aws_error(status, code, message)
        self.status = status
        self.code = code


def _bad(message: str) -> _Reject:
    return _Reject(400, "BadRequestException", message)


def _address(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise _bad(f"{where} must be a string")
    _, bare = email.utils.parseaddr(value)
    if not bare or not _ADDRESS.match(bare):
        raise _bad(f"Illegal address: {value!r} in {where}")
    return bare


def _pairs(value: Any, where: str) -> list[dict[str, str]]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(
        isinstance(p, dict) and isinstance(p.get("Name"), str) and isinstance(p.get("Value"), str)
        for p in value
    ):
        raise _bad(f"{where} must be a list of {{Name, Value}} strings")
    return value


class _Message:
    """What one valid SendEmail says: its recipients and the ids the ledger keeps."""

    def __init__(self, recipients: list[str], tenant_id: str | None, nid: str | None) -> None:
        self.recipients = recipients
        self.tenant_id = tenant_id
        self.notification_id = nid


def _raw_message(content: dict[str, Any]) -> email.message.Message:
    raw = content["Raw"]
    data = raw.get("Data") if isinstance(raw, dict) else None
    if not isinstance(data, str) or not data:
        raise _bad("Raw.Data is required (base64)")
    try:
        decoded = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise _bad("Raw.Data is not valid base64") from exc
    return email.message_from_bytes(decoded, policy=email.policy.compat32)


def _validate(body: Any) -> _Message:
    if not isinstance(body, dict):
        raise _bad("Request body must be a JSON object")
    content = body.get("Content")
    kinds = [k for k in ("Simple", "Raw", "Template") if isinstance(content, dict) and k in content]
    if not isinstance(content, dict) or len(kinds) != 1:
        raise _bad("Content must contain exactly one of Simple, Raw or Template")
    kind = kinds[0]
    headers: dict[str, str] = {}
    raw = _raw_message(content) if kind == "Raw" else None
    if kind == "Simple":
        simple = content["Simple"]
        if not isinstance(simple, dict):
            raise _bad("Content.Simple must be an object")
        subject = simple.get("Subject")
        if not isinstance(subject, dict) or not isinstance(subject.get("Data"), str):
            raise _bad("Content.Simple.Subject.Data is required")
        text_body = simple.get("Body")
        if not isinstance(text_body, dict) or not any(
            isinstance(text_body.get(part), dict) and isinstance(text_body[part].get("Data"), str)
            for part in ("Text", "Html")
        ):
            raise _bad("Content.Simple.Body needs Text or Html with Data")
        for header in _pairs(simple.get("Headers"), "Content.Simple.Headers"):
            if not _HEADER_NAME.match(header["Name"]) or not _HEADER_VALUE.match(header["Value"]):
                raise _bad(f"Invalid header {header['Name']!r}")
            headers[header["Name"].lower()] = header["Value"]
    elif raw is not None:
        headers = {name.lower(): str(value) for name, value in raw.items()}
    if kind != "Raw":
        _address(body.get("FromEmailAddress"), "FromEmailAddress")
    elif body.get("FromEmailAddress") is not None:
        _address(body["FromEmailAddress"], "FromEmailAddress")
    destination = body.get("Destination")
    recipients: list[str] = []
    if destination is None:
        if raw is None:
            raise _bad("Missing required parameter Destination")
        for field in ("to", "cc", "bcc"):
            for _, bare in email.utils.getaddresses(raw.get_all(field, [])):
                recipients.append(_address(bare, f"Raw {field} header"))
    else:
        if not isinstance(destination, dict):
            raise _bad("Destination must be an object")
        for field in ("ToAddresses", "CcAddresses", "BccAddresses"):
            values = destination.get(field) or []
            if not isinstance(values, list):
                raise _bad(f"Destination.{field} must be a list")
            recipients += [_address(v, f"Destination.{field}") for v in values]
    if not recipients:
        raise _bad("Missing required parameter Destination: no recipient")
    if len(recipients) > MAX_RECIPIENTS:
        raise _bad(f"Recipient count exceeds {MAX_RECIPIENTS}.")
    tags: dict[str, str] = {}
    for tag in _pairs(body.get("EmailTags"), "EmailTags"):
        if not _TAG.match(tag["Name"]) or not _TAG.match(tag["Value"]):
            raise _bad(
                f"Invalid tag {tag['Name']!r}: names and values may only contain ASCII letters, "
                "numbers, underscores and dashes (at most 256 characters)"
            )
        tags[tag["Name"]] = tag["Value"]
    return _Message(
        recipients,
        headers.get(TENANT_HEADER) or tags.get("tenant_id"),
        headers.get(NOTIFICATION_HEADER) or tags.get("notification_id"),
    )


def _message_id() -> str:
    """Shaped like SES's: ``<16 hex>-<uuid>-000000``."""
    return f"{time.time_ns() // 1000:016x}-{uuid.uuid4()}-000000"


def _fault_error(fault: Fault, retry_after: int | None) -> Response:
    code, message = FAULT_ERRORS.get(fault.status, FAULT_ERRORS[500])
    return aws_error(fault.status, code, message, retry_after)


class SesSimulator:
    """The request handler; ``state`` holds the ledger, the bounced addresses, the faults."""

    def __init__(self, state: ProviderState | None = None) -> None:
        self.state = state if state is not None else ProviderState(PROVIDER)

    async def handle(self, request: Request) -> Response:
        if request.path.rstrip("/") == "/_sim/addresses/bounced":
            return self.mark_bounced(request)
        control = handle_control(request, self.state)
        if control is not None:
            return control
        return await finish(self.send(request))

    def mark_bounced(self, request: Request) -> Response:
        if request.method != "POST":
            return json_response(405, {"error": f"method {request.method} not allowed"})
        try:
            payload = request.json()
        except ValueError:
            payload = None
        addresses = payload.get("addresses") if isinstance(payload, dict) else None
        if not isinstance(addresses, list) or not all(isinstance(a, str) and a for a in addresses):
            return json_response(400, {"error": 'body must be {"addresses": [non-empty strings]}'})
        count = self.state.mark_unregistered([a.lower() for a in addresses])
        return json_response(200, {"ok": True, "count": count})

    def bounced(self, address: str) -> bool:
        state = self.state
        return (
            state.unregistered_at(address.lower()) or state.unregistered_at(address)
        ) is not None

    def send(self, request: Request) -> Response:
        try:
            body: Any = json.loads(request.body) if request.body else None
        except ValueError:
            body = ...
        message: _Message | None = None

        def record(
            status: int,
            reason: str | None,
            delivered: bool,
            fault: str | None,
            retry_after: int | None = None,
        ) -> None:
            tokens = message.recipients if message is not None else [_first_address(body)]
            for token in tokens:
                self.state.ledger.append(
                    provider=PROVIDER,
                    token=token,
                    status=status,
                    tenant_id=message.tenant_id if message else None,
                    notification_id=message.notification_id if message else None,
                    reason=reason,
                    received_at=request.received_at,
                    delivered=delivered,
                    fault=fault,
                    retry_after=retry_after,
                )

        try:
            if request.path.rstrip("/") != SEND_PATH or request.method != "POST":
                raise _Reject(
                    404, "NotFoundException", f"No operation at {request.method} {request.path}"
                )
            if body is ...:
                raise _Reject(400, "SerializationException", "Request body is not valid JSON")
            message = _validate(body)
        except _Reject as reject:
            record(reject.status, reject.code, False, None)
            return reject.response
        outcome = None
        if self.state.faults.active:
            outcome = self.state.faults.evaluate(message.recipients[0], None, request)
            error = outcome.error
            if error is not None and not error.delivered:
                response = _fault_error(error, outcome.retry_after)
                record(error.status, _code(response), False, error.id, outcome.retry_after)
                return outcome.response(response)
        rejected = [a for a in message.recipients if self.bounced(a)]
        if rejected:
            response = aws_error(
                400,
                "MessageRejected",
                f"Email address is on the suppression list (marked bounced): {rejected[0]}",
            )
            record(400, "MessageRejected", False, None)
            return outcome.response(response) if outcome else response
        if outcome is not None and outcome.error is not None:  # accepted_then_error
            response = _fault_error(outcome.error, outcome.retry_after)
            record(
                outcome.error.status, _code(response), True, outcome.error.id, outcome.retry_after
            )
            return outcome.response(response)
        delay = outcome.delay_fault.id if outcome and outcome.delay_fault else None
        record(200, None, True, delay)
        response = json_response(200, {"MessageId": _message_id()})
        return outcome.response(response) if outcome else response


def _code(response: Response) -> str:
    return response.headers.get("x-amzn-errortype", "")


def _first_address(body: Any) -> str:
    destination = body.get("Destination") if isinstance(body, dict) else None
    if isinstance(destination, dict):
        for field in ("ToAddresses", "CcAddresses", "BccAddresses"):
            values = destination.get(field)
            if isinstance(values, list) and values and isinstance(values[0], str):
                return values[0]
    return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m emulators.providers.ses", description="Amazon SES v2 SendEmail simulator"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    return serve_forever(PROVIDER, SesSimulator().handle, args.host, args.port)


if __name__ == "__main__":
    sys.exit(main())
