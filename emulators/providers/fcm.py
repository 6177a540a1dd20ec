"""FCM HTTP v1 simulator (``POST /v1/projects/<project>/messages:send``), as strict as Google.

Run: ``python -m emulators.providers.fcm --port N [--host 127.0.0.1] [--tls] [--cert-dir DIR]
[--lenient] [--project-quota-per-minute N]``.

A send is checked in this order; the first check that fails answers, in Google's JSON error
shape (``{"error": {code, message, status, details}}``):

1. the route: 404 NOT_FOUND for another path, 405 for another method than POST.
2. credentials (strict): ``Authorization: Bearer <access token>`` with a token this simulator
   issued (``POST /token``, in any of its serving processes) and not expired. Else 401
   UNAUTHENTICATED with Google's messages and a ``google.rpc.ErrorInfo`` detail (reason
   CREDENTIALS_MISSING without the header; ACCESS_TOKEN_TYPE_UNSUPPORTED for another scheme or
   a credential that is no ``ya29.`` token; ACCESS_TOKEN_EXPIRED for an expired ``ya29.``
   token or one this simulator did not sign). Lenient: only a header present but not
   ``Bearer <something>`` is refused.
3. the project quota (strict): 600,000 messages a minute per project (``--project-quota-per-
   minute``, ``PUT /_sim/project-quota``), minutes from the project's first message, not the
   clock's; every authenticated send counts, also those refused below (Google counts client
   errors). Over it: 429 RESOURCE_EXHAUSTED in the shape Google's API front end sends (no
   FcmError; ``google.rpc.ErrorInfo`` RATE_LIMIT_EXCEEDED and a ``google.rpc.Help``), no
   ``retry-after`` (Google sends none for a quota).
4. the body: 400 INVALID_ARGUMENT for bad JSON, unknown fields, a message without exactly one
   of token/topic/condition, an empty or malformed token, non-string ``data`` values, data over
   4096 bytes.
5. ``validate_only`` (a dry run: no fault, no device limit): 404 UNREGISTERED for a dead
   token, else 200 ``{"name": "projects/<p>/messages/fake_message_id"}`` as on the real
   service (its ledger row: reason ``VALIDATE_ONLY``, not delivered).
6. faults (:mod:`emulators.providers.faults`, ``/_sim/faults``) on valid sends: ``quota`` (429
   RESOURCE_EXHAUSTED / QUOTA_EXCEEDED) and ``status`` (503 UNAVAILABLE / 500 INTERNAL) first.
7. 404 NOT_FOUND + FcmError ``UNREGISTERED`` for tokens marked unregistered.
8. the device's limits (strict; messages to a registration token): 240 a minute and 5,000 an
   hour (Google's "maximum message rate to a single device"), windows from the device's first
   message. Over them: 429 RESOURCE_EXHAUSTED + FcmError ``QUOTA_EXCEEDED`` and the
   ``google.rpc.QuotaFailure`` Google documents for it, no ``retry-after``. Collapsible
   messages (``android.collapse_key``, ``apns.headers["apns-collapse-id"]``,
   ``webpush.headers["Topic"]``): a burst of 20 per device, one more every 3 minutes; Google
   delays one over the burst rather than refusing it, so it is answered 200 and its ledger row
   has reason ``COLLAPSIBLE_THROTTLED`` (:mod:`emulators.providers.fcm_limits`).
9. ``accepted_then_error`` faults (delivered, then 500/503), else 200
   ``{"name": "projects/<p>/messages/<id>"}``.

``POST /token``: the OAuth2 JWT-bearer grant google-auth's service-account credentials call at
their ``token_uri`` (:func:`write_service_account_file` writes such a file pointing here; the
assertion is not verified). It answers ``{"access_token", "expires_in": 3600, "token_type":
"Bearer"}``; the token is ``ya29.sim-<expiry, epoch s>-<random hex>-<HMAC-SHA256, hex>``, signed
with a secret every serving process shares (:func:`~emulators.providers.fcm_limits.token_secret`),
so any of them verifies it without asking the others.

Strict is the default. ``PUT /_sim/strict`` ``{"enabled": false}`` turns the checks of
credentials and limits off (``GET /_sim/strict`` says which); ``POST /_sim/reset`` returns to the
start-up setting (strict, unless ``--lenient``), as it does the project quota. ``GET`` / ``PUT
/_sim/project-quota`` ``{"per_minute": N}``. Every process of the simulator sees these at once.

HTTP/2: a connection allows 100 concurrent streams, as fcm.googleapis.com advertises, from its
first SETTINGS frame on (:attr:`FcmSimulator.STREAMS`; on our server and under granian alike);
our server refuses a stream over it with RST_STREAM REFUSED_STREAM.

The ledger row's tenant_id / notification_id come from ``message.data`` (or wherever a system
said its pushes carry them: ``PUT /_sim/payload-ids``, dotted paths into the request body);
``reason`` is the FCM errorCode (or the status when Google sends none), ``COLLAPSIBLE_THROTTLED``
or ``VALIDATE_ONLY``; ``push_type``, ``priority``, ``expiration`` and ``text`` what the message
asked and showed (:func:`push_attributes`; the columns: :mod:`emulators.providers.ledger`).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import hmac
import json
import os
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
from emulators.providers.apns import joined_text, looks_like_jwt, parse_json_body
from emulators.providers.faults import Fault, Outcome, finish
from emulators.providers.fcm_limits import (
    COLLAPSIBLE_THROTTLED,
    DEFAULT_PROJECT_QUOTA_PER_MINUTE,
    DEVICE_MINUTE,
    DEVICE_PER_HOUR,
    DEVICE_PER_MINUTE,
    SENT,
    LocalLimits,
    Settings,
    SharedLimits,
    forget_shared_limits,
    token_secret,
)
from emulators.providers.ledger import ProviderState, control
from emulators.providers.serving import (
    ServeOptions,
    StreamLimits,
    add_serving_arguments,
    serve,
)

PROVIDER = "fcm"
FCM_ERROR_TYPE = "type.googleapis.com/google.firebase.fcm.v1.FcmError"
BAD_REQUEST_TYPE = "type.googleapis.com/google.rpc.BadRequest"
ERROR_INFO_TYPE = "type.googleapis.com/google.rpc.ErrorInfo"
QUOTA_FAILURE_TYPE = "type.googleapis.com/google.rpc.QuotaFailure"
HELP_TYPE = "type.googleapis.com/google.rpc.Help"
JWT_BEARER_GRANT = "urn:ietf:params:oauth:grant-type:jwt-bearer"
SERVICE = "fcm.googleapis.com"
SEND_METHOD = "google.firebase.fcm.v1.FcmService.SendMessage"
# Google's 401 messages (what googleapis.com answers without credentials / with bad ones)
MISSING_CREDENTIALS = (
    "Request is missing required authentication credential. Expected OAuth 2 access token, "
    "login cookie or other valid authentication credential. See "
    "https://developers.google.com/identity/sign-in/web/devconsole-project."
)
INVALID_CREDENTIALS = (
    "Request had invalid authentication credentials. Expected OAuth 2 access token, login "
    "cookie or other valid authentication credential. See "
    "https://developers.google.com/identity/sign-in/web/devconsole-project."
)
ACCESS_TOKEN_PREFIX = "ya29.sim-"
ACCESS_TOKEN_LIFETIME = 3600
_ACCESS_TOKEN_RE = re.compile(r"^ya29\.sim-(\d{1,12})-([0-9a-f]{24})-([0-9a-f]{32})$")
#: concurrent streams a connection allows (what fcm.googleapis.com advertises)
MAX_CONCURRENT_STREAMS = 100
# how the command line tells every serving process its start-up settings
LENIENT_ENV = "SIM_FCM_LENIENT"
PROJECT_QUOTA_ENV = "SIM_FCM_PROJECT_QUOTA_PER_MINUTE"
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
    details: list[dict[str, Any]] | None = None,
) -> Response:
    """An error in Google's JSON shape (``{"error": {code, message, status, details}}``):
    ``details`` are a BadRequest (``field_violations``), an FcmError (``fcm_error``), then
    ``details`` as given."""
    details = [*(details or ())]
    if fcm_error is not None:
        details.insert(0, {"@type": FCM_ERROR_TYPE, "errorCode": fcm_error})
    if field_violations is not None:
        details.insert(0, {"@type": BAD_REQUEST_TYPE, "fieldViolations": field_violations})
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


_NOTIFICATION_LOC_KEYS = ("title_loc_key", "body_loc_key")
_NO_LOC_KEYS = ("", "")
_NO_ATTRIBUTES = (None, None, None, None)
_NOTHING: dict[str, Any] = {}  # read only


def push_attributes(message: Any) -> tuple[str | None, str | None, str | None, str | None]:
    """The ledger's (push_type, priority, expiration, text) of a message (``ledger.py``'s module
    doc): the Android settings, else the APNs headers FCM forwards to an iOS device."""
    if message.__class__ is not dict:
        return _NO_ATTRIBUTES
    android = message.get("android")
    if android.__class__ is not dict:
        android = _NOTHING
    apns = message.get("apns")
    headers = apns.get("headers") if apns.__class__ is dict else None
    if headers.__class__ is not dict:
        headers = _NOTHING
    priority = android.get("priority")
    if priority is None:
        priority = headers.get("apns-priority")
    expiration = android.get("ttl")
    if expiration is None:
        expiration = headers.get("apns-expiration")
    text = None
    notification = message.get("notification")
    if notification.__class__ is dict:
        text = joined_text(notification, "title", "body", _NO_LOC_KEYS)
    shown = android.get("notification")
    if not text and shown.__class__ is dict:
        text = joined_text(shown, "title", "body", _NOTIFICATION_LOC_KEYS)
    push_type = headers.get("apns-push-type")
    # as strings (a number written where Google wants a string is recorded as written)
    if push_type is not None and push_type.__class__ is not str:
        push_type = str(push_type)
    if priority is not None and priority.__class__ is not str:
        priority = str(priority)
    if expiration is not None and expiration.__class__ is not str:
        expiration = str(expiration)
    return push_type, priority, expiration, text


def _collapsible(message: dict[str, Any]) -> bool:
    """What FCM counts as a collapsible message: a collapse key on any platform (Android
    ``collapse_key``, APNs ``apns-collapse-id``, Web Push ``Topic``)."""
    if _collapse_id(message):
        return True
    webpush = message.get("webpush")
    headers = webpush.get("headers") if isinstance(webpush, dict) else None
    if isinstance(headers, dict):
        return any(k.lower() == "topic" and v and isinstance(v, str) for k, v in headers.items())
    return False


def _unauthenticated(message: str, reason: str) -> _Reject:
    """401 as googleapis.com answers it (an ErrorInfo, no FcmError)."""
    info = {
        "@type": ERROR_INFO_TYPE,
        "reason": reason,
        "domain": "googleapis.com",
        "metadata": {"method": SEND_METHOD, "service": SERVICE},
    }
    return _Reject(google_error(401, message, details=[info]), "UNAUTHENTICATED")


def project_number(project: str) -> int:
    """A stable 12-digit stand-in for the project's number (Google names the consumer by it)."""
    digest = hashlib.blake2b(project.encode(), digest_size=8).digest()
    return 100_000_000_000 + int.from_bytes(digest, "big") % 900_000_000_000


def project_quota_error(project: str | None, limit: int) -> Response:
    """429 for a project over its quota, in the shape Google's API front end sends it."""
    number = project_number(project or "")
    return google_error(
        429,
        "Quota exceeded for quota metric 'Send requests' and limit 'Send requests per minute' "
        f"of service '{SERVICE}' for consumer 'project_number:{number}'.",
        details=[
            {
                "@type": ERROR_INFO_TYPE,
                "reason": "RATE_LIMIT_EXCEEDED",
                "domain": "googleapis.com",
                "metadata": {
                    "quota_limit_value": str(limit),
                    "consumer": f"projects/{number}",
                    "quota_metric": f"{SERVICE}/send_requests",
                    "quota_unit": "1/min/{project}",
                    "service": SERVICE,
                    "quota_location": "global",
                    "quota_limit": "SendsPerMinutePerProject",
                },
            },
            {
                "@type": HELP_TYPE,
                "links": [
                    {
                        "description": "Request a higher quota limit.",
                        "url": "https://cloud.google.com/docs/quotas/help/request_increase",
                    }
                ],
            },
        ],
    )


def device_rate_error(verdict: str) -> Response:
    """429 QUOTA_EXCEEDED for a device over its message rate (FcmError and the QuotaFailure
    Google documents for it)."""
    if verdict == DEVICE_MINUTE:
        limit = f"{DEVICE_PER_MINUTE} messages per minute"
    else:
        limit = f"{DEVICE_PER_HOUR} messages per hour"
    violation = {
        "subject": "device",
        "description": f"Device message rate exceeded: more than {limit} to one registration "
        "token.",
    }
    return google_error(
        429,
        "Device message rate exceeded.",
        fcm_error="QUOTA_EXCEEDED",
        details=[{"@type": QUOTA_FAILURE_TYPE, "violations": [violation]}],
    )


def _sign(secret: bytes, text: str) -> str:
    return hmac.new(secret, text.encode(), hashlib.sha256).hexdigest()[:32]


def issue_access_token(secret: bytes, expiry: int) -> str:
    """``ya29.sim-<expiry>-<random>-<HMAC>``: verifiable with ``secret`` alone."""
    text = f"{expiry}-{secrets.token_hex(12)}"
    return f"{ACCESS_TOKEN_PREFIX}{text}-{_sign(secret, text)}"


def access_token_expiry(secret: bytes, token: str) -> int | None:
    """The expiry (epoch s) of a token signed with ``secret``; None for any other string."""
    match = _ACCESS_TOKEN_RE.match(token)
    if match is None:
        return None
    expiry, nonce, mac = match.groups()
    if not hmac.compare_digest(mac, _sign(secret, f"{expiry}-{nonce}")):
        return None
    return int(expiry)


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


def _env_settings() -> Settings:
    """The start-up settings the command line passed down (every serving process reads them)."""
    quota = os.environ.get(PROJECT_QUOTA_ENV)
    return Settings(
        strict=os.environ.get(LENIENT_ENV) != "1",
        project_quota_per_minute=int(quota) if quota else DEFAULT_PROJECT_QUOTA_PER_MINUTE,
    )


class FcmSimulator:
    """The request handler; ``state`` holds the ledger and the unregistered tokens.

    ``clock`` (epoch seconds) is the time of access tokens and of the project and device
    limits, injectable for tests. ``strict`` / ``project_quota_per_minute``: the start-up
    settings (what ``POST /_sim/reset`` returns to); by default what the command line said
    (``--lenient``, ``--project-quota-per-minute``), else strict and Google's 600,000."""

    #: concurrent streams per HTTP/2 connection: 100 from the first SETTINGS frame on, as
    #: fcm.googleapis.com advertises (serving applies it: :mod:`emulators.providers.serving`)
    STREAMS = StreamLimits(first=MAX_CONCURRENT_STREAMS, most=MAX_CONCURRENT_STREAMS)

    def __init__(
        self,
        state: ProviderState | None = None,
        *,
        clock: Callable[[], float] = time.time,
        strict: bool | None = None,
        project_quota_per_minute: int | None = None,
    ) -> None:
        self.state = state if state is not None else ProviderState(PROVIDER)
        self.clock = clock
        defaults = _env_settings()
        if strict is not None:
            defaults = Settings(strict, defaults.project_quota_per_minute)
        if project_quota_per_minute is not None:
            defaults = Settings(defaults.strict, project_quota_per_minute)
        shared = self.state.shared
        self.limits: LocalLimits | SharedLimits = (
            LocalLimits(defaults) if shared is None else SharedLimits(shared, defaults)
        )
        self.secret = token_secret(shared)
        self.tokens_issued = 0
        self._verified: dict[str, int] = {}  # access token -> its expiry (a cache)

    async def handle(self, request: Request) -> Response:
        if request.path.startswith("/_sim/"):
            return await self.control(request)
        self.state.sync()
        if request.path == "/token":
            return self.oauth_token(request)
        response = self.send(request)
        if response.__class__ is not Response:  # a fault's delay / GOAWAY still to apply
            return await finish(response)
        return response

    # -- control API ----------------------------------------------------------------------------
    async def control(self, request: Request) -> Response:
        """``/_sim/strict`` and ``/_sim/project-quota`` here; the rest as every simulator."""
        path = request.path.rstrip("/")
        if path == "/_sim/strict":
            return self._strict_control(request)
        if path == "/_sim/project-quota":
            return self._quota_control(request)
        answer = await control(request, self.state)
        assert answer is not None
        if (request.method, path) == ("POST", "/_sim/reset") and answer.status == 200:
            self.limits.reset()
        return answer

    def _strict_control(self, request: Request) -> Response:
        if request.method == "PUT":
            body = parse_json_body(request.body)
            enabled = body.get("enabled") if isinstance(body, dict) else None
            if not isinstance(enabled, bool) or set(body) != {"enabled"}:
                return json_response(400, {"error": 'body must be {"enabled": true|false}'})
            self.limits.update(strict=enabled)
        elif request.method != "GET":
            return json_response(405, {"error": f"method {request.method} not allowed"})
        return json_response(200, {"enabled": self.limits.settings().strict})

    def _quota_control(self, request: Request) -> Response:
        if request.method == "PUT":
            body = parse_json_body(request.body)
            limit = body.get("per_minute") if isinstance(body, dict) else None
            if (
                not isinstance(limit, int)
                or isinstance(limit, bool)
                or limit < 0
                or set(body) != {"per_minute"}
            ):
                return json_response(400, {"error": 'body must be {"per_minute": an integer >= 0}'})
            self.limits.update(project_quota_per_minute=limit)
        elif request.method != "GET":
            return json_response(405, {"error": f"method {request.method} not allowed"})
        return json_response(200, {"per_minute": self.limits.settings().project_quota_per_minute})

    # -- OAuth2 ---------------------------------------------------------------------------------
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
        expiry = int(self.clock()) + ACCESS_TOKEN_LIFETIME
        return json_response(
            200,
            {
                "access_token": issue_access_token(self.secret, expiry),
                "expires_in": ACCESS_TOKEN_LIFETIME,
                "token_type": "Bearer",
            },
        )

    def _authenticate(self, request: Request, strict: bool) -> None:
        """Raise the 401 for a send whose credentials Google would refuse."""
        auth = request.headers.get("authorization")
        if auth is None:
            if strict:
                raise _unauthenticated(MISSING_CREDENTIALS, "CREDENTIALS_MISSING")
            return
        scheme, _, credential = auth.partition(" ")
        credential = credential.strip()
        if scheme.lower() != "bearer" or not credential:
            raise _unauthenticated(INVALID_CREDENTIALS, "ACCESS_TOKEN_TYPE_UNSUPPORTED")
        if not strict:
            return
        expiry = self._verified.get(credential)
        if expiry is None:
            expiry = access_token_expiry(self.secret, credential)
            if expiry is None:
                reason = (
                    "ACCESS_TOKEN_EXPIRED"  # Google's answer to a ya29 token it does not know
                    if credential.startswith("ya29.")
                    else "ACCESS_TOKEN_TYPE_UNSUPPORTED"
                )
                raise _unauthenticated(INVALID_CREDENTIALS, reason)
            if len(self._verified) >= 4096:
                self._verified.clear()
            self._verified[credential] = expiry
        if expiry <= self.clock():
            raise _unauthenticated(INVALID_CREDENTIALS, "ACCESS_TOKEN_EXPIRED")

    # -- sends ----------------------------------------------------------------------------------
    def send(self, request: Request) -> Response:
        match = _SEND_RE.match(request.path)
        project = match.group(1) if match else None
        body = parse_json_body(request.body)
        settings = self.limits.settings()

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
            push_type, priority, expiration, text = push_attributes(message)
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
                    push_type,
                    priority,
                    expiration,
                    text,
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
            self._authenticate(request, settings.strict)
            if settings.strict:
                limit = settings.project_quota_per_minute
                if not self.limits.admit_project(project or "", self.clock(), limit):
                    raise _Reject(project_quota_error(project, limit), "RESOURCE_EXHAUSTED")
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
            return outcome.response(
                self._faulted(outcome, token, message, project, delayed, settings.strict)
            )
        refusal, reason = self._device_limits(token, message, settings.strict)
        if refusal is not None:
            record(429, reason, delivered=False)
            return refusal
        record(200, reason)
        return _sent(project)

    def _device_limits(
        self, token: Any, message: dict[str, Any], strict: bool
    ) -> tuple[Response | None, str | None]:
        """(the 429 to answer, its reason) for a device over its rate; (None, reason) when the
        message goes out: reason None, or COLLAPSIBLE_THROTTLED (it goes out late)."""
        if not strict or not isinstance(token, str):
            return None, None
        verdict = self.limits.admit_device(token, self.clock(), _collapsible(message))
        if verdict == SENT:
            return None, None
        if verdict == COLLAPSIBLE_THROTTLED:
            return None, "COLLAPSIBLE_THROTTLED"
        return device_rate_error(verdict), "QUOTA_EXCEEDED"

    def _faulted(
        self,
        outcome: Outcome,
        token: Any,
        message: dict[str, Any],
        project: str | None,
        record: Callable[..., None],
        strict: bool,
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
        refusal, reason = self._device_limits(token, message, strict)
        if refusal is not None:
            record(429, reason, delivered=False, fault=delay_id)
            return refusal
        if error is not None:  # accepted_then_error: the device got it
            record(
                error.status,
                _fault_reason(error),
                delivered=True,
                fault=error.id,
                retry_after=outcome.retry_after,
            )
            return _fault_error(error, outcome.retry_after)
        record(200, reason, fault=delay_id)
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


def _quota(text: str) -> int:
    """argparse type of ``--project-quota-per-minute``: a whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m emulators.providers.fcm", description="FCM HTTP v1 simulator"
    )
    add_serving_arguments(parser)
    parser.add_argument(
        "--lenient",
        action="store_true",
        help="start with the checks of credentials and limits off (PUT /_sim/strict turns "
        "them on; a reset returns to this)",
    )
    parser.add_argument(
        "--project-quota-per-minute",
        type=_quota,
        default=DEFAULT_PROJECT_QUOTA_PER_MINUTE,
        help=f"messages a minute per project (default Google's {DEFAULT_PROJECT_QUOTA_PER_MINUTE})",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # every serving process builds its own simulator: they learn the settings from the env
    os.environ[LENIENT_ENV] = "1" if args.lenient else "0"
    os.environ[PROJECT_QUOTA_ENV] = str(args.project_quota_per_minute)
    if args.state_dir is not None:
        forget_shared_limits(args.state_dir)  # an earlier simulator's counts and switch
    return serve(ServeOptions.from_args(PROVIDER, args))


if __name__ == "__main__":
    sys.exit(main())
