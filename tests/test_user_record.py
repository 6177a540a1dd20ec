"""The user's record: preferences and devices in one item (pure functions)."""

from __future__ import annotations

import json

import pytest

from reference_impl.ids import device_id
from reference_impl.user_record import (
    device_attribute,
    devices_of,
    preferences_of,
    record_item,
)


def test_a_record_round_trips_its_preferences_and_devices():
    prefs = {"zone": "Asia/Kolkata", "push_consent": None}
    item = record_item("t#u", prefs, [("tok-b", "fcm"), ("tok-a", "apns")], "2026-11-24T00:00Z")
    assert preferences_of(item) == prefs
    devices = devices_of(item)
    assert [d["token"] for d in devices] == sorted(["tok-a", "tok-b"], key=lambda t: device_id(t))
    assert {d["device_id"] for d in devices} == {device_id("tok-a"), device_id("tok-b")}
    assert all(d["active"] for d in devices)
    assert {d["platform"] for d in devices} == {"apns", "fcm"}


def test_a_record_without_preferences_denies_by_having_none():
    item = record_item("t#u", None, [("tok", "apns")], "now")
    assert "prefs" not in item and preferences_of(item) is None
    assert preferences_of(None) is None and devices_of(None) == []
    assert [d["token"] for d in devices_of(item)] == ["tok"]


def test_a_deactivated_device_reads_inactive_and_other_attributes_are_not_devices():
    item = record_item("t#u", {"zone": "UTC"}, [("dead", "apns"), ("live", "fcm")], "now")
    item[device_attribute(device_id("dead"))]["M"]["active"] = {"BOOL": False}
    item["updated_at"] = {"S": "later"}
    states = {d["token"]: d["active"] for d in devices_of(item)}
    assert states == {"dead": False, "live": True}


def test_an_unreadable_preferences_attribute_is_an_error_not_a_default():
    with pytest.raises(json.JSONDecodeError):
        preferences_of({"pk": {"S": "t#u"}, "prefs": {"S": "{not json"}})
