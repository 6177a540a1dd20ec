"""The duplicate report: duplicates per million deliveries by scenario and by fault, over one
or more run directories, each duplicate traced to its cause.

``python -m harness duplicates RUN...`` prints it as Markdown (``--json`` for machines,
``--out FILE`` to write it). Figures come from ``harness.analysis.metrics``, the same ones the run
report and ``compare`` use.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from harness.analysis import metrics
from harness.analysis.metrics import KEY, Run
from harness.checkers.windows import deliveries

ALL = "(all)"
TABLE_COLUMNS = [
    "scenario",
    "fault",
    "runs",
    "unique_deliveries",
    "duplicates",
    "visible",
    "collapsed",
    "per_million",
    "visible_per_million",
]


@dataclass
class DuplicateReport:
    table: pd.DataFrame  # one row per (scenario, fault), plus an (all) row per scenario
    traces: pd.DataFrame  # one row per duplicate delivery
    runs: list[dict[str, Any]]  # per run: id, scenario, figures, effectively-once


def fault_buckets(run: Run) -> pd.DataFrame:
    """Per cause: unique deliveries whose first delivery fell in it, and the duplicates it
    caused. Both use the same names (``faults_at``), so the per-million figure of a fault is
    'duplicates it caused per million deliveries made while it was on'."""
    windows = metrics.windows_of(run.history)
    got = deliveries(run.history)
    first = got.groupby(KEY, dropna=False)["time"].min()
    unique = pd.Series(metrics.faults_at(first.to_numpy(), windows)).value_counts()
    dups = metrics.duplicate_rows(run.history, windows)
    rows = []
    for cause in sorted(set(unique.index) | set(dups["cause"])):
        caused = dups[dups["cause"] == cause]
        rows.append(
            {
                "fault": cause,
                "unique_deliveries": int(unique.get(cause, 0)),
                "duplicates": int(len(caused)),
                "visible": int((caused["path"] == "visible").sum()),
                "collapsed": int((caused["path"] == "collapsed").sum()),
            }
        )
    return pd.DataFrame(
        rows, columns=["fault", "unique_deliveries", "duplicates", "visible", "collapsed"]
    )


def _aggregate(frame: pd.DataFrame, runs: int) -> dict[str, Any]:
    unique, dups, visible = (
        int(frame["unique_deliveries"].sum()),
        int(frame["duplicates"].sum()),
        int(frame["visible"].sum()),
    )
    return {
        "runs": runs,
        "unique_deliveries": unique,
        "duplicates": dups,
        "visible": visible,
        "collapsed": int(frame["collapsed"].sum()),
        "per_million": metrics.per_million(dups, unique),
        "visible_per_million": metrics.per_million(visible, unique),
    }


def build(run_dirs: list[Path]) -> DuplicateReport:
    """Raises ``metrics.RunDirError`` for a directory that is not a readable run."""
    loaded = [metrics.load_run(Path(d)) for d in run_dirs]
    buckets, traces, per_run = [], [], []
    for run in loaded:
        # Counted by directory: two copies of one run share a run_id but are two runs.
        bucket = fault_buckets(run).assign(scenario=run.scenario, run_dir=str(run.path.resolve()))
        buckets.append(bucket)
        trace = metrics.duplicate_rows(run.history)
        traces.append(trace.assign(run_id=run.name, scenario=run.scenario))
        per_run.append(
            {
                "run_id": run.name,
                "scenario": run.scenario,
                "duplicates": metrics.duplicate_figures(run.history),
                "exactly_once": metrics.exactly_once(run.history, metrics.oracle(run)),
            }
        )
    all_buckets = pd.concat(buckets, ignore_index=True) if buckets else pd.DataFrame()
    rows = []
    for scenario in sorted({r["scenario"] for r in per_run}):
        of_scenario = all_buckets[all_buckets["scenario"] == scenario]
        runs = sum(1 for r in per_run if r["scenario"] == scenario)
        rows.append({"scenario": scenario, "fault": ALL, **_aggregate(of_scenario, runs)})
        for fault, group in of_scenario.groupby("fault", sort=True):
            rows.append(
                {
                    "scenario": scenario,
                    "fault": fault,
                    **_aggregate(group, group["run_dir"].nunique()),
                }
            )
    table = pd.DataFrame(rows, columns=TABLE_COLUMNS)
    trace_frame = pd.concat(traces, ignore_index=True) if traces else pd.DataFrame()
    return DuplicateReport(table, trace_frame, per_run)


def duplicate_report(run_dirs: list[Path]) -> pd.DataFrame:
    """Duplicates per million deliveries by scenario (fault ``(all)``) and by fault."""
    return build(run_dirs).table


def effectively_once_line(run: dict[str, Any]) -> str:
    figure = run["exactly_once"]
    if not figure["pairs"]:
        return f"- `{run['run_id']}`: nothing expected or delivered"
    lost = "lost unknown (no population)" if figure["lost"] is None else f"{figure['lost']} lost"
    dup = run["duplicates"]
    return (
        f"- `{run['run_id']}`: {figure['exactly_once']}/{figure['pairs']} {figure['base']} "
        f"pairs exactly once ({figure['percent']:g}%), {figure['more_than_once']} more than "
        f"once, {lost}; {dup['duplicates_per_million']:.1f} duplicates per million "
        f"({dup['visible_per_million']:.1f} visible)"
    )


def render_markdown(report: DuplicateReport, max_traces: int = 50) -> str:
    lines = ["# Duplicate report", ""]
    lines.append(
        "Duplicates per million = duplicate deliveries / unique (notification, device) "
        "deliveries x 1e6. By fault: duplicates the fault caused per million unique deliveries "
        "first made while it was on; `no fault` = outside every fault window. A duplicate's "
        "cause is the fault window open at the duplicate delivery, or, when none was, the one "
        "open at the delivery it repeats (a retry after 'accepted then 5xx' lands after its "
        "window). `collapsed` = every delivery carried the same collapse id, so the device "
        "shows one notification; `visible` = the user sees it twice."
    )
    lines += ["", "## By scenario and fault", "", metrics.markdown_table(report.table), ""]
    lines += ["## Effectively once, honestly", ""]
    lines += [effectively_once_line(r) for r in report.runs]
    lines += ["", "## Each duplicate, traced", ""]
    traces = report.traces
    if traces.empty:
        lines.append("No duplicate delivery in these runs.")
    else:
        shown = traces.head(max_traces)
        table = pd.DataFrame(
            {
                "run": shown["run_id"],
                "tenant": shown["tenant_id"],
                "notification": shown["notification_id"],
                "token": [str(t)[:16] + "…" for t in shown["token"]],
                "delivery #": shown["delivery_number"],
                "gap (s)": (shown["time"] - shown["previous_time"]).round(2),
                "previous status": shown["previous_status"],
                "path": shown["path"],
                "cause": shown["cause"],
                "cause basis": shown["cause_basis"],
            }
        )
        lines.append(metrics.markdown_table(table))
        if len(traces) > max_traces:
            lines.append(f"\n({len(traces) - max_traces} more; use --json for all)")
    return "\n".join(lines) + "\n"


def to_json(report: DuplicateReport) -> dict[str, Any]:
    traces = report.traces
    return {
        "table": json.loads(report.table.to_json(orient="records")),
        "runs": report.runs,
        "traces": json.loads(traces.to_json(orient="records")) if not traces.empty else [],
    }


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "duplicates", help="duplicates per million by scenario and fault, each traced to a cause"
    )
    parser.add_argument("runs", nargs="+", metavar="RUN", help="run directories")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--out", metavar="FILE", help="write here instead of stdout")
    parser.set_defaults(func=run_command)


def run_command(args: argparse.Namespace) -> int:
    try:
        report = build([Path(r) for r in args.runs])
    except metrics.RunDirError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(to_json(report), indent=2) + "\n" if args.json else render_markdown(report)
    if args.out:
        Path(args.out).write_text(text)
        print(f"wrote {args.out}")
    else:
        sys.stdout.write(text)
    return 0
