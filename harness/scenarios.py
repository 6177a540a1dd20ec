"""Named scenarios a run can be asked for."""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.population import PopulationSpec


class UnknownScenario(KeyError):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name

    def __str__(self) -> str:
        return f"unknown scenario {self.name!r}; known scenarios: {', '.join(sorted(SCENARIOS))}"


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    population: PopulationSpec = field(default_factory=PopulationSpec)
    # Regular posts per regular author; every celebrity posts once.
    regular_posts: int = 1
    celebrity_posts: int = 1
    timeout_seconds: float = 90.0


SCENARIOS: dict[str, Scenario] = {
    "smoke": Scenario(
        name="smoke",
        description=(
            "one celebrity post and a few regular posts per tenant, no faults: the push path "
            "end to end, with quiet-hours deferrals released during the run"
        ),
    ),
}


def get(name: str) -> Scenario:
    try:
        return SCENARIOS[name]
    except KeyError:
        raise UnknownScenario(name) from None
