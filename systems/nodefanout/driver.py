"""nodefanout's driver: the verifier's operations as nodefanout's API calls (``/v2/orgs/...``),
and its answers read back in the verifier's terms. Imports only ``harness.contract.driver``.

Translations: an event's author, kind, object and id are a broadcast's ``by``, ``verb``, ``ref``
and ``key``; the accepted notification id is the ``ticket``. The population's preferences
(``zone``, ``quiet_hours {start, end}``, ``push_consent {granted_at, version, revoked_at}``,
``channels.push``) are a member profile (``tz``, ``doNotDisturb {begin, end}``, ``optIn {at,
version, revokedAt}``, ``pushEnabled``); email, SMS and in-app fields are dropped (push only).
Platforms: ``apns`` is ``apple``, ``fcm`` is ``google``.

Not offered (:class:`Unsupported`): bulk user loading (one PUT per member and per device),
every read of an inbox (nodefanout keeps none), and erasure: its API answers 501, so the driver
says so before any load (driver option ``erasure_call: true`` builds the DELETE anyway, to see
the 501).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

from harness.contract.driver import Call, DriverError, Event, InboxPage, Unsupported

KINDS = {"apns": "apple", "fcm": "google"}
NO_INBOX = "inbox reads (nodefanout is push only: it keeps no inbox)"


def profile_from_preferences(preferences: Mapping[str, Any]) -> dict[str, Any]:
    """The population's preferences body as a nodefanout member profile."""
    quiet = preferences.get("quiet_hours")
    consent = preferences.get("push_consent")
    channels = preferences.get("channels") or {}
    return {
        "tz": preferences.get("zone") or "UTC",
        "doNotDisturb": {"begin": quiet["start"], "end": quiet["end"]} if quiet else None,
        "optIn": (
            {
                "at": str(consent["granted_at"]),
                "version": str(consent["version"]),
                "revokedAt": str(consent["revoked_at"]) if consent.get("revoked_at") else None,
            }
            if consent
            else None
        ),
        "pushEnabled": bool(channels.get("push", True)),
    }


class NodeFanoutDriver:
    """nodefanout's API (``systems/nodefanout/lib/api.mjs``)."""

    name = "nodefanout"
    followers_per_call = 10_000
    bulk = False

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        self.options = dict(options or {})
        self.erasure_call = bool(self.options.get("erasure_call", False))

    @staticmethod
    def _member(tenant: str, user: str) -> str:
        return f"/v2/orgs/{quote(tenant, safe='')}/members/{quote(user, safe='')}"

    def post_event(self, event: Event) -> Call:
        body = {"by": event.author_id, "verb": event.kind, "ref": event.object_id}
        if event.event_id is not None:
            body["key"] = event.event_id
        path = f"/v2/orgs/{quote(event.tenant_id, safe='')}/broadcasts"
        return Call("POST", path, body, "POST broadcasts")

    def parse_post_event(self, status: int, body: Any) -> str:
        if not isinstance(body, dict) or not isinstance(body.get("ticket"), str):
            raise DriverError(f"an accepted broadcast without a ticket: {body!r}")
        return body["ticket"]

    def set_preferences(self, tenant: str, user: str, preferences: Mapping[str, Any]) -> Call:
        body = profile_from_preferences(preferences)
        return Call("PUT", self._member(tenant, user), body, "PUT member")

    def register_device(self, tenant: str, user: str, token: str, platform: str) -> Call:
        kind = KINDS.get(platform)
        if kind is None:
            raise Unsupported(f"devices of platform {platform!r} (only {', '.join(KINDS)})")
        path = f"{self._member(tenant, user)}/devices/{quote(token, safe='')}"
        return Call("PUT", path, {"kind": kind}, "PUT member device")

    def follow(self, tenant: str, author: str, followers: Sequence[str]) -> Call:
        if len(followers) > self.followers_per_call:
            raise ValueError(f"at most {self.followers_per_call} followers a call")
        path = f"{self._member(tenant, author)}/audience"
        return Call("POST", path, {"add": list(followers)}, "POST member audience")

    def load_users(self, tenant: str, users: Sequence[Mapping[str, Any]]) -> Call:
        raise Unsupported("bulk user loading: one PUT per member and per device")

    def inbox_page(self, tenant: str, user: str, limit: int, cursor: str | None) -> Call:
        raise Unsupported(NO_INBOX)

    def parse_inbox_page(self, status: int, body: Any) -> InboxPage:
        raise Unsupported(NO_INBOX)

    def unread_count(self, tenant: str, user: str) -> Call:
        raise Unsupported(NO_INBOX)

    def parse_unread_count(self, status: int, body: Any) -> tuple[int, bool]:
        raise Unsupported(NO_INBOX)

    def read_all(self, tenant: str, user: str) -> Call:
        raise Unsupported(NO_INBOX)

    def mark_read(self, tenant: str, user: str, notification_id: str) -> Call:
        raise Unsupported(NO_INBOX)

    def erase_user(self, tenant: str, user: str) -> Call:
        if not self.erasure_call:
            raise Unsupported("erasure (nodefanout's DELETE member answers 501)")
        return Call("DELETE", self._member(tenant, user), None, "DELETE member")
