"""Fan-out worker: the Lambda behind the Kinesis event stream.

Below the celebrity threshold it writes one inbox row per follower; at or above it, one pointer
row. Either way it pages over the follower list and enqueues one job per follower and channel
(``channels_by_kind``: a mention also goes to email and in-app) on that channel's queue; each
job the queue accepted is an ``enqueued`` record in the audit trail (with an audit bucket).
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Literal

import redis as redis_lib

from reference_impl.audit import AuditSink, seal_record
from reference_impl.audit_keys import AuditKeys, DataKey, User
from reference_impl.aws import batch_write, client, queue_url, send_batch, to_poison
from reference_impl.config import PAGES_QUEUE, Config
from reference_impl.event_source import (
    CheckpointStore,
    KinesisShardPoller,
    SqsPoller,
    run_pollers,
)
from reference_impl.fanout import (
    FanoutEvent,
    MalformedEvent,
    MalformedTask,
    PageTask,
    Tier,
    choose_tier,
    chunks,
    follower_jobs,
    inbox_item,
    parse_event,
    parse_task,
    pointer_item,
    sqs_entries,
    task_entry,
    walk_claim_key,
    walk_tasks,
)
from reference_impl.follower_pages import FollowerPages
from reference_impl.redis_store import connect_redis

log = logging.getLogger("reference_impl.fanout_worker")

# A walk step's claim: held while the step runs (at most half the page queue's visibility
# timeout and 30 s: a copy that found it held comes back after the timeout and finds it either
# done or free, even if the worker holding it died), then marked done for a day (a fan-out's
# walk ends long before).
WALK_LEASE_MS = 30_000
WALK_DONE_SECONDS = 86_400
Claim = Literal["mine", "done", "busy", "unclaimed"]


class WalkStepBusy(RuntimeError):
    """Another copy of this walk step is under way: this one comes back later."""


class WalkClaims:
    """Why: a walk task hands on the next walk task, so a copy of one that SQS delivered twice
    (Standard queues do) would walk the rest of the follower list twice, and every further copy
    doubles it again: under a redelivery fault a 2,500-follower walk ran 54 times over (a page
    duplicated is only that page's jobs, which the dedup store absorbs; a walk duplicated is
    every page after it). Each step is claimed in the dedup store (``SET NX`` with a lease,
    then ``done``) per (event, fan-out run, key). A store that cannot be reached does not stop
    the fan-out: the step runs unclaimed (at worst the old duplicate work, absorbed)."""

    def __init__(self, redis: Any, lease_ms: int = WALK_LEASE_MS) -> None:
        self.redis = redis
        self.lease_ms = lease_ms

    def claim(self, key: str) -> Claim:
        try:
            if self.redis.set(key, "pending", nx=True, px=self.lease_ms):
                return "mine"
            value = self.redis.get(key)
        except redis_lib.RedisError as exc:
            log.warning("walk step %s runs unclaimed: %s", key, exc)
            return "unclaimed"
        return "done" if value == b"done" else "busy"

    def settle(self, key: str, done: bool) -> None:
        """``done``: the step's tasks are on the queue; else give the claim back for a retry."""
        try:
            if done:
                self.redis.set(key, "done", ex=WALK_DONE_SECONDS)
            else:
                self.redis.delete(key)
        except redis_lib.RedisError as exc:
            # Not done: its lease runs out. Done but unmarked: a copy may walk on again.
            log.warning("walk step %s not settled: %s", key, exc)


class FanoutWorker:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.ddb = client(config, "dynamodb")
        self.sqs = client(config, "sqs")
        self.push_queue = queue_url(self.sqs, config.queue_name("push"))
        self.pages_queue = queue_url(self.sqs, config.queue_name(PAGES_QUEUE))
        self.pages_poison_queue = queue_url(self.sqs, config.queue_name(PAGES_QUEUE, "-poison"))
        self.pages = FollowerPages.from_config(config, self.ddb)
        lease_ms = min(WALK_LEASE_MS, config.page_task_visibility_seconds * 1000 // 2)
        self.walk_claims = WalkClaims(connect_redis(config), max(1, lease_ms))
        # Every queue a configured kind can reach, resolved once: a missing one fails the start.
        routed = {c for channels in config.channels_by_kind.values() for c in channels}
        self.queues = {"push": self.push_queue} | {
            c: queue_url(self.sqs, config.queue_name(c)) for c in sorted(routed - {"push"})
        }
        self.audit_sink = AuditSink.from_config(config, "fanout-worker")
        # Each page's followers' audit keys (and the author's), read (one BatchGetItem per 100)
        # and created where missing before its jobs go out: every job names its recipient's key.
        self.audit_keys = (
            AuditKeys(self.ddb, config.table("audit_keys")) if self.audit_sink is not None else None
        )

    def enqueue(
        self, jobs: list[dict[str, Any]], keys: Mapping[User, DataKey] | None = None
    ) -> None:
        """``keys``: the audit keys of the jobs' recipients and author (sealing their records)."""
        by_channel: dict[str, list[dict[str, Any]]] = {}
        for job in jobs:
            by_channel.setdefault(job["channel"], []).append(job)
        for channel, channel_jobs in by_channel.items():
            self._enqueue(self.queues[channel], channel_jobs, keys or {})

    def _enqueue(
        self, queue: str, jobs: list[dict[str, Any]], keys: Mapping[User, DataKey]
    ) -> None:
        for batch in chunks(jobs, 10):
            entries = sqs_entries(batch)
            job_of = {e["Id"]: job for e, job in zip(entries, batch, strict=True)}
            # Only what the queue accepted is audited as enqueued, once per accepted copy.
            send_batch(
                self.sqs,
                queue,
                entries,
                lambda accepted, job_of=job_of: self.audit_enqueued(
                    [job_of[e["Id"]] for e in accepted], keys
                ),
                ignore_failed="send_batch_ignores_failed" in self.config.defects,
            )

    def audit_enqueued(
        self, jobs: list[dict[str, Any]], keys: Mapping[User, DataKey] | None = None
    ) -> None:
        if self.audit_sink is None or not jobs:
            return
        keys = keys or {}
        at = datetime.now(UTC).isoformat()
        for job in jobs:
            tenant = job["tenant_id"]
            record = {
                "outcome": "enqueued",
                "at": at,
                "tenant_id": tenant,
                "notification_id": job["notification_id"],
                "recipient_user_id": job["recipient_user_id"],
                "author_id": job["author_id"],
                "kind": job["kind"],
                "channel": job["channel"],
            }
            recipient = keys.get((tenant, job["recipient_user_id"]))
            author = keys.get((tenant, job["author_id"]))
            self.audit_sink.add(seal_record(record, recipient, author))

    def page_keys(self, event: FanoutEvent, followers: list[str]) -> dict[User, DataKey]:
        """The audit keys of a page's followers and of the author (none without an audit)."""
        if self.audit_keys is None:
            return {}
        tenant = event.tenant_id
        return self.audit_keys.ensure(
            [(tenant, f) for f in followers] + [(tenant, event.author_id)]
        )

    def fan_out(self, event: FanoutEvent, run: str | None = None) -> dict[str, Any]:
        """Choose the tier, write the pointer of a celebrity post, then walk the follower
        pages: an author with one page is fanned out here; more pages go out as tasks on the
        page queue, so no call, this one included, is O(followers)."""
        count = self.pages.count(event.tenant_id, event.author_id)
        tier = choose_tier(count, self.config.celebrity_threshold)
        if tier == "celebrity":
            self.ddb.put_item(
                TableName=self.config.table("celebrity_posts"),
                Item=pointer_item(event, "inbox_ttl_in_milliseconds" in self.config.defects),
            )
        return {"tier": tier, **self.walk(event, tier, None, run)}

    def walk(
        self, event: FanoutEvent, tier: Tier, after: str | None, run: str | None = None
    ) -> dict[str, Any]:
        """List the next pages after ``after`` and hand each on as a page task, and the rest as
        the next walk task; a single page is fanned out here. ``run`` (the fan-out's Kinesis
        sequence number) claims the step, so that a copy of this walk task does not walk on
        twice (:class:`WalkClaims`); raises :class:`WalkStepBusy` while another copy runs."""
        keys, rest = self.pages.page_keys(
            event.tenant_id, event.author_id, after, self.config.pages_per_walk
        )
        if after is None and rest is None and len(keys) <= 1:
            return {"jobs": sum(self.fan_out_page(event, tier, key) for key in keys)}
        claim_key = walk_claim_key(event, run, after) if run is not None else None
        claim: Claim = self.walk_claims.claim(claim_key) if claim_key else "unclaimed"
        if claim == "done":
            return {"page_tasks": 0, "walk_on": False, "already_walked": True}
        if claim == "busy":
            raise WalkStepBusy(claim_key)
        try:
            self.send_tasks(walk_tasks(event, tier, keys, rest, run))
        except BaseException:
            if claim_key is not None and claim == "mine":
                self.walk_claims.settle(claim_key, done=False)
            raise
        if claim_key is not None and claim == "mine":
            self.walk_claims.settle(claim_key, done=True)
        return {"page_tasks": len(keys), "walk_on": rest is not None}

    def fan_out_page(self, event: FanoutEvent, tier: Tier, key: str) -> int:
        """One page: inbox rows (write tier) and a job per (follower, channel). A page
        rewritten since it was listed (an erasure moved its first id) is found at its new
        first id; at worst a page is fanned out twice, which the dedup store absorbs."""
        page = self.pages.page_at_or_after(event.tenant_id, event.author_id, key)
        if page is None:
            return 0
        if tier == "write":
            ms = "inbox_ttl_in_milliseconds" in self.config.defects
            batch_write(
                self.ddb,
                self.config.table("inbox"),
                [{"PutRequest": {"Item": inbox_item(event, f, ms)}} for f in page.ids],
            )
        keys = self.page_keys(event, list(page.ids))
        jobs = follower_jobs(event, page.ids, self.config.channels_for(event.kind))
        if keys:
            for job in jobs:
                job["audit_kid"] = keys[(event.tenant_id, job["recipient_user_id"])].kid
        self.enqueue(jobs, keys)
        return len(jobs)

    def send_tasks(self, tasks: list[PageTask]) -> None:
        for batch in chunks(tasks, 10):
            send_batch(
                self.sqs,
                self.pages_queue,
                [task_entry(t, str(i)) for i, t in enumerate(batch)],
                ignore_failed="send_batch_ignores_failed" in self.config.defects,
            )

    def handle_tasks(self, event: dict[str, Any], context: Any) -> dict[str, Any]:
        """The Lambda behind the page queue: a walk or a page per record; a failed one comes
        back (``batchItemFailures``), a malformed one goes to the poison queue."""
        failures = []
        for record in event.get("Records", []):
            try:
                task = parse_task(record.get("body") or "")
            except MalformedTask as exc:
                log.error("poison page task %s: %s", record.get("messageId"), exc)
                to_poison(self.sqs, self.pages_poison_queue, record, str(exc))
                continue
            try:
                if task.kind == "walk":
                    result = self.walk(task.event, task.tier, task.key, task.run)
                else:
                    assert task.key is not None
                    result = {"jobs": self.fan_out_page(task.event, task.tier, task.key)}
            except WalkStepBusy as exc:
                log.info("walk step %s under way in another copy: this one comes back", exc)
                failures.append({"itemIdentifier": record["messageId"]})
                continue
            except Exception:
                log.exception("page task %s failed", record.get("messageId"))
                failures.append({"itemIdentifier": record["messageId"]})
                continue
            log.info(
                "%s",
                json.dumps(
                    {
                        "audit": "enqueued",
                        "tenant_id": task.event.tenant_id,
                        "notification_id": task.event.notification_id,
                        "task": task.kind,
                        "key": task.key,
                        **result,
                    }
                ),
            )
        if self.config.audit_flush_before_ack and self.audit_sink is not None:
            self.audit_sink.flush()
        return {"batchItemFailures": failures}

    def __call__(self, event: dict[str, Any], context: Any) -> dict[str, Any]:
        """Kinesis batch; report the first failure so the mapping retries from there."""
        result = self.fan_out_batch(event)
        if self.config.audit_flush_before_ack and self.audit_sink is not None:
            # Before the checkpoint moves on: an S3 error fails the batch, which is retried.
            self.audit_sink.flush()
        return result

    def fan_out_batch(self, event: dict[str, Any]) -> dict[str, Any]:
        for record in event.get("Records", []):
            sequence = record["kinesis"]["sequenceNumber"]
            try:
                fanout_event = parse_event(base64.b64decode(record["kinesis"]["data"]))
            except MalformedEvent as exc:
                # Retrying a record that can never parse would block the shard forever.
                log.error("skipping malformed record %s: %s", sequence, exc)
                continue
            try:
                result = self.fan_out(fanout_event, run=sequence)
            except Exception:
                log.exception("fan-out of %s failed", fanout_event.notification_id)
                return {"batchItemFailures": [{"itemIdentifier": sequence}]}
            log.info(
                "%s",
                json.dumps(
                    {
                        "audit": "enqueued",
                        "tenant_id": fanout_event.tenant_id,
                        "notification_id": fanout_event.notification_id,
                        **result,
                    }
                ),
            )
        return {"batchItemFailures": []}


_worker: FanoutWorker | None = None


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """The Lambda entry point (Kinesis trigger with ReportBatchItemFailures)."""
    global _worker
    if _worker is None:
        _worker = FanoutWorker(Config.load())
    result = _worker(event, context)
    if _worker.audit_sink is not None:
        # Stored before the shard checkpoint moves past these records (see push_consumer).
        _worker.audit_sink.flush()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="reference fan-out worker (Kinesis poller)")
    parser.add_argument("--config", help="config JSON (default: $FANOUT_CONFIG)")
    parser.add_argument("--ready-file", help="written once the pollers run")
    args = parser.parse_args(argv)
    config = Config.load_for_main(args.config)
    if config is None:
        return 2
    worker = FanoutWorker(config)
    kinesis = client(config, "kinesis")
    shards = kinesis.list_shards(StreamName=config.stream_name)["Shards"]
    checkpoints = CheckpointStore(worker.ddb, config.table("checkpoints"), config.stream_name)
    pollers = [
        KinesisShardPoller(
            kinesis, config.stream_name, s["ShardId"], worker, checkpoints, "fanout-worker"
        ).run
        for s in shards
    ]
    # The page queue's consumers: a Lambda's reserved concurrency, one poller per unit.
    pages_arn = worker.sqs.get_queue_attributes(
        QueueUrl=worker.pages_queue, AttributeNames=["QueueArn"]
    )["Attributes"]["QueueArn"]
    pollers += [
        # One task per invocation: a page is already a thousand jobs, and a batch of ten
        # handled in turn would outlast the visibility timeout of the last ones.
        SqsPoller(
            worker.sqs,
            worker.pages_queue,
            pages_arn,
            worker.handle_tasks,
            "fanout-pages",
            batch_size=1,
        ).run
        for _ in range(config.fanout_page_threads)
    ]
    sink = worker.audit_sink
    return run_pollers(
        "fanout-worker", pollers, args.ready_file, on_stop=sink.close if sink else None
    )


if __name__ == "__main__":
    sys.exit(main())
