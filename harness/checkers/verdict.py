"""A checker's answer: valid, invalid, unknown (None: it could not decide) or switched off (the
system does not offer what the checker needs), with the counts that say why."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# The key a switched-off checker's result carries, with the reason as its value.
SWITCHED_OFF = "switched_off"
STATUS_WORDS = {"pass": "PASS", "fail": "FAIL", "unknown": "UNKNOWN", "off": "OFF"}


@dataclass(frozen=True)
class Verdict:
    name: str
    # True: the promise held; False: violated; None: unknown (the checker crashed, or the
    # system lacks what it needs). Unknown is never a pass.
    valid: bool | None
    counts: dict[str, int] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def status(self) -> str:
        return result_status(self.to_dict())

    @property
    def applies(self) -> bool:
        """False when the checker was switched off for a system without what it needs."""
        return SWITCHED_OFF not in self.details

    def to_dict(self) -> dict[str, Any]:
        return {"valid": self.valid, **self.counts, **self.details}


def switched_off(name: str, why: str) -> Verdict:
    """The verdict of a checker a system cannot be judged by (it lacks a capability): neither a
    pass nor a failure, and the report says why."""
    return Verdict(name, None, {}, {SWITCHED_OFF: why})


def result_status(result: Mapping[str, Any]) -> str:
    """``pass``, ``fail``, ``unknown`` or ``off`` for a verdict as stored in summary.json."""
    if SWITCHED_OFF in result:
        return "off"
    return {True: "pass", False: "fail"}.get(result.get("valid"), "unknown")  # type: ignore[arg-type]
