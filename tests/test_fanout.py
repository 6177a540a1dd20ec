"""Fan-out planning: tier choice, rows and jobs, malformed records."""

from __future__ import annotations

import json

import pytest

from reference_impl.fanout import (
    FanoutEvent,
    MalformedEvent,
    choose_tier,
    chunks,
    inbox_item,
    parse_event,
    pointer_item,
    push_job,
    sqs_entries,
)

EVENT = FanoutEvent(
    tenant_id="acme",
    author_id="u1",
    kind="post",
    object_id="p1",
    notification_id="01JD5V3KX9B9Q0ZC4S6Y2M8N7P",
    accepted_at="2026-11-22T12:00:00+00:00",
)


@pytest.mark.parametrize(
    ("followers", "threshold", "tier"),
    [
        (0, 10_000, "write"),
        (9_999, 10_000, "write"),
        (10_000, 10_000, "celebrity"),
        (5, 1, "celebrity"),
    ],
)
def test_tier_switches_at_the_threshold(followers, threshold, tier):
    assert choose_tier(followers, threshold) == tier


def test_inbox_row_is_tenant_scoped_ulid_keyed_with_90_day_ttl():
    item = inbox_item(EVENT, "u9")
    assert item["pk"]["S"] == "acme#u9"
    assert item["sk"]["S"] == EVENT.notification_id
    # 2026-11-22T12:00Z + 90 days = 2027-02-20T12:00Z
    assert item["expires_at"]["N"] == "1803124800"


def test_celebrity_pointer_is_one_row_under_the_author():
    item = pointer_item(EVENT)
    assert item["pk"]["S"] == "acme#u1"
    assert item["sk"]["S"] == EVENT.notification_id


def test_jobs_carry_the_tenant_as_a_message_attribute():
    jobs = [push_job(EVENT, f"u{n}") for n in range(3)]
    entries = sqs_entries(jobs)
    assert [e["Id"] for e in entries] == ["0", "1", "2"]
    assert all(e["MessageAttributes"]["tenant_id"]["StringValue"] == "acme" for e in entries)
    body = json.loads(entries[2]["MessageBody"])
    assert body["recipient_user_id"] == "u2"
    assert body["notification_id"] == EVENT.notification_id


def test_chunks_cover_everything_in_order():
    assert list(chunks(range(23), 10)) == [list(range(10)), list(range(10, 20)), [20, 21, 22]]
    assert list(chunks([], 10)) == []


def test_parse_event_round_trip_and_refusals():
    raw = json.dumps(EVENT.__dict__).encode()
    assert parse_event(raw) == EVENT
    with pytest.raises(MalformedEvent, match="not JSON"):
        parse_event(b"{nope")
    with pytest.raises(MalformedEvent, match="notification_id"):
        parse_event(json.dumps({**EVENT.__dict__, "notification_id": ""}).encode())
    with pytest.raises(MalformedEvent, match="not a valid id"):
        parse_event(json.dumps({**EVENT.__dict__, "tenant_id": "a#b"}).encode())
