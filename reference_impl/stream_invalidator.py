"""Preference-cache invalidation from DynamoDB Streams: changes made elsewhere.

The Event API drops the cached preferences on every change it makes (write-through). A change
made by anything else (a console edit, a backfill, another service, a Global Tables replica)
reaches the cache through the preferences table's stream: this handler deletes the cache entry
of every key in the batch (the seed: "DynamoDB Streams + an EventBridge Pipe driving
preference-cache invalidation"). Without it the 5-minute TTL bounds the staleness, and a
withdrawn consent could still be honoured for five minutes.

``handler(event, context)`` takes the batch Lambda receives from a DynamoDB stream and answers
``batchItemFailures`` (a Redis error fails the batch from its first record, so the mapping
retries it). ``StreamPoller`` plays the event-source mapping locally against any endpoint with
the DynamoDB Streams API (moto's server locally; dynalite has no streams).

    python -m reference_impl.stream_invalidator --config reference.json
"""

from __future__ import annotations

import argparse
import sys
import threading
from typing import Any

import redis as redis_lib

from reference_impl.aws import client
from reference_impl.config import Config, ConfigError
from reference_impl.ids import preferences_cache_key
from reference_impl.redis_store import connect_redis

CHANGE_EVENTS = ("INSERT", "MODIFY", "REMOVE")


def cache_keys(records: list[dict[str, Any]]) -> list[str]:
    """The cache entries a batch of preferences-table stream records makes stale."""
    keys = []
    for record in records:
        if record.get("eventName") not in CHANGE_EVENTS:
            continue
        pk = record.get("dynamodb", {}).get("Keys", {}).get("pk", {}).get("S", "")
        tenant, sep, user = pk.partition("#")
        if sep and tenant and user:
            keys.append(preferences_cache_key(tenant, user))
    return keys


class Invalidator:
    def __init__(self, redis: Any) -> None:
        self.redis = redis

    def __call__(self, event: dict[str, Any], context: Any = None) -> dict[str, Any]:
        records = event.get("Records", [])
        keys = cache_keys(records)
        if not keys:
            return {"batchItemFailures": []}
        try:
            self.redis.delete(*keys)
        except redis_lib.RedisError:
            # Report the first record: the mapping retries the batch from there.
            first = records[0]["dynamodb"].get("SequenceNumber", "")
            return {"batchItemFailures": [{"itemIdentifier": first}]}
        return {"batchItemFailures": []}


class StreamPoller:
    """Reads every shard of a table's stream from its start and hands batches to the handler,
    retrying a batch the handler failed (bounded by ``max_batches`` per call)."""

    def __init__(self, ddb: Any, streams: Any, table: str, handler: Invalidator) -> None:
        self.streams = streams
        self.handler = handler
        description = ddb.describe_table(TableName=table)["Table"]
        arn = description.get("LatestStreamArn")
        if not arn:
            raise ConfigError(f"table {table} has no stream: enable StreamSpecification")
        self.arn = arn
        self.iterators: dict[str, str | None] = {}

    def _shards(self) -> list[str]:
        shards = self.streams.describe_stream(StreamArn=self.arn)["StreamDescription"]["Shards"]
        return [s["ShardId"] for s in shards]

    def poll_once(self, max_batches: int = 100) -> int:
        """One pass over the shards; returns the records handled."""
        handled = 0
        for shard in self._shards():
            if shard not in self.iterators:
                self.iterators[shard] = self.streams.get_shard_iterator(
                    StreamArn=self.arn, ShardId=shard, ShardIteratorType="TRIM_HORIZON"
                )["ShardIterator"]
            for _ in range(max_batches):
                iterator = self.iterators[shard]
                if iterator is None:
                    break
                response = self.streams.get_records(ShardIterator=iterator, Limit=100)
                records = response.get("Records", [])
                if not records:
                    self.iterators[shard] = response.get("NextShardIterator")
                    break
                result = self.handler({"Records": records})
                if result["batchItemFailures"]:
                    # Keep the iterator: the same batch comes again on the next pass.
                    break
                handled += len(records)
                self.iterators[shard] = response.get("NextShardIterator")
        return handled

    def run(self, stop: threading.Event, interval_s: float = 0.5) -> None:
        while not stop.is_set():
            self.poll_once()
            stop.wait(interval_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="config JSON (default: $FANOUT_CONFIG)")
    args = parser.parse_args(argv)
    config = Config.load_for_main(args.config)
    if config is None:
        return 2
    redis = connect_redis(config)
    poller = StreamPoller(
        client(config, "dynamodb"),
        client(config, "dynamodbstreams"),
        config.table("preferences"),
        Invalidator(redis),
    )
    stop = threading.Event()
    import signal

    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    poller.run(stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
