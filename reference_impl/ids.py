"""Identifier rules shared by every entry point: what a tenant, user or device id may be."""

from __future__ import annotations

import hashlib
import re

# '#' separates key segments (tenant#user) and ':' separates dedup-key parts, so neither may
# appear inside an id: otherwise two tenants could construct colliding keys.
_ID = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


def valid_id(value: object) -> bool:
    return isinstance(value, str) and bool(_ID.match(value))


def user_key(tenant_id: str, user_id: str) -> str:
    """Partition key of every per-user row: the tenant is the literal leading segment."""
    return f"{tenant_id}#{user_id}"


def device_id(token: str) -> str:
    """Stable short id of a device token (tokens are long and may be rotated by the OS)."""
    return hashlib.sha256(token.encode()).hexdigest()[:20]


PREFERENCES_CACHE_SECONDS = 300


def preferences_cache_key(tenant_id: str, user_id: str) -> str:
    """Tenant-prefixed like every key; written by the consumer, dropped by every change."""
    return f"{tenant_id}:prefs:{user_id}"
