"""Stop conditions: a live count over a threshold ends the drill (AWS FIS's stop conditions,
k6's ``abortOnFail``, Chaos Toolkit's idea of a steady state that must hold).

A condition is written ``<check> > <number>`` (or ``>=``), naming a live check of
:mod:`harness.live.online`: ``duplicates > 0`` stops at the first duplicate the design does not
admit. A scenario lists them under ``configuration.stop_conditions``; ``harness run --stop-on``
adds more. Written by hand: comparing a count with a number needs no library.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# The live checks (harness.live.online) and the final checker whose violations each one's are.
LIVE_CHECKS = {
    "duplicates": "effectively_once",
    "visible_duplicates": "effectively_once",
    "decided_during_outage": "fail_closed",
    "sends_after_dead": "dead_tokens",
    "inside_retry_after": "backpressure",
    "in_quiet_hours": "quiet_hours",
    "without_consent": "consent",
    "late_delivery": "delivery_latency",
}
CHECKS = LIVE_CHECKS
_FORM = re.compile(r"^\s*([a-z_]+)\s*(>=|>)\s*(\d+)\s*$")


class StopConditionError(ValueError):
    """A stop condition that cannot be read, with what is wrong in it."""


@dataclass(frozen=True)
class StopCondition:
    check: str
    threshold: int
    inclusive: bool = False

    def fired(self, counts: Mapping[str, int]) -> bool:
        count = counts.get(self.check, 0)
        return count >= self.threshold if self.inclusive else count > self.threshold

    def __str__(self) -> str:
        return f"{self.check} {'>=' if self.inclusive else '>'} {self.threshold}"


def parse_stop_condition(text: str) -> StopCondition:
    """``duplicates > 0`` -> StopCondition; a clear error for anything else."""
    match = _FORM.match(str(text))
    if match is None:
        raise _unreadable(text)
    check, op, number = match.groups()
    if check not in CHECKS:
        raise StopConditionError(
            f"stop condition {text!r}: no live check {check!r}; "
            f"live checks: {', '.join(sorted(CHECKS))}"
        )
    return StopCondition(check, int(number), inclusive=op == ">=")


def _unreadable(text: str) -> StopConditionError:
    return StopConditionError(
        f"stop condition {text!r}: write it as '<live check> > <number>' "
        f"(or >=), e.g. 'duplicates > 0'; live checks: {', '.join(sorted(CHECKS))}"
    )


def first_fired(
    conditions: Iterable[StopCondition], counts: Mapping[str, int]
) -> StopCondition | None:
    return next((c for c in conditions if c.fired(counts)), None)
