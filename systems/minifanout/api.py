"""The HTTP API (aiohttp): people, followers, events (fanned out in the request), feeds.

* ``POST /api/notify`` ``{"tenant", "actor", "verb", "target", "id"?}`` -> 202 ``{"id",
  "recipients", "jobs"}``: the entry in every follower's feed and one push job per active
  device on the queue before the answer. ``id`` is a ULID the client may choose (a retry with
  the same id writes the same entries and jobs again; the consumer's claim sends once).
* ``PUT /api/t/{tenant}/people/{user}`` ``{"settings"?, "devices"?}`` -> 200: settings replace
  the stored ones, devices are added (or made active again).
* ``GET /api/t/{tenant}/people/{user}`` -> ``{"settings", "devices": [{"token", "os",
  "active"}]}``; ``DELETE`` erases the person (data and dedup claims) -> 200, or 503 if a store
  is unreachable (retry it).
* ``POST /api/t/{tenant}/people/{user}/followers`` ``{"add": [user, ...]}`` -> ``{"followers"}``
* ``GET .../feed?count=&before=`` -> ``{"entries": [{"id", "actor", "verb", "target",
  "seen"}], "before": cursor | null}``; ``GET .../feed/unseen`` -> ``{"unseen"}``; ``POST
  .../feed/seen`` -> ``{"seen_through"}``.

Errors are JSON ``{"error": ...}``: 400 bad input, 404, 405, 413 a body over 1 MiB, 503 a store
or the queue unreachable (nothing already accepted is lost: the caller retries).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from redis.exceptions import RedisError

from systems.minifanout.jobqueue import JobQueue, QueueError
from systems.minifanout.providers import Job
from systems.minifanout.rules import (
    Invalid,
    check_devices,
    check_name,
    check_settings,
    notification_id,
)
from systems.minifanout.store import Claims, People, feed_member

log = logging.getLogger("minifanout.api")

MAX_BODY = 1 << 20
MAX_FOLLOWERS_PER_CALL = 10_000
MAX_PAGE = 100
MAX_TEXT = 256

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure answers JSON, with a status that says whose fault it is."""
    try:
        return await handler(request)
    except Invalid as exc:
        return _error(400, str(exc))
    except (RedisError, QueueError) as exc:
        log.warning("%s %s: store unavailable: %s", request.method, request.path, exc)
        return _error(503, f"a store is unavailable, retry: {type(exc).__name__}")
    except web.HTTPRequestEntityTooLarge:
        return _error(413, f"request body over {MAX_BODY} bytes")
    except web.HTTPException as exc:
        if exc.status >= 400:
            return _error(exc.status, exc.reason)
        raise


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json(loads=json.loads)
    except ValueError as exc:
        raise Invalid(f"the body must be JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise Invalid("the body must be a JSON object")
    return body


def _text(body: dict[str, Any], name: str, default: str | None = None) -> str:
    value = body.get(name, default)
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise Invalid(f"{name} must be a string of at most {MAX_TEXT} characters")
    return value


def _person(request: web.Request) -> tuple[str, str]:
    info = request.match_info
    return check_name(info["tenant"], "tenant"), check_name(info["user"], "user")


class Api:
    def __init__(self, people: People, claims: Claims, queue: JobQueue) -> None:
        self.people, self.claims, self.queue = people, claims, queue
        # Filled in by the process when the consumer runs in it: /api/health shows its counts.
        self.consumer_counts: dict[str, int] | None = None
        self.bugs: list[str] = []

    def app(self) -> web.Application:
        app = web.Application(middlewares=[json_errors], client_max_size=MAX_BODY)
        person = "/api/t/{tenant}/people/{user}"
        app.router.add_get("/api/health", self.health)
        app.router.add_post("/api/notify", self.notify)
        app.router.add_put(person, self.put_person)
        app.router.add_get(person, self.get_person)
        app.router.add_delete(person, self.erase_person)
        app.router.add_post(person + "/followers", self.add_followers)
        app.router.add_get(person + "/feed", self.feed)
        app.router.add_get(person + "/feed/unseen", self.unseen)
        app.router.add_post(person + "/feed/seen", self.seen)
        return app

    async def health(self, request: web.Request) -> web.Response:
        body: dict[str, Any] = {"ok": True, "bugs": self.bugs}
        if self.consumer_counts is not None:
            body["consumer"] = dict(self.consumer_counts)
        return web.json_response(body)

    async def notify(self, request: web.Request) -> web.Response:
        body = await _body(request)
        tenant = check_name(body.get("tenant"), "tenant")
        actor = check_name(body.get("actor"), "actor")
        verb = _text(body, "verb")
        target = _text(body, "target", "")
        nid = notification_id(body.get("id"))
        followers = await self.people.followers(tenant, actor)
        reached = await self.people.fan_out(
            tenant, followers, feed_member(nid, actor, verb, target)
        )
        jobs = [
            Job(tenant, follower, nid, token, device["os"], actor, verb, target).body()
            for follower, devices in reached
            for token, device in sorted(devices.items())
            if device.get("active", True)
        ]
        await self.queue.send(jobs, tenant)
        return web.json_response(
            {"id": nid, "recipients": len(reached), "jobs": len(jobs)}, status=202
        )

    async def put_person(self, request: web.Request) -> web.Response:
        tenant, user = _person(request)
        body = await _body(request)
        unknown = set(body) - {"settings", "devices"}
        if unknown:
            raise Invalid(f"unknown field(s) {', '.join(sorted(unknown))}")
        settings = check_settings(body["settings"]) if "settings" in body else None
        devices = check_devices(body.get("devices", []))
        await self.people.put(tenant, user, settings, devices)
        return web.json_response({"tenant": tenant, "user": user, "devices_added": len(devices)})

    async def get_person(self, request: web.Request) -> web.Response:
        tenant, user = _person(request)
        settings, devices = await self.people.get(tenant, user)
        if settings is None and not devices:
            return _error(404, f"no person {user} in {tenant}")
        listed = [{"token": t, **d} for t, d in sorted(devices.items())]
        return web.json_response({"settings": settings, "devices": listed})

    async def erase_person(self, request: web.Request) -> web.Response:
        tenant, user = _person(request)
        # Claims first: if the dedup store is down the answer is 503 and a retry does it all.
        claims = await self.claims.erase(tenant, user)
        await self.people.erase(tenant, user)
        return web.json_response({"erased": True, "claims": claims})

    async def add_followers(self, request: web.Request) -> web.Response:
        tenant, author = _person(request)
        body = await _body(request)
        add = body.get("add")
        if not isinstance(add, list) or not 0 < len(add) <= MAX_FOLLOWERS_PER_CALL:
            raise Invalid(f"add must be a list of 1-{MAX_FOLLOWERS_PER_CALL} user ids")
        followers = [check_name(f, "a follower") for f in add]
        if author in followers:
            raise Invalid("a person cannot follow themselves")
        total = await self.people.follow(tenant, author, followers)
        return web.json_response({"followers": total})

    async def feed(self, request: web.Request) -> web.Response:
        tenant, user = _person(request)
        raw = request.query.get("count", "20")
        if not raw.isdigit() or not 1 <= int(raw) <= MAX_PAGE:
            raise Invalid(f"count must be a whole number from 1 to {MAX_PAGE}")
        before = request.query.get("before")
        if before is not None:
            before = notification_id(before)
        entries, more = await self.people.feed_page(tenant, user, int(raw), before)
        return web.json_response({"entries": entries, "before": more})

    async def unseen(self, request: web.Request) -> web.Response:
        tenant, user = _person(request)
        return web.json_response({"unseen": await self.people.unseen(tenant, user)})

    async def seen(self, request: web.Request) -> web.Response:
        tenant, user = _person(request)
        return web.json_response({"seen_through": await self.people.mark_seen(tenant, user)})
