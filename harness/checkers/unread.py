"""Unread counts after mark-all-read (seed 003: a read watermark makes read-all one write).

After a read-all acknowledged at ``t``, the unread count counts only what is newer than ``t``,
less what was read one by one. "Newer" is by the notification's own id (a ULID minted when the
event was accepted), which is how the design orders an inbox. Each recorded unread count is
judged against bounds the oracle can stand behind, given that requests overlap:

* the watermark is at least the send instant of the latest read-all acknowledged before the
  count was sent (a watermark never moves back), and at most the answer instant of the latest
  read-all sent before the count was answered;
* a post counts for sure when its id's time is past the highest possible watermark, it was
  accepted more than ``lag_s`` before the count was sent, and no per-item read of it could have
  landed; it may count when its id's time is at or past the lowest possible watermark, it was
  sent before the count was answered, and no per-item read of it surely landed.

A count below the sure ones or above the possible ones is a violation (``undercount`` /
``overcount``). A count marked ``capped`` must be at least what it caps. The same bounds judge
the ``read`` flag of every item on the inbox pages readers walked (seed 003: the page shows
what is read): an item a read-all or a per-item read surely covered shown unread
(``read_shown_unread``), or one nothing could have covered shown read (``unread_shown_read``).
Readers the run erased or registered again are judged by the ``erasure`` checker.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import pandas as pd

from harness.checkers.evidence import Evidence
from harness.checkers.registry import checker
from harness.checkers.verdict import Verdict
from harness.model.inbox import inbox_oracle, read_rows, walks

EXAMPLES = 5
UNREAD_CAP = 1000
BAD_FLAGS = ("read_shown_unread", "unread_shown_read")


def _ops(history: pd.DataFrame, op: str) -> dict[tuple[str, str], list[tuple[float, float, Any]]]:
    """(tenant, user) -> [(sent, answered, row)] of the successful ``op`` reads."""
    out: dict[tuple[str, str], list[tuple[float, float, Any]]] = defaultdict(list)
    for row in read_rows(history, op).itertuples(index=False):
        end = float(row.end) if pd.notna(row.end) else math.inf
        out[(str(row.tenant_id), str(row.user_id))].append((float(row.time), end, row))
    return out


def bounds(
    posts: list[Any],
    read_alls: list[tuple[float, float, Any]],
    marks: list[tuple[float, float, Any]],
    sent: float,
    answered: float,
    lag_s: float,
    skew_s: float,
) -> tuple[int, int]:
    """The (lowest, highest) unread count a correct system may answer for a count sent at
    ``sent`` and answered at ``answered``."""
    low_mark = max((s for s, e, _ in read_alls if e < sent), default=-math.inf)
    high_mark = max((e for s, e, _ in read_alls if s < answered), default=-math.inf)
    low_ms = math.floor((low_mark - skew_s) * 1000) if low_mark > -math.inf else -math.inf
    high_ms = math.ceil((high_mark + skew_s) * 1000) if high_mark > -math.inf else -math.inf
    surely_read = {str(r.notification_id) for s, e, r in marks if e < sent}
    maybe_read = {str(r.notification_id) for s, e, r in marks if s < answered}
    low = high = 0
    for post in posts:
        minted = post.minted_ms
        if (
            post.certain
            and minted > high_ms
            and post.end + lag_s < sent
            and post.notification_id not in maybe_read
        ):
            low += 1
        if minted >= low_ms and post.sent < answered and post.notification_id not in surely_read:
            high += 1
    return low, high


def flag_error(
    post: Any,
    read: bool,
    read_alls: list[tuple[float, float, Any]],
    marks: list[tuple[float, float, Any]],
    sent: float,
    answered: float,
    skew_s: float,
) -> str | None:
    """Whether the ``read`` flag an inbox page (sent at ``sent``, answered at ``answered``)
    gave ``post`` is one no correct system gives: ``read_shown_unread`` when a read-all whose
    watermark surely covers the post (acknowledged before the page was sent, and the post
    minted before that read-all was sent) or a per-item read of it acknowledged before the page
    was sent; ``unread_shown_read`` when no read-all that could have landed covers it and no
    per-item read of it was sent before the page was answered. None when the flag may be right."""
    low_mark = max((s for s, e, _ in read_alls if e < sent), default=-math.inf)
    high_mark = max((e for s, e, _ in read_alls if s < answered), default=-math.inf)
    low_ms = math.floor((low_mark - skew_s) * 1000) if low_mark > -math.inf else -math.inf
    high_ms = math.ceil((high_mark + skew_s) * 1000) if high_mark > -math.inf else -math.inf
    nid, minted = post.notification_id, post.minted_ms
    surely_read = minted < low_ms or any(
        str(r.notification_id) == nid for _, e, r in marks if e < sent
    )
    maybe_read = minted <= high_ms or any(
        str(r.notification_id) == nid for s, _, r in marks if s < answered
    )
    if surely_read and not read:
        return "read_shown_unread"
    if not maybe_read and read:
        return "unread_shown_read"
    return None


def page_flags(
    evidence: Evidence,
    oracle: Any,
    read_alls: dict[tuple[str, str], list[tuple[float, float, Any]]],
    marks: dict[tuple[str, str], list[tuple[float, float, Any]]],
    excluded: set[tuple[str, str]],
    skew_s: float,
) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """Every item of every inbox page a reader walked, its ``read`` flag judged by
    :func:`flag_error` (items the oracle does not know are the ``inbox`` checker's)."""
    counts = {"page_items_judged": 0, "read_shown_unread": 0, "unread_shown_read": 0}
    examples: list[dict[str, Any]] = []
    for walk in walks(evidence.history):
        key = (walk.tenant_id, walk.user_id)
        if key in excluded:
            continue
        for page in walk.pages:
            if len(page.read) != len(page.ids):
                continue  # a system whose pages carry no read flags
            for nid, read in zip(page.ids, page.read, strict=True):
                post = oracle.by_id.get((walk.tenant_id, nid))
                if post is None:
                    continue
                counts["page_items_judged"] += 1
                kind = flag_error(post, read, read_alls.get(key, []), marks.get(key, []),
                                  page.sent, page.end, skew_s)  # fmt: skip
                if kind is not None:
                    counts[kind] += 1
                    if len(examples) < EXAMPLES:
                        examples.append({"kind": kind, "tenant_id": key[0], "user_id": key[1],
                                         "notification_id": nid, "read": read,
                                         "sent": page.sent})  # fmt: skip
    return counts, examples


def check(evidence: Evidence, lag_s: float = 10.0, skew_s: float = 0.01) -> Verdict:
    oracle = inbox_oracle(evidence.population, evidence.history)
    timeline = evidence.timeline
    excluded = set(timeline.erasures) | set(timeline.registrations) if timeline else set()
    read_alls = _ops(evidence.history, "read_all")
    marks = _ops(evidence.history, "mark_read")
    counts = {"unread_counts": 0, "read_alls": sum(len(v) for v in read_alls.values()),
              "per_item_reads": sum(len(v) for v in marks.values()), "undercount": 0,
              "overcount": 0}  # fmt: skip
    examples: list[dict[str, Any]] = []
    for key, observed in _ops(evidence.history, "unread").items():
        if key in excluded:
            continue
        posts = oracle.visible(*key)
        for sent, answered, row in observed:
            detail = json.loads(row.detail) if isinstance(row.detail, str) else {}
            count, capped = detail.get("unread"), bool(detail.get("capped"))
            if not isinstance(count, int):
                continue
            counts["unread_counts"] += 1
            low, high = bounds(posts, read_alls.get(key, []), marks.get(key, []), sent,
                               answered, lag_s, skew_s)  # fmt: skip
            if capped:
                low, high = min(low, UNREAD_CAP), max(high, UNREAD_CAP)
            kind = "undercount" if count < low else "overcount" if count > high else None
            if kind is not None:
                counts[kind] += 1
                if len(examples) < EXAMPLES:
                    examples.append({"kind": kind, "tenant_id": key[0], "user_id": key[1],
                                     "unread": count, "allowed": [low, high], "sent": sent})  # fmt: skip
    flags, flag_examples = page_flags(evidence, oracle, read_alls, marks, excluded, skew_s)
    counts.update(flags)
    examples += flag_examples[: max(0, EXAMPLES - len(examples))]
    valid = not any(counts[k] for k in ("undercount", "overcount", *BAD_FLAGS))
    return Verdict("unread", valid, counts, {"lag_s": lag_s, "examples": examples})


@checker(
    "unread",
    summary="after read-all, unread counts and page read flags only show what is newer, less "
    "what was read one by one",
    tolerances={"lag_s": 10.0, "skew_s": 0.01},
    needs=("unread", "read_all"),
    # With the history on disk these kinds come as a frame (see registry.in_memory_for).
    reads=("inject", "inject_info", "read"),
)
def probe(evidence: Evidence, tolerance: Mapping[str, Any]) -> Verdict:
    return check(evidence, lag_s=float(tolerance["lag_s"]), skew_s=float(tolerance["skew_s"]))
