"""Preference changes made outside the Event API reach the cache through the table's stream."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis
from helpers import TenantClient, apns_token, audit_lines

from emulators.ports import free_port
from harness.stack.reference_table import write_preferences
from harness.stack.supervisor import AWS_KEYS, wait_until
from reference_impl.aws import client
from reference_impl.config import Config
from reference_impl.ids import preferences_cache_key
from reference_impl.stream_invalidator import Invalidator, StreamPoller, cache_keys


def _record(event: str, pk: str, seq: str = "1") -> dict:
    return {"eventName": event, "dynamodb": {"Keys": {"pk": {"S": pk}}, "SequenceNumber": seq}}


def test_every_change_names_its_cache_entry():
    records = [
        _record("INSERT", "t1#u1"),
        _record("MODIFY", "t2#u2"),
        _record("REMOVE", "t1#u3"),
        {"eventName": "INSERT", "dynamodb": {"Keys": {"pk": {"S": "no-tenant"}}}},
        {"eventName": "UNKNOWN", "dynamodb": {"Keys": {"pk": {"S": "t1#u4"}}}},
    ]
    assert cache_keys(records) == [
        preferences_cache_key("t1", "u1"),
        preferences_cache_key("t2", "u2"),
        preferences_cache_key("t1", "u3"),
    ]


def test_a_redis_error_fails_the_batch_from_its_first_record():
    dead = redis.Redis(host="127.0.0.1", port=free_port(), socket_connect_timeout=0.5)
    result = Invalidator(dead)(
        {"Records": [_record("MODIFY", "t#u", "42"), _record("INSERT", "t#v", "43")]}
    )
    assert result == {"batchItemFailures": [{"itemIdentifier": "42"}]}


@pytest.mark.integration
def test_an_edit_made_elsewhere_drops_the_cached_preferences(stack):
    # dynalite has no streams: the preferences table here lives on moto, which has them.
    config = Config.from_mapping(
        {"dynamodb_endpoint": stack.info.url("aws"), **AWS_KEYS, "table_prefix": "streamed"}
    )
    ddb = client(config, "dynamodb")
    table = config.table("preferences")
    ddb.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
        StreamSpecification={"StreamEnabled": True, "StreamViewType": "KEYS_ONLY"},
    )
    cache = redis.Redis.from_url(stack.info.parts["redis"].url)
    key = preferences_cache_key("ts", "edited")
    other = preferences_cache_key("ts", "untouched")
    cache.set(key, '{"zone": "UTC", "push_consent": {"granted_at": "x", "version": "1"}}')
    cache.set(other, "{}")
    poller = StreamPoller(ddb, client(config, "dynamodbstreams"), table, Invalidator(cache))
    # Consent withdrawn by another service, straight into the table.
    ddb.put_item(TableName=table, Item={"pk": {"S": "ts#edited"}, "prefs": {"S": "{}"}})
    wait_until(lambda: poller.poll_once() >= 0 and cache.get(key) is None, 15, "invalidation")
    assert cache.get(other) == b"{}"


# -- on the embedded stack: dynalite behind the AWS proxy, the invalidator as a worker part ------


@pytest.mark.integration
def test_the_stack_gives_the_preferences_table_a_stream_through_the_proxy(stack):
    info = stack.info
    config = Config.load(info.reference_config)
    assert config.dynamodb_endpoint == info.url("dynamodb-proxy") != info.url("dynamodb")
    proxy = info.parts["dynamodb-proxy"]
    assert proxy.argv[proxy.argv.index("--upstream") + 1] == info.url("dynamodb")
    assert "--dynamodb-streams" in proxy.argv
    ddb = info.aws_client("dynamodb")
    table = ddb.describe_table(TableName=config.table("preferences"))["Table"]
    assert table["StreamSpecification"] == {"StreamEnabled": True, "StreamViewType": "KEYS_ONLY"}
    # Only that table has one: the inbox's writes cost the proxy nothing.
    inbox = ddb.describe_table(TableName=config.table("inbox"))["Table"]
    assert "LatestStreamArn" not in inbox
    streams = info.aws_client("dynamodbstreams").list_streams()["Streams"]
    assert [s["TableName"] for s in streams] == [config.table("preferences")]
    # The invalidator is a worker part: started with the others, ready, its log in the stack's.
    invalidator = info.parts["stream-invalidator"]
    assert invalidator.url is None and stack.procs["stream-invalidator"].poll() is None
    assert "stream-invalidator running" in Path(invalidator.log).read_text()


def _withdraw_consent_directly(stack, t: TenantClient, user: str) -> float:
    """The user gets one push (so the push consumer caches their preferences), then their
    consent is withdrawn by a write straight to the table; returns when (monotonic)."""
    token = apns_token(1, f"{t.tenant}-{user}")
    t.user(user, devices=[("apns", token)])
    t.follow(f"author-{user}", [user])
    warm = t.post(f"author-{user}")
    assert [r["status"] for r in t.wait_rows(warm, 1)] == [200]
    cache = redis.Redis.from_url(stack.info.redis_url)
    key = preferences_cache_key(t.tenant, user)
    wait_until(lambda: cache.get(key) is not None, 10, "the push consumer to cache the prefs")
    write_preferences(stack.info, t.tenant, user, {"zone": "UTC", "push_consent": None})
    return time.monotonic()


def _outcome(stack, notification: str, user: str) -> str:
    """The push consumer's audited outcome for one recipient of one notification."""
    found: list[str] = []

    def audited() -> bool:
        found[:] = [
            r["audit"]
            for r in audit_lines(stack, "push-consumer")
            if r.get("notification_id") == notification and r.get("recipient_user_id") == user
        ]
        return bool(found)

    wait_until(audited, 30, f"the push consumer's outcome for {notification}")
    return found[0]


@pytest.mark.integration
def test_consent_withdrawn_in_the_table_stops_pushes_in_seconds_only_with_the_invalidator(stack):
    """The design's promise: a consent withdrawn by anything but the API (a console edit, a
    backfill) takes effect now, not when the cached copy's 5-minute TTL runs out. A push posted
    3 s after the table write is denied; with the invalidator stopped, the cache answers and the
    same push is delivered."""
    t = TenantClient(stack)
    written = _withdraw_consent_directly(stack, t, "withdrawn")
    time.sleep(max(0.0, written + 3 - time.monotonic()))  # the bound under test: 3 s
    late = t.post("author-withdrawn")
    assert _outcome(stack, late, "withdrawn") == "denied_consent"
    assert t.rows_for(late) == []

    stack.stop_part("stream-invalidator")
    try:
        written = _withdraw_consent_directly(stack, t, "stale")
        time.sleep(max(0.0, written + 3 - time.monotonic()))
        late = t.post("author-stale")
        assert _outcome(stack, late, "stale") == "sent"
        assert [r["status"] for r in t.wait_rows(late, 1)] == [200]
    finally:
        stack.start_part("stream-invalidator")
