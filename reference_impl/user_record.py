"""A user's record: one preferences-table item per (tenant, user) that holds the preferences and
every registered device.

The delivery path reads a user's preferences and devices together, so they live together: a
push job reads one item (the devices of a whole SQS batch in one BatchGetItem), and loading a
user is one write however many devices they have. Each device is a map attribute named
``d_<device id>``, so registering or deactivating one is an UpdateItem on that attribute alone,
and a change of preferences (``SET prefs``) leaves the devices as they were.

    pk          tenant#user
    prefs       the preferences, JSON (absent: none stored, consent denied)
    updated_at  when the preferences last changed
    d_<id>      {token, platform, active, registered_at[, deactivated_at][, endpoint_arn]}

``endpoint_arn``: the device's SNS platform endpoint, when pushes go through SNS
(reference_impl/sns_push.py).
"""

from __future__ import annotations

import json
from typing import Any

from reference_impl.ids import device_id

DEVICE_PREFIX = "d_"


def device_attribute(device: str) -> str:
    """The item attribute that holds one device (by its :func:`~reference_impl.ids.device_id`)."""
    return f"{DEVICE_PREFIX}{device}"


def device_value(
    token: str, platform: str, registered_at: str, endpoint_arn: str | None = None
) -> dict[str, Any]:
    """A newly registered device, as a DynamoDB map value."""
    value: dict[str, Any] = {
        "token": {"S": token},
        "platform": {"S": platform},
        "active": {"BOOL": True},
        "registered_at": {"S": registered_at},
    }
    if endpoint_arn is not None:
        value["endpoint_arn"] = {"S": endpoint_arn}
    return {"M": value}


def record_item(
    pk: str,
    prefs: dict[str, Any] | None,
    devices: list[tuple[str, str]],
    now: str,
    endpoints: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A whole record (bulk load): the preferences when given and each (token, platform), with
    its SNS endpoint ARN when ``endpoints`` (token -> ARN) has one."""
    item: dict[str, Any] = {"pk": {"S": pk}}
    if prefs is not None:
        item["prefs"] = {"S": json.dumps(prefs)}
        item["updated_at"] = {"S": now}
    for token, platform in devices:
        arn = (endpoints or {}).get(token)
        item[device_attribute(device_id(token))] = device_value(token, platform, now, arn)
    return item


def preferences_of(item: dict[str, Any] | None) -> dict[str, Any] | None:
    """The stored preferences; None when there are none (no item, or devices only)."""
    if not item or "prefs" not in item:
        return None
    return json.loads(item["prefs"]["S"])


def devices_of(item: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Every device of the record, deactivated ones included (``active`` False), in device id
    order (the order a Query of one row per device used to give)."""
    devices = []
    for name in sorted(item or {}):
        if not name.startswith(DEVICE_PREFIX):
            continue
        value = item[name]["M"]  # type: ignore[index]
        devices.append(
            {
                "device_id": name[len(DEVICE_PREFIX) :],
                "token": value["token"]["S"],
                "platform": value["platform"]["S"],
                "active": value.get("active", {}).get("BOOL", True),
                "endpoint_arn": value.get("endpoint_arn", {}).get("S"),
                "registered_at": value.get("registered_at", {}).get("S"),
            }
        )
    return devices
