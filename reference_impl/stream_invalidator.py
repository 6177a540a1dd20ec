"""Preference-cache invalidation from DynamoDB Streams: changes made elsewhere.

The Event API drops the cached preferences on every change it makes (write-through). A change
made by anything else (a console edit, a backfill, another service, a Global Tables replica)
reaches the cache through the preferences table's stream: this handler deletes the cache entry
of every key in the batch (the seed: "DynamoDB Streams + an EventBridge Pipe driving
preference-cache invalidation"). Without it the 5-minute TTL bounds the staleness, and a
withdrawn consent could still be honoured for five minutes.

``handler(event, context)`` takes the batch Lambda receives from a DynamoDB stream and answers
``batchItemFailures`` (a Redis error fails the batch from its first record, so the mapping
retries it). ``StreamPoller`` plays the event-source mapping against any endpoint with the
DynamoDB Streams API (real AWS, moto's server, or the local stack's AWS proxy in front of
dynalite): every shard from its trim horizon, each polled every
``stream_poll_interval_seconds`` (0.25 s: Lambda polls a DynamoDB stream's shards 4 times a
second), a failed batch retried from where it failed, an expired iterator renewed after the
last handled record, a trimmed one restarted at the horizon (and logged: records were lost).

    python -m reference_impl.stream_invalidator --config reference.json [--ready-file PATH]
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import redis as redis_lib
from botocore.exceptions import ClientError

from reference_impl.aws import client
from reference_impl.config import Config, ConfigError
from reference_impl.event_source import run_pollers
from reference_impl.ids import preferences_cache_key
from reference_impl.redis_store import connect_redis

log = logging.getLogger(__name__)

CHANGE_EVENTS = ("INSERT", "MODIFY", "REMOVE")
# Shards change rarely (AWS rolls a stream's shards over every few hours): list them this often,
# and at once when a shard has been read to its end.
DESCRIBE_EVERY_SECONDS = 10.0
MAX_DESCRIBE_PAGES = 100
MAX_ERROR_BACKOFF_SECONDS = 5.0


def cache_keys(records: list[dict[str, Any]], events: tuple[str, ...] = CHANGE_EVENTS) -> list[str]:
    """The cache entries a batch of preferences-table stream records makes stale."""
    keys = []
    for record in records:
        if record.get("eventName") not in events:
            continue
        pk = record.get("dynamodb", {}).get("Keys", {}).get("pk", {}).get("S", "")
        tenant, sep, user = pk.partition("#")
        if sep and tenant and user:
            keys.append(preferences_cache_key(tenant, user))
    return keys


# A consumer that read the table just before a change can write its stale copy back into the
# cache just after the first delete; a second delete this long after the first removes it (the
# "delayed double delete"), so the stale copy lives seconds, not the 5-minute TTL.
SECOND_DELETE_SECONDS = 1.5


class Invalidator:
    def __init__(
        self, redis: Any, clock: Any = time.monotonic, events: tuple[str, ...] = CHANGE_EVENTS
    ) -> None:
        self.redis = redis
        self.clock = clock
        self.events = events
        self._again: list[tuple[float, list[str]]] = []

    def __call__(self, event: dict[str, Any], context: Any = None) -> dict[str, Any]:
        records = event.get("Records", [])
        keys = cache_keys(records, self.events)
        if not keys:
            return {"batchItemFailures": []}
        try:
            self.redis.delete(*keys)
        except redis_lib.RedisError:
            # Report the first record: the mapping retries the batch from there.
            first = records[0]["dynamodb"].get("SequenceNumber", "")
            return {"batchItemFailures": [{"itemIdentifier": first}]}
        self._again.append((self.clock() + SECOND_DELETE_SECONDS, keys))
        return {"batchItemFailures": []}

    def delete_again(self) -> int:
        """The second deletes that are due; returns how many keys. A Redis error keeps them
        for the next call."""
        now = self.clock()
        due = [keys for at, keys in self._again if at <= now]
        if not due:
            return 0
        keys = sorted({k for batch in due for k in batch})
        try:
            self.redis.delete(*keys)
        except redis_lib.RedisError:
            return 0
        self._again = [(at, k) for at, k in self._again if at > now]
        return len(keys)


class StreamPoller:
    """Reads every shard of a table's stream from its trim horizon and hands batches to the
    handler, retrying a batch the handler failed (bounded by ``max_batches`` per shard and
    call). Shards are read independently: invalidation is idempotent, so a child shard read
    before its parent is finished costs nothing."""

    def __init__(
        self,
        ddb: Any,
        streams: Any,
        table: str,
        handler: Invalidator,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.streams = streams
        self.handler = handler
        self.clock = clock
        try:
            description = ddb.describe_table(TableName=table)["Table"]
        except ClientError as exc:
            raise ConfigError(f"table {table}: {exc}") from exc
        arn = description.get("LatestStreamArn")
        if not arn or not description.get("StreamSpecification", {}).get("StreamEnabled"):
            raise ConfigError(f"table {table} has no enabled stream: enable StreamSpecification")
        self.arn = arn
        self.iterators: dict[str, str | None] = {}
        # The last sequence number handled per shard: where a renewed iterator starts.
        self.checkpoints: dict[str, str] = {}
        self.shards: list[str] = []
        self.described_at: float | None = None
        self.trimmed_restarts = 0

    def _describe(self) -> None:
        if (
            self.described_at is not None
            and self.clock() - self.described_at < DESCRIBE_EVERY_SECONDS
        ):
            return
        shards: list[str] = []
        page: dict[str, Any] = {}
        for _ in range(MAX_DESCRIBE_PAGES):
            description = self.streams.describe_stream(StreamArn=self.arn, **page)[
                "StreamDescription"
            ]
            shards += [s["ShardId"] for s in description["Shards"]]
            last = description.get("LastEvaluatedShardId")
            if not last:
                break
            page = {"ExclusiveStartShardId": last}
        self.shards = shards
        self.described_at = self.clock()

    def _iterator(self, shard: str) -> str:
        """A new iterator for ``shard``: after its last handled record, or at its horizon."""
        checkpoint = self.checkpoints.get(shard)
        if checkpoint is not None:
            try:
                return self.streams.get_shard_iterator(
                    StreamArn=self.arn,
                    ShardId=shard,
                    ShardIteratorType="AFTER_SEQUENCE_NUMBER",
                    SequenceNumber=checkpoint,
                )["ShardIterator"]
            except ClientError as exc:
                if exc.response["Error"]["Code"] != "TrimmedDataAccessException":
                    raise
                self._trimmed(shard)
        return self.streams.get_shard_iterator(
            StreamArn=self.arn, ShardId=shard, ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]

    def _trimmed(self, shard: str) -> None:
        self.trimmed_restarts += 1
        log.warning(
            "shard %s: records after %s were trimmed before they were read; restarting at the "
            "horizon (the cache TTL bounds what was missed)",
            shard,
            self.checkpoints.pop(shard, "the start"),
        )

    def poll_once(self, max_batches: int = 100, stop: threading.Event | None = None) -> int:
        """One pass over the shards; returns the records handled. A set ``stop`` ends the pass
        after the batch in hand (a pass over a long backlog is many requests)."""
        self._describe()
        handled = 0
        for shard in self.shards:
            if stop is not None and stop.is_set():
                break
            if shard not in self.iterators:
                self.iterators[shard] = self._iterator(shard)
            for _ in range(max_batches):
                if stop is not None and stop.is_set():
                    break
                iterator = self.iterators[shard]
                if iterator is None:
                    break  # a closed shard read to its end
                try:
                    response = self.streams.get_records(ShardIterator=iterator, Limit=100)
                except ClientError as exc:
                    code = exc.response["Error"]["Code"]
                    if code == "TrimmedDataAccessException":
                        self._trimmed(shard)
                    elif code != "ExpiredIteratorException":
                        raise
                    self.iterators[shard] = self._iterator(shard)
                    continue
                records = response.get("Records", [])
                if not records:
                    self.iterators[shard] = response.get("NextShardIterator")
                    break
                result = self.handler({"Records": records})
                if result["batchItemFailures"]:
                    # Keep the iterator: the same batch comes again on the next pass.
                    break
                handled += len(records)
                self.checkpoints[shard] = records[-1]["dynamodb"]["SequenceNumber"]
                self.iterators[shard] = response.get("NextShardIterator")
                log.info(
                    "invalidated %d cache entr(ies) for %d record(s) of shard %s, up to %s",
                    len(cache_keys(records)),
                    len(records),
                    shard,
                    self.checkpoints[shard],
                )
            if self.iterators[shard] is None:
                self.described_at = None  # the shard closed: its children are listed now
        return handled

    def run(self, stop: threading.Event, interval_s: float = 0.25) -> None:
        """Poll until ``stop``; an error is logged and the next pass waits longer (up to 5 s)."""
        errors = 0
        while not stop.is_set():
            try:
                self.poll_once(stop=stop)
                if isinstance(self.handler, Invalidator):
                    self.handler.delete_again()
                errors = 0
            except Exception:
                errors += 1
                log.exception("stream %s: poll failed (%d in a row)", self.arn, errors)
            stop.wait(min(MAX_ERROR_BACKOFF_SECONDS, interval_s * 2**errors))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="config JSON (default: $FANOUT_CONFIG)")
    parser.add_argument("--ready-file", help="written once the poller runs")
    args = parser.parse_args(argv)
    config = Config.load_for_main(args.config)
    if config is None:
        return 2
    try:
        poller = StreamPoller(
            client(config, "dynamodb"),
            client(config, "dynamodbstreams"),
            config.table("preferences"),
            Invalidator(
                connect_redis(config),
                # The defect: an update of an existing record (the common change) is skipped.
                events=("INSERT", "REMOVE")
                if "invalidator_ignores_modify" in config.defects
                else CHANGE_EVENTS,
            ),
        )
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    interval = config.stream_poll_interval_seconds
    return run_pollers(
        "stream-invalidator", [lambda stop: poller.run(stop, interval)], args.ready_file
    )


if __name__ == "__main__":
    sys.exit(main())
