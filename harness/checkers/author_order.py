"""Per-author ordering (seed 000: Kinesis partition key = author, "so two posts from the same
account fan out in order"): prefix consistency of each author's posts in what readers see.

In every inbox walk, for every author with a post ``n`` in it, each earlier post ``m`` of that
author that the reader should see (the reader follows the author) and that was accepted before
``n`` was sent (happens-before: ``m`` answered before ``n``'s request went out, plus ``slack_s``)
must be in the walk too, when the walk covers ``m``'s place. A system that fans one author's
posts out of order shows a later post while an earlier one is still missing. Posts whose
acceptance is unknown are never required. Readers the run erased or registered again are left
to the ``erasure`` checker. What reaches each device, in which order, is ``push_order``'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.checkers.evidence import Evidence
from harness.checkers.registry import checker
from harness.checkers.verdict import Verdict
from harness.model.inbox import inbox_oracle, walks

EXAMPLES = 5


def check(evidence: Evidence, slack_s: float = 0.0) -> Verdict:

    oracle = inbox_oracle(evidence.population, evidence.history)
    timeline = evidence.timeline
    excluded = set(timeline.erasures) | set(timeline.registrations) if timeline else set()
    judged = pairs = violations = 0
    examples: list[dict[str, Any]] = []
    for walk in walks(evidence.history):
        tenant, user = walk.tenant_id, walk.user_id
        if (tenant, user) in excluded:
            continue
        judged += 1
        seen = set(walk.ids)
        reported: set[str] = set()
        for nid in walk.ids:
            post = oracle.by_id.get((tenant, nid))
            if post is None or not oracle.follows(tenant, user, post.author_id):
                continue  # the inbox checker reports foreign items
            for earlier in oracle.earlier_posts(tenant, post.author_id, post):
                if earlier.end + slack_s >= post.sent or not walk.covers(earlier.notification_id):
                    continue
                pairs += 1
                if earlier.notification_id in seen or earlier.notification_id in reported:
                    continue
                reported.add(earlier.notification_id)
                violations += 1
                if len(examples) < EXAMPLES:
                    examples.append(
                        {"tenant_id": tenant, "user_id": user, "author_id": post.author_id,
                         "seen": nid, "missing_earlier": earlier.notification_id,
                         "earlier_accepted_before_s": round(post.sent - earlier.end, 3),
                         "walk": walk.pages[0].walk}
                    )  # fmt: skip
    counts = {
        "walks": judged,
        "ordered_pairs_checked": pairs,
        "later_seen_earlier_missing": violations,
    }
    return Verdict(
        "author_order", violations == 0, counts, {"slack_s": slack_s, "examples": examples}
    )


@checker(
    "author_order",
    summary="a reader who sees an author's later post also sees every earlier one",
    tolerances={"slack_s": 0.0},
    needs=("inbox",),
    # With the history on disk these kinds come as a frame (see registry.in_memory_for).
    reads=("inject", "inject_info", "read"),
)
def probe(evidence: Evidence, tolerance: Mapping[str, Any]) -> Verdict:
    return check(evidence, slack_s=float(tolerance["slack_s"]))
