"""The one place that knows how to reach Redis: a single node (ElastiCache, a local
redis-server) or a cluster (MemoryDB cluster mode), from config.

The dedup keys, rate-limit keys (one hash tag per user) and cache keys need nothing else to
work on a cluster: redis-py's cluster client routes each key to its slot's node and splits a
pipeline into one round trip per node.
"""

from __future__ import annotations

from typing import Any

import redis as redis_lib

from reference_impl.config import Config


def connect_redis(config: Config) -> Any:
    options = {
        "socket_timeout": config.redis_timeout_seconds,
        "socket_connect_timeout": config.redis_timeout_seconds,
    }
    if config.redis_cluster:
        return redis_lib.RedisCluster.from_url(config.redis_url, **options)
    return redis_lib.Redis.from_url(config.redis_url, **options)
