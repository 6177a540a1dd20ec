"""Benchmark: the inbox's promises, over real sockets on the local stack, in one run.

Run: ``.venv/bin/python benchmarks/bench_inbox.py --out reports/bench/inbox.json``
(``--quick`` for a small version: at most 1,000 unread, followers up to 1,000, fewer repetitions).

Measured, in this order (the fan-out counts first, while the tables are still small):

1. ``writes_per_celebrity_post``: for follower counts below and at/above the configured
   celebrity threshold, one post through ``POST /v1/events`` -> Kinesis -> the fan-out worker.
   The rows it wrote are the before/after difference of whole-table counts (Scan
   ``Select=COUNT``) of the inbox and celebrity_posts tables, taken once the push queue holds
   one job per follower and the counts have stopped changing. Above the threshold it must be
   exactly 1 (one pointer row), whatever the follower count.
2. ``read_all``: users with 1 ... 10,000 unread rows (bulk-loaded with BatchWriteItem in the
   fan-out's own row format, checked with ``GET .../unread-count``); ``POST .../inbox/read-all``
   timed many times per user, the users interleaved so all see the same machine load, each timed
   call preceded by an untimed delete of the user's watermark so that every call really faces
   the full unread count. Promise: p50(10,000) / p50(1) <= 1.5; unread-count is 0 afterwards.
3. ``inbox_read``: p50/p99 of ``GET .../inbox?limit=20`` and of the next page by cursor, for
   readers following 0, 5 and 50 celebrities (each with posts) beside their own inbox rows; the
   two pages are checked against the newest 40 of everything the reader should see.

The push consumer is not started: nothing here measures delivery, and the push queue then
counts the fan-out's jobs exactly. This machine's cores are shared, so the promises are ratios
within the run, not absolute latencies. Every loop is bounded in count and in time.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
from ulid import ULID

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from harness.stack.supervisor import Stack, wait_until  # noqa: E402
from reference_impl.aws import batch_write  # noqa: E402
from reference_impl.fanout import FanoutEvent, inbox_item, pointer_item  # noqa: E402
from reference_impl.ids import user_key  # noqa: E402
from reference_impl.inbox import UNREAD_CAP  # noqa: E402

MAX_RATIO = 1.5
PAGE = 20
# Everything the benchmark needs; the push consumer and the provider simulators stay off.
PARTS = ("redis", "dynamodb", "kinesis", "sqs", "event-api", "fanout-worker")


@dataclass(frozen=True)
class Settings:
    unread_counts: tuple[int, ...]
    read_all_reps: int
    celebrity_threshold: int
    follower_counts: tuple[int, ...]
    followed_celebrities: tuple[int, ...]
    posts_per_celebrity: int
    own_rows: int
    page_reps: int
    budget_s: float  # per measured phase


FULL = Settings(
    unread_counts=(1, 10, 100, 1_000, 10_000),
    read_all_reps=400,
    celebrity_threshold=10_000,
    follower_counts=(10, 1_000, 10_000, 50_000),
    followed_celebrities=(0, 5, 50),
    posts_per_celebrity=20,
    own_rows=200,
    page_reps=200,
    budget_s=300.0,
)
QUICK = Settings(
    unread_counts=(1, 10, 100, 1_000),
    read_all_reps=60,
    celebrity_threshold=100,
    follower_counts=(10, 100, 1_000),
    followed_celebrities=(0, 5, 50),
    posts_per_celebrity=5,
    own_rows=50,
    page_reps=15,
    budget_s=30.0,
)


def progress(message: str) -> None:
    print(f"[inbox] {message}", flush=True)


def latency(samples: list[float]) -> dict[str, Any]:
    """p50/p99 in ms; p99 by linear interpolation, so it is defined for small samples too."""
    ordered = sorted(samples)
    if not ordered:
        return {"samples": 0}
    rank = 0.99 * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    p99 = ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
    return {
        "samples": len(ordered),
        "p50_ms": round(statistics.median(ordered), 3),
        "p99_ms": round(p99, 3),
        "mean_ms": round(statistics.fmean(ordered), 3),
        "max_ms": round(ordered[-1], 3),
    }


def timed(call: Callable[[], httpx.Response]) -> tuple[float, httpx.Response]:
    started = time.perf_counter()
    response = call()
    return (time.perf_counter() - started) * 1000.0, response


def ok_json(response: httpx.Response) -> dict[str, Any]:
    if response.status_code != 200:
        raise RuntimeError(
            f"{response.request.method} {response.request.url.path} answered "
            f"{response.status_code}: {response.text[:300]}"
        )
    return response.json()


def past_ids(count: int, start_s: float, end_s: float, rng: random.Random) -> list[str]:
    """``count`` ULIDs minted at random instants between ``start_s`` and ``end_s`` (epoch
    seconds), newest first. Minted in the past so that a read-all's watermark (minted at 'now')
    sorts above all of them, as it would for notifications that arrived before the click."""
    ids = {str(ULID.from_timestamp(rng.uniform(start_s, end_s))) for _ in range(count)}
    while len(ids) < count:  # a random collision is astronomically unlikely; stay exact anyway
        ids.add(str(ULID.from_timestamp(rng.uniform(start_s, end_s))))
    return sorted(ids, reverse=True)


def fanout_event(tenant: str, author: str, notification_id: str) -> FanoutEvent:
    accepted = ULID.from_str(notification_id).datetime.isoformat()
    return FanoutEvent(
        tenant, author, "post", f"obj-{notification_id[-6:]}", notification_id, accepted
    )


def load_rows(ddb: Any, table: str, items: list[dict[str, Any]]) -> float:
    """BatchWriteItem in 25s; returns rows per second."""
    started = time.perf_counter()
    for start in range(0, len(items), 25):
        batch_write(ddb, table, [{"PutRequest": {"Item": i}} for i in items[start : start + 25]])
    return len(items) / max(time.perf_counter() - started, 1e-9)


def count_items(ddb: Any, table: str, pk: str | None = None, max_pages: int = 10_000) -> int:
    """Item count with Select=COUNT: one partition by Query, or the whole table by Scan."""
    kwargs: dict[str, Any] = {"TableName": table, "Select": "COUNT"}
    if pk is not None:
        kwargs["KeyConditionExpression"] = "pk = :pk"
        kwargs["ExpressionAttributeValues"] = {":pk": {"S": pk}}
    total = 0
    for _ in range(max_pages):
        page = ddb.query(**kwargs) if pk is not None else ddb.scan(**kwargs)
        total += page["Count"]
        if "LastEvaluatedKey" not in page:
            return total
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
    raise RuntimeError(f"counting {table} did not finish within {max_pages} pages")


def queue_total(sqs: Any, url: str) -> int:
    attrs = sqs.get_queue_attributes(
        QueueUrl=url,
        AttributeNames=[
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed",
        ],
    )["Attributes"]
    return sum(int(v) for v in attrs.values())


def follow(api: httpx.Client, tenant: str, author: str, followers: Iterable[str]) -> None:
    """Through the API, 1,000 a call: it writes the followers, the read side's reverse index
    and the follower count the worker chooses the tier by."""
    batch: list[str] = []
    for follower in followers:
        batch.append(follower)
        if len(batch) == 1000:
            ok_json(
                api.post(
                    f"/v1/tenants/{tenant}/users/{author}/followers:batch",
                    json={"followers": batch},
                )
            )
            batch = []
    if batch:
        ok_json(
            api.post(
                f"/v1/tenants/{tenant}/users/{author}/followers:batch", json={"followers": batch}
            )
        )


def audit_records(log: Path, notification_id: str) -> list[dict[str, Any]]:
    """The fan-out worker's audit lines for one notification (one per completed fan-out)."""
    records = []
    for line in log.read_text(errors="replace").splitlines():
        start = line.find('{"audit"')
        if start < 0 or notification_id not in line:
            continue
        try:
            records.append(json.loads(line[start:]))
        except json.JSONDecodeError:
            continue
    # Only the per-fan-out summary carries the tier; per-job records (if any) do not.
    return [r for r in records if r.get("notification_id") == notification_id and "tier" in r]


# -- 1. writes per celebrity post --------------------------------------------------------------


def fanout_case(stack: Stack, api: httpx.Client, followers: int) -> dict[str, Any]:
    """One post by an author with ``followers`` followers; the rows its fan-out wrote."""
    config = stack.reference_config()
    ddb = stack.info.aws_client("dynamodb")
    sqs = stack.info.aws_client("sqs")
    push_queue = sqs.get_queue_url(QueueName=config.queue_name("push"))["QueueUrl"]
    inbox, pointers = config.table("inbox"), config.table("celebrity_posts")
    tenant = f"bench-fanout-{followers}"
    started = time.perf_counter()
    follow(api, tenant, "author", (f"f{i}" for i in range(followers)))
    follow_s = time.perf_counter() - started
    progress(f"fan-out: {followers} followers registered in {follow_s:.1f}s")

    inbox_before, pointers_before = count_items(ddb, inbox), count_items(ddb, pointers)
    queue_before = queue_total(sqs, push_queue)
    posted = time.perf_counter()
    response = api.post(
        "/v1/events",
        json={"tenant_id": tenant, "author_id": "author", "kind": "post", "object_id": "p1"},
    )
    if response.status_code != 202:
        raise RuntimeError(f"POST /v1/events answered {response.status_code}: {response.text}")
    nid = response.json()["notification_id"]
    # A page's jobs are enqueued after its rows are written: all jobs there means all rows.
    wait_until(
        lambda: queue_total(sqs, push_queue) - queue_before >= followers,
        60 + followers / 200,
        f"{followers} push jobs of {nid}",
        interval=0.2,
    )
    fanout_s = time.perf_counter() - posted
    # Then the counts must hold still: a late or repeated write would show up here.
    last: tuple[int, int] | None = None
    steady = 0
    deadline = time.monotonic() + 60
    while steady < 3 and time.monotonic() < deadline:
        now = (count_items(ddb, inbox), count_items(ddb, pointers))
        steady = steady + 1 if now == last else 0
        last = now
        time.sleep(0.2)
    if steady < 3 or last is None:
        raise RuntimeError(f"row counts kept changing after the fan-out of {nid}")
    log = Path(stack.info.parts["fanout-worker"].log)
    # The worker's log line is corroboration only (the rows and the job count are the proof),
    # so a worker that logs differently does not fail the benchmark.
    audit_deadline = time.monotonic() + 10
    audits = audit_records(log, nid)
    while not audits and time.monotonic() < audit_deadline:
        time.sleep(0.2)
        audits = audit_records(log, nid)
    inbox_rows, pointer_rows = last[0] - inbox_before, last[1] - pointers_before
    jobs = queue_total(sqs, push_queue) - queue_before
    tier = "celebrity" if followers >= config.celebrity_threshold else "write"
    case = {
        "followers": followers,
        "tier_expected": tier,
        "tier_audited": audits[-1].get("tier") if audits else None,
        "fanout_attempts_audited": len(audits),
        "inbox_rows": inbox_rows,
        "celebrity_rows": pointer_rows,
        "writes_per_event": inbox_rows + pointer_rows,
        "expected_writes": 1 if tier == "celebrity" else followers,
        "push_jobs": jobs,
        "follow_setup_s": round(follow_s, 2),
        "post_to_all_jobs_s": round(fanout_s, 2),
    }
    case["ok"] = (
        case["writes_per_event"] == case["expected_writes"]
        and case["tier_audited"] in (tier, None)
        and jobs == followers
        and (tier == "write" or (inbox_rows == 0 and pointer_rows == 1))
    )
    progress(
        f"fan-out: {followers} followers ({tier}) -> {inbox_rows} inbox + {pointer_rows} "
        f"pointer row(s), {jobs} jobs in {fanout_s:.1f}s"
    )
    return case


def bench_fanout_writes(stack: Stack, api: httpx.Client, settings: Settings) -> dict[str, Any]:
    cases = [fanout_case(stack, api, n) for n in settings.follower_counts]
    celebrity_cases = [c for c in cases if c["tier_expected"] == "celebrity"]
    return {
        "celebrity_threshold": stack.reference_config().celebrity_threshold,
        "cases": cases,
        "writes_per_event": {str(c["followers"]): c["writes_per_event"] for c in cases},
        "celebrity_cases": len(celebrity_cases),
        "one_write_per_celebrity_post": bool(celebrity_cases)
        and all(
            c["ok"] and c["writes_per_event"] == 1 and c["celebrity_rows"] == 1
            for c in celebrity_cases
        ),
        "one_row_per_follower_below_threshold": all(
            c["ok"] for c in cases if c["tier_expected"] == "write"
        ),
    }


# -- 2. read-all ----------------------------------------------------------------------------


def bench_read_all(stack: Stack, api: httpx.Client, settings: Settings) -> dict[str, Any]:
    config = stack.reference_config()
    ddb = stack.info.aws_client("dynamodb")
    tenant = "bench-readall"
    rng = random.Random(3)
    now = time.time()
    users = {n: f"unread{n}" for n in settings.unread_counts}
    checks: dict[str, Any] = {}
    for n, user in users.items():
        ids = past_ids(n, now - 3600, now - 5, rng)
        items = [
            inbox_item(fanout_event(tenant, f"a{i % 50}", nid), user) for i, nid in enumerate(ids)
        ]
        rate = load_rows(ddb, config.table("inbox"), items)
        stored = count_items(ddb, config.table("inbox"), user_key(tenant, user))
        unread = ok_json(api.get(f"/v1/tenants/{tenant}/users/{user}/unread-count"))
        expected = {"unread": min(n, UNREAD_CAP), "capped": n > UNREAD_CAP}
        checks[str(n)] = {
            "rows_loaded": n,
            "rows_stored": stored,
            "load_rows_per_s": round(rate, 1),
            "unread_count_before": unread,
            "unread_count_expected": expected,
            "newest_row": ids[0],
        }
        progress(f"read-all: {n} unread loaded ({rate:.0f} rows/s); unread-count says {unread}")

    read_state = config.table("read_state")

    def reset(user: str) -> None:
        # Untimed: every timed read-all faces the full unread count, not a fresh watermark.
        ddb.delete_item(TableName=read_state, Key={"pk": {"S": user_key(tenant, user)}})

    def read_all(user: str) -> tuple[float, httpx.Response]:
        return timed(lambda: api.post(f"/v1/tenants/{tenant}/users/{user}/inbox/read-all"))

    for _ in range(30):  # warm the connection and the server's code paths
        reset("warmup")
        ok_json(read_all("warmup")[1])
    samples: dict[int, list[float]] = {n: [] for n in users}
    counts = list(users)
    deadline = time.perf_counter() + settings.budget_s
    for rep in range(settings.read_all_reps):
        if rep >= 10 and time.perf_counter() > deadline:
            progress(f"read-all: budget spent after {rep} rounds")
            break
        # Rotate the order so no count is always first (or last) after the reset.
        for n in counts[rep % len(counts) :] + counts[: rep % len(counts)]:
            reset(users[n])
            ms, response = read_all(users[n])
            watermark = ok_json(response)["watermark"]
            if watermark <= checks[str(n)]["newest_row"]:
                raise RuntimeError(f"watermark {watermark} is not above the newest row")
            samples[n].append(ms)
        if (rep + 1) % 100 == 0:
            progress(f"read-all: {rep + 1} rounds")

    result: dict[str, Any] = {"unread_counts": {}}
    for n, user in users.items():
        after = ok_json(api.get(f"/v1/tenants/{tenant}/users/{user}/unread-count"))
        check = checks[str(n)]
        check.pop("newest_row")
        result["unread_counts"][str(n)] = {
            **latency(samples[n]),
            **check,
            "unread_count_after": after,
        }
    lowest, highest = str(min(users)), str(max(users))
    table = result["unread_counts"]
    ratio = table[highest]["p50_ms"] / table[lowest]["p50_ms"]
    result["ratio_p50"] = {"of": f"{highest}/{lowest}", "value": round(ratio, 3)}
    result["ratio_p99"] = {
        "of": f"{highest}/{lowest}",
        "value": round(table[highest]["p99_ms"] / table[lowest]["p99_ms"], 3),
    }
    result["max_ratio"] = MAX_RATIO
    result["unread_seen_before"] = all(
        v["rows_stored"] == v["rows_loaded"]
        and v["unread_count_before"] == v["unread_count_expected"]
        for v in table.values()
    )
    result["unread_zero_after"] = all(
        v["unread_count_after"]["unread"] == 0 for v in table.values()
    )
    result["read_all_flat"] = ratio <= MAX_RATIO
    progress(f"read-all: p50 ratio {highest}/{lowest} = {ratio:.2f} (target <= {MAX_RATIO})")
    return result


# -- 3. inbox pages with celebrities --------------------------------------------------------


def bench_inbox_read(stack: Stack, api: httpx.Client, settings: Settings) -> dict[str, Any]:
    config = stack.reference_config()
    ddb = stack.info.aws_client("dynamodb")
    tenant = "bench-read"
    rng = random.Random(4)
    now = time.time()
    celebrities = [f"celeb{k}" for k in range(max(settings.followed_celebrities))]
    readers = {k: f"reader{k}" for k in settings.followed_celebrities}

    posts: dict[str, list[str]] = {}
    pointer_rows = []
    for celebrity in celebrities:
        posts[celebrity] = past_ids(settings.posts_per_celebrity, now - 3600, now - 5, rng)
        pointer_rows += [
            pointer_item(fanout_event(tenant, celebrity, nid)) for nid in posts[celebrity]
        ]
    load_rows(ddb, config.table("celebrity_posts"), pointer_rows)
    for k, celebrity in enumerate(celebrities):
        # Only the count chooses the tier and the read side's "is a celebrity": raise it to the
        # threshold instead of registering thousands of followers per celebrity.
        ddb.update_item(
            TableName=config.table("accounts"),
            Key={"pk": {"S": user_key(tenant, celebrity)}},
            UpdateExpression="ADD follower_count :n",
            ExpressionAttributeValues={":n": {"N": str(config.celebrity_threshold)}},
        )
        follow(api, tenant, celebrity, [r for c, r in readers.items() if c > k])
    expected: dict[int, list[str]] = {}
    for k, reader in readers.items():
        own = past_ids(settings.own_rows, now - 3600, now - 5, rng)
        rows = [
            inbox_item(fanout_event(tenant, f"friend{i % 20}", nid), reader)
            for i, nid in enumerate(own)
        ]
        load_rows(ddb, config.table("inbox"), rows)
        everything = set(own).union(*(posts[c] for c in celebrities[:k]))
        expected[k] = sorted(everything, reverse=True)[: 2 * PAGE]
    progress(
        f"inbox read: {len(celebrities)} celebrities x {settings.posts_per_celebrity} posts, "
        f"{len(readers)} readers with {settings.own_rows} own rows each"
    )

    def page(reader: str, cursor: str | None) -> tuple[float, dict[str, Any]]:
        params: dict[str, Any] = {"limit": PAGE}
        if cursor:
            params["cursor"] = cursor
        ms, response = timed(
            lambda: api.get(f"/v1/tenants/{tenant}/users/{reader}/inbox", params=params)
        )
        return ms, ok_json(response)

    correct: dict[str, bool] = {}
    sources: dict[str, list[str]] = {}
    for k, reader in readers.items():  # also fills the followed-celebrities cache, as in use
        first = page(reader, None)[1]
        second = page(reader, first["next_cursor"])[1]
        got = [i["notification_id"] for i in first["items"] + second["items"]]
        correct[str(k)] = got == expected[k] and len(first["items"]) == PAGE
        sources[str(k)] = sorted({i["source"] for i in first["items"] + second["items"]})

    samples = {k: {"page1": [], "page2": []} for k in readers}
    deadline = time.perf_counter() + settings.budget_s
    keys = list(readers)
    for rep in range(settings.page_reps):
        if rep >= 5 and time.perf_counter() > deadline:
            progress(f"inbox read: budget spent after {rep} rounds")
            break
        for k in keys[rep % len(keys) :] + keys[: rep % len(keys)]:
            ms1, first = page(readers[k], None)
            ms2, _ = page(readers[k], first["next_cursor"])
            samples[k]["page1"].append(ms1)
            samples[k]["page2"].append(ms2)
        if (rep + 1) % 50 == 0:
            progress(f"inbox read: {rep + 1} rounds")

    result: dict[str, Any] = {
        "page_size": PAGE,
        "posts_per_celebrity": settings.posts_per_celebrity,
        "own_rows": settings.own_rows,
        "followed_celebrities": {},
    }
    for k in readers:
        result["followed_celebrities"][str(k)] = {
            "page1": latency(samples[k]["page1"]),
            "page2": latency(samples[k]["page2"]),
            "pages_correct": correct[str(k)],
            "sources_seen": sources[str(k)],
        }
        p1 = result["followed_celebrities"][str(k)]["page1"]
        p2 = result["followed_celebrities"][str(k)]["page2"]
        progress(
            f"inbox read: {k} celebrities: page1 p50 {p1['p50_ms']:.1f} ms p99 {p1['p99_ms']:.1f} "
            f"ms, page2 p50 {p2['p50_ms']:.1f} ms p99 {p2['p99_ms']:.1f} ms"
        )
    result["pages_correct"] = all(correct.values())
    return result


# -- report ---------------------------------------------------------------------------------


def table(report: dict[str, Any]) -> str:
    lines = [
        "read-all (POST .../inbox/read-all)",
        f"  {'unread':>8}{'p50 ms':>10}{'p99 ms':>10}{'n':>6}  after",
    ]
    for n, row in report["read_all"]["unread_counts"].items():
        lines.append(
            f"  {n:>8}{row['p50_ms']:>10.2f}{row['p99_ms']:>10.2f}{row['samples']:>6}  "
            f"unread={row['unread_count_after']['unread']}"
        )
    ratio = report["read_all"]["ratio_p50"]
    lines.append(
        f"  p50 ratio {ratio['of']}: {ratio['value']} (<= {MAX_RATIO}: {report['read_all_flat']})"
    )
    fan = report["writes_per_celebrity_post"]
    lines.append(f"fan-out rows per post (threshold {fan['celebrity_threshold']})")
    lines.append(
        f"  {'followers':>10}{'tier':>11}{'inbox':>8}{'pointer':>9}{'writes':>8}{'jobs':>8}"
    )
    for c in fan["cases"]:
        lines.append(
            f"  {c['followers']:>10}{c['tier_expected']:>11}{c['inbox_rows']:>8}"
            f"{c['celebrity_rows']:>9}{c['writes_per_event']:>8}{c['push_jobs']:>8}"
        )
    lines.append(f"  one write per celebrity post: {report['one_write_per_celebrity_post']}")
    lines.append(f"inbox pages (limit {PAGE})")
    lines.append(
        f"  {'celebs':>8}{'p1 p50':>10}{'p1 p99':>10}{'p2 p50':>10}{'p2 p99':>10}  correct"
    )
    for k, row in report["inbox_read"]["followed_celebrities"].items():
        lines.append(
            f"  {k:>8}{row['page1']['p50_ms']:>10.2f}{row['page1']['p99_ms']:>10.2f}"
            f"{row['page2']['p50_ms']:>10.2f}{row['page2']['p99_ms']:>10.2f}"
            f"  {row['pages_correct']}"
        )
    return "\n".join(lines)


def run(settings: Settings, quick: bool) -> dict[str, Any]:
    report: dict[str, Any] = {
        "benchmark": "inbox",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "mode": "quick" if quick else "full",
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "settings": asdict(settings),
        "stack": {
            "parts": list(PARTS),
            "note": "push consumer not started: the push queue counts the fan-out's jobs",
        },
        "client": "one httpx client (keep-alive) in one thread, loopback",
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }
    # The seed's follower pages (1,000 ids), not the stack's demo-sized 20.
    overrides = {
        "celebrity_threshold": settings.celebrity_threshold,
        "follower_page_size": 1000,
        "pages_per_walk": 10,
    }
    with tempfile.TemporaryDirectory(prefix="bench-inbox-") as tmp:
        started = time.perf_counter()
        with Stack(
            Path(tmp), parts=PARTS, reference_overrides=overrides, start_timeout=90
        ) as stack:
            progress(f"stack up in {time.perf_counter() - started:.1f}s")
            with httpx.Client(base_url=stack.info.url("event-api"), timeout=120) as api:
                report["writes_per_celebrity_post"] = bench_fanout_writes(stack, api, settings)
                report["read_all"] = bench_read_all(stack, api, settings)
                report["inbox_read"] = bench_inbox_read(stack, api, settings)
    report["read_all_flat"] = report["read_all"]["read_all_flat"]
    report["one_write_per_celebrity_post"] = report["writes_per_celebrity_post"][
        "one_write_per_celebrity_post"
    ]
    report["checks_ok"] = (
        report["read_all"]["unread_seen_before"]
        and report["read_all"]["unread_zero_after"]
        and report["writes_per_celebrity_post"]["one_row_per_follower_below_threshold"]
        and report["inbox_read"]["pages_correct"]
    )
    report["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="reports/bench/inbox.json")
    parser.add_argument("--quick", action="store_true", help="small version (about a minute)")
    args = parser.parse_args(argv)
    report = run(QUICK if args.quick else FULL, args.quick)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(table(report))
    print(f"wrote {out}")
    ok = report["read_all_flat"] and report["one_write_per_celebrity_post"] and report["checks_ok"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
