"""Identifier rules shared by every entry point: what a tenant, user or device id may be."""

from __future__ import annotations

import hashlib
import re

# '#' separates key segments (tenant#user) and ':' separates dedup-key parts, so neither may
# appear inside an id: otherwise two tenants could construct colliding keys. An id is also a
# path segment (of URLs, and of the audit trail's S3 keys ``audit/<tenant>/...``): it may not
# start with a dot, so '.' and '..' (and hidden names) are never ids. Dots inside stay allowed
# for domain-style tenants such as ``acme.eu``. The OpenAPI document states the same pattern.
ID_PATTERN = r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}$"
ID_RULE = "1-64 characters of A-Z a-z 0-9 _ - . (not starting with a dot)"
_ID = re.compile(ID_PATTERN)


def valid_id(value: object) -> bool:
    # fullmatch: '$' alone would also let a trailing newline through.
    return isinstance(value, str) and bool(_ID.fullmatch(value))


# A phone number the SMS channel sends to: E.164, '+' and up to 15 digits, no leading zero (what
# SNS's Publish takes as PhoneNumber). The OpenAPI document states the same pattern.
PHONE_PATTERN = r"^\+[1-9][0-9]{1,14}$"
_PHONE = re.compile(PHONE_PATTERN)


def valid_phone(value: object) -> bool:
    return isinstance(value, str) and bool(_PHONE.fullmatch(value))


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
