"""Fan-out planning: pure functions from an accepted event to inbox rows and delivery jobs."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from reference_impl.ids import user_key, valid_id

INBOX_TTL = timedelta(days=90)
Tier = Literal["write", "celebrity"]
_EVENT_FIELDS = ("tenant_id", "author_id", "kind", "object_id", "notification_id", "accepted_at")


class MalformedEvent(ValueError):
    """A stream record that can never be fanned out; retrying it would block the shard."""


@dataclass(frozen=True)
class FanoutEvent:
    tenant_id: str
    author_id: str
    kind: str
    object_id: str
    notification_id: str
    accepted_at: str


def parse_event(data: bytes) -> FanoutEvent:
    try:
        raw = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise MalformedEvent(f"not JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise MalformedEvent("record is not a JSON object")
    missing = [f for f in _EVENT_FIELDS if not isinstance(raw.get(f), str) or not raw.get(f)]
    if missing:
        raise MalformedEvent(f"missing field(s): {', '.join(missing)}")
    if not valid_id(raw["tenant_id"]) or not valid_id(raw["author_id"]):
        raise MalformedEvent("tenant_id or author_id is not a valid id")
    return FanoutEvent(**{f: raw[f] for f in _EVENT_FIELDS})


def choose_tier(follower_count: int, threshold: int) -> Tier:
    """Below the threshold write one inbox row per follower; at or above it, one pointer."""
    return "celebrity" if follower_count >= threshold else "write"


def _expires_at(event: FanoutEvent, in_milliseconds: bool = False) -> str:
    """DynamoDB's TTL is epoch seconds; ``in_milliseconds`` is the defect
    inbox_ttl_in_milliseconds (a date 50,000 years away: the row never expires)."""
    expires = (datetime.fromisoformat(event.accepted_at) + INBOX_TTL).timestamp()
    return str(int(expires * 1000 if in_milliseconds else expires))


def inbox_item(
    event: FanoutEvent, follower_id: str, ttl_in_milliseconds: bool = False
) -> dict[str, Any]:
    """The follower's inbox row (DynamoDB item), SK = the notification ULID, 90-day TTL."""
    return {
        "pk": {"S": user_key(event.tenant_id, follower_id)},
        "sk": {"S": event.notification_id},
        "author_id": {"S": event.author_id},
        "kind": {"S": event.kind},
        "object_id": {"S": event.object_id},
        "expires_at": {"N": _expires_at(event, ttl_in_milliseconds)},
    }


def pointer_item(event: FanoutEvent, ttl_in_milliseconds: bool = False) -> dict[str, Any]:
    """The one row a celebrity post writes, merged into followers' inboxes at read time."""
    return {
        "pk": {"S": user_key(event.tenant_id, event.author_id)},
        "sk": {"S": event.notification_id},
        "kind": {"S": event.kind},
        "object_id": {"S": event.object_id},
        "expires_at": {"N": _expires_at(event, ttl_in_milliseconds)},
    }


def channel_job(event: FanoutEvent, follower_id: str, channel: str) -> dict[str, Any]:
    """One delivery job: the event, its recipient and the channel whose queue carries it."""
    return {**asdict(event), "recipient_user_id": follower_id, "channel": channel}


def push_job(event: FanoutEvent, follower_id: str) -> dict[str, Any]:
    return channel_job(event, follower_id, "push")


def follower_jobs(
    event: FanoutEvent, followers: Iterable[str], channels: Sequence[str]
) -> list[dict[str, Any]]:
    """A job per (follower, channel); a follower's channels stay together in the batch."""
    return [channel_job(event, f, c) for f in followers for c in channels]


def sqs_entries(jobs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """SendMessageBatch entries; every message carries the tenant as a message attribute."""
    return [
        {
            "Id": str(i),
            "MessageBody": json.dumps(job, separators=(",", ":")),
            "MessageAttributes": {
                "tenant_id": {"DataType": "String", "StringValue": job["tenant_id"]}
            },
        }
        for i, job in enumerate(jobs)
    ]


def chunks(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    batch: list[Any] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


# -- the fan-out of fan-out: page tasks ------------------------------------------------------

TaskKind = Literal["walk", "page"]


@dataclass(frozen=True)
class PageTask:
    """``walk``: list the next follower pages after ``key`` (None: from the start) and hand
    each on; ``page``: fan the event out to the page that starts at ``key``."""

    kind: TaskKind
    event: FanoutEvent
    tier: Tier
    key: str | None
    # Which fan-out of the event this task belongs to (the Kinesis record's sequence number:
    # the same across that record's retries, new for an event posted again): a walk step is
    # claimed per (event, run, key), so a duplicated walk task does not fork the walk.
    run: str | None = None


class MalformedTask(ValueError):
    """A page task no retry can fix: it goes to the poison queue."""


def task_entry(task: PageTask, entry_id: str) -> dict[str, Any]:
    """A SendMessageBatch entry; like every job, it names its tenant as a message attribute."""
    body = {"task": task.kind, "event": asdict(task.event), "tier": task.tier, "key": task.key}
    if task.run is not None:
        body["run"] = task.run
    return {
        "Id": entry_id,
        "MessageBody": json.dumps(body, separators=(",", ":")),
        "MessageAttributes": {
            "tenant_id": {"DataType": "String", "StringValue": task.event.tenant_id}
        },
    }


def parse_task(body: str) -> PageTask:
    try:
        raw = json.loads(body)
        event = parse_event(json.dumps(raw["event"]).encode())
        kind, tier, key, run = raw["task"], raw["tier"], raw["key"], raw.get("run")
    except (MalformedEvent, KeyError, TypeError, AttributeError, json.JSONDecodeError) as exc:
        raise MalformedTask(f"not a page task: {exc}") from exc
    if kind not in ("walk", "page") or tier not in ("write", "celebrity"):
        raise MalformedTask(f"unknown task {kind!r} or tier {tier!r}")
    if (key is not None and not valid_id(key)) or (kind == "page" and key is None):
        raise MalformedTask("key must be a follower id (and is required for a page task)")
    if run is not None and (not isinstance(run, str) or not run.isalnum() or len(run) > 128):
        raise MalformedTask("run must be a Kinesis sequence number")
    return PageTask(kind, event, tier, key, run)


def walk_tasks(
    event: FanoutEvent,
    tier: Tier,
    page_keys: Sequence[str],
    rest: str | None,
    run: str | None = None,
) -> list[PageTask]:
    """A page task per listed page, and a walk task for what the listing did not reach."""
    tasks = [PageTask("page", event, tier, key, run) for key in page_keys]
    if rest is not None:
        tasks.append(PageTask("walk", event, tier, rest, run))
    return tasks


def walk_claim_key(event: FanoutEvent, run: str, after: str | None) -> str:
    """The dedup store key that claims one walk step of one fan-out of an event."""
    return f"fanout:walk:{event.tenant_id}:{event.notification_id}:{run}:{after or ''}"
