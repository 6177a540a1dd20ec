"""Capacity model: the architecture review's napkin math as code (seeds/000), corrected with
per-core rates measured on this machine by ``make bench``, giving a fleet plan for a celebrity
burst: Kinesis shards, push consumers, FCM projects, dedup memory and shards, monthly cost.

    python -m harness capacity --followers 100e6 --out reports/capacity

The seed's figures are pure functions of the inputs and reproduce the review's numbers for its
own scenario (the defaults). The fleet sizes divide the burst by a rate; each rate comes from a
bench file and key when present and otherwise from the seed's assumption, and every figure
carries that source so a reader can tell a measurement from a guess.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.analysis.drill_size import DrillEstimate, DrillSizeError, estimate_drill
from harness.analysis.drill_size import render_markdown as drill_markdown

EXIT_USAGE = 2
DEFAULT_BENCH_DIR = Path("reports") / "bench"
SCALE_BENCH = "scale.json"  # benchmarks/bench_scale.py's default output

# The seed's scenario (seeds/000_f9ea1b06a48595a4.txt); the defaults reproduce its figures.
SEED_FOLLOWERS = 50_000_000
SEED_SLA_SECONDS = 60.0
SEED_PUSH_FRACTION = 0.20
SEED_RECORD_BYTES = 300
SEED_ULIDS_PER_MS = 1e6
SEED_SENDS_PER_MONTH = 2e9
SEED_REGIONS = 2
SEED_AUTHOR_EVENTS_PER_MONTH = 1e8
SEED_DEDUP_KEY_BYTES = 120
SEED_APNS_REQ_PER_S_PER_CONNECTION = 2_000.0
ULID_RANDOM_BITS = 80
FCM_QUOTA_PER_MINUTE = 600_000
DEDUP_TTL_SECONDS = 2_592_000  # the EX of the dedup SET: 30 days
MONTH_SECONDS = 30 * 86_400  # the seed's month is its 30-day dedup window
CELEBRITY_THRESHOLD = 10_000
DYNAMODB_WCU_BYTES = 1024
KINESIS_RECORDS_PER_S_PER_SHARD = 1_000  # AWS's per-shard write limit

# Prices and cost lines exactly as the seed's "monthly cost sketch (corrected)" states them.
DYNAMODB_WRITE_USD_PER_M = 1.25
DYNAMODB_REPLICATED_WRITE_USD_PER_M = 1.875
GSI_WRITE_FACTOR = 2
SNS_PUSH_USD_PER_M = 1.00
SQS_USD_PER_M = 0.40
SQS_REQUESTS_PER_MESSAGE = 2.5
MEMORYDB_USD_PER_MONTH_AT_SEED = 2_500.0
MEMORYDB_GB_AT_SEED = 240.0
ELASTICACHE_USD_PER_MONTH = 650.0
# "low thousands" of $/month for ~2e9 delivery invocations, read as $1k-$3k and scaled per send.
LAMBDA_USD_PER_M_LOW = 0.50
LAMBDA_USD_PER_M_HIGH = 1.50
# "low hundreds" of $/month: driven by ~1e8 author events, not by deliveries, so not scaled.
KINESIS_USD_PER_MONTH_LOW = 100.0
KINESIS_USD_PER_MONTH_HIGH = 300.0

# What seed 000 itself says for its scenario, to print beside the model's figures.
SEED_FIGURES: dict[str, float] = {
    "writes_per_event": 5e7,
    "write_rate_per_s": 8.3e5,
    "ulid_collision_probability": 4e-13,
    "fcm_drain_seconds": 1000.0,
    "dedup_memory_bytes": 2.4e11,
    "monthly_cost_usd_low": 17_000.0,
    "monthly_cost_usd_high": 22_000.0,
}

# Where the seed states no rate, DESIGN.md §6 holds one measured on this machine class.
DESIGN_REDIS_SET_NX_PER_S = 46_000.0
DESIGN_REDIS_SET_NX_PIPELINED_PER_S = 234_000.0


class CapacityError(ValueError):
    """Bad input: the CLI turns it into ``error: ...`` and exit 2."""


# -- inputs -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CapacityInputs:
    """One scenario. The defaults are the seed's: a 50M-follower celebrity, 2e9 sends/month."""

    followers: int = SEED_FOLLOWERS
    push_fraction: float = SEED_PUSH_FRACTION
    sla_seconds: float = SEED_SLA_SECONDS
    fcm_projects: int = 1
    sends_per_month: float = SEED_SENDS_PER_MONTH
    regions: int = SEED_REGIONS
    ulids_per_ms: float = SEED_ULIDS_PER_MS
    # Not in the seed: the busiest hour against the month's mean, for the steady-state fleet.
    peak_factor: float = 10.0

    def __post_init__(self) -> None:
        whole, number = _is_whole, _finite
        _require("--followers", self.followers, whole, lambda v: v >= 0, "a whole number >= 0")
        _require("--push-fraction", self.push_fraction, number, lambda v: 0 <= v <= 1, "in 0..1")
        _require("--sla-seconds", self.sla_seconds, number, lambda v: v > 0, "> 0")
        _require(
            "--fcm-projects", self.fcm_projects, whole, lambda v: v >= 1, "a whole number >= 1"
        )
        _require("--sends-per-month", self.sends_per_month, number, lambda v: v >= 0, ">= 0")
        _require("--regions", self.regions, whole, lambda v: v >= 1, "a whole number >= 1")
        _require("--ulids-per-ms", self.ulids_per_ms, number, lambda v: v >= 0, ">= 0")
        _require(
            "--peak-factor",
            self.peak_factor,
            number,
            lambda v: v >= 1,
            ">= 1 (a peak is at least the mean)",
        )


def _require(
    flag: str,
    value: object,
    kind: Callable[[object], bool],
    in_range: Callable[[Any], bool],
    expected: str,
) -> None:
    if not (kind(value) and in_range(value)):
        raise CapacityError(f"{flag} must be {expected}, got {value!r}")


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _is_whole(value: object) -> bool:
    return _finite(value) and float(value).is_integer()  # type: ignore[arg-type]


# -- the seed's napkin math, one pure function per figure -------------------------------------


def writes_per_event(followers: int) -> int:
    """W = F: write-time fan-out writes one inbox row per follower for a single post."""
    return followers


def two_tier_writes_per_event(followers: int, threshold: int = CELEBRITY_THRESHOLD) -> int:
    """At or above the threshold the post is stored once as a pointer: O(1) instead of O(F)."""
    return 1 if followers >= threshold else followers


def write_rate_per_s(writes: float, sla_seconds: float) -> float:
    """R_w = W / t: materialising every row within the SLA is that sustained write rate."""
    return writes / sla_seconds


def write_capacity_units(write_rate: float, record_bytes: int = SEED_RECORD_BYTES) -> float:
    """WCU/s = R_w x ceil(bytes / 1 KB): DynamoDB charges 1 WCU per 1 KB, a ~300 B row is 1."""
    return write_rate * math.ceil(record_bytes / DYNAMODB_WCU_BYTES)


def ulid_collision_probability(ids_per_ms: float, random_bits: int = ULID_RANDOM_BITS) -> float:
    """P ~ n^2 / (2 * 2^80): a birthday bound over the 80 random bits shared within one ms."""
    return min(1.0, ids_per_ms**2 / (2.0 * 2.0**random_bits))


def push_messages(followers: int, push_fraction: float) -> float:
    """D = fraction x F: only followers with push enabled and active get one (seed: 20%)."""
    return push_fraction * followers


def fcm_drain_seconds(
    messages: float, projects: int, quota_per_minute: int = FCM_QUOTA_PER_MINUTE
) -> float:
    """T = D / (K x 600k/60): FCM caps each sender project at 600,000 messages a minute."""
    return messages / (projects * quota_per_minute / 60.0)


def fcm_projects_for_sla(
    messages: float, sla_seconds: float, quota_per_minute: int = FCM_QUOTA_PER_MINUTE
) -> int:
    """K = ceil(D / (10^4 x t)): the seed shards over K projects because one drains in 1000 s."""
    return max(1, math.ceil(messages / (quota_per_minute / 60.0 * sla_seconds)))


def dedup_memory_bytes(
    sends_per_month: float,
    bytes_per_key: int = SEED_DEDUP_KEY_BYTES,
    ttl_seconds: int = DEDUP_TTL_SECONDS,
) -> float:
    """M = sends in the TTL window x 120 B: a 64-char hex key, value and Redis overhead."""
    return sends_per_month * (ttl_seconds / MONTH_SECONDS) * bytes_per_key


def push_consumers(messages: float, sla_seconds: float, deliveries_per_s_per_core: float) -> int:
    """N = ceil(D / t / rate): the burst must leave the queue within the SLA, one core each."""
    return max(1, math.ceil(messages / sla_seconds / deliveries_per_s_per_core))


def dedup_shards(messages: float, sla_seconds: float, set_nx_per_s_per_shard: float) -> int:
    """S = ceil(D / t / SET NX rate): every send claims a key first, and Redis is one core."""
    return max(1, math.ceil(messages / sla_seconds / set_nx_per_s_per_shard))


def fanout_page_out_seconds(messages: float, enqueue_per_s_per_core: float) -> float:
    """T = D / enqueue rate: the author is the partition key, so one shard pages out the post."""
    return messages / enqueue_per_s_per_core


def kinesis_shards(
    author_events_per_month: float,
    sends_per_month: float,
    peak_factor: float,
    enqueue_per_s_per_core: float | None,
) -> int:
    """Shards = max(peak events / 1,000 rec/s, peak jobs / one fan-out worker's enqueue rate)."""
    events = author_events_per_month / MONTH_SECONDS * peak_factor
    shards = math.ceil(events / KINESIS_RECORDS_PER_S_PER_SHARD)
    if enqueue_per_s_per_core:
        # One fan-out worker per shard: the shards must share out the peak job rate between them.
        jobs = sends_per_month / MONTH_SECONDS * peak_factor
        shards = max(shards, math.ceil(jobs / enqueue_per_s_per_core))
    return max(1, shards)


@dataclass(frozen=True)
class CostLine:
    name: str
    low_usd: float
    high_usd: float
    formula: str
    source: str = "seed"


def cost_lines(sends_per_month: float, regions: int, dedup_bytes: float) -> list[CostLine]:
    """The seed's corrected monthly cost sketch, line by line, for ``sends_per_month`` sends."""
    m = sends_per_month / 1e6
    replicas = regions - 1
    base = m * GSI_WRITE_FACTOR * DYNAMODB_WRITE_USD_PER_M
    replicated = m * replicas * DYNAMODB_REPLICATED_WRITE_USD_PER_M
    # The seed prices the replica's base writes only; its GSI writes there too, at the base price.
    replica_gsi = m * replicas * DYNAMODB_WRITE_USD_PER_M
    memorydb = dedup_bytes / 1e9 * MEMORYDB_USD_PER_MONTH_AT_SEED / MEMORYDB_GB_AT_SEED
    sqs = m * SQS_REQUESTS_PER_MESSAGE * SQS_USD_PER_M
    return [
        CostLine(
            "DynamoDB (inbox + GSI + Global Tables)",
            base + replicated,
            base + replicated + replica_gsi,
            "sends x 2 (GSI) x $1.25/M + sends x (regions-1) x $1.875/M replicated; "
            "high adds the replica's GSI writes at $1.25/M",
        ),
        CostLine(
            "SNS mobile push", m * SNS_PUSH_USD_PER_M, m * SNS_PUSH_USD_PER_M, "sends x $1.00/M"
        ),
        CostLine(
            "MemoryDB dedup",
            memorydb,
            memorydb,
            "dedup GB x $2,500 / 240 GB (the seed's price for its keyspace)",
        ),
        CostLine(
            "SQS Standard", sqs, sqs, "sends x 2.5 requests (send, receive, retries) x $0.40/M"
        ),
        CostLine(
            "ElastiCache (follower lists, pointers, rate limits)",
            ELASTICACHE_USD_PER_MONTH,
            ELASTICACHE_USD_PER_MONTH,
            "cache.r6g.2xlarge x 2 nodes, fixed",
        ),
        CostLine(
            "Lambda (delivery + fan-out)",
            m * LAMBDA_USD_PER_M_LOW,
            m * LAMBDA_USD_PER_M_HIGH,
            '"low thousands" for 2e9 invocations: $0.50-$1.50 per M sends',
        ),
        CostLine(
            "Kinesis (author events)",
            KINESIS_USD_PER_MONTH_LOW,
            KINESIS_USD_PER_MONTH_HIGH,
            '"low hundreds" for ~1e8 author events, a few shards; not per send',
        ),
    ]


def monthly_cost(lines: list[CostLine]) -> tuple[float, float]:
    """The total is the sum of the lines; low and high come from each line's own range."""
    return sum(line.low_usd for line in lines), sum(line.high_usd for line in lines)


# -- rates measured by make bench --------------------------------------------------------------


@dataclass(frozen=True)
class Rate:
    """A per-core rate and where it came from (a bench file and key, or the seed's guess)."""

    value: float | None
    source: str


@dataclass(frozen=True)
class BenchRates:
    push_deliveries_per_s_per_core: Rate
    dedup_set_nx_per_s_per_shard: Rate
    dedup_set_nx_pipelined_per_s_per_shard: Rate
    sqs_enqueue_per_s_per_core: Rate


def _positive(value: object) -> float | None:
    return float(value) if _finite(value) and value > 0 else None  # type: ignore[operator]


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CapacityError(f"{path} is not readable JSON ({exc}); rerun `make bench`") from exc
    if not isinstance(data, dict):
        raise CapacityError(f"{path} holds no JSON object; rerun `make bench`")
    return data


def _e2e_per_core(data: dict[str, Any]) -> tuple[float | None, str]:
    # The whole stack (API, workers, simulators, emulators) shared these cores during the run, so
    # this per-core rate is a floor for a consumer alone: the fleet it sizes errs large.
    delivered = _positive(data.get("e2e_deliveries_per_s"))
    cores = _positive(data.get("cpu_count"))
    if cores is not None:
        label = f"e2e_deliveries_per_s / cpu_count ({cores:.0f})"
    else:
        # A file without cpu_count was still measured on this machine: its count stands in.
        cores = float(os.cpu_count() or 1)
        label = f"e2e_deliveries_per_s / os.cpu_count() ({cores:.0f})"
    return (delivered / cores if delivered else None), label


def _proxy_set_nx(data: dict[str, Any], pipeline: int) -> tuple[float | None, str]:
    rows = [
        r
        for r in data.get("throughput") or []
        if isinstance(r, dict)
        and str(r.get("command", "")).startswith("SET")
        and r.get("pipeline") == pipeline
        and _positive(r.get("direct_ops_s"))
    ]
    if not rows:
        return None, f"throughput[SET, pipeline={pipeline}].direct_ops_s"
    # Most clients: the server's ceiling, not a client's round trips.
    row = max(rows, key=lambda r: _positive(r.get("clients")) or 0.0)
    label = f"throughput[SET, clients={row.get('clients')}, pipeline={pipeline}].direct_ops_s"
    return _positive(row["direct_ops_s"]), label


def _sqs_sent(data: dict[str, Any]) -> tuple[float | None, str]:
    ours = data.get("ours") if isinstance(data.get("ours"), dict) else {}
    throughput = ours.get("throughput") if isinstance(ours.get("throughput"), dict) else {}
    return _positive(throughput.get("sent_per_s")), "ours.throughput.sent_per_s"


def _sqs_send_latency(data: dict[str, Any]) -> tuple[float | None, str]:
    ours = data.get("ours") if isinstance(data.get("ours"), dict) else {}
    p50 = ours.get("p50_ms") if isinstance(ours.get("p50_ms"), dict) else {}
    depths = [k for k in p50 if k.startswith("depth_") and k[6:].isdigit()]
    if not depths:
        return None, "ours.p50_ms.depth_N.SendMessageBatch"
    # The deepest queue is what a celebrity burst meets.
    deepest = max(depths, key=lambda k: int(k[6:]))
    label = f"ours.p50_ms.{deepest}.SendMessageBatch"
    ops = p50[deepest] if isinstance(p50[deepest], dict) else {}
    ms = _positive(ops.get("SendMessageBatch"))
    batch = _positive(data.get("batch_size")) or 10.0
    return (batch * 1000.0 / ms if ms else None), f"batch_size / {label}"


def _pick(
    bench_dir: Path | None,
    candidates: list[tuple[str, Callable[[dict[str, Any]], tuple[float | None, str]]]],
    fallback: float | None,
    fallback_source: str,
) -> Rate:
    """The first candidate (file, extractor) with a positive value; else the fallback, saying
    which files or keys were missing."""
    missing = []
    for name, extract in candidates:
        if bench_dir is None:
            missing.append(f"{DEFAULT_BENCH_DIR} absent, run `make bench`")
            break
        path = bench_dir / name
        data = _read_json(path)
        if data is None:
            missing.append(f"{path} absent")
            continue
        value, label = extract(data)
        if value is not None:
            return Rate(value, f"{path}: {label}")
        missing.append(f"{path} has no positive {label}")
    reasons = "; ".join(dict.fromkeys(missing))
    return Rate(fallback, f"{fallback_source} (fallback: {reasons})")


def load_bench_rates(bench_dir: Path | None) -> BenchRates:
    """Rates from ``make bench`` JSON in ``bench_dir`` (None: no bench run, all fall back)."""
    return BenchRates(
        push_deliveries_per_s_per_core=_pick(
            bench_dir,
            [("foundation.json", _e2e_per_core)],
            SEED_APNS_REQ_PER_S_PER_CONNECTION,
            "seed: one consumer on one APNs HTTP/2 connection, ~2,000 req/s",
        ),
        dedup_set_nx_per_s_per_shard=_pick(
            bench_dir,
            [
                ("proxy.json", lambda d: _proxy_set_nx(d, 1)),
                (
                    "foundation.json",
                    lambda d: (
                        _positive(d.get("redis_set_nx_ops_per_s_one_client")),
                        "redis_set_nx_ops_per_s_one_client",
                    ),
                ),
            ],
            DESIGN_REDIS_SET_NX_PER_S,
            "DESIGN.md §6 (the seed states no Redis rate): SET NX EX, 50 clients, ~46k ops/s",
        ),
        dedup_set_nx_pipelined_per_s_per_shard=_pick(
            bench_dir,
            [
                ("proxy.json", lambda d: _proxy_set_nx(d, 16)),
                (
                    "foundation.json",
                    lambda d: (
                        _positive(d.get("redis_set_nx_ops_per_s_pipeline16")),
                        "redis_set_nx_ops_per_s_pipeline16",
                    ),
                ),
            ],
            DESIGN_REDIS_SET_NX_PIPELINED_PER_S,
            "DESIGN.md §6 (the seed states no Redis rate): SET NX EX, -P 16, ~234k ops/s",
        ),
        sqs_enqueue_per_s_per_core=_pick(
            bench_dir,
            [("sqs.json", _sqs_sent), ("sqs.json", _sqs_send_latency)],
            None,
            "seed: states no SQS rate, so the fan-out page-out is not sized",
        ),
    )


# -- the plan ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class CapacityPlan:
    inputs: CapacityInputs
    bench_dir: str | None
    writes_per_event: int
    writes_per_event_two_tier: int
    write_rate_per_s: float
    write_capacity_units_per_s: float
    ulid_collision_probability: float
    push_messages: float
    fcm_drain_seconds: float
    fcm_projects: int
    fcm_drain_seconds_planned: float
    push_consumers: int
    dedup_memory_bytes: float
    dedup_shards: int
    dedup_shards_pipelined: int
    kinesis_shards: int
    fanout_page_out_seconds: float | None
    fanout_workers: int | None
    cost_lines: list[CostLine]
    monthly_cost_usd_low: float
    monthly_cost_usd_high: float
    rates: BenchRates
    sources: dict[str, str]
    formulas: dict[str, str]
    notes: list[str] = field(default_factory=list)
    seed_figures: dict[str, float] = field(default_factory=lambda: dict(SEED_FIGURES))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def build_plan(
    inputs: CapacityInputs, rates: BenchRates, bench_dir: Path | None = None
) -> CapacityPlan:
    """The seed's figures for ``inputs``, and the fleet sized with ``rates`` (from ``bench_dir``)."""
    writes = writes_per_event(inputs.followers)
    rate = write_rate_per_s(writes, inputs.sla_seconds)
    pushes = push_messages(inputs.followers, inputs.push_fraction)
    projects = fcm_projects_for_sla(pushes, inputs.sla_seconds)
    dedup_bytes = dedup_memory_bytes(inputs.sends_per_month)
    lines = cost_lines(inputs.sends_per_month, inputs.regions, dedup_bytes)
    low, high = monthly_cost(lines)
    consumer = rates.push_deliveries_per_s_per_core
    redis_one = rates.dedup_set_nx_per_s_per_shard
    redis_pipe = rates.dedup_set_nx_pipelined_per_s_per_shard
    enqueue = rates.sqs_enqueue_per_s_per_core
    page_out = fanout_page_out_seconds(pushes, enqueue.value) if enqueue.value else None
    workers = max(1, math.ceil(page_out / inputs.sla_seconds)) if page_out is not None else None
    shards = kinesis_shards(
        SEED_AUTHOR_EVENTS_PER_MONTH, inputs.sends_per_month, inputs.peak_factor, enqueue.value
    )
    notes = [r["source"] for r in asdict(rates).values() if "(fallback:" in r["source"]]
    if workers is not None and workers > 1:
        notes.append(
            f"one shard pages out the post in {page_out:,.0f} s, over the {inputs.sla_seconds:g} s "
            f"SLA: split the follower pages over {workers} fan-out workers"
        )
    seed = "seed"
    return CapacityPlan(
        inputs=inputs,
        bench_dir=None if bench_dir is None else str(bench_dir),
        writes_per_event=writes,
        writes_per_event_two_tier=two_tier_writes_per_event(inputs.followers),
        write_rate_per_s=rate,
        write_capacity_units_per_s=write_capacity_units(rate),
        ulid_collision_probability=ulid_collision_probability(inputs.ulids_per_ms),
        push_messages=pushes,
        fcm_drain_seconds=fcm_drain_seconds(pushes, inputs.fcm_projects),
        fcm_projects=projects,
        fcm_drain_seconds_planned=fcm_drain_seconds(pushes, projects),
        push_consumers=push_consumers(pushes, inputs.sla_seconds, consumer.value or 1.0),
        dedup_memory_bytes=dedup_bytes,
        dedup_shards=dedup_shards(pushes, inputs.sla_seconds, redis_one.value or 1.0),
        dedup_shards_pipelined=dedup_shards(pushes, inputs.sla_seconds, redis_pipe.value or 1.0),
        kinesis_shards=shards,
        fanout_page_out_seconds=page_out,
        fanout_workers=workers,
        cost_lines=lines,
        monthly_cost_usd_low=low,
        monthly_cost_usd_high=high,
        rates=rates,
        sources={
            "writes_per_event": seed,
            "write_rate_per_s": seed,
            "write_capacity_units_per_s": seed,
            "ulid_collision_probability": seed,
            "push_messages": seed,
            "fcm_drain_seconds": seed,
            "fcm_projects": seed,
            "dedup_memory_bytes": seed,
            "monthly_cost_usd_low": seed,
            "monthly_cost_usd_high": seed,
            "push_consumers": consumer.source,
            "dedup_shards": redis_one.source,
            "dedup_shards_pipelined": redis_pipe.source,
            "kinesis_shards": f"seed (1e8 author events/month) + AWS 1,000 records/s per shard; "
            f"fan-out: {enqueue.source}",
            "fanout_page_out_seconds": enqueue.source,
            "fanout_workers": enqueue.source,
        },
        formulas={
            "writes_per_event": "W = F (write-time fan-out, one inbox row per follower)",
            "write_rate_per_s": "R_w = W / SLA",
            "write_capacity_units_per_s": "R_w x ceil(300 B / 1 KB)",
            "ulid_collision_probability": "n^2 / (2 x 2^80), n ULIDs in one millisecond",
            "push_messages": "D = push fraction x F",
            "fcm_drain_seconds": "D / (K x 600,000/60 msg/s)",
            "fcm_projects": "ceil(D / (10^4 msg/s x SLA))",
            "dedup_memory_bytes": "sends in 30 days x 120 B per key",
            "push_consumers": "ceil(D / SLA / deliveries per s per core)",
            "dedup_shards": "ceil(D / SLA / SET NX per s per shard)",
            "dedup_shards_pipelined": "ceil(D / SLA / pipelined SET NX per s per shard)",
            "kinesis_shards": "max(peak events / 1,000, peak jobs / enqueue per s per core); "
            f"peak = month mean x {inputs.peak_factor:g}",
            "fanout_page_out_seconds": "D / SQS enqueue per s per core (one shard per author)",
            "fanout_workers": "ceil(page-out seconds / SLA)",
        },
        notes=notes,
    )


# -- renderers --------------------------------------------------------------------------------


def _g(value: float) -> str:
    """2e9, not 2e+09: the seed writes its figures that way."""
    mantissa, _, exponent = f"{value:.3g}".partition("e")
    return f"{mantissa}e{int(exponent)}" if exponent else mantissa


def _usd(value: float) -> str:
    return f"${value:,.0f}"


def render_markdown(plan: CapacityPlan) -> str:
    """The plan as a Markdown report: seed figures beside the seed's, rates, fleet, cost."""
    i = plan.inputs
    seed = plan.seed_figures

    def versus(key: str, value: float) -> str:
        said = seed.get(key)
        if not said:
            return ""
        return f"{_g(said)} ({(value / said - 1) * 100:+.1f}%)"

    lines = [
        f"# Capacity plan: a {i.followers:,}-follower celebrity",
        "",
        f"Inputs: push fraction {i.push_fraction:g}, SLA {i.sla_seconds:g} s, "
        f"{i.fcm_projects} FCM project(s), {_g(i.sends_per_month)} sends/month, "
        f"{i.regions} region(s), {_g(i.ulids_per_ms)} ULIDs/ms, peak factor {i.peak_factor:g}; "
        f"bench dir: {plan.bench_dir or f'{DEFAULT_BENCH_DIR} (absent)'}.",
        "",
        "## The seed's napkin math (architecture review 000)",
        "",
        "| figure | model | formula | seed 000 (its 50M scenario) |",
        "|---|---:|---|---:|",
        f"| writes per celebrity event | {plan.writes_per_event:,} | "
        f"{plan.formulas['writes_per_event']} | {versus('writes_per_event', plan.writes_per_event)} |",
        f"| write rate /s | {plan.write_rate_per_s:,.0f} | {plan.formulas['write_rate_per_s']} | "
        f"{versus('write_rate_per_s', plan.write_rate_per_s)} |",
        f"| DynamoDB WCU /s | {plan.write_capacity_units_per_s:,.0f} | "
        f"{plan.formulas['write_capacity_units_per_s']} | |",
        f"| writes per event, two-tier | {plan.writes_per_event_two_tier:,} | "
        f"1 pointer row at >= {CELEBRITY_THRESHOLD:,} followers | |",
        f"| ULID collision probability | {_g(plan.ulid_collision_probability)} | "
        f"{plan.formulas['ulid_collision_probability']} | "
        f"{versus('ulid_collision_probability', plan.ulid_collision_probability)} |",
        f"| push messages | {plan.push_messages:,.0f} | {plan.formulas['push_messages']} | |",
        f"| FCM drain on {i.fcm_projects} project(s), s | {plan.fcm_drain_seconds:,.0f} | "
        f"{plan.formulas['fcm_drain_seconds']} | "
        f"{versus('fcm_drain_seconds', plan.fcm_drain_seconds)} |",
        f"| dedup memory | {plan.dedup_memory_bytes / 1e9:,.0f} GB | "
        f"{plan.formulas['dedup_memory_bytes']} | "
        f"{versus('dedup_memory_bytes', plan.dedup_memory_bytes)} |",
        f"| monthly cost | {_usd(plan.monthly_cost_usd_low)}-{_usd(plan.monthly_cost_usd_high)} "
        f"| sum of the cost lines below | {_usd(seed['monthly_cost_usd_low'])}-"
        f"{_usd(seed['monthly_cost_usd_high'])} |",
        "",
        "## Rates (per core, this machine)",
        "",
        "| rate | value | source |",
        "|---|---:|---|",
    ]
    for name, rate in asdict(plan.rates).items():
        value = "not sized" if rate["value"] is None else f"{rate['value']:,.0f}/s"
        lines.append(f"| {name.replace('_', ' ')} | {value} | {rate['source']} |")
    page_out = plan.fanout_page_out_seconds
    plan_rows = [
        ("Kinesis shards (per region)", f"{plan.kinesis_shards}", "kinesis_shards"),
        ("push consumers (cores)", f"{plan.push_consumers:,}", "push_consumers"),
        (
            "FCM projects",
            f"{plan.fcm_projects} (drain {plan.fcm_drain_seconds_planned:,.0f} s)",
            "fcm_projects",
        ),
        ("dedup memory", f"{plan.dedup_memory_bytes / 1e9:,.0f} GB", "dedup_memory_bytes"),
        (
            "dedup shards (SET NX)",
            f"{plan.dedup_shards} ({plan.dedup_memory_bytes / plan.dedup_shards / 1e9:,.0f} GB each)",
            "dedup_shards",
        ),
        ("dedup shards (pipelined)", f"{plan.dedup_shards_pipelined}", "dedup_shards_pipelined"),
        (
            "fan-out page-out on one shard",
            "not sized" if page_out is None else f"{page_out:,.0f} s",
            "fanout_page_out_seconds",
        ),
        (
            "fan-out workers for the SLA",
            "not sized" if plan.fanout_workers is None else f"{plan.fanout_workers}",
            "fanout_workers",
        ),
    ]
    lines += ["", "## Plan", "", "| item | value | formula | source |", "|---|---:|---|---|"]
    for label, value, key in plan_rows:
        lines.append(f"| {label} | {value} | {plan.formulas[key]} | {plan.sources[key]} |")
    lines += [
        "",
        f"## Monthly cost ({_g(i.sends_per_month)} sends, {i.regions} region(s))",
        "",
        "| line | low | high | formula | source |",
        "|---|---:|---:|---|---|",
    ]
    for line in plan.cost_lines:
        lines.append(
            f"| {line.name} | {_usd(line.low_usd)} | {_usd(line.high_usd)} | {line.formula} | "
            f"{line.source} |"
        )
    lines.append(
        f"| **total** | **{_usd(plan.monthly_cost_usd_low)}** | "
        f"**{_usd(plan.monthly_cost_usd_high)}** | | seed |"
    )
    if plan.notes:
        lines += ["", "## Notes", ""] + [f"- {note}" for note in plan.notes]
    return "\n".join(lines) + "\n"


def render_chart(plan: CapacityPlan, path: Path) -> None:
    """Three panels: cost by line (low..high), FCM drain time against projects, the fleet."""
    # The object API on the Agg canvas leaves pyplot's global backend alone.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(16, 5), layout="constrained")
    FigureCanvasAgg(fig)
    cost, drain, fleet = fig.subplots(1, 3, width_ratios=[1.4, 1, 1])

    names = [line.name.split(" (")[0] for line in plan.cost_lines]
    lows = [line.low_usd for line in plan.cost_lines]
    spans = [line.high_usd - line.low_usd for line in plan.cost_lines]
    cost.barh(names, lows, color="#4c72b0", label="low")
    cost.barh(names, spans, left=lows, color="#4c72b0", alpha=0.35, hatch="//", label="to high")
    cost.invert_yaxis()
    cost.set_xlabel("USD / month")
    total = f"{_usd(plan.monthly_cost_usd_low)}-{_usd(plan.monthly_cost_usd_high)}"
    # A bare "$" would open matplotlib mathtext and eat the figures.
    cost.set_title(f"Monthly cost {total}".replace("$", r"\$"))
    cost.legend(loc="lower right")

    sla = plan.inputs.sla_seconds
    top = max(2 * plan.fcm_projects, plan.inputs.fcm_projects, 4)
    ks = list(range(1, top + 1))
    drain.plot(ks, [fcm_drain_seconds(plan.push_messages, k) for k in ks], marker=".")
    drain.axhline(sla, color="#c44e52", linestyle="--", label=f"SLA {sla:g} s")
    drain.axvline(plan.fcm_projects, color="#55a868", linestyle=":", label="planned projects")
    drain.set_yscale("log")
    drain.set_xlabel("FCM projects (K)")
    drain.set_ylabel("seconds to drain")
    drain.set_title(f"FCM drain of {plan.push_messages:,.0f} pushes")
    drain.legend()

    items = {
        "Kinesis shards": plan.kinesis_shards,
        "push consumers": plan.push_consumers,
        "FCM projects": plan.fcm_projects,
        "dedup shards": plan.dedup_shards,
    }
    if plan.fanout_workers is not None:
        items["fan-out workers"] = plan.fanout_workers
    bars = fleet.bar(list(items), list(items.values()), color="#8172b2")
    fleet.bar_label(bars, labels=[f"{v:,}" for v in items.values()])
    fleet.set_yscale("log")
    fleet.tick_params(axis="x", labelrotation=20)
    fleet.set_title(f"Fleet for {plan.inputs.followers:,} followers in {sla:g} s")
    fig.savefig(path, dpi=100)


# -- CLI --------------------------------------------------------------------------------------


def _number(text: str) -> float:
    # Accept 50_000_000 and 5e7 as well as 50000000: these figures are written both ways.
    try:
        return float(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    d = CapacityInputs()
    numbers = [
        ("--followers", d.followers, f"the celebrity's followers (default {d.followers:,})"),
        (
            "--push-fraction",
            d.push_fraction,
            "followers with push on and active, 0..1 (default 0.2)",
        ),
        ("--sla-seconds", d.sla_seconds, f"deliver the burst within (default {d.sla_seconds:g})"),
        ("--fcm-projects", d.fcm_projects, "FCM sender projects you have now (default 1)"),
        ("--sends-per-month", d.sends_per_month, "push sends a month, for cost and dedup (2e9)"),
        ("--regions", d.regions, f"Global Tables regions (default {d.regions})"),
        ("--ulids-per-ms", d.ulids_per_ms, "ULIDs minted in one millisecond (default 1e6)"),
        ("--peak-factor", d.peak_factor, "busiest hour over the month's mean (default 10)"),
    ]
    for flag, default, text in numbers:
        parser.add_argument(flag, type=_number, default=default, help=text)
    parser.add_argument(
        "--bench",
        metavar="DIR",
        help=f"make bench JSON files (default {DEFAULT_BENCH_DIR}; when absent, the seed's rates)",
    )
    parser.add_argument(
        "--out", metavar="DIR", help="write capacity.json, capacity.md and capacity.png here"
    )
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    drill = parser.add_argument_group(
        "a drill's machines (from the whole drills benchmarks/bench_scale.py measured)"
    )
    drill.add_argument(
        "--drill",
        metavar="DELIVERIES",
        type=_number,
        help="also size a drill of this many push deliveries (e.g. 1e7) from scale.json",
    )
    drill.add_argument(
        "--drill-minutes", type=_number, default=15.0, help="drain it within (default 15)"
    )
    drill.add_argument(
        "--machine-cores", type=_number, default=16, help="cores a machine (default 16)"
    )
    drill.add_argument(
        "--machine-memory-gb", type=_number, default=64.0, help="GB a machine (default 64)"
    )


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``capacity`` on the harness CLI's subparsers."""
    parser = sub.add_parser(
        "capacity",
        help="size a fleet for a celebrity burst (seed napkin math + bench rates)",
        description=__doc__.split("\n\n")[0],
    )
    _add_arguments(parser)
    parser.set_defaults(func=run_command)


def inputs_from_args(args: argparse.Namespace) -> CapacityInputs:
    def whole(flag: str, value: float) -> int:
        if not _is_whole(value):
            raise CapacityError(f"{flag} must be a whole number, got {value!r}")
        return int(value)

    return CapacityInputs(
        followers=whole("--followers", args.followers),
        push_fraction=args.push_fraction,
        sla_seconds=args.sla_seconds,
        fcm_projects=whole("--fcm-projects", args.fcm_projects),
        sends_per_month=args.sends_per_month,
        regions=whole("--regions", args.regions),
        ulids_per_ms=args.ulids_per_ms,
        peak_factor=args.peak_factor,
    )


def resolve_bench_dir(bench: str | None) -> Path | None:
    """An explicit --bench must exist; the default may not (no bench run yet: seed rates)."""
    if bench is None:
        return DEFAULT_BENCH_DIR if DEFAULT_BENCH_DIR.is_dir() else None
    path = Path(bench)
    if not path.is_dir():
        raise CapacityError(f"--bench {bench}: no such directory (run `make bench` to fill one)")
    return path


def drill_from_args(args: argparse.Namespace, bench_dir: Path | None) -> DrillEstimate | None:
    """The drill estimate ``--drill`` asks for, from ``scale.json`` in the bench directory."""
    if getattr(args, "drill", None) is None:
        return None
    if not _is_whole(args.machine_cores) or args.machine_cores < 1:
        raise CapacityError(
            f"--machine-cores must be a whole number above 0, not {args.machine_cores!r}"
        )
    path = (bench_dir or DEFAULT_BENCH_DIR) / SCALE_BENCH
    bench = _read_json(path)
    if bench is None:
        raise CapacityError(
            f"--drill needs {path}: run `.venv/bin/python benchmarks/bench_scale.py` "
            "(or `make bench`) first"
        )
    try:
        return estimate_drill(
            bench,
            args.drill,
            drain_s=args.drill_minutes * 60,
            machine_cores=int(args.machine_cores),
            machine_memory_gb=args.machine_memory_gb,
        )
    except DrillSizeError as exc:
        raise CapacityError(f"--drill: {exc}") from exc


def run_command(args: argparse.Namespace) -> int:
    """``python -m harness capacity``: print the plan; 2 on bad input."""
    try:
        inputs = inputs_from_args(args)
        bench_dir = resolve_bench_dir(args.bench)
        plan = build_plan(inputs, load_bench_rates(bench_dir), bench_dir)
        drill = drill_from_args(args, bench_dir)
        out = Path(args.out) if args.out else None
        if out is not None and out.exists() and not out.is_dir():
            raise CapacityError(f"--out {out}: exists and is not a directory")
    except CapacityError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    document = json.dumps(
        {**plan.to_dict(), **({"drill": drill.to_dict()} if drill is not None else {})}, indent=2
    )
    markdown = render_markdown(plan)
    if drill is not None:
        markdown += "\n" + drill_markdown(drill)
    print(document if args.json else markdown, end="\n" if args.json else "")
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "capacity.json").write_text(document + "\n")
        (out / "capacity.md").write_text(markdown)
        render_chart(plan, out / "capacity.png")
        # stdout stays pure JSON under --json, so the file list goes to stderr there.
        print(
            f"wrote {out / 'capacity.json'}, {out / 'capacity.md'}, {out / 'capacity.png'}",
            file=sys.stderr if args.json else sys.stdout,
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    """Standalone entry point, the same as ``python -m harness capacity``."""
    parser = argparse.ArgumentParser(
        prog="python -m harness.analysis.capacity", description=__doc__.split("\n\n")[0]
    )
    _add_arguments(parser)
    return run_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
