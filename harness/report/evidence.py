"""The evidence behind each failed checker, and the tables the report draws from a run."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import pandas as pd

from harness.analysis import metrics
from harness.analysis.metrics import KEY, Run
from harness.checkers import dead_tokens, registry
from harness.checkers.windows import Window, deliveries, unavailable_windows
from harness.model.oracle import Expectation
from harness.report.document import MAX_EVIDENCE_ROWS, attempts_of, short_token, since


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
    outages = unavailable_windows(ctx.run.history)
    got = ctx.attempts[ctx.attempts["got"]]
    inside = pd.Series(False, index=got.index)
    for w in outages:
        inside |= (got["time"] > w.start + grace_s) & (got["time"] < w.stop)
    during = got[inside]
    if during.empty:
        return []
    table = attempts_of(during.head(MAX_EVIDENCE_ROWS), ctx.attempts, ctx.windows, ctx.t0)
    return [(f"Deliveries during a dedup outage: {len(during)} (their keys' attempts)", table)]


def dead_token_evidence(ctx: Context, transit_s: float) -> list[tuple[str, pd.DataFrame]]:
    """Requests that reached the provider after the token's first dead answer left it (the
    checker's rule: harness/checkers/dead_tokens.py)."""
    provider = ctx.attempts
    dead = provider[
        ((provider["provider"] == "apns") & (provider["status"] == 410)).fillna(False)
        | ((provider["provider"] == "fcm") & (provider["reason"] == "UNREGISTERED")).fillna(False)
    ]
    if dead.empty:
        return []
    told = dead["end"].fillna(dead["time"]) if "end" in dead else dead["time"]
    first = (
        dead.assign(told=told)
        .groupby(["tenant_id", "token"])["told"]
        .min()
        .rename("dead_at")
        .reset_index()
    )
    later = provider.merge(first, on=["tenant_id", "token"])
    after = later[later["time"] > later["dead_at"] + transit_s].sort_values("time")
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
        found = dead_token_evidence(ctx, float(result.get("transit_s", dead_tokens.TRANSIT_S)))
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
