"""Checkers benchmark: every checker over synthetic run histories of 10 and 100 million rows,
each called through ``run_probe`` exactly as the runner calls it, in memory (pandas, today's
path) and out of core (DuckDB over the Parquet files, ``harness.checkers.store``).

    .venv/bin/python benchmarks/bench_checkers.py --out reports/bench/checkers.json

``--rows 10000000,100000000`` (the default) sizes the histories; each is generated a chunk of
events at a time straight to ``history.parquet`` and ``expected.parquet`` (``--data DIR``,
``--keep`` to keep them), then each engine runs in a process of its own (so that its peak RSS is
its own), with the population made again from the seed there (not counted). Histories above
``--pandas-max-rows`` (10M) do not fit in memory: DuckDB only, within ``--memory-limit-gb``
(4). ``--probes a,b`` times some checkers only. The JSON holds per size and engine the wall
and CPU seconds per checker, DuckDB's preparation (reading the files once: counted in its
total), pandas' read (apart), peak RSS (getrusage, per phase where Linux lets the peak be
reset), the verdicts, the planted counts with whether each checker found exactly them, whether
both engines gave the same verdicts, and ``under_limits`` (10 minutes, 8 GB).

The history plays a 10-minute game day: SQS duplicate delivery, a dedup outage and a short
black hole, an APNs 429 window with Retry-After that the sender honours in bursts, APNs
"accepted then 5xx", and an FCM fault still open at the end. On top of that a known number of
each defect is planted (visible and collapsed duplicates, losses with and without a DLQ
message, deliveries inside the outage, requests inside Retry-After, sends after a dead-token
answer, deliveries without consent or inside quiet hours, early and late releases, deliveries
to another tenant's device, audit 'sent' records for attempts APNs answered 429); the report
puts the planted counts beside the verdicts.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import hashlib
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from harness.checkers import Evidence, Verdict, run_probe  # noqa: E402
from harness.checkers.registry import get as get_checker  # noqa: E402
from harness.checkers.registry import known as known_checkers  # noqa: E402
from harness.checkers.store import HistoryStore  # noqa: E402
from harness.model.history import COLUMNS  # noqa: E402
from harness.model.history import SCHEMA as HISTORY_SCHEMA  # noqa: E402
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

# make bench's goal: every checker over the largest history within 10 minutes and 8 GB.
LIMIT_S = 600.0
LIMIT_RSS_MB = 8192
# DuckDB's cap in the benchmark: the process also holds the population in Python objects
# (about 4 GB at 100M rows' 2M users), and the goal is the whole process under 8 GB.
DUCKDB_MEMORY_GB = 3.0
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
# Checkers that do not query the store yet: with the history on disk they read it into memory
# whole, which a history over --pandas-max-rows does not fit; there they are left out, and the
# report says so.
NOT_OUT_OF_CORE: dict[str, str] = {
    name: "does not query the store yet: it would read the whole history into memory"
    for name in known_checkers()
    if not get_checker(name).out_of_core and get_checker(name).reads is None
}

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


# Expected pairs per chunk: a history of any size is generated, and written, a chunk of events
# at a time (100M rows in about this many rows' worth of arrays at once).
CHUNK_PAIRS = 4_000_000
KINDS = ["inject", "fault", "phase", "action", "sample", "provider", "dlq", "dedup_sample", "audit"]
# The history as the generator writes it: the runner's columns, strings as large_string (a
# chunk's token column passes 2 GB).
BENCH_SCHEMA = pa.schema(
    [
        (name, pa.large_string() if dtype == "string" else field.type)
        for (name, dtype), field in zip(COLUMNS.items(), HISTORY_SCHEMA, strict=True)
    ]
)


class _Sink:
    """Where the generated rows go: kept as Arrow tables (a small history, returned as frames)
    or appended to ``history.parquet`` and ``expected.parquet`` in ``out``."""

    def __init__(self, out: Path | None) -> None:
        self.out = out
        self.rows = 0
        self.history: list[pa.Table] = []
        self.expected: list[pa.Table] = []
        self._history_writer: pq.ParquetWriter | None = None
        self._expected_writer: pq.ParquetWriter | None = None
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            self._history_writer = pq.ParquetWriter(out / "history.parquet", BENCH_SCHEMA)
            self._expected_writer = pq.ParquetWriter(out / "expected.parquet", EXPECTED_SCHEMA)

    def add_history(self, columns: dict[str, pa.Array]) -> None:
        n = len(columns["time"])
        columns["seq"] = pa.array(np.arange(self.rows, self.rows + n), pa.int64())
        # a column a kind does not fill (the provider rows' push attributes elsewhere): null
        table = pa.table(
            {
                name: columns[name]
                if name in columns
                else pa.nulls(n, BENCH_SCHEMA.field(name).type)
                for name in COLUMNS
            }
        ).cast(BENCH_SCHEMA)
        self.rows += n
        if self._history_writer is not None:
            self._history_writer.write_table(table, row_group_size=1_000_000)
        else:
            self.history.append(table)

    def add_expected(self, table: pa.Table) -> None:
        table = table.cast(EXPECTED_SCHEMA)
        if self._expected_writer is not None:
            self._expected_writer.write_table(table, row_group_size=1_000_000)
        else:
            self.expected.append(table)

    def close(self) -> None:
        for writer in (self._history_writer, self._expected_writer):
            if writer is not None:
                writer.close()


EXPECTED_SCHEMA = pa.schema(
    [
        ("tenant_id", pa.large_string()),
        ("notification_id", pa.large_string()),
        ("token", pa.large_string()),
        ("user_id", pa.large_string()),
        ("quiet_until", pa.float64()),
    ]
)


@dataclass
class _Run:
    """What the chunks share: the events, the devices already told dead, the throttled
    answers per round, the jobs parked in the DLQ, and the planted counts so far."""

    author: np.ndarray
    time: np.ndarray
    tenant: np.ndarray
    nid: np.ndarray
    shared: np.ndarray
    told: np.ndarray
    per_round: np.ndarray
    parked: list[np.ndarray]
    counts: Counter[str]
    suppressed: Counter[str]
    # Each device's token as a code (devices in two tenants share a token): made once.
    token_code: np.ndarray | None = None


def _generate(
    rng: np.random.Generator, arr: _Arrays, target_pairs: int, sink: _Sink, chunk_pairs: int
) -> tuple[Counter[str], dict[str, dict[str, int]], _Run]:
    """Every chunk's expected deliveries and provider rows into ``sink``; the suppressed counts,
    the planted counts and the run's shared state back (runner and DLQ rows not written yet)."""
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
    run = _Run(
        ev_author, ev_time, ev_tenant, nids, ev_shared,
        told=np.zeros(len(arr.d_user), dtype=bool),
        per_round=np.zeros(_rounds() + 1, dtype=np.int64),
        parked=[], counts=Counter(), suppressed=Counter(),
    )  # fmt: skip
    # Consecutive events (in time order) whose followers add up to about chunk_pairs.
    followers = np.cumsum(arr.a_count[ev_author])
    bounds = np.searchsorted(followers, np.arange(chunk_pairs, followers[-1], chunk_pairs))
    for events in np.split(np.arange(n_events), np.unique(bounds + 1)):
        if len(events):
            _chunk(rng, arr, run, events, sink)
    c = run.counts
    planted = {
        "effectively_once": {
            "expected": c["pairs"],
            "delivered": c["pairs"] - c["lost"],
            "lost": c["lost"],
            "duplicated": c["dup"] + 2 * c["triple"] + c["mixed"] + c["collapsed"] + c["across"],
            "collapsed": c["collapsed"],
            "visible_duplicates": c["dup"] + 2 * c["triple"] + c["mixed"] + c["across"],
            "unexpected": c["unexpected"],
        },
        "fail_closed": {
            "outage_windows": len(OUTAGES),
            "deliveries_during_outage": c["inside"],
            "duplicated_across_outage": c["across"],
        },
        "quiet_hours": {
            "deferred_expected": c["deferred"],
            "deferred_delivered": c["deferred_delivered"],
            "delivered_inside_window": c["early"] + c["quiet"],
            "released_late": c["late"],
        },
        "consent": {
            "users_without_consent": int((~arr.u_consent).sum()),
            "deliveries_without_consent": c["consent"],
        },
        "tenant_isolation": {
            "ids_minted_by_several_tenants": n_shared,
            "devices_shared_by_tenants": int(arr.d_shared.sum()) // 2,
            "deliveries_to_foreign_devices": c["foreign"],
            "shared_id_deliveries_lost": c["shared_lost"],
        },
        "dead_tokens": {"dead_tokens": c["dead"], "sends_after_dead": c["after_dead"]},
        "audit_outcomes": {
            "sent_records": c["audit_sent"] + c["audit_over"],
            "devices_judged": c["audit_sent"],
            "sent_beyond_acceptance": c["audit_over"],
            "devices_over": c["audit_over"],
        },
    }
    assert c["shared_lost_picked"] >= 1
    return run.suppressed, planted, run


def _chunk(
    rng: np.random.Generator, arr: _Arrays, run: _Run, events: np.ndarray, sink: _Sink
) -> None:
    """One chunk of events: its expected deliveries and its provider rows, with the defects
    planted in proportion."""
    ev_time, ev_tenant, ev_shared = run.time, run.tenant, run.shared
    counts = run.counts
    # Every (event, follower, device) in the oracle's order: events, followers, devices.
    fcount = arr.a_count[run.author[events]]
    f_event = np.repeat(events, fcount)
    follower = arr.f_users[
        np.repeat(arr.a_start[run.author[events]], fcount) + _ragged_arange(fcount)
    ]
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
    run.suppressed.update(
        {
            "no_device": int((dcount == 0).sum()),
            "no_consent": int(c_no_consent.sum()),
            "quiet_hours_pending": int(c_quiet.sum()),
            "dead_token": int(c_dead.sum()),
        }
    )
    e_event, e_user, e_device = p_event[expected], p_user[expected], p_device[expected]
    e_tenant = ev_tenant[e_event]
    e_until = arr.u_until[e_user]
    e_fcm = arr.d_fcm[e_device]
    n_pairs = len(e_event)
    sink.add_expected(
        pa.table(
            {
                "tenant_id": _strings(e_tenant, list(TENANTS)),
                "notification_id": _strings(e_event, run.nid),
                "token": _strings(e_device, arr.d_token),
                "user_id": _strings(e_user % arr.users, arr.user_ids),
                "quiet_until": pa.array(e_until, pa.float64(), from_pandas=True),
            }
        )
    )
    counts["pairs"] += n_pairs

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
    in_shared = ev_shared[e_event]
    if in_shared.any():
        n_shared_here = len(np.unique(e_event[in_shared]))
        counts["shared_lost_picked"] += _pick(
            rng, role, in_shared, max(1, n_shared_here // 2), LOST
        )
    _pick(rng, role, everyone, frac(0.0002, 2), LOST)
    _pick(rng, role, everyone, frac(0.0002, 2), LOST_ATTEMPT)
    o_start, o_stop = OUTAGES[0]
    in_outage = (base > o_start + OUTAGE_GRACE_S + 0.05) & (base < o_stop - 0.05)
    n_across = _pick(rng, role, in_outage, frac(0.00001, 1), ACROSS)
    n_inside = _pick(rng, role, in_outage, frac(0.00001, 1), INSIDE) + n_across
    in_dups = (base >= DUP_WINDOW[0]) & (base < DUP_WINDOW[1])
    counts["dup"] += _pick(rng, role, in_dups, frac(0.0008, 3), DUP)
    counts["triple"] += _pick(rng, role, in_dups, frac(0.00005, 1), TRIPLE)
    counts["mixed"] += _pick(rng, role, in_dups, frac(0.0001, 1), MIXED)
    in_collapse = (base >= COLLAPSE_WINDOW[0]) & (base < COLLAPSE_WINDOW[1])
    counts["collapsed"] += _pick(rng, role, in_collapse, frac(0.0008, 3), COLLAPSED)
    deferred = ~np.isnan(e_until)
    counts["early"] += _pick(
        rng, role, deferred & (ev_time[e_event] < e_until - 91.0), frac(0.00001, 2), EARLY
    )
    counts["late"] += _pick(rng, role, deferred, frac(0.00001, 2), LATE)
    counts["across"] += n_across
    counts["inside"] += n_inside
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
        counts[name] += len(sel)
        counts["unexpected"] += len(sel)
    t1 = events[ev_tenant[events] == 1]
    tenant0_only = np.flatnonzero((arr.d_tenant == 0) & ~arr.d_shared & ~arr.d_dead)
    n_foreign = min(frac(0.00001, 2), len(t1), len(tenant0_only))
    f_event = rng.choice(t1, n_foreign, replace=False)
    f_device = rng.choice(tenant0_only, n_foreign, replace=False)
    when = _settle(rng, natural(f_event, np.full(n_foreign, np.nan)), arr.d_fcm[f_device])
    rows.add(when, np.ones(n_foreign, dtype=np.int64), f_event, f_device, 200, 0)
    counts["foreign"] += n_foreign
    counts["unexpected"] += n_foreign

    # Dead tokens: the first send answers 410/404, the token is dropped (a device told in an
    # earlier chunk gets nothing more); a few sends still follow within the in-flight grace, a
    # few after it (the planted hygiene bugs).
    d_pairs = np.flatnonzero(c_dead & ~run.told[p_device])
    d_time = _settle(
        rng, natural(p_event[d_pairs], arr.u_until[p_user[d_pairs]]), arr.d_fcm[p_device[d_pairs]]
    )
    order = np.lexsort((d_time, p_device[d_pairs]))
    d_pairs, d_time = d_pairs[order], d_time[order]
    firsts = np.r_[True, p_device[d_pairs][1:] != p_device[d_pairs][:-1]][: len(d_pairs)]
    d_pairs, d_time = d_pairs[firsts], d_time[firsts]
    d_dev = p_device[d_pairs]
    run.told[d_dev] = True
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
    counts["dead"] += len(d_pairs)
    counts["after_dead"] += n_after

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
    run.per_round += np.bincount((k[sel] - 1).astype(np.int64), minlength=_rounds() + 1)
    counts["throttles"] += len(sel)
    _audit_throttled(rng, arr, run, provider, sel, rows.concat(), frac(0.0001, 3), sink)

    # DLQ: about half the lost jobs were parked (one message per recipient user).
    lost_idx = np.flatnonzero(lost)
    parked = rng.choice(lost_idx, len(lost_idx) // 2 + 1, replace=False)
    park_key = np.unique(e_event[parked] * len(arr.u_tenant) + e_user[parked])
    run.parked.append(park_key)
    counts["in_dlq"] += int(
        np.isin(e_event[lost_idx] * len(arr.u_tenant) + e_user[lost_idx], park_key).sum()
    )
    counts["lost"] += int(lost.sum())
    counts["shared_lost"] += int((lost & ev_shared[e_event]).sum())
    counts["deferred"] += int(deferred.sum())
    counts["deferred_delivered"] += int((deferred & ~lost).sum())
    del provider
    sink.add_history(_provider_columns(rows.concat(), arr, run.nid))


def _audit_throttled(
    rng: np.random.Generator,
    arr: _Arrays,
    run: _Run,
    provider: dict[str, np.ndarray],
    throttled: np.ndarray,
    every: dict[str, np.ndarray],
    wanted: int,
    sink: _Sink,
) -> None:
    """The audit trail of some devices APNs throttled, then accepted once (``throttled``:
    rows of ``provider`` answered 200 a round after a 429; ``every``: all the chunk's provider
    rows): a 'sent' record each, for a tenth of them (at least one) a second 'sent' written
    for the 429 (the planted ``audit_outcomes`` defect), and a few records stored twice.

    Few records (``wanted``, about 1 per 10,000 expected deliveries): the audit checkers read
    the trail into memory, and a record per send would time the trail, not the history."""
    if run.token_code is None:
        run.token_code = np.unique(arr.d_token, return_inverse=True)[1].astype(np.int64)
    n_tok = int(run.token_code.max()) + 1
    n_events = len(run.nid)

    def key(rows: dict[str, np.ndarray], at: np.ndarray | slice = slice(None)) -> np.ndarray:
        return (rows["tenant"][at] * n_events + rows["event"][at]) * n_tok + run.token_code[
            rows["device"][at]
        ]

    accepted, n_accepted = np.unique(key(every, every["status"] == 200), return_counts=True)
    once = accepted[n_accepted == 1]
    pool = throttled[provider["status"][throttled] == 200]
    pool = pool[np.isin(key(provider, pool), once)]
    chosen = rng.choice(pool, min(len(pool), wanted), replace=False)
    n_over = max(1, len(chosen) // 10) if len(chosen) else 0
    n_twice = len(chosen) // 20
    rows = np.r_[chosen, chosen[:n_over], chosen[n_over : n_over + n_twice]]
    attempt = np.r_[np.full(len(chosen), 2), np.ones(n_over, int), np.full(n_twice, 2)]
    at = provider["time"][rows]
    details = [
        json.dumps(
            {
                "at": datetime.fromtimestamp(when, UTC).isoformat(),
                "channel": "push",
                "attempt": int(n),
                "decrypted": {"token_sha256": hashlib.sha256(token.encode()).hexdigest()},
            }
        )
        for when, n, token in zip(at, attempt, arr.d_token[provider["device"][rows]], strict=True)
    ]
    n = len(rows)
    nothing = pa.nulls(n, pa.large_string())
    sink.add_history(
        {
            "kind": _strings(np.full(n, KINDS.index("audit")), KINDS),
            "time": pa.array(at, pa.float64()),
            "end": pa.nulls(n, pa.float64()),
            "mono": pa.nulls(n, pa.float64()),
            "tenant_id": _strings(provider["tenant"][rows], list(TENANTS)),
            "user_id": nothing,
            "author_id": nothing,
            "notification_id": _strings(provider["event"][rows], run.nid),
            "token": nothing,
            "provider": nothing,
            "project": nothing,
            "status": pa.nulls(n, pa.int64()),
            "reason": _strings(np.zeros(n, np.int64), ["sent"]),
            "delivered": pa.nulls(n, pa.bool_()),
            "collapse_id": nothing,
            "retry_after": pa.nulls(n, pa.float64()),
            "detail": pa.array(details, pa.large_string()),
        }
    )
    run.counts["audit_sent"] += len(chosen)
    run.counts["audit_over"] += n_over


def _provider_columns(
    prov: dict[str, np.ndarray], arr: _Arrays, nids: np.ndarray
) -> dict[str, pa.Array]:
    """Ledger rows as history columns: APNs then FCM, each in time order (as the simulators'
    ledgers come in)."""
    fcm = arr.d_fcm[prov["device"]]
    order = np.lexsort((prov["time"], fcm))
    prov = {k: v[order] for k, v in prov.items()}
    fcm = fcm[order]
    n = len(prov["time"])
    status = prov["status"]
    reason_keys = sorted(REASONS)
    reason_names = [REASONS[k] for k in reason_keys]
    reason_code = np.full(n, -1)
    for i, (f, s) in enumerate(reason_keys):
        if reason_names[i] is not None:
            reason_code[(fcm == bool(f)) & (status == s)] = i
    nothing = pa.nulls(n, pa.large_string())
    return {
        "kind": _strings(np.full(n, KINDS.index("provider")), KINDS),
        "time": pa.array(prov["time"], pa.float64()),
        "end": pa.nulls(n, pa.float64()),
        "mono": pa.nulls(n, pa.float64()),
        "tenant_id": _strings(prov["tenant"], list(TENANTS)),
        "user_id": nothing,
        "author_id": nothing,
        "notification_id": _strings(prov["event"], nids),
        "token": _strings(prov["device"], arr.d_token),
        "provider": _strings(fcm.astype(np.int64), ["apns", "fcm"]),
        "project": _strings(np.where(fcm, prov["tenant"], -1), list(PROJECTS)),
        "status": pa.array(status, pa.int64()),
        "reason": _strings(reason_code, reason_names),
        "delivered": pa.array(prov["delivered"], pa.bool_()),
        "collapse_id": _strings(np.where(prov["collapse"] == 1, prov["event"], -1), nids),
        "retry_after": pa.array(prov["retry_after"], pa.float64(), from_pandas=True),
        "detail": nothing,
        # what a well-behaved sender asks: an alert (APNs' push type; every other header left
        # to the providers' defaults), with text
        "push_type": _strings(np.where(fcm, -1, 0), ["alert"]),
        "text": _strings(np.zeros(n, np.int64), ["New activity"]),
    }


def _finish(
    rng: np.random.Generator, arr: _Arrays, run: _Run, rows: int, sink: _Sink
) -> dict[str, dict[str, int]]:
    """The planted back-pressure bug (few rows), the runner's rows (inject, fault, phase,
    action, sample: samples fill up to ``rows``) and the DLQ contents; their planted counts."""
    # One request mid-silence in a few throttled rounds.
    a = APNS_WINDOW[0]
    busy = np.flatnonzero(run.per_round[1:-1] > 0) + 1
    bad_rounds = rng.choice(busy, min(len(busy), 5), replace=False)
    live_apns = np.flatnonzero(~arr.d_fcm & ~arr.d_dead)
    bad_dev = rng.choice(live_apns, len(bad_rounds))
    bad_event = rng.choice(np.flatnonzero(run.tenant == 0), len(bad_rounds))
    bad = _Rows()
    bad.add(a + bad_rounds * ROUND_S + 0.6, arr.d_tenant[bad_dev], bad_event, bad_dev, 429)
    # A request just after each of those bursts, still within the slack of every throttling
    # answer in it: none is then followed by silence, which would let the slack run from the
    # planted request itself (the checker's rule for a burst read after a silence).
    after_burst = a + bad_rounds * ROUND_S + BURST_S + 0.05
    bad.add(after_burst, arr.d_tenant[bad_dev], bad_event, bad_dev, 429)
    sink.add_history(_provider_columns(bad.concat(), arr, run.nid))
    park_key = np.concatenate(run.parked)
    dlq = {"event": park_key // len(arr.u_tenant), "user": park_key % len(arr.u_tenant)}
    poison = 3
    n_events = len(run.time)
    n_dlq = len(park_key) + poison
    fault_rows = sum(2 if stop is not None else 1 for _, _, stop, _ in FAULTS)
    n_sample = rows - sink.rows - n_events - fault_rows - 5 - n_dlq
    if n_sample < 0:
        raise OverflowError(rows - n_sample)

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
        # The dedup store read at the end: a 'sent' key with the whole window left for every
        # provider request made (at least one per notification and user delivered).
        (
            S0 + RUN_S + 1.0,
            "dedup_sample",
            json.dumps(
                {
                    "pattern": "dedup:*",
                    "elapsed_s": RUN_S + 60.0,
                    "complete": True,
                    "ttls": {str(int(POLICY.dedup_window_seconds - RUN_S - 60.0)): sink.rows},
                }
            ),
        ),
    ]
    queues = ("fanout-push", "fanout-push-dlq", "fanout-push-poison")
    samples = [
        json.dumps({"queue": q, "depth": d, "visible": d, "in_flight": 0, "delayed": 0})
        for q in queues
        for d in (0, 10, 1000)
    ]
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
            run.time,
            [t for t, _ in faults],
            [t for t, _, _ in phases],
            S0 + rng.uniform(0.0, RUN_S, n_sample),
        ]
    )
    run_kind = np.concatenate(
        [
            np.zeros(n_events, dtype=np.int64),
            np.ones(len(faults), dtype=np.int64),
            [KINDS.index(k) for _, k, _ in phases],
            np.full(n_sample, KINDS.index("sample")),
        ]
    ).astype(np.int64)
    n_run = len(run_time)
    run_event = np.r_[np.arange(n_events), np.full(n_run - n_events, -1)]
    order = np.argsort(run_time, kind="stable")
    run_time, run_kind, run_event, detail_code = (
        run_time[order], run_kind[order], run_event[order], detail_code[order],
    )  # fmt: skip
    has_event = run_event >= 0
    event = np.maximum(run_event, 0)
    nothing = pa.nulls(n_run, pa.large_string())
    sink.add_history(
        {
            "kind": _strings(run_kind, KINDS),
            "time": pa.array(run_time, pa.float64()),
            "end": pa.nulls(n_run, pa.float64()),
            "mono": pa.array(run_time - S0 + 1000.0, pa.float64()),
            "tenant_id": _strings(np.where(has_event, run.tenant[event], -1), list(TENANTS)),
            "user_id": nothing,
            "author_id": _strings(
                np.where(has_event, arr.a_user[run.author[event]] % arr.users, -1), arr.user_ids
            ),
            "notification_id": _strings(np.where(has_event, run_event, -1), run.nid),
            "token": nothing,
            "provider": nothing,
            "project": nothing,
            "status": pa.nulls(n_run, pa.int64()),
            "reason": nothing,
            "delivered": pa.nulls(n_run, pa.bool_()),
            "collapse_id": nothing,
            "retry_after": pa.nulls(n_run, pa.float64()),
            "detail": _strings(detail_code, details),
        }
    )
    dlq_event = np.r_[dlq["event"], np.full(poison, -1)]
    dlq_user = np.r_[dlq["user"], np.full(poison, -1)]
    dlq_details = [json.dumps({"queue": "fanout-push-dlq", "recipient_user_id": None})] + [
        json.dumps({"queue": "fanout-push-dlq", "recipient_user_id": u})
        for u in arr.user_ids.tolist()
    ]
    nothing = pa.nulls(n_dlq, pa.large_string())
    sink.add_history(
        {
            "kind": _strings(np.full(n_dlq, KINDS.index("dlq")), KINDS),
            "time": pa.array(np.full(n_dlq, S0 + RUN_S + 5.0), pa.float64()),
            "end": pa.nulls(n_dlq, pa.float64()),
            "mono": pa.array(np.full(n_dlq, RUN_S + 1005.0), pa.float64()),
            "tenant_id": _strings(
                np.where(dlq_event >= 0, run.tenant[np.maximum(dlq_event, 0)], -1), list(TENANTS)
            ),
            "user_id": nothing,
            "author_id": nothing,
            "notification_id": _strings(dlq_event, run.nid),
            "token": nothing,
            "provider": nothing,
            "project": nothing,
            "status": pa.nulls(n_dlq, pa.int64()),
            "reason": nothing,
            "delivered": pa.nulls(n_dlq, pa.bool_()),
            "collapse_id": nothing,
            "retry_after": pa.nulls(n_dlq, pa.float64()),
            "detail": _strings(np.where(dlq_user >= 0, 1 + dlq_user % arr.users, 0), dlq_details),
        }
    )
    c = run.counts
    return {
        "backpressure": {
            "throttle_answers": c["throttles"],
            "requests_inside_retry_after": int(run.per_round[bad_rounds].sum()),
        },
        "dlq_accountability": {
            "expected": c["pairs"],
            "in_dlq": c["in_dlq"],
            "vanished": c["lost"] - c["in_dlq"],
            "dlq_messages": n_dlq,
        },
    }


def _pandas_type(arrow_type: pa.DataType) -> Any:
    if pa.types.is_large_string(arrow_type) or pa.types.is_string(arrow_type):
        return pd.StringDtype()
    if pa.types.is_boolean(arrow_type):
        return pd.BooleanDtype()
    if pa.types.is_integer(arrow_type):
        return pd.Int64Dtype()
    return None


def history_frame(table: pa.Table) -> pd.DataFrame:
    """A history table as the runner's frame (Arrow-backed strings, nullable ints and bools)."""
    frame = table.to_pandas(types_mapper=_pandas_type)
    return frame[list(COLUMNS)].astype(COLUMNS)


def generate(
    rows: int, seed: int, out: Path | None = None, chunk_pairs: int = CHUNK_PAIRS
) -> tuple[Population, Counter[str], dict[str, dict[str, int]], _Sink]:
    """A population and a history of exactly ``rows`` rows with planted defects, written a
    chunk at a time to ``out`` (``history.parquet``, ``expected.parquet``) or kept in the
    returned sink; the oracle's suppressed counts and the planted counts beside them."""
    population, arr = build_population(max(60, rows // 100), np.random.default_rng(seed))
    # Retries, throttled attempts and dead-token answers add about 4% to the expected
    # deliveries; sample rows fill what is left, and a history that would overflow is made
    # again with fewer events.
    target = int(rows * 0.955)
    for _ in range(4):
        sink = _Sink(out)
        rng = np.random.default_rng([seed, target])
        suppressed, planted, run = _generate(rng, arr, target, sink, chunk_pairs)
        try:
            planted.update(_finish(rng, arr, run, rows, sink))
            break
        except OverflowError as over:
            sink.close()
            target = int(target * rows / over.args[0] * 0.99)
    else:
        raise RuntimeError(f"could not fit the history into {rows} rows")
    sink.close()
    population.seed = seed
    return population, suppressed, planted, sink


def synthesize(rows: int = 10_000_000, seed: int = 7) -> Synthetic:
    """A population, expectation and history of exactly ``rows`` rows, with planted defects,
    in memory."""
    population, suppressed, planted, sink = generate(rows, seed)
    history = history_frame(pa.concat_tables(sink.history))
    expected = pa.concat_tables(sink.expected)
    # Built as the oracle builds its frame (from Python values), so that the two compare equal.
    deliveries = pd.DataFrame(
        {c: expected[c].to_numpy(zero_copy_only=False) for c in EXPECTED_COLUMNS},
        columns=EXPECTED_COLUMNS,
    )
    expectation = Expectation(deliveries, Counter(
        {k: v for k, v in suppressed.items() if v}
    ))  # fmt: skip
    return Synthetic(population, expectation, history, planted)


# --- timing ----------------------------------------------------------------------------------


def _rss_mb() -> float:
    """Peak RSS so far (since the last reset), from getrusage."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _cpu_seconds() -> float:
    """User and system seconds of this process so far, every thread (DuckDB's too)."""
    return time.process_time()


def _release_freed_memory() -> None:
    """Hand the memory the population's making freed back to the system (glibc keeps it
    otherwise), so that the peak measured after is the checkers' own."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _reset_peak_rss() -> bool:
    """Start the peak RSS afresh (Linux: clear_refs 5), so that the checkers' peak is not the
    generator's; False where the kernel does not allow it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def time_checkers(
    evidence: Evidence,
    probes: tuple[str, ...] | None = None,
    log: Any = print,
) -> tuple[dict[str, dict[str, float]], dict[str, Verdict], dict[str, str]]:
    """Wall and CPU seconds and the verdict per probe, each through run_probe with the game
    day's tolerances, in the order given; a checker that raises is timed and reported.

    Checkers share work, as in a run: in memory a frame's string encodings, on disk the store's
    integer codes and per-key tables (the store is prepared by the first checker that asks)."""
    seconds, verdicts, errors = {}, {}, {}
    for name in probes if probes is not None else known_checkers():
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


# --- one engine over the files, in a process of its own ---------------------------------------


def _child(args: argparse.Namespace) -> dict[str, Any]:
    """Time the checkers on one engine over ``--data``: the population made again from the
    seed (not counted), then either the history and expectation read into memory (pandas: the
    read timed apart) or a store over the files (DuckDB: its preparation counted)."""
    data = Path(args.data)
    meta = json.loads((data / "meta.json").read_text())
    population, _ = build_population(
        max(60, meta["rows"] // 100), np.random.default_rng(meta["seed"])
    )
    population.seed = meta["seed"]
    suppressed = Counter(meta["suppressed"])
    _release_freed_memory()
    probes = tuple(p for p in args.probes.split(",") if p)
    result: dict[str, Any] = {"engine": args.child, "rows": meta["rows"]}
    _reset_peak_rss()
    started, cpu_started = time.perf_counter(), _cpu_seconds()
    if args.child == "pandas":
        history = history_frame(pq.read_table(data / "history.parquet"))
        deliveries = pd.read_parquet(data / "expected.parquet")
        expectation = Expectation(deliveries, suppressed)
        evidence = Evidence(population, expectation, history, POLICY)
        result["read_seconds"] = round(time.perf_counter() - started, 2)
        result["read_cpu_seconds"] = round(_cpu_seconds() - cpu_started, 2)
        result["peak_rss_mb_read"] = _rss_mb()
        store = None
    else:
        empty = pd.DataFrame(columns=EXPECTED_COLUMNS)
        expectation = Expectation(empty, suppressed)
        store = HistoryStore(
            data / "history.parquet",
            expectation,
            expected=data / "expected.parquet",
            memory_limit_gb=args.memory_limit_gb,
            workdir=data / "duckdb",
        )
        store.prepare()
        result["prepare_seconds"] = round(time.perf_counter() - started, 2)
        result["prepare_cpu_seconds"] = round(_cpu_seconds() - cpu_started, 2)
        result["peak_rss_mb_prepare"] = _rss_mb()
        evidence = Evidence(population, expectation, pd.DataFrame(columns=list(COLUMNS)), POLICY,
                            store=store)  # fmt: skip
    _reset_peak_rss()
    seconds, verdicts, errors = time_checkers(
        evidence, probes, lambda line: print(line, flush=True)
    )
    if store is not None:
        store.close()
    checkers_s = sum(s["wall"] for s in seconds.values())
    checkers_cpu = sum(s["cpu"] for s in seconds.values())
    result.update(
        {
            "checker_seconds": {k: round(v["wall"], 2) for k, v in seconds.items()},
            "checker_cpu_seconds": {k: round(v["cpu"], 2) for k, v in seconds.items()},
            "checker_peak_rss_mb": {k: v["peak_rss_mb"] for k, v in seconds.items()},
            "checkers_seconds": round(checkers_s, 2),
            # What the run costs the checkers: their own seconds, plus reading the history
            # on disk into the store (DuckDB); the pandas read is reported apart.
            "total_seconds": round(checkers_s + result.get("prepare_seconds", 0.0), 2),
            # The CPU (user + system, every thread) beside the wall time: on a shared machine
            # the wall time is mostly other processes' load.
            "checkers_cpu_seconds": round(checkers_cpu, 2),
            "total_cpu_seconds": round(checkers_cpu + result.get("prepare_cpu_seconds", 0.0), 2),
            "peak_rss_mb": max(
                [
                    result.get("peak_rss_mb_prepare", 0.0),
                    *(s["peak_rss_mb"] for s in seconds.values()),
                ]
            ),  # fmt: skip
            "verdicts": {k: {"valid": v.valid, **v.counts} for k, v in verdicts.items()},
            "errors": errors,
        }
    )
    return result


def _run_child(
    engine: str, data: Path, probes: tuple[str, ...], memory_limit_gb: float, log_path: Path
) -> dict[str, Any]:
    command = [
        sys.executable, __file__, "--child", engine, "--data", str(data),
        "--probes", ",".join(probes), "--memory-limit-gb", str(memory_limit_gb),
    ]  # fmt: skip
    with open(log_path, "w") as log:
        done = subprocess.run(
            command, stdout=subprocess.PIPE, stderr=log, text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
    lines = done.stdout.strip().splitlines()
    for line in lines[:-1]:
        print(f"  {engine}: {line}", flush=True)
    if done.returncode or not lines:
        tail = log_path.read_text().strip().splitlines()[-3:]
        return {"engine": engine, "error": f"exit {done.returncode}: {' | '.join(tail)}"}
    return json.loads(lines[-1])


def _size(rows: int, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """Generate one history on disk, then time the checkers on each engine."""
    data = root / f"rows-{rows}"
    engines = [e for e in args.engines.split(",") if e == "duckdb" or rows <= args.pandas_max_rows]
    meta_path = data / "meta.json"
    meta = json.loads(meta_path.read_text()) if args.reuse and meta_path.exists() else {}
    if meta.get("rows") == rows and meta.get("seed") == args.seed and "planted" in meta:
        print(f"reusing the history of {rows:,} rows (seed {args.seed}) in {data}", flush=True)
        planted, generation_s = meta["planted"], meta["generation_seconds"]
        users = meta["users"], meta["devices"]
    else:
        print(f"generating a synthetic history of {rows:,} rows (seed {args.seed}) in {data}",
              flush=True)  # fmt: skip
        started = time.perf_counter()
        population, suppressed, planted, sink = generate(rows, args.seed, data)
        generation_s = time.perf_counter() - started
        users = len(population.users), len(population.devices)
        del population
        meta = {"rows": sink.rows, "seed": args.seed, "suppressed": dict(suppressed),
                "planted": planted, "generation_seconds": generation_s, "users": users[0],
                "devices": users[1]}  # fmt: skip
        meta_path.write_text(json.dumps(meta))
    counts = pq.read_table(data / "history.parquet", columns=["kind"])["kind"].value_counts()
    kinds = {str(k): int(v) for k, v in zip(counts.field(0), counts.field(1), strict=True)}
    expected = pq.ParquetFile(data / "expected.parquet").metadata.num_rows
    print(
        f"generated in {generation_s:.1f} s (not counted): {meta['rows']:,} rows {kinds}, "
        f"{expected:,} expected deliveries, {users[0]:,} users, {users[1]:,} devices; "
        f"peak RSS so far {_rss_mb():,.0f} MB",
        flush=True,
    )
    report: dict[str, Any] = {
        "rows": meta["rows"],
        "rows_by_kind": kinds,
        "expected_deliveries": expected,
        "history_parquet_bytes": (data / "history.parquet").stat().st_size,
        "generation_seconds": round(generation_s, 2),
        "planted": planted,
        "engines": {},
    }
    for engine in engines:
        probes = tuple(
            p
            for p in args.probes.split(",")
            if p
            and (engine == "pandas" or p not in NOT_OUT_OF_CORE or rows <= args.pandas_max_rows)
        )
        print(f"timing {len(probes)} checkers on {engine}", flush=True)
        result = _run_child(engine, data, probes, args.memory_limit_gb, data / f"{engine}.log")
        if "verdicts" in result:
            verdicts = {k: Verdict(k, v["valid"], v) for k, v in result["verdicts"].items()}
            result["planted_found"] = found(planted, verdicts)
            result["not_timed"] = {
                k: NOT_OUT_OF_CORE[k] for k in set(args.probes.split(",")) - set(probes)
            }
            print(
                f"{engine}: {result['total_seconds']:.1f} s (CPU {result['total_cpu_seconds']:.1f} s), peak RSS {result['peak_rss_mb']:,.0f} MB, "
                f"planted defects {'all found' if all(result['planted_found'].values()) else 'NOT all found'}",
                flush=True,
            )
        else:
            print(f"{engine}: {result['error']}", flush=True)
        report["engines"][engine] = result
    ran = [r for r in report["engines"].values() if "verdicts" in r]
    if len(ran) > 1:
        common = set.intersection(*(set(r["verdicts"]) for r in ran))
        report["engines_agree"] = {
            name: all(r["verdicts"][name] == ran[0]["verdicts"][name] for r in ran)
            for name in sorted(common)
        }
    if not args.keep:
        shutil.rmtree(data, ignore_errors=True)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "reports" / "bench" / "checkers.json"))
    parser.add_argument(
        "--rows", default="10000000,100000000", help="comma-separated history sizes"
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--probes", default=",".join(known_checkers()))
    parser.add_argument("--engines", default="pandas,duckdb")
    parser.add_argument(
        "--pandas-max-rows", type=int, default=10_000_000,
        help="larger histories do not fit in memory: DuckDB only",
    )  # fmt: skip
    parser.add_argument("--memory-limit-gb", type=float, default=DUCKDB_MEMORY_GB)
    parser.add_argument("--data", help="where the Parquet files go (default: a temporary dir)")
    parser.add_argument("--keep", action="store_true", help="keep the Parquet files")
    parser.add_argument(
        "--reuse", action="store_true", help="time again over the files kept in --data"
    )
    parser.add_argument("--child", choices=("pandas", "duckdb"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args), default=str), flush=True)
        return 0
    sizes = [int(r) for r in args.rows.split(",") if r]
    root = Path(args.data) if args.data else Path(tempfile.mkdtemp(prefix="bench-checkers-"))
    load_start = [round(x, 2) for x in os.getloadavg()]
    try:
        results = {str(rows): _size(rows, args, root) for rows in sizes}
    finally:
        if not args.data and not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    report = {
        "benchmark": "checkers",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "pandas": pd.__version__,
        "duckdb": duckdb.__version__,
        "pyarrow": pa.__version__,
        "load_average_at_start": load_start,
        "seed": args.seed,
        "tolerances": TOLERANCES,
        "duckdb_memory_limit_gb": args.memory_limit_gb,
        "limit_seconds": LIMIT_S,
        "limit_peak_rss_mb": LIMIT_RSS_MB,
        "sizes": results,
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
    }
    ok = True
    for rows, result in results.items():
        for engine, run in result["engines"].items():
            if "verdicts" not in run:
                ok = False
                continue
            run["under_limits"] = (
                run["total_seconds"] < LIMIT_S and run["peak_rss_mb"] < LIMIT_RSS_MB
                and not run["errors"]
            )  # fmt: skip
            ok &= all(run["planted_found"].values()) and not run["errors"]
            print(
                f"{int(rows):>12,} rows  {engine:<7} {run['total_seconds']:8.1f} s  "
                f"(CPU {run['total_cpu_seconds']:8.1f} s)  "
                f"peak RSS {run['peak_rss_mb']:8,.0f} MB  "
                f"{'within' if run['under_limits'] else 'NOT within'} {LIMIT_S:.0f} s / "
                f"{LIMIT_RSS_MB:,} MB"
            )
        ok &= all(result.get("engines_agree", {}).values())
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"wrote {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
