"""Follower pages: the pure planning (sorted, disjoint pages; membership by one lookup) and the
DynamoDB adapter against the stack's real dynalite, including concurrent writers."""

from __future__ import annotations

import bisect
import random
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_impl.follower_pages import FollowerPages, Page, plan_add, plan_remove


def apply_plan(pages: dict[str, Page], plan) -> dict[str, Page]:
    out = dict(pages)
    for page in plan.writes:
        out[page.lo] = page
    for lo in plan.deletes:
        out.pop(lo, None)
    return out


def candidates(pages: dict[str, Page], ids: list[str]) -> list[Page]:
    """What the adapter hands plan_add: the page at or below the smallest id, and every page
    starting inside the ids' range."""
    los = sorted(pages)
    ids = sorted(ids)
    chosen = set()
    i = bisect.bisect_right(los, ids[0]) - 1
    if i >= 0:
        chosen.add(los[i])
    chosen |= {lo for lo in los if ids[0] <= lo <= ids[-1]}
    return [pages[lo] for lo in sorted(chosen)]


def lookup(pages: dict[str, Page], follower: str) -> bool:
    """The reader's one Query: the page with the greatest lo at or below the follower."""
    los = sorted(pages)
    i = bisect.bisect_right(los, follower) - 1
    return i >= 0 and follower in pages[los[i]]


def check_invariants(pages: dict[str, Page], capacity: int) -> None:
    ordered = [pages[lo] for lo in sorted(pages)]
    for page in ordered:
        assert 1 <= len(page.ids) <= capacity
        assert list(page.ids) == sorted(set(page.ids))
    for a, b in zip(ordered, ordered[1:], strict=False):
        assert a.hi < b.lo, f"pages overlap: {a.lo}..{a.hi} and {b.lo}..{b.hi}"


ids_strategy = st.lists(st.integers(0, 400).map(lambda n: f"u{n:04d}"), min_size=1, max_size=60)


@settings(max_examples=300, deadline=None)
@given(st.lists(ids_strategy, min_size=1, max_size=12), st.integers(1, 9))
def test_any_sequence_of_adds_keeps_pages_disjoint_and_every_follower_findable(batches, capacity):
    pages: dict[str, Page] = {}
    everyone: set[str] = set()
    for batch in batches:
        plan = plan_add(candidates(pages, batch), batch, capacity)
        assert set(plan.changed) == set(batch) - everyone  # only new ones count
        pages = apply_plan(pages, plan)
        everyone |= set(batch)
        check_invariants(pages, capacity)
    assert {f for p in pages.values() for f in p.ids} == everyone
    for n in range(0, 401, 7):
        follower = f"u{n:04d}"
        assert lookup(pages, follower) == (follower in everyone)


@settings(max_examples=200, deadline=None)
@given(ids_strategy, st.data())
def test_removals_keep_pages_disjoint_and_forget_only_the_removed(ids, data):
    pages = apply_plan({}, plan_add([], ids, 4))
    gone = set(data.draw(st.lists(st.sampled_from(sorted(set(ids))), max_size=len(ids))))
    for follower in sorted(gone):
        los = sorted(pages)
        page = pages[los[bisect.bisect_right(los, follower) - 1]]
        pages = apply_plan(pages, plan_remove(page, [follower]))
        check_invariants(pages, 4)
    for follower in set(ids):
        assert lookup(pages, follower) == (follower not in gone)


def test_a_bulk_load_appends_whole_pages_and_never_rewrites_a_full_one():
    first = [f"u{n:04d}" for n in range(0, 1000)]
    pages = apply_plan({}, plan_add([], first, 1000))
    second = [f"u{n:04d}" for n in range(1000, 2000)]
    plan = plan_add(candidates(pages, second), second, 1000)
    assert [p.lo for p in plan.writes] == ["u1000"]  # one new item, the full page untouched
    # Arriving out of order (parallel loaders): the earlier range opens a page of its own.
    early = apply_plan({}, plan_add([], second, 1000))
    plan = plan_add(candidates(early, first), first, 1000)
    assert [p.lo for p in plan.writes] == ["u0000"]


def test_an_insert_into_a_full_page_splits_it_evenly():
    pages = apply_plan({}, plan_add([], [f"u{n:02d}" for n in range(0, 20, 2)], 10))
    plan = plan_add(candidates(pages, ["u05"]), ["u05"], 10)
    assert sorted(len(p.ids) for p in plan.writes) == [5, 6]
    assert plan.changed == ("u05",)


def test_removing_a_page_first_id_moves_it_and_removing_the_last_deletes_it():
    page = Page(("a1", "a2", "a3"))
    plan = plan_remove(page, ["a1"])
    assert [p.lo for p in plan.writes] == ["a2"] and plan.deletes == ("a1",)
    assert plan_remove(Page(("a1",)), ["a1"]).deletes == ("a1",)
    assert plan_remove(page, ["zz"]).changed == ()


def test_capacity_must_be_positive():
    with pytest.raises(ValueError):
        plan_add([], ["a"], 0)


# -- against dynalite -------------------------------------------------------------------------


@pytest.fixture
def pages(stack):
    config = stack.reference_config()
    ddb = stack.info.aws_client("dynamodb")
    return FollowerPages(ddb, config.table("followers"), config.table("accounts"), capacity=7)


@pytest.mark.integration
def test_concurrent_adds_to_one_author_keep_the_pages_disjoint(pages):
    tenant, author = f"fp-{uuid.uuid4().hex[:8]}", "star"
    rng = random.Random(5)
    everyone = [f"u{n:04d}" for n in range(300)]
    batches = [rng.sample(everyone, 25) for _ in range(16)]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda b: pages.add(tenant, author, b), batches))
    expected = set().union(*map(set, batches))
    assert sum(len(added) for added, _ in results) == len(expected)  # nothing counted twice
    assert pages.count(tenant, author) == len(expected)
    stored = {p.lo: p for p in pages.all_pages(tenant, author)}
    check_invariants(stored, 7)
    assert {f for p in stored.values() for f in p.ids} == expected
    for follower in everyone[::3]:
        assert pages.follows(tenant, author, follower) == (follower in expected)
    assert pages.remove(tenant, author, sorted(expected)[0])
    assert pages.count(tenant, author) == len(expected) - 1
    assert not pages.follows(tenant, author, sorted(expected)[0])


@pytest.mark.integration
def test_page_keys_walk_the_index_in_order_in_slices(pages):
    tenant, author = f"fp-{uuid.uuid4().hex[:8]}", "star"
    pages.add(tenant, author, [f"u{n:03d}" for n in range(50)])  # 8 pages of up to 7
    keys, after, walked = [], None, 0
    while True:
        slice_, after = pages.page_keys(tenant, author, after, 3)
        keys += slice_
        walked += 1
        if after is None:
            break
    assert keys == sorted(keys) and len(keys) == 8 and walked == 3
    assert pages.page_at_or_after(tenant, author, keys[2]).lo == keys[2]


@pytest.mark.integration
def test_page_tasks_get_a_visibility_timeout_of_their_own(stack):
    """A page task is a thousand jobs: under the channel queues' short timeout a slow one would
    be handed to a second worker and its page enqueued twice (bench_inbox saw 53,696 jobs for
    50,000 followers)."""
    config = stack.reference_config()
    sqs = stack.info.aws_client("sqs")

    def visibility(name: str) -> int:
        url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
        attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["VisibilityTimeout"])
        return int(attrs["Attributes"]["VisibilityTimeout"])

    assert visibility(config.queue_name("pages")) == config.page_task_visibility_seconds
    assert visibility(config.queue_name("push")) == config.visibility_timeout_seconds
    assert config.page_task_visibility_seconds > config.visibility_timeout_seconds
