"""The sustainable rate: a backlog is bled out at the providers' limits, neither over nor far
below them (DESIGN: absorb a spike "and bleed it out at the providers' aggregate sustainable
rate, not drop it").

Read: the provider ledgers, the limits the run stated (``provider_limits`` rows,
:mod:`harness.model.provider_limits`: what the run set and read back from the simulator), the
oracle's expected deliveries and the population (which provider each device is on) and the
system's stated FCM project mapping (``policy.fcm_mapping``; else a delivery's project is the
one its requests went to). Per provider with a stated limit, per scope (an FCM project):

* **over the quota**: requests in a provider window beyond the quota. Windows as the provider
  counts them: "quotas are per-minute, but these minutes are not aligned to the clock" (Google,
  "FCM throttling and quotas"): a window opens with the first request after the last one
  closed. Every request counts, also those the provider refused: the system sent them. Judged
  over the whole run (an overrun is one whether or not a backlog waits);
* **over a device's limit**: requests to one device beyond its per-minute or per-hour limit, in
  the device's windows (opened the same way);
* **dawdling**: while a backlog exists (expected deliveries due, i.e. accepted and outside any
  quiet window, not yet delivered), in every window of ``window_s`` that lies wholly inside a
  backlog (one starting each ``step_s``), the deliveries the provider accepted must reach
  ``min_fraction`` of what the quota allowed, or of the work there was (pending at the
  window's start plus what fell due during it) when that was less. A delivery never made
  stays pending to the end of the observations (``never_delivered`` says how many: lost ones
  are effectively_once's to judge, but a backlog never bled is a dawdle too).

Unknown when no provider limit was stated, or no backlog lasted a whole window (nothing to judge
the rate by) and nothing went over; switched off when the providers ran without their limits.
The verdict states the fraction achieved: accepted over allowed, over all judged windows, and
the lowest window's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from harness.checkers.evidence import Evidence
from harness.checkers.registry import checker, unknown_verdict
from harness.checkers.verdict import Verdict, switched_off
from harness.checkers.windows import delivery_rows, injection_times
from harness.model.fcm_mapping import project_function
from harness.model.oracle import Expectation
from harness.model.population import Population
from harness.model.provider_limits import ProviderLimits, recorded
from harness.model.system import SystemPolicy

NAME = "sustained_rate"
EXAMPLES = 5


def provider_windows(times: np.ndarray, length: float) -> tuple[np.ndarray, np.ndarray]:
    """The windows a provider counts ``times`` (sorted) in: each opens with the first request
    at or after the previous one's close (start + ``length``). Returns (start, count) per
    window."""
    starts: list[float] = []
    counts: list[int] = []
    i, n = 0, len(times)
    while i < n:
        start = float(times[i])
        j = int(np.searchsorted(times, start + length, side="left"))
        starts.append(start)
        counts.append(j - i)
        i = j
    return np.array(starts, dtype=float), np.array(counts, dtype=np.int64)


def backlog_intervals(due: np.ndarray, done: np.ndarray, end: float) -> list[tuple[float, float]]:
    """Maximal intervals in which some delivery was pending: due (``due``) and not yet done
    (``done``; NaN: never, pending to ``end``)."""
    done = np.where(np.isnan(done), end, np.minimum(done, end))
    keep = done > due
    events = np.concatenate([due[keep], done[keep]])
    deltas = np.concatenate([np.ones(keep.sum(), np.int64), -np.ones(keep.sum(), np.int64)])
    # At one instant, a delivery done before the next falls due: ends sort first.
    order = np.lexsort((deltas, events))
    level = np.cumsum(deltas[order])
    times = events[order]
    intervals: list[tuple[float, float]] = []
    opened: float | None = None
    for at, now in zip(times.tolist(), level.tolist(), strict=True):
        if opened is None and now > 0:
            opened = at
        elif opened is not None and now == 0:
            if at > opened:
                intervals.append((opened, at))
            opened = None
    if opened is not None and end > opened:
        intervals.append((opened, end))
    return intervals


def judge_backlog(
    scope: str,
    due: np.ndarray,
    done: np.ndarray,
    accepted: np.ndarray,
    quota: int,
    window_s: float,
    step_s: float,
    min_fraction: float,
    end: float,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """One scope's backlog windows: (sums, examples of dawdling windows). ``due`` / ``done``:
    the scope's expected deliveries (done NaN: never); ``accepted``: sorted times of the
    requests the provider accepted (the device got them)."""
    done_at = np.where(np.isnan(done), np.inf, done)
    keep = done_at > due
    due_sorted = np.sort(due[keep])
    done_sorted = np.sort(done_at[keep])
    starts_all: list[np.ndarray] = []
    for opened, closed in backlog_intervals(due[keep], done[keep], end):
        if closed - opened < window_s:
            continue
        grid = np.arange(opened, closed - window_s, step_s)
        starts_all.append(np.append(grid, closed - window_s))
    sums = {"windows": 0.0, "dawdling": 0.0, "accepted": 0.0, "allowed": 0.0, "lowest": np.inf}
    examples: list[dict[str, Any]] = []
    if not starts_all:
        return sums, examples
    starts = np.concatenate(starts_all)
    ends = starts + window_s
    pending = np.searchsorted(due_sorted, starts, side="right") - np.searchsorted(
        done_sorted, starts, side="right"
    )
    arriving = np.searchsorted(due_sorted, ends, side="left") - np.searchsorted(
        due_sorted, starts, side="right"
    )
    allowed = np.minimum(quota, pending + arriving).astype(float)
    got = (
        np.searchsorted(accepted, ends, side="left")
        - np.searchsorted(accepted, starts, side="left")
    ).astype(float)
    dawdling = got < min_fraction * allowed
    fraction = np.divide(got, allowed, out=np.ones_like(got), where=allowed > 0)
    sums.update(
        windows=float(len(starts)),
        dawdling=float(dawdling.sum()),
        accepted=float(got.sum()),
        allowed=float(allowed.sum()),
        lowest=float(fraction.min()),
    )
    for i in np.flatnonzero(dawdling)[:EXAMPLES]:
        examples.append(
            {
                "scope": scope,
                "window_start": float(starts[i]),
                "accepted": int(got[i]),
                "allowed": int(allowed[i]),
                "pending_at_start": int(pending[i]),
            }
        )
    return sums, examples


def _expected_scopes(
    population: Population,
    expectation: Expectation,
    history: pd.DataFrame,
    provider_rows: pd.DataFrame,
    policy: SystemPolicy,
    provider: str,
) -> pd.DataFrame:
    """The expected deliveries to devices on ``provider``: tenant_id, notification_id, token,
    ``due`` (injected, or its quiet window's end if later), ``done`` (first delivery; NaN:
    never) and ``scope`` (its project; None when it cannot be told)."""
    platform = {(d.tenant_id, d.token): d.platform for d in population.devices}
    expected = expectation.deliveries
    columns = ["tenant_id", "notification_id", "token", "user_id", "quiet_until"]
    rows = expected[columns].copy() if len(expected) else pd.DataFrame(columns=columns)
    on = [
        platform.get((t, k)) == provider
        for t, k in zip(rows["tenant_id"], rows["token"], strict=True)
    ]
    rows = rows[np.array(on, dtype=bool)].reset_index(drop=True)
    injects = history[history["kind"] == "inject"]
    injected = injection_times(injects) if len(injects) else pd.Series(dtype=float)
    keys = list(zip(rows["tenant_id"], rows["notification_id"], strict=True))
    at = np.array([injected.get(key, np.nan) for key in keys], dtype=float)
    quiet = pd.to_numeric(rows["quiet_until"], errors="coerce").to_numpy(dtype=float)
    rows["due"] = np.fmax(at, quiet)
    got = provider_rows[provider_rows["got"]]
    first = got.groupby(["tenant_id", "notification_id", "token"])["time"].min()
    triples = list(zip(rows["tenant_id"], rows["notification_id"], rows["token"], strict=True))
    rows["done"] = np.array([first.get(key, np.nan) for key in triples], dtype=float)
    project_of = project_function(policy.fcm_mapping, policy.fcm_projects)
    if provider != "fcm":
        rows["scope"] = provider
        return rows
    if project_of is not None:
        users = zip(rows["tenant_id"], rows["user_id"], strict=True)
        rows["scope"] = [project_of(t, u) for t, u in users]
        return rows
    # Not stated: the project its requests went to; the only project used, if just one.
    used = provider_rows.groupby(["tenant_id", "notification_id", "token"])["project"].first()
    projects = sorted(set(provider_rows["project"].dropna()))
    only = projects[0] if len(projects) == 1 else None

    def project(key: tuple[Any, Any, Any]) -> str | None:
        value = used.get(key)
        return value if isinstance(value, str) else only

    rows["scope"] = [project(key) for key in triples]
    return rows


def check(
    population: Population,
    expectation: Expectation,
    history: pd.DataFrame,
    policy: SystemPolicy | None = None,
    min_fraction: float = 0.5,
    step_s: float = 1.0,
    limits: Mapping[str, ProviderLimits] | None = None,
) -> Verdict:
    policy = policy or SystemPolicy()
    limits = dict(recorded(history) if limits is None else limits)
    if not limits:
        return unknown_verdict(
            NAME, "the run stated no provider limits (no provider_limits row in its history)"
        )
    enforced = {name: lim for name, lim in limits.items() if lim.enforced}
    if not enforced:
        return switched_off(
            NAME, f"the providers ran without their limits: {', '.join(sorted(limits))}"
        )
    is_provider = (history["kind"] == "provider").to_numpy(dtype=bool, na_value=False)
    got = np.zeros(len(history), dtype=bool)
    got[delivery_rows(history)] = True
    columns = ["time", "tenant_id", "notification_id", "token", "provider", "project", "status"]
    requests = history.loc[is_provider, columns].copy()
    requests["got"] = got[is_provider]
    requests["time"] = requests["time"].astype(float)
    times = pd.concat(
        [history["time"].astype(float), history["end"].astype(float)], ignore_index=True
    )
    end = float(times.max()) if times.notna().any() else 0.0

    counts = dict.fromkeys(
        (
            "requests_judged",
            "provider_windows",
            "windows_over_quota",
            "requests_over_quota",
            "quota_refusals",
            "device_windows_over_limit",
            "requests_over_device_limit",
            "backlog_deliveries",
            "never_delivered",
            "unattributed_deliveries",
            "backlog_windows",
            "dawdling_windows",
        ),
        0,
    )
    over_examples: list[dict[str, Any]] = []
    dawdle_examples: list[dict[str, Any]] = []
    accepted_sum = allowed_sum = 0.0
    lowest = np.inf
    judged: dict[str, dict[str, Any]] = {}
    for provider, lim in sorted(enforced.items()):
        mine = requests[requests["provider"] == provider].sort_values("time", kind="stable")
        counts["requests_judged"] += len(mine)
        counts["quota_refusals"] += int((mine["status"] == 429).sum())
        if provider == "fcm":
            scopes = {str(p): g for p, g in mine.groupby(mine["project"].fillna(""))}
        else:
            scopes = {provider: mine}
        if lim.project_quota is not None:
            for scope, rows in scopes.items():
                starts, n = provider_windows(rows["time"].to_numpy(dtype=float), lim.window_s)
                counts["provider_windows"] += len(starts)
                over = n > lim.project_quota
                counts["windows_over_quota"] += int(over.sum())
                counts["requests_over_quota"] += int((n[over] - lim.project_quota).sum())
                for s, c in zip(starts[over][:EXAMPLES], n[over][:EXAMPLES], strict=True):
                    if len(over_examples) < EXAMPLES:
                        over_examples.append(
                            {"scope": f"{provider}/{scope}", "window_start": float(s),
                             "requests": int(c), "quota": lim.project_quota}
                        )  # fmt: skip
        for length, limit in ((60.0, lim.device_per_minute), (3600.0, lim.device_per_hour)):
            if limit is None:
                continue
            per_token = mine.groupby("token")["time"]
            busy = per_token.size()
            for token in busy[busy > limit].index:
                times_of = np.sort(per_token.get_group(token).to_numpy(dtype=float))
                starts, n = provider_windows(times_of, length)
                over = n > limit
                counts["device_windows_over_limit"] += int(over.sum())
                counts["requests_over_device_limit"] += int((n[over] - limit).sum())
                if over.any() and len(over_examples) < EXAMPLES:
                    over_examples.append(
                        {"scope": f"{provider} device {token}", "window_s": length,
                         "requests": int(n[over].max()), "limit": limit}
                    )  # fmt: skip
        if lim.project_quota is None:
            continue
        expected = _expected_scopes(population, expectation, history, mine, policy, provider)
        counts["backlog_deliveries"] += len(expected)
        counts["never_delivered"] += int(expected["done"].isna().sum())
        counts["unattributed_deliveries"] += int(expected["scope"].isna().sum())
        for scope, rows in expected.dropna(subset=["scope"]).groupby("scope"):
            sent = scopes.get(str(scope))
            accepted = (
                np.sort(sent.loc[sent["got"], "time"].to_numpy(dtype=float))
                if sent is not None
                else np.zeros(0)
            )
            sums, found = judge_backlog(
                f"{provider}/{scope}",
                rows["due"].to_numpy(dtype=float),
                rows["done"].to_numpy(dtype=float),
                accepted,
                lim.project_quota,
                lim.window_s,
                step_s,
                min_fraction,
                end,
            )
            counts["backlog_windows"] += int(sums["windows"])
            counts["dawdling_windows"] += int(sums["dawdling"])
            accepted_sum += sums["accepted"]
            allowed_sum += sums["allowed"]
            lowest = min(lowest, sums["lowest"])
            dawdle_examples += found[: EXAMPLES - len(dawdle_examples)]
        judged[provider] = {
            "project_quota": lim.project_quota,
            "device_per_minute": lim.device_per_minute,
            "device_per_hour": lim.device_per_hour,
            "window_s": lim.window_s,
            "set_by": lim.set_by,
        }
    over_any = counts["windows_over_quota"] + counts["device_windows_over_limit"] > 0
    details: dict[str, Any] = {
        "limits": judged,
        "min_fraction": min_fraction,
        "step_s": step_s,
        "achieved_fraction": round(accepted_sum / allowed_sum, 3) if allowed_sum else None,
        "lowest_window_fraction": round(lowest, 3) if np.isfinite(lowest) else None,
        "over_limit_examples": over_examples,
        "dawdling_examples": dawdle_examples,
    }
    if counts["backlog_windows"] == 0 and not over_any:
        return Verdict(
            NAME,
            None,
            counts,
            {**details, "unknown": "no backlog lasted a whole window: the rate cannot be judged"},
        )
    valid = not over_any and counts["dawdling_windows"] == 0
    return Verdict(NAME, valid, counts, details)


@checker(
    NAME,
    summary="a backlog bled out at the providers' limits: never over, not far below",
    tolerances={"min_fraction": 0.5, "step_s": 1.0},
)
def probe(evidence: Evidence, tolerance: Mapping[str, Any]) -> Verdict:
    return check(
        evidence.population,
        evidence.expectation,
        evidence.history,
        evidence.policy,
        min_fraction=float(tolerance["min_fraction"]),
        step_s=float(tolerance["step_s"]),
    )
