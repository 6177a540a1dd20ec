"""Follower pages: the pure planning (sorted, disjoint pages; membership by one lookup) and the
DynamoDB adapter against the stack's real dynalite, including concurrent writers."""

from __future__ import annotations

import bisect
import dataclasses
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


# -- a walk task delivered twice -----------------------------------------------------------------


def _walk_worker(stack, **overrides):
    """A fan-out worker with queues of its own (the running workers drain the stack's), pages of
    five followers, two pages a walk step."""
    import json as json_lib

    from reference_impl.config import PAGES_QUEUE, Config
    from reference_impl.fanout_worker import FanoutWorker

    prefix = f"walk-{uuid.uuid4().hex[:8]}"
    base = json_lib.loads(stack.reference_config().to_json())
    config = Config.from_mapping(
        base | {"audit_bucket": None, "queue_prefix": prefix, "follower_page_size": 5,
                "pages_per_walk": 2} | overrides
    )  # fmt: skip
    sqs = stack.info.aws_client("sqs")
    for name in ("push", "email", "in_app", "sms"):
        sqs.create_queue(QueueName=config.queue_name(name))
    pages_url = sqs.create_queue(QueueName=config.queue_name(PAGES_QUEUE))["QueueUrl"]
    sqs.create_queue(QueueName=config.queue_name(PAGES_QUEUE, "-poison"))
    return FanoutWorker(config), sqs, pages_url


def _drain(sqs, url) -> list[dict]:
    """Every task on the queue (deleted as read), parsed."""
    import json as json_lib

    tasks = []
    for _ in range(20):
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0)
        messages = got.get("Messages", [])
        if not messages:
            break
        for m in messages:
            tasks.append(json_lib.loads(m["Body"]))
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    return tasks


@pytest.mark.integration
def test_a_walk_task_delivered_twice_walks_on_once(stack):
    """Issue 25: a walk task hands on the next one, so a copy SQS delivered twice used to walk
    the rest of the list twice, and each further copy doubled it (a 2,500-follower walk ran 54
    times over under celebrity-scale's redelivery fault). Each step is claimed per (event, run,
    key): the second copy walks nothing, a copy that finds the step under way comes back, a
    fan-out posted again (another run) walks again, and a dedup store that cannot be reached
    lets the step run unclaimed rather than stop the fan-out."""
    from datetime import UTC, datetime

    from reference_impl.fanout import FanoutEvent, PageTask, task_entry, walk_claim_key
    from reference_impl.fanout_worker import WalkClaims

    worker, sqs, pages_url = _walk_worker(stack)
    tenant = f"wk-{uuid.uuid4().hex[:8]}"
    worker.pages.add(tenant, "star", [f"u{n:03d}" for n in range(40)])  # 8 pages of 5
    event = FanoutEvent(tenant, "star", "post", "o1", "01JD5V3KX9B9Q0ZC4S6Y2M8N7P",
                        datetime.now(UTC).isoformat())  # fmt: skip
    first = worker.pages.page_keys(tenant, "star", None, 2)[1]
    walk = PageTask("walk", event, "celebrity", first, run="4900001")

    def deliver(task: PageTask, message_id: str = "m1") -> dict:
        body = task_entry(task, "0")["MessageBody"]
        return worker.handle_tasks({"Records": [{"messageId": message_id, "body": body}]}, None)

    assert deliver(walk) == {"batchItemFailures": []}
    handed_on = _drain(sqs, pages_url)
    assert [t["task"] for t in handed_on] == ["page", "page", "walk"]
    assert all(t["run"] == "4900001" for t in handed_on)
    # The copy: claimed and done, so nothing more goes out.
    assert deliver(walk, "m2") == {"batchItemFailures": []}
    assert _drain(sqs, pages_url) == []
    # A copy while the step is under way comes back (its visibility timeout), sends nothing.
    under_way = dataclasses.replace(walk, key=handed_on[-1]["key"])
    claim = walk_claim_key(event, "4900001", under_way.key)
    worker.walk_claims.redis.set(claim, "pending", px=30_000)
    assert deliver(under_way, "m3") == {"batchItemFailures": [{"itemIdentifier": "m3"}]}
    assert _drain(sqs, pages_url) == []
    worker.walk_claims.redis.delete(claim)
    # The event posted again is another run: walked again.
    assert deliver(dataclasses.replace(walk, run="4900777"), "m4") == {"batchItemFailures": []}
    assert len(_drain(sqs, pages_url)) == 3
    # The store out of reach: the step runs unclaimed, the fan-out goes on.
    import redis as redis_lib

    worker.walk_claims = WalkClaims(
        redis_lib.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5)
    )
    assert deliver(dataclasses.replace(walk, run="4900999"), "m5") == {"batchItemFailures": []}
    assert len(_drain(sqs, pages_url)) == 3
