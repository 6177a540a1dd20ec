"""What the proxy reads of DynamoDB traffic (pure): which calls write which items, stream
specifications, item comparison, and the stream fields of a table description.

The proxy learns of every change to a streamed table from the write calls themselves
(PutItem, UpdateItem, DeleteItem, BatchWriteItem; dynalite has no TransactWriteItems and no
PartiQL, so nothing else writes there) and reads the item before and after the write itself:
see :mod:`emulators.aws_proxy.stream_capture`.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from emulators.aws_proxy.dynamodb_streams import VIEW_TYPES, AwsError, Stream, validation

DYNAMODB_TARGET_PREFIX = "DynamoDB_20120810."
STREAMS_TARGET_PREFIX = "DynamoDBStreams_20120810."
ITEM_WRITES = ("PutItem", "UpdateItem", "DeleteItem")
TABLE_CALLS = ("CreateTable", "UpdateTable", "DescribeTable", "DeleteTable")
# The views whose records carry the item as it is after the write.
NEW_IMAGE_VIEWS = ("NEW_IMAGE", "NEW_AND_OLD_IMAGES")


class Unknown:
    """An image the proxy could not read (its read failed): the change is still recorded, with
    what is known, so a reader still learns the key changed."""

    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN = Unknown()
Image = dict[str, Any] | None | Unknown


def is_dynamodb(headers: dict[str, str]) -> bool:
    return headers.get("x-amz-target", "").startswith(DYNAMODB_TARGET_PREFIX)


def is_dynamodb_streams(headers: dict[str, str]) -> bool:
    return headers.get("x-amz-target", "").startswith(STREAMS_TARGET_PREFIX)


def stream_specification(value: Any) -> tuple[bool, str | None]:
    """``(enabled, view type)`` from a CreateTable/UpdateTable ``StreamSpecification``;
    AwsError (ValidationException) when it is not one DynamoDB accepts."""
    if not isinstance(value, dict):
        raise validation("StreamSpecification must be an object")
    enabled = value.get("StreamEnabled")
    if enabled is None:
        raise validation(
            "1 validation error detected: Value null at 'streamSpecification.streamEnabled' "
            "failed to satisfy constraint: Member must not be null"
        )
    if not isinstance(enabled, bool):
        raise validation("StreamSpecification.StreamEnabled must be a boolean")
    view = value.get("StreamViewType")
    if not enabled:
        return False, None
    if view is None:
        raise validation(
            "One or more parameter values were invalid: StreamViewType is required when "
            "StreamEnabled is true"
        )
    if view not in VIEW_TYPES:
        raise validation(
            f"1 validation error detected: Value '{view}' at 'streamSpecification.streamViewType'"
            f" failed to satisfy constraint: Member must satisfy enum value set: {list(VIEW_TYPES)}"
        )
    return True, view


def key_of(item: Any, key_schema: list[dict[str, str]]) -> dict[str, Any] | None:
    """The key attributes of an item (or of a ``Key``), or None when one is missing."""
    if not isinstance(item, dict):
        return None
    key = {}
    for element in key_schema:
        name = element["AttributeName"]
        if not isinstance(item.get(name), dict):
            return None
        key[name] = item[name]
    return key


def key_text(table: str, key: dict[str, Any]) -> str:
    """One text per item, for locks and maps."""
    return json.dumps([table, key], sort_keys=True, separators=(",", ":"))


def _number(text: Any) -> Decimal | Any:
    try:
        return Decimal(text)
    except (InvalidOperation, TypeError, ValueError):
        return text


def _binary(text: Any) -> bytes | Any:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, TypeError, ValueError):
        return text


def _canonical(value: Any) -> Any:
    """An AttributeValue as DynamoDB compares it: numbers by value ("1.50" is "1.5"), sets
    without order, binaries by their bytes."""
    if not isinstance(value, dict) or len(value) != 1:
        return value
    ((kind, inner),) = value.items()
    if kind == "N":
        return ("N", _number(inner))
    if kind == "B":
        return ("B", _binary(inner))
    if kind in ("SS", "NS", "BS") and isinstance(inner, list):
        convert = {"SS": lambda v: v, "NS": _number, "BS": _binary}[kind]
        return (kind, frozenset(convert(v) for v in inner))
    if kind == "M" and isinstance(inner, dict):
        return ("M", {k: _canonical(v) for k, v in inner.items()})
    if kind == "L" and isinstance(inner, list):
        return ("L", [_canonical(v) for v in inner])
    return (kind, inner)


def same_item(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    """Whether two items hold the same data (a PutItem of an identical item changes nothing,
    and AWS then writes no stream record)."""
    if a is None or b is None:
        return a is b
    return a.keys() == b.keys() and all(_canonical(a[k]) == _canonical(b[k]) for k in a)


@dataclass(frozen=True)
class Change:
    event: str
    old: dict[str, Any] | None
    new: dict[str, Any] | None


def change_of(old: Image, new: Image) -> Change | None:
    """The stream record's event and images for an item read before and after a successful
    write; None when nothing changed. An image that could not be read is left out; the event
    is then the one the other image allows (MODIFY when neither says)."""
    if isinstance(old, Unknown) or isinstance(new, Unknown):
        known_old = None if isinstance(old, Unknown) else old
        known_new = None if isinstance(new, Unknown) else new
        if new is None:
            return Change("REMOVE", known_old, None)
        if old is None:
            return Change("INSERT", None, known_new)
        return Change("MODIFY", known_old, known_new)
    if old is None and new is None:
        return None
    if same_item(old, new):
        return None
    event = "INSERT" if old is None else "REMOVE" if new is None else "MODIFY"
    return Change(event, old, new)


@dataclass(frozen=True)
class BatchWrite:
    table: str
    key: dict[str, Any]
    item: dict[str, Any] | None  # the PutRequest's item; None for a DeleteRequest


def batch_writes(body: dict[str, Any], streams: dict[str, Stream]) -> list[BatchWrite]:
    """The writes of a BatchWriteItem to the tables in ``streams``, in request order (a
    request without its key is left for upstream to refuse)."""
    writes = []
    requests = body.get("RequestItems")
    if not isinstance(requests, dict):
        return []
    for table, entries in requests.items():
        stream = streams.get(table)
        if stream is None or not isinstance(entries, list):
            continue
        for entry in entries:
            if not isinstance(entry, dict):
                continue
            put, delete = entry.get("PutRequest"), entry.get("DeleteRequest")
            item = put.get("Item") if isinstance(put, dict) else None
            source = item if item is not None else (delete or {}).get("Key")
            key = key_of(source, stream.key_schema)
            if key is not None:
                writes.append(BatchWrite(table, key, item if isinstance(item, dict) else None))
    return writes


def unprocessed(answer: dict[str, Any], streams: dict[str, Stream]) -> set[str]:
    """The items a BatchWriteItem answer says it did not write (``UnprocessedItems``)."""
    left = set()
    for table, entries in (answer.get("UnprocessedItems") or {}).items():
        stream = streams.get(table)
        if stream is None or not isinstance(entries, list):
            continue
        for entry in entries:
            put, delete = entry.get("PutRequest") or {}, entry.get("DeleteRequest") or {}
            key = key_of(put.get("Item") or delete.get("Key"), stream.key_schema)
            if key is not None:
                left.add(key_text(table, key))
    return left


def with_stream(description: dict[str, Any], stream: Stream | None) -> dict[str, Any]:
    """A TableDescription with the fields DynamoDB adds for the table's latest stream."""
    if stream is None:
        return description
    out = dict(description)
    if stream.status == "ENABLED":
        out["StreamSpecification"] = {"StreamEnabled": True, "StreamViewType": stream.view_type}
    out["LatestStreamArn"] = stream.arn
    out["LatestStreamLabel"] = stream.label
    return out


def already_enabled(table: str) -> AwsError:
    return validation(f"Table already has an enabled stream: TableName: {table}")


def nothing_to_disable(table: str) -> AwsError:
    return validation(f"Table {table} has no enabled stream: there is no stream to disable")
