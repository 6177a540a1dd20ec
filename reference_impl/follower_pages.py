"""Follower lists stored in pages: one DynamoDB item holds up to ``capacity`` follower ids.

Why pages: the fan-out reads a celebrity's followers a page at a time (a million followers are
a thousand reads, not a million), and a bulk load writes a thousand followers with one item.
Why sorted, disjoint ranges: every page's sort key is its smallest id (``lo``) and no two pages
of an author overlap, so "does user U follow author A" is one Query (the page with the greatest
``lo <= U``) and needs no per-edge reverse index. That lookup is what the inbox read uses to find
the celebrities a reader follows.

The planning is pure (:func:`plan_add`, :func:`plan_remove`); :class:`FollowerPages` is the thin
DynamoDB adapter. Changes to one author's pages are serialised by a lease on the author's
accounts row, since two concurrent adds could otherwise both open pages whose ranges interleave.
"""

from __future__ import annotations

import bisect
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from reference_impl.aws import batch_write
from reference_impl.config import Config
from reference_impl.ids import user_key

SEPARATOR = ","  # never inside an id (reference_impl.ids.valid_id)
LOCK_SECONDS = 30.0


class PagesBusy(RuntimeError):
    """Another writer held the author's follower pages for longer than we could wait."""


@dataclass(frozen=True)
class Page:
    """Sorted, unique follower ids; ``lo`` (the first id) is the page's sort key."""

    ids: tuple[str, ...]

    @property
    def lo(self) -> str:
        return self.ids[0]

    @property
    def hi(self) -> str:
        return self.ids[-1]

    def __contains__(self, follower: object) -> bool:
        i = bisect.bisect_left(self.ids, follower)  # type: ignore[arg-type]
        return i < len(self.ids) and self.ids[i] == follower


@dataclass(frozen=True)
class PagePlan:
    """Pages to write (whole items, keyed by ``lo``), sort keys to delete, and the ids whose
    membership changed (added or removed)."""

    writes: tuple[Page, ...]
    deletes: tuple[str, ...]
    changed: tuple[str, ...]


def _chunks(ids: Sequence[str], size: int) -> list[tuple[str, ...]]:
    return [tuple(ids[i : i + size]) for i in range(0, len(ids), size)]


def _even_chunks(ids: Sequence[str], size: int) -> list[tuple[str, ...]]:
    """As few chunks as fit, of near-equal length: a split page leaves room on both sides."""
    count = -(-len(ids) // size)
    step = -(-len(ids) // count)
    return _chunks(ids, step)


def plan_add(existing: Sequence[Page], new_ids: Iterable[str], capacity: int) -> PagePlan:
    """Where ``new_ids`` go, given the author's pages that could hold them: the page with the
    greatest ``lo`` at or below the smallest new id (if any) and every page whose ``lo`` lies
    within the new ids' range. ``existing`` must be sorted by ``lo`` and disjoint.

    Each new id joins the page with the greatest ``lo`` at or below it (ids below every page
    open pages of their own). A page that would overflow takes what fits when the new ids all
    sort after it (a bulk load appends whole new pages and never rewrites a full one), and is
    split evenly otherwise. A page's ``lo`` never changes, so nothing is deleted.
    """
    if capacity < 1:
        raise ValueError("capacity must be at least 1")
    pages = sorted(existing, key=lambda p: p.lo)
    los = [p.lo for p in pages]
    targets: dict[int, list[str]] = {}
    for follower in sorted(set(new_ids)):
        targets.setdefault(bisect.bisect_right(los, follower) - 1, []).append(follower)
    writes: list[Page] = []
    changed: list[str] = []
    for index, incoming in sorted(targets.items()):
        if index < 0:  # below every page of the author: pages of their own
            writes += [Page(c) for c in _chunks(incoming, capacity)]
            changed += incoming
            continue
        page = pages[index]
        added = [f for f in incoming if f not in page]
        if not added:
            continue
        changed += added
        if len(page.ids) + len(added) <= capacity:
            writes.append(Page(tuple(sorted(page.ids + tuple(added)))))
        elif added[0] > page.hi:
            room = capacity - len(page.ids)
            if room > 0:
                writes.append(Page(page.ids + tuple(added[:room])))
            writes += [Page(c) for c in _chunks(added[max(room, 0) :], capacity)]
        else:
            writes += [Page(c) for c in _even_chunks(sorted(page.ids + tuple(added)), capacity)]
    return PagePlan(tuple(writes), (), tuple(changed))


def plan_remove(page: Page, followers: Iterable[str]) -> PagePlan:
    """The page without ``followers``: rewritten under a new ``lo`` when its first id goes,
    deleted when it empties."""
    gone = {f for f in followers if f in page}
    if not gone:
        return PagePlan((), (), ())
    kept = tuple(f for f in page.ids if f not in gone)
    changed = tuple(sorted(gone))
    if not kept:
        return PagePlan((), (page.lo,), changed)
    deletes = (page.lo,) if kept[0] != page.lo else ()
    return PagePlan((Page(kept),), deletes, changed)


def celebrities_key(tenant: str) -> str:
    """'|' is never part of an id, so this key cannot be any user's ``tenant#user``."""
    return f"{tenant}|celebrities"


def page_item(pk: str, page: Page) -> dict[str, Any]:
    return {
        "pk": {"S": pk},
        "sk": {"S": page.lo},
        "ids": {"S": SEPARATOR.join(page.ids)},
        "n": {"N": str(len(page.ids))},
    }


def page_of(item: dict[str, Any]) -> Page:
    return Page(tuple(item["ids"]["S"].split(SEPARATOR)))


class FollowerPages:
    """The author's follower pages in the ``followers`` table (pk ``tenant#author``, sk the
    page's first follower id), and the lease on the author's ``accounts`` row that serialises
    changes to them."""

    def __init__(
        self,
        ddb: Any,
        followers_table: str,
        accounts_table: str,
        capacity: int,
        clock: Callable[[], float] = time.time,
        lock_wait_seconds: float = 10.0,
    ) -> None:
        self.ddb = ddb
        self.table = followers_table
        self.accounts = accounts_table
        self.capacity = capacity
        self.clock = clock
        self.lock_wait_seconds = lock_wait_seconds

    # -- reads ------------------------------------------------------------------------------

    def page_at_or_below(self, pk: str, follower: str) -> Page | None:
        """The one page that may hold ``follower``: the greatest ``lo`` at or below it."""
        items = self.ddb.query(
            TableName=self.table,
            KeyConditionExpression="pk = :pk AND sk <= :f",
            ExpressionAttributeValues={":pk": {"S": pk}, ":f": {"S": follower}},
            ScanIndexForward=False,
            Limit=1,
            ConsistentRead=True,
        ).get("Items", [])
        return page_of(items[0]) if items else None

    def page_at_or_after(self, tenant: str, author: str, key: str) -> Page | None:
        items = self.ddb.query(
            TableName=self.table,
            KeyConditionExpression="pk = :pk AND sk >= :k",
            ExpressionAttributeValues={":pk": {"S": user_key(tenant, author)}, ":k": {"S": key}},
            Limit=1,
            ConsistentRead=True,
        ).get("Items", [])
        return page_of(items[0]) if items else None

    def follows(self, tenant: str, author: str, follower: str) -> bool:
        page = self.page_at_or_below(user_key(tenant, author), follower)
        return page is not None and follower in page

    def page_keys(
        self, tenant: str, author: str, after: str | None, limit: int
    ) -> tuple[list[str], str | None]:
        """Up to ``limit`` page sort keys after ``after``, and the key to continue from (None
        at the end): the index the fan-out walks, without reading the ids themselves."""
        kwargs: dict[str, Any] = {
            "TableName": self.table,
            "KeyConditionExpression": "pk = :pk",
            "ExpressionAttributeValues": {":pk": {"S": user_key(tenant, author)}},
            "ProjectionExpression": "sk",
            "Limit": limit,
        }
        if after is not None:
            kwargs["ExclusiveStartKey"] = {
                "pk": {"S": user_key(tenant, author)},
                "sk": {"S": after},
            }
        response = self.ddb.query(**kwargs)
        keys = [item["sk"]["S"] for item in response.get("Items", [])]
        more = "LastEvaluatedKey" in response and bool(keys)
        return keys, (keys[-1] if more else None)

    def all_pages(self, tenant: str, author: str) -> Iterator[Page]:
        kwargs: dict[str, Any] = {
            "TableName": self.table,
            "KeyConditionExpression": "pk = :pk",
            "ExpressionAttributeValues": {":pk": {"S": user_key(tenant, author)}},
            "ConsistentRead": True,
        }
        while True:
            response = self.ddb.query(**kwargs)
            yield from (page_of(item) for item in response.get("Items", []))
            if "LastEvaluatedKey" not in response:
                return
            kwargs["ExclusiveStartKey"] = response["LastEvaluatedKey"]

    def _pages_for(self, pk: str, ids: Sequence[str]) -> list[Page]:
        """The pages ``plan_add`` needs: the one at or below the smallest id, and every page
        starting inside the ids' range."""
        pages = []
        first = self.page_at_or_below(pk, ids[0])
        if first is not None:
            pages.append(first)
        kwargs: dict[str, Any] = {
            "TableName": self.table,
            "KeyConditionExpression": "pk = :pk AND sk BETWEEN :lo AND :hi",
            "ExpressionAttributeValues": {
                ":pk": {"S": pk},
                ":lo": {"S": ids[0]},
                ":hi": {"S": ids[-1]},
            },
            "ConsistentRead": True,
        }
        while True:
            response = self.ddb.query(**kwargs)
            pages += [page_of(i) for i in response.get("Items", []) if i["sk"]["S"] != ids[0]]
            if "LastEvaluatedKey" not in response:
                break
            kwargs["ExclusiveStartKey"] = response["LastEvaluatedKey"]
        return pages

    # -- writes -----------------------------------------------------------------------------

    def add(
        self, tenant: str, author: str, followers: Iterable[str]
    ) -> tuple[tuple[str, ...], int]:
        """Add followers; returns (those not there before, the follower count after). The
        count moves only by new followers, so adding one twice does not inflate it."""
        pk = user_key(tenant, author)
        ids = sorted(set(followers))
        if not ids:
            return (), self.count(tenant, author)
        with self._lease(pk) as lease:
            plan = plan_add(self._pages_for(pk, ids), ids, self.capacity)
            self._apply(pk, plan)
            return plan.changed, lease.settle(len(plan.changed))

    def remove(self, tenant: str, author: str, follower: str) -> bool:
        """Remove one follower; True when they were there."""
        pk = user_key(tenant, author)
        with self._lease(pk) as lease:
            page = self.page_at_or_below(pk, follower)
            plan = plan_remove(page, [follower]) if page is not None else PagePlan((), (), ())
            self._apply(pk, plan)
            lease.settle(-len(plan.changed))
            return bool(plan.changed)

    def mark_celebrity(self, tenant: str, author: str) -> None:
        """The tenant's list of authors at or above the threshold: the only authors whose
        follower pages an inbox read has to look into (the others write inbox rows)."""
        self.ddb.update_item(
            TableName=self.accounts,
            Key={"pk": {"S": celebrities_key(tenant)}},
            UpdateExpression="ADD authors :a",
            ExpressionAttributeValues={":a": {"SS": [author]}},
        )

    def celebrities(self, tenant: str) -> list[str]:
        item = self.ddb.get_item(
            TableName=self.accounts, Key={"pk": {"S": celebrities_key(tenant)}}
        ).get("Item", {})
        return sorted(item.get("authors", {}).get("SS", []))

    def count(self, tenant: str, author: str) -> int:
        item = self.ddb.get_item(
            TableName=self.accounts, Key={"pk": {"S": user_key(tenant, author)}}
        ).get("Item", {})
        return int(item.get("follower_count", {}).get("N", "0"))

    def _apply(self, pk: str, plan: PagePlan) -> None:
        # Writes before deletes: a reader between the two sees a follower twice, never zero
        # times (a removed page's ids already live in the rewritten one).
        writes = [{"PutRequest": {"Item": page_item(pk, page)}} for page in plan.writes]
        batch_write(self.ddb, self.table, writes)
        for lo in plan.deletes:
            self.ddb.delete_item(TableName=self.table, Key={"pk": {"S": pk}, "sk": {"S": lo}})

    @classmethod
    def from_config(cls, config: Config, ddb: Any) -> FollowerPages:
        return cls(
            ddb, config.table("followers"), config.table("accounts"), config.follower_page_size
        )

    def _lease(self, pk: str) -> _Lease:
        return _Lease(self, pk)


class _Lease:
    """The author's pages, held for one change: a conditional write on the accounts row, with
    an expiry so a crashed holder does not block the author for ever."""

    def __init__(self, pages: FollowerPages, pk: str) -> None:
        self.pages = pages
        self.pk = pk
        self.owner = uuid.uuid4().hex
        self.settled = False

    def __enter__(self) -> _Lease:
        deadline = time.monotonic() + self.pages.lock_wait_seconds
        pause = 0.005
        while True:
            now = self.pages.clock()
            try:
                self.pages.ddb.update_item(
                    TableName=self.pages.accounts,
                    Key={"pk": {"S": self.pk}},
                    UpdateExpression="SET pages_lock = :o, pages_lock_until = :u",
                    ConditionExpression="attribute_not_exists(pages_lock) OR pages_lock_until < :now",
                    ExpressionAttributeValues={
                        ":o": {"S": self.owner},
                        ":u": {"N": f"{now + LOCK_SECONDS:.3f}"},
                        ":now": {"N": f"{now:.3f}"},
                    },
                )
                return self
            except ClientError as exc:
                if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
                    raise
            if time.monotonic() > deadline:
                raise PagesBusy(f"the follower pages of {self.pk} stayed locked")
            time.sleep(pause)  # a short backoff while another writer finishes its page writes
            pause = min(pause * 2, 0.2)

    def settle(self, delta: int) -> int:
        """Release the lease and move the follower count in one write; returns the count."""
        response = self.pages.ddb.update_item(
            TableName=self.pages.accounts,
            Key={"pk": {"S": self.pk}},
            UpdateExpression="ADD follower_count :n REMOVE pages_lock, pages_lock_until",
            ConditionExpression="pages_lock = :o",
            ExpressionAttributeValues={":n": {"N": str(delta)}, ":o": {"S": self.owner}},
            ReturnValues="UPDATED_NEW",
        )
        self.settled = True
        return int(response["Attributes"]["follower_count"]["N"])

    def __exit__(self, *exc: object) -> None:
        if self.settled:
            return
        try:  # a failed change: release without counting anything
            self.pages.ddb.update_item(
                TableName=self.pages.accounts,
                Key={"pk": {"S": self.pk}},
                UpdateExpression="REMOVE pages_lock, pages_lock_until",
                ConditionExpression="pages_lock = :o",
                ExpressionAttributeValues={":o": {"S": self.owner}},
            )
        except ClientError:
            pass  # the lease expires on its own
