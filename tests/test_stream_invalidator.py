"""Preference changes made outside the Event API reach the cache through the table's stream."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import redis
from botocore.exceptions import ClientError
from helpers import TenantClient, apns_token, audit_lines

from emulators.aws_proxy.dynamodb_streams import AwsError, StreamStore
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


class StoreClient:
    """The Streams API of the AWS proxy's own store (a fake clock, no server), answering as
    boto3 would: its errors as ClientError."""

    def __init__(self, store: StreamStore) -> None:
        self.store = store

    def _call(self, operation: str, body: dict) -> dict:
        try:
            return json.loads(self.store.call(operation, body))
        except AwsError as error:
            error_body = {"Error": {"Code": error.code, "Message": error.message}}
            raise ClientError(error_body, operation) from None

    def describe_stream(self, **body: object) -> dict:
        return self._call("DescribeStream", body)

    def get_shard_iterator(self, **body: object) -> dict:
        return self._call("GetShardIterator", body)

    def get_records(self, **body: object) -> dict:
        return self._call("GetRecords", body)


class Table:
    def __init__(self, arn: str) -> None:
        self.arn = arn

    def describe_table(self, TableName: str) -> dict:  # noqa: N803 - boto3's parameter name
        spec = {"StreamEnabled": True, "StreamViewType": "KEYS_ONLY"}
        return {"Table": {"LatestStreamArn": self.arn, "StreamSpecification": spec}}


def _poller(**limits: int) -> tuple[StreamPoller, StreamStore, list[str], list[float]]:
    now = [1_800_000_000.0]
    store = StreamStore(lambda: now[0], **limits)
    arn = "arn:aws:dynamodb:us-east-1:000000000000:table/prefs"
    stream = store.enable("prefs", arn, KEYS, "KEYS_ONLY")
    seen: list[str] = []

    def handler(event: dict) -> dict:
        seen.extend(r["dynamodb"]["Keys"]["pk"]["S"] for r in event["Records"])
        return {"batchItemFailures": []}

    poller = StreamPoller(
        Table(stream.arn), StoreClient(store), "prefs", handler, clock=lambda: now[0]
    )
    return poller, store, seen, now


def _change(store: StreamStore, pk: str) -> None:
    key = {"pk": {"S": pk}}
    store.append("prefs", key, "MODIFY", None, None)


KEYS = [{"AttributeName": "pk", "KeyType": "HASH"}]


def test_an_expired_iterator_is_renewed_after_the_last_handled_record():
    poller, store, seen, now = _poller()
    _change(store, "t#a")
    assert poller.poll_once() == 1
    now[0] += 16 * 60  # past an iterator's 15 minutes
    _change(store, "t#b")
    assert poller.poll_once() == 1
    assert seen == ["t#a", "t#b"]  # nothing handled twice, nothing skipped
    assert poller.trimmed_restarts == 0


def test_a_trimmed_position_restarts_at_the_horizon_and_says_so():
    poller, store, seen, _ = _poller(max_records=2)
    _change(store, "t#a")
    assert poller.poll_once() == 1
    for user in "bcde":  # the cap keeps the last two: b and c are gone before they are read
        _change(store, f"t#{user}")
    assert poller.poll_once() == 2
    assert seen == ["t#a", "t#d", "t#e"] and poller.trimmed_restarts == 1


def test_a_stop_ends_a_pass_after_the_batch_in_hand():
    # A SIGTERM during a pass over a long backlog: the process stops after one batch, not 100.
    poller, store, seen, _ = _poller()
    for n in range(150):
        _change(store, f"t#{n}")
    stop = threading.Event()
    handle = poller.handler

    def handle_then_stop(event: dict) -> dict:
        stop.set()
        return handle(event)

    poller.handler = handle_then_stop
    assert poller.poll_once(stop=stop) == 100
    poller.handler = handle
    assert poller.poll_once() == 50 and len(seen) == 150


def test_the_poller_survives_an_error_and_polls_on():
    poller, store, seen, _ = _poller()
    calls = {"n": 0}
    real = poller.streams.get_records

    def flaky(**body: object) -> dict:
        calls["n"] += 1
        if calls["n"] == 1:
            raise ClientError({"Error": {"Code": "InternalServerError", "Message": "x"}}, "GR")
        return real(**body)

    poller.streams.get_records = flaky  # type: ignore[method-assign]
    _change(store, "t#a")
    stop = threading.Event()
    thread = threading.Thread(target=poller.run, args=(stop, 0.01))
    thread.start()
    try:
        wait_until(lambda: seen == ["t#a"], 10, "the record after the error")
    finally:
        stop.set()
        thread.join(10)
    assert calls["n"] >= 2


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
    cache = redis.Redis.from_url(stack.info.redis_url)
    key = preferences_cache_key(t.tenant, user)
    # The registration's own writes are on the stream too: the invalidator may drop the entry
    # the first push cached. Warm again until an entry stays (bounded).
    for _ in range(5):
        warm = t.post(f"author-{user}")
        assert [r["status"] for r in t.wait_rows(warm, 1)] == [200]
        try:
            wait_until(lambda: cache.get(key) is not None, 3, "the push consumer to cache them")
        except TimeoutError:
            continue
        break
    wait_until(lambda: cache.get(key) is not None, 3, "the push consumer to cache the prefs")
    _write_preferences(stack, t.tenant, user, {"zone": "UTC", "push_consent": None})
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


class _Cache:
    """Redis's DELETE and SET, in memory: enough to watch a stale copy come back."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    def delete(self, *keys: str) -> int:
        return sum(self.values.pop(k, None) is not None for k in keys)


def test_a_stale_copy_written_back_after_the_first_delete_goes_with_the_second():
    now = [100.0]
    cache = _Cache()
    invalidator = Invalidator(cache, clock=lambda: now[0])
    key = preferences_cache_key("t", "u")
    cache.values[key] = "old"
    record = {"eventName": "MODIFY", "dynamodb": {"Keys": {"pk": {"S": "t#u"}}}}
    assert invalidator({"Records": [record]}) == {"batchItemFailures": []}
    assert key not in cache.values
    cache.values[key] = "old, read before the change"  # a consumer's late cache fill
    assert invalidator.delete_again() == 0  # not due yet
    now[0] += 1.6
    assert invalidator.delete_again() == 1
    assert key not in cache.values
    assert invalidator.delete_again() == 0  # done once


def _write_preferences(stack, tenant: str, user: str, prefs: dict) -> None:
    """Straight to the preferences table, through the reference's contract."""
    from harness.stack.reference import contract

    contract(stack.info, durable=False).table_writer(tenant, user, prefs)
