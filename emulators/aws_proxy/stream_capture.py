"""DynamoDB Streams in front of a DynamoDB that has none (dynalite): the proxy's adapter.

Table calls: a ``StreamSpecification`` on CreateTable/UpdateTable enables or disables the
table's stream here (dynalite ignores it on CreateTable and refuses an UpdateTable that has
nothing else, so UpdateTable is forwarded without it, or answered here when nothing else
remains); DescribeTable, CreateTable, UpdateTable and DeleteTable answers carry
``StreamSpecification``, ``LatestStreamArn`` and ``LatestStreamLabel`` as DynamoDB's do.

Item writes to a table with an enabled stream (PutItem, UpdateItem, DeleteItem,
BatchWriteItem) become stream records. The old image, which the event name needs (INSERT or
MODIFY; no record for a delete of nothing or a write that changes nothing), is read with a
consistent GetItem/BatchGetItem just before the write is forwarded, and the new one just after,
both while the proxy holds a lock on those items: every write that goes through the proxy is
then recorded with exactly the images it made, in the order it was made. The client's own
request goes upstream unchanged (signature included) and its answer comes back unchanged; the
reads are extra calls of the proxy's own. They are skipped where the write itself says the
image: ``ReturnValues: ALL_OLD`` gives the old item, UpdateItem's ``ALL_NEW`` the new one, and a
PutItem's new item is its ``Item`` (compared by value; read back only for the views that carry
it, so the record holds what DynamoDB stored, numbers normalised). Writes to other tables, and
every read, are only forwarded.

Time to Live: UpdateTimeToLive and DescribeTimeToLive are answered here, per table, after
asking upstream whether the table exists (:mod:`emulators.aws_proxy.dynamodb_ttl`; only the
status: nothing expires); a deleted table's TTL goes with it.

What it cannot see: writes that reach the upstream without going through the proxy.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any

from emulators.aws_proxy.answers import (
    DYNAMODB_CONTENT_TYPE,
    DYNAMODB_ERROR_NAMESPACE,
    aws_error,
    aws_json,
    rewritten,
)
from emulators.aws_proxy.dynamodb import (
    DYNAMODB_TARGET_PREFIX,
    ITEM_WRITES,
    NEW_IMAGE_VIEWS,
    TABLE_CALLS,
    UNKNOWN,
    BatchWrite,
    Image,
    already_enabled,
    batch_writes,
    change_of,
    key_of,
    key_text,
    nothing_to_disable,
    stream_specification,
    unprocessed,
    with_stream,
)
from emulators.aws_proxy.dynamodb_streams import AwsError, Stream, StreamStore
from emulators.aws_proxy.dynamodb_ttl import TtlStore, ttl_specification
from emulators.aws_proxy.kinesis import json_object
from emulators.http_server import Request, Response

log = logging.getLogger(__name__)

Send = Callable[[Request], Awaitable[Response]]
# Headers of the client's request a read of the proxy's own must not carry.
NOT_FOR_READS = frozenset(
    {"x-amz-target", "content-encoding", "content-length", "x-amz-crc32", "accept-encoding"}
)
TTL_CALLS = ("UpdateTimeToLive", "DescribeTimeToLive")
BATCH_GET_MAX = 100
BATCH_GET_ATTEMPTS = 5
READ_ATTEMPTS = 4
READ_RETRY_SECONDS = 0.05


def error_answer(error: AwsError) -> Response:
    return aws_error(
        error.status, error.code, error.message, DYNAMODB_CONTENT_TYPE, DYNAMODB_ERROR_NAMESPACE
    )


class KeyLocks:
    """One asyncio lock per item, held while the item is read, written and read again; a lock
    nobody holds or waits for is dropped, so the map stays as small as the writes in flight."""

    def __init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}
        self._users: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self._locks)

    @asynccontextmanager
    async def hold(self, names: Iterable[str]) -> AsyncIterator[None]:
        ordered = sorted(set(names))  # one order for everyone: no two batches deadlock
        waiting: list[str] = []
        held: list[str] = []
        try:
            for name in ordered:
                self._users[name] += 1
                waiting.append(name)
                await self._locks.setdefault(name, asyncio.Lock()).acquire()
                held.append(name)
            yield
        finally:
            for name in reversed(held):
                self._locks[name].release()
            for name in waiting:
                self._users[name] -= 1
                if not self._users[name]:
                    del self._users[name], self._locks[name]


class StreamCapture:
    """The DynamoDB side (table calls, item writes) and the Streams API of one proxy."""

    def __init__(self, store: StreamStore, send: Send) -> None:
        self.store = store
        self.send = send
        self.ttl = TtlStore()
        self.locks = KeyLocks()
        self.counts: Counter[str] = Counter()

    def health(self) -> dict[str, int]:
        return {
            **self.store.counts(),
            "recorded": self.counts["recorded"],
            "unchanged_writes": self.counts["unchanged_writes"],
            "image_reads": self.counts["image_reads"],
            "capture_errors": self.counts["capture_errors"],
        }

    # -- the Streams API --------------------------------------------------------------------------
    def streams_api(self, request: Request, operation: str) -> Response:
        body = json_object(request.body, request.headers.get("content-encoding", ""))
        if body is None:
            return error_answer(AwsError("SerializationException", "the body must be JSON"))
        try:
            return aws_json(200, self.store.call(operation, body))
        except AwsError as error:
            return error_answer(error)

    # -- DynamoDB ---------------------------------------------------------------------------------
    async def dynamodb(self, request: Request, operation: str | None) -> Response:
        if operation in TTL_CALLS:
            body = self._body(request)
            if body is None:
                return error_answer(AwsError("SerializationException", "the body must be JSON"))
            try:
                return await self._ttl_call(request, operation, body)
            except AwsError as error:
                return error_answer(error)
        if operation in TABLE_CALLS:
            body = self._body(request)
            if body is not None:
                try:
                    return await self._table_call(request, operation, body)
                except AwsError as error:
                    return error_answer(error)
        elif self.store.latest and operation in ITEM_WRITES:
            body = self._body(request)
            stream = self._stream_of(body)
            if body is not None and stream is not None:
                return await self._item_write(request, operation, body, stream)
        elif self.store.latest and operation == "BatchWriteItem":
            body = self._body(request)
            if body is not None:
                tables = body.get("RequestItems") or {}
                streams = {t: s for t in tables if (s := self._enabled(t)) is not None}
                writes = batch_writes(body, streams)
                if writes:
                    return await self._batch_write(request, body, streams, writes)
        return await self.send(request)

    @staticmethod
    def _body(request: Request) -> dict[str, Any] | None:
        return json_object(request.body, request.headers.get("content-encoding", ""))

    def _enabled(self, table: Any) -> Stream | None:
        return self.store.enabled(table) if isinstance(table, str) else None

    def _stream_of(self, body: dict[str, Any] | None) -> Stream | None:
        return self._enabled(body.get("TableName")) if body is not None else None

    # -- reads of the proxy's own ---------------------------------------------------------------
    async def _call(
        self, like: Request, operation: str, body: dict[str, Any]
    ) -> tuple[Response, dict[str, Any] | None]:
        """A DynamoDB call with the client's credentials headers; its answer and JSON body."""
        headers = [(k, v) for k, v in like.raw_headers if k not in NOT_FOR_READS]
        headers += [
            ("x-amz-target", DYNAMODB_TARGET_PREFIX + operation),
            ("accept-encoding", "identity"),
        ]
        request = Request(
            method="POST",
            path=like.path,
            headers={**like.headers, "x-amz-target": DYNAMODB_TARGET_PREFIX + operation},
            body=json.dumps(body, separators=(",", ":")).encode(),
            http_version="1.1",
            raw_headers=headers,
        )
        # Reads are idempotent: one the upstream did not answer (a 5xx of its own or of the
        # proxy's, a connection closed under it) is tried again rather than recorded without
        # its image.
        for attempt in range(READ_ATTEMPTS):
            answer = await self.send(request)
            if answer.status < 500:
                break
            log.warning("%s for a stream image answered %s", operation, answer.status)
            if attempt + 1 < READ_ATTEMPTS:
                await asyncio.sleep(READ_RETRY_SECONDS * 2**attempt)
        return answer, self._body_of(answer) if answer.status == 200 else None

    @staticmethod
    def _body_of(answer: Response) -> dict[str, Any] | None:
        return json_object(answer.body, answer.headers.get("content-encoding", ""))

    async def _get_item(self, like: Request, table: str, key: dict[str, Any]) -> Image:
        self.counts["image_reads"] += 1
        _, found = await self._call(
            like, "GetItem", {"TableName": table, "Key": key, "ConsistentRead": True}
        )
        if found is None:
            return UNKNOWN
        item = found.get("Item")
        return item if isinstance(item, dict) else None

    async def _get_items(self, like: Request, writes: list[BatchWrite]) -> dict[str, Image]:
        """The items of ``writes`` as they are now (consistent reads), by key text; UNKNOWN for
        the ones that could not be read."""
        images: dict[str, Image] = {}
        for start in range(0, len(writes), BATCH_GET_MAX):
            wanted: dict[str, dict[str, Any]] = {}
            for write in writes[start : start + BATCH_GET_MAX]:
                images[key_text(write.table, write.key)] = None
                wanted.setdefault(write.table, {"Keys": [], "ConsistentRead": True})
                if write.key not in wanted[write.table]["Keys"]:
                    wanted[write.table]["Keys"].append(write.key)
            for _ in range(BATCH_GET_ATTEMPTS):
                self.counts["image_reads"] += 1
                _, found = await self._call(like, "BatchGetItem", {"RequestItems": wanted})
                if found is None:
                    break
                for table, items in (found.get("Responses") or {}).items():
                    stream = self.store.latest.get(table)
                    for item in items:
                        key = key_of(item, stream.key_schema) if stream is not None else None
                        if key is not None:
                            images[key_text(table, key)] = item
                wanted = found.get("UnprocessedKeys") or {}
                if not wanted:
                    break
            for table, left in wanted.items():
                for key in left.get("Keys", []):
                    images[key_text(table, key)] = UNKNOWN
        return images

    def _record(self, table: str, key: dict[str, Any], old: Image, new: Image) -> None:
        if old is UNKNOWN or new is UNKNOWN:
            self.counts["capture_errors"] += 1
            log.warning("stream %s: could not read an image of %s; recorded without it", table, key)
        change = change_of(old, new)
        if change is None:
            self.counts["unchanged_writes"] += 1
            return
        if self.store.append(table, key, change.event, change.old, change.new) is not None:
            self.counts["recorded"] += 1

    # -- item writes ----------------------------------------------------------------------------
    async def _item_write(
        self, request: Request, operation: str, body: dict[str, Any], stream: Stream
    ) -> Response:
        table = stream.table
        source = body.get("Item") if operation == "PutItem" else body.get("Key")
        key = key_of(source, stream.key_schema)
        if key is None:
            return await self.send(request)  # upstream names the missing key attribute
        returns = body.get("ReturnValues")
        async with self.locks.hold([key_text(table, key)]):
            old: Image = None
            if returns != "ALL_OLD":
                old = await self._get_item(request, table, key)
            answer = await self.send(request)
            if answer.status != 200:
                return answer
            given = self._body_of(answer) or {}
            if returns == "ALL_OLD":
                old = given.get("Attributes") or None
            new: Image
            if operation == "DeleteItem":
                new = None
            elif operation == "UpdateItem" and returns == "ALL_NEW":
                new = given.get("Attributes") or None
            elif operation == "PutItem" and stream.view_type not in NEW_IMAGE_VIEWS:
                new = body["Item"]  # compared by value only: this view does not carry it
            else:
                new = await self._get_item(request, table, key)
            self._record(table, key, old, new)
        return answer

    async def _batch_write(
        self,
        request: Request,
        body: dict[str, Any],
        streams: dict[str, Stream],
        writes: list[BatchWrite],
    ) -> Response:
        async with self.locks.hold(key_text(w.table, w.key) for w in writes):
            before = await self._get_items(request, writes)
            answer = await self.send(request)
            if answer.status != 200:
                return answer
            left = unprocessed(self._body_of(answer) or {}, streams)
            done = [w for w in writes if key_text(w.table, w.key) not in left]
            read_back = [
                w
                for w in done
                if w.item is not None and streams[w.table].view_type in NEW_IMAGE_VIEWS
            ]
            after = await self._get_items(request, read_back) if read_back else {}
            for write in done:
                name = key_text(write.table, write.key)
                new: Image = write.item
                if name in after:
                    new = after[name]
                self._record(write.table, write.key, before.get(name, UNKNOWN), new)
        return answer

    # -- table calls ----------------------------------------------------------------------------
    async def _table_call(self, request: Request, operation: str, body: dict[str, Any]) -> Response:
        table = body.get("TableName")
        if not isinstance(table, str):
            return await self.send(request)  # upstream's validation names the problem
        if operation == "CreateTable":
            spec = body.get("StreamSpecification")
            enabled, view = stream_specification(spec) if spec is not None else (False, None)
            answer = await self.send(request)
            described = self._described(answer, "TableDescription")
            if described is None:
                return answer
            self.store.table_deleted(table)  # a stream left from a table deleted behind our back
            self.ttl.table_deleted(table)
            if enabled and view is not None:
                self.store.enable(table, described["TableArn"], described["KeySchema"], view)
            return self._with_stream(answer, "TableDescription", described, table)
        if operation == "UpdateTable" and "StreamSpecification" in body:
            return await self._update_stream(request, body, table)
        answer = await self.send(request)
        key = "Table" if operation == "DescribeTable" else "TableDescription"
        described = self._described(answer, key)
        if described is not None and operation == "DeleteTable":
            self.ttl.table_deleted(table)
        if described is None or table not in self.store.latest:
            return answer
        out = self._with_stream(answer, key, described, table)
        if operation == "DeleteTable":
            self.store.table_deleted(table)
        return out

    async def _ttl_call(self, request: Request, operation: str, body: dict[str, Any]) -> Response:
        """UpdateTimeToLive and DescribeTimeToLive, answered here (dynalite has no TTL)."""
        table = body.get("TableName")
        if not isinstance(table, str):
            raise AwsError(
                "ValidationException",
                "1 validation error detected: Value null at 'tableName' failed to satisfy "
                "constraint: Member must not be null",
            )
        if operation == "UpdateTimeToLive":
            ttl_specification(body.get("TimeToLiveSpecification"))  # input first, as AWS
        # The table must exist (else DynamoDB's own ResourceNotFoundException).
        answer, found = await self._call(request, "DescribeTable", {"TableName": table})
        if found is None or not isinstance(found.get("Table"), dict):
            return answer
        if operation == "DescribeTimeToLive":
            out = self.ttl.describe(table)
        else:
            out = self.ttl.update(table, body["TimeToLiveSpecification"])
        return aws_json(200, json.dumps(out, separators=(",", ":")).encode())

    @classmethod
    def _described(cls, answer: Response, key: str) -> dict[str, Any] | None:
        if answer.status != 200:
            return None
        value = (cls._body_of(answer) or {}).get(key)
        return value if isinstance(value, dict) else None

    def _with_stream(
        self, answer: Response, key: str, described: dict[str, Any], table: str
    ) -> Response:
        stream = self.store.latest.get(table)
        if stream is None:
            return answer
        body = self._body_of(answer) or {}
        return rewritten(answer, {**body, key: with_stream(described, stream)})

    async def _update_stream(self, request: Request, body: dict[str, Any], table: str) -> Response:
        enabled, view = stream_specification(body["StreamSpecification"])
        # The table must exist (else DynamoDB's own ResourceNotFoundException) ...
        answer, found = await self._call(request, "DescribeTable", {"TableName": table})
        if found is None or not isinstance(found.get("Table"), dict):
            return answer
        described: dict[str, Any] = found["Table"]
        # ... and the change must be one DynamoDB allows, before anything else is changed.
        if enabled and self.store.enabled(table) is not None:
            raise already_enabled(table)
        if not enabled and self.store.enabled(table) is None:
            raise nothing_to_disable(table)
        rest = {k: v for k, v in body.items() if k != "StreamSpecification"}
        other_changes = bool(set(rest) - {"TableName"})
        if other_changes:
            # Other changes too: upstream makes them (the body is re-encoded without the
            # specification; dynalite checks no signature).
            answer = await self.send(
                Request(
                    method=request.method,
                    path=request.path,
                    query=request.query,
                    headers=request.headers,
                    body=json.dumps(rest, separators=(",", ":")).encode(),
                    http_version=request.http_version,
                    raw_headers=[(k, v) for k, v in request.raw_headers if k != "content-encoding"],
                )
            )
            updated = self._described(answer, "TableDescription")
            if updated is None:
                return answer
            described = updated
        if enabled and view is not None:
            self.store.enable(table, described["TableArn"], described["KeySchema"], view)
        else:
            self.store.disable(table)
        out = {"TableDescription": with_stream(described, self.store.latest.get(table))}
        if other_changes:
            return rewritten(answer, out)
        return aws_json(200, json.dumps(out, separators=(",", ":")).encode())
