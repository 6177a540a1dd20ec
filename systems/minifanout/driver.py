"""minifanout's driver: the verifier's operations as minifanout's API calls, and its answers
read back in the verifier's terms (``harness.contract.driver``: the contract, the one module
of the harness this imports).

What minifanout does not offer raises :class:`Unsupported`: a bulk user load (the loader then
makes one call per person and per device) and per-item reads (its feed has only a seen
watermark). Preferences are translated: ``zone`` -> ``timezone``, ``quiet_hours {start, end}``
-> ``dnd {from, to}``, ``push_consent {granted_at, version}`` -> ``push.consent {at, version}``,
``channels.push`` -> ``push.enabled`` (a consent with ``revoked_at`` -> none); email fields are dropped (minifanout has no email
channel).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

from harness.contract.driver import (
    Call,
    DriverError,
    Event,
    InboxItem,
    InboxPage,
    Unsupported,
)

PLATFORM_OS = {"apns": "ios", "fcm": "android"}
MAX_PAGE = 100


def settings_from_preferences(preferences: Mapping[str, Any]) -> dict[str, Any]:
    """The population's preferences body as minifanout's settings."""
    quiet = preferences.get("quiet_hours")
    consent = preferences.get("push_consent")
    channels = preferences.get("channels") or {}
    return {
        "timezone": preferences.get("zone") or "UTC",
        "dnd": {"from": quiet["start"], "to": quiet["end"]} if quiet else None,
        "push": {
            "enabled": bool(channels.get("push", True)),
            "consent": (
                {"at": str(consent["granted_at"]), "version": str(consent["version"])}
                # minifanout keeps no revoked consent: a withdrawn record is no consent there.
                if consent and not consent.get("revoked_at")
                else None
            ),
        },
    }


class MiniFanoutDriver:
    """minifanout's API (``systems/minifanout/api.py``)."""

    name = "minifanout"
    followers_per_call = 10_000
    bulk = False

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        self.options = dict(options or {})
        # ``erasure: false``: a deployment whose erasure runs elsewhere (the API's DELETE is
        # switched off): the harness must hear so before any load.
        self.erasure = bool(self.options.get("erasure", True))

    @staticmethod
    def _person(tenant: str, user: str) -> str:
        return f"/api/t/{quote(tenant, safe='')}/people/{quote(user, safe='')}"

    def post_event(self, event: Event) -> Call:
        body = {
            "tenant": event.tenant_id,
            "actor": event.author_id,
            "verb": event.kind,
            "target": event.object_id,
        }
        if event.event_id is not None:
            body["id"] = event.event_id
        return Call("POST", "/api/notify", body, "POST /api/notify")

    def parse_post_event(self, status: int, body: Any) -> str:
        if not isinstance(body, dict) or not isinstance(body.get("id"), str):
            raise DriverError(f"an accepted event without an id: {body!r}")
        return body["id"]

    def set_preferences(self, tenant: str, user: str, preferences: Mapping[str, Any]) -> Call:
        body = {"settings": settings_from_preferences(preferences)}
        return Call("PUT", self._person(tenant, user), body, "PUT person (settings)")

    def register_device(self, tenant: str, user: str, token: str, platform: str) -> Call:
        os_name = PLATFORM_OS.get(platform)
        if os_name is None:
            raise Unsupported(f"devices of platform {platform!r} (only {', '.join(PLATFORM_OS)})")
        body = {"devices": [{"token": token, "os": os_name}]}
        return Call("PUT", self._person(tenant, user), body, "PUT person (device)")

    def follow(self, tenant: str, author: str, followers: Sequence[str]) -> Call:
        if len(followers) > self.followers_per_call:
            raise ValueError(f"at most {self.followers_per_call} followers a call")
        path = f"{self._person(tenant, author)}/followers"
        return Call("POST", path, {"add": list(followers)}, "POST followers")

    def load_users(self, tenant: str, users: Sequence[Mapping[str, Any]]) -> Call:
        raise Unsupported("bulk user loading: one PUT per person and per device")

    def inbox_page(self, tenant: str, user: str, limit: int, cursor: str | None) -> Call:
        # minifanout serves at most 100 entries a page; a shorter page with a cursor is still
        # a correct page.
        query = {"count": str(max(1, min(limit, MAX_PAGE)))} | (
            {"before": cursor} if cursor else {}
        )
        name = "GET feed (next page)" if cursor else "GET feed"
        return Call("GET", f"{self._person(tenant, user)}/feed", None, name, query)

    def parse_inbox_page(self, status: int, body: Any) -> InboxPage:
        entries = body.get("entries") if isinstance(body, dict) else None
        if not isinstance(entries, list):
            raise DriverError(f"a feed page without entries: {body!r}")
        try:
            items = tuple(
                InboxItem(str(e["id"]), e.get("actor"), bool(e.get("seen"))) for e in entries
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise DriverError(f"a feed entry without an id: {body!r}") from exc
        cursor = body.get("before")
        return InboxPage(items, cursor if isinstance(cursor, str) and cursor else None)

    def unread_count(self, tenant: str, user: str) -> Call:
        return Call("GET", f"{self._person(tenant, user)}/feed/unseen", None, "GET feed/unseen")

    def parse_unread_count(self, status: int, body: Any) -> tuple[int, bool]:
        if not isinstance(body, dict) or type(body.get("unseen")) is not int:
            raise DriverError(f"an unseen count without a number: {body!r}")
        return body["unseen"], False

    def read_all(self, tenant: str, user: str) -> Call:
        return Call("POST", f"{self._person(tenant, user)}/feed/seen", None, "POST feed/seen")

    def mark_read(self, tenant: str, user: str, notification_id: str) -> Call:
        raise Unsupported("per-item reads (the feed keeps only a seen watermark)")

    def erase_user(self, tenant: str, user: str) -> Call:
        if not self.erasure:
            raise Unsupported("erasure through the API (driver option erasure: false)")
        return Call("DELETE", self._person(tenant, user), None, "DELETE person")
