"""Consent gates (DESIGN.md section 4, push consumer step 2): default deny.

Every push send needs a lawful basis (GDPR Art. 7 / ePrivacy), so the consumer reads the
``push_consent`` attribute stored in the preferences record as ``{granted_at, version}`` and
denies whenever it is absent, malformed, or revoked. Email and SMS are consent-bearing channels
too (ePrivacy Art. 13): ``email_consent`` and ``sms_consent``, same shape, same rules. Pure
logic, no I/O, no clock.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

__all__ = [
    "consent_granted",
    "email_consent_granted",
    "push_consent_granted",
    "sms_consent_granted",
]


def _parse_instant(value: object) -> dt.datetime | None:
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        return dt.datetime.fromisoformat(value)
    except ValueError:
        return None


def _valid_version(value: object) -> bool:
    if isinstance(value, bool):  # bool is an int subclass; True is not a consent version
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, str) and bool(value.strip())


def push_consent_granted(preferences: Mapping[str, Any] | None) -> bool:
    """True only for a well-formed, unrevoked push consent record (:func:`consent_granted`)."""
    return consent_granted(preferences, "push_consent")


def email_consent_granted(preferences: Mapping[str, Any] | None) -> bool:
    """True only for a well-formed, unrevoked email consent record (:func:`consent_granted`)."""
    return consent_granted(preferences, "email_consent")


def sms_consent_granted(preferences: Mapping[str, Any] | None) -> bool:
    """True only for a well-formed, unrevoked SMS consent record (:func:`consent_granted`)."""
    return consent_granted(preferences, "sms_consent")


def consent_granted(preferences: Mapping[str, Any] | None, attribute: str) -> bool:
    """True only for a well-formed, unrevoked consent record; False for anything else.

    Granted iff ``preferences[attribute]`` is a mapping with

    * ``granted_at``: a non-empty ISO-8601 string accepted by ``datetime.fromisoformat``;
    * ``version``: an int (not bool) or a non-blank string;
    * ``revoked_at``: absent or None, or an ISO-8601 string strictly *earlier* than
      ``granted_at`` (a re-grant after a revocation).

    Fail-closed choices: a ``revoked_at`` equal to ``granted_at`` denies (the order of the two
    events is unknown); a ``revoked_at`` that is present but unparseable denies; a naive
    timestamp compared with an aware one denies (the two cannot be ordered). ``granted_at`` is
    not compared with the current time (this module has no clock).
    """
    if not isinstance(preferences, Mapping):
        return False
    consent = preferences.get(attribute)
    if not isinstance(consent, Mapping):
        return False
    granted_at = _parse_instant(consent.get("granted_at"))
    if granted_at is None:
        return False
    if not _valid_version(consent.get("version")):
        return False
    raw_revoked = consent.get("revoked_at")
    if raw_revoked is None:
        return True
    revoked_at = _parse_instant(raw_revoked)
    if revoked_at is None:
        return False
    if (revoked_at.utcoffset() is None) != (granted_at.utcoffset() is None):
        return False
    return revoked_at < granted_at
