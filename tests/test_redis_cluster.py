"""Dedup, rate limits and caches work unchanged on a single Redis node and on a local
three-master Redis Cluster (MemoryDB cluster mode) started by the harness."""

from __future__ import annotations

import datetime as dt
import json

import pytest
import redis

from harness.stack.redis_cluster import RedisCluster, slot_ranges
from reference_impl.dedup import DedupStore
from reference_impl.dedup_key import dedup_key
from reference_impl.ids import preferences_cache_key
from reference_impl.rate_limit import RateLimiter, RateLimits

pytestmark = pytest.mark.integration


def test_slot_ranges_cover_every_slot_once():
    ranges = slot_ranges(3)
    assert ranges[0][0] == 0 and ranges[-1][1] == 16383
    assert all(a[1] + 1 == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    with pytest.raises(ValueError):
        slot_ranges(0)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with RedisCluster(tmp_path_factory.mktemp("cluster")) as running:
        yield running


@pytest.fixture(params=["single-node", "cluster"])
def client(request, stack, cluster):
    if request.param == "cluster":
        c = redis.RedisCluster.from_url(cluster.url)
        assert len(c.get_primaries()) == 3
    else:
        c = redis.Redis.from_url(stack.info.parts["redis"].url)
    yield c
    c.close()


def test_dedup_claims_spread_over_every_node(client, request):
    store = DedupStore(client, lease_seconds=30)
    keys = [dedup_key("tc", f"01HZX{i:021d}", f"user{i}#dev") for i in range(60)]
    assert [store.claim(k, "a") for k in keys] == ["won"] * 60
    assert {store.claim(k, "b") for k in keys} == {"in_flight"}
    store.release(keys[0], "b")  # not b's lease: it stays
    assert store.claim(keys[0], "b") == "in_flight"
    store.release(keys[0], "a")
    assert store.claim(keys[0], "b") == "won"
    for k in keys[1:]:
        store.mark_sent(k)
    assert {store.claim(k, "c") for k in keys[1:]} == {"already_sent"}
    if isinstance(client, redis.RedisCluster):
        # The keys really are spread: every master holds some.
        sizes = [n.redis_connection.dbsize() for n in client.get_primaries()]
        assert all(size > 0 for size in sizes), sizes
    assert client.delete(*keys) == 60  # multi-key across slots, as erasure does


def test_rate_limit_scripts_run_on_one_slot_per_user(client):
    limiter = RateLimiter(client, RateLimits(per_window=2, window_seconds=60))
    now = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)
    user = f"rl-{id(client)}"
    decisions = [
        limiter.window("tc", user, "push", f"n{i}", "like", f"a{i}", now) for i in range(4)
    ]
    assert [d.admitted for d in decisions] == [True, True, False, False]
    assert decisions[2].opened and not decisions[3].opened
    again = limiter.window("tc", user, "push", "n0", "like", "a0", now)
    assert again.admitted and again.repeat  # a redelivery spends nothing
    held = limiter.close_digest("tc", user, "push", decisions[2].digest_start_ms)
    assert sorted(held) == [("like", "a2"), ("like", "a3")]


def test_daily_limit_counts_ids_not_receives(client):
    limiter = RateLimiter(client, RateLimits(daily_per_device_type=1))
    now = dt.datetime.now(dt.UTC)  # the day's set expires at a real instant: it must be today's
    user = f"daily-{id(client)}"
    assert limiter.daily("tc", user, "dev", "like", "n1", now, "Asia/Kathmandu")
    assert not limiter.daily("tc", user, "dev", "like", "n2", now, "Asia/Kathmandu")
    assert limiter.daily("tc", user, "dev", "like", "n1", now, "Asia/Kathmandu")


def test_preference_cache_entries_round_trip_and_drop(client):
    keys = [preferences_cache_key("tc", f"u{i}") for i in range(20)]
    for k in keys:
        client.set(k, "{}", ex=300)
    assert all(client.get(k) == b"{}" for k in keys)
    assert client.delete(*keys) == 20


@pytest.mark.wholerun
def test_a_smoke_run_passes_with_the_workers_on_the_cluster(cluster, tmp_path):
    """The reference's workers and Event API on the three-master cluster (redis_cluster:
    true): every notification exactly once, the dedup keys spread over every master."""
    from harness.model.scenarios import get
    from harness.run.runner import Progress, run
    from harness.stack.supervisor import Stack

    overrides = {"redis_url": cluster.url, "redis_cluster": True}
    result = run(
        get("smoke"),
        seed=5,
        out=tmp_path,
        progress=Progress(lambda line: None),
        stack_factory=lambda d: Stack(d, reference_overrides=overrides),
    )
    assert result.summary["verdict"] == "pass", result.summary
    once = result.summary["checkers"]["effectively_once"]
    assert once["delivered"] == once["expected"] > 0
    client = redis.RedisCluster.from_url(cluster.url)
    dedup = [
        sum(1 for _ in node.redis_connection.scan_iter("dedup:*", count=1000))
        for node in client.get_primaries()
    ]
    assert all(n > 0 for n in dedup) and sum(dedup) >= once["expected"], dedup


def test_a_batch_reads_its_cached_preferences_once(cluster, stack):
    from reference_impl.push_consumer import PushConsumer

    config = stack.reference_config()
    consumer = PushConsumer(config, redis_client=redis.RedisCluster.from_url(cluster.url))
    key = preferences_cache_key("tb", "u1")
    consumer.redis.set(key, '{"zone": "UTC"}', ex=60)
    job = {
        "tenant_id": "tb", "recipient_user_id": "u1", "notification_id": "01J00000000000000000000000",
        "author_id": "a", "kind": "post", "object_id": "o", "channel": "push",
    }  # fmt: skip
    record = {
        "messageId": "m1",
        "body": json.dumps(job),
        "messageAttributes": {"tenant_id": {"stringValue": "tb"}},
        "attributes": {"ApproximateReceiveCount": "1"},
    }
    consumer.prefetch_preferences([record])
    consumer.redis.set(key, '{"zone": "Asia/Tokyo"}', ex=60)
    # Served from the batch's one pipelined read, not read again.
    assert consumer.preferences("tb", "u1") == {"zone": "UTC"}
    consumer.prefetch_preferences([])
    assert consumer.preferences("tb", "u1") == {"zone": "Asia/Tokyo"}


def test_node_ports_stay_where_redis_accepts_a_cluster_node():
    import random

    from harness.stack.redis_cluster import MAX_NODE_PORT, cluster_node_port

    rng = random.Random(3)
    ports = [cluster_node_port(rng) for _ in range(20)]
    assert all(20000 <= p <= MAX_NODE_PORT for p in ports) and len(set(ports)) == 20
