"""Quiet hours: no delivery while the recipient is inside their local window, and every
deferred notification delivered soon after the window ends.

``deferred_never_released`` counts deferred notifications that never arrived by the end of the
run's wait (a deferral that loses the job must not pass just because nothing arrived early).
The windows' end instants come from the population (which placed them), never from the
system's own quiet-hours code. Users whose preferences the run changed are judged by the
``preference_changes`` checker.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from harness.checkers.evidence import Evidence
from harness.checkers.keys import joint_keys, member, rows_with, sorted_unique, values_at
from harness.checkers.registry import checker
from harness.checkers.verdict import Verdict
from harness.checkers.windows import delivery_rows
from harness.model.oracle import Expectation
from harness.model.population import Population

KEY = ["tenant_id", "notification_id", "token"]


def check(
    population: Population,
    expectation: Expectation,
    history: pd.DataFrame,
    release_bound_seconds: float = 30.0,
    changed: set[tuple[str, str]] | frozenset[tuple[str, str]] = frozenset(),
) -> Verdict:
    rows = delivery_rows(history)
    whole_run_tokens = {
        (d.tenant_id, d.token)
        for u in population.users
        if u.quiet_state == "whole_run" and (u.tenant_id, u.user_id) not in changed
        for d in population.devices_of(u.tenant_id, u.user_id)
    }
    suspects = rows[rows_with(history, "token", {k for _, k in whole_run_tokens})[rows]]
    inside_whole_run = sum(
        1
        for row in history[["tenant_id", "token"]].iloc[suspects].itertuples(index=False, name=None)
        if row in whole_run_tokens
    )
    expected = expectation.deliveries
    deferred = np.flatnonzero(expected["quiet_until"].notna().to_numpy(dtype=bool))
    quiet_until = expected["quiet_until"].iloc[deferred].to_numpy(dtype=float, na_value=np.nan)
    # Each deferred (notification, device)'s first delivery, the figure a left merge with the
    # per-key minimum gives, found among the deliveries to deferred devices only.
    expected_keys, history_keys = joint_keys([expected, history], KEY)
    deferred_keys = expected_keys[deferred]
    deferred_tokens = values_at(expected, "token", deferred)
    related = rows[rows_with(history, "token", deferred_tokens)[rows]]
    related = related[member(history_keys[related], sorted_unique(deferred_keys))]
    first = (
        pd.Series(history["time"].to_numpy(dtype=float, na_value=np.nan)[related])
        .groupby(history_keys[related])
        .min()
    )
    found = first.index.get_indexer(deferred_keys)
    first_time = np.append(first.to_numpy(dtype=float), np.nan)[found]  # -1: never delivered
    arrived = ~np.isnan(first_time)
    lateness = first_time - quiet_until
    early = arrived & (first_time < quiet_until)
    late = arrived & (lateness > release_bound_seconds)
    counts = {
        "deferred_expected": int(len(deferred)),
        "deferred_delivered": int(arrived.sum()),
        "delivered_inside_window": int(early.sum()) + inside_whole_run,
        "released_late": int(late.sum()),
        "deferred_never_released": int((~arrived).sum()),
    }
    early_rows = expected[KEY].iloc[deferred[early][:5]].astype(object)
    early_examples = early_rows.assign(
        quiet_until=quiet_until[early][:5], first_time=first_time[early][:5]
    ).to_dict("records")
    details = {
        "release_bound_seconds": release_bound_seconds,
        "max_release_delay_seconds": (
            round(float(lateness[arrived].max()), 3) if arrived.any() else None
        ),
        "early_examples": early_examples,
    }
    never_rows = expected[KEY].iloc[deferred[~arrived][:5]].astype(object)
    details["never_released_examples"] = never_rows.assign(
        quiet_until=quiet_until[~arrived][:5]
    ).to_dict("records")
    valid = (
        counts["delivered_inside_window"] == 0
        and counts["released_late"] == 0
        and counts["deferred_never_released"] == 0
    )
    return Verdict("quiet_hours", valid, counts, details)


@checker(
    "quiet_hours",
    summary="no delivery inside the recipient's local window; deferred ones arrive after it",
    tolerances={"release_bound_s": 30.0},
)
def probe(evidence: Evidence, tolerance: Mapping[str, Any]) -> Verdict:
    return check(
        evidence.population,
        evidence.expectation,
        evidence.history,
        release_bound_seconds=float(tolerance["release_bound_s"]),
        changed=evidence.timeline.changed_users() if evidence.timeline else frozenset(),
    )
