"""DynamoDB Streams for dynalite (the AWS proxy's --dynamodb-streams): the store and the
item comparison as pure logic, then boto3's dynamodb and dynamodbstreams clients through the
real proxy process against real dynalite."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import boto3
import httpx
import pytest
from botocore.config import Config as BotoConfig
from botocore.exceptions import ClientError
from helpers import answers_200, start_process

from emulators.aws_proxy.dynamodb import UNKNOWN, change_of, same_item, stream_specification
from emulators.aws_proxy.dynamodb_streams import (
    ITERATOR_LIFETIME_SECONDS,
    AwsError,
    StreamStore,
    sequence_text,
)
from emulators.aws_proxy.dynamodb_ttl import TtlStore
from emulators.ports import free_port
from harness.stack.supervisor import NODE_EMULATOR, Stack, StackError, stop_process
from reference_impl.config import ConfigError
from reference_impl.provision import ensure_ttl, ttl_tables

TABLE_ARN = "arn:aws:dynamodb:us-east-1:000000000000:table/prefs"
KEYS = [{"AttributeName": "pk", "KeyType": "HASH"}]


# -- pure ---------------------------------------------------------------------------------------


def test_items_compare_as_dynamodb_compares_them():
    assert same_item({"n": {"N": "1.50"}}, {"n": {"N": "1.5"}})
    assert same_item({"s": {"SS": ["a", "b"]}}, {"s": {"SS": ["b", "a"]}})
    assert same_item(
        {"m": {"M": {"x": {"NS": ["1", "2.0"]}}}}, {"m": {"M": {"x": {"NS": ["2", "1"]}}}}
    )
    assert not same_item({"n": {"N": "1"}}, {"n": {"S": "1"}})
    assert not same_item(
        {"l": {"L": [{"N": "1"}, {"N": "2"}]}}, {"l": {"L": [{"N": "2"}, {"N": "1"}]}}
    )
    assert not same_item({"a": {"S": "x"}}, {"a": {"S": "x"}, "b": {"S": "y"}})
    assert same_item(None, None) and not same_item(None, {"a": {"S": "x"}})


def test_the_event_follows_the_images_and_a_no_op_has_none():
    item, other = {"pk": {"S": "u"}, "v": {"N": "1"}}, {"pk": {"S": "u"}, "v": {"N": "2"}}
    assert change_of(None, item).event == "INSERT"
    assert change_of(item, other).event == "MODIFY"
    assert change_of(item, None).event == "REMOVE"
    assert change_of(item, {"pk": {"S": "u"}, "v": {"N": "1.0"}}) is None
    assert change_of(None, None) is None  # a delete of nothing
    # An image the proxy could not read is left out, never invented.
    assert change_of(UNKNOWN, other) == type(change_of(item, other))("MODIFY", None, other)
    assert change_of(UNKNOWN, None).event == "REMOVE"
    assert change_of(None, UNKNOWN).event == "INSERT"


def test_a_stream_specification_is_validated_as_dynamodb_does():
    assert stream_specification({"StreamEnabled": True, "StreamViewType": "KEYS_ONLY"}) == (
        True,
        "KEYS_ONLY",
    )
    assert stream_specification({"StreamEnabled": False}) == (False, None)
    for spec, message in [
        ({}, "streamSpecification.streamEnabled"),
        ({"StreamEnabled": True}, "StreamViewType is required"),
        ({"StreamEnabled": True, "StreamViewType": "Fisk"}, "enum value set"),
        ({"StreamEnabled": "yes"}, "must be a boolean"),
    ]:
        with pytest.raises(AwsError) as caught:
            stream_specification(spec)
        assert caught.value.code == "ValidationException" and message in caught.value.message


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def _store(**kwargs: Any) -> tuple[StreamStore, Clock]:
    clock = Clock()
    return StreamStore(clock, **kwargs), clock


def _call(store: StreamStore, operation: str, **body: Any) -> dict[str, Any]:
    return json.loads(store.call(operation, body))


def _iterator(store: StreamStore, stream: Any, kind: str, **extra: Any) -> str:
    return _call(
        store,
        "GetShardIterator",
        StreamArn=stream.arn,
        ShardId=stream.shard_id,
        ShardIteratorType=kind,
        **extra,
    )["ShardIterator"]


def _put(store: StreamStore, user: str, n: int = 1) -> None:
    key = {"pk": {"S": user}}
    store.append("prefs", key, "INSERT", None, {**key, "v": {"N": str(n)}})


def _users(answer: dict[str, Any]) -> list[str]:
    return [r["dynamodb"]["Keys"]["pk"]["S"] for r in answer["Records"]]


def test_iterators_read_from_where_they_say_and_page_by_limit():
    store, clock = _store()
    stream = store.enable("prefs", TABLE_ARN, KEYS, "KEYS_ONLY")
    for user in "abc":
        _put(store, user)
    latest = _iterator(store, stream, "LATEST")
    clock.now += 10
    _put(store, "d")
    page = _call(
        store, "GetRecords", ShardIterator=_iterator(store, stream, "TRIM_HORIZON"), Limit=2
    )
    assert _users(page) == ["a", "b"]
    rest = _call(store, "GetRecords", ShardIterator=page["NextShardIterator"])
    assert _users(rest) == ["c", "d"]
    assert _users(_call(store, "GetRecords", ShardIterator=latest)) == ["d"]
    second = page["Records"][1]["dynamodb"]["SequenceNumber"]
    at = _iterator(store, stream, "AT_SEQUENCE_NUMBER", SequenceNumber=second)
    after = _iterator(store, stream, "AFTER_SEQUENCE_NUMBER", SequenceNumber=second)
    assert _users(_call(store, "GetRecords", ShardIterator=at)) == ["b", "c", "d"]
    assert _users(_call(store, "GetRecords", ShardIterator=after)) == ["c", "d"]
    timed = _iterator(store, stream, "AT_TIMESTAMP", Timestamp=clock.now - 5)
    assert _users(_call(store, "GetRecords", ShardIterator=timed)) == ["d"]
    # Records are KEYS_ONLY: no images; sequence numbers are decimal, 21 digits, increasing.
    record = rest["Records"][0]
    assert set(record["dynamodb"]) == {
        "ApproximateCreationDateTime",
        "Keys",
        "SequenceNumber",
        "SizeBytes",
        "StreamViewType",
    }
    numbers = [r["dynamodb"]["SequenceNumber"] for r in page["Records"] + rest["Records"]]
    assert numbers == sorted(numbers) and all(len(n) == 21 and n.isdecimal() for n in numbers)


def test_an_iterator_expires_after_15_minutes():
    store, clock = _store()
    stream = store.enable("prefs", TABLE_ARN, KEYS, "KEYS_ONLY")
    iterator = _iterator(store, stream, "TRIM_HORIZON")
    clock.now += ITERATOR_LIFETIME_SECONDS + 1
    with pytest.raises(AwsError) as caught:
        store.call("GetRecords", {"ShardIterator": iterator})
    assert caught.value.code == "ExpiredIteratorException"


def test_records_past_the_retention_are_trimmed_and_a_reader_behind_them_is_told():
    store, clock = _store(retention_seconds=600)  # shorter than an iterator's 15 minutes
    stream = store.enable("prefs", TABLE_ARN, KEYS, "KEYS_ONLY")
    _put(store, "old")
    behind = _iterator(store, stream, "TRIM_HORIZON")
    first = sequence_text(stream.start_seq)
    clock.now += 500
    _put(store, "new")
    clock.now += 200  # "old" is now 700 s old, "new" 200 s
    with pytest.raises(AwsError) as caught:
        store.call("GetRecords", {"ShardIterator": behind})
    assert caught.value.code == "TrimmedDataAccessException"
    with pytest.raises(AwsError) as caught:
        _iterator(store, stream, "AT_SEQUENCE_NUMBER", SequenceNumber=first)
    assert caught.value.code == "TrimmedDataAccessException"
    fresh = _call(store, "GetRecords", ShardIterator=_iterator(store, stream, "TRIM_HORIZON"))
    assert _users(fresh) == ["new"]
    assert store.counts()["trimmed"] == 1 and store.counts()["trimmed_early"] == 0


def test_the_record_cap_trims_early_and_says_so():
    store, _ = _store(max_records=3)
    stream = store.enable("prefs", TABLE_ARN, KEYS, "KEYS_ONLY")
    behind = _iterator(store, stream, "TRIM_HORIZON")
    for user in "abcde":
        _put(store, user)
    assert stream.kept() == 3 and store.counts()["trimmed_early"] == 2
    with pytest.raises(AwsError) as caught:
        store.call("GetRecords", {"ShardIterator": behind})
    assert caught.value.code == "TrimmedDataAccessException"
    horizon = _call(store, "GetRecords", ShardIterator=_iterator(store, stream, "TRIM_HORIZON"))
    assert _users(horizon) == ["c", "d", "e"]


def test_a_disabled_stream_stays_readable_then_is_forgotten():
    store, clock = _store(retention_seconds=3600)
    stream = store.enable("prefs", TABLE_ARN, KEYS, "KEYS_ONLY")
    _put(store, "a")
    store.disable("prefs")
    _put(store, "b")  # no enabled stream: not recorded
    described = _call(store, "DescribeStream", StreamArn=stream.arn)["StreamDescription"]
    assert described["StreamStatus"] == "DISABLED"
    assert described["Shards"][0]["SequenceNumberRange"]["EndingSequenceNumber"].isdecimal()
    answer = _call(store, "GetRecords", ShardIterator=_iterator(store, stream, "TRIM_HORIZON"))
    assert _users(answer) == ["a"] and "NextShardIterator" not in answer  # closed, read to its end
    again = store.enable("prefs", TABLE_ARN, KEYS, "NEW_IMAGE")
    assert again.arn != stream.arn
    assert [s["StreamArn"] for s in _call(store, "ListStreams")["Streams"]] == [
        stream.arn,
        again.arn,
    ]
    clock.now += 3601
    assert [s["StreamArn"] for s in _call(store, "ListStreams")["Streams"]] == [again.arn]


def test_streams_api_errors_have_awss_codes():
    store, _ = _store()
    stream = store.enable("prefs", TABLE_ARN, KEYS, "KEYS_ONLY")
    unknown = f"{TABLE_ARN}/stream/2020-01-01T00:00:00.000"
    for operation, body, code, message in [
        ("DescribeStream", {"StreamArn": "nonsense"}, "ValidationException", "Invalid StreamArn"),
        ("DescribeStream", {"StreamArn": unknown}, "ResourceNotFoundException", "not found"),
        ("DescribeStream", {}, "ValidationException", "Value null at 'streamArn'"),
        (
            "GetShardIterator",
            {"StreamArn": stream.arn, "ShardId": "shardId-x" * 4, "ShardIteratorType": "LATEST"},
            "ResourceNotFoundException",
            "does not exist",
        ),
        (
            "GetShardIterator",
            {"StreamArn": stream.arn, "ShardId": stream.shard_id, "ShardIteratorType": "bulle"},
            "ValidationException",
            "enum value set",
        ),
        (
            "GetShardIterator",
            {
                "StreamArn": stream.arn,
                "ShardId": stream.shard_id,
                "ShardIteratorType": "AT_SEQUENCE_NUMBER",
            },
            "ValidationException",
            "SequenceNumber is required",
        ),
        (
            "GetShardIterator",
            {
                "StreamArn": stream.arn,
                "ShardId": stream.shard_id,
                "ShardIteratorType": "LATEST",
                "SequenceNumber": sequence_text(1),
            },
            "ValidationException",
            "must not be given",
        ),
        ("GetRecords", {"ShardIterator": "sdfsdfsgagaddafg"}, "ValidationException", "Invalid"),
        ("ListStreams", {"Limit": 0}, "ValidationException", "greater than or equal to 1"),
        ("ListStreams", {"Limit": 101}, "ValidationException", "less than or equal to 100"),
    ]:
        with pytest.raises(AwsError) as caught:
            store.call(operation, body)
        assert (caught.value.code, operation) == (code, operation)
        assert message in caught.value.message, (operation, caught.value.message)
    iterator = _iterator(store, stream, "LATEST")
    with pytest.raises(AwsError) as caught:
        store.call("GetRecords", {"ShardIterator": iterator, "Limit": 1001})
    assert "less than or equal to 1000" in caught.value.message


# -- boto3 through the real proxy, real dynalite ------------------------------------------------


def _clients(url: str) -> tuple[Any, Any]:
    kwargs = {
        "endpoint_url": url,
        "region_name": "us-east-1",
        "aws_access_key_id": "testing",
        "aws_secret_access_key": "testing",
        "config": BotoConfig(retries={"max_attempts": 1}),
    }
    return boto3.client("dynamodb", **kwargs), boto3.client("dynamodbstreams", **kwargs)


@pytest.fixture(scope="module")
def dynalite() -> Iterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    ddb, _ = _clients(url)

    def ready() -> bool:
        try:
            ddb.list_tables()
            return True
        except Exception:
            return False

    argv = [shutil.which("node") or "node", str(NODE_EMULATOR), "dynalite", "--port", str(port)]
    proc = start_process(argv, ready, "dynalite to answer")
    try:
        yield url
    finally:
        stop_process(proc)


@pytest.fixture(scope="module")
def proxy(dynalite) -> Iterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [
        sys.executable, "-m", "emulators.aws_proxy", "--upstream", dynalite,
        "--port", str(port), "--dynamodb-streams",
    ]  # fmt: skip
    proc = start_process(argv, lambda: answers_200(f"{url}/_proxy/health"), "the proxy")
    try:
        yield url
    finally:
        stop_process(proc)


@pytest.fixture
def clients(proxy) -> tuple[Any, Any]:
    return _clients(proxy)


def _table(ddb: Any, view: str | None, sort_key: bool = False) -> tuple[str, str | None]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    keys = [{"AttributeName": "pk", "KeyType": "HASH"}]
    attributes = [{"AttributeName": "pk", "AttributeType": "S"}]
    if sort_key:
        keys.append({"AttributeName": "sk", "KeyType": "RANGE"})
        attributes.append({"AttributeName": "sk", "AttributeType": "S"})
    extra = {}
    if view is not None:
        extra["StreamSpecification"] = {"StreamEnabled": True, "StreamViewType": view}
    created = ddb.create_table(
        TableName=name,
        KeySchema=keys,
        AttributeDefinitions=attributes,
        BillingMode="PAY_PER_REQUEST",
        **extra,
    )["TableDescription"]
    return name, created.get("LatestStreamArn")


def _shard(streams: Any, arn: str) -> str:
    return streams.describe_stream(StreamArn=arn)["StreamDescription"]["Shards"][0]["ShardId"]


def _read_all(streams: Any, arn: str, kind: str = "TRIM_HORIZON", **extra: Any) -> list[dict]:
    iterator = streams.get_shard_iterator(
        StreamArn=arn, ShardId=_shard(streams, arn), ShardIteratorType=kind, **extra
    )["ShardIterator"]
    records: list[dict] = []
    for _ in range(100):
        answer = streams.get_records(ShardIterator=iterator, Limit=2)
        records += answer["Records"]
        iterator = answer.get("NextShardIterator")
        if not answer["Records"] or iterator is None:
            return records
    raise AssertionError("a stream of a few records did not end in 100 pages")


def _events(records: list[dict]) -> list[tuple[str, str, Any, Any]]:
    def plain(image: dict | None) -> Any:
        if image is None:
            return None
        return {k: next(iter(v.values())) for k, v in sorted(image.items())}

    return [
        (
            r["eventName"],
            r["dynamodb"]["Keys"]["pk"]["S"],
            plain(r["dynamodb"].get("OldImage")),
            plain(r["dynamodb"].get("NewImage")),
        )
        for r in records
    ]


@pytest.mark.integration
def test_every_write_kind_is_recorded_with_the_images_it_made(clients):
    ddb, streams = clients
    table, arn = _table(ddb, "NEW_AND_OLD_IMAGES")
    assert arn and arn.startswith("arn:aws:dynamodb:us-east-1:") and "/stream/" in arn
    described = ddb.describe_table(TableName=table)["Table"]
    assert described["StreamSpecification"] == {
        "StreamEnabled": True,
        "StreamViewType": "NEW_AND_OLD_IMAGES",
    }
    assert described["LatestStreamArn"] == arn and arn.endswith(described["LatestStreamLabel"])

    ddb.put_item(TableName=table, Item={"pk": {"S": "a"}, "v": {"N": "1.50"}})  # INSERT
    ddb.put_item(TableName=table, Item={"pk": {"S": "a"}, "v": {"N": "1.5"}})  # same: nothing
    old = ddb.put_item(  # MODIFY; the client's ReturnValues still answered
        TableName=table, Item={"pk": {"S": "a"}, "w": {"S": "x"}}, ReturnValues="ALL_OLD"
    )["Attributes"]
    assert old == {"pk": {"S": "a"}, "v": {"N": "1.5"}}
    ddb.update_item(  # INSERT through UpdateItem
        TableName=table,
        Key={"pk": {"S": "b"}},
        UpdateExpression="SET c = :c",
        ExpressionAttributeValues={":c": {"N": "1"}},
    )
    updated = ddb.update_item(  # MODIFY, the client's UPDATED_NEW answer untouched
        TableName=table,
        Key={"pk": {"S": "b"}},
        UpdateExpression="ADD c :one",
        ExpressionAttributeValues={":one": {"N": "1"}},
        ReturnValues="UPDATED_NEW",
    )["Attributes"]
    assert updated == {"c": {"N": "2"}}
    ddb.delete_item(TableName=table, Key={"pk": {"S": "a"}})  # REMOVE
    ddb.delete_item(TableName=table, Key={"pk": {"S": "a"}})  # nothing to delete: nothing
    with pytest.raises(ClientError) as refused:  # a failed conditional write: nothing
        ddb.put_item(
            TableName=table,
            Item={"pk": {"S": "b"}},
            ConditionExpression="attribute_not_exists(pk)",
        )
    assert refused.value.response["Error"]["Code"] == "ConditionalCheckFailedException"
    ddb.batch_write_item(
        RequestItems={
            table: [
                {"PutRequest": {"Item": {"pk": {"S": "c"}, "v": {"S": "new"}}}},  # INSERT
                {"DeleteRequest": {"Key": {"pk": {"S": "b"}}}},  # REMOVE
                {"DeleteRequest": {"Key": {"pk": {"S": "zz"}}}},  # nothing
            ]
        }
    )
    assert _events(_read_all(streams, arn)) == [
        ("INSERT", "a", None, {"pk": "a", "v": "1.5"}),
        ("MODIFY", "a", {"pk": "a", "v": "1.5"}, {"pk": "a", "w": "x"}),
        ("INSERT", "b", None, {"c": "1", "pk": "b"}),
        ("MODIFY", "b", {"c": "1", "pk": "b"}, {"c": "2", "pk": "b"}),
        ("REMOVE", "a", {"pk": "a", "w": "x"}, None),
        ("INSERT", "c", None, {"pk": "c", "v": "new"}),
        ("REMOVE", "b", {"c": "2", "pk": "b"}, None),
    ]
    record = _read_all(streams, arn)[0]
    assert record["eventSource"] == "aws:dynamodb" and record["awsRegion"] == "us-east-1"
    assert record["eventVersion"] == "1.1" and len(record["eventID"]) == 32
    assert isinstance(record["dynamodb"]["ApproximateCreationDateTime"], datetime)
    assert record["dynamodb"]["StreamViewType"] == "NEW_AND_OLD_IMAGES"


@pytest.mark.integration
def test_keys_only_records_carry_keys_and_no_images(clients):
    ddb, streams = clients
    table, arn = _table(ddb, "KEYS_ONLY", sort_key=True)
    key = {"pk": {"S": "u"}, "sk": {"S": "1"}}
    other = {"pk": {"S": "u"}, "sk": {"S": "2"}}
    # The stream's first writes come in a batch (an empty stream is a stream all the same).
    ddb.batch_write_item(
        RequestItems={
            table: [{"PutRequest": {"Item": {**k, "v": {"S": "x"}}}} for k in (key, other)]
        }
    )
    ddb.update_item(
        TableName=table,
        Key=key,
        UpdateExpression="SET v = :v",
        ExpressionAttributeValues={":v": {"S": "y"}},
    )
    records = _read_all(streams, arn)
    assert [r["eventName"] for r in records] == ["INSERT", "INSERT", "MODIFY"]
    assert [r["dynamodb"]["Keys"] for r in records] == [key, other, key]
    assert all("NewImage" not in r["dynamodb"] and "OldImage" not in r["dynamodb"] for r in records)


@pytest.mark.integration
def test_iterator_types_and_paging_through_boto3(clients):
    ddb, streams = clients
    table, arn = _table(ddb, "KEYS_ONLY")
    for user in "abc":
        ddb.put_item(TableName=table, Item={"pk": {"S": user}})
    shard = _shard(streams, arn)
    latest = streams.get_shard_iterator(StreamArn=arn, ShardId=shard, ShardIteratorType="LATEST")
    assert streams.get_records(ShardIterator=latest["ShardIterator"])["Records"] == []
    ddb.put_item(TableName=table, Item={"pk": {"S": "d"}})
    after_latest = streams.get_records(ShardIterator=latest["ShardIterator"])["Records"]
    assert [r["dynamodb"]["Keys"]["pk"]["S"] for r in after_latest] == ["d"]
    everything = _read_all(streams, arn)  # two records a page
    assert [r["dynamodb"]["Keys"]["pk"]["S"] for r in everything] == ["a", "b", "c", "d"]
    second = everything[1]["dynamodb"]["SequenceNumber"]
    at = _read_all(streams, arn, "AT_SEQUENCE_NUMBER", SequenceNumber=second)
    after = _read_all(streams, arn, "AFTER_SEQUENCE_NUMBER", SequenceNumber=second)
    assert [r["dynamodb"]["SequenceNumber"] for r in at] == [
        r["dynamodb"]["SequenceNumber"] for r in everything[1:]
    ]
    assert [r["dynamodb"]["Keys"]["pk"]["S"] for r in after] == ["c", "d"]
    assert int(everything[0]["dynamodb"]["SequenceNumber"]) < int(second)
    page = streams.get_records(
        ShardIterator=streams.get_shard_iterator(
            StreamArn=arn, ShardId=shard, ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"],
        Limit=3,
    )
    assert len(page["Records"]) == 3 and page["NextShardIterator"]
    # ListStreams pages one stream at a time and lists this table's stream exactly once.
    listed: list[str] = []
    page_args: dict[str, Any] = {}
    for _ in range(200):
        answer = streams.list_streams(Limit=1, **page_args)
        assert len(answer["Streams"]) <= 1
        listed += [s["StreamArn"] for s in answer["Streams"]]
        if "LastEvaluatedStreamArn" not in answer:
            break
        page_args = {"ExclusiveStartStreamArn": answer["LastEvaluatedStreamArn"]}
    else:
        raise AssertionError("ListStreams did not end in 200 pages")
    assert listed.count(arn) == 1 and len(listed) == len(set(listed)) > 1


@pytest.mark.integration
def test_a_table_without_a_stream_has_none(clients, proxy):
    ddb, streams = clients
    table, arn = _table(ddb, None)
    assert arn is None
    described = ddb.describe_table(TableName=table)["Table"]
    assert "LatestStreamArn" not in described and "StreamSpecification" not in described
    before = httpx.get(f"{proxy}/_proxy/health").json()["dynamodb_streams"]
    ddb.put_item(TableName=table, Item={"pk": {"S": "a"}})
    ddb.delete_item(TableName=table, Key={"pk": {"S": "a"}})
    after = httpx.get(f"{proxy}/_proxy/health").json()["dynamodb_streams"]
    assert streams.list_streams(TableName=table)["Streams"] == []
    assert after["recorded"] == before["recorded"]
    assert after["image_reads"] == before["image_reads"]  # not one read of the proxy's own


@pytest.mark.integration
def test_update_table_turns_a_stream_on_and_off_as_dynamodb_does(clients):
    ddb, streams = clients
    table, _ = _table(ddb, None)
    with pytest.raises(ClientError) as caught:
        ddb.update_table(TableName=table, StreamSpecification={"StreamEnabled": False})
    assert caught.value.response["Error"]["Code"] == "ValidationException"
    enabled = ddb.update_table(
        TableName=table,
        StreamSpecification={"StreamEnabled": True, "StreamViewType": "NEW_IMAGE"},
    )["TableDescription"]
    arn = enabled["LatestStreamArn"]
    assert enabled["StreamSpecification"]["StreamViewType"] == "NEW_IMAGE"
    with pytest.raises(ClientError) as caught:
        ddb.update_table(
            TableName=table,
            StreamSpecification={"StreamEnabled": True, "StreamViewType": "KEYS_ONLY"},
        )
    assert caught.value.response["Error"]["Code"] == "ValidationException"
    assert "already has an enabled stream" in caught.value.response["Error"]["Message"]
    ddb.put_item(TableName=table, Item={"pk": {"S": "a"}})
    off = ddb.update_table(TableName=table, StreamSpecification={"StreamEnabled": False})
    assert "StreamSpecification" not in off["TableDescription"]
    assert off["TableDescription"]["LatestStreamArn"] == arn
    ddb.put_item(TableName=table, Item={"pk": {"S": "b"}})  # not recorded: the stream is off
    described = streams.describe_stream(StreamArn=arn)["StreamDescription"]
    assert described["StreamStatus"] == "DISABLED"
    assert "EndingSequenceNumber" in described["Shards"][0]["SequenceNumberRange"]
    assert [r["dynamodb"]["Keys"]["pk"]["S"] for r in _read_all(streams, arn)] == ["a"]
    # A stream made again is a new stream; the old one is still listed (readable for 24 h).
    again = ddb.update_table(
        TableName=table,
        StreamSpecification={"StreamEnabled": True, "StreamViewType": "KEYS_ONLY"},
        BillingMode="PAY_PER_REQUEST",  # a change upstream makes, alongside the stream's
    )["TableDescription"]["LatestStreamArn"]
    assert again != arn
    listed = [s["StreamArn"] for s in streams.list_streams(TableName=table)["Streams"]]
    assert listed == [arn, again]


@pytest.mark.integration
def test_errors_reach_boto3_by_name(clients):
    ddb, streams = clients
    missing = f"t-missing-{uuid.uuid4().hex[:6]}"
    with pytest.raises(ClientError) as caught:
        ddb.update_table(
            TableName=missing,
            StreamSpecification={"StreamEnabled": True, "StreamViewType": "KEYS_ONLY"},
        )
    assert caught.value.response["Error"]["Code"] == "ResourceNotFoundException"
    with pytest.raises(ClientError) as caught:
        ddb.create_table(
            TableName=f"t-{uuid.uuid4().hex[:10]}",
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
            StreamSpecification={"StreamEnabled": True, "StreamViewType": "Fisk"},
        )
    assert caught.value.response["Error"]["Code"] == "ValidationException"
    unknown = "arn:aws:dynamodb:us-east-1:000000000000:table/none/stream/2020-01-01T00:00:00.000"
    with pytest.raises(ClientError) as caught:
        streams.describe_stream(StreamArn=unknown)
    assert caught.value.response["Error"]["Code"] == "ResourceNotFoundException"
    table, arn = _table(ddb, "KEYS_ONLY")
    iterator = streams.get_shard_iterator(
        StreamArn=arn, ShardId=_shard(streams, arn), ShardIteratorType="LATEST"
    )["ShardIterator"]
    with pytest.raises(ClientError) as caught:
        streams.get_records(ShardIterator=iterator, Limit=1001)
    assert caught.value.response["Error"]["Code"] == "ValidationException"
    with pytest.raises(ClientError) as caught:
        streams.get_records(ShardIterator="x" * 40)
    assert caught.value.response["Error"]["Code"] == "ValidationException"


@pytest.mark.integration
def test_concurrent_writers_to_one_item_leave_a_chain_of_images(clients, proxy):
    """Eight threads add to one counter 25 times each: 200 MODIFY records whose images chain
    (each OldImage is the previous NewImage), which only a per-item lock around read, write and
    read-back gives."""
    ddb, streams = clients
    table, arn = _table(ddb, "NEW_AND_OLD_IMAGES")
    ddb.put_item(TableName=table, Item={"pk": {"S": "n"}, "c": {"N": "0"}})
    errors: list[BaseException] = []

    def add() -> None:
        own, _ = _clients(proxy)
        try:
            for _ in range(25):
                own.update_item(
                    TableName=table,
                    Key={"pk": {"S": "n"}},
                    UpdateExpression="ADD c :one",
                    ExpressionAttributeValues={":one": {"N": "1"}},
                )
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=add) for _ in range(8)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors and time.monotonic() - started < 120
    records = []
    iterator = streams.get_shard_iterator(
        StreamArn=arn, ShardId=_shard(streams, arn), ShardIteratorType="TRIM_HORIZON"
    )["ShardIterator"]
    for _ in range(10):
        answer = streams.get_records(ShardIterator=iterator)
        records += answer["Records"]
        iterator = answer["NextShardIterator"]
        if not answer["Records"]:
            break
    counts = [
        (
            int(r["dynamodb"]["OldImage"]["c"]["N"]) if "OldImage" in r["dynamodb"] else None,
            int(r["dynamodb"]["NewImage"]["c"]["N"]),
        )
        for r in records
    ]
    assert counts == [(None, 0)] + [(n, n + 1) for n in range(200)]


def test_ttl_status_changes_as_dynamodbs_does():
    store = TtlStore()
    assert store.describe("t") == {"TimeToLiveDescription": {"TimeToLiveStatus": "DISABLED"}}
    on = {"Enabled": True, "AttributeName": "expires_at"}
    assert store.update("t", on) == {"TimeToLiveSpecification": on}
    assert store.describe("t")["TimeToLiveDescription"] == {
        "TimeToLiveStatus": "ENABLED",
        "AttributeName": "expires_at",
    }
    for spec, message in [
        (on, "TimeToLive is already enabled"),
        ({"Enabled": True, "AttributeName": "other"}, "TimeToLive is already enabled"),
        ({"Enabled": False, "AttributeName": "other"}, "current AttributeName is expires_at"),
        ({"Enabled": True}, "'timeToLiveSpecification.attributeName'"),
        ({"AttributeName": "x"}, "'timeToLiveSpecification.enabled'"),
        ({"Enabled": True, "AttributeName": ""}, "length greater than or equal to 1"),
        ({"Enabled": True, "AttributeName": "x" * 256}, "length less than or equal to 255"),
        ({"Enabled": "yes", "AttributeName": "x"}, "must be a boolean"),
        (None, "Value null at 'timeToLiveSpecification'"),
    ]:
        with pytest.raises(AwsError, match=message) as caught:
            store.update("t", spec)
        assert caught.value.code == "ValidationException"
    assert store.describe("t")["TimeToLiveDescription"]["AttributeName"] == "expires_at"
    store.update("t", {"Enabled": False, "AttributeName": "expires_at"})
    with pytest.raises(AwsError, match="TimeToLive is already disabled"):
        store.update("t", {"Enabled": False, "AttributeName": "expires_at"})
    store.update("t", on)
    store.table_deleted("t")
    assert store.describe("t")["TimeToLiveDescription"]["TimeToLiveStatus"] == "DISABLED"


def test_ttl_through_the_proxy_with_boto3(clients):
    ddb, _ = clients
    table, _ = _table(ddb, None)
    assert ddb.describe_time_to_live(TableName=table)["TimeToLiveDescription"] == {
        "TimeToLiveStatus": "DISABLED"
    }
    on = {"Enabled": True, "AttributeName": "expires_at"}
    answer = ddb.update_time_to_live(TableName=table, TimeToLiveSpecification=on)
    assert answer["TimeToLiveSpecification"] == on
    assert ddb.describe_time_to_live(TableName=table)["TimeToLiveDescription"] == {
        "TimeToLiveStatus": "ENABLED",
        "AttributeName": "expires_at",
    }
    with pytest.raises(ClientError) as caught:
        ddb.update_time_to_live(TableName=table, TimeToLiveSpecification=on)
    error = caught.value.response["Error"]
    assert (error["Code"], error["Message"]) == (
        "ValidationException",
        "TimeToLive is already enabled",
    )
    # Another table's status is its own.
    other, _ = _table(ddb, None)
    assert ddb.describe_time_to_live(TableName=other)["TimeToLiveDescription"] == {
        "TimeToLiveStatus": "DISABLED"
    }
    ddb.update_time_to_live(
        TableName=table, TimeToLiveSpecification={"Enabled": False, "AttributeName": "expires_at"}
    )
    with pytest.raises(ClientError) as caught:
        ddb.update_time_to_live(
            TableName=table,
            TimeToLiveSpecification={"Enabled": False, "AttributeName": "expires_at"},
        )
    assert caught.value.response["Error"]["Message"] == "TimeToLive is already disabled"
    # Unknown tables are upstream's ResourceNotFoundException, for both calls.
    missing = f"t-missing-{uuid.uuid4().hex[:6]}"
    for call in (
        lambda: ddb.describe_time_to_live(TableName=missing),
        lambda: ddb.update_time_to_live(TableName=missing, TimeToLiveSpecification=on),
    ):
        with pytest.raises(ClientError) as caught:
            call()
        assert caught.value.response["Error"]["Code"] == "ResourceNotFoundException"
    # A missing member, past boto3's own validation, is the endpoint's ValidationException.
    unchecked = boto3.client(
        "dynamodb",
        endpoint_url=ddb.meta.endpoint_url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=BotoConfig(retries={"max_attempts": 1}, parameter_validation=False),
    )
    with pytest.raises(ClientError) as caught:
        unchecked.update_time_to_live(TableName=table, TimeToLiveSpecification={"Enabled": True})
    assert caught.value.response["Error"]["Code"] == "ValidationException"
    assert "timeToLiveSpecification.attributeName" in caught.value.response["Error"]["Message"]
    # A deleted table's TTL goes with it: made again, it starts disabled.
    ddb.update_time_to_live(TableName=table, TimeToLiveSpecification=on)
    ddb.delete_table(TableName=table)
    # dynalite deletes in the background (DELETING, then gone): a CreateTable before that is a
    # ResourceInUseException, as on AWS.
    ddb.get_waiter("table_not_exists").wait(
        TableName=table, WaiterConfig={"Delay": 1, "MaxAttempts": 30}
    )
    ddb.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    assert ddb.describe_time_to_live(TableName=table)["TimeToLiveDescription"] == {
        "TimeToLiveStatus": "DISABLED"
    }


def test_provisioning_enables_ttl_once_and_says_when_it_cannot(clients, dynalite, capsys):
    ddb, _ = clients
    assert "inbox" in ttl_tables(()) and "dedup_fallback" in ttl_tables(())
    assert "inbox" not in ttl_tables(("inbox_ttl_not_enabled",))
    assert "dedup_fallback" in ttl_tables(("inbox_ttl_not_enabled",))
    table, _ = _table(ddb, None)
    assert ensure_ttl(ddb, table, "expires_at")
    assert ensure_ttl(ddb, table, "expires_at")  # already enabled on it: fine, nothing done
    assert ddb.describe_time_to_live(TableName=table)["TimeToLiveDescription"] == {
        "TimeToLiveStatus": "ENABLED",
        "AttributeName": "expires_at",
    }
    with pytest.raises(ConfigError, match="has TTL on 'expires_at', not 'ttl'"):
        ensure_ttl(ddb, table, "ttl")
    # Straight to dynalite (no TTL API): said, not raised; the table's TTL stays off.
    direct, _ = _clients(dynalite)
    plain, _ = _table(direct, None)
    assert not ensure_ttl(direct, plain, "expires_at")
    assert "has no UpdateTimeToLive" in capsys.readouterr().err


def test_the_dynamodb_proxy_part_names_its_missing_upstream(tmp_path):
    with pytest.raises(StackError, match="dynamodb-proxy needs an upstream: the dynamodb part"):
        Stack(tmp_path, parts=["dynamodb-proxy"]).up()


@pytest.mark.integration
def test_an_image_read_the_upstream_fails_once_is_read_again(dynalite):
    """The proxy's own reads for a record's images are idempotent: one that upstream answers
    with a 5xx (a keep-alive connection closed under it comes back as a 502) is tried again,
    so the record keeps its event name (INSERT, not the MODIFY of an unknown old image)."""
    from emulators.aws_proxy.server import AwsProxy
    from emulators.http_server import Request, Response

    proxy = AwsProxy(dynalite, streams=StreamStore(time.time))
    assert proxy.capture is not None
    forward = proxy.capture.send
    failed: list[str] = []

    async def first_read_fails(request: Request) -> Response:
        target = request.headers.get("x-amz-target", "")
        if target.endswith(".BatchGetItem") and not failed:
            failed.append(target)
            return Response(502, {"content-type": "application/json"}, b"{}")
        return await forward(request)

    proxy.capture.send = first_read_fails

    def call(operation: str, body: dict) -> dict:
        request = Request(
            method="POST",
            path="/",
            headers={
                "x-amz-target": f"DynamoDB_20120810.{operation}",
                "content-type": "application/x-amz-json-1.0",
                "host": dynalite.removeprefix("http://"),
                # dynalite asks for a signature's presence, not its worth
                "x-amz-date": "20260101T000000Z",
                "authorization": "AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/"
                "dynamodb/aws4_request, SignedHeaders=host;x-amz-date, Signature=00",
            },
            body=json.dumps(body).encode(),
            http_version="1.1",
        )
        request.raw_headers = list(request.headers.items())
        answer = asyncio.run_coroutine_threadsafe(proxy.handle(request), loop).result(30)
        assert answer.status == 200, answer.body
        return json.loads(answer.body or b"{}")

    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    try:
        table = f"t-{uuid.uuid4().hex[:10]}"
        created = call(
            "CreateTable",
            {
                "TableName": table,
                "KeySchema": KEYS,
                "AttributeDefinitions": [{"AttributeName": "pk", "AttributeType": "S"}],
                "BillingMode": "PAY_PER_REQUEST",
                "StreamSpecification": {"StreamEnabled": True, "StreamViewType": "KEYS_ONLY"},
            },
        )
        items = [{"pk": {"S": k}} for k in ("a", "b")]
        call(
            "BatchWriteItem",
            {"RequestItems": {table: [{"PutRequest": {"Item": i}} for i in items]}},
        )
        arn = created["TableDescription"]["LatestStreamArn"]

        def stream(operation: str, body: dict) -> dict:
            return json.loads(proxy.capture.store.call(operation, body))

        shards = stream("DescribeStream", {"StreamArn": arn})["StreamDescription"]["Shards"]
        iterator = stream(
            "GetShardIterator",
            {
                "StreamArn": arn,
                "ShardId": shards[0]["ShardId"],
                "ShardIteratorType": "TRIM_HORIZON",
            },
        )["ShardIterator"]
        records = stream("GetRecords", {"ShardIterator": iterator})["Records"]
    finally:
        if proxy._session is not None:
            asyncio.run_coroutine_threadsafe(proxy._session.close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        runner.join(10)
    assert failed, "the read the test fails was never made"
    assert [r["eventName"] for r in records] == ["INSERT", "INSERT"]
    assert proxy.capture.health()["capture_errors"] == 0
