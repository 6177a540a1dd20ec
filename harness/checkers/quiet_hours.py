"""Quiet hours: no delivery while the recipient is inside their local window, and every
deferred notification delivered soon after the window ends.

The windows' end instants come from the population (which placed them), never from the
system's own quiet-hours code.
"""

from __future__ import annotations

import pandas as pd

from harness.checkers.verdict import Verdict
from harness.checkers.windows import deliveries
from harness.oracle import Expectation
from harness.population import Population

KEY = ["tenant_id", "notification_id", "token"]


def check(
    population: Population,
    expectation: Expectation,
    history: pd.DataFrame,
    release_bound_seconds: float = 30.0,
) -> Verdict:
    delivered = deliveries(history)
    whole_run_tokens = {
        (d.tenant_id, d.token)
        for u in population.users
        if u.quiet_state == "whole_run"
        for d in population.devices_of(u.tenant_id, u.user_id)
    }
    inside_whole_run = sum(
        1
        for row in delivered[["tenant_id", "token"]].itertuples(index=False, name=None)
        if row in whole_run_tokens
    )
    deferred = expectation.deliveries.dropna(subset=["quiet_until"])
    first = delivered.groupby(KEY, dropna=False)["time"].min().rename("first_time").reset_index()
    timed = deferred.merge(first, on=KEY, how="left")
    arrived = timed.dropna(subset=["first_time"])
    early = arrived[arrived["first_time"] < arrived["quiet_until"]]
    lateness = arrived["first_time"] - arrived["quiet_until"]
    late = arrived[lateness > release_bound_seconds]
    counts = {
        "deferred_expected": int(len(timed)),
        "deferred_delivered": int(len(arrived)),
        "delivered_inside_window": int(len(early)) + inside_whole_run,
        "released_late": int(len(late)),
    }
    details = {
        "release_bound_seconds": release_bound_seconds,
        "max_release_delay_seconds": round(float(lateness.max()), 3) if len(arrived) else None,
        "early_examples": early[KEY + ["quiet_until", "first_time"]].head(5).to_dict("records"),
    }
    valid = counts["delivered_inside_window"] == 0 and counts["released_late"] == 0
    return Verdict("quiet_hours", valid, counts, details)
