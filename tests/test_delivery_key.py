"""Delivery keys built apart share their strings (the await's memory at a million deliveries)."""

from __future__ import annotations

import json

from harness.model.delivery_key import delivery_key

ROW = '{"tenant_id": "t1", "notification_id": "01JAAAAAAAAAAAAAAAAAAAAAAA", "token": "tok-000042"}'


def test_keys_of_rows_parsed_apart_hold_each_string_once() -> None:
    first, second = (json.loads(ROW) for _ in range(2))
    assert first["token"] is not second["token"]  # what the collector and the live view get
    a = delivery_key(first["tenant_id"], first["notification_id"], first["token"])
    b = delivery_key(second["tenant_id"], second["notification_id"], second["token"])
    assert a == b == ("t1", "01JAAAAAAAAAAAAAAAAAAAAAAA", "tok-000042")
    assert all(x is y for x, y in zip(a, b, strict=True))


def test_a_missing_part_reads_none_as_text() -> None:
    assert delivery_key("t1", None, "tok") == ("t1", "None", "tok")
