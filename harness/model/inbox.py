"""What each reader should see in their inbox, from the population and the injected load alone
(seed 000's two-tier fan-out, seed 003's unread state), and what the readers did see.

Every event an author was accepted for belongs in the inbox of each of the author's followers
(own rows written at fan-out below the celebrity threshold, the celebrity's pointer merged at
read time above it: the same set either way), newest first by id. An event whose acceptance is
unknown may or may not be there. The read-side checkers compare the ``read`` rows the load
recorded (pages of a walk, read-alls, per-item reads, unread counts) with this.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
from ulid import ULID

from harness.model.population import Population

UserKey = tuple[str, str]


@dataclass(frozen=True)
class Post:
    notification_id: str
    author_id: str
    sent: float  # the request went out
    end: float  # the system accepted it (nan: unknown)
    certain: bool  # False: its acceptance is unknown

    @property
    def minted_ms(self) -> int:
        """The id's own timestamp (a ULID's first 48 bits, in ms)."""
        return ulid_ms(self.notification_id)


def ulid_ms(value: str) -> int:
    try:
        return int(ULID.from_str(value).milliseconds)
    except ValueError:
        return -1


@dataclass
class InboxOracle:
    population: Population
    # (tenant, author) -> its posts, oldest id first
    posts_by_author: dict[UserKey, list[Post]] = field(default_factory=dict)
    # (tenant, notification id) -> the post
    by_id: dict[tuple[str, str], Post] = field(default_factory=dict)
    _follows: dict[UserKey, list[str]] = field(default_factory=dict)

    def followed(self, tenant: str, user: str) -> list[str]:
        if not self._follows:
            follows: dict[UserKey, list[str]] = defaultdict(list)
            for author in self.population.authors:
                for follower in author.followers:
                    follows[(author.tenant_id, follower)].append(author.user_id)
            self._follows = dict(follows)
        return self._follows.get((tenant, user), [])

    def visible(self, tenant: str, user: str) -> list[Post]:
        """Every post the user should see, oldest id first."""
        posts = [
            p
            for a in self.followed(tenant, user)
            for p in self.posts_by_author.get((tenant, a), [])
        ]
        return sorted(posts, key=lambda p: p.notification_id)

    def follows(self, tenant: str, user: str, author: str) -> bool:
        return author in self.followed(tenant, user)

    def earlier_posts(self, tenant: str, author: str, than: Post) -> list[Post]:
        """The author's posts accepted before ``than`` was sent (happens-before), and so fanned
        out before it by a system that keeps per-author order."""
        return [
            p
            for p in self.posts_by_author.get((tenant, author), [])
            if p.certain and not math.isnan(p.end) and p.end < than.sent
        ]


def inbox_oracle(population: Population, history: pd.DataFrame) -> InboxOracle:
    oracle = InboxOracle(population)
    rows = history[history["kind"].isin(["inject", "inject_info"])]
    for row in rows[
        ["kind", "tenant_id", "author_id", "notification_id", "time", "end"]
    ].itertuples(index=False):
        end = float(row.end) if pd.notna(row.end) else math.nan
        post = Post(str(row.notification_id), str(row.author_id), float(row.time), end,
                    row.kind == "inject")  # fmt: skip
        key = (str(row.tenant_id), str(row.notification_id))
        known = oracle.by_id.get(key)
        if known is not None and (known.certain or not post.certain):
            continue  # a retried event (the same id again) keeps its first acceptance
        oracle.by_id[key] = post
    for (tenant, _), post in oracle.by_id.items():
        oracle.posts_by_author.setdefault((tenant, post.author_id), []).append(post)
    for posts in oracle.posts_by_author.values():
        posts.sort(key=lambda p: p.notification_id)
    return oracle


@dataclass(frozen=True)
class Page:
    walk: str
    index: int
    tenant_id: str
    user_id: str
    sent: float
    end: float
    limit: int
    cursor: str | None
    next_cursor: str | None
    ids: tuple[str, ...]
    authors: tuple[str | None, ...]
    read: tuple[bool, ...]


@dataclass(frozen=True)
class Walk:
    pages: tuple[Page, ...]

    @property
    def tenant_id(self) -> str:
        return self.pages[0].tenant_id

    @property
    def user_id(self) -> str:
        return self.pages[0].user_id

    @property
    def sent(self) -> float:
        return self.pages[0].sent

    @property
    def complete(self) -> bool:
        """The walk reached the end of the inbox (the last page had no next cursor)."""
        return self.pages[-1].next_cursor is None

    @property
    def ids(self) -> list[str]:
        return [i for p in self.pages for i in p.ids]

    def covers(self, notification_id: str) -> bool:
        """Whether the walk's pages span ``notification_id``'s place (newest first, down to
        the last id seen, or to the end when the walk reached it)."""
        ids = self.ids
        if self.complete or not ids:
            return self.complete
        return notification_id >= ids[-1]


def _detail(value: Any) -> dict[str, Any]:
    try:
        parsed = json.loads(value) if isinstance(value, str) else {}
    except json.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def read_rows(history: pd.DataFrame, op: str) -> pd.DataFrame:
    rows = history[(history["kind"] == "read") & (history["reason"] == op)]
    return rows[(rows["status"] >= 200) & (rows["status"] < 300)]


def walks(history: pd.DataFrame) -> list[Walk]:
    """The successful inbox walks the readers recorded: pages of one walk in order, up to the
    first page that failed."""
    pages: dict[str, list[Page]] = defaultdict(list)
    rows = history[(history["kind"] == "read") & (history["reason"] == "page")]
    for row in rows.itertuples(index=False):
        detail = _detail(row.detail)
        if row.status != 200:
            pages[str(detail.get("walk"))].append(None)  # type: ignore[arg-type]
            continue
        pages[str(detail.get("walk"))].append(
            Page(
                walk=str(detail.get("walk")),
                index=int(detail.get("page", 0)),
                tenant_id=str(row.tenant_id),
                user_id=str(row.user_id),
                sent=float(row.time),
                end=float(row.end),
                limit=int(detail.get("limit", 0)),
                cursor=detail.get("cursor"),
                next_cursor=detail.get("next_cursor"),
                ids=tuple(str(i) for i in detail.get("ids") or []),
                authors=tuple(detail.get("authors") or []),
                read=tuple(bool(r) for r in detail.get("read") or []),
            )
        )
    out = []
    for walk_pages in pages.values():
        ordered = []
        for page in sorted(walk_pages, key=lambda p: p.index if p is not None else math.inf):
            if page is None:
                break
            ordered.append(page)
        if ordered and ordered[0].index == 0:
            out.append(Walk(tuple(ordered)))
    return sorted(out, key=lambda w: w.sent)
