"""What minifanout keeps in Redis, and the commands that read and write it.

Data store (``--redis``), per tenant ``t``:

* ``mini:{t}:settings:{u}``: the person's settings (JSON string)
* ``mini:{t}:devices:{u}``: hash token -> ``{"os", "active"}`` (JSON)
* ``mini:{t}:followers:{a}`` / ``mini:{t}:following:{u}``: sets, both directions (erasure)
* ``mini:{t}:feed:{u}``: sorted set, every score 0, members ``<ULID> <JSON [actor, verb,
  target]>``: lexicographic order is time order, so ``ZREVRANGEBYLEX`` pages newest first with
  the ULID itself as the cursor (no float scores: a ULID's 128 bits do not fit a double)
* ``mini:{t}:seen:{u}``: the newest feed member the person marked seen (a watermark)

Dedup store (``--dedup-redis``): ``mini:once:{t}:{u}:{id}:{sha256(token)[:32]}``: ``pending``
while a send is in flight (a lease, ``PX``), then ``sent`` for 30 days.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

FEED_KEEP = 1000
FEED_TTL_S = 90 * 24 * 3600
SENT_TTL_S = 30 * 24 * 3600
PIPELINE_CHUNK = 500
_SET_IF_PRESENT = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  return redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
end
return 0
"""


def _key(tenant: str, kind: str, user: str) -> str:
    return f"mini:{tenant}:{kind}:{user}"


def feed_member(notification_id: str, actor: str, verb: str, target: str) -> str:
    return f"{notification_id} {json.dumps([actor, verb, target], separators=(',', ':'))}"


def parse_member(member: str) -> dict[str, Any]:
    nid, _, rest = member.partition(" ")
    actor, verb, target = json.loads(rest)
    return {"id": nid, "actor": actor, "verb": verb, "target": target}


def dedup_key(tenant: str, user: str, notification_id: str, token: str) -> str:
    digest = hashlib.sha256(token.encode()).hexdigest()[:32]
    return f"mini:once:{tenant}:{user}:{notification_id}:{digest}"


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


class People:
    """Settings, devices, follower sets and feeds in the data store."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis

    async def put(
        self,
        tenant: str,
        user: str,
        settings: dict[str, Any] | None,
        devices: Sequence[dict[str, str]],
    ) -> None:
        pipe = self.redis.pipeline(transaction=True)
        if settings is not None:
            pipe.set(_key(tenant, "settings", user), json.dumps(settings))
        if devices:
            pipe.hset(
                _key(tenant, "devices", user),
                mapping={d["token"]: json.dumps({"os": d["os"], "active": True}) for d in devices},
            )
        await pipe.execute()

    async def get(self, tenant: str, user: str) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """(settings or None, {token: {"os", "active"}})."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.get(_key(tenant, "settings", user))
        pipe.hgetall(_key(tenant, "devices", user))
        raw, devices = await pipe.execute()
        return (
            json.loads(raw) if raw else None,
            {_text(t): json.loads(v) for t, v in devices.items()},
        )

    async def job_state(
        self, tenant: str, user: str, token: str
    ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """(settings, the device) as they are now, in one round trip."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.get(_key(tenant, "settings", user))
        pipe.hget(_key(tenant, "devices", user), token)
        settings, device = await pipe.execute()
        return (json.loads(settings) if settings else None, json.loads(device) if device else None)

    async def deactivate(self, tenant: str, user: str, token: str, os_name: str) -> None:
        # Only if it is still there, in one step: an erased person's device is not written back.
        value = json.dumps({"os": os_name, "active": False})
        await self.redis.eval(_SET_IF_PRESENT, 1, _key(tenant, "devices", user), token, value)

    async def follow(self, tenant: str, author: str, followers: Sequence[str]) -> int:
        pipe = self.redis.pipeline(transaction=False)
        pipe.sadd(_key(tenant, "followers", author), *followers)
        for follower in followers:
            pipe.sadd(_key(tenant, "following", follower), author)
        pipe.scard(_key(tenant, "followers", author))
        return int((await pipe.execute())[-1])

    async def followers(self, tenant: str, author: str) -> list[str]:
        return sorted(
            _text(m) for m in await self.redis.smembers(_key(tenant, "followers", author))
        )

    async def fan_out(
        self, tenant: str, followers: Sequence[str], member: str
    ) -> list[tuple[str, dict[str, Any]]]:
        """Write the entry into each follower's feed; returns (follower, devices) for all."""
        out: list[tuple[str, dict[str, Any]]] = []
        for start in range(0, len(followers), PIPELINE_CHUNK):
            chunk = followers[start : start + PIPELINE_CHUNK]
            pipe = self.redis.pipeline(transaction=False)
            for follower in chunk:
                feed = _key(tenant, "feed", follower)
                pipe.zadd(feed, {member: 0})
                pipe.zremrangebyrank(feed, 0, -FEED_KEEP - 1)
                pipe.expire(feed, FEED_TTL_S)
                pipe.hgetall(_key(tenant, "devices", follower))
            answers = await pipe.execute()
            for i, follower in enumerate(chunk):
                devices = answers[i * 4 + 3]
                out.append((follower, {_text(t): json.loads(v) for t, v in devices.items()}))
        return out

    async def feed_page(
        self, tenant: str, user: str, count: int, before: str | None
    ) -> tuple[list[dict[str, Any]], str | None]:
        """``count`` entries older than ``before`` (newest first) and the next cursor."""
        feed = _key(tenant, "feed", user)
        top = f"({before}" if before else "+"
        pipe = self.redis.pipeline(transaction=False)
        pipe.zrevrangebylex(feed, top, "-", start=0, num=count + 1)
        pipe.get(_key(tenant, "seen", user))
        members, seen = await pipe.execute()
        seen_text = _text(seen) if seen else ""
        entries = []
        for raw in members[:count]:
            member = _text(raw)
            entry = parse_member(member)
            entry["seen"] = bool(seen_text) and member <= seen_text
            entries.append(entry)
        more = entries[-1]["id"] if len(members) > count else None
        return entries, more

    async def unseen(self, tenant: str, user: str) -> int:
        seen = await self.redis.get(_key(tenant, "seen", user))
        low = "(" + _text(seen) if seen else "-"
        return int(await self.redis.zlexcount(_key(tenant, "feed", user), low, "+"))

    async def mark_seen(self, tenant: str, user: str) -> str | None:
        """Everything in the feed now is seen; returns the newest entry's id."""
        newest = await self.redis.zrevrangebylex(
            _key(tenant, "feed", user), "+", "-", start=0, num=1
        )
        if not newest:
            return None
        member = _text(newest[0])
        await self.redis.set(_key(tenant, "seen", user), member, ex=FEED_TTL_S)
        return member.partition(" ")[0]

    async def erase(self, tenant: str, user: str) -> None:
        """Everything of the person in the data store, both directions of the follow graph."""
        following = await self.redis.smembers(_key(tenant, "following", user))
        followers = await self.redis.smembers(_key(tenant, "followers", user))
        pipe = self.redis.pipeline(transaction=True)
        for author in following:
            pipe.srem(_key(tenant, "followers", _text(author)), user)
        for follower in followers:
            pipe.srem(_key(tenant, "following", _text(follower)), user)
        pipe.delete(
            *(
                _key(tenant, kind, user)
                for kind in ("settings", "devices", "followers", "following", "feed", "seen")
            )
        )
        await pipe.execute()


class Claims:
    """The dedup store: one claim per (tenant, person, notification, device)."""

    def __init__(self, redis: Redis, sent_ttl_s: int = SENT_TTL_S) -> None:
        self.redis = redis
        self.sent_ttl_s = sent_ttl_s
        # Sends whose 'sent' mark the store refused (it was down): written before any new
        # claim, since the lease guarding them runs out while the store is away and a copy
        # of the job claimed after that would be sent again.
        self.unsettled: set[str] = set()

    async def claim(self, key: str, lease_s: float) -> tuple[str, float]:
        """``("won", 0)``, ``("sent", 0)`` or ``("busy", seconds the lease still runs)``.
        Raises a redis error when the store cannot decide: the caller must not send."""
        if key in self.unsettled:
            return "sent", 0.0
        for late in list(self.unsettled):
            # No XX: the lease may have run out meanwhile; the send happened all the same.
            await self.redis.set(late, "sent", ex=self.sent_ttl_s)
            self.unsettled.discard(late)
        if await self.redis.set(key, "pending", nx=True, px=int(lease_s * 1000)):
            return "won", 0.0
        pipe = self.redis.pipeline(transaction=False)
        pipe.get(key)
        pipe.pttl(key)
        value, pttl = await pipe.execute()
        if value is not None and _text(value) == "sent":
            return "sent", 0.0
        return "busy", max(pttl, 0) / 1000.0

    async def mark_sent(self, key: str) -> None:
        # XX: only over our own lease. A claim erased mid-send (the person erased) stays
        # erased; nothing of them survives in the store.
        try:
            await self.redis.set(key, "sent", ex=self.sent_ttl_s, xx=True)
        except RedisError:
            self.unsettled.add(key)
            raise

    async def release(self, key: str) -> None:
        await self.redis.delete(key)

    async def erase(self, tenant: str, user: str) -> int:
        """Every claim of the person (SCAN: the keyspace is the dedup store's only)."""
        prefix = f"mini:once:{tenant}:{user}:"
        self.unsettled = {k for k in self.unsettled if not k.startswith(prefix)}
        pattern = f"mini:once:{_glob_escape(tenant)}:{_glob_escape(user)}:*"
        deleted = 0
        batch: list[Any] = []
        async for key in self.redis.scan_iter(match=pattern, count=1000):
            batch.append(key)
            if len(batch) >= 500:
                deleted += await self.redis.delete(*batch)
                batch = []
        if batch:
            deleted += await self.redis.delete(*batch)
        return deleted


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
