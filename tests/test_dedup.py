"""The dedup lease protocol against the stack's real Redis."""

from __future__ import annotations

import uuid

import pytest
import redis

from harness.stack.supervisor import wait_until
from reference_impl.dedup import DedupStore
from reference_impl.dedup_key import DEDUP_TTL_SECONDS, dedup_key

pytestmark = pytest.mark.integration


@pytest.fixture
def store(stack):
    client = redis.Redis.from_url(stack.info.redis_url)
    return DedupStore(client, lease_seconds=1)


def _key() -> str:
    return dedup_key("tenant", "01JD5V3KX9B9Q0ZC4S6Y2M8N7P", f"user#{uuid.uuid4().hex}")


def test_first_claim_wins_and_others_see_it_in_flight(store):
    key = _key()
    assert store.claim(key, "a") == "won"
    assert store.claim(key, "b") == "in_flight"


def test_sent_mark_lasts_thirty_days_and_dedups(store):
    key = _key()
    assert store.claim(key, "a") == "won"
    store.mark_sent(key)
    assert store.claim(key, "b") == "already_sent"
    ttl = store.redis.ttl(key)
    assert DEDUP_TTL_SECONDS - 5 <= ttl <= DEDUP_TTL_SECONDS


def test_release_frees_only_our_own_lease(store):
    key = _key()
    assert store.claim(key, "a") == "won"
    store.release(key, "b")  # not b's lease: stays
    assert store.claim(key, "c") == "in_flight"
    store.release(key, "a")
    assert store.claim(key, "c") == "won"


def test_an_abandoned_lease_expires_so_a_crash_does_not_lose_the_notification(store):
    key = _key()
    assert store.claim(key, "crashed") == "won"
    wait_until(lambda: store.claim(key, "next") == "won", 5, "the lease to expire")


def test_a_dead_redis_raises_rather_than_answering(stack):
    dead = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5)
    with pytest.raises(redis.RedisError):
        DedupStore(dead, lease_seconds=1).claim(_key(), "a")
