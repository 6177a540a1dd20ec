"""A checker's answer: valid, invalid, or unknown (None: it could not decide), with the counts
that say why."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
        return {True: "pass", False: "fail", None: "unknown"}[self.valid]

    def to_dict(self) -> dict[str, Any]:
        return {"valid": self.valid, **self.counts, **self.details}
