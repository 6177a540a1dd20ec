"""The one place that knows how to reach Redis: a single node (ElastiCache, a local
redis-server) or a cluster (MemoryDB cluster mode), from config; and how to send a batch's
commands in one round trip per node.

The dedup keys, rate-limit keys (one hash tag per user) and cache keys need nothing else to
work on a cluster: redis-py's cluster client routes each key to its slot's node and splits a
pipeline into one round trip per node.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import redis as redis_lib
from redis.exceptions import ClusterDownError, NoScriptError, RedisClusterException

from reference_impl.config import Config

__all__ = ["Command", "LuaScript", "connect_redis", "pipelined", "script_command"]


def connect_redis(config: Config) -> Any:
    options = {
        "socket_timeout": config.redis_timeout_seconds,
        "socket_connect_timeout": config.redis_timeout_seconds,
    }
    if config.redis_cluster:
        return redis_lib.RedisCluster.from_url(config.redis_url, **options)
    return redis_lib.Redis.from_url(config.redis_url, **options)


@dataclass(frozen=True)
class LuaScript:
    """A Lua script run by EVALSHA in batch pipelines (redis-py's ``Script`` checks SCRIPT
    EXISTS before every pipeline: a round trip per node more). Every script made is known to
    :func:`pipelined`, which loads them all on a node that lacks one."""

    text: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.text.encode()).hexdigest())
        _SCRIPTS.add(self)


_SCRIPTS: set[LuaScript] = set()


@dataclass(frozen=True)
class Command:
    """One command of a batch pipeline: a redis-py method and its arguments."""

    method: str
    args: tuple[Any, ...] = ()
    options: tuple[tuple[str, Any], ...] = ()
    route_key: str | None = None  # the key whose slot a cluster client sends the command to


def script_command(script: LuaScript, keys: Sequence[str], args: Sequence[Any]) -> Command:
    # Through execute_command: redis-py's cluster pipeline blocks its evalsha() method (so
    # Script.__call__ with a pipeline too).
    call = ("EVALSHA", script.sha, len(keys), *keys, *args)
    return Command("execute_command", call, route_key=keys[0] if keys else None)


def _queue(redis: Any, pipe: Any, command: Command) -> None:
    options = dict(command.options)
    if command.route_key is not None and isinstance(redis, redis_lib.RedisCluster):
        # Named, the node costs nothing; left to the cluster pipeline, an EVALSHA's keys are
        # found by COMMAND GETKEYS (movable keys): one round trip per script call.
        options["target_nodes"] = redis.get_node_from_key(command.route_key)
    getattr(pipe, command.method)(*command.args, **options)


def _execute(redis: Any, commands: Sequence[Command]) -> list[Any]:
    try:
        pipe = redis.pipeline(transaction=False)
        for command in commands:
            _queue(redis, pipe, command)
        return pipe.execute(raise_on_error=False)
    except redis_lib.RedisError as exc:
        return [exc] * len(commands)
    except RedisClusterException as exc:
        # E.g. a slot no node serves: to the caller, as any other unreachable store.
        return [ClusterDownError(str(exc))] * len(commands)


def pipelined(redis: Any, commands: Sequence[Command]) -> list[Any]:
    """Every command in one non-transactional pipeline: one round trip per node (a cluster
    client splits it by slot). Reply ``i`` is command ``i``'s, or the RedisError it failed
    with: on a cluster one node can fail while the others answer, and a caller must be able
    to fail closed for exactly the keys without an answer. A whole failed pipeline (a single
    node's connection) fails every command.

    A node without a script (NOSCRIPT: fresh, restarted or failed over) is sent every known
    script, and the commands it refused are sent again, in their order: one more round trip,
    once per node. Loading them all keeps a node at all scripts or none, so the script calls of
    one pipeline never run out of order among themselves; a plain command queued after a
    refused script call has run before it, which the callers' batches allow (their plain
    commands and script calls never share a key)."""
    if not commands:
        return []
    replies = _execute(redis, commands)
    missing = [i for i, r in enumerate(replies) if isinstance(r, NoScriptError)]
    if not missing:
        return replies
    try:
        # A cluster client sends SCRIPT LOAD to every primary.
        for script in sorted(_SCRIPTS, key=lambda s: s.sha):
            redis.script_load(script.text)
    except redis_lib.RedisError as exc:
        again = [exc] * len(missing)
    else:
        again = _execute(redis, [commands[i] for i in missing])
    for i, reply in zip(missing, again, strict=True):
        replies[i] = reply
    return replies
