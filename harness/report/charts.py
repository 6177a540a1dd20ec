"""The report's charts (matplotlib, fault windows shaded)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.transforms import blended_transform_factory

from harness.analysis import metrics
from harness.analysis.metrics import Run
from harness.checkers.windows import Window

FAULT_COLORS = ["#4c72b0", "#dd8452", "#8172b3", "#937860", "#da8bc3", "#8c8c8c", "#ccb974"]

STATUS_COLORS = {"200": "#55a868", "429": "#dd8452", "410": "#8c8c8c", "404": "#b0b0b0"}


def _fault_colors(windows: list[Window]) -> dict[str, str]:
    names = sorted({w.fault for w in windows})
    return {n: FAULT_COLORS[i % len(FAULT_COLORS)] for i, n in enumerate(names)}


def _label_lanes(windows: list[Window], t0: float, span: float) -> list[int]:
    """A text lane per window, so labels of overlapping or adjacent windows do not collide."""
    char = span * 0.0075  # ~one 8pt character on a 10-inch axis
    lanes_end: list[float] = []
    lanes = []
    for w in windows:
        start = w.start - t0
        end = max(w.stop - t0, start + (len(w.fault) + 2) * char)
        for lane, busy_until in enumerate(lanes_end):
            if start >= busy_until:
                lanes_end[lane] = end
                lanes.append(lane)
                break
        else:
            lanes_end.append(end)
            lanes.append(len(lanes_end) - 1)
    return lanes


LANE = 0.09  # axes fraction per label lane


def shade_faults(
    ax: Axes, windows: list[Window], actions: pd.DataFrame, t0: float, span: float
) -> None:
    """A light band per fault window, and at the top a coloured bar with the fault's name in
    its own lane, so overlapping windows stay distinguishable; actions are dotted lines."""
    colors = _fault_colors(windows)
    lanes = _label_lanes(windows, t0, span)
    trans = blended_transform_factory(ax.transData, ax.transAxes)
    for w, lane in zip(windows, lanes, strict=True):
        start, stop = w.start - t0, w.stop - t0
        ax.axvspan(start, stop, color=colors[w.fault], alpha=0.10, lw=0, zorder=0)
        y = 0.985 - LANE * lane
        ax.plot(
            [start, stop],
            [y, y],
            transform=trans,
            color=colors[w.fault],
            lw=3,
            solid_capstyle="butt",
            zorder=5,
        )
        ax.text(
            start,
            y - 0.02,
            w.fault,
            transform=trans,
            fontsize=8,
            va="top",
            ha="left",
            color=colors[w.fault],
            fontweight="bold",
            zorder=6,
        )
    for row in actions.itertuples(index=False):
        ax.axvline(row.time - t0, color="#444444", ls=":", lw=1, zorder=1)
        ax.text(
            row.time - t0,
            0.02,
            f"{str(row.name).split(':')[0]} ",
            transform=trans,
            fontsize=7,
            color="#444444",
            rotation=90,
            va="bottom",
            ha="right",
        )
    if windows:
        # Headroom so the data stays below the label lanes.
        reserved = 0.07 + LANE * (max(lanes) + 1)
        low, high = ax.get_ylim()
        ax.set_ylim(low, low + (high - low) / (1 - reserved))


def _figure(height: float) -> Figure:
    # The object API with an explicit Agg canvas: no pyplot global state, so reports can be
    # written from any thread and never touch the caller's backend.
    fig = Figure(figsize=(10, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _new_axes(title: str, ylabel: str) -> tuple[Figure, Axes]:
    fig = _figure(3.8)
    ax = fig.subplots()
    ax.set_title(title, fontsize=11, loc="left")
    ax.set_xlabel("seconds since run start")
    ax.set_ylabel(ylabel)
    ax.grid(True, axis="y", alpha=0.3)
    ax.spines[["top", "right"]].set_visible(False)
    return fig, ax


def _finish(fig: Figure, ax: Axes, path: Path, left_in: float = 0.75) -> Path:
    """Fixed margins in inches (tight_layout costs as much as drawing the chart), the legend
    in one row under the x axis label."""
    width, height = fig.get_figwidth(), fig.get_figheight()
    handles, labels = ax.get_legend_handles_labels()
    bottom_in = 0.55 + (0.3 if handles else 0.0)
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=6, fontsize=8, frameon=False)
    fig.subplots_adjust(
        left=left_in / width,
        right=1 - 0.2 / width,
        top=1 - 0.35 / height,
        bottom=bottom_in / height,
    )
    fig.savefig(path)
    return path


@dataclass
class ChartInput:
    run: Run
    t0: float
    span: float
    bucket_s: int
    windows: list[Window]
    actions: pd.DataFrame


def chart_throughput(c: ChartInput, path: Path) -> Path | None:
    series = metrics.throughput_series(c.run.history, c.bucket_s)
    if series.to_numpy().sum() == 0:
        return None
    fig, ax = _new_axes(
        f"Throughput ({c.bucket_s}s buckets)" if c.bucket_s > 1 else "Throughput", "per second"
    )
    ax.step(
        series.index, series["provider_requests_per_s"], where="post", label="provider requests/s"
    )
    ax.step(series.index, series["deliveries_per_s"], where="post", label="deliveries/s")
    ax.set_xlim(0, c.span)
    ax.set_ylim(bottom=0)
    shade_faults(ax, c.windows, c.actions, c.t0, c.span)
    return _finish(fig, ax, path)


def chart_latency(c: ChartInput, samples: pd.DataFrame, path: Path) -> Path | None:
    samples = samples[~samples["deferred"].astype(bool)]
    if samples.empty:
        return None
    bucket = max(c.bucket_s, math.ceil(c.span / 40))
    offset = samples["time"] - c.t0
    grouped = samples.groupby((offset // bucket) * bucket)["latency"]
    quantiles = pd.DataFrame(
        {
            "p50": grouped.quantile(0.5),
            "p95": grouped.quantile(0.95),
            "p99": grouped.quantile(0.99),
            "max": grouped.max(),
        }
    )
    # Empty buckets become gaps: a line drawn across a silence would invent latencies.
    quantiles = quantiles.reindex(np.arange(0, c.span + bucket, bucket, dtype=float))
    fig, ax = _new_axes(
        "Event-to-device latency (first delivery; quiet-hours deferrals left out)", "seconds"
    )
    shown = samples.sample(n=min(len(samples), 5000), random_state=0)
    ax.scatter(shown["time"] - c.t0, shown["latency"], s=4, color="#b0b0b0", label="each delivery")
    mid = quantiles.index + bucket / 2
    for name, style in (("p50", "-"), ("p95", "--"), ("p99", "-."), ("max", ":")):
        ax.plot(mid, quantiles[name], style, marker=".", label=name)
    ax.set_xlim(0, c.span)
    ax.set_ylim(bottom=0)
    shade_faults(ax, c.windows, c.actions, c.t0, c.span)
    return _finish(fig, ax, path)


def status_category(status: Any, got: bool) -> str:
    if status is None or status is pd.NA:
        return "no status"
    code = str(int(status))
    return f"{code} accepted" if got and code != "200" else code


def chart_status(c: ChartInput, attempts: pd.DataFrame, path: Path) -> Path | None:
    if attempts.empty:
        return None
    category = [
        status_category(s, g) for s, g in zip(attempts["status"], attempts["got"], strict=True)
    ]
    bucket = ((attempts["time"] - c.t0) // c.bucket_s) * c.bucket_s
    table = pd.crosstab(bucket.to_numpy(), np.array(category)) / c.bucket_s
    order = sorted(table.columns, key=lambda k: (k != "200", k))
    fig, ax = _new_axes("Provider answers by status code (stacked)", "requests per second")
    bottom = np.zeros(len(table))
    for i, name in enumerate(order):
        color = STATUS_COLORS.get(name)
        if color is None:
            color = "#8172b3" if "accepted" in name else colormaps["Reds"](0.5 + 0.4 * (i % 2))
        ax.bar(
            table.index,
            table[name],
            width=c.bucket_s,
            bottom=bottom,
            align="edge",
            label=name,
            color=color,
            zorder=2,
        )
        bottom += table[name].to_numpy()
    ax.set_xlim(0, c.span)
    shade_faults(ax, c.windows, c.actions, c.t0, c.span)
    return _finish(fig, ax, path)


def chart_duplicates(c: ChartInput, dups: pd.DataFrame, path: Path) -> Path | None:
    if dups.empty:
        return None
    bucket = ((dups["time"] - c.t0) // c.bucket_s) * c.bucket_s
    table = pd.crosstab(bucket.to_numpy(), dups["path"].to_numpy())
    unit = "per second" if c.bucket_s == 1 else f"per {c.bucket_s}s"
    fig, ax = _new_axes("Duplicate deliveries (each delivery after a key's first)", unit)
    bottom = np.zeros(len(table))
    for name, color in (("visible", "#c44e52"), ("collapsed", "#ccb974")):
        if name in table.columns:
            ax.bar(
                table.index,
                table[name],
                width=c.bucket_s,
                bottom=bottom,
                align="edge",
                label=f"{name} ({int(table[name].sum())})",
                color=color,
                zorder=2,
            )
            bottom += table[name].to_numpy()
    ax.set_xlim(0, c.span)
    ax.yaxis.get_major_locator().set_params(integer=True)
    shade_faults(ax, c.windows, c.actions, c.t0, c.span)
    return _finish(fig, ax, path)


def chart_depth(c: ChartInput, samples: pd.DataFrame, path: Path) -> Path | None:
    if samples.empty:
        return None
    fig, ax = _new_axes("Queue and DLQ depth", "messages")
    for queue, group in samples.groupby("queue"):
        ax.step(group["time"] - c.t0, group["depth"], where="post", label=str(queue))
    ax.set_xlim(0, c.span)
    ax.set_ylim(bottom=0)
    shade_faults(ax, c.windows, c.actions, c.t0, c.span)
    return _finish(fig, ax, path)


def chart_quiet_zones(by_zone: pd.DataFrame, path: Path) -> Path | None:
    if by_zone.empty or by_zone[["deferred", "users held all run"]].to_numpy().sum() == 0:
        return None
    frame = by_zone.iloc[::-1]
    fig = _figure(0.45 * len(frame) + 1.6)
    ax = fig.subplots()
    left = np.zeros(len(frame))
    parts = (
        ("released on time", "#55a868"),
        ("released late", "#dd8452"),
        ("inside window", "#c44e52"),
        ("not delivered", "#8c8c8c"),
    )
    for name, color in parts:
        values = frame[name].to_numpy(dtype=float)
        ax.barh(frame["zone"], values, left=left, color=color, label=name)
        left += values
    for y, (total, held) in enumerate(zip(left, frame["users held all run"], strict=True)):
        if held:
            ax.text(total + 0.3, y, f"+{held} user(s) held all run", va="center", fontsize=8)
    ax.set_title(
        "Quiet-hours deferrals by recipient time zone (notification x device)",
        fontsize=11,
        loc="left",
    )
    ax.set_xlabel("deferred deliveries")
    ax.set_xlim(0, max(1.0, float(left.max())) * 1.3)
    ax.spines[["top", "right"]].set_visible(False)
    longest = max(len(str(z)) for z in frame["zone"])
    return _finish(fig, ax, path, left_in=0.25 + 0.075 * longest)
