"""A run directory read back and laid out as a document."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from harness.analysis import metrics
from harness.analysis.duplicates import fault_buckets
from harness.analysis.metrics import Run
from harness.checkers.verdict import STATUS_WORDS, result_status
from harness.report.charts import (
    ChartInput,
    chart_depth,
    chart_duplicates,
    chart_latency,
    chart_quiet_zones,
    chart_status,
    chart_throughput,
)
from harness.report.document import (
    CHART_DIR,
    TOKEN_CHARS,
    Block,
    Document,
    counts_text,
    verdict_rows,
    verdict_sentence,
    verdict_word,
    window_rows,
)
from harness.report.evidence import (
    Context,
    checker_evidence,
    depth_samples,
    dlq_events,
    quiet_hours_by_zone,
)


def build_document(run: Run, out_dir: Path) -> Document:
    """Compute everything and write the charts into ``out_dir / charts``."""
    summary, history = run.summary, run.history
    doc = Document(run, verdict_word(summary))
    t0 = metrics.run_start(history)
    span = max(1.0, float(history["time"].max() - t0)) if len(history) else 1.0
    windows = metrics.windows_of(history)
    actions = metrics.actions_of(history)
    attempts = metrics.provider_attempts(history)
    expectation = metrics.oracle(run)
    facts = metrics.run_metrics(run)
    samples = metrics.latency_samples(history, metrics.deferred_keys(expectation))
    dups = metrics.duplicate_rows(history, windows)
    ctx = Context(run, t0, windows, attempts, expectation)
    charts = out_dir / CHART_DIR
    charts.mkdir(exist_ok=True)
    chart_in = ChartInput(run, t0, span, metrics.bucket_seconds(history), windows, actions)

    doc.blocks.append(Block("lead", verdict_sentence(summary)))
    if run.partial:
        doc.note(
            "Partial report: the run was stopped before it wrote history.parquet; this is the "
            f"history it streamed ({len(history)} rows, up to its last flush)."
        )
    doc.h2("Verdict by checker")
    doc.table(verdict_rows(summary))

    doc.h2("Headline figures")
    doc.table(headline_rows(facts))
    doc.note(
        "Throughput averages the one-second buckets in which something was sent. Latency is "
        "from the event's inject time to the first delivery of each (notification, device); "
        f"{facts['latency']['excluded_deferred']} delivery(ies) the oracle deferred for quiet "
        "hours are left out (they wait for the recipient's window by design). Duplicates per "
        "million = duplicate deliveries / unique (notification, device) deliveries x 1e6."
        + ("" if facts["latency"]["oracle"] else " No population.json: nothing was left out.")
    )
    if windows:
        doc.h3("Fault windows")
        doc.table(window_rows(windows, t0))
    else:
        doc.p("No fault was injected in this run.")

    doc.h2("Charts")
    path = chart_throughput(chart_in, charts / "throughput.png")
    if path:
        doc.image(path, "Throughput: provider requests and deliveries per second")
    else:
        doc.note("No provider request was recorded: there is no throughput to draw.")

    path = chart_latency(chart_in, samples, charts / "latency.png")
    if path:
        doc.image(path, "Event-to-device latency over time (p50/p95/p99/max per bucket)")
    else:
        doc.note("No delivery could be matched to an injected event: no latency to draw.")

    path = chart_status(chart_in, attempts, charts / "status.png")
    if path:
        doc.image(path, "Provider answers by status code ('accepted' = the device got it)")
    else:
        doc.note("No provider request was recorded: no status codes to draw.")

    path = chart_duplicates(chart_in, dups, charts / "duplicates.png")
    if path:
        doc.image(path, "Duplicate deliveries over time (visible vs collapsed by collapse id)")
        doc.p(
            "Duplicates by cause (the fault window open at the duplicate, else at the delivery "
            "it repeats); per million = duplicates caused / unique deliveries first made "
            "while that fault was on:"
        )
        doc.table(duplicates_by_cause(run))
    else:
        doc.note("No duplicate deliveries in this run (nothing to draw).")

    path = chart_depth(chart_in, depth_samples(history), charts / "depth.png")
    if path:
        doc.image(path, "Queue and DLQ depth")
    else:
        doc.note(
            "Queue/DLQ depth: the history holds no depth samples (the runner does not "
            "record queue depth over time), so no depth chart is drawn."
        )
    events = dlq_events(history, t0)
    if events.empty:
        doc.note("No DLQ redrive and no message left in a DLQ at the end of the run.")
    else:
        doc.p("What the history records about dead-letter queues:")
        doc.table(events)

    bound = float(
        summary.get("checkers", {}).get("quiet_hours", {}).get("release_bound_seconds", 30)
    )
    by_zone = quiet_hours_by_zone(run, expectation, bound)
    path = chart_quiet_zones(by_zone, charts / "quiet_hours.png")
    if path:
        doc.image(path, "Quiet-hours deferrals by recipient time zone")
    elif run.population is None:
        doc.note("Quiet hours by zone: no population.json, so deferrals have no time zone.")
    else:
        doc.note("Quiet hours by zone: no recipient had a quiet window during the run.")
    if not by_zone.empty:
        doc.table(by_zone)
        doc.note(
            "Deferred = (notification, device) pairs the oracle expects to wait for the "
            "recipient's local quiet window to end (placed by the population, not read from the "
            "system). The history records when each delivery arrived, not the system's own "
            f"deferral decision. 'Released late' = more than {bound:g}s after the window ended."
        )

    doc.h2("Evidence")
    failed = {
        n: r
        for n, r in summary.get("checkers", {}).items()
        if result_status(r) in ("fail", "unknown")
    }
    if not summary.get("checkers"):
        doc.p("No checker ran, so there is no verdict on any invariant.")
    elif not failed:
        doc.p("Every checker passed: there is no violation to show.")
    for name, result in failed.items():
        doc.h3(f"{name}: {STATUS_WORDS[result_status(result)]} ({counts_text(result)})")
        found = checker_evidence(name, result, ctx)
        if not found:
            doc.note(
                "The history holds no row that violates this checker on its own "
                "(e.g. fail_closed fails when no outage window was recorded at all)."
            )
        for title, table in found:
            doc.p(title)
            doc.table(table)
    if failed:
        doc.note(
            f"Times are seconds since the first history row; tokens show their first "
            f"{TOKEN_CHARS} characters; 'fault window' is the fault open at that instant."
        )
    return doc


def effectively_once_text(figure: dict[str, Any]) -> str:
    if not figure["pairs"]:
        return "n/a (nothing expected or delivered)"
    text = (
        f"{figure['exactly_once']} of {figure['pairs']} {figure['base']} (notification, device) "
        f"pairs arrived exactly once ({figure['percent']:g}%); "
        f"{figure['more_than_once']} more than once"
    )
    if figure["lost"] is None:
        return text + "; lost ones unknown (no population.json)"
    return text + f", {figure['lost']} never"


def duplicates_by_cause(run: Run) -> pd.DataFrame:
    buckets = fault_buckets(run)
    return buckets.assign(
        per_million=[
            metrics.per_million(d, u)
            for d, u in zip(buckets["duplicates"], buckets["unique_deliveries"], strict=True)
        ]
    )


def headline_rows(facts: dict[str, Any]) -> pd.DataFrame:
    tp, lat, dup = facts["throughput"], facts["latency"], facts["duplicates"]

    def sec(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.3f}s"

    rows = [
        ("deliveries per second (mean of active seconds)", f"{tp['deliveries_per_s']:g}"),
        ("provider requests per second", f"{tp['provider_requests_per_s']:g}"),
        ("peak deliveries in one second", f"{tp['peak_deliveries_per_s']}"),
        ("deliveries / provider requests", f"{tp['deliveries']} / {tp['provider_requests']}"),
        (
            "latency p50 / p95 / p99 / max",
            " / ".join(sec(lat[k]) for k in ("p50", "p95", "p99", "max"))
            + f" ({lat['count']} deliveries)",
        ),
        (
            "duplicates per million (all / visible)",
            f"{dup['duplicates_per_million']:.1f} / {dup['visible_per_million']:.1f}",
        ),
        ("effectively once", effectively_once_text(facts["exactly_once"])),
    ]
    return pd.DataFrame(rows, columns=["figure", "value"])
