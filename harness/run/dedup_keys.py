"""The dedup store's keys at the end of a run: how long each has left to live.

Seed 000: a delivery's dedup key lives 30 days (``SET key 1 NX EX 2592000``), longer than any
provider's retry horizon; "a dedup window shorter than the provider's own retry timeout leaks
duplicates through the seam", and the 30-day TTL also bounds retention (GDPR). A run lasts
minutes, so a key set with an hour's TTL never expires inside it: only the TTLs themselves show
the window. The runner reads them (read-only: SCAN and TTL, straight to the store, not through
the fault proxy) once the system has settled, and records one ``dedup_sample`` row: how many
keys of the policy's pattern carry each remaining TTL. The ``dedup_window`` checker judges it.

Bounded: at most ``cap`` keys, in batches of ``batch``; a cluster's every primary is scanned.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import redis

from harness.model.history import History

DEFAULT_CAP = 1_000_000
BATCH = 1000


@dataclass
class TtlSample:
    """Remaining TTL (seconds, -1: no expiry) -> keys; ``complete``: every key was read;
    ``earlier``: keys left out because they existed before the run began."""

    ttls: Counter[int] = field(default_factory=Counter)
    complete: bool = True
    earlier: int = 0

    @property
    def keys(self) -> int:
        return sum(self.ttls.values())


def _client(url: str) -> Any:
    plain = redis.Redis.from_url(url, socket_timeout=10)
    try:
        enabled = plain.info("cluster").get("cluster_enabled") == 1
    except redis.RedisError:
        enabled = False
    if not enabled:
        return plain
    plain.close()
    return redis.RedisCluster.from_url(url, socket_timeout=10)


TENANT_PREFIX = "${tenant_prefix}"


def run_pattern(pattern: str, tenant_prefix: str) -> str:
    """A pattern naming ``${tenant_prefix}`` (keys that carry their tenant) matches this run's
    keys only; any other is the same for every run."""
    escaped = "".join("\\" + c if c in "*?[]\\" else c for c in tenant_prefix)
    return pattern.replace(TENANT_PREFIX, escaped)


def existing_keys(url: str, pattern: str, cap: int = DEFAULT_CAP) -> frozenset[bytes] | None:
    """Every key matching ``pattern`` now: taken before a run's load, so that the keys a
    long-lived store kept from earlier runs are never judged as this run's (a run right after
    a clean one passed 1-hour keys: 722 of 733 keys read were the clean run's). None when there
    are more than ``cap``: this run's keys cannot then be told apart (state a pattern with
    ``${tenant_prefix}``)."""
    client = _client(url)
    try:
        found: set[bytes] = set()
        for key in client.scan_iter(match=pattern, count=BATCH):
            if len(found) >= cap:
                return None
            found.add(key)
        return frozenset(found)
    finally:
        client.close()


def sample_ttls(
    url: str, pattern: str, cap: int = DEFAULT_CAP, exclude: frozenset[bytes] = frozenset()
) -> TtlSample:
    """The remaining TTL of every key matching ``pattern`` (up to ``cap`` keys), but those in
    ``exclude`` (an earlier run's: :func:`existing_keys`)."""
    sample = TtlSample()
    client = _client(url)
    try:
        keys: list[bytes] = []

        def flush() -> None:
            pipe = client.pipeline(transaction=False)
            for key in keys:
                pipe.ttl(key)
            for ttl in pipe.execute():
                if ttl != -2:  # gone between SCAN and TTL
                    sample.ttls[int(ttl)] += 1
            keys.clear()

        for key in client.scan_iter(match=pattern, count=BATCH):
            if key in exclude:
                sample.earlier += 1
                continue
            if sample.keys + len(keys) >= cap:
                sample.complete = False
                break
            keys.append(key)
            if len(keys) >= BATCH:
                flush()
        if keys:
            flush()
    finally:
        client.close()
    return sample


def record_sample(history: History, sample: TtlSample, pattern: str, elapsed_s: float) -> None:
    """One ``dedup_sample`` row; ``elapsed_s``: since the run began (before any key was set)."""
    history.append(
        "dedup_sample",
        time=time.time(),
        detail=json.dumps(
            {
                "pattern": pattern,
                "elapsed_s": round(elapsed_s, 3),
                "complete": sample.complete,
                "earlier_keys_left_out": sample.earlier,
                "ttls": {str(k): v for k, v in sorted(sample.ttls.items())},
            }
        ),
    )
