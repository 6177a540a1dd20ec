from __future__ import annotations

from types import MappingProxyType
from typing import Any

import pytest

from reference_impl.consent import push_consent_granted

GRANTED = {"granted_at": "2026-01-10T09:00:00+00:00", "version": 3}


def prefs(**consent: Any) -> dict[str, Any]:
    return {"push_consent": consent}


@pytest.mark.parametrize(
    "preferences",
    [
        prefs(**GRANTED),
        prefs(granted_at="2026-01-10T09:00:00Z", version="2025-11"),
        prefs(granted_at="2026-01-10", version=0),
        prefs(granted_at="2026-01-10T09:00:00", version="v1"),  # naive, nothing to compare
        prefs(**GRANTED, revoked_at=None),
        # re-granted after an earlier revocation
        prefs(**GRANTED, revoked_at="2026-01-09T09:00:00+00:00"),
        # same instant in another offset is still earlier: 09:30+01:00 == 08:30Z < 09:00Z
        prefs(**GRANTED, revoked_at="2026-01-10T09:30:00+01:00"),
        {"push_consent": MappingProxyType(dict(GRANTED)), "quiet_hours": None},
    ],
)
def test_granted(preferences: Any) -> None:
    assert push_consent_granted(preferences) is True


@pytest.mark.parametrize(
    "preferences",
    [
        None,
        {},
        [],
        "push_consent",
        {"quiet_hours": {"start": "22:00", "end": "07:00"}},
        {"push_consent": None},
        {"push_consent": True},
        {"push_consent": "granted"},
        {"push_consent": [GRANTED]},
        prefs(),
        prefs(version=3),
        prefs(granted_at="2026-01-10T09:00:00+00:00"),
        prefs(granted_at="", version=3),
        prefs(granted_at="   ", version=3),
        prefs(granted_at=None, version=3),
        prefs(granted_at="yesterday", version=3),
        prefs(granted_at="2026-13-01T00:00:00Z", version=3),
        prefs(granted_at=1767999600, version=3),
        prefs(granted_at="2026-01-10T09:00:00+00:00", version=""),
        prefs(granted_at="2026-01-10T09:00:00+00:00", version="  "),
        prefs(granted_at="2026-01-10T09:00:00+00:00", version=None),
        prefs(granted_at="2026-01-10T09:00:00+00:00", version=True),
        prefs(granted_at="2026-01-10T09:00:00+00:00", version=3.0),
        # revoked after granting
        prefs(**GRANTED, revoked_at="2026-01-11T09:00:00+00:00"),
        prefs(**GRANTED, revoked_at="2026-01-10T09:00:00.000001+00:00"),
        # later in absolute time although the wall clock reads earlier: 05:00-05:00 == 10:00Z
        prefs(**GRANTED, revoked_at="2026-01-10T05:00:00-05:00"),
        # tie: order unknown -> deny
        prefs(**GRANTED, revoked_at="2026-01-10T09:00:00Z"),
        # malformed revocation -> deny
        prefs(**GRANTED, revoked_at="not a date"),
        prefs(**GRANTED, revoked_at=""),
        prefs(**GRANTED, revoked_at=0),
        # naive vs aware cannot be ordered -> deny
        prefs(**GRANTED, revoked_at="2026-01-01T00:00:00"),
    ],
)
def test_denied(preferences: Any) -> None:
    assert push_consent_granted(preferences) is False


def test_revocation_then_regrant_sequence() -> None:
    record: dict[str, Any] = {"granted_at": "2026-01-01T00:00:00+00:00", "version": 1}
    assert push_consent_granted({"push_consent": record}) is True
    record["revoked_at"] = "2026-02-01T00:00:00+00:00"
    assert push_consent_granted({"push_consent": record}) is False
    record["granted_at"] = "2026-03-01T00:00:00+00:00"
    assert push_consent_granted({"push_consent": record}) is True
