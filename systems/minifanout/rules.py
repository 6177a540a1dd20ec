"""The pure decisions: what a person's settings look like, whether a push may go now (consent,
quiet hours in the person's IANA zone), how long to wait before a retry. No I/O here."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from functools import cache
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ulid import ULID

NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
OSES = ("ios", "android")
MAX_DEVICES_PER_CALL = 20
MAX_TOKEN_LENGTH = 4096
# SQS caps a message's delay at 15 minutes: a longer window is waited out in 15-minute steps.
MAX_DEFER_S = 900
# Retries after a failure (a store or provider error) back off with the receive count.
BACKOFF_S = (3, 6, 12, 20)


class Invalid(ValueError):
    """A request body that breaks the API's rules; the message says which."""


def check_name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not NAME_RE.match(value):
        raise Invalid(f"{what} must be 1-128 characters of A-Z a-z 0-9 . _ -, got {value!r}")
    return value


def notification_id(value: Any) -> str:
    """The event's id: a ULID the client chose (canonical form), or a new one."""
    if value is None:
        return str(ULID())
    if not isinstance(value, str):
        raise Invalid("id must be a ULID string")
    try:
        return str(ULID.from_str(value.upper()))
    except ValueError as exc:
        raise Invalid(
            f"id must be a ULID (26 Crockford base-32 characters), got {value!r}"
        ) from exc


def parse_clock(value: Any) -> time:
    """``HH:MM`` or ``HH:MM:SS``."""
    if not isinstance(value, str):
        raise Invalid(f"a clock time is a string HH:MM[:SS], got {value!r}")
    parts = value.split(":")
    try:
        if len(parts) not in (2, 3):
            raise ValueError
        return time(*(int(p) for p in parts))
    except ValueError as exc:
        raise Invalid(f"a clock time is HH:MM[:SS], got {value!r}") from exc


@cache
def zone(name: str) -> ZoneInfo | None:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return None


def check_settings(body: Any) -> dict[str, Any]:
    """A person's settings in their stored form::

    {"timezone": "Asia/Tokyo",
     "dnd": {"from": "22:00", "to": "07:00"} | null,
     "push": {"enabled": true, "consent": {"at": "<ISO time>", "version": "1"} | null}}
    """
    if not isinstance(body, dict):
        raise Invalid("settings must be an object")
    unknown = set(body) - {"timezone", "dnd", "push"}
    if unknown:
        raise Invalid(f"settings: unknown field(s) {', '.join(sorted(unknown))}")
    tz = body.get("timezone", "UTC")
    if not isinstance(tz, str) or zone(tz) is None:
        raise Invalid(f"settings.timezone must be an IANA zone name, got {tz!r}")
    dnd = body.get("dnd")
    if dnd is not None:
        if not isinstance(dnd, dict) or set(dnd) != {"from", "to"}:
            raise Invalid('settings.dnd must be null or {"from": "HH:MM", "to": "HH:MM"}')
        parse_clock(dnd["from"])
        parse_clock(dnd["to"])
        dnd = {"from": dnd["from"], "to": dnd["to"]}
    push = body.get("push") or {}
    if not isinstance(push, dict) or set(push) - {"enabled", "consent"}:
        raise Invalid('settings.push must be {"enabled": bool, "consent": {...} | null}')
    enabled = push.get("enabled", True)
    if not isinstance(enabled, bool):
        raise Invalid("settings.push.enabled must be true or false")
    consent = push.get("consent")
    if consent is not None:
        if (
            not isinstance(consent, dict)
            or not isinstance(consent.get("at"), str)
            or not consent["at"]
            or not isinstance(consent.get("version"), str)
        ):
            raise Invalid('settings.push.consent must be null or {"at": str, "version": str}')
        consent = {"at": consent["at"], "version": consent["version"]}
    return {"timezone": tz, "dnd": dnd, "push": {"enabled": enabled, "consent": consent}}


def check_devices(body: Any) -> list[dict[str, str]]:
    """``[{"token": str, "os": "ios" | "android"}]``."""
    if not isinstance(body, list) or len(body) > MAX_DEVICES_PER_CALL:
        raise Invalid(f"devices must be a list of at most {MAX_DEVICES_PER_CALL}")
    devices = []
    for device in body:
        if not isinstance(device, dict) or set(device) != {"token", "os"}:
            raise Invalid('each device is {"token": str, "os": "ios" | "android"}')
        token, os_name = device["token"], device["os"]
        if not isinstance(token, str) or not 0 < len(token) <= MAX_TOKEN_LENGTH:
            raise Invalid(f"a device token is a string of 1-{MAX_TOKEN_LENGTH} characters")
        if os_name not in OSES:
            raise Invalid(f"a device's os is one of {', '.join(OSES)}, got {os_name!r}")
        devices.append({"token": token, "os": os_name})
    return devices


def consented(settings: dict[str, Any] | None) -> bool:
    """Push consent is default-deny: no settings, push switched off or no consent record, no
    push."""
    if not settings:
        return False
    push = settings.get("push") or {}
    return bool(push.get("enabled", True)) and bool(push.get("consent"))


def quiet_remaining(dnd: dict[str, str] | None, tz: ZoneInfo, now: datetime) -> float | None:
    """Seconds until the do-not-disturb window containing ``now`` ends, in the zone's wall
    clock; None when ``now`` is outside it. The window covers [from, to), wrapping midnight
    when from > to; from == to covers nothing."""
    if not dnd:
        return None
    start, end = parse_clock(dnd["from"]), parse_clock(dnd["to"])
    local = now.astimezone(tz)
    clock = local.time().replace(tzinfo=None)
    if start == end:
        return None
    inside = start <= clock < end if start < end else (clock >= start or clock < end)
    if not inside:
        return None
    for days in range(3):  # the end is at most a day and a DST shift away
        candidate = datetime.combine(local.date() + timedelta(days=days), end, tzinfo=tz)
        # Timestamps, not datetime subtraction: two datetimes sharing a tzinfo subtract as
        # naive wall clocks, which is wrong across a DST change.
        remaining = candidate.timestamp() - now.timestamp()
        if remaining > 0:
            return remaining
    raise AssertionError("unreachable: a window ends within two days")


@dataclass(frozen=True)
class Decision:
    """``send``, ``deny`` (drop the job, with why) or ``defer`` (re-enqueue ``delay_s`` later)."""

    action: str
    reason: str = ""
    delay_s: int = 0


def decide(
    settings: dict[str, Any] | None,
    now: datetime,
    *,
    quiet_hours_utc: bool = False,
    consent_default_allow: bool = False,
) -> Decision:
    """What to do with a push job for a person with these settings at ``now`` (aware)."""
    if not consented(settings) and not (consent_default_allow and not _withdrawn(settings)):
        return Decision("deny", "no push consent")
    settings = settings or {}
    tz = UTC if quiet_hours_utc else zone(settings.get("timezone") or "UTC")
    if tz is None:  # quiet hours fail closed: an unknown zone waits
        return Decision("defer", "unknown time zone", MAX_DEFER_S)
    remaining = quiet_remaining(settings.get("dnd"), tz, now)
    if remaining is not None:
        return Decision("defer", "quiet hours", min(MAX_DEFER_S, max(1, math.ceil(remaining))))
    return Decision("send")


def _withdrawn(settings: dict[str, Any] | None) -> bool:
    """Push switched off explicitly (the consent_default_allow bug still honours that)."""
    return bool(settings) and not (settings.get("push") or {}).get("enabled", True)


def backoff_s(receive_count: int) -> int:
    """How long a job that failed on its ``receive_count``-th receive stays invisible."""
    return BACKOFF_S[min(max(receive_count, 1), len(BACKOFF_S)) - 1]


def retry_after_s(value: str | None, now: datetime) -> float | None:
    """A Retry-After header (seconds or an HTTP date) in seconds from ``now``; None if absent or
    unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    from email.utils import parsedate_to_datetime

    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - now).total_seconds())
