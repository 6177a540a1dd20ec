"""Delivery dedup key (DESIGN.md section 4, push consumer step 5).

The consumer runs ``SET <dedup_key(...)> 1 NX EX DEDUP_TTL_SECONDS`` before sending, so a
redelivered or redriven job for the same (tenant, notification, recipient) is sent at most once.
The key is tenant-prefixed in the data, not only in IAM: the same notification ULID and
recipient under two tenants yield different keys. Pure logic, no I/O.
"""

from __future__ import annotations

import hashlib

__all__ = [
    "DEDUP_KEY_PREFIX",
    "DEDUP_TTL_SECONDS",
    "dedup_key",
    "email_recipient",
    "inapp_recipient",
    "sms_recipient",
]

DEDUP_KEY_PREFIX = "dedup:"
DEDUP_TTL_SECONDS = 2_592_000  # 30 days; bounds dedup-key retention (GDPR)


def _check_part(name: str, value: object, *, allow_colon: bool) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise ValueError(f"{name} must be non-empty")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{name} is not valid Unicode text (lone surrogate): {value!r}") from exc
    if not allow_colon and ":" in value:
        raise ValueError(f"{name} must not contain ':' (it separates the hashed parts): {value!r}")
    return value


def dedup_key(tenant_id: str, notification_id: str, recipient: str) -> str:
    """``"dedup:" + sha256(f"{tenant_id}:{notification_id}:{recipient}").hexdigest()``.

    The hashed string must decode to exactly one (tenant, notification, recipient) triple,
    otherwise ("a:b", "c", r) and ("a", "b:c", r) would share a key and one would be dropped as
    a duplicate of the other (a cross-tenant suppression). ':' is therefore refused in
    ``tenant_id`` and ``notification_id`` (notification ids are ULIDs, recipients are
    ``user_id#device_id``, so neither legitimately contains one); with the first two parts
    colon-free, the first two ':' are the separators and ``recipient`` may hold anything.
    Empty or whitespace-only parts and non-strings raise ValueError. Parts are not normalized.
    """
    tenant = _check_part("tenant_id", tenant_id, allow_colon=False)
    notification = _check_part("notification_id", notification_id, allow_colon=False)
    who = _check_part("recipient", recipient, allow_colon=True)
    digest = hashlib.sha256(f"{tenant}:{notification}:{who}".encode()).hexdigest()
    return DEDUP_KEY_PREFIX + digest


def email_recipient(user_id: str, address: str) -> str:
    """The email channel's recipient part: ``user#email:<sha256(address)[:16]>``. The address is
    in it (a changed address is a new recipient, mailed again) but only hashed: the dedup store
    holds no PII."""
    return f"{user_id}#email:{hashlib.sha256(address.encode()).hexdigest()[:16]}"


def inapp_recipient(user_id: str) -> str:
    """The in-app channel's recipient part: one per user (every open connection is the user)."""
    return f"{user_id}#inapp"


def sms_recipient(user_id: str, phone: str) -> str:
    """The SMS channel's recipient part: ``user#sms:<sha256(number)[:16]>``. As for email, a
    changed number is a new recipient, and the dedup store holds only a hash of it."""
    return f"{user_id}#sms:{hashlib.sha256(phone.encode()).hexdigest()[:16]}"
