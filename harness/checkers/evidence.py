"""What every checker may read: the oracle's side, the observed history and the system's
stated policies. Never the system's own code, tables or logs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pandas as pd

from harness.checkers.limited import exempt_limited
from harness.checkers.windows import PREFERENCES_STREAM, unavailable_windows
from harness.model.oracle import Expectation, expected_deliveries
from harness.model.population import Population
from harness.model.system import SystemPolicy
from harness.model.timeline import DEFAULT_BOUND_S, Timeline, from_history

if TYPE_CHECKING:
    from harness.checkers.store import HistoryStore


@dataclass(frozen=True)
class Evidence:
    population: Population
    expectation: Expectation
    history: pd.DataFrame
    policy: SystemPolicy = field(default_factory=SystemPolicy)
    # Users the run changed (preferences, erasures, registrations), and when.
    timeline: Timeline | None = None
    # A history larger than memory, on disk: checkers that can run out of core query it
    # (``history`` then holds only what the others read: see ``registry.run_probe``).
    store: HistoryStore | None = None
    # What the system exposes (``SystemContract.capabilities``; None: everything), for a
    # checker that switches off only a part of itself (channel_delivery's SMS part).
    capabilities: frozenset[str] | None = None
    # How far the system's clock ran ahead of real time (a scenario that moved it): calendar
    # and time-of-day promises are judged in the system's time, real time plus this.
    clock_offset_s: float = 0.0


def expectation_from(
    population: Population, history: pd.DataFrame, timeline: Timeline
) -> Expectation:
    """The oracle's expectation for a history: its accepted and indeterminate events, judged
    by the population as the timeline changed it."""
    injected = history[history["kind"] == "inject"]
    indeterminate = history[history["kind"] == "inject_info"]
    expectation = expected_deliveries(population, injected, timeline, indeterminate)
    for (tenant, user), change in timeline.registrations.items():
        for device in population.devices_of(tenant, user):
            expectation.reregistered[(tenant, device.token)] = change.sent
    return expectation


def timeline_from(
    population: Population,
    history: pd.DataFrame,
    policy: SystemPolicy | None = None,
    bound_s: float = DEFAULT_BOUND_S,
) -> Timeline:
    """The run's timeline, with the windows in which a fault stopped the preferences table's
    change stream (from the history's fault rows) and the system's stated cache TTL."""
    policy = policy or SystemPolicy()
    stops = [(w.start, w.stop) for w in unavailable_windows(history, PREFERENCES_STREAM)]
    return from_history(population, history, bound_s, stops, policy.preferences_cache_ttl_s)


def evidence_from(
    population: Population,
    history: pd.DataFrame,
    policy: SystemPolicy | None = None,
    bound_s: float = DEFAULT_BOUND_S,
) -> Evidence:
    policy = policy or SystemPolicy()
    timeline = timeline_from(population, history, policy, bound_s)
    expectation = exempt_limited(expectation_from(population, history, timeline), history, policy)
    return Evidence(
        population, expectation, history, policy, timeline,
        clock_offset_s=timeline.clock_offset_s,
    )  # fmt: skip
