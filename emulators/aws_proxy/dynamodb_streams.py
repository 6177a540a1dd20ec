"""DynamoDB Streams, kept in memory (pure, no I/O): the streams of tables, their records, shard
iterators, trimming, and the four operations of the Streams API (``DynamoDBStreams_20120810``).

What it models of AWS (the Streams API reference and what real DynamoDB does, as DynamoDB-
compatible servers' tests against it record):

* one stream per enabling of a table's stream, ARN ``<table ARN>/stream/<label>``, label the
  ISO 8601 time of the enabling; a disabled stream stays readable (status ``DISABLED``, its
  shard closed with an ``EndingSequenceNumber``) for the retention period, then is forgotten;
* one shard per stream (AWS splits shards every few hours; a reader that follows
  ``DescribeStream`` handles one shard as well as many), never split;
* records carry ``eventID``, ``eventName`` (INSERT/MODIFY/REMOVE), ``eventVersion`` 1.1,
  ``eventSource`` aws:dynamodb, ``awsRegion`` and ``dynamodb`` with
  ``ApproximateCreationDateTime`` (epoch seconds, rounded down), ``Keys``, the images the
  ``StreamViewType`` asks for, ``SequenceNumber`` (decimal digits, 21 of them, increasing) and
  ``SizeBytes``; a write that changes nothing writes no record (the caller decides that);
* shard iterators expire after 15 minutes (``ExpiredIteratorException``); an iterator whose
  position has been trimmed gets ``TrimmedDataAccessException``; GetRecords answers at most
  1,000 records and about 1 MB, and no ``NextShardIterator`` once a closed shard is read to
  its end.

Memory is bounded: records older than the retention (24 h, as AWS) are trimmed, and so are the
oldest records of a stream past ``max_records`` or ``max_bytes``. That second trim is earlier
than AWS would trim, so it is counted (``trimmed_early``) and a reader that was behind it is
told (``TrimmedDataAccessException``), never silently skipped.

Records are kept as their JSON text: a GetRecords answer is spliced from them, not
re-serialised, and a KEYS_ONLY record costs a few hundred bytes.
"""

from __future__ import annotations

import base64
import bisect
import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

VIEW_TYPES = ("KEYS_ONLY", "NEW_IMAGE", "OLD_IMAGE", "NEW_AND_OLD_IMAGES")
ITERATOR_TYPES = (
    "TRIM_HORIZON",
    "LATEST",
    "AT_SEQUENCE_NUMBER",
    "AFTER_SEQUENCE_NUMBER",
    "AT_TIMESTAMP",
)
RETENTION_SECONDS = 24 * 3600
ITERATOR_LIFETIME_SECONDS = 15 * 60
GET_RECORDS_MAX = 1000
GET_RECORDS_MAX_BYTES = 1 << 20
LIST_MAX = 100
DEFAULT_MAX_RECORDS = 100_000
DEFAULT_MAX_BYTES = 64 << 20
SEQUENCE_DIGITS = 21
STREAM_ARN = re.compile(
    r"^arn:aws[a-z-]*:dynamodb:[a-z0-9-]+:\d{12}:table/[a-zA-Z0-9_.-]{3,255}/stream/\S+$"
)
# Compact separators: the records are stored and answered as this text.
_DUMPS = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


class AwsError(Exception):
    """An error answer in AWS's JSON shape: ``code`` is the ``__type`` a client reports."""

    def __init__(self, code: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status


def validation(message: str) -> AwsError:
    return AwsError("ValidationException", message)


def _null(member: str) -> AwsError:
    return validation(
        f"1 validation error detected: Value null at '{member}' failed to satisfy constraint: "
        "Member must not be null"
    )


def _limit(body: dict[str, Any], maximum: int, default: int) -> int:
    value = body.get("Limit")
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise validation(f"Limit must be an integer from 1 to {maximum}, not {value!r}")
    bound = "greater than or equal to 1" if value < 1 else f"less than or equal to {maximum}"
    if value < 1 or value > maximum:
        raise validation(
            f"1 validation error detected: Value '{value}' at 'limit' failed to satisfy "
            f"constraint: Member must have value {bound}"
        )
    return value


def sequence_text(number: int) -> str:
    return f"{number:0{SEQUENCE_DIGITS}d}"


def stream_label(at: float) -> str:
    """``2026-11-24T18:57:53.400``: the label AWS gives a stream (UTC, milliseconds)."""
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3]


@dataclass
class Stream:
    """One stream of one table: one shard and its records, oldest first."""

    arn: str
    label: str
    table: str
    key_schema: list[dict[str, str]]
    view_type: str
    region: str
    created_at: float
    shard_id: str
    start_seq: int
    status: str = "ENABLED"
    end_seq: int | None = None
    disabled_at: float | None = None
    # Parallel lists from ``head`` on (trimmed entries before it are dropped in bulk).
    seqs: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    texts: list[bytes] = field(default_factory=list)
    head: int = 0
    bytes: int = 0
    trimmed_through: int = 0
    trimmed: int = 0
    trimmed_early: int = 0

    @property
    def closed(self) -> bool:
        return self.end_seq is not None

    def kept(self) -> int:
        """Records not trimmed yet. (Not ``__len__``: an empty stream must not be falsy.)"""
        return len(self.seqs) - self.head

    def describe_shard(self) -> dict[str, Any]:
        numbers = {"StartingSequenceNumber": sequence_text(self.start_seq)}
        if self.end_seq is not None:
            numbers["EndingSequenceNumber"] = sequence_text(self.end_seq)
        return {"ShardId": self.shard_id, "SequenceNumberRange": numbers}

    def index_at(self, position: int) -> int:
        """Index of the first kept record with a sequence number at or after ``position``."""
        return bisect.bisect_left(self.seqs, position, lo=self.head)

    def horizon(self) -> int:
        """The position of the oldest record a reader can still get."""
        return max(self.start_seq, self.trimmed_through + 1)

    def drop_oldest(self, early: bool) -> None:
        self.trimmed_through = self.seqs[self.head]
        self.bytes -= len(self.texts[self.head])
        self.head += 1
        self.trimmed += 1
        self.trimmed_early += int(early)
        if self.head >= 1024 and self.head * 2 >= len(self.seqs):
            del self.seqs[: self.head], self.times[: self.head], self.texts[: self.head]
            self.head = 0


EVENTS = ("INSERT", "MODIFY", "REMOVE")


def change_record(
    stream: Stream,
    keys: dict[str, Any],
    event: str,
    old: dict[str, Any] | None,
    new: dict[str, Any] | None,
    sequence: int,
    at: float,
) -> dict[str, Any]:
    """The stream record of one item-level change: ``old``/``new`` are the whole item before
    and after (None where it did not exist or is not known); the view type picks which go in."""
    if event not in EVENTS:
        raise ValueError(f"unknown event {event!r}: one of {', '.join(EVENTS)}")
    data: dict[str, Any] = {"ApproximateCreationDateTime": int(at), "Keys": keys}
    if new is not None and stream.view_type in ("NEW_IMAGE", "NEW_AND_OLD_IMAGES"):
        data["NewImage"] = new
    if old is not None and stream.view_type in ("OLD_IMAGE", "NEW_AND_OLD_IMAGES"):
        data["OldImage"] = old
    # SizeBytes: the length of the record's key and images as JSON, an approximation of
    # AWS's own count (attribute names and values), which no client computes back.
    images = {k: v for k, v in data.items() if k in ("Keys", "NewImage", "OldImage")}
    data["SizeBytes"] = len(_DUMPS(images))
    data["SequenceNumber"] = sequence_text(sequence)
    data["StreamViewType"] = stream.view_type
    return {
        "eventID": uuid.uuid4().hex,
        "eventName": event,
        "eventVersion": "1.1",
        "eventSource": "aws:dynamodb",
        "awsRegion": stream.region,
        "dynamodb": data,
    }


@dataclass(frozen=True)
class IteratorPosition:
    arn: str
    shard_id: str
    position: int
    issued_at: float


def encode_iterator(arn: str, shard_id: str, position: int, issued_at: float) -> str:
    """``<stream ARN>|1|<opaque>``, the shape AWS's iterators have; unique per call."""
    token = _DUMPS([shard_id, position, round(issued_at * 1000), uuid.uuid4().hex[:8]])
    return f"{arn}|1|{base64.urlsafe_b64encode(token.encode()).decode()}"


def decode_iterator(iterator: Any) -> IteratorPosition:
    if not isinstance(iterator, str) or not iterator:
        raise _null("shardIterator")
    try:
        arn, version, token = iterator.rsplit("|", 2)
        shard_id, position, issued_ms, _ = json.loads(base64.urlsafe_b64decode(token))
        if version != "1" or not isinstance(position, int) or not isinstance(issued_ms, int):
            raise ValueError(version)
    except (ValueError, TypeError):
        raise validation(f"Invalid ShardIterator: {iterator[:64]!r}") from None
    return IteratorPosition(arn, str(shard_id), position, issued_ms / 1000)


@dataclass
class StreamStore:
    """Every stream the proxy keeps, the latest per table, and one sequence counter for all
    (numbers increase across streams too, so a LATEST position is just the next number)."""

    clock: Callable[[], float]
    max_records: int = DEFAULT_MAX_RECORDS
    max_bytes: int = DEFAULT_MAX_BYTES
    retention_seconds: float = RETENTION_SECONDS
    streams: dict[str, Stream] = field(default_factory=dict)
    latest: dict[str, Stream] = field(default_factory=dict)
    counter: int = 0

    def __post_init__(self) -> None:
        if self.max_records < 1 or self.max_bytes < 1 or self.retention_seconds <= 0:
            raise ValueError("max_records, max_bytes and retention must be positive")

    # -- the table side --------------------------------------------------------------------------
    def enabled(self, table: str) -> Stream | None:
        stream = self.latest.get(table)
        return stream if stream is not None and stream.status == "ENABLED" else None

    def enable(
        self, table: str, table_arn: str, key_schema: list[dict[str, str]], view_type: str
    ) -> Stream:
        if view_type not in VIEW_TYPES:
            raise ValueError(f"unknown StreamViewType {view_type!r}")
        if self.enabled(table) is not None:
            raise ValueError(f"table {table} already has an enabled stream")
        now = self.clock()
        label = stream_label(now)
        while f"{table_arn}/stream/{label}" in self.streams:
            now += 0.001  # two enablings within a millisecond still get two ARNs
            label = stream_label(now)
        parts = table_arn.split(":")
        stream = Stream(
            arn=f"{table_arn}/stream/{label}",
            label=label,
            table=table,
            key_schema=[dict(k) for k in key_schema],
            view_type=view_type,
            region=parts[3] if len(parts) > 3 and parts[3] else "us-east-1",
            created_at=now,
            shard_id=f"shardId-{round(now * 1000):020d}-{uuid.uuid4().hex[:8]}",
            start_seq=self.counter + 1,
        )
        self.streams[stream.arn] = stream
        self.latest[table] = stream
        self.expire()
        return stream

    def disable(self, table: str) -> Stream | None:
        """Close the table's enabled stream (it stays readable); None when it had none."""
        stream = self.enabled(table)
        if stream is None:
            return None
        stream.status = "DISABLED"
        stream.disabled_at = self.clock()
        last = stream.seqs[-1] if stream.kept() else 0
        stream.end_seq = max(stream.start_seq, stream.trimmed_through, last)
        return stream

    def table_deleted(self, table: str) -> None:
        """A deleted table's stream is disabled, and a table made again under that name starts
        without one."""
        self.disable(table)
        self.latest.pop(table, None)

    def append(
        self,
        table: str,
        keys: dict[str, Any],
        event: str,
        old: dict[str, Any] | None,
        new: dict[str, Any] | None,
    ) -> dict[str, Any] | None:
        """Record one change of an item of ``table``; the record, or None when the table has
        no enabled stream."""
        stream = self.enabled(table)
        if stream is None:
            return None
        now = self.clock()
        if stream.kept() and now < stream.times[-1]:
            now = stream.times[-1]  # a clock stepping back must not unsort AT_TIMESTAMP
        self.counter += 1
        record = change_record(stream, keys, event, old, new, self.counter, now)
        text = _DUMPS(record).encode()
        stream.seqs.append(self.counter)
        stream.times.append(now)
        stream.texts.append(text)
        stream.bytes += len(text)
        self._trim(stream, now)
        return record

    # -- bounds ---------------------------------------------------------------------------------
    def _trim(self, stream: Stream, now: float) -> None:
        cutoff = now - self.retention_seconds
        while stream.kept() and stream.times[stream.head] < cutoff:
            stream.drop_oldest(early=False)
        while stream.kept() > self.max_records or (
            stream.kept() > 1 and stream.bytes > self.max_bytes
        ):
            stream.drop_oldest(early=True)

    def expire(self) -> None:
        """Trim every stream by age and forget streams disabled longer than the retention."""
        now = self.clock()
        for arn, stream in list(self.streams.items()):
            self._trim(stream, now)
            if stream.disabled_at is not None and now - stream.disabled_at > self.retention_seconds:
                del self.streams[arn]
                if self.latest.get(stream.table) is stream:
                    del self.latest[stream.table]

    def counts(self) -> dict[str, int]:
        streams = list(self.streams.values())
        return {
            "streams": len(streams),
            "records": sum(s.kept() for s in streams),
            "record_bytes": sum(s.bytes for s in streams),
            "trimmed": sum(s.trimmed for s in streams),
            "trimmed_early": sum(s.trimmed_early for s in streams),
        }

    # -- the Streams API ------------------------------------------------------------------------
    def call(self, operation: str, body: dict[str, Any]) -> bytes:
        """One Streams API call: its answer as JSON bytes, or AwsError."""
        handler = {
            "ListStreams": self.list_streams,
            "DescribeStream": self.describe_stream,
            "GetShardIterator": self.get_shard_iterator,
            "GetRecords": self.get_records,
        }.get(operation)
        if handler is None:
            raise AwsError("UnknownOperationException", f"unknown operation {operation}")
        self.expire()
        return handler(body)

    def _stream(self, arn: Any) -> Stream:
        if arn is None:
            raise _null("streamArn")
        if not isinstance(arn, str) or not STREAM_ARN.match(arn) or len(arn) > 1024:
            raise validation(f"Invalid StreamArn: {str(arn)[:128]!r}")
        stream = self.streams.get(arn)
        if stream is None:
            raise AwsError(
                "ResourceNotFoundException",
                f"Requested resource not found: Stream: {arn} not found",
            )
        return stream

    def _shard(self, stream: Stream, shard_id: Any) -> None:
        if shard_id is None:
            raise _null("shardId")
        if shard_id != stream.shard_id:
            raise AwsError(
                "ResourceNotFoundException",
                f"Requested resource not found: Shard {shard_id} does not exist in {stream.arn}",
            )

    def list_streams(self, body: dict[str, Any]) -> bytes:
        limit = _limit(body, LIST_MAX, LIST_MAX)
        table = body.get("TableName")
        streams = [s for s in self.streams.values() if table is None or s.table == table]
        start = body.get("ExclusiveStartStreamArn")
        if start is not None:
            after = self._stream(start)
            streams = streams[streams.index(after) + 1 :] if after in streams else []
        page = streams[:limit]
        answer: dict[str, Any] = {
            "Streams": [
                {"StreamArn": s.arn, "TableName": s.table, "StreamLabel": s.label} for s in page
            ]
        }
        if len(streams) > limit:
            answer["LastEvaluatedStreamArn"] = page[-1].arn
        return _DUMPS(answer).encode()

    def describe_stream(self, body: dict[str, Any]) -> bytes:
        stream = self._stream(body.get("StreamArn"))
        _limit(body, LIST_MAX, LIST_MAX)
        shards = [stream.describe_shard()]
        start = body.get("ExclusiveStartShardId")
        if start is not None and start >= stream.shard_id:
            shards = []  # AWS answers an unknown start shard with no shards, not an error
        shard_filter = body.get("ShardFilter")
        if isinstance(shard_filter, dict) and shard_filter.get("Type") == "CHILD_SHARDS":
            shards = []  # the one shard is never split: no shard has children
        description = {
            "StreamArn": stream.arn,
            "StreamLabel": stream.label,
            "StreamStatus": stream.status,
            "StreamViewType": stream.view_type,
            "CreationRequestDateTime": stream.created_at,
            "TableName": stream.table,
            "KeySchema": stream.key_schema,
            "Shards": shards,
        }
        return _DUMPS({"StreamDescription": description}).encode()

    def _sequence(self, stream: Stream, value: Any, kind: str) -> int:
        if value is None:
            raise validation(f"SequenceNumber is required with ShardIteratorType {kind}")
        if not isinstance(value, str) or not value.isdecimal() or len(value) > 40:
            raise validation(f"Invalid SequenceNumber: {str(value)[:64]!r}")
        number = int(value)
        upper = stream.end_seq if stream.end_seq is not None else self.counter
        if not stream.start_seq <= number <= max(upper, stream.start_seq):
            raise validation(
                f"Invalid SequenceNumber {value} for shard {stream.shard_id}: its range is "
                f"{sequence_text(stream.start_seq)} to {sequence_text(upper)}"
            )
        if number <= stream.trimmed_through:
            raise AwsError(
                "TrimmedDataAccessException",
                f"SequenceNumber {value} has been trimmed from shard {stream.shard_id}",
            )
        return number

    def _at_time(self, stream: Stream, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise validation("Timestamp is required with ShardIteratorType AT_TIMESTAMP")
        now = self.clock()
        if value > now:
            raise validation(f"Timestamp {value} is in the future")
        index = bisect.bisect_left(stream.times, value, lo=stream.head)
        if index < len(stream.seqs):
            return stream.seqs[index]
        return self._after_last(stream)

    def _after_last(self, stream: Stream) -> int:
        return (stream.end_seq if stream.end_seq is not None else self.counter) + 1

    def get_shard_iterator(self, body: dict[str, Any]) -> bytes:
        stream = self._stream(body.get("StreamArn"))
        self._shard(stream, body.get("ShardId"))
        kind = body.get("ShardIteratorType")
        if kind is None:
            raise _null("shardIteratorType")
        if kind not in ITERATOR_TYPES:
            raise validation(
                f"1 validation error detected: Value '{kind}' at 'shardIteratorType' failed to "
                f"satisfy constraint: Member must satisfy enum value set: {list(ITERATOR_TYPES)}"
            )
        sequence = body.get("SequenceNumber")
        if kind in ("TRIM_HORIZON", "LATEST", "AT_TIMESTAMP") and sequence is not None:
            raise validation(f"SequenceNumber must not be given with ShardIteratorType {kind}")
        if kind == "TRIM_HORIZON":
            position = stream.horizon()
        elif kind == "LATEST":
            position = self._after_last(stream)
        elif kind == "AT_SEQUENCE_NUMBER":
            position = self._sequence(stream, sequence, kind)
        elif kind == "AFTER_SEQUENCE_NUMBER":
            position = self._sequence(stream, sequence, kind) + 1
        else:
            position = max(self._at_time(stream, body.get("Timestamp")), stream.horizon())
        iterator = encode_iterator(stream.arn, stream.shard_id, position, self.clock())
        return _DUMPS({"ShardIterator": iterator}).encode()

    def get_records(self, body: dict[str, Any]) -> bytes:
        where = decode_iterator(body.get("ShardIterator"))
        limit = _limit(body, GET_RECORDS_MAX, GET_RECORDS_MAX)
        stream = self.streams.get(where.arn)
        if stream is None or stream.shard_id != where.shard_id:
            raise AwsError(
                "ResourceNotFoundException",
                f"Requested resource not found: Stream: {where.arn} not found",
            )
        now = self.clock()
        if now - where.issued_at > ITERATOR_LIFETIME_SECONDS:
            raise AwsError(
                "ExpiredIteratorException",
                f"Iterator expired. The iterator was created at time {stream_label(where.issued_at)}"
                f" while right now it is {stream_label(now)} which is further in the future than "
                f"the tolerated delay of {ITERATOR_LIFETIME_SECONDS * 1000} milliseconds.",
            )
        if where.position <= stream.trimmed_through:
            raise AwsError(
                "TrimmedDataAccessException",
                "The operation attempted to read past the oldest stream record in a shard: "
                f"records up to {sequence_text(stream.trimmed_through)} have been trimmed",
            )
        start = stream.index_at(where.position)
        end, size = start, 0
        while end < len(stream.seqs) and end - start < limit:
            size += len(stream.texts[end])
            if end > start and size > GET_RECORDS_MAX_BYTES:
                break
            end += 1
        position = stream.seqs[end - 1] + 1 if end > start else where.position
        parts = [b'{"Records":[', b",".join(stream.texts[start:end]), b"]"]
        if not (stream.closed and end == len(stream.seqs)):
            iterator = encode_iterator(stream.arn, stream.shard_id, position, now)
            parts.append(b',"NextShardIterator":' + _DUMPS(iterator).encode())
        parts.append(b"}")
        return b"".join(parts)
