"""FCM HTTP v1 simulator (``POST /v1/projects/<project>/messages:send``), Google's error shape.

Run: ``python -m emulators.providers.fcm --port N [--host 127.0.0.1] [--tls] [--cert-dir DIR]``.

* 200 ``{"name": "projects/<p>/messages/<id>"}``; with ``validate_only`` the id is
  ``fake_message_id`` as on the real service (the ledger row then has reason ``VALIDATE_ONLY``).
* 404 NOT_FOUND + FcmError ``UNREGISTERED`` for tokens marked unregistered.
* 400 INVALID_ARGUMENT for bad JSON, unknown fields, a message without exactly one of
  token/topic/condition, an empty or malformed token, non-string ``data`` values, data over
  4096 bytes.
* 401 UNAUTHENTICATED when an ``Authorization`` header is present but not ``Bearer <token>``
  (a missing header is accepted: the simulator does not police credentials).
* ``POST /token``: OAuth2 JWT-bearer grant, what google-auth service-account credentials call at
  their ``token_uri``. :func:`write_service_account_file` writes such a file pointing here.

The ledger row's tenant_id / notification_id come from ``message.data`` (or wherever a system
said its pushes carry them: ``PUT /_sim/payload-ids``, dotted paths into the request body);
``reason`` is the FCM errorCode (or the status when Google sends none).

Faults (:mod:`emulators.providers.faults`, ``/_sim/faults``) act on valid sends (not on
``validate_only`` dry runs): ``quota`` (429 RESOURCE_EXHAUSTED / QUOTA_EXCEEDED) and ``status``
(503 UNAVAILABLE / 500 INTERNAL) before the UNREGISTERED check, ``accepted_then_error``
(delivered, then 500/503) after it.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import secrets
import sys
import time
from collections.abc import Callable
from json.encoder import encode_basestring_ascii  # type: ignore[attr-defined]
from pathlib import Path
from random import getrandbits
from typing import Any
from urllib.parse import parse_qs

from emulators.http_server import Request, Response, json_response
from emulators.providers.apns import looks_like_jwt, parse_json_body
from emulators.providers.faults import Fault, Outcome, finish
from emulators.providers.ledger import ProviderState, control
from emulators.providers.serving import ServeOptions, add_serving_arguments, serve

PROVIDER = "fcm"
FCM_ERROR_TYPE = "type.googleapis.com/google.firebase.fcm.v1.FcmError"
BAD_REQUEST_TYPE = "type.googleapis.com/google.rpc.BadRequest"
JWT_BEARER_GRANT = "urn:ietf:params:oauth:grant-type:jwt-bearer"
MAX_DATA_BYTES = 4096
_SEND_RE = re.compile(r"^/v1/projects/([^/]+)/messages:send$")
_TOKEN_CHARS = re.compile(r"^[A-Za-z0-9_:\-.]+$")
_MESSAGE_FIELDS = frozenset(
    {
        "name",
        "data",
        "notification",
        "android",
        "webpush",
        "apns",
        "fcm_options",
        "fcmOptions",
        "token",
        "topic",
        "condition",
    }
)
_REQUEST_FIELDS = frozenset({"message", "validate_only", "validateOnly"})
_STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}


def google_error(
    code: int,
    message: str,
    *,
    fcm_error: str | None = None,
    field_violations: list[dict[str, str]] | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    """An error in Google's JSON shape (``{"error": {code, message, status, details}}``)."""
    details: list[dict[str, Any]] = []
    if field_violations is not None:
        details.append({"@type": BAD_REQUEST_TYPE, "fieldViolations": field_violations})
    if fcm_error is not None:
        details.append({"@type": FCM_ERROR_TYPE, "errorCode": fcm_error})
    error: dict[str, Any] = {
        "code": code,
        "message": message,
        "status": _STATUS_NAMES.get(code, "UNKNOWN"),
    }
    if details:
        error["details"] = details
    return json_response(code, {"error": error}, headers)


class _Reject(Exception):
    def __init__(self, response: Response, reason: str) -> None:
        super().__init__(reason)
        self.response = response
        self.reason = reason
        self.fault: str | None = None


def _invalid(message: str, *, fcm: bool = True, field: str | None = None) -> _Reject:
    violations = None
    if field is not None or not fcm:
        violation = {"description": message}
        if field is not None:
            violation = {"field": field, "description": message}
        violations = [violation]
    response = google_error(
        400, message, fcm_error="INVALID_ARGUMENT" if fcm else None, field_violations=violations
    )
    return _Reject(response, "INVALID_ARGUMENT")


def _validate(body: Any) -> tuple[dict[str, Any], bool]:
    """(message, validate_only) or raise _Reject."""
    if not isinstance(body, dict):
        raise _invalid("Invalid JSON payload received. Expected an object.", fcm=False)
    if not _REQUEST_FIELDS.issuperset(body):  # one C call when every name is known
        key = next(k for k in body if k not in _REQUEST_FIELDS)
        raise _invalid(
            f'Invalid JSON payload received. Unknown name "{key}": Cannot find field.',
            fcm=False,
        )
    message = body.get("message")
    if not isinstance(message, dict):
        raise _invalid("Request contains an invalid argument.", field="message")
    if not _MESSAGE_FIELDS.issuperset(message):
        key = next(k for k in message if k not in _MESSAGE_FIELDS)
        raise _invalid(
            f"Invalid JSON payload received. Unknown name \"{key}\" at 'message': "
            "Cannot find field.",
            fcm=False,
        )
    targets = [k for k in ("token", "topic", "condition") if message.get(k) not in (None, "")]
    if not targets:
        raise _invalid("Recipient of the message is not set.", field="message")
    if len(targets) > 1:
        raise _invalid(
            "Exactly one of token, topic or condition must be specified.", field="message"
        )
    token = message.get("token")
    if token is not None and (not isinstance(token, str) or not _TOKEN_CHARS.match(token)):
        raise _invalid("The registration token is not a valid FCM registration token")
    data = message.get("data")
    if data is not None:
        if not isinstance(data, dict):
            raise _invalid("Invalid value at 'message.data' (type.googleapis.com/Map)", fcm=False)
        size = 0
        for index, (key, value) in enumerate(data.items()):
            if not isinstance(value, str):
                text = f"Invalid value at 'message.data[{index}].value' (TYPE_STRING), {value}"
                raise _invalid(text, field=f"message.data[{index}].value", fcm=False)
            size += len(key.encode()) + len(value.encode())
        if size > MAX_DATA_BYTES:
            raise _invalid("Message is too big")
    validate_only = body.get("validate_only", body.get("validateOnly", False))
    return message, bool(validate_only)


def _fault_error(fault: Fault, retry_after: int | None) -> Response:
    headers = {"retry-after": str(retry_after)} if retry_after is not None else None
    if fault.status == 429:
        return google_error(
            429,
            "Quota exceeded for quota metric 'Send requests' and limit 'Send requests per "
            "minute' of service 'fcm.googleapis.com'.",
            fcm_error="QUOTA_EXCEEDED",
            headers=headers,
        )
    if fault.status == 503:
        return google_error(
            503, "The service is currently unavailable.", fcm_error="UNAVAILABLE", headers=headers
        )
    return google_error(500, "Internal error encountered.", fcm_error="INTERNAL", headers=headers)


def _collapse_id(message: dict[str, Any]) -> str | None:
    android = message.get("android")
    if isinstance(android, dict) and isinstance(android.get("collapse_key"), str):
        return android["collapse_key"]
    apns = message.get("apns")
    headers = apns.get("headers") if isinstance(apns, dict) else None
    if isinstance(headers, dict) and isinstance(headers.get("apns-collapse-id"), str):
        return headers["apns-collapse-id"]
    return None


def _target(body: Any) -> str:
    message = body.get("message") if isinstance(body, dict) else None
    if not isinstance(message, dict):
        return ""
    if isinstance(message.get("token"), str):
        return message["token"]
    if isinstance(message.get("topic"), str) and message["topic"]:
        return f"/topics/{message['topic']}"
    if isinstance(message.get("condition"), str) and message["condition"]:
        return f"condition:{message['condition']}"
    return ""


class FcmSimulator:
    """The request handler; ``state`` holds the ledger and the unregistered tokens."""

    def __init__(self, state: ProviderState | None = None) -> None:
        self.state = state if state is not None else ProviderState(PROVIDER)
        self.tokens_issued = 0

    async def handle(self, request: Request) -> Response:
        if request.path.startswith("/_sim/"):
            answer = await control(request, self.state)
            assert answer is not None
            return answer
        self.state.sync()
        if request.path == "/token":
            return self.oauth_token(request)
        response = self.send(request)
        if response.__class__ is not Response:  # a fault's delay / GOAWAY still to apply
            return await finish(response)
        return response

    def oauth_token(self, request: Request) -> Response:
        """OAuth2 token endpoint (JWT-bearer grant); the assertion is not verified."""
        if request.method != "POST":
            return json_response(405, {"error": "invalid_request"})
        form = parse_qs(request.body.decode("utf-8", "replace"))
        grant = form.get("grant_type", [""])[0]
        assertion = form.get("assertion", [""])[0]
        if grant != JWT_BEARER_GRANT:
            return json_response(
                400,
                {"error": "unsupported_grant_type", "error_description": f"grant {grant!r}"},
            )
        if not looks_like_jwt(assertion):
            return json_response(
                400, {"error": "invalid_grant", "error_description": "Invalid JWT assertion."}
            )
        self.tokens_issued += 1
        return json_response(
            200,
            {
                "access_token": f"ya29.sim-{secrets.token_urlsafe(24)}",
                "expires_in": 3600,
                "token_type": "Bearer",
            },
        )

    def send(self, request: Request) -> Response:
        match = _SEND_RE.match(request.path)
        project = match.group(1) if match else None
        body = parse_json_body(request.body)

        def record(
            status: int,
            reason: str | None,
            *,
            delivered: bool | None = None,
            fault: str | None = None,
            retry_after: int | None = None,
            answer_delay: float = 0.0,
        ) -> None:
            message = body.get("message") if isinstance(body, dict) else None
            self.state.ledger.append_row(
                (
                    PROVIDER,
                    request.received_at,
                    time.time() + answer_delay,
                    self.state.payload_id(body, "tenant_id"),
                    self.state.payload_id(body, "notification_id"),
                    _target(body),
                    project,
                    status,
                    reason,
                    None,  # apns_id
                    status == 200 if delivered is None else delivered,
                    fault,
                    retry_after,
                    _collapse_id(message) if isinstance(message, dict) else None,
                )
            )

        try:
            if match is None:
                raise _Reject(
                    google_error(404, f"The requested URL {request.path} was not found."),
                    "NOT_FOUND",
                )
            if request.method != "POST":
                raise _Reject(
                    google_error(405, f"Method {request.method} not allowed."),
                    "METHOD_NOT_ALLOWED",
                )
            auth = request.headers.get("authorization")
            if auth is not None:
                scheme, _, credential = auth.partition(" ")
                if scheme.lower() != "bearer" or not credential.strip():
                    raise _Reject(
                        google_error(
                            401,
                            "Request had invalid authentication credentials. Expected OAuth 2 "
                            "access token, login cookie or other valid authentication credential.",
                        ),
                        "UNAUTHENTICATED",
                    )
            if body is None:
                text = request.body.decode("utf-8", "replace")[:80]
                raise _invalid(
                    f"Invalid JSON payload received. Unexpected token. {text}", fcm=False
                )
            message, validate_only = _validate(body)
            token = message.get("token")
            if validate_only or not self.state.faults.active:
                if isinstance(token, str) and self.state.unregistered_at(token) is not None:
                    raise _Unregistered(self.state.unregistered_by(token))
        except _Reject as reject:
            record(reject.response.status, reject.reason, fault=reject.fault)
            return reject.response
        if validate_only:
            record(200, "VALIDATE_ONLY", delivered=False)
            return json_response(200, {"name": f"projects/{project}/messages/fake_message_id"})
        if self.state.faults.active:
            outcome = self.state.faults.evaluate(_target(body), project, request)
            delayed = functools.partial(record, answer_delay=outcome.delay)
            return outcome.response(self._faulted(outcome, token, project, delayed))
        record(200, None)
        return _sent(project)

    def _faulted(
        self,
        outcome: Outcome,
        token: Any,
        project: str | None,
        record: Callable[..., None],
    ) -> Response:
        """The answer to a valid send while faults are active."""
        error = outcome.error
        if error is not None and not error.delivered:
            response = _fault_error(error, outcome.retry_after)
            record(
                error.status,
                _fault_reason(error),
                delivered=False,
                fault=error.id,
                retry_after=outcome.retry_after,
            )
            return response
        delay_id = outcome.delay_fault.id if outcome.delay_fault is not None else None
        if isinstance(token, str) and self.state.unregistered_at(token) is not None:
            reject = _Unregistered()
            record(404, reject.reason, fault=self.state.unregistered_by(token) or delay_id)
            return reject.response
        if error is not None:  # accepted_then_error: the device got it
            record(
                error.status,
                _fault_reason(error),
                delivered=True,
                fault=error.id,
                retry_after=outcome.retry_after,
            )
            return _fault_error(error, outcome.retry_after)
        record(200, None, fault=delay_id)
        return _sent(project)


def _fault_reason(fault: Fault) -> str:
    return {429: "QUOTA_EXCEEDED", 503: "UNAVAILABLE"}.get(fault.status, "INTERNAL")


class _Unregistered(_Reject):
    def __init__(self, fault: str | None = None) -> None:
        super().__init__(
            google_error(404, "Requested entity was not found.", fcm_error="UNREGISTERED"),
            "UNREGISTERED",
        )
        self.fault = fault


def _sent(project: str | None) -> Response:
    # random, not secrets: an id must be unique, not unguessable (and this saves a system call)
    message_id = f"0:{time.time_ns() // 1000}%{getrandbits(64):016x}"
    # what json_response writes, without json.dumps's call chain (a third of a send's cost)
    name = encode_basestring_ascii(f"projects/{project}/messages/{message_id}")
    return Response(200, {"content-type": "application/json"}, f'{{"name":{name}}}'.encode())


def write_service_account_file(path: Path, token_uri: str, project_id: str) -> Path:
    """Write a service-account JSON (fresh RSA key) whose ``token_uri`` points at the simulator.

    google-auth (and so pyfcm, firebase-admin) then fetch access tokens from the simulator.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    email = f"fcm-sim@{project_id}.iam.gserviceaccount.com"
    info = {
        "type": "service_account",
        "project_id": project_id,
        "private_key_id": secrets.token_hex(20),
        "private_key": pem,
        "client_email": email,
        "client_id": str(secrets.randbelow(10**20)),
        "auth_uri": "https://accounts.google.com/o/oauth2/auth",
        "token_uri": token_uri,
        "auth_provider_x509_cert_url": "https://www.googleapis.com/oauth2/v1/certs",
        "client_x509_cert_url": f"https://www.googleapis.com/robot/v1/metadata/x509/{email}",
        "universe_domain": "googleapis.com",
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(info, indent=2))
    path.chmod(0o600)
    return path


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m emulators.providers.fcm", description="FCM HTTP v1 simulator"
    )
    add_serving_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return serve(ServeOptions.from_args(PROVIDER, args))


if __name__ == "__main__":
    sys.exit(main())
