"""The live view's cost on a whole game day: the same run (scenario and seed) with the live view
(metrics served, online checks, stop conditions watched) and without it (``--no-live``), one
after the other on this machine.

    .venv/bin/python benchmarks/bench_live_run.py --out reports/bench/live_run.json

Per run: the harness process's own CPU (``summary.json`` ``harness_cpu_s``: its threads, not
the stack's processes), the deliveries the providers accepted, the harness's CPU per delivery,
and the delivery rate (deliveries over the span from the first to the last of them). Each mode
runs ``--repeats`` times, alternating, and the means are compared: on a shared machine two runs
of one mode differ by more than the live view costs, so the JSON also holds the live view's own
CPU replayed over the with-live run's history (its metrics and online checks fed the rows in
the half-second batches the view reads), the figure ``under_limit`` judges against the 5% of
the run's own harness CPU that issue 22 allows.

``benchmarks/bench_live.py`` measures the live view alone on a synthetic history (its CPU per
delivery beside the history's own append); this one measures it inside a real run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 0.05


def figures(summary: dict[str, Any], history: pd.DataFrame) -> dict[str, Any]:
    """One run's figures: its verdict, the harness's CPU, the deliveries and their rate."""
    provider = history[history["kind"] == "provider"]
    delivered = provider[provider["delivered"].fillna(False).astype(bool)]
    times = delivered["time"].astype(float)
    span = float(times.max() - times.min()) if len(times) > 1 else 0.0
    cpu = float(summary["harness_cpu_s"])
    count = len(delivered)
    return {
        "verdict": summary["verdict"],
        "harness_cpu_s": cpu,
        "deliveries": count,
        "deliveries_per_s": round(count / span, 1) if span > 0 else None,
        "harness_cpu_us_per_delivery": round(cpu * 1e6 / count, 1) if count else None,
    }


def compare(with_live: dict[str, Any], without: dict[str, Any]) -> dict[str, Any]:
    """The live view's cost: its extra CPU per delivery over the run's without it."""
    live_us = with_live["harness_cpu_us_per_delivery"]
    base_us = without["harness_cpu_us_per_delivery"]
    if not live_us or not base_us:
        return {"cost_fraction": None, "under_limit": None, "why": "a run delivered nothing"}
    cost = (live_us - base_us) / base_us
    rate = with_live["deliveries_per_s"], without["deliveries_per_s"]
    return {
        "cost_fraction": round(cost, 4),
        "under_limit": cost < LIMIT,
        "rate_ratio": round(rate[0] / rate[1], 3) if all(rate) else None,
    }


def replayed_cpu_s(history: pd.DataFrame, interval_s: float = 0.5) -> tuple[float, dict[str, int]]:
    """CPU seconds the live view's metrics and online checks take over ``history``, fed in
    the batches of ``interval_s`` of history time the view reads as the run goes, and the
    live violations they counted."""
    from harness.live.metrics import LiveMetrics
    from harness.live.online import OnlineChecks

    rows = history.to_dict("records")
    times = history["time"].astype(float)
    start = float(times.min()) if len(times) else 0.0
    batch = ((times.fillna(start) - start) // interval_s).astype(int).tolist()
    metrics, checks = LiveMetrics("bench", "bench", 0), OnlineChecks()
    began = time.process_time()
    at = 0
    while at < len(rows):
        end = at
        while end < len(rows) and batch[end] <= batch[at]:
            end += 1
        chunk = rows[at:end]
        metrics.feed(chunk)
        for violation in checks.feed(chunk, now=start + (batch[at] + 1) * interval_s):
            metrics.violation(violation)
        at = end
    checks.finish()
    return time.process_time() - began, dict(checks.counts)


def mean(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The runs' mean of each figure (the first's verdict and the list of CPU seconds)."""
    keys = ("harness_cpu_s", "deliveries", "deliveries_per_s", "harness_cpu_us_per_delivery")
    out: dict[str, Any] = {"verdicts": [r["verdict"] for r in runs]}
    for key in keys:
        values = [r[key] for r in runs if r[key] is not None]
        out[key] = round(sum(values) / len(values), 3) if values else None
    out["harness_cpu_s_each"] = [r["harness_cpu_s"] for r in runs]
    return out


def run_once(scenario: str, seed: int, out: Path, live: bool) -> dict[str, Any]:
    argv = [sys.executable, "-m", "harness", "run", scenario, "--seed", str(seed)]
    argv += ["--no-report", "--out", str(out)] + ([] if live else ["--no-live"])
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=900)
    runs = sorted(p for p in out.iterdir() if p.is_dir())
    if not runs:
        raise RuntimeError(f"{' '.join(argv)} left no run: {done.stdout}{done.stderr}"[-4000:])
    summary = json.loads((runs[-1] / "summary.json").read_text())
    history = pd.read_parquet(runs[-1] / "history.parquet")
    found = figures(summary, history)
    if live:
        found["live_view_cpu_s_replayed"] = round(replayed_cpu_s(history)[0], 3)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--scenario", default="game-day")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2, help="runs of each mode, alternating")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        print("error: --repeats must be 1 or more", file=sys.stderr)
        return 2
    runs: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="bench-live-run-") as tmp:
        for n in range(args.repeats):
            for live in (False, True):
                out = Path(tmp) / f"{'on' if live else 'off'}-{n}"
                runs[live].append(run_once(args.scenario, args.seed, out, live))
    with_live, without = mean(runs[True]), mean(runs[False])
    replayed = [r["live_view_cpu_s_replayed"] for r in runs[True]]
    own = sum(replayed) / len(replayed)
    base = without["harness_cpu_s"]
    result = {
        "benchmark": "live_run",
        "scenario": args.scenario,
        "seed": args.seed,
        "repeats": args.repeats,
        "limit_fraction": LIMIT,
        "with_live_view": with_live,
        "without_live_view": without,
        **{f"ab_{k}": v for k, v in compare(with_live, without).items() if k != "under_limit"},
        "live_view_cpu_s_replayed": round(own, 3),
        "live_view_fraction_of_harness_cpu": round(own / base, 4) if base else None,
        "under_limit": bool(base) and own / base < LIMIT,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
