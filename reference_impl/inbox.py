"""The inbox read side: newest-first pages that merge a user's own rows with the pointers of the
celebrities they follow (the read-time half of the two-tier fan-out), unread state by a read
watermark (seed 003: mark-all-read is one write, whatever the unread count), and per-item reads.

The merge is pure (``merge_newest_first``); ``Inbox`` is the thin DynamoDB/Redis adapter.
The cursor is the sort key (ULID) of the last item returned: ULIDs are time-ordered and unique,
so "older than the cursor" is correct across every merged source at once.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from ulid import ULID

from reference_impl.config import Config
from reference_impl.follower_pages import FollowerPages
from reference_impl.ids import user_key

MAX_LIMIT = 100
UNREAD_CAP = 1000
CELEBRITY_CACHE_SECONDS = 300
READ_CONCURRENCY = 8
_T = TypeVar("_T")


class BadCursor(ValueError):
    pass


@dataclass(frozen=True)
class InboxItem:
    notification_id: str
    author_id: str
    kind: str
    object_id: str
    source: str  # "inbox" (written at fan-out) or "celebrity" (a merged pointer)
    read: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "notification_id": self.notification_id,
            "author_id": self.author_id,
            "kind": self.kind,
            "object_id": self.object_id,
            "source": self.source,
            "read": self.read,
        }


def parse_cursor(cursor: str | None) -> str | None:
    if cursor in (None, ""):
        return None
    try:
        return str(ULID.from_str(cursor))
    except ValueError as exc:
        raise BadCursor(f"cursor {cursor!r} is not a notification id from an earlier page") from exc


def merge_newest_first(sources: Iterable[list[InboxItem]], limit: int) -> list[InboxItem]:
    """The ``limit`` newest items of several newest-first lists, without duplicates."""
    merged: list[InboxItem] = []
    seen: set[str] = set()
    for item in heapq.merge(*sources, key=lambda i: i.notification_id, reverse=True):
        if item.notification_id in seen:
            continue
        seen.add(item.notification_id)
        merged.append(item)
        if len(merged) == limit:
            break
    return merged


def is_unread(notification_id: str, watermark: str | None, read_ids: set[str]) -> bool:
    """Unread: newer than the read watermark and not read one by one."""
    newer = watermark is None or notification_id > watermark
    return newer and notification_id not in read_ids


class Inbox:
    def __init__(self, config: Config, ddb: Any, redis: Any | None) -> None:
        self.config = config
        self.ddb = ddb
        self.redis = redis
        self.pages = FollowerPages.from_config(config, ddb)
        self._pool = ThreadPoolExecutor(READ_CONCURRENCY, thread_name_prefix="inbox-read")

    # -- sources ----------------------------------------------------------------------------

    def _query(
        self, table: str, pk: str, before: str | None, limit: int, after: str | None = None
    ) -> list[dict[str, Any]]:
        condition = "pk = :pk"
        values: dict[str, Any] = {":pk": {"S": pk}}
        if before and after:
            condition += " AND sk BETWEEN :after AND :before"
            values[":before"] = {"S": before}
            values[":after"] = {"S": after}
        elif before:
            condition += " AND sk < :before"
            values[":before"] = {"S": before}
        elif after:
            condition += " AND sk > :after"
            values[":after"] = {"S": after}
        return self.ddb.query(
            TableName=self.config.table(table),
            KeyConditionExpression=condition,
            ExpressionAttributeValues=values,
            ScanIndexForward=False,
            Limit=limit,
        ).get("Items", [])

    def followed_celebrities(self, tenant: str, user: str) -> list[str]:
        """Authors this user follows who are above the threshold: the tenant's celebrities
        whose follower pages hold the user, one Query each (cached; the cache is dropped when
        a follower list that includes this user changes)."""
        key = f"{tenant}:celebs-followed:{user}"
        if self.redis is not None:
            try:
                cached = self.redis.get(key)
                if cached is not None:
                    return json.loads(cached)
            except Exception:  # a cache outage must not fail a read
                cached = None
        candidates = self.pages.celebrities(tenant)
        found = self._each(lambda c: self.pages.follows(tenant, c, user), candidates)
        celebrities = [c for c, follows in zip(candidates, found, strict=True) if follows]
        if self.redis is not None:
            try:
                self.redis.set(key, json.dumps(sorted(celebrities)), ex=CELEBRITY_CACHE_SECONDS)
            except Exception:
                pass
        return sorted(celebrities)

    def forget_followed(self, tenant: str, users: list[str]) -> None:
        if self.redis is None or not users:
            return
        try:
            self.redis.delete(*[f"{tenant}:celebs-followed:{u}" for u in users])
        except Exception:
            pass  # the TTL bounds the staleness

    def read_state(self, tenant: str, user: str) -> tuple[str | None, set[str]]:
        pk = user_key(tenant, user)
        state = self.ddb.get_item(
            TableName=self.config.table("read_state"), Key={"pk": {"S": pk}}, ConsistentRead=True
        ).get("Item", {})
        watermark = state.get("watermark", {}).get("S")
        reads = self._query("reads", pk, None, 1000, after=watermark)
        return watermark, {r["sk"]["S"] for r in reads}

    def _sources(
        self, tenant: str, user: str, before: str | None, limit: int, after: str | None = None
    ) -> list[list[InboxItem]]:
        own = [
            InboxItem(
                i["sk"]["S"], i["author_id"]["S"], i["kind"]["S"], i["object_id"]["S"], "inbox"
            )
            for i in self._query("inbox", user_key(tenant, user), before, limit, after)
        ]

        def posts_of(celebrity: str) -> list[InboxItem]:
            return [
                InboxItem(i["sk"]["S"], celebrity, i["kind"]["S"], i["object_id"]["S"], "celebrity")
                for i in self._query(
                    "celebrity_posts", user_key(tenant, celebrity), before, limit, after
                )
            ]

        return [own, *self._each(posts_of, self.followed_celebrities(tenant, user))]

    def _each(self, read: Callable[[str], _T], keys: list[str]) -> list[_T]:
        """One read per key, up to READ_CONCURRENCY at a time: a reader following 50
        celebrities waits for the slowest of them, not for their sum."""
        if len(keys) <= 1:
            return [read(k) for k in keys]
        return list(self._pool.map(read, keys))

    # -- the API ----------------------------------------------------------------------------

    def page(self, tenant: str, user: str, limit: int, cursor: str | None) -> dict[str, Any]:
        before = parse_cursor(cursor)
        sources = self._sources(tenant, user, before, limit)
        items = merge_newest_first(sources, limit)
        watermark, reads = self.read_state(tenant, user)
        if "read_flags_ignore_watermark" in self.config.defects:
            watermark = None  # the defect: a page shows only per-item reads, not read-all
        marked = [
            InboxItem(**{**i.__dict__, "read": not is_unread(i.notification_id, watermark, reads)})
            for i in items
        ]
        next_cursor = items[-1].notification_id if len(items) == limit else None
        if "next_cursor_from_own_rows" in self.config.defects and len(sources[0]) < limit:
            next_cursor = None  # the defect: pointers filling the page end the walk
        if next_cursor and "inbox_cursor_skips" in self.config.defects:
            # The defect: the oldest row any source fetched, not the last one merged in.
            next_cursor = min(s[-1].notification_id for s in sources if s)
        return {"items": [i.to_json() for i in marked], "next_cursor": next_cursor}

    def unread_count(self, tenant: str, user: str) -> dict[str, Any]:
        watermark, reads = self.read_state(tenant, user)
        sources = self._sources(tenant, user, None, UNREAD_CAP + 1, after=watermark)
        if "unread_ignores_celebrity_pointers" in self.config.defects:
            sources = sources[:1]  # the defect: the user's own rows only, no merged pointers
        items = merge_newest_first(sources, UNREAD_CAP + 1)
        if "unread_ignores_item_reads" in self.config.defects:
            reads = set()
        count = sum(1 for i in items if i.notification_id not in reads)
        return {"unread": min(count, UNREAD_CAP), "capped": count > UNREAD_CAP}

    def mark_read(self, tenant: str, user: str, notification_id: str) -> None:
        self.ddb.put_item(
            TableName=self.config.table("reads"),
            Item={"pk": {"S": user_key(tenant, user)}, "sk": {"S": notification_id}},
        )

    def mark_all_read(self, tenant: str, user: str) -> str:
        """One write, whatever the unread count: the watermark moves to now."""
        watermark = str(ULID())  # every notification minted before this instant sorts below it
        self.ddb.put_item(
            TableName=self.config.table("read_state"),
            Item={"pk": {"S": user_key(tenant, user)}, "watermark": {"S": watermark}},
        )
        return watermark
