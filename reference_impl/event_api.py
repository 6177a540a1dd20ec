"""Event and preferences API: a Lambda handler for API Gateway (HTTP API, payload 2.0).

``handler(event, context)`` is what runs on AWS behind API Gateway, and the one place where a
request is decided: routes, methods (405 with Allow), media types (415), body size (413), JSON
and its nesting, ids, and every answer. ``serve()`` is the local stand-in for API Gateway
(``reference_impl.api_gateway``: uvicorn with its framing, limits and timeouts), which turns each
HTTP request into the same event.
"""

from __future__ import annotations

import argparse
import base64
import copy
import json
import logging
import re
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote
from zoneinfo import available_timezones

import redis
import yaml
from botocore.exceptions import BotoCoreError, ClientError
from ulid import ULID

from reference_impl.audit_keys import AuditKeys
from reference_impl.aws import batch_write, client
from reference_impl.config import CHANNELS, Config
from reference_impl.event_registry import REGISTRY_TABLE, EventRegistry, content_sha256
from reference_impl.follower_pages import FollowerPages, PagesBusy
from reference_impl.ids import (
    ID_RULE,
    device_id,
    preferences_cache_key,
    user_key,
    valid_id,
    valid_phone,
)
from reference_impl.inbox import MAX_LIMIT, Inbox
from reference_impl.quiet_hours import parse_window, resolve_zone
from reference_impl.sns_push import EndpointRegistry
from reference_impl.ulid_window import (
    canonical_ulid,
    served_event_id_pattern,
    time_window_problem,
    ulid_milliseconds,
)
from reference_impl.user_record import device_attribute, device_value, record_item

log = logging.getLogger("reference.event_api")

EVENT_KINDS = ("post", "like", "comment", "mention")
PLATFORMS = ("apns", "fcm")
# Ten follower pages a call: one lease of the author's list and one count update for them.
MAX_FOLLOWERS_PER_CALL = 10_000
MAX_USERS_PER_CALL = 500
MAX_BODY_BYTES = 1_000_000
MAX_TOKEN_CHARS = 4096
# The deepest body the API takes is users:batch -> entry -> preferences -> consent: 5 levels.
# Bounding the nesting before parsing keeps a 2 KB "[[[[..." from reaching the parser's
# recursion limit (a RecursionError that used to close the connection with no answer).
MAX_JSON_DEPTH = 32
# One plain address: no display name, no list (the email consumer sends to exactly this).
# Spelled out, not \s: JSON Schema patterns are ECMAScript, whose \s differs from Python's.
_EMAIL = re.compile(
    r"^[^@\u0000-\u0020\u007f<>,;]{1,64}@[^@\u0000-\u0020\u007f<>,;]+"
    r"\.[^@\u0000-\u0020\u007f<>,;]+$"
)
# RFC 3339 with an offset, seconds 00-59 (datetime has no leap second, and the consumer's
# consent check parses with datetime.fromisoformat): what the OpenAPI document's Instant says.
_INSTANT = re.compile(
    r"^(?!0000)[0-9]{4}-[0-9]{2}-[0-9]{2}T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?"
    r"(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$"
)
# A consent version string: at least one character that str.strip() keeps (the consumer's rule,
# reference_impl.consent), its whitespace spelled out for the OpenAPI document's ECMAScript.
_VERSION = re.compile(
    r"[^\u0009-\u000d\u001c-\u0020\u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f"
    r"\u205f\u3000]"
)
_LIMIT = re.compile(r"^[+-]?[0-9]{1,9}$")
# JSON strings (escapes included), then the brackets left outside them.
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_JSON_BRACKET = re.compile(r"[\[\]{}]")


_USER = r"/v1/tenants/(?P<tenant>[^/]+)/users/(?P<user>[^/]+)"


class ApiError(Exception):
    """A request the API refuses with a 4xx answer; nothing has been stored."""

    status = 400

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status


class BadRequest(ApiError):
    """Input the API refuses (400); nothing has been stored."""


def _response(status: int, body: Any, headers: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "statusCode": status,
        "headers": {"content-type": "application/json", **(headers or {})},
        "body": json.dumps(body),
    }


def json_nesting_exceeds(text: str, limit: int) -> bool:
    """Whether JSON text opens more than ``limit`` arrays/objects inside each other (brackets
    inside strings do not count). Linear in the text; stops at the first level too deep."""
    depth = 0
    for bracket in _JSON_BRACKET.finditer(_JSON_STRING.sub("", text)):
        if bracket.group() in "[{":
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


def is_json_media_type(content_type: str | None) -> bool:
    """application/json or any application/*+json, parameters (charset) allowed."""
    if not content_type:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


def valid_instant(value: object) -> bool:
    if not isinstance(value, str) or not _INSTANT.fullmatch(value):
        return False
    try:
        datetime.fromisoformat(value)
    except ValueError:  # a day the month does not have
        return False
    return True


@cache
def known_zones() -> frozenset[str]:
    """The IANA zones a preference may name: those of the tz database this process loads."""
    return frozenset(z for z in available_timezones() if resolve_zone(z) is not None)


class EventApi:
    """Routes and handlers; one instance per process (the Lambda 'init' phase)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.kinesis = client(config, "kinesis")
        self.ddb = client(config, "dynamodb")
        self.registry = EventRegistry(self.ddb, config.table(REGISTRY_TABLE))
        # Token registration's own role: the devices' SNS platform endpoints.
        self.endpoints = EndpointRegistry(config) if config.push_transport == "sns" else None
        # A user's audit data key is made when the user is registered, not on their first
        # notification: a burst's fan-out then only reads keys (the lazy creation there stays
        # for users registered before keys were made here, or whose creation failed).
        self.audit_keys = (
            AuditKeys(self.ddb, config.table("audit_keys")) if config.audit_bucket else None
        )
        # (method, path pattern, handler, takes a JSON body)
        self.routes: list[tuple[str, re.Pattern[str], Callable[..., dict[str, Any]], bool]] = [
            ("GET", re.compile(r"^/health$"), self.health, False),
            ("GET", re.compile(r"^/openapi\.json$"), self.openapi, False),
            ("POST", re.compile(r"^/v1/events$"), self.post_event, True),
            ("PUT", re.compile(rf"^{_USER}/preferences$"), self.put_preferences, True),
            ("PUT", re.compile(rf"^{_USER}/devices/(?P<token>[^/]+)$"), self.put_device, True),
            ("POST", re.compile(rf"^{_USER}/followers:batch$"), self.add_followers, True),
            (
                "POST",
                re.compile(r"^/v1/tenants/(?P<tenant>[^/]+)/users:batch$"),
                self.put_users,
                True,
            ),
            ("DELETE", re.compile(rf"^{_USER}$"), self.erase_user, False),
            ("GET", re.compile(rf"^{_USER}/inbox$"), self.get_inbox, False),
            ("GET", re.compile(rf"^{_USER}/unread-count$"), self.get_unread_count, False),
            ("POST", re.compile(rf"^{_USER}/inbox/read-all$"), self.read_all, False),
            ("POST", re.compile(rf"^{_USER}/inbox/(?P<nid>[^/]+)/read$"), self.read_one, False),
        ]
        self._inbox: Inbox | None = None
        self._cache: Any = None

    # -- dispatch ---------------------------------------------------------------------------

    def __call__(self, event: dict[str, Any], context: Any = None) -> dict[str, Any]:
        method = event.get("requestContext", {}).get("http", {}).get("method", "GET").upper()
        path = event.get("rawPath", "/")
        allowed: set[str] = set()
        for route_method, pattern, func, takes_json in self.routes:
            match = pattern.match(path)
            if not match:
                continue
            if route_method != method:
                allowed.add(route_method)
                continue
            try:
                params = {k: unquote(v) for k, v in match.groupdict().items()}
                if takes_json:
                    return func(event, self._json_body(event), **params)
                return func(event, **params)
            except ApiError as exc:
                return _response(exc.status, {"error": str(exc)})
            except (ClientError, BotoCoreError, redis.RedisError) as exc:
                # The store, the cache or the stream failed: tell the client to retry; nothing
                # half-done is acknowledged as accepted.
                return _response(503, {"error": f"backend unavailable: {exc}"})
            except Exception:
                log.exception("%s %s failed", method, path)
                return _response(500, {"error": "internal error"})
        if allowed:
            return _response(
                405,
                {"error": f"method {method} not allowed on {path}"},
                {"allow": ", ".join(sorted(allowed))},
            )
        return _response(404, {"error": f"no route for {path}"})

    @staticmethod
    def _json_body(event: dict[str, Any]) -> dict[str, Any]:
        """The body as a JSON object, or ApiError: 415 unless sent as JSON, 413 over
        MAX_BODY_BYTES, 400 for anything that is not UTF-8 JSON of bounded nesting."""
        headers = {k.lower(): v for k, v in (event.get("headers") or {}).items()}
        content_type = headers.get("content-type")
        if not is_json_media_type(content_type):
            raise ApiError(
                f"the body must be sent as application/json, not {content_type or 'untyped'}",
                415,
            )
        raw = event.get("body") or ""
        data = base64.b64decode(raw) if event.get("isBase64Encoded") else raw.encode()
        if len(data) > MAX_BODY_BYTES:
            raise ApiError(f"body over {MAX_BODY_BYTES} bytes", 413)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadRequest("body is not valid JSON: not UTF-8") from exc
        if json_nesting_exceeds(text, MAX_JSON_DEPTH):
            raise BadRequest(f"body is not valid JSON here: nested deeper than {MAX_JSON_DEPTH}")
        try:
            body = json.loads(text, parse_constant=_refuse_constant)
        except (json.JSONDecodeError, ValueError) as exc:
            raise BadRequest(f"body is not valid JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise BadRequest("body must be a JSON object")
        return body

    @staticmethod
    def _require_ids(**ids: Any) -> None:
        for name, value in ids.items():
            if not valid_id(value):
                raise BadRequest(f"{name} must be {ID_RULE}")

    # -- handlers ---------------------------------------------------------------------------

    def health(self, event: dict[str, Any]) -> dict[str, Any]:
        return _response(200, {"ok": True})

    def openapi(self, event: dict[str, Any]) -> dict[str, Any]:
        return _response(200, openapi_document())

    def post_event(self, event: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        missing = [f for f in ("tenant_id", "author_id", "kind", "object_id") if f not in body]
        if missing:
            raise BadRequest(f"missing field(s): {', '.join(missing)}")
        self._require_ids(
            tenant_id=body["tenant_id"], author_id=body["author_id"], object_id=body["object_id"]
        )
        if body["kind"] not in EVENT_KINDS:
            raise BadRequest(f"kind must be one of {', '.join(EVENT_KINDS)}")
        now = datetime.now(UTC)
        digest = content_sha256(
            body["tenant_id"], body["author_id"], body["kind"], body["object_id"]
        )
        # The id is minted here, once, so a retried fan-out reuses it and dedup can work. A
        # client may supply it (an idempotency key for its own retries): a canonical ULID whose
        # time lies in the window downstream can honour (reference_impl.ulid_window).
        if body.get("event_id") is not None:
            notification_id = body["event_id"]
            if not canonical_ulid(notification_id):
                raise BadRequest("event_id must be a ULID (26 upper-case Crockford characters)")
            problem = time_window_problem(ulid_milliseconds(notification_id), now)
            if problem:
                raise BadRequest(f"event_id {notification_id} is refused: {problem}")
            if not self.registry.claim(
                body["tenant_id"],
                notification_id,
                digest,
                ULID.from_str(notification_id).datetime,
                now,
            ):
                return _response(
                    409,
                    {
                        "error": f"event_id {notification_id} is already taken by another event "
                        "in this tenant; nothing was stored (send a new id)"
                    },
                )
        else:
            # A fresh ULID is unique (80 random bits); registered all the same (before the 202),
            # so that a client reusing it later as its event_id for other content is refused.
            notification_id = str(ULID())
            if "event_ids_in_whole_seconds" in self.config.defects:
                # The defect: an int is milliseconds to python-ulid: an id from January 1970.
                notification_id = str(ULID.from_timestamp(int(now.timestamp())))
            self.registry.claim_minted(body["tenant_id"], notification_id, digest, now)
        accepted_at = now.isoformat()
        record = {
            "tenant_id": body["tenant_id"],
            "author_id": body["author_id"],
            "kind": body["kind"],
            "object_id": body["object_id"],
            "notification_id": notification_id,
            "accepted_at": accepted_at,
        }
        self.kinesis.put_record(
            StreamName=self.config.stream_name,
            Data=json.dumps(record).encode(),
            PartitionKey=notification_id
            if "partition_key_per_event" in self.config.defects
            else user_key(body["tenant_id"], body["author_id"]),
        )
        return _response(202, {"notification_id": notification_id, "accepted_at": accepted_at})

    @staticmethod
    def _consent(name: str, consent: Any) -> dict[str, Any] | None:
        """A consent record as the consumers honour it (reference_impl.consent), or None."""
        if consent is None:
            return None
        if not isinstance(consent, dict):
            raise BadRequest(f"{name} must be null or {{granted_at, version}}")
        if not valid_instant(consent.get("granted_at")):
            raise BadRequest(
                f"{name} must be null or {{granted_at, version}}: granted_at must be an "
                "RFC 3339 date-time with an offset, such as 2026-01-01T00:00:00Z"
            )
        version = consent.get("version")
        if not (
            (isinstance(version, int) and not isinstance(version, bool))
            or (isinstance(version, str) and _VERSION.search(version) and len(version) <= 64)
        ):
            raise BadRequest(
                f"{name} must be null or {{granted_at, version}}: version must be an integer "
                "or a non-blank string of at most 64 characters"
            )
        record = {"granted_at": consent["granted_at"], "version": version}
        if "revoked_at" in consent:
            revoked = consent["revoked_at"]
            if revoked is not None and not valid_instant(revoked):
                raise BadRequest(f"{name}.revoked_at must be null or an RFC 3339 date-time")
            record["revoked_at"] = revoked
        return record

    @classmethod
    def _preferences(cls, body: Any) -> dict[str, Any]:
        """Validated preferences, or BadRequest naming the field."""
        if not isinstance(body, dict):
            raise BadRequest("preferences must be a JSON object")
        zone = body.get("zone")
        if not isinstance(zone, str):
            raise BadRequest("zone must be an IANA time zone name such as Europe/Berlin")
        if zone not in known_zones():
            raise BadRequest(f"unknown time zone {zone!r}")
        quiet_hours = body.get("quiet_hours")
        try:
            window = parse_window(quiet_hours)
        except (ValueError, TypeError) as exc:
            raise BadRequest(f"quiet_hours: {exc}") from exc
        channels = body.get("channels", {})
        if not isinstance(channels, dict) or any(
            c not in CHANNELS or not isinstance(v, bool) for c, v in channels.items()
        ):
            raise BadRequest(f"channels must map some of {', '.join(CHANNELS)} to true/false")
        email = body.get("email")
        if email is not None and not (isinstance(email, str) and _EMAIL.fullmatch(email)):
            raise BadRequest("email must be null or one address such as ada@example.com")
        phone = body.get("phone")
        if phone is not None and not valid_phone(phone):
            raise BadRequest("phone must be null or an E.164 number such as +14155550100")
        prefs = {
            "zone": zone,
            # Only the window itself is stored: extra keys are accepted and dropped.
            "quiet_hours": None
            if window is None
            else {"start": quiet_hours["start"], "end": quiet_hours["end"]},
            "channels": channels,
            "push_consent": cls._consent("push_consent", body.get("push_consent")),
        }
        # Only when given: a record written without them reads exactly as it always did.
        if "email" in body:
            prefs["email"] = email
        if "email_consent" in body:
            prefs["email_consent"] = cls._consent("email_consent", body["email_consent"])
        if "phone" in body:
            prefs["phone"] = phone
        if "sms_consent" in body:
            prefs["sms_consent"] = cls._consent("sms_consent", body["sms_consent"])
        return prefs

    @staticmethod
    def _device(token: Any, platform: Any) -> tuple[str, str]:
        if platform not in PLATFORMS:
            raise BadRequest("platform must be apns or fcm")
        if not isinstance(token, str) or not token or len(token) > MAX_TOKEN_CHARS:
            raise BadRequest(f"token must be 1-{MAX_TOKEN_CHARS} characters")
        return token, platform

    def _invalidate(self, keys: list[str]) -> bool:
        """Write-through invalidation: a withdrawn consent takes effect on the next job."""
        if "no_write_through" in self.config.defects:
            return False  # the defect: only the table's stream invalidates
        try:
            self.cache.delete(*keys)
            return True
        except Exception:  # the 5-minute TTL then bounds the staleness
            return False

    def put_preferences(
        self, event: dict[str, Any], body: dict[str, Any], tenant: str, user: str
    ) -> dict[str, Any]:
        self._require_ids(tenant_id=tenant, user_id=user)
        prefs = self._preferences(body)
        self._ensure_audit_keys(tenant, [user])
        # An update, not a put: the record's devices stay as they are.
        self.ddb.update_item(
            TableName=self.config.table("preferences"),
            Key={"pk": {"S": user_key(tenant, user)}},
            UpdateExpression="SET prefs = :p, updated_at = :t",
            ExpressionAttributeValues={
                ":p": {"S": json.dumps(prefs)},
                ":t": {"S": datetime.now(UTC).isoformat()},
            },
        )
        invalidated = self._invalidate([preferences_cache_key(tenant, user)])
        return _response(200, {"stored": True, "cache_invalidated": invalidated})

    def put_device(
        self, event: dict[str, Any], body: dict[str, Any], tenant: str, user: str, token: str
    ) -> dict[str, Any]:
        self._require_ids(tenant_id=tenant, user_id=user)
        token, platform = self._device(token, body.get("platform"))
        self._ensure_audit_keys(tenant, [user])
        arn = self._endpoints([(user, token, platform)]).get((user, token))
        self.ddb.update_item(
            TableName=self.config.table("preferences"),
            Key={"pk": {"S": user_key(tenant, user)}},
            UpdateExpression="SET #d = :d",
            ExpressionAttributeNames={"#d": device_attribute(device_id(token))},
            ExpressionAttributeValues={
                ":d": device_value(token, platform, datetime.now(UTC).isoformat(), arn)
            },
        )
        return _response(200, {"device_id": device_id(token)})

    def _ensure_audit_keys(self, tenant: str, users: list[str]) -> None:
        """Each user's audit data key, made where missing (read in one BatchGetItem per 100,
        the missing ones created by conditional puts, :meth:`AuditKeys.ensure`), before their
        record is written: a stored user has a key. Made only with an audit trail configured.
        A failure is a 503 (ClientError) with nothing of the user stored but keys, which a
        retry reuses."""
        if self.audit_keys is None:
            return
        try:
            self.audit_keys.ensure([(tenant, user) for user in users])
        except RuntimeError as exc:  # keys left unread, or one erased while it was made
            raise ApiError(f"audit key creation failed: {exc}; retry", 503) from exc

    def _endpoints(self, devices: list[tuple[str, str, str]]) -> dict[tuple[str, str], str]:
        """(user, token) -> SNS endpoint ARN for each (user, token, platform), registered before
        the record is written (a record never names an endpoint that does not exist); {} when
        pushes go direct. SNS unreachable or refusing: 503, nothing stored."""
        if self.endpoints is None or not devices:
            return {}
        registry = self.endpoints
        unique = list(dict.fromkeys(devices))
        try:
            # A few at a time: one bulk call registers up to thousands of devices.
            with ThreadPoolExecutor(max_workers=min(8, len(unique))) as pool:
                arns = list(pool.map(lambda d: registry.register(*d), unique))
        except (ClientError, BotoCoreError, LookupError) as exc:
            raise ApiError(f"device registration with SNS failed: {exc}; retry", 503) from exc
        return {(user, token): arn for (user, token, _), arn in zip(unique, arns, strict=True)}

    def put_users(self, event: dict[str, Any], body: dict[str, Any], tenant: str) -> dict[str, Any]:
        """Bulk load: the records (preferences and devices) of up to MAX_USERS_PER_CALL users
        in one call, one item per user, written with BatchWriteItem. Each entry replaces the
        user's whole record (so of two entries for one user, the last wins). All entries are
        validated before anything is stored."""
        self._require_ids(tenant_id=tenant)
        users = body.get("users")
        if not isinstance(users, list) or not users:
            raise BadRequest("users must be a non-empty list")
        if len(users) > MAX_USERS_PER_CALL:
            raise BadRequest(f"at most {MAX_USERS_PER_CALL} users per call")
        now = datetime.now(UTC).isoformat()
        # One item per user id: BatchWriteItem refuses two requests for one key.
        entries: dict[str, tuple[dict[str, Any] | None, list[tuple[str, str]]]] = {}
        with_prefs, devices = 0, 0
        for i, entry in enumerate(users):
            try:
                if not isinstance(entry, dict) or not valid_id(entry.get("user_id")):
                    raise BadRequest(f"user_id is missing or not {ID_RULE}")
                user = entry["user_id"]
                prefs = None
                if entry.get("preferences") is not None:
                    prefs = self._preferences(entry["preferences"])
                    with_prefs += 1
                entry_devices = entry.get("devices")
                if entry_devices is not None and not isinstance(entry_devices, list):
                    raise BadRequest("devices must be null or a list of {token, platform}")
                registered = []
                for device in entry_devices or []:
                    if not isinstance(device, dict):
                        raise BadRequest("devices must be a list of {token, platform}")
                    registered.append(self._device(device.get("token"), device.get("platform")))
            except BadRequest as exc:
                raise BadRequest(f"users[{i}]: {exc}") from exc
            entries[user] = (prefs, registered)
            devices += len(registered)
        self._ensure_audit_keys(tenant, list(entries))
        arns = self._endpoints(
            [(u, t, p) for u, (_, registered) in entries.items() for t, p in registered]
        )
        items = {
            user: record_item(
                user_key(tenant, user),
                prefs,
                registered,
                now,
                {t: arns[(user, t)] for t, _ in registered if (user, t) in arns},
            )
            for user, (prefs, registered) in entries.items()
        }
        requests = [{"PutRequest": {"Item": item}} for item in items.values()]
        batch_write(self.ddb, self.config.table("preferences"), requests)
        keys = [preferences_cache_key(tenant, user) for user in items]
        return _response(
            200,
            {
                "users": len(users),
                "preferences": with_prefs,
                "devices": devices,
                "cache_invalidated": self._invalidate(keys),
            },
        )

    def add_followers(
        self, event: dict[str, Any], body: dict[str, Any], tenant: str, user: str
    ) -> dict[str, Any]:
        self._require_ids(tenant_id=tenant, author_id=user)
        followers = body.get("followers")
        if not isinstance(followers, list) or not followers:
            raise BadRequest("followers must be a non-empty list of user ids")
        if len(followers) > MAX_FOLLOWERS_PER_CALL:
            raise BadRequest(f"at most {MAX_FOLLOWERS_PER_CALL} followers per call")
        bad = [f for f in followers if not valid_id(f)]
        if bad:
            raise BadRequest(f"invalid follower id(s) (each must be {ID_RULE}): {bad[:5]}")
        try:
            added, count = self.pages.add(tenant, user, followers)
        except PagesBusy as exc:
            return _response(503, {"error": f"{exc}; retry"})
        before = count - len(added)
        threshold = self.config.celebrity_threshold
        if before < threshold:
            # Below the threshold the edges are also kept per follower: erasure finds a
            # user's regular follows there. Above it, the follower pages answer on their own.
            requests = [
                {"PutRequest": {"Item": {"pk": {"S": user_key(tenant, f)}, "sk": {"S": user}}}}
                for f in added
            ]
            batch_write(self.ddb, self.config.table("following"), requests)
        if count >= threshold:
            self.pages.mark_celebrity(tenant, user)  # idempotent: one set, one write a call
        crossing = before < threshold <= count
        if crossing and "followed_cache_kept_at_threshold" not in self.config.defects:
            # Every follower's cached list of followed celebrities just went stale, once.
            added = tuple(f for page in self.pages.all_pages(tenant, user) for f in page.ids)
        self.inbox.forget_followed(tenant, list(added))
        return _response(200, {"added": len(added), "followers": count})

    def erase_user(self, event: dict[str, Any], tenant: str, user: str) -> dict[str, Any]:
        """GDPR erasure: inbox, read state, preferences, devices, follows, caches, dedup keys."""
        from reference_impl.erasure import erase_user

        self._require_ids(tenant_id=tenant, user_id=user)
        try:
            removed = erase_user(self.config, self.ddb, self.cache, tenant, user)
        except Exception as exc:  # nothing is reported erased that was not; a retry is safe
            log.warning("erasure of %s/%s failed: %s", tenant, user, exc)
            return _response(503, {"error": f"erasure incomplete, retry: {type(exc).__name__}"})
        log.info("%s", json.dumps({"audit": "erased", "tenant_id": tenant, **removed}))
        return _response(200, {"erased": True, "removed": removed})

    # -- inbox ------------------------------------------------------------------------------

    @property
    def cache(self) -> Any:
        """Redis (ElastiCache in the seed): follower-list and preference caches."""
        if self._cache is None:
            from reference_impl.redis_store import connect_redis

            self._cache = connect_redis(self.config)
        return self._cache

    @property
    def pages(self) -> FollowerPages:
        return self.inbox.pages

    @property
    def inbox(self) -> Inbox:
        if self._inbox is None:
            self._inbox = Inbox(self.config, self.ddb, self.cache)
        return self._inbox

    def get_inbox(self, event: dict[str, Any], tenant: str, user: str) -> dict[str, Any]:
        self._require_ids(tenant_id=tenant, user_id=user)
        # Blank values kept: "limit=" is a bad limit, not an absent one.
        query = parse_qs(event.get("rawQueryString") or "", keep_blank_values=True)
        raw_limit = query.get("limit", ["20"])[0]
        if not _LIMIT.fullmatch(raw_limit):
            raise BadRequest(f"limit must be an integer between 1 and {MAX_LIMIT}")
        limit = int(raw_limit)
        if not 1 <= limit <= MAX_LIMIT:
            raise BadRequest(f"limit must be an integer between 1 and {MAX_LIMIT}")
        cursor = query.get("cursor", [None])[0]
        if cursor is not None and not canonical_ulid(cursor):
            raise BadRequest(f"cursor {cursor!r} is not a notification id from an earlier page")
        return _response(200, self.inbox.page(tenant, user, limit, cursor))

    def get_unread_count(self, event: dict[str, Any], tenant: str, user: str) -> dict[str, Any]:
        self._require_ids(tenant_id=tenant, user_id=user)
        return _response(200, self.inbox.unread_count(tenant, user))

    def read_all(self, event: dict[str, Any], tenant: str, user: str) -> dict[str, Any]:
        self._require_ids(tenant_id=tenant, user_id=user)
        return _response(200, {"watermark": self.inbox.mark_all_read(tenant, user)})

    def read_one(self, event: dict[str, Any], tenant: str, user: str, nid: str) -> dict[str, Any]:
        self._require_ids(tenant_id=tenant, user_id=user)
        if not canonical_ulid(nid):
            raise BadRequest(f"{nid!r} is not a notification id (a canonical ULID)")
        self.inbox.mark_read(tenant, user, nid)
        return _response(200, {"read": nid})


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


@cache
def _openapi_base() -> dict[str, Any]:
    document = yaml.safe_load((Path(__file__).parent / "openapi.yaml").read_text())
    schemas = document["components"]["schemas"]
    schemas["Preferences"]["properties"]["zone"]["enum"] = sorted(known_zones())
    return document


def openapi_document(now: datetime | None = None) -> dict[str, Any]:
    """The OpenAPI document as served: the zones this process knows, and the event_id time
    window as of ``now`` (JSON Schema has no clock: see reference_impl.ulid_window)."""
    document = copy.deepcopy(_openapi_base())
    event_id = document["components"]["schemas"]["Event"]["properties"]["event_id"]
    event_id["pattern"] = served_event_id_pattern(now or datetime.now(UTC))
    return document


_api: EventApi | None = None


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """The Lambda entry point (API Gateway HTTP API, payload format 2.0)."""
    global _api
    if _api is None:
        _api = EventApi(Config.load())
    return _api(event, context)


# -- local API Gateway ----------------------------------------------------------------------


def gateway_limits(config: Config) -> Any:
    from reference_impl.api_gateway import GatewayLimits

    return GatewayLimits(
        max_body_bytes=MAX_BODY_BYTES,
        read_timeout_seconds=config.event_api_read_timeout_seconds,
        keep_alive_seconds=config.event_api_keep_alive_seconds,
        max_connections=config.event_api_max_connections,
        handler_threads=config.event_api_threads,
    )


def asgi_app_from_environment() -> Any:
    """The ASGI application for any ASGI server's command line (``--factory``), with the
    config named by ``FANOUT_CONFIG``: how the benchmark compares servers."""
    from reference_impl.api_gateway import LambdaAdapter

    config = Config.load()
    return LambdaAdapter(EventApi(config), gateway_limits(config))


def serve(config: Config, host: str, port: int) -> int:
    """Serve until SIGTERM/SIGINT with ``config.event_api_processes`` processes on one port."""
    from reference_impl.api_gateway import serve as serve_gateway

    return serve_gateway(
        lambda: EventApi(config),
        host,
        port,
        processes=config.event_api_processes,
        limits=gateway_limits(config),
        banner="event api listening",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="reference Event API (local API Gateway)")
    parser.add_argument("--config", help="config JSON (default: $FANOUT_CONFIG)")
    parser.add_argument("--host", default=None)
    parser.add_argument("--port", type=int, default=None)
    args = parser.parse_args(argv)
    config = Config.load_for_main(args.config)
    if config is None:
        return 2
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # audit lines, one per line
    logging.getLogger("uvicorn.error").setLevel(logging.WARNING)  # no line per process start
    return serve(config, args.host or config.event_api_host, args.port or config.event_api_port)


if __name__ == "__main__":
    sys.exit(main())
