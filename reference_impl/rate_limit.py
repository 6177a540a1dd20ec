"""Rate limits: a sliding window per (user, channel) that collapses the excess into one digest
(seed 000), and a daily cap per (user device, notification kind, local day) (seed 002).

Both limits are event-based: what they count is notification ids, never receives. A job that
the at-least-once queue hands out twice gets the same answer twice and spends the budget once
(seed 002: "the increasing counter is not idempotent"). A notification id once decided is
remembered for ``DECISION_RETENTION_SECONDS``, longer than any redelivery, so a copy that comes
back after its window has slid away is still recognised instead of being counted again.

Sliding window per (tenant, user, channel)
  ``<tenant>:rl:{<user>}:<channel>:sent`` is a sorted set of the admitted notification ids,
  scored by the admission time (ms). A job is admitted when fewer than ``per_window`` ids have
  a score in ``(now - window, now]``. Over the limit it is *held*: added to
  ``...:held`` (sorted set, member ``id<TAB>kind<TAB>author``, score = the digest window's start)
  and not sent. The first held job opens a digest window (``...:open`` holds its start); later
  excess jobs join it while ``now < start + window``. The digest job, queued by the opener with
  a delay until the window closes, closes it (atomically: after the close no job can join) and
  sends ONE push "N people liked your post". Its id is derived from
  ``digest:<tenant>:<user>:<channel>:<start>``, so every copy of the digest job carries the
  same id and the ordinary dedup store suppresses all but one send per device.
Daily cap per (tenant, user device, kind, local day)
  ``<tenant>:rld:{<user>}:<device>:<kind>:<YYYY-MM-DD>`` is a set of notification ids that
  expires a day after the end of that day in the user's IANA zone. A device is sent the
  notification when its id is already in the set (a redelivery) or the set holds fewer than the
  cap; otherwise it is blocked for that device (seed 002 blocks; it does not digest).

Each decision is one Lua script, atomic, which a pipeline of ZREMRANGEBYSCORE / ZADD NX / ZCARD
cannot be (the count must be read and the id added in one step, or two consumers both take the
last slot). A consumer sends the decisions of a whole SQS batch in one pipeline
(:meth:`RateLimiter.decide_many`): one round trip per node; a node runs its scripts in the
batch's order, so one user's jobs are decided as if one after the other. The ``{<user>}`` hash
tag keeps one user's keys in one cluster slot, as a multi-key script on MemoryDB requires.

Everything above the ``RateLimiter`` class is pure: no I/O, the instant is always passed in.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from zoneinfo import ZoneInfo

from ulid import ULID

from reference_impl.quiet_hours import resolve_zone
from reference_impl.redis_store import Command, LuaScript, pipelined, script_command

__all__ = [
    "DECISION_RETENTION_SECONDS",
    "DIGEST_AUTHOR",
    "DIGEST_KIND",
    "DailyRequest",
    "DigestClose",
    "LimitAnswer",
    "LimitRequest",
    "RateLimiter",
    "RateLimits",
    "WindowDecision",
    "WindowLog",
    "WindowRequest",
    "daily_key",
    "day_key_expires_at",
    "digest_closes_at_ms",
    "digest_collapse_id",
    "digest_notification_id",
    "digest_text",
    "held_member",
    "local_day",
    "parse_digest_collapse_id",
    "parse_held_member",
    "to_ms",
    "window_decision",
    "window_floor_ms",
    "window_keys",
]

# ShareChat keeps its rows two days; a redelivery or a digest deferred by quiet hours is long
# done by then, and the sets stay bounded by the limits over that span.
DECISION_RETENTION_SECONDS = 2 * 86_400
DIGEST_KIND = "digest"
DIGEST_AUTHOR = "digest"
_COLLAPSE_PREFIX = "digest-"
_UTC = dt.UTC


@dataclass(frozen=True)
class RateLimits:
    """0 turns a limit off (the default: the existing scenarios are never limited)."""

    per_window: int = 0
    window_seconds: int = 60
    daily_per_device_type: int = 0

    def __post_init__(self) -> None:
        for name in ("per_window", "daily_per_device_type"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        seconds = self.window_seconds
        if isinstance(seconds, bool) or not isinstance(seconds, int) or seconds < 1:
            raise ValueError(f"window_seconds must be an integer >= 1, got {seconds!r}")

    @property
    def window_on(self) -> bool:
        return self.per_window > 0

    @property
    def daily_on(self) -> bool:
        return self.daily_per_device_type > 0

    @property
    def window_ms(self) -> int:
        return self.window_seconds * 1000


# -- window arithmetic -----------------------------------------------------------------------


def to_ms(instant: dt.datetime) -> int:
    """Epoch milliseconds of a timezone-aware instant (the scores of the sorted sets)."""
    if instant.tzinfo is None or instant.utcoffset() is None:
        raise ValueError("instant must be timezone-aware")
    return math.floor(instant.timestamp() * 1000)


def window_floor_ms(now_ms: int, window_ms: int) -> int:
    """Admissions scored strictly above this are inside the window ``(now - window, now]``."""
    return now_ms - window_ms


def digest_closes_at_ms(start_ms: int, window_ms: int) -> int:
    """A digest window ``[start, start + window)`` takes jobs until this instant, exclusive."""
    return start_ms + window_ms


@dataclass(frozen=True)
class WindowDecision:
    """``admitted``: send individually. Otherwise the job is held in the digest window that
    starts at ``digest_start_ms``. ``opened``: this job opened that window. ``repeat``: the
    notification id had been decided before (a redelivery) and got the same answer."""

    admitted: bool
    digest_start_ms: int | None = None
    opened: bool = False
    repeat: bool = False

    @property
    def schedules_digest(self) -> bool:
        """The opener queues the digest job; so does a redelivered held job, because the copy
        that opened the window may have died before its digest job was queued (extra digest
        jobs are harmless: the digest's send is deduplicated)."""
        return not self.admitted and (self.opened or self.repeat)


@dataclass
class WindowLog:
    """The sliding-window decision in plain Python: the specification the Lua script follows
    (the tests run both on the same sequences and compare)."""

    limits: RateLimits
    sent: dict[str, int]
    held: dict[str, int]
    open_start: int | None = None

    @classmethod
    def empty(cls, limits: RateLimits) -> WindowLog:
        return cls(limits, {}, {})

    def decide(self, sent_member: str, held_member: str, now_ms: int) -> WindowDecision:
        if sent_member in self.sent:
            return WindowDecision(True, repeat=True)
        if held_member in self.held:
            return WindowDecision(False, self.held[held_member], repeat=True)
        floor = window_floor_ms(now_ms, self.limits.window_ms)
        in_window = sum(1 for score in self.sent.values() if score > floor)
        if in_window < self.limits.per_window:
            self.sent[sent_member] = now_ms
            return WindowDecision(True)
        opened = not (
            self.open_start is not None
            and now_ms < digest_closes_at_ms(self.open_start, self.limits.window_ms)
        )
        if opened:
            self.open_start = now_ms
        assert self.open_start is not None
        self.held[held_member] = self.open_start
        return WindowDecision(False, self.open_start, opened=opened)

    def close(self, start_ms: int) -> list[str]:
        if self.open_start == start_ms:
            self.open_start = None
        return sorted(m for m, s in self.held.items() if s == start_ms)


# -- the day bucket --------------------------------------------------------------------------


def _zone(zone: str | None) -> ZoneInfo:
    # The consumer reaches the limiter only after quiet hours accepted the zone; UTC is the
    # bucket of last resort for a caller that has none, never a reason to skip the cap.
    return resolve_zone(zone) or ZoneInfo("UTC")


def local_day(now: dt.datetime, zone: str | None) -> dt.date:
    """The user's calendar day at ``now`` in their IANA zone (UTC when it cannot be resolved)."""
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError("now must be timezone-aware")
    return now.astimezone(_zone(zone)).date()


def day_key_expires_at(now: dt.datetime, zone: str | None) -> int:
    """Epoch seconds at which the day's set may go: one day after the local day ends, so a job
    decided just before midnight and redelivered just after is still found in yesterday's set.
    The next local midnight is resolved with fold=0, which for a zone whose midnight is skipped
    (a DST gap at 00:00) gives the first instant of the new day."""
    tz = _zone(zone)
    tomorrow = local_day(now, zone) + dt.timedelta(days=1)
    midnight = dt.datetime.combine(tomorrow, dt.time(0), tzinfo=tz).astimezone(_UTC)
    return math.ceil((midnight + dt.timedelta(days=1)).timestamp())


# -- keys and members ------------------------------------------------------------------------


@dataclass(frozen=True)
class WindowKeys:
    sent: str
    held: str
    open: str


def window_keys(tenant_id: str, user_id: str, channel: str) -> WindowKeys:
    base = f"{tenant_id}:rl:{{{user_id}}}:{channel}"
    return WindowKeys(f"{base}:sent", f"{base}:held", f"{base}:open")


def daily_key(tenant_id: str, user_id: str, device_id: str, kind: str, day: dt.date) -> str:
    return f"{tenant_id}:rld:{{{user_id}}}:{device_id}:{kind}:{day.isoformat()}"


def held_member(notification_id: str, kind: str, author_id: str) -> str:
    """What a held job leaves for its digest: enough to write the text. Every copy of a job
    carries the same three fields, so a redelivery finds its own member."""
    return f"{notification_id}\t{kind}\t{author_id}"


def parse_held_member(member: str | bytes) -> tuple[str, str, str]:
    text = member.decode() if isinstance(member, bytes) else member
    notification_id, kind, author = text.split("\t", 2)
    return notification_id, kind, author


# -- the digest ------------------------------------------------------------------------------


def digest_notification_id(tenant_id: str, user_id: str, channel: str, start_ms: int) -> str:
    """A ULID whose time is the window's start and whose random part is a hash of
    ``digest:<tenant>:<user>:<channel>:<start>``: every copy of a digest job, from any consumer,
    names the same digest, and the dedup key built from it is tenant-scoped like any other."""
    seed = f"digest:{tenant_id}:{user_id}:{channel}:{start_ms}".encode()
    tail = hashlib.sha256(seed).digest()[:10]
    return str(ULID.from_bytes(start_ms.to_bytes(6, "big") + tail))


def digest_collapse_id(start_ms: int, count: int) -> str:
    """``digest-<window start ms>-<count>``. The count is final once the window is closed, so a
    retried digest carries the same collapse id and replaces, not doubles, on the device; and it
    is the field of a push that the provider ledgers record, which is how the harness reads N
    without looking at the system's own state."""
    return f"{_COLLAPSE_PREFIX}{start_ms}-{count}"


def parse_digest_collapse_id(value: str | None) -> tuple[int, int] | None:
    """``(start_ms, count)`` of a digest collapse id, None for anything else."""
    if not isinstance(value, str) or not value.startswith(_COLLAPSE_PREFIX):
        return None
    parts = value[len(_COLLAPSE_PREFIX) :].split("-")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[1])


# kind -> (one author, several authors)
_ONE_KIND = {
    "like": ("1 person liked your post", "{n} people liked your post"),
    "comment": ("1 person commented on your post", "{n} people commented on your post"),
    "mention": ("1 person mentioned you", "{n} people mentioned you"),
    "post": ("1 person you follow posted", "{n} people you follow posted"),
}


def digest_text(items: Sequence[tuple[str, str]]) -> str:
    """The digest's body from the held ``(kind, author)`` pairs, e.g. "5 people liked your
    post". People are distinct authors; a mix of kinds (or an unknown one) says how many
    notifications there were instead."""
    if not items:
        raise ValueError("a digest needs at least one held notification")
    kinds = {kind for kind, _ in items}
    people = len({author for _, author in items})
    if len(kinds) == 1 and (kind := next(iter(kinds))) in _ONE_KIND:
        one, several = _ONE_KIND[kind]
        return one if people == 1 else several.format(n=people)
    who = "1 person" if people == 1 else f"{people} people"
    return f"{len(items)} new notifications from {who}"


# -- the Redis adapter -----------------------------------------------------------------------

# KEYS: sent, held, open. ARGV: now, window floor, limit, sent member, held member, retention
# floor, retention ms, window ms. Returns {admitted 0|1, digest start or "", opened 0|1,
# repeat 0|1}. Scores and the open window's start are epoch ms (exact in Lua's doubles).
_WINDOW = LuaScript(
    """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[6])
if redis.call('ZSCORE', KEYS[1], ARGV[4]) then return {1, '', 0, 1} end
local held = redis.call('ZSCORE', KEYS[2], ARGV[5])
if held then return {0, held, 0, 1} end
if redis.call('ZCOUNT', KEYS[1], '(' .. ARGV[2], '+inf') < tonumber(ARGV[3]) then
  redis.call('ZADD', KEYS[1], ARGV[1], ARGV[4])
  redis.call('PEXPIRE', KEYS[1], ARGV[7])
  return {1, '', 0, 0}
end
local start = redis.call('GET', KEYS[3])
local opened = 0
if not start or tonumber(ARGV[1]) >= tonumber(start) + tonumber(ARGV[8]) then
  start = ARGV[1]
  opened = 1
  redis.call('SET', KEYS[3], start, 'PX', ARGV[7])
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. ARGV[6])
redis.call('ZADD', KEYS[2], start, ARGV[5])
redis.call('PEXPIRE', KEYS[2], ARGV[7])
return {0, start, opened, 0}
"""
)

# KEYS: held, open. ARGV: start. Closing deletes ``open`` only when it still names this window
# (a newer window may have replaced it, which closed this one already).
_CLOSE = LuaScript(
    """
if redis.call('GET', KEYS[2]) == ARGV[1] then redis.call('DEL', KEYS[2]) end
return redis.call('ZRANGEBYSCORE', KEYS[1], ARGV[1], ARGV[1])
"""
)

# KEYS: today's set, yesterday's set. ARGV: member, cap, expire-at (epoch s). 1 = send.
_DAILY = LuaScript(
    """
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then return 1 end
if redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 1 then return 1 end
if redis.call('SCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('SADD', KEYS[1], ARGV[1])
redis.call('EXPIREAT', KEYS[1], ARGV[3])
return 1
"""
)


@dataclass(frozen=True)
class WindowRequest:
    """The sliding window's decision for one job."""

    tenant_id: str
    user_id: str
    channel: str
    notification_id: str
    kind: str
    author_id: str
    now: dt.datetime


@dataclass(frozen=True)
class DigestClose:
    """Close a digest window and read what it held."""

    tenant_id: str
    user_id: str
    channel: str
    start_ms: int


@dataclass(frozen=True)
class DailyRequest:
    """The daily cap's decision for one (job, device)."""

    tenant_id: str
    user_id: str
    device_id: str
    kind: str
    notification_id: str
    now: dt.datetime
    zone: str | None


LimitRequest = WindowRequest | DigestClose | DailyRequest
# WindowDecision for a WindowRequest, the held (kind, author) pairs for a DigestClose, whether
# the device may be sent to for a DailyRequest.
LimitAnswer = WindowDecision | list[tuple[str, str]] | bool


def window_decision(reply: Sequence[Any]) -> WindowDecision:
    """The window script's ``{admitted, start or "", opened, repeat}``."""
    admitted, start, opened, repeat = reply
    return WindowDecision(
        admitted=bool(admitted),
        digest_start_ms=int(start) if start not in (b"", "", None) else None,
        opened=bool(opened),
        repeat=bool(repeat),
    )


class RateLimiter:
    """Both limits on Redis (the dedup store's cluster). Every Redis error is the caller's to
    judge: it decides whether an unreachable limiter stops delivery.

    ``count_receives`` is the deliberate defect ``rate_limit_counts_redeliveries``: each receive
    gets a member of its own, as a counter would (INCR per receive), so redeliveries spend the
    budget and land in digests beside the copy that was already sent.
    """

    def __init__(
        self,
        redis: Any,
        limits: RateLimits,
        count_receives: bool = False,
        retention_seconds: int = DECISION_RETENTION_SECONDS,
        per_tenant: bool = False,
    ) -> None:
        self.redis = redis
        self.limits = limits
        self.count_receives = count_receives
        # The deliberate defect rate_limit_per_tenant: one window for a whole tenant's users.
        self.per_tenant = per_tenant
        self.retention_ms = retention_seconds * 1000

    def _event(self, notification_id: str) -> str:
        return f"{notification_id}~{uuid.uuid4().hex}" if self.count_receives else notification_id

    def _window_keys(self, request: WindowRequest | DigestClose) -> WindowKeys:
        user = "*" if self.per_tenant else request.user_id
        return window_keys(request.tenant_id, user, request.channel)

    def _command(self, request: LimitRequest) -> Command:
        if isinstance(request, WindowRequest):
            keys = self._window_keys(request)
            event = self._event(request.notification_id)
            now_ms = to_ms(request.now)
            return script_command(
                _WINDOW,
                [keys.sent, keys.held, keys.open],
                [
                    now_ms,
                    window_floor_ms(now_ms, self.limits.window_ms),
                    self.limits.per_window,
                    event,
                    held_member(event, request.kind, request.author_id),
                    now_ms - self.retention_ms,
                    self.retention_ms,
                    self.limits.window_ms,
                ],
            )
        if isinstance(request, DigestClose):
            keys = self._window_keys(request)
            return script_command(_CLOSE, [keys.held, keys.open], [str(request.start_ms)])
        today = local_day(request.now, request.zone)
        keys = [  # today's set, then yesterday's
            daily_key(request.tenant_id, request.user_id, request.device_id, request.kind, day)
            for day in (today, today - dt.timedelta(days=1))
        ]
        return script_command(
            _DAILY,
            keys,
            [
                self._event(request.notification_id),
                self.limits.daily_per_device_type,
                day_key_expires_at(request.now, request.zone),
            ],
        )

    @staticmethod
    def _answer(request: LimitRequest, reply: Any) -> LimitAnswer:
        if isinstance(request, WindowRequest):
            return window_decision(reply)
        if isinstance(request, DigestClose):
            return [parse_held_member(m)[1:] for m in reply]
        return bool(reply)

    def decide_many(self, requests: Sequence[LimitRequest]) -> list[LimitAnswer | Exception]:
        """Every request's answer, in order, from one pipeline (one round trip per node). A
        request whose node failed gets the RedisError instead."""
        replies = pipelined(self.redis, [self._command(r) for r in requests])
        return [
            reply if isinstance(reply, Exception) else self._answer(request, reply)
            for request, reply in zip(requests, replies, strict=True)
        ]

    def _one(self, request: LimitRequest) -> Any:
        [answer] = self.decide_many([request])
        if isinstance(answer, Exception):
            raise answer
        return answer

    def window(
        self,
        tenant_id: str,
        user_id: str,
        channel: str,
        notification_id: str,
        kind: str,
        author_id: str,
        now: dt.datetime,
    ) -> WindowDecision:
        return self._one(
            WindowRequest(tenant_id, user_id, channel, notification_id, kind, author_id, now)
        )

    def close_digest(
        self, tenant_id: str, user_id: str, channel: str, start_ms: int
    ) -> list[tuple[str, str]]:
        """Close the digest window (no job joins it afterwards) and return the held
        ``(kind, author)`` pairs. Idempotent: a second call returns the same list."""
        return self._one(DigestClose(tenant_id, user_id, channel, start_ms))

    def daily(
        self,
        tenant_id: str,
        user_id: str,
        device_id: str,
        kind: str,
        notification_id: str,
        now: dt.datetime,
        zone: str | None,
    ) -> bool:
        """True when the device may be sent this notification today (and it now counts)."""
        return self._one(
            DailyRequest(tenant_id, user_id, device_id, kind, notification_id, now, zone)
        )
