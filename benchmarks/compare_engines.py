"""Which engine runs the checkers over a history larger than memory: DuckDB or Polars streaming
(pandas beside them), measured on the same Parquet files, each in a fresh process.

    .venv/bin/python benchmarks/compare_engines.py --data DIR [--memory-limit-gb 4]

``DIR`` holds ``history.parquet`` and ``expected.parquet`` as ``bench_checkers.py --keep DIR``
leaves them. Two of the heaviest checkers' cores are timed per engine: effectively_once's
(deliveries grouped per (tenant, notification, token) with their collapse ids, outer-joined with
the expected keys: delivered, duplicated, collapsed, lost, unexpected) and quiet_hours' (each
deferred expected delivery's first delivery time: early, late, never). Wall seconds, peak RSS
(the child's getrusage) and the counts per engine go to ``reports/bench/engines.json``; the
counts must agree across engines. Not part of ``make bench`` (it is run to choose, not to watch).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ("duckdb", "polars", "pandas")
RELEASE_BOUND_S = 120.0


def _duckdb(data: Path, memory_gb: float) -> dict[str, Any]:
    import duckdb

    con = duckdb.connect()
    spill = tempfile.mkdtemp(prefix="engines-")
    con.execute(f"SET memory_limit='{memory_gb}GB'")
    con.execute(f"SET temp_directory='{spill}'")
    con.execute("SET preserve_insertion_order=false")
    h, e = f"'{data / 'history.parquet'}'", f"'{data / 'expected.parquet'}'"
    started = time.perf_counter()
    row = con.execute(f"""
        WITH d AS (
            SELECT tenant_id, notification_id, token, count(*) AS n,
                   count(collapse_id) = count(*) AND min(collapse_id) = max(collapse_id) AS one_id
            FROM read_parquet({h})
            WHERE kind = 'provider' AND coalesce(delivered, status = 200)
            GROUP BY ALL),
        x AS (SELECT DISTINCT tenant_id, notification_id, token FROM read_parquet({e})),
        j AS (SELECT d.n, d.one_id, x.token IS NOT NULL AS expected, d.n IS NOT NULL AS got
              FROM d FULL JOIN x USING (tenant_id, notification_id, token))
        SELECT count(*) FILTER (expected AND got), sum(n) FILTER (got) - count(*) FILTER (got),
               coalesce(sum(n - 1) FILTER (expected AND got AND one_id), 0),
               count(*) FILTER (expected AND NOT got), coalesce(sum(n) FILTER (NOT expected), 0)
        FROM j""").fetchone()
    once = dict(
        zip(("delivered", "duplicated", "collapsed", "lost", "unexpected"), row, strict=True)
    )
    once_s = time.perf_counter() - started
    started = time.perf_counter()
    row = con.execute(f"""
        WITH q AS (SELECT DISTINCT tenant_id, notification_id, token, quiet_until
                   FROM read_parquet({e}) WHERE quiet_until IS NOT NULL),
        f AS (SELECT tenant_id, notification_id, token, min(time) AS first
              FROM read_parquet({h})
              WHERE kind = 'provider' AND coalesce(delivered, status = 200)
                AND token IN (SELECT token FROM q)
              GROUP BY ALL)
        SELECT count(*), count(first), count(*) FILTER (first < quiet_until),
               count(*) FILTER (first - quiet_until > {RELEASE_BOUND_S})
        FROM q LEFT JOIN f USING (tenant_id, notification_id, token)""").fetchone()
    quiet = dict(
        zip(("deferred_expected", "deferred_delivered", "early", "late"), row, strict=True)
    )
    return {"effectively_once": once, "effectively_once_s": once_s, "quiet_hours": quiet,
            "quiet_hours_s": time.perf_counter() - started}  # fmt: skip


def _polars(data: Path) -> dict[str, Any]:
    import polars as pl

    history = pl.scan_parquet(data / "history.parquet")
    expected = pl.scan_parquet(data / "expected.parquet")
    key = ["tenant_id", "notification_id", "token"]
    delivered = pl.col("delivered").fill_null(pl.col("status") == 200)
    got = history.filter((pl.col("kind") == "provider") & delivered)
    started = time.perf_counter()
    per_key = got.group_by(key).agg(
        pl.len().alias("n"),
        (
            (pl.col("collapse_id").count() == pl.len())
            & (pl.col("collapse_id").min() == pl.col("collapse_id").max())
        ).alias("one_id"),
    )
    joined = per_key.join(
        expected.select(key).unique().with_columns(pl.lit(True).alias("expected")),
        on=key,
        how="full",
        coalesce=True,
        nulls_equal=True,
    ).with_columns(pl.col("expected").fill_null(False), pl.col("n").is_not_null().alias("got"))
    e, g = pl.col("expected"), pl.col("got")
    out = joined.select(
        (e & g).sum().alias("delivered"),
        (pl.col("n").sum() - g.sum()).alias("duplicated"),
        pl.when(e & g & pl.col("one_id"))
        .then(pl.col("n") - 1)
        .otherwise(0)
        .sum()
        .alias("collapsed"),
        (e & ~g).sum().alias("lost"),
        pl.when(~e).then(pl.col("n")).otherwise(0).sum().alias("unexpected"),
    ).collect(engine="streaming")
    once = {k: int(v) for k, v in out.row(0, named=True).items()}
    once_s = time.perf_counter() - started
    started = time.perf_counter()
    deferred = (
        expected.filter(pl.col("quiet_until").is_not_null()).select([*key, "quiet_until"]).unique()
    )
    first = got.group_by(key).agg(pl.col("time").min().alias("first"))
    q = deferred.join(first, on=key, how="left", nulls_equal=True)
    early = pl.col("first") < pl.col("quiet_until")
    late = (pl.col("first") - pl.col("quiet_until")) > RELEASE_BOUND_S
    out = q.select(
        pl.len().alias("deferred_expected"),
        pl.col("first").count().alias("deferred_delivered"),
        early.sum().alias("early"),
        late.sum().alias("late"),
    ).collect(engine="streaming")
    quiet = {k: int(v) for k, v in out.row(0, named=True).items()}
    return {"effectively_once": once, "effectively_once_s": once_s, "quiet_hours": quiet,
            "quiet_hours_s": time.perf_counter() - started}  # fmt: skip


def _pandas(data: Path) -> dict[str, Any]:
    import pandas as pd

    from harness.checkers import effectively_once, quiet_hours
    from harness.model import history as history_module
    from harness.model.oracle import EXPECTED_COLUMNS, Expectation
    from harness.model.population import Population, PopulationSpec

    started = time.perf_counter()
    frame = history_module.read(data / "history.parquet")
    expectation = Expectation(pd.read_parquet(data / "expected.parquet")[EXPECTED_COLUMNS])
    read_s = time.perf_counter() - started
    started = time.perf_counter()
    counts = effectively_once.check(expectation, frame).counts
    once_s = time.perf_counter() - started
    once = {k: counts[k] for k in ("delivered", "duplicated", "collapsed", "lost", "unexpected")}
    started = time.perf_counter()
    empty = Population(seed=0, started_at=0.0, spec=PopulationSpec())
    counts = quiet_hours.check(empty, expectation, frame, RELEASE_BOUND_S).counts
    quiet = {
        "deferred_expected": counts["deferred_expected"],
        "deferred_delivered": counts["deferred_delivered"],
        "early": counts["delivered_inside_window"],
        "late": counts["released_late"],
    }
    return {"read_s": read_s, "effectively_once": once, "effectively_once_s": once_s,
            "quiet_hours": quiet, "quiet_hours_s": time.perf_counter() - started}  # fmt: skip


def child(engine: str, data: Path, memory_gb: float) -> dict[str, Any]:
    started = time.perf_counter()
    if engine == "duckdb":
        result = _duckdb(data, memory_gb)
    elif engine == "polars":
        result = _polars(data)
    else:
        result = _pandas(data)
    result["total_s"] = round(time.perf_counter() - started, 2)
    result["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, type=Path)
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--memory-limit-gb", type=float, default=4.0, help="DuckDB's cap")
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "bench" / "engines.json")
    parser.add_argument("--child", choices=ENGINES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.data, args.memory_limit_gb)))
        return 0
    results: dict[str, Any] = {}
    for engine in args.engines.split(","):
        command = [sys.executable, __file__, "--data", str(args.data), "--child", engine,
                   "--memory-limit-gb", str(args.memory_limit_gb)]  # fmt: skip
        done = subprocess.run(
            command, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}
        )
        if done.returncode:
            results[engine] = {"error": done.stderr.strip().splitlines()[-1:]}
        else:
            results[engine] = json.loads(done.stdout.strip().splitlines()[-1])
        print(engine, json.dumps(results[engine]), flush=True)
    ok = [r for r in results.values() if "error" not in r]
    agree = all(
        r[k] == ok[0][k] for r in ok for k in ("effectively_once", "quiet_hours")
    ) if ok else False  # fmt: skip
    report = {
        "benchmark": "engines",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "data": str(args.data),
        "history_bytes": (args.data / "history.parquet").stat().st_size,
        "duckdb_memory_limit_gb": args.memory_limit_gb,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "results": results,
        "counts_agree": agree,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"counts agree: {agree}; wrote {args.out}")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
