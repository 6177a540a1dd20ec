"""Checkers benchmark: every steady-state checker over a synthetic run history of 10 million rows,
each called through ``run_probe`` exactly as the runner calls it.

    .venv/bin/python benchmarks/bench_checkers.py --out reports/bench/checkers.json

``--rows N`` (default 10,000,000) sizes the history, ``--probes a,b`` times some checkers only
(default: every registered checker), ``--cold`` stops checkers from reusing the string
encodings earlier ones computed (they do in a run: see ``harness.checkers.keys``). The JSON
holds the rows, the generation seconds, wall and CPU seconds per checker and in total, peak RSS
(getrusage; per phase and per checker where Linux lets the peak be reset), ``under_60s``, the
verdicts, and the planted counts with whether each checker found exactly them.

The history is built vectorised (numpy/pyarrow, no Python loop per row) from a synthetic
population and load: inject rows, provider ledger rows (mostly 200s, with retries, 429s and dead
token answers), fault windows, DLQ contents, phase/action/sample rows. It plays a 10-minute game
day: SQS duplicate delivery, a dedup outage and a short black hole, an APNs 429 window with
Retry-After that the sender honours in bursts, APNs "accepted then 5xx", and an FCM fault still
open at the end. On top of that a known number of each defect is planted (visible and collapsed
duplicates, losses with and without a DLQ message, deliveries inside the outage, requests
inside Retry-After, sends after a dead-token answer, deliveries without consent or inside quiet
hours, early and late releases, deliveries to another tenant's device); the report puts the
planted counts beside the verdicts. Generation time is reported apart and not counted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from harness.checkers import Evidence, Verdict, run_probe  # noqa: E402
from harness.checkers.registry import known as known_checkers  # noqa: E402
from harness.model.history import COLUMNS  # noqa: E402
from harness.model.oracle import EXPECTED_COLUMNS, Expectation  # noqa: E402
from harness.model.population import (  # noqa: E402
    ZONES,
    Author,
    Device,
    Population,
    PopulationSpec,
    User,
    _window,
)
from harness.model.system import SystemPolicy  # noqa: E402

LIMIT_S = 60.0
START = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
S0 = START.timestamp()
RUN_S = 600.0
INJECT_S = (5.0, 510.0)
# Quiet windows of "ends_during_run" users end after most of the load, as in a real game day:
# lateness is measured from the window's end, so load injected long after it would read as late.
RELEASE_S = 450.0
OUTAGE_GRACE_S = 0.5
DEAD_TRANSIT_S = 0.05
RELEASE_BOUND_S = 120.0
SLACK_S = 0.3
# Checkers that still loop over rows in Python: at 10M rows they take minutes and 15+ GB, so the
# default run leaves them out and says so (time them with --probes, at a smaller --rows).
NOT_YET_VECTORISED: dict[str, str] = {}

# The game day's probes' tolerances (scenarios/game-day.yaml), the defaults for the rest.
TOLERANCES: dict[str, dict[str, Any]] = {
    "fail_closed": {"grace_s": OUTAGE_GRACE_S},
    "backpressure": {"slack_s": SLACK_S},
    "quiet_hours": {"release_bound_s": RELEASE_BOUND_S},
    "dead_tokens": {"transit_s": DEAD_TRANSIT_S},
}
POLICY = SystemPolicy(dedup_fallback=False)
RETRY_AFTER_S = 1.0
THROTTLE_P = 0.4
# A throttled sender's round: a 0.1 s burst, then silence for Retry-After and a little more.
BURST_S = 0.1
ROUND_S = BURST_S + RETRY_AFTER_S + 0.05
# (fault, start offset, stop offset or None when still open at the end, params)
FAULTS: list[tuple[str, float, float | None, dict[str, Any]]] = [
    ("sqs-duplicate-delivery", 30.0, 150.0, {"p": 0.2}),
    ("dedup-outage", 200.0, 230.0, {}),
    ("apns-status", 300.0, 340.0, {"p": THROTTLE_P, "status": 429, "retry_after": 1}),
    ("apns-accepted-then-error", 380.0, 400.0, {"p": 0.05}),
    ("dedup-blackhole", 470.0, 475.0, {}),
    ("fcm-status", 560.0, None, {"p": 0.1, "status": 503}),
]
OUTAGES = [(S0 + a, S0 + b) for name, a, b, _ in FAULTS if name.startswith("dedup-") and b]
APNS_WINDOW = next((S0 + a, S0 + b) for name, a, b, _ in FAULTS if name == "apns-status" and b)
DUP_WINDOW = (S0 + 30.0, S0 + 148.0)
COLLAPSE_WINDOW = (S0 + 380.0, S0 + 398.0)
TENANTS = ("tenant-0", "tenant-1")
PROJECTS = ("proj-tenant-0", "proj-tenant-1")
# Provider answers: (status, reason) per platform (0 apns, 1 fcm), as the simulators write them.
REASONS = {
    (0, 200): None, (0, 410): "Unregistered", (0, 429): "TooManyRequests",
    (0, 500): "InternalServerError", (0, 503): "ServiceUnavailable",
    (1, 200): None, (1, 404): "UNREGISTERED", (1, 500): "INTERNAL", (1, 503): "UNAVAILABLE",
}  # fmt: skip
CONSENT = {"granted_at": "2026-01-01T00:00:00+00:00", "version": "2026-01"}
STATES = ("none", "outside", "ends_during_run", "whole_run")
NONE, OUTSIDE, ENDS, WHOLE = range(4)


@dataclass
class Synthetic:
    """A population, its expectation and a history, with the defects planted in the history."""

    population: Population
    expectation: Expectation
    history: pd.DataFrame
    planted: dict[str, dict[str, int]]
    policy: SystemPolicy = POLICY

    def evidence(self) -> Evidence:
        return Evidence(self.population, self.expectation, self.history, self.policy)


# --- population ------------------------------------------------------------------------------


@dataclass
class _Arrays:
    """The population as arrays, indexed by global user (tenant * users + user) and device."""

    users: int
    u_tenant: np.ndarray
    u_consent: np.ndarray
    u_state: np.ndarray
    u_until: np.ndarray
    u_dev_start: np.ndarray
    u_dev_count: np.ndarray
    d_tenant: np.ndarray
    d_user: np.ndarray
    d_fcm: np.ndarray
    d_dead: np.ndarray
    d_token: np.ndarray  # object array of str
    d_shared: np.ndarray
    a_tenant: np.ndarray
    a_user: np.ndarray
    a_celebrity: np.ndarray
    a_start: np.ndarray
    a_count: np.ndarray
    f_users: np.ndarray  # global user index of each follower, authors' lists back to back
    user_ids: np.ndarray  # object array: "u000042" per local user index


def _ragged_arange(counts: np.ndarray) -> np.ndarray:
    """0..n-1 for every n in counts, back to back."""
    ends = np.cumsum(counts)
    return np.arange(int(ends[-1]) if len(ends) else 0) - np.repeat(ends - counts, counts)


def _tokens(rng: np.random.Generator, fcm: np.ndarray) -> np.ndarray:
    """APNs: 64 hex digits; FCM: 22 + '_' + 140 url-safe characters (as the population writes)."""
    out = np.empty(len(fcm), dtype=object)
    hexdigits = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
    apns = ~fcm
    codes = hexdigits[rng.integers(0, 16, (int(apns.sum()), 64))]
    out[apns] = codes.view("S64").ravel().astype(str)
    alphabet = np.frombuffer(
        b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_", dtype=np.uint8
    )
    codes = alphabet[rng.integers(0, 64, (int(fcm.sum()), 163))]
    codes[:, 22] = ord("_")
    out[fcm] = codes.view("S163").ravel().astype(str)
    return out


def build_population(users_per_tenant: int, rng: np.random.Generator) -> tuple[Population, _Arrays]:
    """Two tenants with the same user ids, devices shared across tenants, celebrities and
    regular authors; fractions as PopulationSpec's defaults."""
    spec = PopulationSpec(
        tenants=len(TENANTS),
        users_per_tenant=users_per_tenant,
        celebrity_followers=users_per_tenant // 2,
        regular_authors=max(3, users_per_tenant // 500),
        regular_followers=max(5, min(200, users_per_tenant // 10)),
        quiet_release_seconds=RELEASE_S,
        shared_token_fraction=0.05,
    )
    tenants, per = spec.tenants, users_per_tenant
    n = tenants * per
    u_tenant = np.repeat(np.arange(tenants), per)
    zone = rng.integers(0, len(ZONES), n)
    roll = rng.random(n)
    edges = np.cumsum(
        [spec.quiet_whole_run_fraction, spec.quiet_ends_fraction, spec.quiet_outside_fraction]
    )
    u_state = np.select([roll < edges[0], roll < edges[1], roll < edges[2]], [WHOLE, ENDS, OUTSIDE])
    u_consent = rng.random(n) >= spec.no_consent_fraction
    no_device = rng.random(n) < spec.no_device_fraction
    u_dev_count = np.where(
        no_device, 0, np.where(rng.random(n) < spec.second_device_fraction, 2, 1)
    )
    u_dev_start = np.cumsum(u_dev_count) - u_dev_count
    d_user = np.repeat(np.arange(n), u_dev_count)
    d_tenant = u_tenant[d_user]
    d_fcm = rng.random(len(d_user)) < spec.fcm_fraction
    d_dead = rng.random(len(d_user)) < spec.dead_token_fraction
    d_token = _tokens(rng, d_fcm)
    # Tenant 1's first device of a user is, sometimes, tenant 0's same user's first device.
    first = u_dev_start[per:]
    peer = u_dev_start[: n - per]
    share = (
        (u_dev_count[per:] > 0)
        & (u_dev_count[: n - per] > 0)
        & (rng.random(n - per) < spec.shared_token_fraction)
    )
    d_fcm[first[share]] = d_fcm[peer[share]]
    d_dead[first[share]] = d_dead[peer[share]]
    d_token[first[share]] = d_token[peer[share]]
    d_shared = np.zeros(len(d_user), dtype=bool)
    d_shared[first[share]] = d_shared[peer[share]] = True

    windows = {}
    u_until = np.full(n, np.nan)
    for state in range(4):
        for z in range(len(ZONES)):
            windows[state, z] = _window(STATES[state], START, ZONES[z], RELEASE_S)
    user_ids = np.array([f"u{i:06d}" for i in range(per)], dtype=object)
    population = Population(seed=0, started_at=S0, spec=spec)
    for g in range(n):
        window, until = windows[int(u_state[g]), int(zone[g])]
        u_until[g] = np.nan if until is None else until
        population.users.append(
            User(
                TENANTS[u_tenant[g]],
                user_ids[g % per],
                ZONES[zone[g]],
                window,
                CONSENT if u_consent[g] else None,
                STATES[u_state[g]],
                until,
            )
        )
    population.devices = [
        Device(TENANTS[t], user_ids[u % per], "fcm" if f else "apns", tok, bool(dead))
        for t, u, f, tok, dead in zip(
            d_tenant.tolist(),
            d_user.tolist(),
            d_fcm.tolist(),
            d_token.tolist(),
            d_dead.tolist(),
            strict=True,
        )
    ]

    a_tenant, a_user, a_celebrity, a_count, followers = [], [], [], [], []
    for t in range(tenants):
        authors = [(0, True), (1, True)] + [(2 + i, False) for i in range(spec.regular_authors)]
        for local, celebrity in authors:
            size = spec.celebrity_followers if celebrity else spec.regular_followers
            chosen = rng.choice(per - 1, size=min(size, per - 1), replace=False)
            chosen = np.sort(chosen + (chosen >= local))
            a_tenant.append(t)
            a_user.append(t * per + local)
            a_celebrity.append(celebrity)
            a_count.append(len(chosen))
            followers.append(t * per + chosen)
            population.authors.append(
                Author(TENANTS[t], user_ids[local], celebrity, tuple(user_ids[chosen].tolist()))
            )
    a_count_arr = np.array(a_count)
    arrays = _Arrays(
        users=per,
        u_tenant=u_tenant,
        u_consent=u_consent,
        u_state=u_state,
        u_until=u_until,
        u_dev_start=u_dev_start,
        u_dev_count=u_dev_count,
        d_tenant=d_tenant,
        d_user=d_user,
        d_fcm=d_fcm,
        d_dead=d_dead,
        d_token=d_token,
        d_shared=d_shared,
        a_tenant=np.array(a_tenant),
        a_user=np.array(a_user),
        a_celebrity=np.array(a_celebrity),
        a_start=np.cumsum(a_count_arr) - a_count_arr,
        a_count=a_count_arr,
        f_users=np.concatenate(followers),
        user_ids=user_ids,
    )
    return population, arrays


# --- history ---------------------------------------------------------------------------------


def _strings(codes: np.ndarray, categories: list[str | None] | np.ndarray) -> pa.Array:
    """An Arrow string column from codes into categories; code -1 (or a None category) is null."""
    cats = pa.array(
        list(categories) if not isinstance(categories, np.ndarray) else categories,
        pa.large_string(),
    )
    codes = np.asarray(codes, dtype=np.int64)
    indices = pa.array(codes, pa.int64(), mask=codes < 0)
    return pa.DictionaryArray.from_arrays(indices, cats).cast(pa.large_string())


def _settle(rng: np.random.Generator, t: np.ndarray, fcm: np.ndarray) -> np.ndarray:
    """Where a well-behaved system would have sent at ``t``: nothing during a dedup outage (the
    backlog drains when it ends) and, while APNs throttles, only in short bursts each followed by
    Retry-After of silence."""
    t = t.copy()
    for start, stop in OUTAGES:
        inside = (t > start + OUTAGE_GRACE_S) & (t < stop)
        t[inside] = stop + rng.uniform(0.0, 2.0, int(inside.sum()))
    a, _ = APNS_WINDOW
    in_rounds = ~fcm & (t >= a) & (t < _rounds_end())
    k = np.floor((t[in_rounds] - a) / ROUND_S)
    t[in_rounds] = a + k * ROUND_S + rng.uniform(0.0, BURST_S, int(in_rounds.sum()))
    return t


def _rounds() -> int:
    a, b = APNS_WINDOW
    return int((b - a) // ROUND_S)


def _rounds_end() -> float:
    return APNS_WINDOW[0] + (_rounds() + 1) * ROUND_S


class _Rows:
    """Provider rows gathered block by block as arrays, turned into columns once."""

    def __init__(self) -> None:
        self.blocks: list[dict[str, np.ndarray]] = []

    def add(
        self,
        time_: np.ndarray,
        tenant: np.ndarray,
        event: np.ndarray,
        device: np.ndarray,
        status: int | np.ndarray,
        collapse: int | np.ndarray = 0,
        delivered: bool | np.ndarray | None = None,
        retry_after: float | np.ndarray = np.nan,
    ) -> None:
        n = len(time_)
        status_arr = np.broadcast_to(np.asarray(status, dtype=np.int64), (n,))
        if delivered is None:
            delivered = status_arr == 200
        self.blocks.append(
            {
                "time": np.asarray(time_, dtype=np.float64),
                "tenant": np.asarray(tenant, dtype=np.int64),
                "event": np.asarray(event, dtype=np.int64),
                "device": np.asarray(device, dtype=np.int64),
                "status": status_arr.copy(),
                "collapse": np.broadcast_to(np.asarray(collapse, dtype=np.int64), (n,)).copy(),
                "delivered": np.broadcast_to(np.asarray(delivered, dtype=bool), (n,)).copy(),
                "retry_after": np.broadcast_to(
                    np.asarray(retry_after, dtype=np.float64), (n,)
                ).copy(),
            }
        )

    def concat(self) -> dict[str, np.ndarray]:
        return {k: np.concatenate([b[k] for b in self.blocks]) for k in self.blocks[0]}


def _pick(rng: np.random.Generator, role: np.ndarray, pool: np.ndarray, k: int, value: int) -> int:
    """Give role ``value`` to up to k pairs of the pool that have no role yet."""
    candidates = np.flatnonzero(pool & (role == 0))
    chosen = rng.choice(candidates, size=min(k, len(candidates)), replace=False)
    role[chosen] = value
    return len(chosen)


def _events(
    rng: np.random.Generator, arr: _Arrays, target_pairs: int
) -> tuple[np.ndarray, np.ndarray]:
    """Authors (celebrities 60% of the deliveries, regular authors 40%) posting until the
    expected deliveries reach the target; returns (author index, inject time) sorted by time."""
    deliverable_user = np.zeros(len(arr.u_tenant), dtype=np.int64)
    ok = ~arr.d_dead & arr.u_consent[arr.d_user] & (arr.u_state[arr.d_user] != WHOLE)
    np.add.at(deliverable_user, arr.d_user[ok], 1)
    per_author = np.add.reduceat(deliverable_user[arr.f_users], arr.a_start)
    celeb = np.flatnonzero(arr.a_celebrity)
    regular = np.flatnonzero(~arr.a_celebrity)
    mean_c, mean_r = per_author[celeb].mean(), max(per_author[regular].mean(), 1.0)
    p_celeb = (0.6 / mean_c) / (0.6 / mean_c + 0.4 / mean_r)
    mean = p_celeb * mean_c + (1 - p_celeb) * mean_r
    draws = int(target_pairs / mean * 1.5) + 64
    authors = np.where(
        rng.random(draws) < p_celeb,
        rng.choice(celeb, draws),
        rng.choice(regular, draws),
    )
    cum = np.cumsum(per_author[authors])
    count = int(np.searchsorted(cum, target_pairs)) + 1
    authors = authors[:count]
    times = np.sort(S0 + rng.uniform(*INJECT_S, count))
    return authors, times


def _nids(rng: np.random.Generator, count: int) -> np.ndarray:
    """ULID-shaped (26 Crockford base-32 characters), unique, in time order."""
    alphabet = np.frombuffer(b"0123456789ABCDEFGHJKMNPQRSTVWXYZ", dtype=np.uint8)
    codes = np.empty((count, 26), dtype=np.uint8)
    codes[:, :3] = np.frombuffer(b"01K", dtype=np.uint8)
    order = np.arange(count)
    for i in range(10):  # the event's rank keeps them unique; the rest is random
        codes[:, 12 - i] = alphabet[(order >> (5 * i)) & 31]
    codes[:, 13:] = alphabet[rng.integers(0, 32, (count, 13))]
    return codes.view("S26").ravel().astype(str).astype(object)


def _build(
    rng: np.random.Generator, arr: _Arrays, target_pairs: int
) -> tuple[Expectation, dict[str, Any], dict[str, dict[str, int]]]:
    """The expectation, the provider/inject/dlq rows as arrays, and the planted counts."""
    planted: dict[str, dict[str, int]] = {}
    ev_author, ev_time = _events(rng, arr, target_pairs)
    n_events = len(ev_author)
    ev_tenant = arr.a_tenant[ev_author]
    nids = _nids(rng, n_events)
    # Some of tenant 1's events reuse the id a tenant 0 event minted (a ULID collision).
    t0 = np.flatnonzero(ev_tenant == 0)
    t1 = np.flatnonzero(ev_tenant == 1)
    n_shared = min(max(2, n_events // 1000), len(t0), len(t1))
    shared_from = rng.choice(t0, n_shared, replace=False)
    shared_to = rng.choice(t1, n_shared, replace=False)
    nids[shared_to] = nids[shared_from]
    ev_shared = np.zeros(n_events, dtype=bool)
    ev_shared[shared_to] = ev_shared[shared_from] = True

    # Every (event, follower, device) in the oracle's order: events, followers, devices.
    fcount = arr.a_count[ev_author]
    f_event = np.repeat(np.arange(n_events), fcount)
    follower = arr.f_users[np.repeat(arr.a_start[ev_author], fcount) + _ragged_arange(fcount)]
    dcount = arr.u_dev_count[follower]
    p_event = np.repeat(f_event, dcount)
    p_user = np.repeat(follower, dcount)
    p_device = np.repeat(arr.u_dev_start[follower], dcount) + _ragged_arange(dcount)
    consent = arr.u_consent[p_user]
    whole = arr.u_state[p_user] == WHOLE
    dead = arr.d_dead[p_device]
    c_no_consent = ~consent
    c_quiet = consent & whole
    c_dead = consent & ~whole & dead
    expected = consent & ~whole & ~dead
    suppressed = Counter(
        {
            "no_device": int((dcount == 0).sum()),
            "no_consent": int(c_no_consent.sum()),
            "quiet_hours_pending": int(c_quiet.sum()),
            "dead_token": int(c_dead.sum()),
        }
    )
    suppressed = Counter({k: v for k, v in suppressed.items() if v})

    e_event, e_user, e_device = p_event[expected], p_user[expected], p_device[expected]
    e_tenant = ev_tenant[e_event]
    e_until = arr.u_until[e_user]
    e_fcm = arr.d_fcm[e_device]
    n_pairs = len(e_event)
    deliveries = pd.DataFrame(
        {
            "tenant_id": np.array(TENANTS, dtype=object)[e_tenant],
            "notification_id": nids[e_event],
            "token": arr.d_token[e_device],
            "user_id": arr.user_ids[e_user % arr.users],
            "quiet_until": e_until,
        },
        columns=EXPECTED_COLUMNS,
    )
    expectation = Expectation(deliveries, suppressed)

    def natural(events: np.ndarray, until: np.ndarray) -> np.ndarray:
        t = ev_time[events] + 0.02 + rng.exponential(0.8, len(events))
        deferred = ~np.isnan(until) & (t < until)
        t[deferred] = until[deferred] + rng.uniform(0.2, 20.0, int(deferred.sum()))
        return t

    base = natural(e_event, e_until)
    role = np.zeros(n_pairs, dtype=np.int8)
    LOST, LOST_ATTEMPT, DUP, TRIPLE, MIXED, COLLAPSED, INSIDE, ACROSS, EARLY, LATE = range(1, 11)

    def frac(f: float, floor: int) -> int:
        return max(floor, int(n_pairs * f))

    everyone = np.ones(n_pairs, dtype=bool)
    shared_lost = _pick(rng, role, ev_shared[e_event], max(1, n_shared // 2), LOST)
    _pick(rng, role, everyone, frac(0.0002, 2), LOST)
    _pick(rng, role, everyone, frac(0.0002, 2), LOST_ATTEMPT)
    o_start, o_stop = OUTAGES[0]
    in_outage = (base > o_start + OUTAGE_GRACE_S + 0.05) & (base < o_stop - 0.05)
    n_across = _pick(rng, role, in_outage, frac(0.00001, 1), ACROSS)
    n_inside = _pick(rng, role, in_outage, frac(0.00001, 1), INSIDE) + n_across
    in_dups = (base >= DUP_WINDOW[0]) & (base < DUP_WINDOW[1])
    n_dup = _pick(rng, role, in_dups, frac(0.0008, 3), DUP)
    n_triple = _pick(rng, role, in_dups, frac(0.00005, 1), TRIPLE)
    n_mixed = _pick(rng, role, in_dups, frac(0.0001, 1), MIXED)
    in_collapse = (base >= COLLAPSE_WINDOW[0]) & (base < COLLAPSE_WINDOW[1])
    n_collapsed = _pick(rng, role, in_collapse, frac(0.0008, 3), COLLAPSED)
    deferred = ~np.isnan(e_until)
    n_early = _pick(
        rng, role, deferred & (ev_time[e_event] < e_until - 91.0), frac(0.00001, 2), EARLY
    )
    n_late = _pick(rng, role, deferred, frac(0.00001, 2), LATE)
    t = _settle(rng, base, e_fcm)
    t[role == INSIDE] = base[role == INSIDE]
    t[role == ACROSS] = base[role == ACROSS]
    early, late = role == EARLY, role == LATE
    t[early] = e_until[early] - rng.uniform(1.0, 90.0, int(early.sum()))
    t[late] = e_until[late] + RELEASE_BOUND_S + rng.uniform(5.0, 20.0, int(late.sum()))

    rows = _Rows()
    # Tenant 0's sender sets a collapse id (the notification id), tenant 1's does not.
    default_collapse = (e_tenant == 0).astype(np.int64)
    lost = (role == LOST) | (role == LOST_ATTEMPT)
    ok = ~lost & (role != COLLAPSED)
    collapse = np.where(np.isin(role, [DUP, TRIPLE, ACROSS]), 0, default_collapse)
    collapse[role == MIXED] = 1
    rows.add(t[ok], e_tenant[ok], e_event[ok], e_device[ok], 200, collapse[ok])
    sel = role == LOST_ATTEMPT
    rows.add(t[sel], e_tenant[sel], e_event[sel], e_device[sel], 503)
    for value, extra in ((DUP, 1), (TRIPLE, 2), (MIXED, 1)):
        sel = np.flatnonzero(role == value)
        for _ in range(extra):
            again = _settle(rng, t[sel] + rng.uniform(0.1, 3.0, len(sel)), e_fcm[sel])
            rows.add(again, e_tenant[sel], e_event[sel], e_device[sel], 200, 0)
    sel = np.flatnonzero(role == ACROSS)
    again = o_stop + rng.uniform(2.0, 20.0, len(sel))
    rows.add(again, e_tenant[sel], e_event[sel], e_device[sel], 200, 0)
    # Accepted then 5xx, retried with the same collapse id: the device shows one notification.
    sel = np.flatnonzero(role == COLLAPSED)
    rows.add(t[sel], e_tenant[sel], e_event[sel], e_device[sel], 500, 1, delivered=True)
    again = _settle(rng, t[sel] + rng.uniform(0.3, 2.0, len(sel)), e_fcm[sel])
    rows.add(again, e_tenant[sel], e_event[sel], e_device[sel], 200, 1)
    # Transient errors before the delivery (not while APNs throttles: those rows get 429s).
    sel = np.flatnonzero(ok & (rng.random(n_pairs) < 0.02))
    before = _settle(rng, t[sel] - rng.uniform(0.05, 0.5, len(sel)), e_fcm[sel])
    keep = e_fcm[sel] | (before < APNS_WINDOW[0] - 1.0) | (before > _rounds_end() + 1.0)
    sel, before = sel[keep], before[keep]
    rows.add(before, e_tenant[sel], e_event[sel], e_device[sel], 503)

    n_unexpected = 0
    # Deliveries the oracle did not expect: no consent, quiet all run, another tenant's device.
    for name, mask, share in (
        ("consent", c_no_consent & (arr.u_state[p_user] != WHOLE), 0.00002),
        ("quiet", c_quiet, 0.00002),
    ):
        pool = np.flatnonzero(mask & ~dead)
        sel = rng.choice(pool, min(len(pool), frac(share, 2)), replace=False)
        when = _settle(
            rng, natural(p_event[sel], arr.u_until[p_user[sel]]), arr.d_fcm[p_device[sel]]
        )
        rows.add(when, ev_tenant[p_event[sel]], p_event[sel], p_device[sel], 200, 0)
        planted.setdefault(name, {})["planted"] = len(sel)
        n_unexpected += len(sel)
    tenant0_only = np.flatnonzero((arr.d_tenant == 0) & ~arr.d_shared & ~arr.d_dead)
    n_foreign = min(frac(0.00001, 2), len(t1), len(tenant0_only))
    f_event = rng.choice(t1, n_foreign, replace=False)
    f_device = rng.choice(tenant0_only, n_foreign, replace=False)
    when = _settle(rng, natural(f_event, np.full(n_foreign, np.nan)), arr.d_fcm[f_device])
    rows.add(when, np.ones(n_foreign, dtype=np.int64), f_event, f_device, 200, 0)
    n_unexpected += n_foreign

    # Dead tokens: the first send answers 410/404, the token is dropped; a few sends still
    # follow within the in-flight grace, a few after it (the planted hygiene bugs).
    d_pairs = np.flatnonzero(c_dead)
    d_time = _settle(
        rng, natural(p_event[d_pairs], arr.u_until[p_user[d_pairs]]), arr.d_fcm[p_device[d_pairs]]
    )
    order = np.lexsort((d_time, p_device[d_pairs]))
    d_pairs, d_time = d_pairs[order], d_time[order]
    firsts = np.r_[True, p_device[d_pairs][1:] != p_device[d_pairs][:-1]][: len(d_pairs)]
    d_pairs, d_time = d_pairs[firsts], d_time[firsts]
    d_dev = p_device[d_pairs]
    d_status = np.where(arr.d_fcm[d_dev], 404, 410)
    rows.add(d_time, ev_tenant[p_event[d_pairs]], p_event[d_pairs], d_dev, d_status, 0)
    calm = np.ones(len(d_pairs), dtype=bool)
    for start, stop in [*OUTAGES, (APNS_WINDOW[0], _rounds_end())]:
        calm &= (d_time < start - 2.0) | (d_time > stop + 2.0)
    pool = np.flatnonzero(calm)
    n_after = min(len(pool), max(2, len(d_pairs) // 50))
    n_flight = max(0, min(len(pool) - n_after, max(1, len(d_pairs) // 50)))
    chosen = rng.choice(pool, n_after + n_flight, replace=False)
    for sel, offset in (
        (chosen[:n_after], DEAD_TRANSIT_S + rng.uniform(1.0, 50.0, n_after)),
        (chosen[n_after:], rng.uniform(0.001, 0.8 * DEAD_TRANSIT_S, n_flight)),
    ):
        when = _settle(rng, d_time[sel] + offset, arr.d_fcm[d_dev[sel]])
        rows.add(
            when,
            ev_tenant[p_event[d_pairs[sel]]],
            p_event[d_pairs[sel]],
            d_dev[sel],
            d_status[sel],
            0,
        )
    planted["dead_tokens"] = {"dead_tokens": len(d_pairs), "sends_after_dead": n_after}

    # APNs 429 with Retry-After: a throttled attempt one round before the one that went through.
    provider = rows.concat()
    a = APNS_WINDOW[0]
    apns = ~arr.d_fcm[provider["device"]]
    k = np.floor((provider["time"] - a) / ROUND_S)
    throttled = apns & (k >= 1) & (k <= _rounds()) & (provider["time"] >= a)
    throttled &= rng.random(len(k)) < THROTTLE_P
    sel = np.flatnonzero(throttled)
    t429 = a + (k[sel] - 1) * ROUND_S + rng.uniform(0.0, BURST_S, len(sel))
    rows.add(
        t429,
        provider["tenant"][sel],
        provider["event"][sel],
        provider["device"][sel],
        429,
        0,
        retry_after=RETRY_AFTER_S,
    )
    per_round = np.bincount((k[sel] - 1).astype(np.int64), minlength=_rounds() + 1)
    # The planted back-pressure bug: one request mid-silence in a few throttled rounds.
    busy = np.flatnonzero(per_round[1:-1] > 0) + 1
    bad_rounds = rng.choice(busy, min(len(busy), 5), replace=False)
    live_apns = np.flatnonzero(~arr.d_fcm & ~arr.d_dead)
    bad_dev = rng.choice(live_apns, len(bad_rounds))
    bad_event = rng.choice(np.flatnonzero(ev_tenant == 0), len(bad_rounds))
    rows.add(a + bad_rounds * ROUND_S + 0.6, arr.d_tenant[bad_dev], bad_event, bad_dev, 429)
    planted["backpressure"] = {
        "throttle_answers": len(sel),
        "requests_inside_retry_after": int(per_round[bad_rounds].sum()),
    }

    # DLQ: half the lost jobs were parked (one message per recipient user), plus poison messages
    # without a job in them.
    lost_idx = np.flatnonzero(lost)
    parked = rng.choice(lost_idx, len(lost_idx) // 2 + 1, replace=False)
    park_key = np.unique(e_event[parked] * len(arr.u_tenant) + e_user[parked])
    p_ev, p_user_g = park_key // len(arr.u_tenant), park_key % len(arr.u_tenant)
    in_dlq = int(np.isin(e_event[lost_idx] * len(arr.u_tenant) + e_user[lost_idx], park_key).sum())
    dlq = {"event": p_ev, "user": p_user_g, "tenant": ev_tenant[p_ev], "poison": 3}

    nid_shared = ev_shared[e_event]
    planted["effectively_once"] = {
        "expected": n_pairs,
        "delivered": n_pairs - int(lost.sum()),
        "lost": int(lost.sum()),
        "duplicated": n_dup + 2 * n_triple + n_mixed + n_collapsed + n_across,
        "collapsed": n_collapsed,
        "visible_duplicates": n_dup + 2 * n_triple + n_mixed + n_across,
        "unexpected": n_unexpected,
    }
    planted["fail_closed"] = {
        "outage_windows": len(OUTAGES),
        "deliveries_during_outage": n_inside,
        "duplicated_across_outage": n_across,
    }
    planted["quiet_hours"] = {
        "deferred_expected": int(deferred.sum()),
        "deferred_delivered": int((deferred & ~lost).sum()),
        "delivered_inside_window": n_early + planted.pop("quiet")["planted"],
        "released_late": n_late,
    }
    planted["consent"] = {
        "users_without_consent": int((~arr.u_consent).sum()),
        "deliveries_without_consent": planted.pop("consent")["planted"],
    }
    planted["tenant_isolation"] = {
        "ids_minted_by_several_tenants": n_shared,
        "devices_shared_by_tenants": int(arr.d_shared.sum()) // 2,
        "deliveries_to_foreign_devices": n_foreign,
        "shared_id_deliveries_lost": int((lost & nid_shared).sum()),
    }
    planted["dlq_accountability"] = {
        "expected": n_pairs,
        "in_dlq": in_dlq,
        "vanished": int(lost.sum()) - in_dlq,
        "dlq_messages": len(park_key) + dlq["poison"],
    }
    assert shared_lost >= 1
    events = {"author": ev_author, "time": ev_time, "tenant": ev_tenant, "nid": nids}
    return expectation, {"provider": rows.concat(), "events": events, "dlq": dlq}, planted


def _frame(
    rows: int, arr: _Arrays, parts: dict[str, Any], rng: np.random.Generator
) -> pd.DataFrame:
    """The history table, with the runner's dtypes; ``rows`` fixes its length (samples fill)."""
    prov, events, dlq = parts["provider"], parts["events"], parts["dlq"]
    # The ledgers come in at the end of the run, APNs then FCM, each in time order.
    fcm = arr.d_fcm[prov["device"]]
    order = np.lexsort((prov["time"], fcm))
    prov = {k: v[order] for k, v in prov.items()}
    fcm = fcm[order]
    n_prov = len(prov["time"])
    n_events = len(events["time"])
    n_dlq = len(dlq["event"]) + dlq["poison"]
    fault_rows = sum(2 if stop is not None else 1 for _, _, stop, _ in FAULTS)
    fixed = n_events + fault_rows + 4 + n_prov + n_dlq
    n_sample = rows - fixed
    if n_sample < 0:
        raise OverflowError(fixed)

    # Runner-side rows (inject, fault, phase, action, sample) in time order, then the ledgers,
    # then the DLQ contents.
    faults = []
    for i, (name, start, stop, params) in enumerate(FAULTS):
        for phase, offset in (("start", start), ("stop", stop)):
            if offset is not None:
                detail = {"window": f"w{i:09d}", "fault": name, "phase": phase, "params": params}
                faults.append((S0 + offset, json.dumps(detail)))
    phases = [
        (S0 - 30.0, "phase", json.dumps({"stack_up": {"api": 1, "consumer": 2}})),
        (S0 - 1.0, "phase", "population_loaded"),
        (S0 + 540.0, "action", "redrive-dlq"),
        (S0 + RUN_S, "phase", "settled"),
    ]
    queues = ("fanout-push", "fanout-push-dlq", "fanout-push-poison")
    samples = [
        json.dumps({"queue": q, "depth": d, "visible": d, "in_flight": 0, "delayed": 0})
        for q in queues
        for d in (0, 10, 1000)
    ]
    kinds = ["inject", "fault", "phase", "action", "sample", "provider", "dlq"]
    details = ["post"] + [d for _, d in faults] + [d for _, _, d in phases] + samples
    detail_code = np.concatenate(
        [
            np.zeros(n_events, dtype=np.int64),
            np.arange(1, 1 + len(faults)),
            np.arange(1 + len(faults), 1 + len(faults) + len(phases)),
            1 + len(faults) + len(phases) + rng.integers(0, len(samples), n_sample),
        ]
    )
    run_time = np.concatenate(
        [
            events["time"],
            [t for t, _ in faults],
            [t for t, _, _ in phases],
            S0 + rng.uniform(0.0, RUN_S, n_sample),
        ]
    )
    run_kind = np.concatenate(
        [
            np.zeros(n_events, dtype=np.int64),
            np.ones(len(faults), dtype=np.int64),
            [kinds.index(k) for _, k, _ in phases],
            np.full(n_sample, 4),
        ]
    ).astype(np.int64)
    n_run = len(run_time)
    run_event = np.r_[np.arange(n_events), np.full(n_run - n_events, -1)]
    order = np.argsort(run_time, kind="stable")
    run_time, run_kind, run_event, detail_code = (
        run_time[order],
        run_kind[order],
        run_event[order],
        detail_code[order],
    )

    dlq_event = np.r_[dlq["event"], np.full(dlq["poison"], -1)]
    dlq_user = np.r_[dlq["user"], np.full(dlq["poison"], -1)]
    dlq_details = [json.dumps({"queue": "fanout-push-dlq", "recipient_user_id": None})] + [
        json.dumps({"queue": "fanout-push-dlq", "recipient_user_id": u})
        for u in arr.user_ids.tolist()
    ]
    end = S0 + RUN_S + 5.0
    time_ = np.concatenate([run_time, prov["time"], np.full(n_dlq, end)])
    kind = np.concatenate([run_kind, np.full(n_prov, 5), np.full(n_dlq, 6)])
    event = np.concatenate([run_event, prov["event"], dlq_event])
    tenant = np.where(event >= 0, events["tenant"][np.maximum(event, 0)], -1)
    tenant[n_run : n_run + n_prov] = prov["tenant"]
    no_detail = -1
    detail = np.concatenate(
        [
            detail_code,
            np.full(n_prov, no_detail),
            len(details) + np.where(dlq_user >= 0, 1 + dlq_user % arr.users, 0),
        ]
    )
    author = np.full(len(time_), -1)
    author[:n_run] = np.where(
        run_kind == 0, arr.a_user[events["author"][np.maximum(run_event, 0)]] % arr.users, -1
    )
    device = np.r_[np.full(n_run, -1), prov["device"], np.full(n_dlq, -1)]
    status = prov["status"]
    reason_keys = sorted({k for k in REASONS})
    reason_names = [REASONS[k] for k in reason_keys]
    reason_code = np.full(n_prov, -1)
    for i, (f, s) in enumerate(reason_keys):
        if reason_names[i] is not None:
            reason_code[(fcm == bool(f)) & (status == s)] = i
    seq = np.arange(len(time_))
    mono = np.where(kind == 5, np.nan, time_ - S0 + 1000.0)
    pad = np.full(n_run, -1)
    prov_pad = np.full(n_dlq, -1)
    nid_code = np.where(event >= 0, event, -1)
    collapse = np.r_[pad, np.where(prov["collapse"] == 1, prov["event"], -1), prov_pad]
    columns = {
        "seq": pa.array(seq, pa.int64()),
        "kind": _strings(kind, kinds),
        "time": pa.array(time_, pa.float64()),
        "end": pa.array(np.full(len(time_), np.nan), pa.float64()),
        "mono": pa.array(mono, pa.float64()),
        "tenant_id": _strings(tenant, list(TENANTS)),
        "user_id": pa.nulls(len(time_), pa.large_string()),
        "author_id": _strings(author, arr.user_ids),
        "notification_id": _strings(nid_code, events["nid"]),
        "token": _strings(device, arr.d_token),
        "provider": _strings(np.r_[pad, fcm.astype(np.int64), prov_pad], ["apns", "fcm"]),
        "project": _strings(
            np.r_[pad, np.where(fcm, prov["tenant"], -1), prov_pad], list(PROJECTS)
        ),
        "status": pa.array(
            np.r_[pad, status, prov_pad], pa.int64(), mask=np.r_[pad, status, prov_pad] < 0
        ),
        "reason": _strings(np.r_[pad, reason_code, prov_pad], reason_names),
        "delivered": pa.array(
            np.r_[np.zeros(n_run, bool), prov["delivered"], np.zeros(n_dlq, bool)],
            pa.bool_(),
            mask=np.r_[np.ones(n_run, bool), np.zeros(n_prov, bool), np.ones(n_dlq, bool)],
        ),
        "collapse_id": _strings(collapse, events["nid"]),
        "retry_after": pa.array(
            np.r_[np.full(n_run, np.nan), prov["retry_after"], np.full(n_dlq, np.nan)], pa.float64()
        ),
        "detail": _strings(detail, details + dlq_details),
    }
    frame = pa.table(columns).to_pandas(types_mapper=_pandas_type)
    return frame[list(COLUMNS)].astype(COLUMNS)


def _pandas_type(arrow_type: pa.DataType) -> Any:
    if pa.types.is_large_string(arrow_type) or pa.types.is_string(arrow_type):
        return pd.StringDtype()
    if pa.types.is_boolean(arrow_type):
        return pd.BooleanDtype()
    if pa.types.is_integer(arrow_type):
        return pd.Int64Dtype()
    return None


def synthesize(rows: int = 10_000_000, seed: int = 7) -> Synthetic:
    """A population, expectation and history of exactly ``rows`` rows, with planted defects."""
    rng = np.random.default_rng(seed)
    population, arr = build_population(max(60, rows // 100), rng)
    # Retries, throttled attempts and dead-token answers add about 4% to the expected
    # deliveries; sample rows fill what is left, and a history that would overflow is rebuilt
    # with fewer events.
    target = int(rows * 0.955)
    for _ in range(4):
        expectation, parts, planted = _build(np.random.default_rng([seed, target]), arr, target)
        try:
            history = _frame(rows, arr, parts, rng)
            break
        except OverflowError as over:
            target = int(target * rows / over.args[0] * 0.99)
    else:
        raise RuntimeError(f"could not fit the history into {rows} rows")
    population.seed = seed
    return Synthetic(population, expectation, history, planted)


# --- timing ----------------------------------------------------------------------------------


def _rss_mb() -> float:
    """Peak RSS so far (since the last reset), from getrusage."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _reset_peak_rss() -> bool:
    """Start the peak RSS afresh (Linux: clear_refs 5), so that the checkers' peak is not the
    generator's; False where the kernel does not allow it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def time_checkers(
    synthetic: Synthetic,
    probes: tuple[str, ...] | None = None,
    log: Any = print,
    cold: bool = False,
) -> tuple[dict[str, dict[str, float]], dict[str, Verdict], dict[str, str]]:
    """Wall and CPU seconds and the verdict per probe, each through run_probe with the game
    day's tolerances, in the order given; a checker that raises is timed and reported.

    Checkers keep a frame's string encodings while it lives, so later ones reuse what earlier
    ones hashed, as in a run. ``cold`` hands each checker fresh frames (the copy untimed) to
    show what it costs alone."""
    evidence = synthetic.evidence()
    seconds, verdicts, errors = {}, {}, {}
    for name in probes if probes is not None else known_checkers():
        if cold:
            expectation = Expectation(
                synthetic.expectation.deliveries.copy(), synthetic.expectation.suppressed
            )
            evidence = Evidence(
                synthetic.population, expectation, synthetic.history.copy(), synthetic.policy
            )
        started, cpu = time.perf_counter(), time.process_time()
        try:
            verdicts[name] = run_probe(name, TOLERANCES.get(name, {}), evidence)
        except Exception as exc:  # the others still get timed
            errors[name] = f"{type(exc).__name__}: {exc}"
        seconds[name] = {
            "wall": time.perf_counter() - started,
            "cpu": time.process_time() - cpu,
            "peak_rss_mb": _rss_mb(),
        }
        _reset_peak_rss()
        outcome = (
            f"valid={verdicts[name].valid}  {verdicts[name].counts}"
            if name in verdicts
            else f"ERROR {errors[name]}"
        )
        log(
            f"{name:<20} {seconds[name]['wall']:7.2f} s (cpu {seconds[name]['cpu']:6.2f})  {outcome}"
        )
    return seconds, verdicts, errors


def found(planted: dict[str, dict[str, int]], verdicts: dict[str, Verdict]) -> dict[str, bool]:
    """Per checker: every planted count equals the count the checker reported."""
    return {
        name: all(verdicts[name].counts.get(k) == v for k, v in counts.items())
        for name, counts in planted.items()
        if name in verdicts
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "reports" / "bench" / "checkers.json"))
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--probes",
        default=",".join(p for p in known_checkers() if p not in NOT_YET_VECTORISED),
        help="comma-separated; default: every known checker but the ones not yet vectorised",
    )
    parser.add_argument(
        "--cold", action="store_true", help="no checker reuses another's string encodings"
    )
    args = parser.parse_args(argv)
    probes = tuple(p for p in args.probes.split(",") if p)
    for name in sorted(set(NOT_YET_VECTORISED) - set(probes)):
        print(f"not timed: {name}: {NOT_YET_VECTORISED[name]}", flush=True)

    load_start = [round(x, 2) for x in os.getloadavg()]
    print(f"generating a synthetic history of {args.rows:,} rows (seed {args.seed})", flush=True)
    started = time.perf_counter()
    synthetic = synthesize(args.rows, args.seed)
    generation_s = time.perf_counter() - started
    history = synthetic.history
    kinds = history["kind"].value_counts().to_dict()
    rss_generation = _rss_mb()
    print(
        f"generated in {generation_s:.1f} s (not counted): {len(history):,} rows {kinds}, "
        f"{len(synthetic.expectation.deliveries):,} expected deliveries, "
        f"{len(synthetic.population.users):,} users, {len(synthetic.population.devices):,} "
        f"devices; peak RSS so far {rss_generation:,.0f} MB",
        flush=True,
    )
    print(f"timing {len(probes)} checkers: {', '.join(probes)}", flush=True)
    peaks_apart = _reset_peak_rss()
    seconds, verdicts, errors = time_checkers(
        synthetic, probes, log=lambda line: print(line, flush=True), cold=args.cold
    )
    total = sum(s["wall"] for s in seconds.values())
    matches = found(synthetic.planted, verdicts)
    report = {
        "benchmark": "checkers",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "pandas": pd.__version__,
        "numpy": np.__version__,
        "pyarrow": pa.__version__,
        "load_average_at_start": load_start,
        "seed": args.seed,
        "probes": list(probes),
        "not_timed": {k: v for k, v in NOT_YET_VECTORISED.items() if k not in probes},
        "cache": "cold: fresh frames per checker" if args.cold else "shared, in probe order",
        "rows": len(history),
        "rows_by_kind": {k: int(v) for k, v in kinds.items()},
        "expected_deliveries": len(synthetic.expectation.deliveries),
        "users": len(synthetic.population.users),
        "devices": len(synthetic.population.devices),
        "generation_seconds": round(generation_s, 2),
        "checker_seconds": {k: round(v["wall"], 3) for k, v in seconds.items()},
        "checker_cpu_seconds": {k: round(v["cpu"], 3) for k, v in seconds.items()},
        "total_seconds": round(total, 2),
        "total_cpu_seconds": round(sum(s["cpu"] for s in seconds.values()), 2),
        "limit_seconds": LIMIT_S,
        "under_60s": total < LIMIT_S and not errors,
        "slowest": sorted(seconds, key=lambda k: -seconds[k]["wall"])[:3],
        # With the peak reset between phases (Linux), each figure is that phase's own peak,
        # the history and expectation held throughout included.
        "peak_rss_mb": max([rss_generation, *(s["peak_rss_mb"] for s in seconds.values())]),
        "peak_rss_mb_generation": rss_generation,
        "peak_rss_mb_checkers": (
            max((s["peak_rss_mb"] for s in seconds.values()), default=None) if peaks_apart else None
        ),
        "checker_peak_rss_mb": (
            {k: v["peak_rss_mb"] for k, v in seconds.items()} if peaks_apart else None
        ),
        "tolerances": {p: TOLERANCES.get(p, {}) for p in probes},
        "verdicts": {k: {"valid": v.valid, **v.counts} for k, v in verdicts.items()},
        "errors": errors,
        "planted": {k: v for k, v in synthetic.planted.items() if k in probes},
        "planted_found": matches,
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    missed = [k for k, ok in matches.items() if not ok]
    print(
        f"total {total:.2f} s (cpu {report['total_cpu_seconds']:.2f} s) for {len(seconds)} "
        f"checkers over {len(history):,} rows: {'under' if report['under_60s'] else 'NOT under'} "
        f"{LIMIT_S:.0f} s; peak RSS {report['peak_rss_mb']:,.0f} MB; planted defects "
        + ("all found" if not missed else f"NOT matched by {', '.join(missed)}")
    )
    print(f"wrote {out}")
    return 0 if report["under_60s"] and not missed else 1


if __name__ == "__main__":
    sys.exit(main())
