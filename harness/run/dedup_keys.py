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
    """Remaining TTL (seconds, -1: no expiry) -> keys; ``complete``: every key was read."""

    ttls: Counter[int] = field(default_factory=Counter)
    complete: bool = True

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


def sample_ttls(url: str, pattern: str, cap: int = DEFAULT_CAP) -> TtlSample:
    """The remaining TTL of every key matching ``pattern`` (up to ``cap`` keys)."""
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
                "ttls": {str(k): v for k, v in sorted(sample.ttls.items())},
            }
        ),
    )
