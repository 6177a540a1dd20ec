"""Per-run metrics shared by the report, the run comparison and the duplicate report.

Each figure is computed in exactly one place here, so that ``report.md``, ``compare`` and
``duplicates`` can never disagree about what a run's throughput, latency or duplicate rate was.

Definitions (they are repeated in the rendered reports):

* a *delivery* is a provider row the device got (``windows.deliveries``); a *key* is
  ``(tenant_id, notification_id, token)``; *unique deliveries* are delivered keys;
* a *duplicate* is every delivery of a key after its first; ``collapsed`` duplicates follow the
  effectively-once checker's rule (every delivery of the key carried one and the same collapse
  id, so the device shows one notification), the rest are ``visible``;
* duplicates per million = duplicates / unique deliveries x 1e6 (the checker's figure);
* latency = first delivery of a key - the inject time of its ``(tenant_id, notification_id)``;
  deliveries the oracle deferred for quiet hours are left out when the population is known,
  because they wait for the recipient's window to end by design;
* throughput = deliveries (or provider requests) per second, averaged over the one-second
  buckets in which at least one happened, so idle waits do not dilute it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.checkers.evidence import expectation_from, timeline_from
from harness.checkers.windows import Window, deliveries, fault_windows
from harness.model.history import STREAM_FILE, read_partial
from harness.model.history import read as read_history
from harness.model.oracle import Expectation
from harness.model.population import Population
from harness.model.timeline import DEFAULT_BOUND_S

KEY = ["tenant_id", "notification_id", "token"]
NO_FAULT = "no fault"


class RunDirError(Exception):
    """A run directory that is missing or cannot be read."""


@dataclass
class Run:
    path: Path
    summary: dict[str, Any]
    history: pd.DataFrame
    population: Population | None
    # The run never finished: the history is what it streamed before it stopped.
    partial: bool = False

    @property
    def name(self) -> str:
        return str(self.summary.get("run_id") or self.path.name)

    @property
    def scenario(self) -> str:
        return str(self.summary.get("scenario") or "?")


def load_run(run_dir: Path) -> Run:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir} is not a directory")
    summary_path, history_path = run_dir / "summary.json", run_dir / "history.parquet"
    partial = not history_path.is_file() and (run_dir / STREAM_FILE).is_file()
    if partial:
        # A run that never finished (killed with -9): what it streamed, up to its last second.
        history_path = run_dir / STREAM_FILE
    for needed in (summary_path, history_path):
        if not needed.is_file():
            raise RunDirError(f"{run_dir} is not a run directory: {needed.name} is missing")
    try:
        summary = json.loads(summary_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise RunDirError(f"{summary_path}: unreadable summary ({exc})") from exc
    if not isinstance(summary, dict):
        raise RunDirError(f"{summary_path}: not a JSON object")
    try:
        history = read_partial(history_path) if partial else read_history(history_path)
    except Exception as exc:  # pyarrow raises several unrelated types for a bad file
        raise RunDirError(f"{history_path}: unreadable history ({exc})") from exc
    population = None
    population_path = run_dir / "population.json"
    if population_path.is_file():
        try:
            population = Population.load(population_path)
        except (OSError, ValueError, KeyError, TypeError):
            # The report still has value without the oracle; it says what it could not show.
            population = None
    return Run(run_dir, summary, history, population, partial)


def run_start(history: pd.DataFrame) -> float:
    return float(history["time"].min()) if len(history) else 0.0


def windows_of(history: pd.DataFrame) -> list[Window]:
    return fault_windows(history) if (history["kind"] == "fault").any() else []


def actions_of(history: pd.DataFrame) -> pd.DataFrame:
    """Scheduled operator actions (e.g. a DLQ redrive): instants, not windows."""
    rows = history[history["kind"] == "action"]
    return pd.DataFrame(
        {"time": rows["time"].astype(float), "name": rows["detail"].fillna("action").astype(str)}
    ).reset_index(drop=True)


def faults_at(times: pd.Series | np.ndarray, windows: list[Window]) -> list[str]:
    """For each instant, the names of the fault windows open at it ('+'-joined), or 'no fault'."""
    values = np.asarray(times, dtype=float)
    names: list[list[str]] = [[] for _ in range(len(values))]
    for window in windows:
        inside = (values >= window.start) & (values <= window.stop)
        for i in np.flatnonzero(inside):
            if window.fault not in names[i]:
                names[i].append(window.fault)
    return ["+".join(n) if n else NO_FAULT for n in names]


def provider_attempts(history: pd.DataFrame) -> pd.DataFrame:
    """Provider rows in time order, each with its attempt number for its key (1 = first
    request), whether the device got it, and its delivery number for the key (0 = not
    delivered, 1 = first delivery, 2+ = a duplicate)."""
    provider = history[history["kind"] == "provider"].sort_values(["time", "seq"], kind="stable")
    delivered_index = deliveries(provider).index
    provider = provider.assign(got=provider.index.isin(delivered_index))
    keys = provider[KEY].astype(object).fillna("")
    provider = provider.assign(attempt=keys.groupby(KEY, sort=False).cumcount() + 1)
    number = provider["got"].astype(int).groupby([keys[k] for k in KEY], sort=False).cumsum()
    return provider.assign(delivery_number=number.where(provider["got"], 0).astype(int))


def duplicate_rows(history: pd.DataFrame, windows: list[Window] | None = None) -> pd.DataFrame:
    """One row per duplicate delivery, traced to its cause.

    ``cause`` is the fault window(s) open at the duplicate delivery; when none was, the ones
    open at the delivery it repeats (a retry after 'accepted then 5xx' lands after its window
    closed, and blaming nothing would hide the fault); ``cause_basis`` says which.
    """
    windows = windows_of(history) if windows is None else windows
    attempts = provider_attempts(history)
    got = attempts[attempts["got"]]
    keys = got[KEY].astype(object).fillna("")
    by_key = got.groupby([keys[k] for k in KEY], sort=False)
    # Assign before filtering: assigning a Series to an empty frame adopts the Series' index.
    got = got.assign(
        previous_time=by_key["time"].shift(1), previous_status=by_key["status"].shift(1)
    )
    collapsed = _collapsed_keys(got)
    dups = got[got["delivery_number"] > 1]
    columns = [
        *KEY,
        "provider",
        "time",
        "attempt",
        "delivery_number",
        "status",
        "collapse_id",
        "previous_time",
        "previous_status",
        "path",
        "fault_at_delivery",
        "fault_at_previous",
        "cause",
        "cause_basis",
    ]
    if dups.empty:
        return pd.DataFrame(columns=columns)
    key_tuples = list(dups[KEY].astype(object).itertuples(index=False, name=None))
    at_delivery = faults_at(dups["time"], windows)
    at_previous = faults_at(dups["previous_time"], windows)
    cause, basis = [], []
    for now, before in zip(at_delivery, at_previous, strict=True):
        if now != NO_FAULT:
            cause.append(now)
            basis.append("at duplicate")
        elif before != NO_FAULT:
            cause.append(before)
            basis.append("at previous delivery")
        else:
            cause.append(NO_FAULT)
            basis.append("-")
    dups = dups.assign(
        path=["collapsed" if k in collapsed else "visible" for k in key_tuples],
        fault_at_delivery=at_delivery,
        fault_at_previous=at_previous,
        cause=cause,
        cause_basis=basis,
    )
    return dups[columns].reset_index(drop=True)


def _collapsed_keys(got: pd.DataFrame) -> set[tuple[Any, ...]]:
    # Same rule as the effectively-once checker, so the two never report different splits;
    # vectorised, and only over keys delivered more than once (a big run has millions).
    repeated = got[got["delivery_number"] > 1][KEY].drop_duplicates()
    if repeated.empty:
        return set()
    rows = got.merge(repeated, on=KEY, how="inner")
    ids = rows.groupby(KEY, dropna=False)["collapse_id"]
    stats = pd.DataFrame({"n": ids.size(), "named": ids.count(), "distinct": ids.nunique()})
    ok = stats[(stats["named"] == stats["n"]) & (stats["distinct"] == 1)]
    return {tuple(k) for k in ok.index}


def duplicate_figures(history: pd.DataFrame) -> dict[str, Any]:
    got = deliveries(history)
    unique = int(len(got[KEY].drop_duplicates()))
    dups = duplicate_rows(history, windows=[])
    duplicated = int(len(dups))
    collapsed = int((dups["path"] == "collapsed").sum()) if duplicated else 0
    per_key = got.groupby(KEY, dropna=False).size()
    return {
        "deliveries": int(len(got)),
        "unique_deliveries": unique,
        "exactly_once": int((per_key == 1).sum()),
        "duplicated": duplicated,
        "collapsed": collapsed,
        "visible_duplicates": duplicated - collapsed,
        "duplicates_per_million": per_million(duplicated, unique),
        "visible_per_million": per_million(duplicated - collapsed, unique),
    }


def exactly_once(history: pd.DataFrame, expectation: Expectation | None) -> dict[str, Any]:
    """The honest effectively-once figure: of the (notification, device) pairs that should
    have arrived, how many arrived exactly once (lost and duplicated ones both count against).
    Without the oracle the base is the delivered pairs, and lost ones cannot be seen."""
    per_key = deliveries(history).groupby(KEY, dropna=False).size()
    if expectation is None:
        base = int(len(per_key))
        once = int((per_key == 1).sum())
        return {
            "base": "delivered",
            "pairs": base,
            "exactly_once": once,
            "lost": None,
            "more_than_once": base - once,
            "percent": _percent(once, base),
        }
    expected = expectation.deliveries[KEY].drop_duplicates()
    counts = [per_key.get(k, 0) for k in expected.itertuples(index=False, name=None)]
    once = sum(1 for n in counts if n == 1)
    return {
        "base": "expected",
        "pairs": len(counts),
        "exactly_once": once,
        "lost": sum(1 for n in counts if n == 0),
        "more_than_once": sum(1 for n in counts if n > 1),
        "percent": _percent(once, len(counts)),
    }


def _percent(part: int, whole: int) -> float | None:
    return round(part / whole * 100, 3) if whole else None


def per_million(count: int, base: int) -> float:
    return round(count / base * 1_000_000, 1) if base else 0.0


def oracle(run: Run) -> Expectation | None:
    """The oracle's expectation, recomputed from the population and the injected rows."""
    if run.population is None:
        return None
    bound = float(run.summary.get("preference_bound_s") or DEFAULT_BOUND_S)
    try:
        timeline = timeline_from(run.population, run.history, None, bound)
        return expectation_from(run.population, run.history, timeline)
    except KeyError:
        # An injected author the saved population does not know: do not guess.
        return None


def deferred_keys(expectation: Expectation | None) -> set[tuple[str, str, str]]:
    if expectation is None:
        return set()
    deferred = expectation.deliveries.dropna(subset=["quiet_until"])
    return set(deferred[KEY].itertuples(index=False, name=None))


def latency_samples(
    history: pd.DataFrame, deferred: set[tuple[str, str, str]] | None = None
) -> pd.DataFrame:
    """Event-to-device latency of each key's first delivery: the key, ``time`` (delivery,
    epoch), ``latency`` (seconds) and ``deferred`` (the oracle deferred it for quiet hours)."""
    injected = history[history["kind"] == "inject"]
    inject_time = injected.groupby(["tenant_id", "notification_id"])["time"].min()
    inject_time = inject_time.rename("inject_time").reset_index()
    got = deliveries(history)
    first = got.groupby(KEY)["time"].min().reset_index()
    joined = first.merge(inject_time, on=["tenant_id", "notification_id"], how="inner")
    keys = list(joined[KEY].itertuples(index=False, name=None))
    joined = joined.assign(
        latency=joined["time"] - joined["inject_time"],
        deferred=[k in deferred for k in keys] if deferred else False,
    )
    return joined[[*KEY, "time", "latency", "deferred"]].sort_values("time").reset_index(drop=True)


def latency_quantiles(samples: pd.DataFrame) -> dict[str, float | int | None]:
    """Quantiles over the samples that were not deferred for quiet hours."""
    values = samples.loc[~samples["deferred"].astype(bool), "latency"].astype(float)
    excluded = int(samples["deferred"].astype(bool).sum())
    if values.empty:
        return {
            "count": 0,
            "p50": None,
            "p95": None,
            "p99": None,
            "max": None,
            "excluded_deferred": excluded,
        }
    return {
        "count": int(len(values)),
        "p50": round(float(values.quantile(0.50)), 4),
        "p95": round(float(values.quantile(0.95)), 4),
        "p99": round(float(values.quantile(0.99)), 4),
        "max": round(float(values.max()), 4),
        "excluded_deferred": excluded,
    }


def bucket_seconds(history: pd.DataFrame, target_buckets: int = 90) -> int:
    """Bucket width for time series: one second unless the run is long enough to crowd it."""
    if history.empty:
        return 1
    duration = float(history["time"].max() - history["time"].min())
    return max(1, math.ceil(duration / target_buckets))


def throughput_series(history: pd.DataFrame, bucket_s: int) -> pd.DataFrame:
    """Provider requests/s and deliveries/s per bucket, indexed by seconds since run start."""
    t0 = run_start(history)
    provider = history[history["kind"] == "provider"]
    got = deliveries(history)
    edges = _bucket_index(history, bucket_s)
    requests = _counts(provider["time"], t0, bucket_s).reindex(edges, fill_value=0)
    delivered = _counts(got["time"], t0, bucket_s).reindex(edges, fill_value=0)
    return pd.DataFrame(
        {"provider_requests_per_s": requests / bucket_s, "deliveries_per_s": delivered / bucket_s},
        index=edges,
    )


def _bucket_index(history: pd.DataFrame, bucket_s: int) -> pd.Index:
    t0 = run_start(history)
    span = float(history["time"].max() - t0) if len(history) else 0.0
    return pd.Index(np.arange(0, span + bucket_s, bucket_s, dtype=float), name="t")


def _counts(times: pd.Series, t0: float, bucket_s: int) -> pd.Series:
    offsets = ((times.astype(float) - t0) // bucket_s) * bucket_s
    return offsets.value_counts().sort_index()


def throughput(history: pd.DataFrame) -> dict[str, float | int]:
    provider = history[history["kind"] == "provider"]
    got = deliveries(history)
    req_buckets = provider["time"].astype(float).astype("int64").value_counts()
    del_buckets = got["time"].astype(float).astype("int64").value_counts()
    injected = history[history["kind"] == "inject"]
    start = float(injected["time"].min()) if len(injected) else run_start(history)
    end = float(got["time"].max()) if len(got) else start
    return {
        "provider_requests": int(len(provider)),
        "deliveries": int(len(got)),
        "provider_requests_per_s": _mean_rate(req_buckets),
        "deliveries_per_s": _mean_rate(del_buckets),
        "peak_deliveries_per_s": int(del_buckets.max()) if len(del_buckets) else 0,
        "active_seconds": int(len(del_buckets)),
        "inject_to_last_delivery_s": round(max(0.0, end - start), 3),
    }


def _mean_rate(buckets: pd.Series) -> float:
    return round(float(buckets.sum()) / len(buckets), 2) if len(buckets) else 0.0


def checker_counts(result: dict[str, Any]) -> dict[str, int]:
    """A checker's counts from summary.json: its integer fields (details are not counts)."""
    return {
        k: int(v)
        for k, v in result.items()
        if k != "valid" and isinstance(v, int) and not isinstance(v, bool)
    }


def run_metrics(run: Run) -> dict[str, Any]:
    """Everything the comparison and the report headline need, as plain JSON values."""
    expectation = oracle(run)
    samples = latency_samples(run.history, deferred_keys(expectation))
    return {
        "run_id": run.name,
        "scenario": run.scenario,
        "verdict": run.summary.get("verdict"),
        "throughput": throughput(run.history),
        "latency": {**latency_quantiles(samples), "oracle": expectation is not None},
        "duplicates": duplicate_figures(run.history),
        "exactly_once": exactly_once(run.history, expectation),
        "fault_windows": [
            {"fault": w.fault, "start": round(w.start, 3), "stop": round(w.stop, 3)}
            for w in windows_of(run.history)
        ],
    }


# --- one Markdown table writer for every report (no tabulate dependency) ---


def cell_text(value: Any) -> str:
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value)


def markdown_table(frame: pd.DataFrame) -> str:
    if frame.empty:
        return "_(none)_"
    escape = str.maketrans({"|": "\\|", "\n": " "})
    header = "| " + " | ".join(str(c).translate(escape) for c in frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = [
        "| " + " | ".join(cell_text(v).translate(escape) for v in row) + " |"
        for row in frame.itertuples(index=False, name=None)
    ]
    return "\n".join([header, rule, *body])
