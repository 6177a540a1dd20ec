"""Scenario files (YAML): Chaos Toolkit experiments that the harness also runs itself.

``steady-state-hypothesis``: the checkers (probes) and their tolerances; ``method``: the load
and the fault schedule with offsets and durations (plus timed actions such as a DLQ redrive);
``rollbacks``: actions run at the end, also when the run fails (every fault the nemesis started
is undone in any case). Scenarios ship in ``scenarios/``; ``run`` also accepts a path.

The shipped files are written as Chaos Toolkit activities calling the harness's extension
(:mod:`harness.chaostoolkit`), so ``chaos run`` runs them unchanged; the harness reads the same
activities, and its shorter hand-written form (``type: load | locust | fault | action``), to the
same :class:`Scenario`. A fault, action or probe may name any importable function
(``provider: {type: python, module, func, arguments}``, :mod:`harness.model.python_provider`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml

from harness.live.stop import StopCondition, StopConditionError, parse_stop_condition
from harness.model.population import PopulationSpec
from harness.model.python_provider import ProviderError, PythonProvider
from harness.model.tolerance import (
    VERDICT_TOLERANCE,
    ToleranceError,
    check_tolerance,
    judges_verdicts,
)

SCENARIO_DIR = Path(__file__).resolve().parents[2] / "scenarios"
CONFIGURATION_KEYS = frozenset(
    {
        "clock",
        "durable_redis",
        "population",
        "preference_bound_s",
        "providers",
        "reference",
        "stop_conditions",
        "timeout_s",
        "timeout_per_scale_s",
    }
)
# ``configuration.providers``: the providers' limits the run sets (and records) before its load.
PROVIDER_KEYS = frozenset({"fcm_project_quota_per_minute"})


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
    """A checker by name with its tolerance thresholds; or, with ``provider``, a function
    ``(evidence, **arguments)`` returning a Verdict, or a value judged by ``tolerance`` in Chaos
    Toolkit's forms (None: the value must be true)."""

    name: str
    tolerance: Any = field(default_factory=dict)
    provider: PythonProvider | None = None


@dataclass(frozen=True)
class FaultStep:
    """A catalogue fault; or, with ``provider``, a function ``(targets, **arguments)`` that
    starts a fault and returns what undoes it (``params`` are then its arguments)."""

    name: str
    offset_s: float
    duration_s: float
    params: dict[str, Any] = field(default_factory=dict)
    provider: PythonProvider | None = None


@dataclass(frozen=True)
class ActionStep:
    """A built-in action; or, with ``provider``, a function ``(context, **arguments)``."""

    name: str
    offset_s: float = 0.0
    params: dict[str, Any] = field(default_factory=dict)
    provider: PythonProvider | None = None


@dataclass(frozen=True)
class Load:
    regular_posts: int = 1
    celebrity_posts: int = 1
    spread_s: float = 0.0
    # The same event id (ULID) for the same author id in every tenant: two tenants minting
    # the same ULID, which tenant-prefixed keys must keep apart.
    shared_event_ids: bool = False
    # The kind of every event of the load: "post", or e.g. "mention" (which the policy's
    # channels_by_kind routes to email, in-app and SMS too).
    kind: str = "post"
    # The system mints the load's notification ids (no event_id sent): its own minting, which a
    # client-chosen id bypasses, then runs and is judged (``notification_ids``).
    system_minted_ids: bool = False


@dataclass(frozen=True)
class LocustLoad:
    """Load from a locustfile (``locustfiles/<name>.py``) with a plan (``harness.model.shapes``)."""

    locustfile: str
    plan: dict[str, Any] = field(default_factory=dict)
    workers: int = 0
    # Locust's own OpenTelemetry instrumentation (``locust --otel``; ``harness run --otel``).
    otel: bool = False


@dataclass(frozen=True)
class ClockStep:
    """A day boundary inside the load (``configuration.clock``): the system's clock is moved
    forward so that it shows midnight in ``midnight`` (an IANA zone) ``at_s`` seconds after
    the load starts. ``lead_s``: how long the harness allows from setting the clock to the
    load's start (loading the population); the load waits for the rest. The system must offer
    a movable clock (contract capability ``clock``), else the run ends "unknown"."""

    midnight: str = "UTC"
    at_s: float = 10.0
    lead_s: float = 30.0


def _clock(value: Any) -> ClockStep | None:
    if value is None:
        return None
    where = "configuration.clock"
    clock = _dataclass_from(ClockStep, _mapping(value, where), where)
    try:
        ZoneInfo(clock.midnight)
    except (ValueError, TypeError, ZoneInfoNotFoundError):
        raise ScenarioError(
            f"{where}: midnight must be an IANA zone, not {clock.midnight!r}"
        ) from None
    for key in ("at_s", "lead_s"):
        _number(asdict(clock), key, where)
    return clock


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
    # Seconds the timeout grows by per unit of ``--scale`` above 1 (``configuration.
    # timeout_per_scale_s``): a scenario sized for scaling says how long a unit takes to deliver.
    # 0: the timeout stays as written, whatever the scale.
    timeout_per_scale_s: float = 0.0
    # How soon a changed preference (consent, quiet hours, zone) or an erasure must take effect
    # after the system acknowledged it (seed 000: invalidation now; the 5-minute TTL is only a
    # backstop).
    preference_bound_s: float = 5.0
    # A day boundary inside the load (the system's clock moved), or None.
    clock: ClockStep | None = None
    # Live counts that end the drill (``configuration.stop_conditions``; harness.live.stop).
    stop_conditions: tuple[StopCondition, ...] = ()
    # The FCM project quota (messages per project per minute) the run sets on the simulator
    # (``configuration.providers.fcm_project_quota_per_minute``); None: the simulator's own
    # (Google's 600,000). Either way the run records the quota in force in its history.
    fcm_project_quota: int | None = None

    @property
    def regular_posts(self) -> int:
        return self.load.regular_posts

    @property
    def celebrity_posts(self) -> int:
        return self.load.celebrity_posts


def scaled(scenario: Scenario, factor: float) -> Scenario:
    """Every count grows together, and so the deliveries: users, celebrity followers, regular
    authors (each keeps its followers), Locust's background and celebrities; fault timings and probes stay as written, and the timeout grows by the
    scenario's ``timeout_per_scale_s`` per unit above 1."""
    from dataclasses import replace

    if factor <= 0:
        raise ScenarioError("--scale must be a positive number")
    population = scenario.population.scaled(factor)
    population = replace(
        population,
        regular_authors=max(1, round(scenario.population.regular_authors * factor)),
        # More regular authors, each with the followers it had: their deliveries grow with the
        # factor, not with its square (celebrity-scale at 100 expected 208,466, not ~118,000).
        regular_followers=scenario.population.regular_followers,
        users_per_tenant=max(population.users_per_tenant, population.celebrity_followers + 1),
    )
    locust = scenario.locust
    probes = tuple(_probe_at_scale(p, factor) for p in scenario.probes)
    scenario = replace(scenario, probes=probes)
    if factor > 1 and scenario.timeout_per_scale_s:
        grown = scenario.timeout_seconds + scenario.timeout_per_scale_s * (factor - 1)
        scenario = replace(scenario, timeout_seconds=grown)
    quota = scenario.fcm_project_quota
    if quota is not None:
        # The backlog grows with the population: so does the quota it is bled out at.
        scenario = replace(scenario, fcm_project_quota=max(1, round(quota * factor)))
    known = scenario.reference.get("fcm_quota_per_minute")
    if isinstance(known, int) and not isinstance(known, bool):
        # What the reference is told of its quota scales with the quota.
        reference = {**scenario.reference, "fcm_quota_per_minute": max(1, round(known * factor))}
        scenario = replace(scenario, reference=reference)
    if locust is not None:
        plan = dict(locust.plan)
        for key, default in (("background_users", 8), ("celebrities", 1)):
            plan[key] = max(1, round(plan.get(key, default) * factor))
        locust = replace(locust, plan=plan)
    return replace(scenario, population=population, locust=locust)


SCALE_SUFFIX = "_per_scale"


def _probe_at_scale(probe: Probe, factor: float) -> Probe:
    """A checker's tolerance at ``--scale factor``: each ``<key>_per_scale`` adds its value per
    unit above 1 to ``<key>`` (``bound_s: 60, bound_s_per_scale: 1.5``: a latency bound that
    is a drain rate, for a burst that grows with the scale). Below 1 nothing shrinks."""
    tolerance = probe.tolerance
    if not isinstance(tolerance, dict) or not any(k.endswith(SCALE_SUFFIX) for k in tolerance):
        return probe
    from dataclasses import replace

    grown = dict(tolerance)
    for key, per_unit in tolerance.items():
        if key.endswith(SCALE_SUFFIX):
            base = key[: -len(SCALE_SUFFIX)]
            grown[base] = grown[base] + per_unit * max(0.0, factor - 1)
    return replace(probe, tolerance=grown)


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


def valid_kind(kind: str) -> bool:
    """An event kind the load may post (the Event API's own rule is the system's to state)."""
    return 0 < len(kind) <= 64 and all(c.isascii() and (c.isalnum() or c in "_-") for c in kind)


def _number(step: dict[str, Any], key: str, where: str, default: float | None = None) -> float:
    value = step.get(key, default)
    if not isinstance(value, int | float) or value < 0:
        raise ScenarioError(f"{where}: {key} must be a number >= 0")
    return float(value)


def parse(data: Any, name: str) -> Scenario:
    """A Scenario from parsed YAML; every mistake raises ScenarioError naming where it is.

    Steps and probes may be written in the harness's shorthand (``type: load | locust | fault
    | action``, probes by checker name) or as Chaos Toolkit activities that call the harness's
    extension (``provider: {type: python, module: harness.chaostoolkit, func: ..., arguments:
    ...}``), whose arguments are the shorthand's keys; both mean the same run."""
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
    probes: list[Probe] = []
    for i, probe in enumerate(hypothesis.get("probes") or []):
        parsed = _probe(probe, f"steady-state-hypothesis.probes[{i}]")
        if parsed.name in {p.name for p in probes}:
            raise ScenarioError(
                f"steady-state-hypothesis.probes[{i}]: a second probe named {parsed.name!r}"
            )
        probes.append(parsed)
    if not probes:
        raise ScenarioError("steady-state-hypothesis.probes must name at least one checker")
    method = data.get("method") or []
    if not isinstance(method, list):
        raise ScenarioError("method must be a list of steps")
    steps = [
        _step(_mapping(step, f"method[{i}]"), f"method[{i}]", dict(METHOD_FUNCS))
        for i, step in enumerate(method)
    ]
    kinds = [s.get("type") for s in steps]
    if "load" in kinds and "locust" in kinds:
        raise ScenarioError("method: a load step and a locust step exclude each other; pick one")
    load = Load()
    locust = None
    faults, actions = [], []
    for i, step in enumerate(steps):
        where = f"method[{i}]"
        kind = step.get("type")
        if kind == "load":
            values = {k: v for k, v in step.items() if k not in ("type", "name")}
            load = _dataclass_from(Load, values, where)
            for key in ("regular_posts", "celebrity_posts"):
                value = getattr(load, key)
                if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                    raise ScenarioError(f"{where}: {key} must be a whole number >= 0")
            _number(values, "spread_s", where, 0.0)
            if not isinstance(load.kind, str) or not valid_kind(load.kind):
                raise ScenarioError(
                    f"{where}: kind must be an event kind of 1-64 letters, digits, _ or -"
                )
        elif kind == "locust":
            locust = _locust_step(step, where)
        elif kind == "fault":
            faults.append(_fault(step, where))
        elif kind == "action":
            actions.append(_action(step, where))
        else:
            raise ScenarioError(
                f"{where}: type must be load, locust, fault or action, not {kind!r}"
            )
    rollbacks = data.get("rollbacks") or []
    if not isinstance(rollbacks, list):
        raise ScenarioError("rollbacks must be a list of actions")
    rollback_steps = []
    for i, value in enumerate(rollbacks):
        where = f"rollbacks[{i}]"
        step = _step(_mapping(value, where), where, ROLLBACK_FUNCS)
        if step is None:
            continue
        if step.get("type") != "action":
            raise ScenarioError(f"{where}: a rollback is an action, not {step.get('type')!r}")
        if "offset_s" in step:
            raise ScenarioError(f"{where}: a rollback runs at the end; it takes no offset_s")
        rollback_steps.append(_action(step, where))
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
        rollbacks=tuple(rollback_steps),
        reference=dict(_mapping(config.get("reference"), "configuration.reference")),
        durable_redis=bool(config.get("durable_redis", False)),
        timeout_seconds=float(timeout),
        timeout_per_scale_s=_number(config, "timeout_per_scale_s", "configuration", 0.0),
        preference_bound_s=_number(config, "preference_bound_s", "configuration", 5.0),
        clock=_clock(config.get("clock")),
        stop_conditions=_stop_conditions(config.get("stop_conditions")),
        fcm_project_quota=_fcm_quota(config.get("providers")),
    )


def _stop_conditions(value: Any) -> tuple[StopCondition, ...]:
    """``configuration.stop_conditions``: a list of ``<live check> > <number>``."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ScenarioError("configuration.stop_conditions must be a list, e.g. ['duplicates > 0']")
    try:
        return tuple(parse_stop_condition(item) for item in value)
    except StopConditionError as exc:
        raise ScenarioError(f"configuration.stop_conditions: {exc}") from None


def _fcm_quota(value: Any) -> int | None:
    where = "configuration.providers"
    providers = _mapping(value, where)
    unknown = sorted(set(providers) - PROVIDER_KEYS)
    if unknown:
        raise ScenarioError(
            f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(PROVIDER_KEYS))}"
        )
    quota = providers.get("fcm_project_quota_per_minute")
    if quota is not None and (isinstance(quota, bool) or not isinstance(quota, int) or quota < 1):
        raise ScenarioError(f"{where}: fcm_project_quota_per_minute must be a whole number >= 1")
    return quota


# -- Chaos Toolkit activities -----------------------------------------------------------------

# The harness's Chaos Toolkit extension (harness/chaostoolkit): its functions, by the shorthand
# step each one stands for.
EXTENSION = "harness.chaostoolkit"
METHOD_FUNCS = {"load": "load", "locust": "locust", "fault": "fault", "action": "action"}
# ``stop`` is Chaos Toolkit's alone: it ends the background run, which the harness's own run
# always does by itself.
ROLLBACK_FUNCS: dict[str, str | None] = {"rollback": "action", "stop": None}
PROBE_FUNC = "verdict"
# The keys of a Chaos Toolkit activity the harness reads. A step's timing is its arguments'
# offset_s: Chaos Toolkit's own pauses and background would not change it, so they are refused.
ACTIVITY_KEYS = frozenset({"type", "name", "provider", "tolerance", "description"})


def _extension_call(
    step: dict[str, Any], where: str, funcs: dict[str, str | None]
) -> tuple[str | None, dict[str, Any]] | None:
    """(shorthand type, arguments) of a Chaos Toolkit activity that calls the extension; None
    for anything else."""
    provider = step.get("provider")
    if not isinstance(provider, dict) or provider.get("module") != EXTENSION:
        return None
    unknown = sorted(set(step) - ACTIVITY_KEYS)
    if unknown:
        raise ScenarioError(
            f"{where}: unknown key(s) {', '.join(unknown)} (a step's timing is its arguments' "
            f"offset_s); allowed: {', '.join(sorted(ACTIVITY_KEYS))}"
        )
    try:
        call = PythonProvider.from_mapping(provider)
    except ProviderError as exc:
        raise ScenarioError(f"{where}: {exc}") from exc
    if call.func not in funcs:
        raise ScenarioError(
            f"{where}: {EXTENSION}.{call.func} is not a step here; use one of: "
            f"{', '.join(sorted(funcs))}"
        )
    return funcs[call.func], dict(call.arguments)


def _step(step: dict[str, Any], where: str, funcs: dict[str, str | None]) -> dict[str, Any] | None:
    """A method or rollback step in the shorthand's keys, whichever way it was written (None:
    a step of Chaos Toolkit's run alone)."""
    call = _extension_call(step, where, funcs)
    if call is None:
        return step
    kind, arguments = call
    if step.get("type") != "action":
        raise ScenarioError(f"{where}: a step of the harness is a Chaos Toolkit action")
    if kind is None:
        if arguments:
            raise ScenarioError(f"{where}: {step['provider']['func']} takes no arguments")
        return None
    if "type" in arguments:
        raise ScenarioError(f"{where}: arguments: unknown key type")
    return {"type": kind, **arguments}


def _probe(value: Any, where: str) -> Probe:
    from harness.checkers import registry as checker_registry

    probe = _mapping(value, where)
    call = _extension_call(probe, where, {PROBE_FUNC: "probe"})
    if call is not None:
        if probe.get("type") != "probe":
            raise ScenarioError(f"{where}: a steady-state probe has type: probe")
        if "tolerance" not in probe:
            raise ScenarioError(f"{where}: a Chaos Toolkit probe needs a tolerance")
        try:
            judges = judges_verdicts(probe["tolerance"])
        except ToleranceError as exc:
            raise ScenarioError(f"{where}: tolerance: {exc}") from exc
        if not judges:
            raise ScenarioError(
                f"{where}: tolerance must accept a passing or switched-off verdict and refuse a "
                f"failing or unknown one, e.g. {VERDICT_TOLERANCE}; the checker's own thresholds go in "
                "the arguments' tolerance"
            )
        probe = call[1]
        unknown = sorted(set(probe) - {"name", "tolerance", "provider"})
        if unknown:
            raise ScenarioError(f"{where}: arguments: unknown key(s) {', '.join(unknown)}")
    name = probe.get("name")
    if "provider" in probe:
        if not isinstance(name, str) or not name:
            raise ScenarioError(f"{where}: a probe that names a function needs a name")
        if name in checker_registry.known():
            raise ScenarioError(
                f"{where}: {name!r} is a built-in checker's name; name your probe otherwise"
            )
        try:
            provider = PythonProvider.from_mapping(probe["provider"])
            provider.check("evidence", injectable=("tolerance",))
            # A function that takes the tolerance judges by it; else Chaos Toolkit's forms do.
            if probe.get("tolerance") is not None and not provider.declares("tolerance"):
                check_tolerance(probe["tolerance"])
        except (ProviderError, ToleranceError) as exc:
            raise ScenarioError(f"{where} ({name}): {exc}") from exc
        return Probe(name, probe.get("tolerance"), provider)
    if name not in checker_registry.known():
        raise ScenarioError(
            f"{where}: unknown probe {name!r}; known: {', '.join(checker_registry.known())} "
            "(or name your own function with provider: {type: python, module, func})"
        )
    tolerance = dict(_mapping(probe.get("tolerance"), "tolerance"))
    per_scale = {k for k in tolerance if isinstance(k, str) and k.endswith(SCALE_SUFFIX)}
    for key in sorted(per_scale):
        base, value = key[: -len(SCALE_SUFFIX)], tolerance[key]
        numbers = [v for v in (value, tolerance.get(base)) if isinstance(v, int | float)]
        if len(numbers) < 2 or any(isinstance(v, bool) or v < 0 for v in numbers):
            raise ScenarioError(
                f"{where} ({name}): {key} grows {base} per unit of --scale above 1: both must "
                f"be numbers >= 0"
            )
    unknown = checker_registry.unknown_tolerances(
        name, {k: v for k, v in tolerance.items() if k not in per_scale}
    )
    if unknown:
        allowed = ", ".join(sorted(checker_registry.get(name).tolerances)) or "none"
        raise ScenarioError(
            f"{where} ({name}): unknown tolerance(s) {', '.join(unknown)}; allowed: {allowed}"
        )
    return Probe(name, tolerance)


def _fault(step: dict[str, Any], where: str) -> FaultStep:
    from chaos.faults import CATALOGUE, FaultError, make_fault

    unknown = sorted(set(step) - {"type", "name", "offset_s", "duration_s", "params", "provider"})
    if unknown:
        raise ScenarioError(f"{where}: unknown key(s) {', '.join(unknown)}")
    offset, duration = _number(step, "offset_s", where, 0), _number(step, "duration_s", where)
    if "provider" in step:
        name = step.get("name")
        if not isinstance(name, str) or not name:
            raise ScenarioError(f"{where}: a fault that names a function needs a name")
        if "params" in step:
            raise ScenarioError(
                f"{where}: a python fault's parameters are its provider's arguments"
            )
        try:
            provider = PythonProvider.from_mapping(step["provider"])
            provider.check("chaos targets")
        except ProviderError as exc:
            raise ScenarioError(f"{where} ({name}): {exc}") from exc
        return FaultStep(name, offset, duration, dict(provider.arguments), provider)
    if step.get("name") not in CATALOGUE:
        raise ScenarioError(
            f"{where}: unknown fault {step.get('name')!r}; known: {', '.join(sorted(CATALOGUE))} "
            "(or name your own function with provider: {type: python, module, func})"
        )
    try:
        make_fault(step["name"], _mapping(step.get("params"), f"{where}.params"))
    except FaultError as exc:
        raise ScenarioError(f"{where}: {exc}") from exc
    return FaultStep(step["name"], offset, duration, dict(step.get("params") or {}))


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

    unknown = sorted(set(step) - {"type", "name", "offset_s", "params", "provider"})
    if unknown:
        raise ScenarioError(f"{where}: unknown key(s) {', '.join(unknown)}")
    offset = _number(step, "offset_s", where, 0)
    if "provider" in step:
        name = step.get("name")
        if not isinstance(name, str) or not name:
            raise ScenarioError(f"{where}: an action that names a function needs a name")
        if "params" in step:
            raise ScenarioError(
                f"{where}: a python action's parameters are its provider's arguments"
            )
        try:
            provider = PythonProvider.from_mapping(step["provider"])
            provider.check("action context (the run's ActionContext)")
        except ProviderError as exc:
            raise ScenarioError(f"{where} ({name}): {exc}") from exc
        return ActionStep(name, offset, dict(provider.arguments), provider)
    params = dict(_mapping(step.get("params"), f"{where}.params"))
    try:
        validate(str(step.get("name")), params)
    except ActionError as exc:
        raise ScenarioError(f"{where}: {exc}") from exc
    return ActionStep(step["name"], offset, params)


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
