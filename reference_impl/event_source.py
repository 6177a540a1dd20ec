"""Local event-source mappings: what AWS Lambda's pollers do for Kinesis and SQS.

Each poller builds the event Lambda would pass (same record shapes), calls the handler and
honours its ``batchItemFailures`` the way the managed mapping does: for SQS the successes are
deleted and the failures left to reappear after the visibility timeout; for Kinesis the shard
checkpoint stops before the first failure and the batch is retried from there.
"""

from __future__ import annotations

import base64
import faulthandler
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

Handler = Callable[[dict[str, Any], Any], dict[str, Any] | None]
log = logging.getLogger("reference_impl.event_source")


class LambdaContext:
    """The parts of the Lambda context object handlers use."""

    def __init__(self, function_name: str, timeout_seconds: float) -> None:
        self.function_name = function_name
        self._deadline = time.monotonic() + timeout_seconds

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


def _failed_ids(result: dict[str, Any] | None) -> list[str]:
    return [f["itemIdentifier"] for f in (result or {}).get("batchItemFailures", [])]


class SqsPoller:
    """One poller thread per unit of reserved concurrency, as Lambda scales SQS consumers."""

    def __init__(
        self,
        sqs: Any,
        queue_url: str,
        queue_arn: str,
        handler: Handler,
        function_name: str,
        batch_size: int = 10,
        wait_seconds: int = 1,
        timeout_seconds: float = 30.0,
    ) -> None:
        self.sqs = sqs
        self.queue_url = queue_url
        self.queue_arn = queue_arn
        self.handler = handler
        self.function_name = function_name
        self.batch_size = batch_size
        self.wait_seconds = wait_seconds
        self.timeout_seconds = timeout_seconds

    def lambda_event(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        records = []
        for m in messages:
            attrs = {
                name: {
                    "stringValue": value.get("StringValue"),
                    "dataType": value.get("DataType", "String"),
                }
                for name, value in (m.get("MessageAttributes") or {}).items()
            }
            records.append(
                {
                    "messageId": m["MessageId"],
                    "receiptHandle": m["ReceiptHandle"],
                    "body": m["Body"],
                    "attributes": m.get("Attributes", {}),
                    "messageAttributes": attrs,
                    "md5OfBody": m.get("MD5OfBody"),
                    "eventSource": "aws:sqs",
                    "eventSourceARN": self.queue_arn,
                }
            )
        return {"Records": records}

    def poll_once(self) -> int:
        response = self.sqs.receive_message(
            QueueUrl=self.queue_url,
            MaxNumberOfMessages=self.batch_size,
            WaitTimeSeconds=self.wait_seconds,
            AttributeNames=["All"],
            MessageAttributeNames=["All"],
        )
        messages = response.get("Messages", [])
        if not messages:
            # Between batches: a handler with work of its own to finish (a consumer's 'sent'
            # marks a dead store refused) does it now, not at its next batch.
            idle = getattr(self.handler, "idle", None)
            if idle is not None:
                try:
                    idle()
                except Exception:
                    log.exception("%s: idle work failed", self.function_name)
            return 0
        context = LambdaContext(self.function_name, self.timeout_seconds)
        try:
            result = self.handler(self.lambda_event(messages), context)
        except Exception:
            # A handler that throws fails the whole batch: nothing is deleted.
            log.exception("%s: handler raised; the batch will be retried", self.function_name)
            return len(messages)
        failed = set(_failed_ids(result))
        done = [m for m in messages if m["MessageId"] not in failed]
        for start in range(0, len(done), 10):
            entries = [
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                for i, m in enumerate(done[start : start + 10])
            ]
            self.sqs.delete_message_batch(QueueUrl=self.queue_url, Entries=entries)
        return len(messages)

    def run(self, stop: threading.Event) -> None:
        backoff = 0.1
        while not stop.is_set():
            try:
                self.poll_once()
                backoff = 0.1
            except (ClientError, BotoCoreError) as exc:
                log.warning("%s: receive failed (%s); backing off", self.function_name, exc)
                stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)


class KinesisShardPoller:
    """Reads one shard from its checkpoint, calls the handler, checkpoints after success."""

    def __init__(
        self,
        kinesis: Any,
        stream_name: str,
        shard_id: str,
        handler: Handler,
        checkpoints: CheckpointStore,
        function_name: str,
        batch_size: int = 100,
    ) -> None:
        self.kinesis = kinesis
        self.stream_name = stream_name
        self.shard_id = shard_id
        self.handler = handler
        self.checkpoints = checkpoints
        self.function_name = function_name
        self.batch_size = batch_size

    def _iterator(self, at_sequence: str | None = None) -> str:
        kwargs: dict[str, Any] = {"StreamName": self.stream_name, "ShardId": self.shard_id}
        checkpoint = self.checkpoints.get(self.shard_id)
        if at_sequence:
            kwargs.update(
                ShardIteratorType="AT_SEQUENCE_NUMBER", StartingSequenceNumber=at_sequence
            )
        elif checkpoint:
            kwargs.update(
                ShardIteratorType="AFTER_SEQUENCE_NUMBER", StartingSequenceNumber=checkpoint
            )
        else:
            kwargs.update(ShardIteratorType="TRIM_HORIZON")
        return self.kinesis.get_shard_iterator(**kwargs)["ShardIterator"]

    def lambda_event(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "Records": [
                {
                    "kinesis": {
                        "partitionKey": r["PartitionKey"],
                        "sequenceNumber": r["SequenceNumber"],
                        "data": base64.b64encode(r["Data"]).decode(),
                        "approximateArrivalTimestamp": r["ApproximateArrivalTimestamp"].timestamp(),
                    },
                    "eventSource": "aws:kinesis",
                    "eventID": f"{self.shard_id}:{r['SequenceNumber']}",
                }
                for r in records
            ]
        }

    def run(self, stop: threading.Event) -> None:
        iterator: str | None = None
        backoff = 0.1
        while not stop.is_set():
            try:
                if iterator is None:
                    iterator = self._iterator()
                response = self.kinesis.get_records(ShardIterator=iterator, Limit=self.batch_size)
            except (ClientError, BotoCoreError) as exc:
                log.warning("%s: GetRecords failed (%s)", self.function_name, exc)
                iterator = None
                stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            records = response.get("Records", [])
            if not records:
                iterator = response.get("NextShardIterator")
                stop.wait(0.1)  # Lambda polls an idle shard about once a second; we poll faster
                continue
            context = LambdaContext(self.function_name, 60.0)
            try:
                failed = _failed_ids(self.handler(self.lambda_event(records), context))
            except Exception:
                log.exception("%s: handler raised; retrying the batch", self.function_name)
                failed = [records[0]["SequenceNumber"]]
            if failed:
                first = failed[0]
                done = [r["SequenceNumber"] for r in records]
                done = done[: done.index(first)] if first in done else []
                if done:
                    self.checkpoints.put(self.shard_id, done[-1])
                iterator = self._iterator(at_sequence=first)
                stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            backoff = 0.1
            self.checkpoints.put(self.shard_id, records[-1]["SequenceNumber"])
            iterator = response.get("NextShardIterator")


class CheckpointStore:
    """Shard checkpoints in DynamoDB, so a restarted worker resumes where it stopped."""

    def __init__(self, ddb: Any, table: str, stream_name: str) -> None:
        self.ddb = ddb
        self.table = table
        self.stream_name = stream_name

    def _key(self, shard_id: str) -> dict[str, Any]:
        return {"pk": {"S": f"{self.stream_name}#{shard_id}"}}

    def get(self, shard_id: str) -> str | None:
        item = self.ddb.get_item(TableName=self.table, Key=self._key(shard_id), ConsistentRead=True)
        return item.get("Item", {}).get("sequence", {}).get("S")

    def put(self, shard_id: str, sequence: str) -> None:
        self.ddb.put_item(
            TableName=self.table, Item={**self._key(shard_id), "sequence": {"S": sequence}}
        )


def run_pollers(
    name: str,
    targets: list[Callable[[threading.Event], None]],
    ready_file: str | None,
    on_stop: Callable[[], object] | None = None,
) -> int:
    """Run poller loops in threads until SIGTERM/SIGINT; announce readiness via a file.

    ``on_stop`` runs once the pollers have finished their last batch (e.g. the audit sink's
    close, so every record those batches produced is stored before the process exits)."""
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s {name} %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    # A process that has not stopped within its grace gets SIGUSR1 before SIGKILL (the stack's
    # supervisor): every thread's traceback then lands in its log, the evidence of where it hung.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    threads = [threading.Thread(target=t, args=(stop,), daemon=True) for t in targets]
    for thread in threads:
        thread.start()
    if ready_file:
        write_whole(ready_file, json.dumps({"name": name, "threads": len(threads)}))
    print(f"{name} running with {len(threads)} poller thread(s)", flush=True)
    while not stop.wait(0.5):
        pass
    for thread in threads:
        thread.join(timeout=10)
    if on_stop is not None:
        try:
            on_stop()
        except Exception:
            log.exception("%s: shutdown hook failed", name)
            return 1
    return 0


def write_whole(path: str, text: str) -> None:
    """Write ``text`` under a temporary name, then rename: a reader polling for the file sees it
    whole or not at all (a ready file read between creation and write read as empty)."""
    partial = f"{path}.partial-{os.getpid()}"
    Path(partial).write_text(text)
    os.replace(partial, path)
