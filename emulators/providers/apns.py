"""APNs provider API simulator (``POST /3/device/<token>``), with Apple's status codes/reasons.

Run: ``python -m emulators.providers.apns --port N [--host 127.0.0.1] [--tls] [--cert-dir DIR]``.

Behaviour (Apple, "Handling notification responses from APNs"): every response carries
``apns-id`` (the request's, else a new UUID); success is 200 with an empty body; errors are
``{"reason": ...}`` JSON, plus ``timestamp`` (ms since epoch) for 410 Unregistered.
Checks, in order: path (404 BadPath), method (405 MethodNotAllowed), repeated apns-* headers
(400 DuplicateHeaders), apns-id (400 BadMessageId), authorization (403 InvalidProviderToken
when present but not ``bearer <JWT>``; the JWT is not verified, a missing one is accepted as
certificate auth), apns-priority / apns-expiration / apns-push-type / apns-collapse-id
(400 BadPriority / BadExpirationDate / InvalidPushType / BadCollapseId), token (400
MissingDeviceToken / BadDeviceToken unless 64 hex characters), size (413 PayloadTooLarge above
4096 bytes, 5120 for voip), body (400 PayloadEmpty when empty, 400 BadPayload when not a JSON
object: Apple documents no reason for malformed JSON), unregistered tokens (410; or 400
BadDeviceToken for tokens the control API marked so).

HTTP/2 concurrent streams (Apple, "Establishing a connection to APNs": "if you're using an
authentication token, APNs allows only one stream until you post a request with a valid
authentication token"): a new connection advertises SETTINGS_MAX_CONCURRENT_STREAMS 1; the first
request on it whose credentials pass (strict: a provider token that verifies and has not
expired; not strict: one that looks like a JWT, or none, as certificate authentication) makes
the server send a new SETTINGS frame with 1000 (before that request's answer), and the
connection keeps it. A connection whose tokens are refused stays at 1. A stream opened over the
limit is refused alone with RST_STREAM REFUSED_STREAM (:mod:`emulators.http_server`). Under
granian (``--server granian``) the simulator cannot reach a connection's settings: every
connection advertises 1000 from the start (:mod:`emulators.providers.serving`).

Faults (:mod:`emulators.providers.faults`, ``/_sim/faults``) act on requests that pass those
checks: ``status`` (429 TooManyRequests / 500 InternalServerError / 503 ServiceUnavailable) comes
before the 410 check, ``accepted_then_error`` (delivered, then 500/503) after it.

Every request's ledger row (errors included) carries its ``apns-push-type``, ``apns-priority``
and ``apns-expiration`` as sent and the alert's text (:func:`alert_text`; the columns:
:mod:`emulators.providers.ledger`).
"""

from __future__ import annotations

import argparse
import base64
import functools
import itertools
import json
import os
import re
import sys
import time
from collections.abc import Callable
from random import getrandbits
from typing import Any

from emulators.http_server import H2ServerConnection, Request, Response, json_response
from emulators.providers.apns_auth import ApnsAuth, parse_key, parse_strict, parse_topics
from emulators.providers.faults import Outcome, finish
from emulators.providers.ledger import TEXT_LIMIT, ProviderState, control
from emulators.providers.serving import (
    ServeOptions,
    StreamLimits,
    add_serving_arguments,
    serve,
)

PROVIDER = "apns"
#: SETTINGS_MAX_CONCURRENT_STREAMS of a connection before its first valid provider token, after
STREAMS_BEFORE_TOKEN = 1
STREAMS_AFTER_TOKEN = 1000
PATH_PREFIX = "/3/device/"
MAX_PAYLOAD = 4096
MAX_VOIP_PAYLOAD = 5120
MALFORMED_PAYLOAD_REASON = "BadPayload"
PUSH_TYPES = frozenset(
    {
        "alert",
        "background",
        "location",
        "voip",
        "complication",
        "fileprovider",
        "mdm",
        "liveactivity",
        "pushtotalk",
        "widgets",
        "controls",
    }
)
_TOKEN_RE = re.compile(r"^[0-9a-fA-F]{64}$")
_UUID_RE = re.compile(
    r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
)
#: Apple's reasons for the statuses the faults answer
FAULT_REASONS = {429: "TooManyRequests", 500: "InternalServerError", 503: "ServiceUnavailable"}
_VARIANT = "89ab"
_JWT_RE = re.compile(r"^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$")


def looks_like_jwt(value: str) -> bool:
    """Three base64url segments whose first decodes to a JSON object with ``alg``."""
    if not _JWT_RE.match(value):
        return False
    head = value.split(".", 1)[0]
    try:
        header = json.loads(base64.urlsafe_b64decode(head + "=" * (-len(head) % 4)))
    except (ValueError, TypeError):
        return False
    return isinstance(header, dict) and "alg" in header


def new_apns_id() -> str:
    """A random version-4 UUID string, as APNs makes one when the request has no apns-id.

    From the ``random`` module rather than ``uuid.uuid4`` (a system call for 16 bytes of
    ``os.urandom`` each time): an id needs to be unique, not unguessable."""
    h = f"{getrandbits(128):032x}"
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{_VARIANT[int(h[16], 16) & 3]}{h[17:20]}-{h[20:]}"


class ApnsIds:
    """Version-4 UUID strings for the answers to requests without an apns-id: 74 random bits
    drawn once (per process: ``os.urandom``, so forked workers differ) and a 48-bit counter
    from a random start. Unique, as Apple's are; 0.1 µs where :func:`new_apns_id` costs 1."""

    def __init__(self) -> None:
        prefix = new_apns_id()
        self._prefix = prefix[:-12]
        self._count = itertools.count(int.from_bytes(os.urandom(5), "big"))

    def __call__(self) -> str:
        return f"{self._prefix}{next(self._count) & 0xFFFFFFFFFFFF:012x}"


_decode_json = json.JSONDecoder().decode


def parse_json_body(body: bytes) -> Any:
    """The body as JSON, or None when it is not JSON.

    A UTF-8 body is decoded as ``str`` first: ``json.loads`` on bytes guesses the encoding
    each time, which cost more than the parsing (3.2 µs against 1.4 for a small push)."""
    if not body:
        return None
    try:
        return _decode_json(body.decode())
    except ValueError:
        pass  # not UTF-8 (json.loads also reads UTF-16/32), a BOM, or not JSON at all
    try:
        return json.loads(body)
    except ValueError:
        return None


def joined_text(parts: dict[str, Any], first: str, second: str, loc: tuple[str, str]) -> str:
    """``parts[first]`` and ``parts[second]`` (strings; a title and a body) joined by a newline,
    either alone when the other is missing or empty; without both, the same of the keys in
    ``loc`` (a localised alert's); at most ``TEXT_LIMIT`` characters. Written out: it runs for
    every request the simulators answer."""
    a, b = parts.get(first), parts.get(second)
    if a.__class__ is not str:
        a = ""
    if b.__class__ is not str:
        b = ""
    if not (a or b):
        a, b = parts.get(loc[0]), parts.get(loc[1])
        a, b = a if a.__class__ is str else "", b if b.__class__ is str else ""
    text = f"{a}\n{b}" if a and b else a or b
    return text if len(text) <= TEXT_LIMIT else text[:TEXT_LIMIT]


_ALERT_LOC_KEYS = ("title-loc-key", "loc-key")


def alert_text(payload: Any) -> str | None:
    """The alert a person sees (the ledger's ``text``): ``aps.alert`` as a string, or its
    title and body; "" for an alert with nothing in it; None without one."""
    aps = payload.get("aps") if payload.__class__ is dict else None
    alert = aps.get("alert") if aps.__class__ is dict else None
    if alert is None:
        return None
    if alert.__class__ is dict:
        return joined_text(alert, "title", "body", _ALERT_LOC_KEYS)
    if alert.__class__ is str:
        return alert if len(alert) <= TEXT_LIMIT else alert[:TEXT_LIMIT]
    return ""  # a number, a list: nothing a device shows


def _may_alert(push_type: str | None, payload: dict[str, Any]) -> bool:
    """Whether priority 10 fits: Apple calls it an error for a background push, and for a
    payload with content-available alone (no alert, sound or badge)."""
    if push_type == "background":
        return False
    aps = payload.get("aps")
    if not isinstance(aps, dict) or not aps.get("content-available"):
        return True
    return any(k in aps for k in ("alert", "sound", "badge"))


class ApnsSimulator:
    """The request handler; ``state`` holds the ledger and the unregistered tokens, ``auth``
    the signing keys, topics and strictness (:mod:`emulators.providers.apns_auth`)."""

    #: concurrent streams per HTTP/2 connection: one until a valid provider token, then 1000
    STREAMS = StreamLimits(first=STREAMS_BEFORE_TOKEN, most=STREAMS_AFTER_TOKEN)

    def __init__(
        self, state: ProviderState | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self.state = state if state is not None else ProviderState(PROVIDER)
        self._new_id = ApnsIds()
        self.auth = ApnsAuth(clock)
        self.state.extend(
            {
                "apns_key": self.auth.apply_key,
                "apns_topics": self.auth.apply_topics,
                "strict": self.auth.apply_strict,
            },
            on_reset=self.auth.on_reset,
        )

    async def handle(self, request: Request) -> Response:
        if request.path.startswith("/_sim/"):
            self.state.sync()
            own = self._control(request)
            if own is not None:
                return own
            answer = await control(request, self.state)
            assert answer is not None
            return answer
        self.state.sync()
        response = self.push(request)
        if response.__class__ is not Response:  # a fault's delay / GOAWAY still to apply
            return await finish(response)
        return response

    def _control(self, request: Request) -> Response | None:
        """``/_sim/apns/keys``, ``/_sim/apns/topics``, ``/_sim/strict`` (GET and PUT)."""
        path = request.path.rstrip("/")
        parsers = {
            "/_sim/apns/keys": ("apns_key", parse_key),
            "/_sim/apns/topics": ("apns_topics", parse_topics),
            "/_sim/strict": ("strict", parse_strict),
        }
        if path not in parsers:
            return None
        if request.method == "GET":
            return json_response(200, self.auth.describe())
        if request.method != "PUT":
            return json_response(405, {"error": f"method {request.method} not allowed on {path}"})
        op, parse = parsers[path]
        try:
            event = parse(request.json())
        except ValueError as exc:
            return json_response(400, {"error": str(exc)})
        self.state.publish({"op": op, **event})
        return json_response(200, self.auth.describe())

    def _answer(
        self,
        request: Request,
        token: str,
        apns_id: str,
        payload: Any,
        status: int,
        reason: str | None,
        extra: dict[str, Any] | None = None,
        *,
        delivered: bool | None = None,
        fault: str | None = None,
        retry_after: int | None = None,
        answer_delay: float = 0.0,
    ) -> Response:
        """The ledger row of one request, and its answer."""
        headers = request.headers
        self.state.ledger.append_row(
            (
                PROVIDER,
                request.received_at,
                time.time() + answer_delay,
                self.state.payload_id(payload, "tenant_id"),
                self.state.payload_id(payload, "notification_id"),
                token,
                None,  # project
                status,
                reason,
                apns_id,
                status == 200 if delivered is None else delivered,
                fault,
                retry_after,
                headers.get("apns-collapse-id"),
                headers.get("apns-push-type"),
                headers.get("apns-priority"),
                headers.get("apns-expiration"),
                alert_text(payload),
            )
        )
        if reason is None:
            return Response(status, {"apns-id": apns_id}, b"")
        hdrs = {"apns-id": apns_id}
        if retry_after is not None:
            hdrs["retry-after"] = str(retry_after)
        return json_response(status, {"reason": reason, **(extra or {})}, hdrs)

    def push(self, request: Request) -> Response:
        headers = request.headers
        given_id = headers.get("apns-id")
        apns_id = given_id if given_id and _UUID_RE.match(given_id) else self._new_id()
        path = request.path
        token = path[len(PATH_PREFIX) :] if path.startswith(PATH_PREFIX) else ""
        # Parsed up front (best effort) so that every ledger row, errors included, carries the
        # tenant_id / notification_id of the payload when it has them (top-level keys, or the
        # paths a system stated: PUT /_sim/payload-ids).
        payload = parse_json_body(request.body) if len(request.body) <= 1 << 20 else None
        rejected = self._rejection(request, token, given_id, payload)
        if rejected is not None:
            return self._answer(request, token, apns_id, payload, *rejected)
        if self.state.faults.active:
            outcome = self.state.faults.evaluate(token, None, request)
            answer = functools.partial(
                self._answer, request, token, apns_id, payload, answer_delay=outcome.delay
            )
            return outcome.response(self._faulted(outcome, token, answer))
        stamp = self.state.unregistered_at(token)
        if stamp is not None:
            by = self.state.unregistered_by(token)
            return self._answer(
                request, token, apns_id, payload, *self._dead(token, stamp), fault=by
            )
        return self._answer(request, token, apns_id, payload, 200, None)

    def _dead(self, token: str, stamp: int) -> tuple[int, str, dict[str, Any] | None]:
        """(status, reason, extra body) of a dead token: 410 Unregistered with the timestamp
        it died, or, marked so, 400 BadDeviceToken (no timestamp: APNs gives one with 410 only)."""
        if self.state.unregistered_reason(token) == "BadDeviceToken":
            return 400, "BadDeviceToken", None
        return 410, "Unregistered", {"timestamp": stamp}

    def _rejection(
        self, request: Request, token: str, given_id: str | None, payload: Any
    ) -> tuple[int, str] | None:
        """Apple's (status, reason) for a request that fails a check, in Apple's order."""
        path = request.path
        if not path.startswith(PATH_PREFIX) or "/" in token:
            return 404, "BadPath"
        if request.method != "POST":
            return 405, "MethodNotAllowed"
        headers = request.headers
        raw = request.raw_headers
        # a name repeats only when the joined dict has no more keys than the list (the servers
        # add at most one: host, from :authority), so the usual request skips the loop
        if len(raw) >= len(headers):
            seen: set[str] = set()
            for name, _ in raw:
                if name.startswith("apns-") or name == "authorization":
                    if name in seen:
                        return 400, "DuplicateHeaders"
                    seen.add(name)
        if given_id is not None and not _UUID_RE.match(given_id):
            return 400, "BadMessageId"
        auth = self.auth
        refused, key = auth.credential_refusal(headers, request.connection)
        if refused is not None:
            return refused
        if key is None:  # not strict: a token is only looked at, not verified
            credential = headers.get("authorization")
            if credential is not None:
                scheme, _, value = credential.partition(" ")
                if scheme.lower() != "bearer" or not looks_like_jwt(value.strip()):
                    return 403, "InvalidProviderToken"
        connection = request.connection
        if (
            connection.__class__ is H2ServerConnection
            and connection.max_concurrent_streams < STREAMS_AFTER_TOKEN
        ):
            connection.set_max_concurrent_streams(STREAMS_AFTER_TOKEN)  # credentials passed
        priority = headers.get("apns-priority")
        if priority is not None and priority not in ("1", "5", "10"):
            return 400, "BadPriority"
        expiration = headers.get("apns-expiration")
        if expiration is not None and not expiration.isdigit():
            return 400, "BadExpirationDate"
        push_type = headers.get("apns-push-type")
        if push_type is not None and push_type not in PUSH_TYPES:
            return 400, "InvalidPushType"
        if push_type is None and key is not None:
            return 400, "InvalidPushType"  # required since iOS 13 and watchOS 6
        collapse_id = headers.get("apns-collapse-id")
        if collapse_id is not None and len(collapse_id.encode()) > 64:
            return 400, "BadCollapseId"
        if not token:
            return 400, "MissingDeviceToken"
        if not _TOKEN_RE.match(token):
            return 400, "BadDeviceToken"
        if key is not None:
            refused = auth.topic_refusal(headers, key, token)
            if refused is not None:
                return refused
        body = request.body
        if len(body) > (MAX_VOIP_PAYLOAD if push_type == "voip" else MAX_PAYLOAD):
            return 413, "PayloadTooLarge"
        if not isinstance(payload, dict):  # whitespace alone is not JSON either
            return 400, "PayloadEmpty" if not body.strip() else MALFORMED_PAYLOAD_REASON
        if not payload:
            return 400, "PayloadEmpty"
        if key is not None and priority == "10" and not _may_alert(push_type, payload):
            return 400, "BadPriority"
        return None

    def _faulted(self, outcome: Outcome, token: str, answer: Callable[..., Response]) -> Response:
        """The answer to a valid request while faults are active."""
        error = outcome.error
        if error is not None and not error.delivered:
            return answer(
                error.status,
                FAULT_REASONS[error.status],
                fault=error.id,
                retry_after=outcome.retry_after,
            )
        delay_id = outcome.delay_fault.id if outcome.delay_fault is not None else None
        stamp = self.state.unregistered_at(token)
        if stamp is not None:
            by = self.state.unregistered_by(token)
            return answer(*self._dead(token, stamp), fault=by or delay_id)
        if error is not None:  # accepted_then_error: the device got it
            return answer(
                error.status,
                FAULT_REASONS[error.status],
                delivered=True,
                fault=error.id,
                retry_after=outcome.retry_after,
            )
        return answer(200, None, fault=delay_id)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m emulators.providers.apns", description="APNs provider API simulator"
    )
    add_serving_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return serve(ServeOptions.from_args(PROVIDER, args))


if __name__ == "__main__":
    sys.exit(main())
