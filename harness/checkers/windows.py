"""Fault windows and deliveries, read from a run history (shared by the chaos checkers)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pandas as pd


@dataclass(frozen=True)
class Window:
    fault: str
    start: float
    stop: float


def fault_windows(history: pd.DataFrame, names: tuple[str, ...] | None = None) -> list[Window]:
    """Windows of the named faults; one still open at the end of the history closes there."""
    rows = history[history["kind"] == "fault"]
    opened: dict[str, tuple[str, float]] = {}
    windows = []
    for row in rows.itertuples(index=False):
        detail = json.loads(row.detail)
        if names is not None and detail["fault"] not in names:
            continue
        if detail["phase"] == "start":
            opened[detail["window"]] = (detail["fault"], row.time)
        elif detail["window"] in opened:
            fault, start = opened.pop(detail["window"])
            windows.append(Window(fault, start, row.time))
    end = float(history["time"].max()) if len(history) else 0.0
    windows += [Window(fault, start, end) for fault, start in opened.values()]
    return sorted(windows, key=lambda w: w.start)


def deliveries(history: pd.DataFrame) -> pd.DataFrame:
    """Provider requests the device got: a 200, or 'accepted then error' when recorded."""
    provider = history[history["kind"] == "provider"]
    if "delivered" in provider.columns:
        delivered = provider["delivered"].fillna(provider["status"] == 200).astype(bool)
    else:
        delivered = provider["status"] == 200
    return provider[delivered]
