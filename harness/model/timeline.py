"""Users whose record changed during the run: the oracle's view of time.

The population says what every user is at the start. During a run the harness itself changes
some of them (it withdraws or grants push consent, moves quiet hours or the zone, erases a user,
registers an erased user again, installs a user's app again so that a dead token answers and is
registered anew) and records each change as a ``change`` history row with the
instant it was sent (``time``) and the instant the system acknowledged it (``end``). A change
the system took may become visible to it any time from when it was sent; the state before it
may still be acted on until ``bound_s`` after the acknowledgement (the promise under test: a
withdrawn consent takes effect now, not after a cache's TTL).

From that, for any instant, the states a correct system may act on; and for a notification
injected at ``t``, the states it may be judged by at any later processing time. The oracle
(:mod:`harness.model.oracle`) turns that into must / may / must-not deliveries, and the
``preference_changes`` and ``erasure`` checkers judge each delivery by the states possible at its
instant.

A change written straight to the preferences table reaches a correct system only through the
table's change stream. While a fault stopped that stream's delivery (a window whose record says
it took the ``preferences_stream`` away), such a change is bounded by the cache's TTL alone: the
state before it may be acted on until ``cache_ttl_s`` (the system's stated
``preferences_cache_ttl_s``) plus ``bound_s`` after its acknowledgement, when the stream could
have been stopped anywhere between its sending and ``bound_s`` after its acknowledgement. A
change made through the API is judged by ``bound_s`` whatever the stream did: the API's own
write-through holds the promise alone.

Windows of changed users are evaluated with :mod:`harness.model.local_time` at the injection
instant: the harness draws changes whose windows neither start nor end during the run.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import pandas as pd

from harness.contract.clock import offset_of
from harness.model import local_time
from harness.model.population import Device, Population, QuietState, User, consent_stands

DEFAULT_BOUND_S = 5.0
# Seed 000: "the 5-minute TTL is only a backstop".
DEFAULT_CACHE_TTL_S = 300.0
# A deferral that ends later than this after the population's start is not released in a run.
PENDING_AFTER_S = 3600.0

ChangeKind = Literal["preferences", "erasure", "registration", "reinstall"]
Decision = tuple[Literal["deliver", "defer", "suppress"], float | str | None]
UserKey = tuple[str, str]


@dataclass(frozen=True)
class State:
    """What a user is between two changes."""

    since: float  # the change that made it was sent (-inf: the population's own)
    until: float  # the next change was acknowledged (+inf: still current)
    consent: bool
    zone: str
    quiet_hours: dict[str, str] | None
    # The population's planned quiet state (initial state only); None: evaluate the window.
    planned: QuietState | None
    quiet_until: float | None
    erased: bool = False
    # Authors (tenant, id) followed; None: as the population says.
    follows: frozenset[UserKey] | None = None
    # The user turned push off (``channels.push`` false): an opt-out holds whatever the consent.
    push_off: bool = False
    # Dead tokens of the user's devices an app installed again brought back and registered.
    revived: frozenset[str] = frozenset()
    # How long after ``until`` it may still be acted on; None: the timeline's ``bound_s``. Set
    # when the change that ended it was written to the table while the stream was stopped.
    grace_s: float | None = None


@dataclass(frozen=True)
class Change:
    tenant_id: str
    user_id: str
    kind: ChangeKind
    sent: float
    acked: float
    preferences: dict[str, Any] | None = None
    follows: tuple[UserKey, ...] = ()
    via: str = "api"
    tokens: tuple[str, ...] = ()


@dataclass
class Timeline:
    population: Population
    bound_s: float = DEFAULT_BOUND_S
    states: dict[UserKey, list[State]] = field(default_factory=dict)
    erasures: dict[UserKey, Change] = field(default_factory=dict)
    registrations: dict[UserKey, Change] = field(default_factory=dict)
    # (tenant, user, token) of a dead token reinstalled -> when the first reinstall was sent.
    reinstalls: dict[tuple[str, str, str], float] = field(default_factory=dict)
    # How far the system's clock ran ahead of real time: windows are the system's wall clock.
    clock_offset_s: float = 0.0
    # (start, stop) of the windows in which the preferences table's change stream was stopped,
    # and the cache TTL that alone bounds a table write's staleness in them.
    stream_stops: tuple[tuple[float, float], ...] = ()
    cache_ttl_s: float = DEFAULT_CACHE_TTL_S
    # The changes judged by the TTL (written to the table while the stream was stopped), and
    # those made through the API in such a window (judged by ``bound_s``: write-through alone).
    ttl_bounded: list[Change] = field(default_factory=list)
    api_while_stream_stopped: list[Change] = field(default_factory=list)

    @property
    def horizon(self) -> float:
        return self.population.started_at + PENDING_AFTER_S

    def revived_at(self, tenant: str, user: str, token: str) -> float | None:
        """When ``token`` of the user was first brought back (reinstall-devices), or None."""
        return self.reinstalls.get((tenant, user, token))

    def changed(self, tenant: str, user: str) -> bool:
        return (tenant, user) in self.states

    def changed_users(self) -> set[UserKey]:
        return set(self.states)

    def grace(self, state: State) -> float:
        """How long after ``state.until`` a correct system may still act on it."""
        return self.bound_s if state.grace_s is None else state.grace_s

    def in_stream_stop(self, change: Change) -> bool:
        """Whether the stream may have been stopped while it had ``change`` to deliver: from its
        sending to ``bound_s`` after its acknowledgement."""
        return any(
            change.sent <= stop and change.acked + self.bound_s >= start
            for start, stop in self.stream_stops
        )

    def seen_at(self, tenant: str, user: str, instant: float) -> list[State]:
        """States a correct system may act on at ``instant``."""
        return [
            s for s in self.states[(tenant, user)] if s.since <= instant <= s.until + self.grace(s)
        ]

    def seen_from(self, tenant: str, user: str, instant: float) -> list[State]:
        """States a correct system may act on at ``instant`` or any time after."""
        return [s for s in self.states[(tenant, user)] if instant <= s.until + self.grace(s)]

    def decision(
        self, state: State, author: UserKey, device: Device | None, instant: float
    ) -> Decision:
        """What a correct system does with a notification of ``author`` for ``device`` (None:
        the user has none) when it acts on ``state`` at ``instant``."""
        if state.erased:
            return ("suppress", "erased")
        if state.follows is not None and author not in state.follows:
            return ("suppress", "not_following")
        if device is None:
            return ("suppress", "no_device")
        if not state.consent:
            return ("suppress", "no_consent")
        if state.push_off:
            return ("suppress", "push_switched_off")
        if not local_time.known_zone(state.zone):
            # Fails closed whatever the window (none at all included): deferred until the zone
            # is known again, which no run sees.
            return ("suppress", "unknown_zone")
        if not local_time.readable(state.quiet_hours):
            return ("suppress", "unreadable_quiet_hours")
        if state.planned is not None:
            if state.planned == "whole_run":
                return ("suppress", "quiet_hours_pending")
            if state.planned == "ends_during_run" and state.quiet_until is not None:
                return (
                    ("defer", state.quiet_until)
                    if instant < state.quiet_until
                    else (
                        "deliver",
                        None,
                    )
                )
        else:
            # In the system's time (its clock's offset), the end back in real time.
            shown = instant + self.clock_offset_s
            end = local_time.window_end(state.quiet_hours, state.zone, shown)
            if end is not None:
                end -= self.clock_offset_s
                return ("suppress", "quiet_hours_pending") if end > self.horizon else ("defer", end)
        if device.dead and device.token not in state.revived:
            return ("suppress", "dead_token")
        return ("deliver", None)

    def allowed_at(
        self, tenant: str, user: str, author: UserKey, device: Device | None, instant: float
    ) -> tuple[bool, str | None]:
        """Whether a delivery at ``instant`` is one a correct system could have made, and if
        not, why (the reason of the states it could have acted on)."""
        reasons = []
        for state in self.seen_at(tenant, user, instant):
            kind, value = self.decision(state, author, device, instant)
            if kind == "deliver" or (
                kind == "defer" and isinstance(value, float) and value <= instant
            ):
                return True, None
            reasons.append(str(value) if kind == "suppress" else "quiet_hours")
        return False, (reasons[-1] if reasons else "no_state")


def initial_state(user: User) -> State:
    return State(
        since=-math.inf,
        until=math.inf,
        consent=user.consent is not None,
        zone=user.zone,
        quiet_hours=user.quiet_hours,
        planned=user.quiet_state,
        quiet_until=user.quiet_until,
    )


def _next_state(previous: State, change: Change, original: User) -> State:
    base = replace(previous, since=change.sent, until=math.inf, grace_s=None)
    if change.kind == "erasure":
        return replace(base, erased=True, follows=frozenset())
    if change.kind == "registration":
        fresh = initial_state(original)
        return replace(fresh, since=change.sent, follows=frozenset(change.follows))
    if change.kind == "reinstall":
        # The same person, their app installed again: the token answers and is registered.
        return replace(base, revived=previous.revived | frozenset(change.tokens))
    prefs = change.preferences or {}
    consent = prefs.get("push_consent", "absent")
    channels = prefs.get("channels")
    push = channels.get("push") if isinstance(channels, dict) else None
    return replace(
        base,
        # A withdrawal is no record at all or one revoked since its grant: both deny.
        consent=previous.consent if consent == "absent" else consent_stands(consent),
        push_off=previous.push_off if push is None else push is False,
        zone=str(prefs.get("zone", previous.zone)),
        quiet_hours=prefs.get("quiet_hours", previous.quiet_hours),
        # A changed window is evaluated, no longer planned.
        planned=None if ("quiet_hours" in prefs or "zone" in prefs) else previous.planned,
    )


def build(
    population: Population,
    changes: Iterable[Change],
    bound_s: float = DEFAULT_BOUND_S,
    clock_offset_s: float = 0.0,
    stream_stops: Iterable[tuple[float, float]] = (),
    cache_ttl_s: float = DEFAULT_CACHE_TTL_S,
) -> Timeline:
    """The timeline of every changed user; ``changes`` in any order, failed ones left out.
    ``stream_stops``: the windows in which the preferences table's change stream was stopped."""
    timeline = Timeline(
        population,
        bound_s,
        clock_offset_s=clock_offset_s,
        stream_stops=tuple((float(a), float(b)) for a, b in stream_stops),
        cache_ttl_s=cache_ttl_s,
    )
    ordered = sorted(changes, key=lambda c: (c.sent, c.acked))
    for change in ordered:
        key = (change.tenant_id, change.user_id)
        original = population.user(*key)
        states = timeline.states.setdefault(key, [initial_state(original)])
        previous = states[-1]
        grace = None
        if change.kind == "preferences" and timeline.in_stream_stop(change):
            if change.via == "api":
                timeline.api_while_stream_stopped.append(change)
            else:  # only the stream could have told the system: the cache's TTL bounds it
                timeline.ttl_bounded.append(change)
                grace = cache_ttl_s + bound_s
        states[-1] = replace(previous, until=change.acked, grace_s=grace)
        states.append(_next_state(previous, change, original))
        if change.kind == "erasure":
            timeline.erasures.setdefault(key, change)
        elif change.kind == "registration":
            timeline.registrations[key] = change
        elif change.kind == "reinstall":
            for token in change.tokens:
                timeline.reinstalls.setdefault((*key, token), change.sent)
    return timeline


def changes_from_history(history: pd.DataFrame) -> list[Change]:
    """The acknowledged ``change`` rows (a change the system refused never happened; one left
    unacknowledged by a crash is taken as happened, from when it was sent)."""
    rows = history[history["kind"] == "change"]
    out = []
    for row in rows.itertuples(index=False):
        detail = json.loads(row.detail) if isinstance(row.detail, str) else {}
        if detail.get("ok") is False:
            continue
        acked = row.end if isinstance(row.end, float) and not math.isnan(row.end) else math.inf
        out.append(
            Change(
                tenant_id=str(row.tenant_id),
                user_id=str(row.user_id),
                kind=detail["change"],
                sent=float(row.time),
                acked=acked,
                preferences=detail.get("preferences"),
                follows=tuple(tuple(a) for a in detail.get("follows", [])),  # type: ignore[misc]
                via=str(detail.get("via", "api")),
                tokens=tuple(str(t) for t in detail.get("tokens", [])),
            )
        )
    return out


def from_history(
    population: Population,
    history: pd.DataFrame,
    bound_s: float = DEFAULT_BOUND_S,
    stream_stops: Iterable[tuple[float, float]] = (),
    cache_ttl_s: float = DEFAULT_CACHE_TTL_S,
) -> Timeline:
    return build(
        population,
        changes_from_history(history),
        bound_s,
        offset_of(history),
        stream_stops,
        cache_ttl_s,
    )
