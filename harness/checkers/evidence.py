"""What every checker may read: the oracle's side, the observed history and the system's
stated policies. Never the system's own code, tables or logs."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from harness.model.oracle import Expectation
from harness.model.population import Population
from harness.model.system import SystemPolicy


@dataclass(frozen=True)
class Evidence:
    population: Population
    expectation: Expectation
    history: pd.DataFrame
    policy: SystemPolicy = field(default_factory=SystemPolicy)
