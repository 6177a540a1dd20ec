"""Scenario files (YAML) in Chaos Toolkit's vocabulary.

``steady-state-hypothesis``: the checkers (probes) and their tolerances; ``method``: the load
and the fault schedule with offsets and durations (plus timed actions such as a DLQ redrive);
``rollbacks``: actions run at the end, also when the run fails (every fault the nemesis started
is undone in any case). Scenarios ship in ``scenarios/``; ``run`` also accepts a path.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from harness.model.population import PopulationSpec

SCENARIO_DIR = Path(__file__).resolve().parents[2] / "scenarios"
CONFIGURATION_KEYS = frozenset(
    {"durable_redis", "population", "preference_bound_s", "reference", "timeout_s"}
)


class ScenarioError(ValueError):
    """A scenario file that cannot be run, with what is wrong in it."""


class UnknownScenario(ScenarioError):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name

    def __str__(self) -> str:
        return f"unknown scenario {self.name!r}; known scenarios: {', '.join(known())}"


@dataclass(frozen=True)
class Probe:
    name: str
    tolerance: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class FaultStep:
    name: str
    offset_s: float
    duration_s: float
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ActionStep:
    name: str
    offset_s: float = 0.0
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Load:
    regular_posts: int = 1
    celebrity_posts: int = 1
    spread_s: float = 0.0
    # The same event id (ULID) for the same author id in every tenant: two tenants minting
    # the same ULID, which tenant-prefixed keys must keep apart.
    shared_event_ids: bool = False


@dataclass(frozen=True)
class LocustLoad:
    """Load from a locustfile (``locustfiles/<name>.py``) with a plan (``harness.model.shapes``)."""

    locustfile: str
    plan: dict[str, Any] = field(default_factory=dict)
    workers: int = 0


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    population: PopulationSpec = field(default_factory=PopulationSpec)
    load: Load = field(default_factory=Load)
    locust: LocustLoad | None = None
    probes: tuple[Probe, ...] = (Probe("effectively_once"), Probe("quiet_hours"))
    faults: tuple[FaultStep, ...] = ()
    actions: tuple[ActionStep, ...] = ()
    rollbacks: tuple[ActionStep, ...] = ()
    reference: dict[str, Any] = field(default_factory=dict)
    durable_redis: bool = False
    timeout_seconds: float = 90.0
    # How soon a changed preference (consent, quiet hours, zone) or an erasure must take effect
    # after the system acknowledged it (seed 000: invalidation now; the 5-minute TTL is only a
    # backstop).
    preference_bound_s: float = 5.0

    @property
    def regular_posts(self) -> int:
        return self.load.regular_posts

    @property
    def celebrity_posts(self) -> int:
        return self.load.celebrity_posts


def scaled(scenario: Scenario, factor: float) -> Scenario:
    """Every count grows together: users, followers, regular authors, Locust's background and
    celebrities; fault timings and probes stay as written."""
    from dataclasses import replace

    if factor <= 0:
        raise ScenarioError("--scale must be a positive number")
    population = scenario.population.scaled(factor)
    population = replace(
        population,
        regular_authors=max(1, round(scenario.population.regular_authors * factor)),
        users_per_tenant=max(population.users_per_tenant, population.celebrity_followers + 1),
    )
    locust = scenario.locust
    if locust is not None:
        plan = dict(locust.plan)
        for key, default in (("background_users", 8), ("celebrities", 1)):
            plan[key] = max(1, round(plan.get(key, default) * factor))
        locust = replace(locust, plan=plan)
    return replace(scenario, population=population, locust=locust)


def known() -> list[str]:
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml"))


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ScenarioError(f"{where} must be a mapping")
    return value


def _dataclass_from(cls: type, values: dict[str, Any], where: str) -> Any:
    allowed = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - allowed)
    if unknown:
        raise ScenarioError(
            f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}"
        )
    try:
        return cls(**values)
    except TypeError as exc:
        raise ScenarioError(f"{where}: {exc}") from exc


def _number(step: dict[str, Any], key: str, where: str, default: float | None = None) -> float:
    value = step.get(key, default)
    if not isinstance(value, int | float) or value < 0:
        raise ScenarioError(f"{where}: {key} must be a number >= 0")
    return float(value)


def parse(data: Any, name: str) -> Scenario:
    """A Scenario from parsed YAML; every mistake raises ScenarioError naming where it is."""
    from chaos.faults import CATALOGUE, FaultError, make_fault
    from harness.checkers import registry as checker_registry

    data = _mapping(data, f"scenario {name}")
    config = _mapping(data.get("configuration"), "configuration")
    unknown_config = sorted(set(config) - CONFIGURATION_KEYS)
    if unknown_config:
        raise ScenarioError(
            f"configuration: unknown key(s) {', '.join(unknown_config)}; "
            f"allowed: {', '.join(sorted(CONFIGURATION_KEYS))}"
        )
    population = _dataclass_from(
        PopulationSpec,
        _mapping(config.get("population"), "configuration.population"),
        "configuration.population",
    )
    problem = population.problem()
    if problem:
        raise ScenarioError(f"configuration.population: {problem}")
    hypothesis = _mapping(data.get("steady-state-hypothesis"), "steady-state-hypothesis")
    probes = []
    for i, probe in enumerate(hypothesis.get("probes") or []):
        probe = _mapping(probe, f"steady-state-hypothesis.probes[{i}]")
        if probe.get("name") not in checker_registry.known():
            raise ScenarioError(
                f"steady-state-hypothesis.probes[{i}]: unknown probe {probe.get('name')!r}; "
                f"known: {', '.join(checker_registry.known())}"
            )
        tolerance = dict(_mapping(probe.get("tolerance"), "tolerance"))
        unknown = checker_registry.unknown_tolerances(probe["name"], tolerance)
        if unknown:
            allowed = ", ".join(sorted(checker_registry.get(probe["name"]).tolerances)) or "none"
            raise ScenarioError(
                f"steady-state-hypothesis.probes[{i}] ({probe['name']}): unknown tolerance(s) "
                f"{', '.join(unknown)}; allowed: {allowed}"
            )
        probes.append(Probe(probe["name"], tolerance))
    if not probes:
        raise ScenarioError("steady-state-hypothesis.probes must name at least one checker")
    steps = [s.get("type") for s in data.get("method") or [] if isinstance(s, dict)]
    if "load" in steps and "locust" in steps:
        raise ScenarioError("method: a load step and a locust step exclude each other; pick one")
    load = Load()
    locust = None
    faults, actions = [], []
    method = data.get("method") or []
    if not isinstance(method, list):
        raise ScenarioError("method must be a list of steps")
    for i, step in enumerate(method):
        where = f"method[{i}]"
        step = _mapping(step, where)
        kind = step.get("type")
        if kind == "load":
            values = {k: v for k, v in step.items() if k not in ("type", "name")}
            load = _dataclass_from(Load, values, where)
            for key in ("regular_posts", "celebrity_posts"):
                value = getattr(load, key)
                if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                    raise ScenarioError(f"{where}: {key} must be a whole number >= 0")
            _number(values, "spread_s", where, 0.0)
        elif kind == "locust":
            locust = _locust_step(step, where)
        elif kind == "fault":
            if step.get("name") not in CATALOGUE:
                raise ScenarioError(
                    f"{where}: unknown fault {step.get('name')!r}; known: {', '.join(sorted(CATALOGUE))}"
                )
            try:
                make_fault(step["name"], _mapping(step.get("params"), f"{where}.params"))
            except FaultError as exc:
                raise ScenarioError(f"{where}: {exc}") from exc
            faults.append(
                FaultStep(
                    step["name"],
                    _number(step, "offset_s", where, 0),
                    _number(step, "duration_s", where),
                    dict(step.get("params") or {}),
                )
            )
        elif kind == "action":
            actions.append(_action(step, where))
        else:
            raise ScenarioError(
                f"{where}: type must be load, locust, fault or action, not {kind!r}"
            )
    rollbacks = [
        _action(_mapping(s, f"rollbacks[{i}]"), f"rollbacks[{i}]")
        for i, s in enumerate(data.get("rollbacks") or [])
    ]
    timeout = config.get("timeout_s", 90)
    if not isinstance(timeout, int | float) or timeout <= 0:
        raise ScenarioError("configuration.timeout_s must be a positive number")
    return Scenario(
        name=str(data.get("title") or name),
        description=str(data.get("description") or "").strip(),
        population=population,
        load=load,
        locust=locust,
        probes=tuple(probes),
        faults=tuple(faults),
        actions=tuple(actions),
        rollbacks=tuple(rollbacks),
        reference=dict(_mapping(config.get("reference"), "configuration.reference")),
        durable_redis=bool(config.get("durable_redis", False)),
        timeout_seconds=float(timeout),
        preference_bound_s=_number(config, "preference_bound_s", "configuration", 5.0),
    )


def _locust_step(step: dict[str, Any], where: str) -> LocustLoad:
    from harness.model.shapes import SHAPES, LoadPlan, PlanError

    values = {k: v for k, v in step.items() if k not in ("type", "name")}
    locust = _dataclass_from(LocustLoad, values, where)
    shape = Path(locust.locustfile).stem
    if shape not in SHAPES:
        raise ScenarioError(
            f"{where}: unknown locustfile {locust.locustfile!r}; known: {', '.join(SHAPES)}"
        )
    if not isinstance(locust.workers, int) or locust.workers < 0:
        raise ScenarioError(f"{where}: workers must be a whole number >= 0")
    try:
        LoadPlan.from_mapping({**_mapping(locust.plan, f"{where}.plan"), "shape": shape})
    except PlanError as exc:
        raise ScenarioError(f"{where}.plan: {exc}") from exc
    return locust


def _action(step: dict[str, Any], where: str) -> ActionStep:
    from harness.run.actions import ActionError, validate

    params = dict(_mapping(step.get("params"), f"{where}.params"))
    try:
        validate(str(step.get("name")), params)
    except ActionError as exc:
        raise ScenarioError(f"{where}: {exc}") from exc
    return ActionStep(step["name"], _number(step, "offset_s", where, 0), params)


def load_file(path: Path) -> Scenario:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{path} is not valid YAML: {exc}") from exc
    try:
        return parse(data, path.stem)
    except ScenarioError as exc:
        raise ScenarioError(f"{path}: {exc}") from exc


def get(name: str) -> Scenario:
    """A shipped scenario by name, or a scenario file by path."""
    candidate = Path(name)
    if candidate.suffix in (".yaml", ".yml") and candidate.exists():
        return load_file(candidate)
    path = SCENARIO_DIR / f"{name}.yaml"
    if not path.exists():
        raise UnknownScenario(name)
    return load_file(path)
