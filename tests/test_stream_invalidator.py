"""Preference changes made outside the Event API reach the cache through the table's stream."""

from __future__ import annotations

import pytest
import redis

from emulators.ports import free_port
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
