"""Event and preferences API: a Lambda handler for API Gateway (HTTP API, payload 2.0).

``handler(event, context)`` is what runs on AWS behind API Gateway; ``serve()`` is the local
stand-in for API Gateway, a threaded HTTP server that turns each request into the same event.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import logging
import os
import re
import signal
import sys
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from functools import cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote

import yaml
from botocore.exceptions import BotoCoreError, ClientError
from ulid import ULID

from reference_impl.aws import batch_write, client
from reference_impl.config import CHANNELS, Config
from reference_impl.follower_pages import FollowerPages, PagesBusy
from reference_impl.ids import device_id, preferences_cache_key, user_key, valid_id
from reference_impl.inbox import MAX_LIMIT, BadCursor, Inbox, parse_cursor
from reference_impl.quiet_hours import parse_window, resolve_zone
from reference_impl.user_record import device_attribute, device_value, record_item

log = logging.getLogger("reference.event_api")

EVENT_KINDS = ("post", "like", "comment", "mention")
PLATFORMS = ("apns", "fcm")
# Ten follower pages a call: one lease of the author's list and one count update for them.
MAX_FOLLOWERS_PER_CALL = 10_000
MAX_USERS_PER_CALL = 500
MAX_BODY_BYTES = 1_000_000
# One plain address: no display name, no list (the email consumer sends to exactly this).
_EMAIL = re.compile(r"^[^@\s<>,;]{1,64}@[^@\s<>,;]+\.[^@\s<>,;]+$")


_USER = r"/v1/tenants/(?P<tenant>[^/]+)/users/(?P<user>[^/]+)"


class BadRequest(Exception):
    """Input the API refuses; nothing has been stored."""


def _response(status: int, body: Any) -> dict[str, Any]:
    return {
        "statusCode": status,
        "headers": {"content-type": "application/json"},
        "body": json.dumps(body),
    }


class EventApi:
    """Routes and handlers; one instance per process (the Lambda 'init' phase)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.kinesis = client(config, "kinesis")
        self.ddb = client(config, "dynamodb")
        self.routes: list[tuple[str, re.Pattern[str], Callable[..., dict[str, Any]]]] = [
            ("GET", re.compile(r"^/health$"), self.health),
            ("GET", re.compile(r"^/openapi\.json$"), self.openapi),
            ("POST", re.compile(r"^/v1/events$"), self.post_event),
            (
                "PUT",
                re.compile(r"^/v1/tenants/(?P<tenant>[^/]+)/users/(?P<user>[^/]+)/preferences$"),
                self.put_preferences,
            ),
            (
                "PUT",
                re.compile(
                    r"^/v1/tenants/(?P<tenant>[^/]+)/users/(?P<user>[^/]+)/devices/(?P<token>[^/]+)$"
                ),
                self.put_device,
            ),
            (
                "POST",
                re.compile(
                    r"^/v1/tenants/(?P<tenant>[^/]+)/users/(?P<user>[^/]+)/followers:batch$"
                ),
                self.add_followers,
            ),
            ("POST", re.compile(r"^/v1/tenants/(?P<tenant>[^/]+)/users:batch$"), self.put_users),
            ("DELETE", re.compile(rf"^{_USER}$"), self.erase_user),
            ("GET", re.compile(rf"^{_USER}/inbox$"), self.get_inbox),
            ("GET", re.compile(rf"^{_USER}/unread-count$"), self.get_unread_count),
            ("POST", re.compile(rf"^{_USER}/inbox/read-all$"), self.read_all),
            ("POST", re.compile(rf"^{_USER}/inbox/(?P<nid>[^/]+)/read$"), self.read_one),
        ]
        self._inbox: Inbox | None = None
        self._cache: Any = None

    # -- dispatch ---------------------------------------------------------------------------

    def __call__(self, event: dict[str, Any], context: Any = None) -> dict[str, Any]:
        method = event.get("requestContext", {}).get("http", {}).get("method", "GET").upper()
        path = event.get("rawPath", "/")
        allowed: list[str] = []
        for route_method, pattern, func in self.routes:
            match = pattern.match(path)
            if not match:
                continue
            if route_method != method:
                allowed.append(route_method)
                continue
            try:
                params = {k: unquote(v) for k, v in match.groupdict().items()}
                return func(event, **params)
            except BadRequest as exc:
                return _response(400, {"error": str(exc)})
            except (ClientError, BotoCoreError) as exc:
                # The store or stream failed: tell the client to retry; nothing half-done is
                # acknowledged as accepted.
                return _response(503, {"error": f"backend unavailable: {exc}"})
        if allowed:
            return _response(405, {"error": f"method {method} not allowed on {path}"})
        return _response(404, {"error": f"no route for {path}"})

    @staticmethod
    def _json_body(event: dict[str, Any]) -> dict[str, Any]:
        raw = event.get("body") or ""
        if event.get("isBase64Encoded"):
            raw = base64.b64decode(raw).decode("utf-8", "replace")
        try:
            body = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise BadRequest(f"body is not valid JSON: {exc.msg}") from exc
        if not isinstance(body, dict):
            raise BadRequest("body must be a JSON object")
        return body

    @staticmethod
    def _require_ids(**ids: Any) -> None:
        for name, value in ids.items():
            if not valid_id(value):
                raise BadRequest(f"{name} must be 1-64 characters of A-Z a-z 0-9 _ . -")

    # -- handlers ---------------------------------------------------------------------------

    def health(self, event: dict[str, Any]) -> dict[str, Any]:
        return _response(200, {"ok": True})

    def openapi(self, event: dict[str, Any]) -> dict[str, Any]:
        return _response(200, openapi_document())

    def post_event(self, event: dict[str, Any]) -> dict[str, Any]:
        body = self._json_body(event)
        missing = [f for f in ("tenant_id", "author_id", "kind", "object_id") if f not in body]
        if missing:
            raise BadRequest(f"missing field(s): {', '.join(missing)}")
        self._require_ids(
            tenant_id=body["tenant_id"], author_id=body["author_id"], object_id=body["object_id"]
        )
        if body["kind"] not in EVENT_KINDS:
            raise BadRequest(f"kind must be one of {', '.join(EVENT_KINDS)}")
        # The id is minted here, once, so a retried fan-out reuses it and dedup can work. A
        # client may supply it (an idempotency key for its own retries): it must be a ULID.
        if body.get("event_id") is not None:
            try:
                notification_id = str(ULID.from_str(str(body["event_id"])))
            except ValueError as exc:
                raise BadRequest(
                    "event_id must be a ULID (26 Crockford base32 characters)"
                ) from exc
        else:
            notification_id = str(ULID())
        accepted_at = datetime.now(UTC).isoformat()
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
    def _preferences(body: dict[str, Any]) -> dict[str, Any]:
        """Validated preferences, or BadRequest naming the field."""
        zone = body.get("zone")
        if not isinstance(zone, str):
            raise BadRequest("zone must be an IANA time zone name such as Europe/Berlin")
        if resolve_zone(zone) is None:
            raise BadRequest(f"unknown time zone {zone!r}")
        try:
            parse_window(body.get("quiet_hours"))
        except (ValueError, TypeError) as exc:
            raise BadRequest(f"quiet_hours: {exc}") from exc
        channels = body.get("channels", {})
        if not isinstance(channels, dict) or any(
            c not in CHANNELS or not isinstance(v, bool) for c, v in channels.items()
        ):
            raise BadRequest(f"channels must map some of {', '.join(CHANNELS)} to true/false")
        for name in ("push_consent", "email_consent"):
            consent = body.get(name)
            if consent is not None and not (
                isinstance(consent, dict) and "granted_at" in consent and "version" in consent
            ):
                raise BadRequest(f"{name} must be null or {{granted_at, version}}")
        email = body.get("email")
        if email is not None and not (isinstance(email, str) and _EMAIL.match(email)):
            raise BadRequest("email must be null or one address such as ada@example.com")
        prefs = {
            "zone": zone,
            "quiet_hours": body.get("quiet_hours"),
            "channels": channels,
            "push_consent": body.get("push_consent"),
        }
        # Only when given: a record written without them reads exactly as it always did.
        for name in ("email", "email_consent"):
            if name in body:
                prefs[name] = body[name]
        return prefs

    @staticmethod
    def _device(token: Any, platform: Any) -> tuple[str, str]:
        if platform not in PLATFORMS:
            raise BadRequest("platform must be apns or fcm")
        if not isinstance(token, str) or not token or len(token) > 4096:
            raise BadRequest("token must be 1-4096 characters")
        return token, platform

    def _invalidate(self, keys: list[str]) -> bool:
        """Write-through invalidation: a withdrawn consent takes effect on the next job."""
        try:
            self.cache.delete(*keys)
            return True
        except Exception:  # the 5-minute TTL then bounds the staleness
            return False

    def put_preferences(self, event: dict[str, Any], tenant: str, user: str) -> dict[str, Any]:
        self._require_ids(tenant_id=tenant, user_id=user)
        prefs = self._preferences(self._json_body(event))
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
        invalidated = (
            False
            if "no_cache_invalidation" in self.config.defects
            else self._invalidate([preferences_cache_key(tenant, user)])
        )
        return _response(200, {"stored": True, "cache_invalidated": invalidated})

    def put_device(
        self, event: dict[str, Any], tenant: str, user: str, token: str
    ) -> dict[str, Any]:
        self._require_ids(tenant_id=tenant, user_id=user)
        body = self._json_body(event)
        token, platform = self._device(token, body.get("platform"))
        self.ddb.update_item(
            TableName=self.config.table("preferences"),
            Key={"pk": {"S": user_key(tenant, user)}},
            UpdateExpression="SET #d = :d",
            ExpressionAttributeNames={"#d": device_attribute(device_id(token))},
            ExpressionAttributeValues={
                ":d": device_value(token, platform, datetime.now(UTC).isoformat())
            },
        )
        return _response(200, {"device_id": device_id(token)})

    def put_users(self, event: dict[str, Any], tenant: str) -> dict[str, Any]:
        """Bulk load: the records (preferences and devices) of up to MAX_USERS_PER_CALL users
        in one call, one item per user, written with BatchWriteItem. Each entry replaces the
        user's whole record. All entries are validated before anything is stored."""
        self._require_ids(tenant_id=tenant)
        users = self._json_body(event).get("users")
        if not isinstance(users, list) or not users:
            raise BadRequest("users must be a non-empty list")
        if len(users) > MAX_USERS_PER_CALL:
            raise BadRequest(f"at most {MAX_USERS_PER_CALL} users per call")
        now = datetime.now(UTC).isoformat()
        items, keys, with_prefs, devices = [], [], 0, 0
        for i, entry in enumerate(users):
            try:
                if not isinstance(entry, dict) or not valid_id(entry.get("user_id")):
                    raise BadRequest("user_id is missing or invalid")
                user = entry["user_id"]
                prefs = None
                if entry.get("preferences") is not None:
                    prefs = self._preferences(entry["preferences"])
                    with_prefs += 1
                registered = []
                for device in entry.get("devices") or []:
                    if not isinstance(device, dict):
                        raise BadRequest("devices must be a list of {token, platform}")
                    registered.append(self._device(device.get("token"), device.get("platform")))
            except BadRequest as exc:
                raise BadRequest(f"users[{i}]: {exc}") from exc
            items.append(record_item(user_key(tenant, user), prefs, registered, now))
            keys.append(preferences_cache_key(tenant, user))
            devices += len(registered)
        requests = [{"PutRequest": {"Item": item}} for item in items]
        batch_write(self.ddb, self.config.table("preferences"), requests)
        return _response(
            200,
            {
                "users": len(users),
                "preferences": with_prefs,
                "devices": devices,
                "cache_invalidated": self._invalidate(keys),
            },
        )

    def add_followers(self, event: dict[str, Any], tenant: str, user: str) -> dict[str, Any]:
        self._require_ids(tenant_id=tenant, author_id=user)
        followers = self._json_body(event).get("followers")
        if not isinstance(followers, list) or not followers:
            raise BadRequest("followers must be a non-empty list of user ids")
        if len(followers) > MAX_FOLLOWERS_PER_CALL:
            raise BadRequest(f"at most {MAX_FOLLOWERS_PER_CALL} followers per call")
        bad = [f for f in followers if not valid_id(f)]
        if bad:
            raise BadRequest(f"invalid follower id(s): {bad[:5]}")
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
        if before < threshold <= count:
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
        query = parse_qs(event.get("rawQueryString") or "")
        try:
            limit = int(query.get("limit", ["20"])[0])
        except ValueError as exc:
            raise BadRequest("limit must be an integer") from exc
        if not 1 <= limit <= MAX_LIMIT:
            raise BadRequest(f"limit must be between 1 and {MAX_LIMIT}")
        try:
            page = self.inbox.page(tenant, user, limit, query.get("cursor", [None])[0])
        except BadCursor as exc:
            raise BadRequest(str(exc)) from exc
        return _response(200, page)

    def get_unread_count(self, event: dict[str, Any], tenant: str, user: str) -> dict[str, Any]:
        self._require_ids(tenant_id=tenant, user_id=user)
        return _response(200, self.inbox.unread_count(tenant, user))

    def read_all(self, event: dict[str, Any], tenant: str, user: str) -> dict[str, Any]:
        self._require_ids(tenant_id=tenant, user_id=user)
        return _response(200, {"watermark": self.inbox.mark_all_read(tenant, user)})

    def read_one(self, event: dict[str, Any], tenant: str, user: str, nid: str) -> dict[str, Any]:
        self._require_ids(tenant_id=tenant, user_id=user)
        try:
            nid = parse_cursor(nid) or ""
        except BadCursor as exc:
            raise BadRequest(f"{nid!r} is not a notification id") from exc
        self.inbox.mark_read(tenant, user, nid)
        return _response(200, {"read": nid})


@cache
def openapi_document() -> dict[str, Any]:
    return yaml.safe_load((Path(__file__).parent / "openapi.yaml").read_text())


_api: EventApi | None = None


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """The Lambda entry point (API Gateway HTTP API, payload format 2.0)."""
    global _api
    if _api is None:
        _api = EventApi(Config.load())
    return _api(event, context)


# -- local API Gateway ----------------------------------------------------------------------


def _request_handler(api: EventApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body go out in two writes: without TCP_NODELAY the body waits for the
        # client's delayed ACK (40 ms a request).
        disable_nagle_algorithm = True

        def _serve(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            if length > MAX_BODY_BYTES:
                self._send(_response(413, {"error": f"body over {MAX_BODY_BYTES} bytes"}))
                return
            body = self.rfile.read(length) if length else b""
            path, _, query = self.path.partition("?")
            event = {
                "version": "2.0",
                "rawPath": path,
                "rawQueryString": query,
                "headers": {k.lower(): v for k, v in self.headers.items()},
                "requestContext": {"http": {"method": self.command, "path": path}},
                "body": base64.b64encode(body).decode(),
                "isBase64Encoded": True,
            }
            self._send(api(event, None))

        def _send(self, response: dict[str, Any]) -> None:
            payload = response.get("body", "").encode()
            self.send_response(response["statusCode"])
            for name, value in response.get("headers", {}).items():
                self.send_header(name, value)
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = do_PUT = do_DELETE = _serve

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            return  # one line per request would drown the worker log under load

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512


_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


def serve(config: Config, host: str, port: int) -> int:
    """Serve until SIGTERM/SIGINT with ``config.event_api_processes`` processes on one
    listening socket (each accepts its own connections, as concurrent Lambda instances take
    their own requests). The first process is the parent of the others: it passes its signal
    on and waits for them, so stopping it (or its process group) stops them all."""
    try:
        server = _Server((host, port), BaseHTTPRequestHandler)
    except OSError as exc:
        print(f"error: cannot listen on {host}:{port}: {exc.strerror}", file=sys.stderr)
        return 2
    # Every process waits on the same socket and all wake for one connection: one accepts it,
    # and a blocking accept() would hold the others until the next one.
    server.socket.setblocking(False)
    # Held until each process has its handlers: a stop that comes mid-fork is not lost.
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    children = []
    # Fork before any thread or client exists: each process makes its own (boto3 clients and
    # Redis connections do not survive a fork).
    for _ in range(config.event_api_processes - 1):
        pid = os.fork()
        if pid == 0:
            os._exit(_serve_forever(server, config, children=[]))
        children.append(pid)
    print(
        f"event api listening on http://{host}:{port} ({config.event_api_processes} process(es))",
        flush=True,
    )
    return _serve_forever(server, config, children)


def _serve_forever(server: _Server, config: Config, children: list[int]) -> int:
    stop = threading.Event()

    def _stop(*_: Any) -> None:
        if not stop.is_set():
            stop.set()
            for pid in children:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
            threading.Thread(target=server.shutdown, daemon=True).start()

    # The handlers go first: a signal while the clients are made still stops this process
    # and its children (a shutdown asked for before serve_forever makes it return at once).
    for signum in _STOP_SIGNALS:
        signal.signal(signum, _stop)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    server.RequestHandlerClass = _request_handler(EventApi(config))
    server.serve_forever(poll_interval=0.2)
    server.server_close()
    for pid in children:
        os.waitpid(pid, 0)
    return 0


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
    return serve(config, args.host or config.event_api_host, args.port or config.event_api_port)


if __name__ == "__main__":
    sys.exit(main())
