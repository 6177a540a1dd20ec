"""The dedup_window checker over hand-made histories (both engines), and the TTL sampler
against the stack's real Redis."""

from __future__ import annotations

import dataclasses
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
import redis

from harness.checkers.evidence import evidence_from
from harness.checkers.registry import run_probe
from harness.checkers.store import HistoryStore
from harness.model.history import History
from harness.model.population import PopulationSpec, generate
from harness.run.dedup_keys import TtlSample, record_sample, sample_ttls

START = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)
SPEC = PopulationSpec(tenants=1, users_per_tenant=30, celebrity_followers=20, regular_authors=1)
WINDOW = 2_592_000


def _history(ttls_for: Callable[[int], dict[int, int]] | None):
    """One celebrity post delivered to every expected device; ``ttls_for(users due)``: the
    sample (None: the run read none)."""
    population = generate(3, START, SPEC)
    author = next(a for a in population.authors if a.celebrity)
    history = History()
    history.append("inject", time=START.timestamp(), end=START.timestamp() + 0.01,
                   tenant_id=author.tenant_id, author_id=author.user_id,
                   notification_id="01JNOTIFICATION0000000000", detail="post")  # fmt: skip
    expected = evidence_from(population, history.frame()).expectation.deliveries
    history.extend_provider([{"received_at": START.timestamp() + 1, "tenant_id": r.tenant_id,
                              "notification_id": r.notification_id, "token": r.token,
                              "provider": "apns", "project": None, "status": 200,
                              "reason": None} for r in expected.itertuples()])  # fmt: skip
    users = len(expected[["tenant_id", "notification_id", "user_id"]].drop_duplicates())
    if ttls_for is not None:
        record_sample(history, TtlSample(ttls=Counter(ttls_for(users))), "dedup:*", 60.0)
    return population, history.frame(), users


def _verdicts(tmp_path, population, frame):
    """The verdict in memory and out of core (they must agree)."""
    evidence = evidence_from(population, frame)
    in_memory = run_probe("dedup_window", {}, evidence)
    frame.to_parquet(tmp_path / "history.parquet", index=False)
    with HistoryStore(
        tmp_path / "history.parquet", evidence.expectation, workdir=tmp_path / "db"
    ) as store:
        on_disk = run_probe("dedup_window", {}, dataclasses.replace(evidence, store=store))
    assert on_disk.to_dict() == in_memory.to_dict()
    return in_memory


def test_keys_with_the_whole_window_left_pass(tmp_path):
    # One key per device (more than one per user) a minute into the run, and a lease.
    population, frame, users = _history(lambda users: {WINDOW - 65: users + 3, 4: 1})
    verdict = _verdicts(tmp_path, population, frame)
    assert verdict.valid, verdict.counts
    assert verdict.counts["required"] == users > 0
    assert verdict.counts["full_window"] == users + 3 and verdict.counts["short_lived"] == 1


def test_keys_set_for_an_hour_are_a_window_too_short(tmp_path):
    population, frame, users = _history(lambda users: {3540: users + 3})
    verdict = _verdicts(tmp_path, population, frame)
    assert not verdict.valid
    assert verdict.counts["missing_full_window"] == users
    assert verdict.details["longest_ttl_s"] == 3540


def test_a_key_that_never_expires_breaks_the_retention_bound(tmp_path):
    population, frame, users = _history(lambda users: {WINDOW - 65: users, -1: 1})
    verdict = _verdicts(tmp_path, population, frame)
    assert not verdict.valid and verdict.counts["never_expire"] == 1


def test_fewer_full_window_keys_than_notifications_due_fail(tmp_path):
    population, frame, users = _history(lambda users: {WINDOW - 65: users - 1})
    verdict = _verdicts(tmp_path, population, frame)
    assert not verdict.valid and verdict.counts["missing_full_window"] == 1


def test_no_sample_is_unknown_never_pass(tmp_path):
    population, frame, _ = _history(None)
    verdict = run_probe("dedup_window", {}, evidence_from(population, frame))
    assert verdict.valid is None


@pytest.mark.integration
def test_the_sampler_reads_every_matching_keys_ttl(stack):
    client = redis.Redis.from_url(stack.info.redis_url)
    prefix = f"dedupwin-{uuid.uuid4().hex}:"
    client.set(prefix + "a", "sent", ex=WINDOW)
    client.set(prefix + "b", "sent", ex=3600)
    client.set(prefix + "c", "sent")
    client.set(f"other-{uuid.uuid4().hex}", "x", ex=5)
    try:
        sample = sample_ttls(stack.info.redis_url, prefix + "*")
        assert sample.complete and sample.keys == 3
        assert sample.ttls[-1] == 1
        assert sorted(t for t in sample.ttls.elements() if t >= 0)[1] > WINDOW - 60
        capped = sample_ttls(stack.info.redis_url, prefix + "*", cap=2)
        assert not capped.complete and capped.keys < 3
    finally:
        client.delete(prefix + "a", prefix + "b", prefix + "c")


@pytest.mark.integration
def test_a_run_reads_only_its_own_keys_of_a_long_lived_store(stack):
    """Keys there before the run are left out (counted); a pattern naming ${tenant_prefix}
    reads the run's tenants' keys only."""
    from harness.run.dedup_keys import existing_keys, run_pattern

    url = stack.info.redis_url
    store = redis.Redis.from_url(url)
    k = f"lived-{uuid.uuid4().hex}:"
    store.set(k + "tenant-aaa111-0:n1", 1, ex=3600)  # an earlier run's, an hour
    try:
        earlier = existing_keys(url, k + "*")
        assert earlier == {(k + "tenant-aaa111-0:n1").encode()}
        store.set(k + "tenant-bbb222-0:n2", 1, ex=WINDOW)
        sample = sample_ttls(url, k + "*", exclude=earlier)
        assert sample.keys == 1 and sample.earlier == 1 and max(sample.ttls) > 3600
        assert existing_keys(url, k + "*", cap=1) is None  # too many to tell apart
        own = run_pattern(k + "${tenant_prefix}*", "tenant-bbb222")
        assert own == k + "tenant-bbb222*" and sample_ttls(url, own).keys == 1
        assert run_pattern("k:${tenant_prefix}*", "a[b]") == "k:a\\[b\\]*"
    finally:
        store.delete(k + "tenant-aaa111-0:n1", k + "tenant-bbb222-0:n2")
