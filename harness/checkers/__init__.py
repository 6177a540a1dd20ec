"""Checkers: pure functions over a run's history and population that return a verdict.

``run_probe`` maps a scenario's steady-state probe (a name and its tolerance) to a checker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from harness.checkers import (
    audit_complete,
    backpressure,
    channel_delivery,
    consent,
    dead_tokens,
    dlq_accountability,
    effectively_once,
    fail_closed,
    quiet_hours,
    rate_limit,
    tenant_isolation,
)
from harness.checkers.verdict import Verdict
from harness.model.oracle import Expectation, expected_channel_deliveries
from harness.model.population import Population
from reference_impl.config import Config

__all__ = ["Evidence", "Verdict", "run_probe"]


@dataclass(frozen=True)
class Evidence:
    """What every checker may read: the oracle's side and the observed history."""

    population: Population
    expectation: Expectation
    history: pd.DataFrame
    reference: dict[str, Any]


def run_probe(name: str, tolerance: dict[str, Any], evidence: Evidence) -> Verdict:
    history = evidence.history
    if name == "effectively_once":
        return effectively_once.check(
            evidence.expectation,
            history,
            max_visible_duplicates=int(tolerance.get("max_visible_duplicates", 0)),
            max_lost=int(tolerance.get("max_lost", 0)),
            max_duplicated=(
                int(tolerance["max_duplicated"]) if "max_duplicated" in tolerance else None
            ),
        )
    if name == "quiet_hours":
        return quiet_hours.check(
            evidence.population,
            evidence.expectation,
            history,
            release_bound_seconds=float(tolerance.get("release_bound_s", 30.0)),
        )
    if name == "fail_closed":
        return fail_closed.check(
            history,
            grace_s=float(tolerance.get("grace_s", 0.5)),
            fallback=bool(evidence.reference.get("dedup_fallback", False)),
        )
    if name == "dead_tokens":
        return dead_tokens.check(history, grace_s=float(tolerance.get("grace_s", 1.0)))
    if name == "backpressure":
        cap = tolerance.get("cap_per_s")
        return backpressure.check(
            history,
            slack_s=float(tolerance.get("slack_s", 0.3)),
            cap_per_s=float(cap) if cap is not None else None,
        )
    if name == "dlq_accountability":
        return dlq_accountability.check(evidence.expectation, history)
    if name == "consent":
        return consent.check(evidence.population, history)
    if name == "tenant_isolation":
        return tenant_isolation.check(evidence.population, evidence.expectation, history)
    if name == "rate_limit":
        # The limits the system ran with (the scenario's reference overrides over the
        # defaults); a tolerance may name them for a target the harness did not start.
        config = Config.from_mapping(dict(evidence.reference))
        return rate_limit.check(
            evidence.population,
            evidence.expectation,
            history,
            per_window=int(tolerance.get("per_window", config.rate_limit_per_window)),
            window_seconds=float(tolerance.get("window_seconds", config.rate_limit_window_seconds)),
            daily_limit=int(tolerance.get("daily_limit", config.daily_limit_per_device_type)),
            slack_s=float(tolerance.get("slack_s", 1.0)),
        )
    if name == "audit_complete":
        return audit_complete.check(
            evidence.expectation,
            history,
            evidence.population,
            max_unaudited_dlq=int(tolerance.get("max_unaudited_dlq", 0)),
            max_lost_sent_records=int(tolerance.get("max_lost_sent_records", 0)),
        )
    if name == "channel_delivery":
        config = Config.from_mapping(dict(evidence.reference))
        expected = expected_channel_deliveries(
            evidence.population, history[history["kind"] == "inject"], config.channels_by_kind
        )
        return channel_delivery.check(
            expected,
            history,
            max_lost=int(tolerance.get("max_lost", 0)),
            max_duplicated=int(tolerance.get("max_duplicated", 0)),
        )
    raise ValueError(f"no checker named {name!r}")
