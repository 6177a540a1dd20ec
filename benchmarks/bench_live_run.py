"""The live view's cost on a whole game day: the same run (scenario and seed) with the live view
(metrics served, online checks, stop conditions watched) and without it (``--no-live``), one
after the other on this machine.

    .venv/bin/python benchmarks/bench_live_run.py --out reports/bench/live_run.json

Per run: the harness process's own CPU (``summary.json`` ``harness_cpu_s``: its threads, not
the stack's processes), the deliveries the providers accepted, the harness's CPU per delivery,
and the delivery rate (deliveries over the span from the first to the last of them). The JSON
holds both and the live view's cost: the extra CPU per delivery as a fraction of the run's
without it, and whether that is under the 5% issue 22 allows. One pair on a shared machine: a
ratio, not an absolute.

``benchmarks/bench_live.py`` measures the live view alone on a synthetic history (its CPU per
delivery beside the history's own append); this one measures it inside a real run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
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


def run_once(scenario: str, seed: int, out: Path, live: bool) -> dict[str, Any]:
    argv = [sys.executable, "-m", "harness", "run", scenario, "--seed", str(seed)]
    argv += ["--no-report", "--out", str(out)] + ([] if live else ["--no-live"])
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=900)
    runs = sorted(p for p in out.iterdir() if p.is_dir())
    if not runs:
        raise RuntimeError(f"{' '.join(argv)} left no run: {done.stdout}{done.stderr}"[-4000:])
    summary = json.loads((runs[-1] / "summary.json").read_text())
    return figures(summary, pd.read_parquet(runs[-1] / "history.parquet"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--scenario", default="game-day")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-live-run-") as tmp:
        without = run_once(args.scenario, args.seed, Path(tmp) / "off", live=False)
        with_live = run_once(args.scenario, args.seed, Path(tmp) / "on", live=True)
    result = {
        "benchmark": "live_run",
        "scenario": args.scenario,
        "seed": args.seed,
        "limit_fraction": LIMIT,
        "with_live_view": with_live,
        "without_live_view": without,
        **compare(with_live, without),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
