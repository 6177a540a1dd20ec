"""Alarms on sampled metrics, CloudWatch style: a state (OK or ALARM) per metric that changes
when a sample crosses the threshold, each change recorded once as an event.

The runbook's alarm is "DLQ depth over 100": the operator redrives after fixing the cause.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DLQ_DEPTH_THRESHOLD = 100


@dataclass
class ThresholdAlarm:
    """ALARM while the metric is above ``threshold``; ``observe`` returns the new state on a
    change, None otherwise (so each crossing is one event, not one per sample)."""

    name: str
    threshold: float
    states: dict[str, str] = field(default_factory=dict)

    def observe(self, metric: str, value: float) -> str | None:
        new = "ALARM" if value > self.threshold else "OK"
        old = self.states.get(metric, "OK")
        self.states[metric] = new
        return new if new != old else None
