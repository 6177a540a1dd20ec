"""What a reader sees (seed 000's read-time merge, newest-first cursor pagination): each inbox
walk the readers recorded is compared with what the oracle says that reader should see.

For every walk (pages by cursor, newest first):

* ``out_of_order``: ids not strictly newest first, within a page or across a page boundary;
* ``repeated``: an id twice in one walk (a cursor that re-serves a page's last item);
* ``foreign``: an id that is not a post of an author the reader follows in their tenant (another
  user's or tenant's notification, or an id never injected); ``wrong_author``: the item names
  another author than the one the oracle knows;
* ``missing``: a post the reader should see, accepted more than ``lag_s`` before the walk began,
  inside the span the walk covered (down to its last id, or everything when the walk reached the
  end), absent from the walk; ``gap_at_boundary`` counts those that fall between two pages (a
  cursor that skips). A post whose acceptance is unknown is never required.

Readers the run changed (erased, registered again) are judged by the ``erasure`` checker.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.checkers.evidence import Evidence
from harness.checkers.registry import checker
from harness.checkers.verdict import Verdict
from harness.model.inbox import InboxOracle, Walk, inbox_oracle, walks
from harness.model.timeline import Timeline

EXAMPLES = 5


def _excluded(timeline: Timeline | None) -> set[tuple[str, str]]:
    if timeline is None:
        return set()
    return set(timeline.erasures) | set(timeline.registrations)


def judge_walk(walk: Walk, oracle: InboxOracle, lag_s: float) -> dict[str, list[dict[str, Any]]]:
    """The violations of one walk, by kind (each a list of example dicts)."""
    tenant, user = walk.tenant_id, walk.user_id
    found: dict[str, list[dict[str, Any]]] = {}

    def add(kind: str, **fields: Any) -> None:
        found.setdefault(kind, []).append({"tenant_id": tenant, "user_id": user, **fields})

    seen: set[str] = set()
    previous: str | None = None
    for page in walk.pages:
        for nid, author in zip(page.ids, page.authors, strict=False):
            if previous is not None and not nid < previous:
                add("out_of_order", walk=walk.pages[0].walk, page=page.index, id=nid,
                    after=previous)  # fmt: skip
            previous = nid
            if nid in seen:
                add("repeated", walk=page.walk, page=page.index, id=nid)
            seen.add(nid)
            post = oracle.by_id.get((tenant, nid))
            if post is None or not oracle.follows(tenant, user, post.author_id):
                add("foreign", walk=page.walk, page=page.index, id=nid, author=author)
            elif author is not None and author != post.author_id:
                add("wrong_author", walk=page.walk, id=nid, author=author,
                    expected=post.author_id)  # fmt: skip
    boundaries = [
        (a.ids[-1], b.ids[0])
        for a, b in zip(walk.pages, walk.pages[1:], strict=False)
        if a.ids and b.ids
    ]
    for post in oracle.visible(tenant, user):
        if not post.certain or post.notification_id in seen:
            continue
        if not post.end + lag_s < walk.sent or not walk.covers(post.notification_id):
            continue
        at_boundary = any(low > post.notification_id > high for low, high in boundaries)
        add("gap_at_boundary" if at_boundary else "missing", walk=walk.pages[0].walk,
            id=post.notification_id, author=post.author_id,
            accepted_before_walk_s=round(walk.sent - post.end, 3))  # fmt: skip
    return found


def check(evidence: Evidence, lag_s: float = 10.0, min_pages: int = 0) -> Verdict:
    oracle = inbox_oracle(evidence.population, evidence.history)
    excluded = _excluded(evidence.timeline)
    kinds = ("out_of_order", "repeated", "foreign", "wrong_author", "missing", "gap_at_boundary")
    totals = dict.fromkeys(kinds, 0)
    examples: dict[str, list[dict[str, Any]]] = {}
    judged = pages = multi_page = items = 0
    for walk in walks(evidence.history):
        if (walk.tenant_id, walk.user_id) in excluded:
            continue
        judged += 1
        pages += len(walk.pages)
        multi_page += len(walk.pages) >= 2
        items += len(walk.ids)
        for kind, found in judge_walk(walk, oracle, lag_s).items():
            totals[kind] += len(found)
            examples.setdefault(kind, [])
            examples[kind] += found[: EXAMPLES - len(examples[kind])]
    counts = {"walks": judged, "pages": pages, "multi_page_walks": multi_page, "items_seen": items}
    counts |= totals
    # A scenario that promises readers walk several pages says how many walks must have; fewer
    # means the read side was not exercised, which must not read as a pass.
    too_few = multi_page < min_pages
    counts["too_few_multi_page_walks"] = int(too_few)
    valid = not any(totals.values()) and not too_few
    return Verdict("inbox", valid, counts, {"lag_s": lag_s, "examples": examples})


@checker(
    "inbox",
    summary="every reader sees exactly their followed authors' posts, newest first, no gap",
    tolerances={"lag_s": 10.0, "min_multi_page_walks": 0},
    needs=("inbox",),
    # With the history on disk these kinds come as a frame (see registry.in_memory_for).
    reads=("inject", "inject_info", "read"),
)
def probe(evidence: Evidence, tolerance: Mapping[str, Any]) -> Verdict:
    return check(
        evidence,
        lag_s=float(tolerance["lag_s"]),
        min_pages=int(tolerance["min_multi_page_walks"]),
    )
