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
``overcount``). A count marked ``capped`` must be at least what it caps. Readers the run
erased or registered again are judged by the ``erasure`` checker.
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
from harness.model.inbox import inbox_oracle, read_rows

EXAMPLES = 5
UNREAD_CAP = 1000


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
    valid = counts["undercount"] == 0 and counts["overcount"] == 0
    return Verdict("unread", valid, counts, {"lag_s": lag_s, "examples": examples})


@checker(
    "unread",
    summary="after read-all, unread counts only what is newer, less what was read one by one",
    tolerances={"lag_s": 10.0, "skew_s": 0.01},
    needs=("unread", "read_all"),
    # With the history on disk these kinds come as a frame (see registry.in_memory_for).
    reads=("inject", "inject_info", "read"),
)
def probe(evidence: Evidence, tolerance: Mapping[str, Any]) -> Verdict:
    return check(evidence, lag_s=float(tolerance["lag_s"]), skew_s=float(tolerance["skew_s"]))
