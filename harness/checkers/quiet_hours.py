"""Quiet hours: no delivery while the recipient is inside their local window, and every
deferred notification delivered soon after the window ends.

``deferred_never_released`` counts deferred notifications that never arrived by the end of the
run's wait (a deferral that loses the job must not pass just because nothing arrived early).
The windows' end instants come from the population (which placed them), never from the
system's own quiet-hours code. A release due while a fault had stopped the system's push
consumer (killed, paused, restarted) may instead arrive up to ``recovery_s`` after
that fault ended, by ``delivery_latency``'s rule (its :func:`allowance`): a killed consumer's
jobs come back only when their visibility runs out, which the scenario bounds. Faults that only
degrade (latency, errors) excuse nothing. ``extended_by_fault`` counts those judged so. Users whose preferences the run changed are judged by the
``preference_changes`` checker.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from harness.checkers.delivery_latency import DEFAULT_RECOVERY_S, allowance
from harness.checkers.evidence import Evidence
from harness.checkers.keys import joint_keys, member, rows_with, sorted_unique, values_at
from harness.checkers.registry import checker
from harness.checkers.store import HistoryStore
from harness.checkers.verdict import Verdict
from harness.checkers.windows import delivery_rows, process_windows
from harness.model.oracle import Expectation
from harness.model.population import Population

KEY = ["tenant_id", "notification_id", "token"]


def quiet_all_run(
    population: Population,
    changed: set[tuple[str, str]] | frozenset[tuple[str, str]] = frozenset(),
) -> set[tuple[str, str]]:
    """(tenant, token) of the devices of users quiet for the whole run (the run did not change
    them): any delivery to one is inside its window. Both engines judge these."""
    return {
        (d.tenant_id, d.token)
        for u in population.users
        if u.quiet_state == "whole_run" and (u.tenant_id, u.user_id) not in changed
        for d in population.devices_of(u.tenant_id, u.user_id)
    }


def check(
    population: Population,
    expectation: Expectation,
    history: pd.DataFrame,
    release_bound_seconds: float = 30.0,
    changed: set[tuple[str, str]] | frozenset[tuple[str, str]] = frozenset(),
    recovery_s: float = DEFAULT_RECOVERY_S,
) -> Verdict:
    rows = delivery_rows(history)
    whole_run_tokens = quiet_all_run(population, changed)
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
    allowed, extended = allowance(
        quiet_until, release_bound_seconds, recovery_s, process_windows(history)
    )
    late = arrived & (first_time > allowed)
    counts = {
        "deferred_expected": int(len(deferred)),
        "deferred_delivered": int(arrived.sum()),
        "delivered_inside_window": int(early.sum()) + inside_whole_run,
        "released_late": int(late.sum()),
        "deferred_never_released": int((~arrived).sum()),
        "extended_by_fault": int((arrived & extended).sum()),
    }
    early_rows = expected[KEY].iloc[deferred[early][:5]].astype(object)
    early_examples = early_rows.assign(
        quiet_until=quiet_until[early][:5], first_time=first_time[early][:5]
    ).to_dict("records")
    details = {
        "release_bound_seconds": release_bound_seconds,
        "recovery_s": recovery_s,
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


def check_store(
    store: HistoryStore,
    population: Population,
    release_bound_seconds: float = 30.0,
    changed: set[tuple[str, str]] | frozenset[tuple[str, str]] = frozenset(),
    recovery_s: float = DEFAULT_RECOVERY_S,
) -> Verdict:
    """:func:`check` over a history on disk."""
    store.require_decided()
    store.device_table("quiet_all_run", quiet_all_run(population, changed))
    (inside_whole_run,) = store.one(
        "SELECT count(*) FROM prov p JOIN quiet_all_run q ON q.tenant = p.tenant "
        "AND q.tok = p.tok WHERE p.got"
    )
    bound = float(release_bound_seconds)
    store.run(
        f"""CREATE OR REPLACE TABLE deferred AS
        SELECT e.pos, e.key, e.quiet_until, f.first_time,
               e.quiet_until + {bound} AS allowed, e.quiet_until + {bound} AS base
        FROM exp e LEFT JOIN {store.delivered_keys()} f ON f.key = e.key
        WHERE e.quiet_until IS NOT NULL"""
    )
    faults = store.rows(["fault"], ["kind", "time", "detail"])
    for window in sorted(process_windows(faults, end=store.end_time), key=lambda w: w.start):
        # delivery_latency's allowance, one UPDATE per window in order of start.
        store.run(
            "UPDATE deferred SET allowed = greatest(allowed, ?) "
            "WHERE ? <= allowed AND ? >= quiet_until",
            [window.stop + float(recovery_s), window.start, window.stop],
        )
    expected, arrived, early, late, never, latest, extended = store.one(
        """SELECT count(*), count(first_time), count(*) FILTER (first_time < quiet_until),
                  count(*) FILTER (first_time > allowed),
                  count(*) FILTER (first_time IS NULL), max(first_time - quiet_until),
                  count(*) FILTER (first_time IS NOT NULL AND allowed > base)
           FROM deferred"""
    )
    counts = {
        "deferred_expected": int(expected),
        "deferred_delivered": int(arrived),
        "delivered_inside_window": int(early) + int(inside_whole_run),
        "released_late": int(late),
        "deferred_never_released": int(never),
        "extended_by_fault": int(extended),
    }

    def records(where: str, with_first: bool) -> list[dict[str, Any]]:
        found = store.sql(
            f"SELECT key, quiet_until, first_time FROM deferred WHERE {where} ORDER BY pos LIMIT 5"
        ).fetchall()
        out = []
        for record, (_, until, first) in zip(
            store.decode_keys([k for k, _, _ in found]), found, strict=True
        ):
            record["quiet_until"] = until
            if with_first:
                record["first_time"] = first
            out.append(record)
        return out

    details = {
        "release_bound_seconds": release_bound_seconds,
        "recovery_s": recovery_s,
        "max_release_delay_seconds": round(float(latest), 3) if arrived else None,
        "early_examples": records("first_time < quiet_until", True),
        "never_released_examples": records("first_time IS NULL", False),
    }
    valid = (
        counts["delivered_inside_window"] == 0
        and counts["released_late"] == 0
        and counts["deferred_never_released"] == 0
    )
    return Verdict("quiet_hours", valid, counts, details)


@checker(
    "quiet_hours",
    summary="no delivery inside the recipient's local window; deferred ones arrive after it",
    tolerances={"release_bound_s": 30.0, "recovery_s": DEFAULT_RECOVERY_S},
    out_of_core=True,
)
def probe(evidence: Evidence, tolerance: Mapping[str, Any]) -> Verdict:
    if evidence.store is not None:
        return check_store(
            evidence.store,
            evidence.population,
            release_bound_seconds=float(tolerance["release_bound_s"]),
            changed=evidence.timeline.changed_users() if evidence.timeline else frozenset(),
            recovery_s=float(tolerance["recovery_s"]),
        )
    return check(
        evidence.population,
        evidence.expectation,
        evidence.history,
        release_bound_seconds=float(tolerance["release_bound_s"]),
        changed=evidence.timeline.changed_users() if evidence.timeline else frozenset(),
        recovery_s=float(tolerance["recovery_s"]),
    )
