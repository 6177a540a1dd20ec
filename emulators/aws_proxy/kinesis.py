"""What the proxy reads of Kinesis traffic (pure): operations, which shard an iterator reads,
and the answer that holds a shard.

Kinesis iterators are opaque (kinesalite's are AES-encrypted, AWS's too), so the proxy learns
the shard of each one from the traffic itself: a GetShardIterator request names the stream and
shard and its answer carries the iterator; every GetRecords answer carries the next iterator of
the same shard. An iterator the proxy has never seen (one obtained before it started, or
straight from upstream) belongs to no known shard and is never held.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections import OrderedDict
from typing import Any

from emulators.aws_proxy.faults import ShardRef

KINESIS_TARGET_PREFIX = "Kinesis_20131202."
# Enough for thousands of consumers: each needs only its latest iterator or two.
DEFAULT_ITERATOR_CAPACITY = 10_000


def operation_of(headers: dict[str, str]) -> str | None:
    """``GetRecords`` from ``X-Amz-Target: Kinesis_20131202.GetRecords`` (any JSON-protocol
    service: the part after the dot); None when the request names no target."""
    target = headers.get("x-amz-target", "")
    if "." not in target:
        return None
    return target.rsplit(".", 1)[1] or None


def is_kinesis(headers: dict[str, str]) -> bool:
    return headers.get("x-amz-target", "").startswith(KINESIS_TARGET_PREFIX)


def stream_name(body: dict[str, Any]) -> str | None:
    """The stream a request names, by ``StreamName`` or by ``StreamARN`` (``.../stream/<name>``)."""
    name = body.get("StreamName")
    if isinstance(name, str) and name:
        return name
    arn = body.get("StreamARN")
    if isinstance(arn, str) and "/" in arn:
        return arn.rsplit("/", 1)[1] or None
    return None


def json_object(body: bytes, content_encoding: str = "") -> dict[str, Any] | None:
    """A JSON object body (decoded from gzip/deflate if need be), or None."""
    encoding = content_encoding.strip().lower()
    try:
        if encoding == "gzip":
            body = gzip.decompress(body)
        elif encoding == "deflate":
            body = zlib.decompress(body)
        elif encoding not in ("", "identity"):
            return None
        value = json.loads(body)
    except (ValueError, OSError, zlib.error):
        return None
    return value if isinstance(value, dict) else None


class IteratorMap:
    """Shard iterator -> the shard it reads; least recently used entries go past capacity."""

    def __init__(self, capacity: int = DEFAULT_ITERATOR_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._map: OrderedDict[str, ShardRef] = OrderedDict()

    def __len__(self) -> int:
        return len(self._map)

    def learn(self, iterator: Any, ref: ShardRef) -> None:
        if not isinstance(iterator, str) or not iterator:
            return  # a closed shard's last answer has no next iterator
        self._map[iterator] = ref
        self._map.move_to_end(iterator)
        while len(self._map) > self.capacity:
            self._map.popitem(last=False)

    def get(self, iterator: Any) -> ShardRef | None:
        if not isinstance(iterator, str):
            return None
        ref = self._map.get(iterator)
        if ref is not None:
            self._map.move_to_end(iterator)
        return ref


def requested_shard(request: dict[str, Any]) -> ShardRef | None:
    """The shard a GetShardIterator request asks for."""
    stream = stream_name(request)
    shard = request.get("ShardId")
    if stream is None or not isinstance(shard, str) or not shard:
        return None
    return ShardRef(stream, shard)


def held_answer(upstream: dict[str, Any], iterator: str) -> tuple[dict[str, Any], int]:
    """The GetRecords answer that holds a shard, built from upstream's own answer: no records,
    the SAME iterator (the consumer asks again from where it was), upstream's
    MillisBehindLatest. Returns it with the number of records it withheld.

    ``ChildShards`` is dropped: upstream sends it only once the reader has reached the end of a
    closed shard, which a reader that is held there has not."""
    records = upstream.get("Records")
    withheld = len(records) if isinstance(records, list) else 0
    answer: dict[str, Any] = {"Records": [], "NextShardIterator": iterator}
    if "MillisBehindLatest" in upstream:
        answer["MillisBehindLatest"] = upstream["MillisBehindLatest"]
    return answer, withheld
