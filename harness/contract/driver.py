"""The driver: how the verifier reaches a system's public API, for every operation the load and
the oracle need (Jepsen names a client per database; a target file names a driver class).

A driver is *sans I/O*: each operation is a :class:`Call` (method, path, JSON body, a name for
the stats) built from the operation's arguments, and a parser that turns the system's answer
(status, JSON body) into the verifier's terms. The same driver then serves every executor: the
population loader and the scenario actions (httpx, :class:`HttpExecutor`), and the Locust users
(Locust's own client, so its statistics stay Locust's). A driver holds no connection and no
state; it is constructed from the target file's ``driver_options``.

Operations a system does not offer raise :class:`Unsupported`; the harness then switches off the
load, actions and checkers that need them and says so.

:class:`FanoutApiDriver` speaks the reference's Event and Inbox API (``reference_impl/
openapi.yaml``); a system with other paths or payloads brings its own class, named in its target
file as ``driver: package.module:Class``.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import quote

import httpx


class Unsupported(NotImplementedError):
    """The system offers no such operation."""


class DriverError(RuntimeError):
    """The system answered an operation in a way the driver cannot read."""


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    body: Any = None
    # The name Locust files the request under (its statistics group requests by it).
    name: str = ""
    query: Mapping[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        if not self.query:
            return self.path
        return (
            self.path
            + "?"
            + "&".join(f"{k}={quote(str(v), safe='')}" for k, v in self.query.items())
        )


@dataclass(frozen=True)
class Event:
    tenant_id: str
    author_id: str
    kind: str
    object_id: str
    # None: the system mints the id (and answers it).
    event_id: str | None


@dataclass(frozen=True)
class InboxItem:
    notification_id: str
    author_id: str | None
    read: bool


@dataclass(frozen=True)
class InboxPage:
    items: tuple[InboxItem, ...]
    next_cursor: str | None


class Driver(Protocol):
    """What the verifier may ask of a system. Every method returns the :class:`Call` to make;
    ``parse_*`` read the answers that carry data."""

    name: str

    def post_event(self, event: Event) -> Call: ...

    def parse_post_event(self, status: int, body: Any) -> str:
        """The accepted event's notification id."""
        ...

    def set_preferences(self, tenant: str, user: str, preferences: Mapping[str, Any]) -> Call: ...

    def register_device(self, tenant: str, user: str, token: str, platform: str) -> Call: ...

    def follow(self, tenant: str, author: str, followers: Sequence[str]) -> Call: ...

    def load_users(self, tenant: str, users: Sequence[Mapping[str, Any]]) -> Call:
        """A bulk load of users (``user_id``, ``preferences``, ``devices``); raise
        :class:`Unsupported` to have the loader make one call per row instead."""
        ...

    def inbox_page(self, tenant: str, user: str, limit: int, cursor: str | None) -> Call: ...

    def parse_inbox_page(self, status: int, body: Any) -> InboxPage: ...

    def unread_count(self, tenant: str, user: str) -> Call: ...

    def parse_unread_count(self, status: int, body: Any) -> tuple[int, bool]:
        """(count, capped)."""
        ...

    def read_all(self, tenant: str, user: str) -> Call: ...

    def mark_read(self, tenant: str, user: str, notification_id: str) -> Call: ...

    def erase_user(self, tenant: str, user: str) -> Call: ...


class FanoutApiDriver:
    """The reference's Event and Inbox API (and any system that offers the same one)."""

    name = "fanout-api"
    # Bulk calls: the reference's limits (a million users is 2,000 calls, not 2.3 million).
    users_per_call = 500
    followers_per_call = 10_000

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        self.options = dict(options or {})
        self.bulk = bool(self.options.get("bulk", True))

    @staticmethod
    def _user(tenant: str, user: str) -> str:
        return f"/v1/tenants/{quote(tenant, safe='')}/users/{quote(user, safe='')}"

    def post_event(self, event: Event) -> Call:
        body = {
            "tenant_id": event.tenant_id,
            "author_id": event.author_id,
            "kind": event.kind,
            "object_id": event.object_id,
        }
        if event.event_id is not None:
            body["event_id"] = event.event_id
        return Call("POST", "/v1/events", body, "POST /v1/events")

    def parse_post_event(self, status: int, body: Any) -> str:
        try:
            return str(body["notification_id"])
        except (KeyError, TypeError) as exc:
            raise DriverError(f"an accepted event without a notification_id: {body!r}") from exc

    def set_preferences(self, tenant: str, user: str, preferences: Mapping[str, Any]) -> Call:
        path = f"{self._user(tenant, user)}/preferences"
        return Call("PUT", path, dict(preferences), "PUT preferences")

    def register_device(self, tenant: str, user: str, token: str, platform: str) -> Call:
        path = f"{self._user(tenant, user)}/devices/{quote(token, safe='')}"
        return Call("PUT", path, {"platform": platform}, "PUT device")

    def follow(self, tenant: str, author: str, followers: Sequence[str]) -> Call:
        path = f"{self._user(tenant, author)}/followers:batch"
        return Call("POST", path, {"followers": list(followers)}, "POST followers:batch")

    def load_users(self, tenant: str, users: Sequence[Mapping[str, Any]]) -> Call:
        if not self.bulk:
            raise Unsupported("bulk user loading")
        path = f"/v1/tenants/{quote(tenant, safe='')}/users:batch"
        return Call("POST", path, {"users": [dict(u) for u in users]}, "POST users:batch")

    def inbox_page(self, tenant: str, user: str, limit: int, cursor: str | None) -> Call:
        query = {"limit": str(limit)} | ({"cursor": cursor} if cursor else {})
        name = "GET inbox (next page)" if cursor else "GET inbox"
        return Call("GET", f"{self._user(tenant, user)}/inbox", None, name, query)

    def parse_inbox_page(self, status: int, body: Any) -> InboxPage:
        if not isinstance(body, dict):
            raise DriverError(f"an inbox page that is not an object: {body!r}")
        items = tuple(
            InboxItem(str(i.get("notification_id")), i.get("author_id"), bool(i.get("read")))
            for i in body.get("items") or []
        )
        return InboxPage(items, body.get("next_cursor"))

    def unread_count(self, tenant: str, user: str) -> Call:
        return Call("GET", f"{self._user(tenant, user)}/unread-count", None, "GET unread-count")

    def parse_unread_count(self, status: int, body: Any) -> tuple[int, bool]:
        if not isinstance(body, dict) or not isinstance(body.get("unread"), int):
            raise DriverError(f"an unread count without a number: {body!r}")
        return int(body["unread"]), bool(body.get("capped"))

    def read_all(self, tenant: str, user: str) -> Call:
        return Call("POST", f"{self._user(tenant, user)}/inbox/read-all", None, "POST read-all")

    def mark_read(self, tenant: str, user: str, notification_id: str) -> Call:
        path = f"{self._user(tenant, user)}/inbox/{quote(notification_id, safe='')}/read"
        return Call("POST", path, None, "POST inbox/{id}/read")

    def erase_user(self, tenant: str, user: str) -> Call:
        return Call("DELETE", self._user(tenant, user), None, "DELETE user")


def named(spec: str, what: str, shape: str = "package.module:name") -> Any:
    """The object ``package.module:name`` names (a driver class, a team's hook function).
    Raises ValueError saying what is wrong."""
    module_name, sep, name = spec.partition(":")
    if not sep or not module_name or not name:
        raise ValueError(f"{what} must be {shape}, not {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{what} {spec}: cannot import {module_name} ({exc})") from exc
    found = getattr(module, name, None)
    if found is None:
        raise ValueError(f"{what} {spec}: {module_name} has no {name}")
    return found


def load_driver(spec: str | None, options: Mapping[str, Any] | None = None) -> Driver:
    """The driver a target file names (``package.module:Class``); the Event API driver when it
    names none. Raises ValueError with what is wrong."""
    if not spec:
        return FanoutApiDriver(options)
    return named(spec, "driver", "package.module:Class")(options or {})  # type: ignore[no-any-return]


@dataclass
class Answer:
    status: int
    body: Any
    sent: float
    answered: float


class HttpExecutor:
    """Makes a driver's calls with httpx (the loader, the actions, the tests)."""

    def __init__(self, base_url: str, timeout_s: float = 10.0) -> None:
        self.http = httpx.Client(base_url=base_url, timeout=timeout_s)

    def __call__(self, call: Call) -> Answer:
        import time

        sent = time.time()
        response = self.http.request(call.method, call.url, json=call.body)
        answered = time.time()
        try:
            body = response.json() if response.content else None
        except ValueError:
            body = response.text
        return Answer(response.status_code, body, sent, answered)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> HttpExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
