"""Promises judged while the run goes: each check reads the history's rows in order, once, and
names a violation the moment its evidence is in.

Only what the final checkers would also count is reported live: a live violation is one the
full checker cannot excuse afterwards (``tests/test_live_online.py`` holds every live violation
of a recorded history against the final verdict). A rule is applied once the evidence it reads
is surely in: rows arrive in the order they are collected, not in the order they happened.

* ``duplicates`` (effectively_once): a device got a notification again, and none of the
  causes the design admits explains it: the checker's own rule
  (:func:`harness.checkers.duplicate_causes.cause_after`) over the key's deliveries in time order,
  applied :data:`DELIVERY_SETTLE_S` after the duplicate (every earlier delivery is in by then;
  a dedup store judged volatile, and a fault window still open judged as never closing, so the
  live rule excuses at least what the final one does). The checker fails on any unattributed
  duplicate, collapse id or not. A device whose erased user was registered again is a new
  person's from the registration on (the ``erasure`` checker judges those deliveries, as the
  final rule leaves them out too).
* ``visible_duplicates``: those of them a user sees, with no collapse id shared with the first
  delivery (the device shows the rest as one).
* ``sends_after_dead`` (dead_tokens): a request reached the provider more than ``transit_s``
  after the token's first dead answer (APNs 410 or 400 BadDeviceToken, FCM UNREGISTERED)
  left it, and the harness had not brought the token back (``reinstall-devices``); judged
  :data:`INJECT_SETTLE_S` after the request (a reinstall is recorded when the system answers).
* ``decided_during_outage`` (fail_closed): a delivery inside a window in which the dedup store
  was unavailable, of a notification injected after the window opened (plus the checker's
  ``grace_s``): its dedup decision was taken with the store out. Off when the system states a
  fallback store (then such deliveries are allowed). Judged :data:`INJECT_SETTLE_S` after the
  delivery: an injection is recorded when its answer comes back, and the earliest post of a
  shared event id may still be on its way (the checker takes the earliest).
* ``inside_retry_after`` (backpressure): a request to a provider scope (APNs, or one FCM
  project) after a throttling answer's time plus the checker's ``slack_s`` (counted from the
  scope's first request after the answer, when none came within the slack) and before its Retry-After ran
  out; judged :data:`DELIVERY_SETTLE_S` after the request (every answer before
  it is in by then). Counted once per request (the final checker counts it once per answer it
  falls inside: never fewer).
* ``in_quiet_hours`` (quiet_hours): a delivery to a device of a user whose quiet window, placed
  by the population, covers the whole run. ``without_consent`` (consent): a delivery to a
  device of a user without push consent. Both are judged the moment the delivery is seen, and
  only on a run that changes no user (:meth:`OnlineChecks.watch_population`): the final
  checkers leave a user the run changed to ``preference_changes``, and a change may come after
  the delivery.
* ``late_delivery`` (delivery_latency): the first delivery of a notification to a device whose
  recipient must get it (a follower of its author with push consent, not quiet for the whole
  run, the device live) later than the bound after its acceptance (the latest post sent before
  it), its recipient's quiet window's end, or a DLQ redrive of it, whichever is latest, with
  every stated fault window the allowance meets extending it to ``recovery_s`` past the fault's
  end (one still open: not late). Judged :data:`INJECT_SETTLE_S` after the delivery, only on a
  run that changes no user and states no rate limit (:meth:`OnlineChecks.watch_latency`: the
  final oracle then requires exactly these deliveries).

Written by hand: no library checks these promises incrementally; the rules are the final
checkers', read one row at a time.
"""

from __future__ import annotations

import bisect
import json
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.checkers.dead_tokens import TRANSIT_S
from harness.checkers.duplicate_causes import DEFAULT_KILL_WINDOW_S, UNATTRIBUTED, cause_after
from harness.checkers.windows import DEDUP_STORE, Window
from harness.live.stop import LIVE_CHECKS as CHECKS
from harness.model.delivery_key import delivery_key

# The faults whose windows excuse a duplicate (duplicate_causes reads them by these names).
_KILL, _CRASH = "consumer-crash", "dedup-crash"
# How long after a delivery every delivery that happened before it is in the history: the
# collector reads the ledgers every second, a provider writes a row when it answers.
DELIVERY_SETTLE_S = 3.0
# How long after a delivery its injections are all in the history: the injector's request
# timeout (10 s) and a second for the row's append.
INJECT_SETTLE_S = 11.0


@dataclass(frozen=True)
class LiveViolation:
    """A broken promise seen live: the check, the instant of its evidence (epoch seconds, the
    provider's receive time) and that evidence."""

    check: str
    time: float
    evidence: dict[str, Any]

    def describe(self) -> str:
        what = ", ".join(f"{k}={v}" for k, v in self.evidence.items())
        return f"{self.check}: {what}"


@dataclass(frozen=True, slots=True)  # one per delivery: no __dict__ each
class _Delivery:
    time: float
    seq: int
    status: Any
    collapse_id: str | None


@dataclass
class _Outage:
    start: float
    stop: float | None = None


@dataclass
class OnlineChecks:
    """The live checks over one run's rows, fed in history order (:meth:`feed`).

    ``fallback``: the system states a fallback dedup store (``decided_during_outage`` off);
    ``grace_s``: fail_closed's grace after a window opens."""

    fallback: bool = False
    grace_s: float = 0.5
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CHECKS, 0))
    first: dict[str, LiveViolation] = field(default_factory=dict)
    _deliveries: dict[tuple[str, str, str], list[_Delivery]] = field(default_factory=dict)
    # Deliveries of a key delivered before, judged once every earlier one is surely in.
    _repeats: deque[tuple[tuple[str, str, str], _Delivery]] = field(default_factory=deque)
    _windows: dict[str, dict[str, Any]] = field(default_factory=dict)
    _outages: dict[str, _Outage] = field(default_factory=dict)
    _injected_at: dict[tuple[str, str], float] = field(default_factory=dict)
    # Deliveries inside an outage, judged once their injections are surely in.
    _pending: deque[tuple[float, tuple[str, str], str]] = field(default_factory=deque)
    _latest: float = 0.0
    transit_s: float = TRANSIT_S
    # (tenant, token) -> when its first dead answer left the provider; requests to be judged
    # against it once settled; when the harness revived a token.
    _dead_at: dict[tuple[str, str], float] = field(default_factory=dict)
    _requests: deque[tuple[float, tuple[str, str]]] = field(default_factory=deque)
    _revived_at: dict[tuple[str, str], float] = field(default_factory=dict)
    # (tenant, token) of an erased user's device registered again -> when the registration was
    # sent: its deliveries from then on are the new person's.
    _registered_at: dict[tuple[str, str], float] = field(default_factory=dict)
    # (tenant, token) of the devices no delivery may reach all run, by check (in_quiet_hours,
    # without_consent); empty: that check is off.
    _never: dict[str, frozenset[tuple[str, str]]] = field(default_factory=dict)
    # backpressure's slack after a throttling answer; per scope ("apns/", "fcm/<project>") the
    # union of its Retry-After windows as disjoint open intervals (starts, ends), and the
    # requests waiting to be judged against them.
    slack_s: float = 0.3
    _paused: dict[str, tuple[list[float], list[float]]] = field(default_factory=dict)
    _scoped: deque[tuple[float, str]] = field(default_factory=deque)
    # Per scope, the throttling answers (time, Retry-After) whose window is not yet placed, and
    # the request times (sorted) that place them: the slack runs from the scope's first
    # request after the answer when none came within it (the final checker's rule,
    # harness.checkers.backpressure.requests_inside), known once the rows up to it are in.
    _unread: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    _scope_times: dict[str, list[float]] = field(default_factory=dict)
    # late_delivery, armed by watch_latency: the bound and fault recovery; per (tenant, token)
    # the recipients that must get what their authors post (user, end of their quiet window);
    # per (tenant, author) its followers; the posts (sent, accepted, author) and redrives
    # (time, recipient or None) of each notification; every fault window (start, stop or inf);
    # and the first deliveries waiting to be judged.
    bound_s: float = 60.0
    recovery_s: float = 30.0
    _recipients: dict[tuple[str, str], list[tuple[str, float | None]]] | None = None
    _followers: dict[tuple[str, str], frozenset[str]] = field(default_factory=dict)
    _posts: dict[tuple[str, str], list[tuple[float, float, str]]] = field(default_factory=dict)
    _redrives: dict[tuple[str, str], list[tuple[float, str | None]]] = field(default_factory=dict)
    _all_windows: dict[str, list[float]] = field(default_factory=dict)
    _firsts: deque[tuple[float, tuple[str, str, str]]] = field(default_factory=deque)

    def watch_population(
        self,
        quiet_all_run: frozenset[tuple[str, str]],
        refused: frozenset[tuple[str, str]],
    ) -> None:
        """Judge deliveries to these devices live: those of users quiet for the whole run and
        those of users without consent (``harness.checkers.quiet_hours.quiet_all_run`` and
        ``harness.checkers.consent.refused_devices`` of a run that changes no user)."""
        self._never = {"in_quiet_hours": quiet_all_run, "without_consent": refused}

    def watch_latency(
        self,
        recipients: Mapping[tuple[str, str], list[tuple[str, float | None]]],
        followers: Mapping[tuple[str, str], frozenset[str]],
        bound_s: float,
        recovery_s: float,
    ) -> None:
        """Judge delivery latency live (``late_delivery``): ``recipients``, per (tenant, token),
        the users that must get what the authors they follow post, with the end of their quiet
        window (None: not quiet); ``followers`` per (tenant, author). A run that changes no user
        and states no rate limit (the oracle's required deliveries are then exactly these)."""
        self._recipients = dict(recipients)
        self._followers = dict(followers)
        self.bound_s, self.recovery_s = float(bound_s), float(recovery_s)

    def feed(
        self, rows: Iterable[Mapping[str, Any]], now: float | None = None
    ) -> list[LiveViolation]:
        """Take the next rows of the history; return the violations they reveal. ``now``: the
        wall clock (epoch s), so that evidence settles while no row comes."""
        if now is not None:
            self._latest = max(self._latest, now)
        found: list[LiveViolation] = []
        for row in rows:
            kind = row.get("kind")
            if kind == "fault":
                self._fault(row)
            elif kind == "inject":
                self._inject(row)
            elif kind == "provider":
                self._request(row)
                found += self._provider(row)
            elif kind == "change":
                self._change(row)
            elif kind == "redriven":
                self._redriven(row)
            time = row.get("time")
            if isinstance(time, float | int) and time == time:
                self._latest = max(self._latest, float(time))
        return self._counted(found + self._settled(self._latest))

    # -- rows -----------------------------------------------------------------------------------

    def _fault(self, row: Mapping[str, Any]) -> None:
        try:
            detail = json.loads(row.get("detail") or "")
        except ValueError:
            return
        if not isinstance(detail, dict) or "window" not in detail:
            return
        start = detail.get("phase") == "start"
        # Every stated window, by its id as delivery_latency reads them: a start opens it (to
        # infinity), its stop closes it.
        if start:
            self._all_windows[str(detail["window"])] = [float(row["time"]), float("inf")]
        elif str(detail["window"]) in self._all_windows:
            self._all_windows[str(detail["window"])][1] = float(row["time"])
        # A window is its fault's: the final checkers read each fault's windows apart, so two
        # faults' records that share a window id must not close each other's.
        window = f"{detail.get('fault')}/{detail['window']}"
        if detail.get("fault") in (_KILL, _CRASH):
            if start:
                self._windows[window] = {"fault": detail["fault"], "start": float(row["time"])}
            elif window in self._windows:
                self._windows[window]["stop"] = float(row["time"])
        if start and detail.get("unavailable") == DEDUP_STORE:
            self._outages[str(detail["window"])] = _Outage(float(row["time"]))
        elif not start and str(detail["window"]) in self._outages:
            self._outages[str(detail["window"])].stop = float(row["time"])

    def _inject(self, row: Mapping[str, Any]) -> None:
        key = (str(row.get("tenant_id")), str(row.get("notification_id")))
        at = float(row["time"])
        self._injected_at[key] = min(at, self._injected_at.get(key, at))
        if self._recipients is not None:
            end = row.get("end")
            accepted = float(end) if isinstance(end, float | int) and end == end else at
            self._posts.setdefault(key, []).append((at, accepted, str(row.get("author_id"))))

    def _redriven(self, row: Mapping[str, Any]) -> None:
        """A job the harness moved back from a DLQ: its push is measured from then."""
        key = (str(row.get("tenant_id")), str(row.get("notification_id")))
        user = row.get("user_id")
        recipient = str(user) if isinstance(user, str) else None
        self._redrives.setdefault(key, []).append((float(row["time"]), recipient))

    def finish(self) -> list[LiveViolation]:
        """The history is whole (the run ended): judge what still waited to be."""
        return self._counted(self._settled(float("inf")))

    def _settled(self, latest: float) -> list[LiveViolation]:
        """What each rule judges once the rows up to ``latest``, less its settling time, are
        surely in (``inf``: all of them)."""
        return (
            self._settle(latest - INJECT_SETTLE_S)
            + self._settle_repeats(latest - DELIVERY_SETTLE_S)
            + self._settle_requests(latest - INJECT_SETTLE_S)
            + self._settle_scoped(latest - DELIVERY_SETTLE_S)
            + self._settle_latency(latest - INJECT_SETTLE_S)
        )

    def _counted(self, found: list[LiveViolation]) -> list[LiveViolation]:
        for violation in found:
            self.counts[violation.check] += 1
            self.first.setdefault(violation.check, violation)
        return found

    def _settle(self, until: float) -> list[LiveViolation]:
        ready = _take(self._pending, until, lambda p: p[0])
        found = []
        for at, key, token in ready:
            injected = self._injected_at.get(key)
            if injected is None:  # not injected by us: the checker counts it as before
                continue
            if (violation := self._judge_outage(key, token, at, injected)) is not None:
                found.append(violation)
        return found

    def _request(self, row: Mapping[str, Any]) -> None:
        """Every request, for dead_tokens: a dead answer, or a request to be judged later."""
        key = (str(row.get("tenant_id")), str(row.get("token")))
        at = float(row["time"])
        status, reason, provider = row.get("status"), row.get("reason"), row.get("provider")
        dead = (
            provider == "apns" and (status == 410 or (status == 400 and reason == "BadDeviceToken"))
        ) or (provider == "fcm" and reason == "UNREGISTERED")
        if dead:
            end = row.get("end")
            left = float(end) if isinstance(end, float | int) and end == end else at
            self._dead_at[key] = min(left, self._dead_at.get(key, left))
        self._requests.append((at, key))
        project = row.get("project")
        scope = f"{provider}/{project if isinstance(project, str) else ''}"
        bisect.insort(self._scope_times.setdefault(scope, []), at)
        retry_after = row.get("retry_after")
        if isinstance(retry_after, float | int) and retry_after == retry_after and retry_after > 0:
            self._unread.setdefault(scope, []).append((at, float(retry_after)))
        self._scoped.append((at, scope))

    def _place_windows(self, until: float) -> None:
        """Place the Retry-After window of each throttling answer whose scope's first request
        after it is in (every row up to ``until`` is); forget request times no answer needs."""
        for scope, waiting in self._unread.items():
            times = self._scope_times.get(scope, [])
            still = []
            for answered, pause_s in waiting:
                n = bisect.bisect_right(times, answered)
                first = times[n] if n < len(times) else float("inf")
                if first > until:
                    still.append((answered, pause_s))
                    continue
                silent = first > answered + self.slack_s  # through the whole slack
                begin = (first if silent else answered) + self.slack_s
                _pause(self._paused.setdefault(scope, ([], [])), begin, answered + pause_s)
            self._unread[scope] = still
        for scope, times in self._scope_times.items():
            keep = min((a for a, _ in self._unread.get(scope, ())), default=until)
            del times[: bisect.bisect_right(times, min(keep, until))]

    def _settle_scoped(self, until: float) -> list[LiveViolation]:
        self._place_windows(until)
        found = []
        for at, scope in _take(self._scoped, until, lambda r: r[0]):
            starts, ends = self._paused.get(scope, ((), ()))
            n = bisect.bisect_left(starts, at) - 1  # the last window opening before ``at``
            if n >= 0 and at < ends[n]:
                evidence = {"scope": scope, "paused_until": round(ends[n], 3)}
                found.append(LiveViolation("inside_retry_after", at, evidence))
        return found

    def _change(self, row: Mapping[str, Any]) -> None:
        """A ``reinstall-devices`` change the system acknowledged: its tokens brought back; a
        registration again after an erasure: its devices a new person's."""
        try:
            detail = json.loads(row.get("detail") or "")
        except ValueError:
            return
        if not isinstance(detail, dict) or detail.get("ok") is False:
            return
        kind = detail.get("change")
        if kind not in ("reinstall", "registration"):
            return
        since = self._revived_at if kind == "reinstall" else self._registered_at
        at = float(row["time"])
        for token in detail.get("tokens", []):
            key = (str(row.get("tenant_id")), str(token))
            since[key] = min(at, since.get(key, at))

    def _settle_requests(self, until: float) -> list[LiveViolation]:
        ready = _take(self._requests, until, lambda r: r[0])
        found = []
        for at, key in ready:
            dead_at = self._dead_at.get(key)
            if dead_at is None or at - dead_at <= self.transit_s:
                continue
            if at >= self._revived_at.get(key, float("inf")):
                continue
            evidence = {"tenant_id": key[0], "token": key[1], "dead_at": round(dead_at, 3)}
            found.append(LiveViolation("sends_after_dead", at, evidence))
        return found

    def _provider(self, row: Mapping[str, Any]) -> list[LiveViolation]:
        status = row.get("status")
        delivered = row.get("delivered")
        if delivered is None:
            delivered = status == 200
        if not delivered:
            return []
        key = delivery_key(row.get("tenant_id"), row.get("notification_id"), row.get("token"))
        at = float(row["time"])
        delivery = _Delivery(at, int(row.get("seq") or 0), status, row.get("collapse_id") or None)
        seen = self._deliveries.setdefault(key, [])
        seen.append(delivery)
        if len(seen) == 1 and self._recipients is not None:
            self._firsts.append((at, key))
        if len(seen) > 1:
            # Either this one or an earlier-seen one is the repeat (by time): judge this one
            # and, if it came first, the earlier-seen one (queued when it was seen second).
            self._repeats.append((key, delivery))
            if len(seen) == 2:
                self._repeats.append((key, seen[0]))
        if not self.fallback and self._inside_outage(at):
            self._pending.append((at, key[:2], key[2]))
        device = (key[0], key[2])
        return [
            LiveViolation(
                check, at, {"tenant_id": key[0], "notification_id": key[1], "token": key[2]}
            )
            for check, devices in self._never.items()
            if device in devices
        ]

    # -- the rules ------------------------------------------------------------------------------

    def _settle_repeats(self, until: float) -> list[LiveViolation]:
        ready = _take(self._repeats, until, lambda r: r[1].time)
        kills = self._fault_windows(_KILL)
        crashes = self._fault_windows(_CRASH)
        found = []
        for key, delivery in ready:
            order = sorted(self._deliveries[key], key=lambda d: (d.time, d.seq))
            earlier = order[: order.index(delivery)]
            if not earlier:
                continue  # the first delivery by time: the others are the repeats
            if delivery.time >= self._registered_at.get((key[0], key[2]), float("inf")):
                continue  # the new person's (the erasure checker's)
            # Volatile (durable=False): a crash may excuse; the final rule excuses no less.
            cause = cause_after(
                any(d.status != 200 for d in earlier),
                earlier[-1].time,
                delivery.time,
                kills,
                crashes,
                False,
                DEFAULT_KILL_WINDOW_S,
            )
            if cause != UNATTRIBUTED:
                continue
            first = order[0]
            collapsed = first.collapse_id is not None and first.collapse_id == delivery.collapse_id
            evidence = {
                "tenant_id": key[0],
                "notification_id": key[1],
                "token": key[2],
                "first_delivered_at": round(first.time, 3),
                "collapsed": collapsed,
            }
            found.append(LiveViolation("duplicates", delivery.time, evidence))
            if not collapsed:
                found.append(LiveViolation("visible_duplicates", delivery.time, evidence))
        return found

    def _settle_latency(self, until: float) -> list[LiveViolation]:
        found = []
        for _, key in _take(self._firsts, until, lambda r: r[0]):
            if (late := self._judge_latency(key)) is not None:
                found.append(late)
        return found

    def _judge_latency(self, key: tuple[str, str, str]) -> LiveViolation | None:
        """delivery_latency's rule for one (tenant, notification, token), its first delivery
        and every post, redrive and fault window before it in."""
        assert self._recipients is not None
        tenant, notification, token = key
        delivered = min(d.time for d in self._deliveries[key])
        posts = sorted(self._posts.get((tenant, notification), ()))
        if not posts:
            return None  # never accepted (no_acceptance): not judged
        # The latest post sent by the delivery (the earliest when none was); one instant's
        # posts count from the earliest answer among them.
        sent = max((p[0] for p in posts if p[0] <= delivered), default=posts[0][0])
        accepted = min(p[1] for p in posts if p[0] == sent)
        author = next(p[2] for p in posts if p[0] == sent)
        followers = self._followers.get((tenant, author), frozenset())
        redrives = self._redrives.get((tenant, notification), ())
        windows = sorted((w[0], w[1]) for w in self._all_windows.values())
        for user, quiet_until in self._recipients.get((tenant, token), ()):
            if user not in followers:
                continue
            start = max(
                accepted,
                quiet_until if quiet_until is not None else -float("inf"),
                max((t for t, r in redrives if t <= delivered and r in (None, user)),
                    default=-float("inf")),
            )  # fmt: skip
            allowed = start + self.bound_s
            for opened, closed in windows:
                if opened <= allowed and closed >= start:
                    allowed = max(allowed, closed + self.recovery_s)
            if delivered > allowed:
                evidence = {
                    "tenant_id": tenant,
                    "notification_id": notification,
                    "token": token,
                    "measured_from": round(start, 3),
                    "allowed_by": round(allowed, 3),
                }
                return LiveViolation("late_delivery", delivered, evidence)
        return None

    def _fault_windows(self, fault: str) -> list[Window]:
        """The windows of ``fault`` seen so far; one still open as never closing."""
        return [
            Window(fault, w["start"], w.get("stop", float("inf")))
            for w in self._windows.values()
            if w["fault"] == fault
        ]

    def _inside_outage(self, at: float) -> bool:
        return any(
            at > o.start + self.grace_s and (o.stop is None or at < o.stop)
            for o in self._outages.values()
        )

    def _judge_outage(
        self, key: tuple[str, str], token: str, at: float, injected: float
    ) -> LiveViolation | None:
        for outage in self._outages.values():
            inside = at > outage.start + self.grace_s and (outage.stop is None or at < outage.stop)
            if inside and injected > outage.start + self.grace_s:
                return LiveViolation(
                    "decided_during_outage",
                    at,
                    {
                        "tenant_id": key[0],
                        "notification_id": key[1],
                        "token": token,
                        "outage_began_at": round(outage.start, 3),
                        "injected_at": round(injected, 3),
                    },
                )
        return None


def _pause(windows: tuple[list[float], list[float]], start: float, end: float) -> None:
    """Add the open interval (start, end) to a union of disjoint open intervals kept sorted."""
    starts, ends = windows
    if end <= start:
        return
    n = bisect.bisect_right(starts, start)
    # Merge with the interval before when it reaches past ``start``, then swallow the ones after
    # that begin before ``end``.
    if n > 0 and ends[n - 1] > start:
        n -= 1
        start = starts[n]
        end = max(end, ends[n])
        del starts[n], ends[n]
    while n < len(starts) and starts[n] < end:
        end = max(end, ends[n])
        del starts[n], ends[n]
    starts.insert(n, start)
    ends.insert(n, end)


def _take(queue: deque[Any], until: float, time_of: Callable[[Any], float]) -> list[Any]:
    """The items at the head of ``queue`` (kept in the order rows came, nearly the order of
    time) whose time is ``until`` or earlier. One behind a later head waits for it: judged a
    little late, never early. Each item is looked at once per step at most, not every item."""
    ready = []
    while queue and time_of(queue[0]) <= until:
        ready.append(queue.popleft())
    return ready
