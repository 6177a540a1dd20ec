"""A run's reports: ``report.md``, a self-contained ``report.html``, charts and ``junit.xml``.

Everything here is read back from the run directory (summary.json, history.parquet and, when
present, population.json), so a report can be regenerated for any old run. The figures come
from ``harness.analysis.metrics`` (shared with ``compare`` and ``duplicates``); this module only lays
them out, and finds the evidence behind each failed checker.
"""

from __future__ import annotations

import argparse
import base64
import html
import json
import math
import re
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from datetime import UTC, datetime
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
from harness.analysis.duplicates import fault_buckets
from harness.analysis.metrics import KEY, Run
from harness.checkers import registry
from harness.checkers.fail_closed import OUTAGES
from harness.checkers.windows import Window, deliveries
from harness.model.oracle import Expectation

MAX_EVIDENCE_ROWS = 10
TOKEN_CHARS = 16
CHART_DIR = "charts"


# --- the document model: both renderers read the same blocks --------------------------------


@dataclass
class Block:
    kind: str  # lead | h2 | h3 | p | note | table | image
    text: str = ""
    table: pd.DataFrame | None = None
    image: Path | None = None


@dataclass
class Document:
    run: Run
    verdict: str  # PASS | FAIL | ERROR
    blocks: list[Block] = field(default_factory=list)

    def h2(self, text: str) -> None:
        self.blocks.append(Block("h2", text))

    def h3(self, text: str) -> None:
        self.blocks.append(Block("h3", text))

    def p(self, text: str) -> None:
        self.blocks.append(Block("p", text))

    def note(self, text: str) -> None:
        self.blocks.append(Block("note", text))

    def table(self, frame: pd.DataFrame) -> None:
        self.blocks.append(Block("table", table=frame))

    def image(self, path: Path, caption: str) -> None:
        self.blocks.append(Block("image", caption, image=path))


# --- small pure helpers ----------------------------------------------------------------------


def verdict_word(summary: dict[str, Any]) -> str:
    if summary.get("verdict") == "incomplete":
        return "INCOMPLETE"
    if summary.get("error"):
        return "ERROR"
    return {"pass": "PASS", "unknown": "UNKNOWN"}.get(str(summary.get("verdict")), "FAIL")


def verdict_sentence(summary: dict[str, Any]) -> str:
    checkers = summary.get("checkers") or {}
    failed = [name for name, result in checkers.items() if not result.get("valid")]
    if summary.get("verdict") == "incomplete":
        return (
            f"The run did not finish: {summary.get('error') or 'it was stopped'}. There is "
            "no verdict; this report shows only what it recorded before it stopped. Do not "
            "release on this run."
        )
    if summary.get("error"):
        ran = f" ({len(checkers)} checker(s) ran, {len(failed)} failed)" if checkers else ""
        return f"The run itself failed: {summary['error']}{ran}. Do not release on this run."
    if not checkers:
        return "No checker ran: this run proves nothing."
    if not failed:
        return f"All {len(checkers)} checkers passed."
    return f"{len(failed)} of {len(checkers)} checkers failed: {', '.join(failed)}."


def short_token(token: Any) -> str:
    if token is None or token is pd.NA or (isinstance(token, float) and math.isnan(token)):
        return ""
    text = str(token)
    return text if len(text) <= TOKEN_CHARS else text[:TOKEN_CHARS] + "…"


def since(t: Any, t0: float) -> str:
    if t is None or t is pd.NA or (isinstance(t, float) and math.isnan(t)):
        return ""
    return f"+{float(t) - t0:.2f}s"


def counts_text(result: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in metrics.checker_counts(result).items())


def verdict_rows(summary: dict[str, Any]) -> pd.DataFrame:
    rows = [
        {
            "checker": name,
            "result": "PASS" if result.get("valid") else "FAIL",
            "counts": counts_text(result),
        }
        for name, result in summary.get("checkers", {}).items()
    ]
    if summary.get("error"):
        rows.append({"checker": "(run)", "result": "ERROR", "counts": str(summary["error"])})
    return pd.DataFrame(rows, columns=["checker", "result", "counts"])


def window_rows(windows: list[Window], t0: float) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "fault": w.fault,
                "start": since(w.start, t0),
                "stop": since(w.stop, t0),
                "seconds": round(w.stop - w.start, 2),
            }
            for w in windows
        ],
        columns=["fault", "start", "stop", "seconds"],
    )


def attempts_of(
    keys: pd.DataFrame,
    attempts: pd.DataFrame,
    windows: list[Window],
    t0: float,
    extra: tuple[str, ...] = (),
) -> pd.DataFrame:
    """Every provider attempt for the given keys, in time order, with the fault window open at
    it: the context a person needs to see why a key ended the way it did. ``extra`` names
    columns of ``keys`` carried onto each of the key's rows."""
    if keys.empty:
        return pd.DataFrame()
    wanted = keys[[*KEY, *extra]].drop_duplicates(subset=KEY)
    rows = attempts.merge(wanted, on=KEY, how="inner").sort_values(["time", "seq"])
    table = pd.DataFrame(
        {
            "tenant": rows["tenant_id"].astype(str),
            "notification": rows["notification_id"].astype(str),
            "token": [short_token(t) for t in rows["token"]],
            "attempt": rows["attempt"].astype(int),
            "at": [since(t, t0) for t in rows["time"]],
            "status": rows["status"].astype("string").fillna(""),
            "device got it": np.where(rows["got"], "yes", "no"),
            "delivery #": [int(n) if n else "" for n in rows["delivery_number"]],
            "fault window": metrics.faults_at(rows["time"], windows),
        }
    )
    for column in extra:
        table[column] = rows[column].to_numpy()
    return table.reset_index(drop=True)


# --- evidence for failed checkers ------------------------------------------------------------


@dataclass
class Context:
    run: Run
    t0: float
    windows: list[Window]
    attempts: pd.DataFrame
    expectation: Expectation | None


def duplicate_evidence(ctx: Context) -> list[tuple[str, pd.DataFrame]]:
    dups = metrics.duplicate_rows(ctx.run.history, ctx.windows)
    if dups.empty:
        return []
    groups = dups.drop_duplicates(subset=KEY)
    shown = groups.head(MAX_EVIDENCE_ROWS)
    title = (
        f"Duplicated (tenant, notification, token) groups: first {len(shown)} of {len(groups)}, "
        f"every attempt shown; cause = fault window open at the duplicate (else at the delivery "
        f"it repeats)"
    )
    table = attempts_of(shown, ctx.attempts, ctx.windows, ctx.t0, extra=("path", "cause"))
    table = table.rename(columns={"path": "group path", "cause": "group cause"})
    return [(title, table)]


def missing_keys(ctx: Context) -> pd.DataFrame:
    """Expected (oracle) keys with no delivery, with whether the job sits in a DLQ."""
    if ctx.expectation is None:
        return pd.DataFrame(columns=[*KEY, "user_id", "in_dlq"])
    delivered = deliveries(ctx.run.history)[KEY].drop_duplicates()
    expected = ctx.expectation.deliveries
    merged = expected.merge(delivered, on=KEY, how="left", indicator=True)
    lost = merged[merged["_merge"] == "left_only"].drop(columns="_merge")
    parked = dlq_parked(ctx.run.history)
    in_dlq = [
        (t, n, u) in parked
        for t, n, u in lost[["tenant_id", "notification_id", "user_id"]].itertuples(
            index=False, name=None
        )
    ]
    return lost.assign(in_dlq=in_dlq)[[*KEY, "user_id", "in_dlq"]].reset_index(drop=True)


def dlq_parked(history: pd.DataFrame) -> set[tuple[Any, Any, Any]]:
    parked = set()
    for row in history[history["kind"] == "dlq"].itertuples(index=False):
        detail = _json_object(row.detail)
        parked.add((row.tenant_id, row.notification_id, detail.get("recipient_user_id")))
    return parked


def lost_evidence(ctx: Context, only_vanished: bool = False) -> list[tuple[str, pd.DataFrame]]:
    lost = missing_keys(ctx)
    if only_vanished:
        lost = lost[~lost["in_dlq"]]
    if lost.empty:
        return []
    shown = lost.head(MAX_EVIDENCE_ROWS)
    per_key = []
    for row in shown.itertuples(index=False):
        tried = ctx.attempts[
            (ctx.attempts["tenant_id"] == row.tenant_id)
            & (ctx.attempts["notification_id"] == row.notification_id)
            & (ctx.attempts["token"] == row.token)
        ]
        last = tried.iloc[-1] if len(tried) else None
        per_key.append(
            {
                "tenant": row.tenant_id,
                "notification": row.notification_id,
                "token": short_token(row.token),
                "user": row.user_id,
                "attempts": int(len(tried)),
                "last status": "" if last is None else str(last["status"]),
                "last attempt": "" if last is None else since(last["time"], ctx.t0),
                "fault window at last attempt": (
                    "" if last is None else metrics.faults_at([last["time"]], ctx.windows)[0]
                ),
                "in DLQ": "yes" if row.in_dlq else "no",
            }
        )
    label = "vanished (not delivered, not in a DLQ)" if only_vanished else "lost"
    return [(f"{label.capitalize()}: first {len(shown)} of {len(lost)}", pd.DataFrame(per_key))]


def unexpected_evidence(ctx: Context) -> list[tuple[str, pd.DataFrame]]:
    if ctx.expectation is None:
        return []
    got = deliveries(ctx.run.history)
    merged = got.merge(
        ctx.expectation.deliveries[KEY].drop_duplicates(), on=KEY, how="left", indicator=True
    )
    extra = merged[merged["_merge"] == "left_only"]
    if extra.empty:
        return []
    return [
        (
            f"Delivered but not expected by the oracle: first "
            f"{min(len(extra), MAX_EVIDENCE_ROWS)} of {len(extra)}",
            attempts_of(extra.head(MAX_EVIDENCE_ROWS), ctx.attempts, ctx.windows, ctx.t0),
        )
    ]


def effectively_once_evidence(
    ctx: Context, result: dict[str, Any]
) -> list[tuple[str, pd.DataFrame]]:
    """Duplicates, lost and unexpected deliveries; what broke the tolerance comes first, the
    rest is marked as context so nobody chases a figure that did not fail the check."""
    # The checker's own defaults (one place: the registry), under what the run recorded.
    tolerance = {**registry.get("effectively_once").tolerances, **(result.get("tolerance") or {})}
    max_duplicated = tolerance["max_duplicated"]
    dup_broken = (
        int(result.get("visible_duplicates", 0)) > int(tolerance["max_visible_duplicates"])
        or int(result.get("unattributed_duplicates", 0)) > int(tolerance["max_unattributed"])
        or (max_duplicated is not None and int(result.get("duplicated", 0)) > int(max_duplicated))
    )
    parts = [
        (dup_broken, duplicate_evidence(ctx)),
        (int(result.get("lost", 0)) > int(tolerance["max_lost"]), lost_evidence(ctx)),
        (int(result.get("unexpected", 0)) > 0, unexpected_evidence(ctx)),
    ]
    found = [item for broken, items in parts if broken for item in items]
    found += [
        (f"{title} (within tolerance, shown for context)", table)
        for broken, items in parts
        if not broken
        for title, table in items
    ]
    return found


def quiet_hours_evidence(ctx: Context, bound_s: float) -> list[tuple[str, pd.DataFrame]]:
    run = ctx.run
    if ctx.expectation is None or run.population is None:
        return []
    zones = {(u.tenant_id, u.user_id): u.zone for u in run.population.users}
    got = ctx.attempts[ctx.attempts["delivery_number"] == 1]
    deferred = ctx.expectation.deliveries.dropna(subset=["quiet_until"])
    timed = deferred.merge(got[[*KEY, "time", "attempt"]], on=KEY, how="inner")
    bad = timed[
        (timed["time"] < timed["quiet_until"]) | (timed["time"] > timed["quiet_until"] + bound_s)
    ].sort_values("time")
    whole_run = {
        (d.tenant_id, d.token): u
        for u in run.population.users
        if u.quiet_state == "whole_run"
        for d in run.population.devices_of(u.tenant_id, u.user_id)
    }
    inside = [row for row in got.itertuples(index=False) if (row.tenant_id, row.token) in whole_run]
    rows = [
        {
            "tenant": r.tenant_id,
            "notification": r.notification_id,
            "token": short_token(r.token),
            "zone": zones.get((r.tenant_id, r.user_id), "?"),
            "window ends": since(r.quiet_until, ctx.t0),
            "first delivery": since(r.time, ctx.t0),
            "delay after window (s)": round(float(r.time - r.quiet_until), 2),
            "problem": "inside window" if r.time < r.quiet_until else f"late (> {bound_s:g}s)",
            "attempt": int(r.attempt),
            "fault window": metrics.faults_at([r.time], ctx.windows)[0],
        }
        for r in bad.head(MAX_EVIDENCE_ROWS).itertuples(index=False)
    ]
    rows += [
        {
            "tenant": r.tenant_id,
            "notification": r.notification_id,
            "token": short_token(r.token),
            "zone": whole_run[(r.tenant_id, r.token)].zone,
            "window ends": "after the run",
            "first delivery": since(r.time, ctx.t0),
            "delay after window (s)": "",
            "problem": "inside window (whole run)",
            "attempt": int(r.attempt),
            "fault window": metrics.faults_at([r.time], ctx.windows)[0],
        }
        for r in inside[:MAX_EVIDENCE_ROWS]
    ]
    if not rows:
        return []
    total = len(bad) + len(inside)
    return [(f"Quiet-hours violations: first {len(rows)} of {total}", pd.DataFrame(rows))]


def fail_closed_evidence(ctx: Context, grace_s: float) -> list[tuple[str, pd.DataFrame]]:
    outages = [w for w in ctx.windows if w.fault in OUTAGES]
    got = ctx.attempts[ctx.attempts["got"]]
    inside = pd.Series(False, index=got.index)
    for w in outages:
        inside |= (got["time"] > w.start + grace_s) & (got["time"] < w.stop)
    during = got[inside]
    if during.empty:
        return []
    table = attempts_of(during.head(MAX_EVIDENCE_ROWS), ctx.attempts, ctx.windows, ctx.t0)
    return [(f"Deliveries during a dedup outage: {len(during)} (their keys' attempts)", table)]


def dead_token_evidence(ctx: Context, grace_s: float) -> list[tuple[str, pd.DataFrame]]:
    provider = ctx.attempts
    dead = provider[
        ((provider["provider"] == "apns") & (provider["status"] == 410)).fillna(False)
        | ((provider["provider"] == "fcm") & (provider["reason"] == "UNREGISTERED")).fillna(False)
    ]
    if dead.empty:
        return []
    first = dead.groupby(["tenant_id", "token"])["time"].min().rename("dead_at").reset_index()
    later = provider.merge(first, on=["tenant_id", "token"])
    after = later[later["time"] > later["dead_at"] + grace_s].sort_values("time")
    if after.empty:
        return []
    rows = [
        {
            "tenant": r.tenant_id,
            "notification": r.notification_id,
            "token": short_token(r.token),
            "token died": since(r.dead_at, ctx.t0),
            "sent again": since(r.time, ctx.t0),
            "attempt": int(r.attempt),
            "status": str(r.status),
            "fault window": metrics.faults_at([r.time], ctx.windows)[0],
        }
        for r in after.head(MAX_EVIDENCE_ROWS).itertuples(index=False)
    ]
    return [(f"Sends after the token died: first {len(rows)} of {len(after)}", pd.DataFrame(rows))]


def backpressure_evidence(ctx: Context, slack_s: float) -> list[tuple[str, pd.DataFrame]]:
    provider = ctx.attempts
    scope = provider["provider"].astype(str) + "/" + provider["project"].fillna("").astype(str)
    provider = provider.assign(scope=scope)
    throttles = provider[(provider["retry_after"].fillna(0) > 0)]
    rows = []
    for t in throttles.itertuples(index=False):
        same = provider[
            (provider["scope"] == t.scope)
            & (provider["time"] > t.time + slack_s)
            & (provider["time"] < t.time + float(t.retry_after))
        ]
        for r in same.itertuples(index=False):
            rows.append(
                {
                    "scope": t.scope,
                    "throttled at": since(t.time, ctx.t0),
                    "retry after (s)": float(t.retry_after),
                    "sent at": since(r.time, ctx.t0),
                    "notification": r.notification_id,
                    "token": short_token(r.token),
                    "attempt": int(r.attempt),
                    "fault window": metrics.faults_at([r.time], ctx.windows)[0],
                }
            )
    if not rows:
        return []
    return [
        (
            f"Requests inside a Retry-After: first {min(len(rows), MAX_EVIDENCE_ROWS)} "
            f"of {len(rows)}",
            pd.DataFrame(rows[:MAX_EVIDENCE_ROWS]),
        )
    ]


def consent_evidence(ctx: Context) -> list[tuple[str, pd.DataFrame]]:
    population = ctx.run.population
    if population is None:
        return []
    without = {
        (d.tenant_id, d.token)
        for u in population.users
        if u.consent is None
        for d in population.devices_of(u.tenant_id, u.user_id)
    }
    got = ctx.attempts[ctx.attempts["got"]]
    bad = got[[(t, k) in without for t, k in zip(got["tenant_id"], got["token"], strict=True)]]
    if bad.empty:
        return []
    table = attempts_of(bad.head(MAX_EVIDENCE_ROWS), ctx.attempts, ctx.windows, ctx.t0)
    return [(f"Deliveries to users without consent: {len(bad)}", table)]


def tenant_isolation_evidence(ctx: Context) -> list[tuple[str, pd.DataFrame]]:
    population = ctx.run.population
    if population is None:
        return []
    devices = {(d.tenant_id, d.token) for d in population.devices}
    got = ctx.attempts[ctx.attempts["got"]]
    foreign = got[
        [(t, k) not in devices for t, k in zip(got["tenant_id"], got["token"], strict=True)]
    ]
    if foreign.empty:
        return []
    table = attempts_of(foreign.head(MAX_EVIDENCE_ROWS), ctx.attempts, ctx.windows, ctx.t0)
    return [(f"Deliveries to another tenant's device: {len(foreign)}", table)]


def summary_examples(result: dict[str, Any]) -> list[tuple[str, pd.DataFrame]]:
    """What the checker itself recorded, for checkers the history alone cannot re-derive."""
    found = []
    for name, value in result.items():
        if name.endswith("examples") and isinstance(value, list) and value:
            found.append((f"{name} (from summary.json)", pd.DataFrame(value)))
    return found


def checker_evidence(name: str, result: dict[str, Any], ctx: Context) -> list[tuple[str, Any]]:
    if name == "effectively_once":
        found = effectively_once_evidence(ctx, result)
    elif name == "quiet_hours":
        found = quiet_hours_evidence(ctx, float(result.get("release_bound_seconds", 30.0)))
    elif name == "fail_closed":
        found = fail_closed_evidence(ctx, float(result.get("grace_s", 0.5)))
    elif name == "dead_tokens":
        found = dead_token_evidence(ctx, float(result.get("grace_s", 1.0)))
    elif name == "backpressure":
        found = backpressure_evidence(ctx, float(result.get("slack_s", 0.3)))
    elif name == "consent":
        found = consent_evidence(ctx)
    elif name == "dlq_accountability":
        found = lost_evidence(ctx, only_vanished=True)
    elif name == "tenant_isolation":
        found = tenant_isolation_evidence(ctx)
    else:
        found = []
    # The recomputation needs the population; without it, fall back to the checker's own record.
    return found or summary_examples(result)


# --- quiet hours by recipient time zone ------------------------------------------------------


def quiet_hours_by_zone(run: Run, expectation: Expectation | None, bound_s: float) -> pd.DataFrame:
    """Per IANA zone: notifications the oracle expects deferred (the recipient's window ended
    during the run) and how they arrived, plus users whose window covers the whole run."""
    columns = [
        "zone",
        "deferred",
        "released on time",
        "released late",
        "inside window",
        "not delivered",
        "median delay (s)",
        "users held all run",
    ]
    if run.population is None or expectation is None:
        return pd.DataFrame(columns=columns)
    zones = {(u.tenant_id, u.user_id): u.zone for u in run.population.users}
    deferred = expectation.deliveries.dropna(subset=["quiet_until"])
    first = deliveries(run.history).groupby(KEY)["time"].min().rename("first").reset_index()
    timed = deferred.merge(first, on=KEY, how="left")
    timed = timed.assign(
        zone=[zones.get(k, "?") for k in zip(timed["tenant_id"], timed["user_id"], strict=True)],
        delay=timed["first"] - timed["quiet_until"],
    )
    held = pd.Series(
        [u.zone for u in run.population.users if u.quiet_state == "whole_run"], dtype=object
    ).value_counts()
    rows = []
    for zone in sorted(set(timed["zone"]) | set(held.index)):
        group = timed[timed["zone"] == zone]
        delay = group["delay"]
        rows.append(
            {
                "zone": zone,
                "deferred": int(len(group)),
                "released on time": int(((delay >= 0) & (delay <= bound_s)).sum()),
                "released late": int((delay > bound_s).sum()),
                "inside window": int((delay < 0).sum()),
                "not delivered": int(delay.isna().sum()),
                "median delay (s)": round(float(delay.median()), 2) if delay.notna().any() else "",
                "users held all run": int(held.get(zone, 0)),
            }
        )
    return pd.DataFrame(rows, columns=columns)


# --- queue and DLQ depth -----------------------------------------------------------------------


def depth_samples(history: pd.DataFrame) -> pd.DataFrame:
    """Rows whose detail is JSON with a numeric ``depth`` (and a ``queue``): depth samples.
    The runner records none yet; a recorder that writes them gets a chart for free."""
    rows = []
    for row in history[history["detail"].fillna("").str.contains('"depth"')].itertuples():
        try:
            detail = json.loads(row.detail)
        except json.JSONDecodeError:
            continue
        if isinstance(detail, dict) and isinstance(detail.get("depth"), int | float):
            rows.append(
                {
                    "time": row.time,
                    "queue": str(detail.get("queue", row.kind)),
                    "depth": detail["depth"],
                }
            )
    return pd.DataFrame(rows, columns=["time", "queue", "depth"])


def _json_object(text: Any) -> dict[str, Any]:
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except json.JSONDecodeError:
        value = None
    return value if isinstance(value, dict) else {}


REDRIVE = re.compile(r"moved (\d+) message")


def dlq_events(history: pd.DataFrame, t0: float) -> pd.DataFrame:
    """What the history does say about dead-letter queues: redrives (how many messages each
    moved back) and the DLQ contents recorded at the end of the run, by queue."""
    rows = []
    for row in history[history["kind"] == "action"].itertuples(index=False):
        match = REDRIVE.search(str(row.detail))
        if match:
            rows.append(
                {
                    "at": since(row.time, t0),
                    "event": str(row.detail).split(":")[0],
                    "messages": int(match.group(1)),
                    "note": "moved from DLQs back to their source queues",
                }
            )
    parked = history[history["kind"] == "dlq"]
    details = [_json_object(d) for d in parked["detail"]]
    # A 'dlq' row with a depth is a depth sample, not a parked message.
    keep = ["depth" not in d for d in details]
    parked = parked[keep]
    if len(parked):
        queues = [d.get("queue", "?") for d, k in zip(details, keep, strict=True) if k]
        for queue, n in pd.Series(queues).value_counts().items():
            rows.append(
                {
                    "at": since(parked["time"].max(), t0),
                    "event": f"left in {queue}",
                    "messages": int(n),
                    "note": "recorded at the end of the run",
                }
            )
    return pd.DataFrame(rows, columns=["at", "event", "messages", "note"])


# --- charts ----------------------------------------------------------------------------------

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


# --- assembling the document -----------------------------------------------------------------


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
    failed = {n: r for n, r in summary.get("checkers", {}).items() if not r.get("valid")}
    if not summary.get("checkers"):
        doc.p("No checker ran, so there is no verdict on any invariant.")
    elif not failed:
        doc.p("Every checker passed: there is no violation to show.")
    for name, result in failed.items():
        doc.h3(f"{name}: FAIL ({counts_text(result)})")
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


# --- renderers -------------------------------------------------------------------------------


def header_lines(run: Run) -> list[tuple[str, str]]:
    summary = run.summary
    t0 = metrics.run_start(run.history)
    started = datetime.fromtimestamp(t0, UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if t0 else "?"
    return [
        ("run", str(summary.get("run_id", run.path.name))),
        ("scenario", str(summary.get("scenario", "?"))),
        ("seed", str(summary.get("seed", "?"))),
        ("started", started),
        (
            "history rows",
            str(len(run.history) if run.partial else summary.get("history_rows", len(run.history))),
        ),
    ]


def render_markdown(doc: Document, out_dir: Path) -> str:
    lines = [f"# {doc.verdict}", ""]
    lines += [f"- **{k}**: {v}" for k, v in header_lines(doc.run)]
    for block in doc.blocks:
        lines.append("")
        if block.kind == "lead":
            lines.append(f"**{block.text}**")
        elif block.kind == "h2":
            lines.append(f"## {block.text}")
        elif block.kind == "h3":
            lines.append(f"### {block.text}")
        elif block.kind == "p":
            lines.append(block.text)
        elif block.kind == "note":
            lines.append(f"> {block.text}")
        elif block.kind == "table" and block.table is not None:
            lines.append(metrics.markdown_table(block.table))
        elif block.kind == "image" and block.image is not None:
            lines.append(f"![{block.text}]({block.image.relative_to(out_dir).as_posix()})")
    return "\n".join(lines) + "\n"


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;
max-width:1100px;color:#222;padding:0 1em}
.verdict{font-size:4em;font-weight:800;letter-spacing:.05em;padding:.2em .4em;border-radius:8px;
display:inline-block;color:#fff;margin:0}
.PASS{background:#2e7d32}.FAIL{background:#c62828}.ERROR{background:#ef6c00}
.INCOMPLETE,.UNKNOWN{background:#616161}
dl.meta{display:grid;grid-template-columns:max-content auto;gap:.2em 1em;color:#444}
dl.meta dt{font-weight:600}dl.meta dd{margin:0;font-family:ui-monospace,monospace}
table{border-collapse:collapse;margin:.6em 0 1.2em;font-size:.9em}
th,td{border:1px solid #ddd;padding:.3em .6em;text-align:left;vertical-align:top}
th{background:#f4f4f4}td{font-family:ui-monospace,Menlo,monospace}
td.res-PASS{color:#2e7d32;font-weight:700}td.res-FAIL{color:#c62828;font-weight:700}
td.res-ERROR{color:#ef6c00;font-weight:700}
.note{color:#555;border-left:3px solid #ccc;padding:.2em .8em;margin:.6em 0}
figure{margin:1em 0}figure img{max-width:100%;border:1px solid #eee}
figcaption{color:#555;font-size:.9em}
.lead{font-size:1.4em;font-weight:600;margin:.6em 0 1em}
"""


def html_table(frame: pd.DataFrame) -> str:
    if frame.empty:
        return "<p class='note'>(none)</p>"
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    body = []
    for row in frame.itertuples(index=False, name=None):
        cells = []
        for column, value in zip(frame.columns, row, strict=True):
            text = metrics.cell_text(value)
            css = f" class='res-{text}'" if column == "result" else ""
            cells.append(f"<td{css}>{html.escape(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def render_html(doc: Document) -> str:
    title = f"{doc.verdict}: {doc.run.summary.get('run_id', doc.run.path.name)}"
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>",
        f"<p class='verdict {doc.verdict}'>{doc.verdict}</p>",
        "<dl class='meta'>",
        *(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in header_lines(doc.run)),
        "</dl>",
    ]
    for block in doc.blocks:
        if block.kind == "lead":
            parts.append(f"<p class='lead'>{html.escape(block.text)}</p>")
        elif block.kind == "h2":
            parts.append(f"<h2>{html.escape(block.text)}</h2>")
        elif block.kind == "h3":
            parts.append(f"<h3>{html.escape(block.text)}</h3>")
        elif block.kind == "p":
            parts.append(f"<p>{html.escape(block.text)}</p>")
        elif block.kind == "note":
            parts.append(f"<p class='note'>{html.escape(block.text)}</p>")
        elif block.kind == "table" and block.table is not None:
            parts.append(html_table(block.table))
        elif block.kind == "image" and block.image is not None:
            data = base64.b64encode(block.image.read_bytes()).decode("ascii")
            parts.append(
                f"<figure><img alt='{html.escape(block.text)}' "
                f"src='data:image/png;base64,{data}'>"
                f"<figcaption>{html.escape(block.text)}</figcaption></figure>"
            )
    parts.append("</body></html>")
    return "\n".join(parts)


# --- JUnit -----------------------------------------------------------------------------------


def junit_xml(summary: dict[str, Any], duration_s: float = 0.0) -> str:
    """One testsuite, one testcase per checker; the run's own error is an error testcase."""
    scenario = str(summary.get("scenario", "run"))
    checkers = summary.get("checkers", {}) or {}
    failures = sum(1 for r in checkers.values() if not r.get("valid"))
    error = summary.get("error")
    errors = 1 if error or not checkers else 0
    suites = ET.Element("testsuites")
    suite = ET.SubElement(
        suites,
        "testsuite",
        {
            "name": f"fanout-harness.{scenario}",
            "tests": str(len(checkers) + errors),
            "failures": str(failures),
            "errors": str(errors),
            "skipped": "0",
            "time": f"{duration_s:.3f}",
        },
    )
    props = ET.SubElement(suite, "properties")
    for key in ("run_id", "scenario", "seed", "verdict"):
        ET.SubElement(props, "property", {"name": key, "value": str(summary.get(key, ""))})
    for name, result in checkers.items():
        case = ET.SubElement(
            suite, "testcase", {"classname": f"harness.{scenario}", "name": name, "time": "0"}
        )
        if not result.get("valid"):
            failure = ET.SubElement(
                case,
                "failure",
                {"message": f"{name} violated: {counts_text(result)}", "type": "InvariantViolated"},
            )
            failure.text = "\n".join(
                f"{k} = {v}" for k, v in metrics.checker_counts(result).items()
            )
    if errors:
        case = ET.SubElement(
            suite, "testcase", {"classname": f"harness.{scenario}", "name": "run", "time": "0"}
        )
        message = str(error) if error else "no checker ran"
        ET.SubElement(case, "error", {"message": message, "type": "RunError"}).text = message
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


# --- entry point -----------------------------------------------------------------------------


def write_reports(run_dir: Path) -> dict[str, Path]:
    """Write report.md, report.html, junit.xml and charts/*.png into ``run_dir``.

    Returns the written paths by name (``markdown``, ``html``, ``junit``, ``chart:<name>``).
    Raises ``metrics.RunDirError`` when the directory is not a readable run.
    """
    run_dir = Path(run_dir)
    run = metrics.load_run(run_dir)
    doc = build_document(run, run_dir)
    written: dict[str, Path] = {}
    md_path, html_path, junit_path = (
        run_dir / "report.md",
        run_dir / "report.html",
        run_dir / "junit.xml",
    )
    md_path.write_text(render_markdown(doc, run_dir))
    html_path.write_text(render_html(doc))
    history = run.history
    duration = float(history["time"].max() - history["time"].min()) if len(history) else 0.0
    junit_path.write_text(junit_xml(run.summary, duration))
    written.update(markdown=md_path, html=html_path, junit=junit_path)
    for block in doc.blocks:
        if block.kind == "image" and block.image is not None:
            written[f"chart:{block.image.stem}"] = block.image
    return written


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("report", help="(re)write a run directory's reports")
    parser.add_argument("run_dir", nargs="+", metavar="RUN", help="run directory")
    parser.set_defaults(func=run_command)


def run_command(args: argparse.Namespace) -> int:
    status = 0
    for run_dir in args.run_dir:
        try:
            written = write_reports(Path(run_dir))
        except metrics.RunDirError as exc:
            print(f"error: {exc}", file=sys.stderr)
            status = 2
            continue
        print(f"{run_dir}: {written['html']}")
    return status
