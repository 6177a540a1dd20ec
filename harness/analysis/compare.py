"""Compare two runs (A = baseline, B = candidate): throughput, latency quantiles and duplicate
rate side by side, with thresholds that turn "B is worse" into an exit code a CI job can gate on.

Exit codes: 0 B is within every threshold; 1 B regressed past one; 2 a run directory is
missing or unreadable. Figures come from ``harness.analysis.metrics`` (the same as the run report).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from harness.analysis import metrics

EXIT_OK, EXIT_REGRESSED, EXIT_BAD_INPUT = 0, 1, 2


def _relative_change(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or a == 0:
        return None
    return (b - a) / a


def _row(
    name: str, a: float | None, b: float | None, unit: str, gate: str | None = None
) -> dict[str, Any]:
    return {
        "metric": name,
        "a": a,
        "b": b,
        "unit": unit,
        "change": _relative_change(a, b),
        "gate": gate,
        "regressed": False,
        "why": None,
    }


def compare_metrics(
    a: dict[str, Any],
    b: dict[str, Any],
    max_throughput_drop: float = 0.2,
    max_latency_increase: float = 0.5,
    max_duplicate_rate_increase: float = 0.0,
) -> dict[str, Any]:
    """The comparison of two ``metrics.run_metrics`` results (pure: no file access)."""
    ta, tb = a["throughput"], b["throughput"]
    la, lb = a["latency"], b["latency"]
    da, db = a["duplicates"], b["duplicates"]
    rows = [
        _row("deliveries/s", ta["deliveries_per_s"], tb["deliveries_per_s"], "1/s", "throughput"),
        _row(
            "provider requests/s",
            ta["provider_requests_per_s"],
            tb["provider_requests_per_s"],
            "1/s",
        ),
        _row("peak deliveries/s", ta["peak_deliveries_per_s"], tb["peak_deliveries_per_s"], "1/s"),
        _row("latency p50", la["p50"], lb["p50"], "s"),
        _row("latency p95", la["p95"], lb["p95"], "s", "latency"),
        _row("latency p99", la["p99"], lb["p99"], "s"),
        _row("latency max", la["max"], lb["max"], "s"),
        _row(
            "duplicates/million",
            da["duplicates_per_million"],
            db["duplicates_per_million"],
            "ppm",
            "duplicates",
        ),
        _row(
            "visible duplicates/million",
            da["visible_per_million"],
            db["visible_per_million"],
            "ppm",
        ),
    ]
    notes = []
    for row in rows:
        gate, va, vb = row["gate"], row["a"], row["b"]
        if gate is None:
            continue
        if va is None or vb is None:
            notes.append(f"{row['metric']}: not measured in {'A' if va is None else 'B'}")
            continue
        if gate == "throughput" and va > 0 and (va - vb) / va > max_throughput_drop:
            row["regressed"] = True
            row["why"] = f"dropped {(va - vb) / va:.0%} > {max_throughput_drop:.0%} allowed"
        elif gate == "latency" and va > 0 and (vb - va) / va > max_latency_increase:
            row["regressed"] = True
            row["why"] = f"rose {(vb - va) / va:.0%} > {max_latency_increase:.0%} allowed"
        elif gate == "duplicates" and vb - va > max_duplicate_rate_increase:
            row["regressed"] = True
            row["why"] = (
                f"rose by {vb - va:g} per million > {max_duplicate_rate_increase:g} allowed"
            )
    if la.get("oracle") != lb.get("oracle"):
        notes.append(
            "latency: one run has a population.json and one has not, so quiet-hours "
            "deferrals are left out of one side only"
        )
    if a.get("scenario") != b.get("scenario"):
        notes.append(f"different scenarios: {a.get('scenario')} vs {b.get('scenario')}")
    return {
        "a": a,
        "b": b,
        "thresholds": {
            "max_throughput_drop": max_throughput_drop,
            "max_latency_increase": max_latency_increase,
            "max_duplicate_rate_increase": max_duplicate_rate_increase,
        },
        "rows": rows,
        "regressed": any(r["regressed"] for r in rows),
        "notes": notes,
    }


def compare_runs(
    a: Path,
    b: Path,
    max_throughput_drop: float = 0.2,
    max_latency_increase: float = 0.5,
    max_duplicate_rate_increase: float = 0.0,
) -> dict[str, Any]:
    """Compare run directory ``b`` against baseline ``a``. Raises ``metrics.RunDirError``."""
    return compare_metrics(
        metrics.run_metrics(metrics.load_run(Path(a))),
        metrics.run_metrics(metrics.load_run(Path(b))),
        max_throughput_drop,
        max_latency_increase,
        max_duplicate_rate_increase,
    )


def _fmt(value: float | None) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, int):
        return str(value)
    return f"{value:.3f}" if abs(value) < 1000 else f"{value:.1f}"


def render_table(result: dict[str, Any]) -> str:
    a, b = result["a"], result["b"]
    lines = [
        f"A: {a['run_id']}  ({a['scenario']}, verdict {a['verdict']})",
        f"B: {b['run_id']}  ({b['scenario']}, verdict {b['verdict']})",
        "",
        f"{'metric':<34} {'A':>12} {'B':>12} {'change':>9}  gate",
    ]
    for row in result["rows"]:
        change = "" if row["change"] is None else f"{row['change']:+.1%}"
        if row["gate"] is None:
            gate = ""
        else:
            gate = f"REGRESSED: {row['why']}" if row["regressed"] else "ok"
        metric = f"{row['metric']} ({row['unit']})"
        lines.append(f"{metric:<34} {_fmt(row['a']):>12} {_fmt(row['b']):>12} {change:>9}  {gate}")
    for note in result["notes"]:
        lines.append(f"note: {note}")
    lines.append("")
    lines.append("result: B REGRESSED against A" if result["regressed"] else "result: B is ok")
    return "\n".join(lines)


def _fraction(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "compare", help="compare run B against baseline run A; exit 1 when B regressed"
    )
    parser.add_argument("run_a", metavar="RUN_A", help="baseline run directory")
    parser.add_argument("run_b", metavar="RUN_B", help="candidate run directory")
    parser.add_argument(
        "--max-throughput-drop",
        type=_fraction,
        default=0.2,
        help="fraction of A's deliveries/s B may lose (default 0.2)",
    )
    parser.add_argument(
        "--max-latency-increase",
        type=_fraction,
        default=0.5,
        help="fraction by which B's p95 latency may exceed A's (default 0.5)",
    )
    parser.add_argument(
        "--max-duplicate-rate-increase",
        type=_fraction,
        default=0.0,
        help="duplicates per million B may add over A (default 0)",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=run_command)


def run_command(args: argparse.Namespace) -> int:
    try:
        result = compare_runs(
            Path(args.run_a),
            Path(args.run_b),
            args.max_throughput_drop,
            args.max_latency_increase,
            args.max_duplicate_rate_increase,
        )
    except metrics.RunDirError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(render_table(result))
    return EXIT_REGRESSED if result["regressed"] else EXIT_OK
