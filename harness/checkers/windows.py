"""Fault windows and deliveries, read from a run history (shared by the chaos checkers)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

# The dependency name a fault's window record gives the dedup store (``unavailable``; chaos's
# ``DEDUP_STORE``: the history is the protocol between them).
DEDUP_STORE = "dedup"
# What a window records when it stopped the preferences table's change stream on its way to the
# cache invalidator (chaos's ``PREFERENCES_STREAM``).
PREFERENCES_STREAM = "preferences_stream"
# Before faults recorded what they take away, the catalogue's faults that took the dedup store
# away were these: histories written then are read by name.
_DEDUP_OUTAGES_BY_NAME = ("dedup-outage", "dedup-blackhole", "dedup-crash")


@dataclass(frozen=True)
class Window:
    fault: str
    start: float
    stop: float


def fault_windows(
    history: pd.DataFrame, names: tuple[str, ...] | None = None, end: float | None = None
) -> list[Window]:
    """Windows of the named faults; one still open at the end of the history closes there
    (``end``: the history's last instant, when ``history`` holds only some of its rows)."""
    return _windows(history, lambda record: names is None or record["fault"] in names, end)


def process_windows(
    history: pd.DataFrame, part: str = "push-consumer", end: float | None = None
) -> list[Window]:
    """Windows of the faults that stopped the system's process in role ``part`` (killed,
    paused, restarted: their records name the ``stopped_part``)."""
    return _windows(history, lambda record: record.get("stopped_part") == part, end)


def unavailable_windows(
    history: pd.DataFrame, dependency: str = DEDUP_STORE, end: float | None = None
) -> list[Window]:
    """Windows of the faults that took ``dependency`` away (no answer from it: connections
    refused, black-holed until a client's own timeout, its process killed), by what each
    fault's window record says it took (``unavailable``), whatever the fault's name. A record
    without that field (a history written before faults said so) is read by the names the
    catalogue then had for the dedup store."""

    def took(record: dict[str, Any]) -> bool:
        if "unavailable" in record:
            return bool(record["unavailable"] == dependency)
        return dependency == DEDUP_STORE and record["fault"] in _DEDUP_OUTAGES_BY_NAME

    return _windows(history, took, end)


def _windows(
    history: pd.DataFrame, keep: Callable[[dict[str, Any]], bool], end: float | None
) -> list[Window]:
    rows = history[history["kind"] == "fault"]
    opened: dict[str, tuple[str, float]] = {}
    windows = []
    for row in rows.itertuples(index=False):
        detail = json.loads(row.detail)
        if detail["phase"] == "start":
            if keep(detail):
                opened[detail["window"]] = (detail["fault"], row.time)
        elif detail["window"] in opened:
            fault, start = opened.pop(detail["window"])
            windows.append(Window(fault, start, row.time))
    if end is None:
        end = float(history["time"].max()) if len(history) else 0.0
    windows += [Window(fault, start, end) for fault, start in opened.values()]
    return sorted(windows, key=lambda w: w.start)


def delivery_rows(history: pd.DataFrame) -> np.ndarray:
    """Positions (for ``iloc``) of the rows ``deliveries`` returns, in history order: checkers
    over millions of rows read the columns they need at these positions instead of copying
    every column of every delivery."""
    is_provider = (history["kind"] == "provider").to_numpy(dtype=bool, na_value=False)
    if "delivered" in history and _nullable_bool(history["delivered"]):
        flag = history["delivered"]
        status_200 = history["status"] == 200
        undecided = is_provider & flag.isna().to_numpy(dtype=bool)
        if not (undecided & status_200.isna().to_numpy(dtype=bool)).any():
            # The arrays' form of ``delivered.fillna(status == 200)``.
            delivered = np.where(
                undecided,
                status_200.to_numpy(dtype=bool, na_value=False),
                flag.to_numpy(dtype=bool, na_value=False),
            )
            return np.flatnonzero(is_provider & delivered)
    # Any other column types, or a row where neither says (which raises, as it always did).
    provider = history.loc[is_provider, [c for c in ("delivered", "status") if c in history]]
    if "delivered" in provider.columns:
        delivered = provider["delivered"].fillna(provider["status"] == 200).astype(bool)
    else:
        delivered = provider["status"] == 200
    return np.flatnonzero(is_provider)[delivered.to_numpy(dtype=bool, na_value=False)]


def _nullable_bool(values: pd.Series) -> bool:
    return isinstance(values.dtype, pd.BooleanDtype) or values.dtype == bool


def deliveries(history: pd.DataFrame) -> pd.DataFrame:
    """Provider requests the device got: a 200, or 'accepted then error' when recorded."""
    return history.iloc[delivery_rows(history)]


def injection_times(injected: pd.DataFrame) -> pd.Series:
    """When the harness sent each injected (tenant, notification), the earliest of its rows:
    no decision of the system about it can be earlier. ``injected``: rows with tenant_id,
    notification_id and time; the answer is indexed by (tenant_id, notification_id)."""
    return injected.groupby(["tenant_id", "notification_id"])["time"].min()


def handoff_times(history: pd.DataFrame, rows: np.ndarray) -> np.ndarray:
    """When the system handed each delivery (``rows``, positions from :func:`delivery_rows`)
    off: the latest Publish SNS accepted for the same tenant, notification and token at or
    before the provider got it, or the provider's own time when none (straight to APNs/FCM).

    A decision to send precedes its hand-off, so this is the tightest bound the harness sees on
    it. Through SNS the push still waits in SNS's own delivery before the provider sees it: on
    a loaded machine that wait alone put pushes published before a dedup outage seconds into
    it, which the provider's time would have judged as decided there."""
    times = history["time"].to_numpy(dtype=float, na_value=np.nan)[rows]
    accepted = (history["kind"] == "sns_publish") & history["reason"].isna()
    if not accepted.any():
        return times
    by = ["tenant_id", "notification_id", "token"]
    published = history.loc[accepted, [*by, "time"]].dropna(subset=by)
    published = published.rename(columns={"time": "published"}).sort_values("published")
    delivered = history[by].iloc[rows].assign(time=times, position=np.arange(len(rows)))
    delivered = delivered.dropna(subset=[*by, "time"]).sort_values("time")
    matched = pd.merge_asof(
        delivered, published, left_on="time", right_on="published", by=by, direction="backward"
    )
    handoff = times.copy()
    found = matched["published"].notna().to_numpy()
    handoff[matched["position"].to_numpy()[found]] = matched["published"].to_numpy()[found]
    return handoff
