"""Scenario files: every shipped one parses, and is a valid Chaos Toolkit experiment that means
what the harness's shorthand means; activities may name a team's own function; mistakes are
named precisely."""

from __future__ import annotations

import copy

import pytest
import yaml
from conftest import run_cli

from harness.model import scenarios
from harness.model.scenarios import SCENARIO_DIR, ScenarioError, parse

SHIPPED = (
    "smoke",
    "memorydb-outage",
    "memorydb-timeout",
    "memorydb-outage-fallback",
    "apns-429-storm",
    "sqs-redelivery",
    "consumer-crash",
    "dedup-failover",
    "dedup-failover-volatile",
    "tenant-collision",
    "mention-channels",
    "sns-throttle",
    "day-boundary",
)


def test_every_shipped_scenario_parses():
    assert set(SHIPPED) <= set(scenarios.known())
    for name in SHIPPED:
        scenario = scenarios.get(name)
        assert scenario.probes, name
        assert scenario.description, name


def test_chaos_scenarios_schedule_the_faults_they_are_named_for():
    assert {f.name for f in scenarios.get("memorydb-outage").faults} == {"dedup-outage"}
    [blackhole] = scenarios.get("memorydb-timeout").faults
    assert blackhole.name == "dedup-blackhole" and blackhole.params["timeout_ms"] == 0
    assert scenarios.get("memorydb-timeout").reference["dedup_fallback"] is False
    assert scenarios.get("memorydb-outage-fallback").reference["dedup_fallback"] is True
    assert "apns-status" in {f.name for f in scenarios.get("apns-429-storm").faults}
    assert {f.name for f in scenarios.get("sns-throttle").faults} == {"sns-throttle", "apns-status"}
    assert scenarios.get("sns-throttle").reference["push_transport"] == "sns"
    assert scenarios.get("dedup-failover").durable_redis is True
    assert scenarios.get("dedup-failover-volatile").durable_redis is False
    clock = scenarios.get("day-boundary").clock
    assert clock is not None and clock.midnight == "UTC" and clock.at_s > 0


BASE = {
    "title": "t",
    "steady-state-hypothesis": {"probes": [{"name": "effectively_once"}]},
    "method": [{"type": "load", "regular_posts": 1}],
}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"steady-state-hypothesis": {"probes": [{"name": "vibes"}]}}, "unknown probe 'vibes'"),
        ({"steady-state-hypothesis": {"probes": []}}, "at least one checker"),
        (
            {"method": [{"type": "fault", "name": "meteor", "duration_s": 1}]},
            "unknown fault 'meteor'",
        ),
        (
            {"method": [{"type": "fault", "name": "apns-status", "duration_s": 1}]},
            "needs parameter(s): p, status",
        ),
        (
            {"method": [{"type": "fault", "name": "dedup-outage", "duration_s": -1}]},
            "duration_s must be a number >= 0",
        ),
        ({"method": [{"type": "dance"}]}, "type must be load, locust, fault or action"),
        ({"method": [{"type": "load", "celebrity_post": 3}]}, "unknown key(s) celebrity_post"),
        (
            {"configuration": {"population": {"users": 3}}},
            "configuration.population: unknown key(s) users",
        ),
        ({"configuration": {"timeout_s": 0}}, "timeout_s must be a positive number"),
        ({"rollbacks": [{"type": "action", "name": "pray"}]}, "unknown action 'pray'"),
        (
            {"rollbacks": [{"type": "action", "name": "redrive-dlq", "offset_s": 3}]},
            "a rollback runs at the end; it takes no offset_s",
        ),
        ({"method": [{"type": "locust", "locustfile": "tsunami"}]}, "unknown locustfile 'tsunami'"),
        (
            {
                "method": [
                    {"type": "load"},
                    {"type": "action", "name": "post-probes", "params": {"system_minted_ids": 1}},
                ]
            },
            "post-probes: system_minted_ids must be true or false",
        ),
        (
            {"method": [{"type": "locust", "locustfile": "game_day", "plan": {"duration_s": -1}}]},
            "method[0].plan: duration_s must be positive",
        ),
        (
            {"method": [{"type": "load"}, {"type": "locust", "locustfile": "steady_state"}]},
            "a load step and a locust step exclude each other",
        ),
        (
            {"method": [{"type": "locust", "locustfile": "steady_state", "workers": -2}]},
            "workers must be a whole number >= 0",
        ),
    ],
)
def test_mistakes_are_named(change, message):
    with pytest.raises(ScenarioError) as info:
        parse({**BASE, **change}, "t")
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("providers", "message"),
    [
        ({"apns_quota": 5}, "configuration.providers: unknown key(s) apns_quota"),
        ({"fcm_project_quota_per_minute": 0}, "must be a whole number >= 1"),
        ({"fcm_project_quota_per_minute": 1.5}, "must be a whole number >= 1"),
    ],
)
def test_provider_limit_mistakes_are_named(providers, message):
    with pytest.raises(ScenarioError) as info:
        parse({**BASE, "configuration": {"providers": providers}}, "t")
    assert message in str(info.value)


def test_the_fcm_quota_a_scenario_sets_scales_with_the_run():
    from harness.model.scenarios import get, scaled

    base = get("fcm-backlog")
    assert base.fcm_project_quota == 160 and get("smoke").fcm_project_quota is None
    big = scaled(base, 2)
    assert big.fcm_project_quota == 320
    assert big.reference["fcm_quota_per_minute"] == 320  # what the system is told scales too


def test_a_bad_scenario_file_is_a_clear_cli_error(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text(
        yaml.safe_dump({**BASE, "method": [{"type": "fault", "name": "meteor", "duration_s": 1}]})
    )
    result = run_cli("run", str(path), "--out", str(tmp_path))
    assert result.returncode == 2
    assert "unknown fault 'meteor'" in result.stderr
    not_yaml = tmp_path / "garbage.yaml"
    not_yaml.write_text("method: [unclosed")
    result = run_cli("run", str(not_yaml), "--out", str(tmp_path))
    assert result.returncode == 2
    assert "not valid YAML" in result.stderr


def test_a_load_posts_the_kind_it_names_and_refuses_an_empty_one():
    from harness.model.scenarios import get, parse

    assert get("sqs-redelivery").load.kind == "mention"  # push, email and in-app redelivered
    assert get("smoke").load.kind == "post"
    step = {"type": "load", "regular_posts": 1, "celebrity_posts": 1}
    assert parse({**BASE, "method": [{**step, "kind": "like"}]}, "x").load.kind == "like"
    with pytest.raises(ScenarioError, match="kind"):
        parse({**BASE, "method": [{**step, "kind": ""}]}, "x")


def test_scale_grows_every_count_together():
    from harness.model.scenarios import get, scaled

    base = get("game-day")
    big = scaled(base, 3)
    assert big.population.users_per_tenant == 3 * base.population.users_per_tenant
    assert big.population.celebrity_followers == 3 * base.population.celebrity_followers
    assert big.population.regular_authors == 3 * base.population.regular_authors
    # Each regular author keeps its followers: their deliveries grow 3x, not 9x.
    assert big.population.regular_followers == base.population.regular_followers
    assert big.locust.plan["background_users"] == 3 * base.locust.plan["background_users"]
    assert big.locust.plan["celebrities"] == 3 * base.locust.plan["celebrities"]
    assert big.faults == base.faults and big.probes == base.probes
    small = scaled(base, 0.01)
    assert small.population.users_per_tenant > small.population.celebrity_followers >= 1
    # The timeout stays as written, unless the scenario says how long a unit of scale takes.
    assert big.timeout_seconds == base.timeout_seconds
    drill = get("celebrity-scale")
    assert drill.timeout_per_scale_s == 5
    assert scaled(drill, 1000).timeout_seconds == drill.timeout_seconds + 5 * 999
    assert scaled(drill, 0.5).timeout_seconds == drill.timeout_seconds
    # A checker's bound may grow with the scale too (a drain rate): <key>_per_scale per unit.
    latency = {p.name: p.tolerance for p in scaled(drill, 101).probes}["delivery_latency"]
    assert latency["bound_s"] == 60 + 5 * 100
    assert {p.name: p.tolerance for p in scaled(drill, 1).probes}["delivery_latency"][
        "bound_s"
    ] == 60
    with pytest.raises(ScenarioError, match="positive"):
        scaled(base, 0)


@pytest.mark.parametrize(
    "tolerance",
    [{"bound_s_per_scale": 3}, {"bound_s": 60, "bound_s_per_scale": "3"},
     {"bound_s": 60, "bound_s_per_scale": -1}, {"bound_s": True, "bound_s_per_scale": 1}],
)  # fmt: skip
def test_a_tolerance_that_grows_with_the_scale_needs_both_numbers(tolerance):
    probe = {"name": "delivery_latency", "tolerance": tolerance}
    data = {"title": "t", "steady-state-hypothesis": {"probes": [probe]}}
    with pytest.raises(ScenarioError, match="bound_s_per_scale grows bound_s"):
        scenarios.parse(data, "t")


# -- a team's own functions (module-level: the scenario names them test_scenarios.<func>) -------


def cut_nothing(targets, seconds=1.0):
    return None


def note(context, label):
    return label


def share_of_nothing(evidence):
    return 1.0


def judged(evidence, tolerance):
    return None


def _python(func, **arguments):
    return {"type": "python", "module": "test_scenarios", "func": func, "arguments": arguments}


def test_steps_and_probes_may_name_a_function():
    scenario = parse(
        {
            **BASE,
            "steady-state-hypothesis": {
                "probes": [
                    {"name": "effectively_once"},
                    {
                        "name": "all-of-it",
                        "provider": _python("share_of_nothing"),
                        "tolerance": {"type": "range", "range": [0.9, 1.0]},
                    },
                    {"name": "my-checker", "provider": _python("judged"), "tolerance": {"a": 1}},
                ]
            },
            "method": [
                {"type": "load"},
                {
                    "type": "fault",
                    "name": "cut",
                    "offset_s": 2,
                    "duration_s": 3,
                    "provider": _python("cut_nothing", seconds=2),
                },
                {
                    "type": "action",
                    "name": "say",
                    "offset_s": 1,
                    "provider": _python("note", label="x"),
                },
            ],
        },
        "t",
    )
    (fault,) = scenario.faults
    assert (fault.name, fault.offset_s, fault.duration_s) == ("cut", 2.0, 3.0)
    assert fault.provider.label == "test_scenarios.cut_nothing"
    assert fault.params == {"seconds": 2}
    assert scenario.actions[0].provider.arguments == {"label": "x"}
    assert [p.name for p in scenario.probes] == ["effectively_once", "all-of-it", "my-checker"]
    # A function that takes the tolerance judges by it, whatever its form.
    assert scenario.probes[2].tolerance == {"a": 1}


def _probe_of(provider, **more):
    return {
        **BASE,
        "steady-state-hypothesis": {"probes": [{"name": "p", "provider": provider, **more}]},
    }


def _fault_of(provider):
    step = {"type": "fault", "name": "f", "duration_s": 1, "provider": provider}
    return {**BASE, "method": [{"type": "load"}, step]}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            _fault_of(_python("cut_nothing") | {"module": "no_such_team_module"}),
            "cannot import module 'no_such_team_module'",
        ),
        (
            _fault_of(_python("no_such_func")),
            "module 'test_scenarios' has no function 'no_such_func'",
        ),
        (
            _fault_of(_python("cut_nothing", minutes=3)),
            "cannot be called with the chaos targets and arguments ['minutes']",
        ),
        (
            _fault_of(_python("cut_nothing") | {"type": "process"}),
            "provider type must be python, not 'process'",
        ),
        (_fault_of({"type": "python", "func": "cut_nothing"}), "a python provider needs a module"),
        (
            _probe_of(_python("share_of_nothing"), tolerance={"type": "jsonpath", "path": "$"}),
            "tolerance type 'jsonpath' is not judged",
        ),
        (_probe_of(_python("share_of_nothing", extra=1)), "cannot be called with the evidence"),
        (
            {
                **BASE,
                "steady-state-hypothesis": {
                    "probes": [{"name": "consent", "provider": _python("share_of_nothing")}]
                },
            },
            "'consent' is a built-in checker's name",
        ),
        (
            {
                **BASE,
                "steady-state-hypothesis": {"probes": [{"name": "consent"}, {"name": "consent"}]},
            },
            "a second probe named 'consent'",
        ),
        (
            {**BASE, "method": [{"type": "action", "name": "a", "provider": _python("note")}]},
            "cannot be called with the action context",
        ),
    ],
)
def test_a_function_that_cannot_be_called_is_named_at_parse_time(data, message):
    with pytest.raises(ScenarioError) as info:
        parse(data, "t")
    assert message in str(info.value)


def test_an_unknown_module_is_a_clear_cli_error_not_a_traceback(tmp_path):
    path = tmp_path / "team.yaml"
    path.write_text(yaml.safe_dump(_fault_of(_python("cut_nothing") | {"module": "team.faults"})))
    result = run_cli("run", str(path), "--out", str(tmp_path))
    assert result.returncode == 2
    assert "cannot import module 'team.faults'" in result.stderr
    assert "Traceback" not in result.stderr
    assert not [p for p in tmp_path.iterdir() if p.is_dir()]  # refused before any run began


# -- the Chaos Toolkit form ---------------------------------------------------------------------

PASSES = {"type": "regex", "target": "verdict", "pattern": "^(pass|off)$"}


def _ext(func, **arguments):
    return {
        "type": "python",
        "module": "harness.chaostoolkit",
        "func": func,
        "arguments": arguments,
    }


SHORTHAND = {
    "title": "both",
    "description": "every kind of step",
    "configuration": {"timeout_s": 60},
    "steady-state-hypothesis": {
        "title": "held",
        "probes": [
            {"name": "effectively_once", "tolerance": {"max_duplicated": 0}},
            {"name": "fail_closed"},
            {"name": "team", "provider": _python("share_of_nothing"), "tolerance": [0.5, 1]},
        ],
    },
    "method": [
        {"type": "load", "name": "burst", "regular_posts": 2, "celebrity_posts": 1, "spread_s": 4},
        {"type": "fault", "name": "dedup-outage", "offset_s": 2, "duration_s": 5},
        {
            "type": "fault",
            "name": "apns-status",
            "offset_s": 3,
            "duration_s": 4,
            "params": {"p": 0.5, "status": 429},
        },
        {
            "type": "fault",
            "name": "cut",
            "offset_s": 1,
            "duration_s": 2,
            "provider": _python("cut_nothing", seconds=3),
        },
        {"type": "action", "name": "redrive-dlq", "offset_s": 20},
        {"type": "action", "name": "say", "offset_s": 5, "provider": _python("note", label="hi")},
    ],
    "rollbacks": [{"type": "action", "name": "redrive-dlq"}],
}

CHAOS_TOOLKIT = {
    "title": "both",
    "description": "every kind of step",
    "runtime": {
        "hypothesis": {"strategy": "after-method-only"},
        "rollbacks": {"strategy": "always"},
    },
    "controls": [
        {
            "name": "fanout-harness",
            "provider": {"type": "python", "module": "harness.chaostoolkit.control"},
        }
    ],
    "configuration": {"timeout_s": 60},
    "steady-state-hypothesis": {
        "title": "held",
        "probes": [
            {
                "type": "probe",
                "name": "effectively_once",
                "tolerance": PASSES,
                "provider": _ext(
                    "verdict", name="effectively_once", tolerance={"max_duplicated": 0}
                ),
            },
            {
                "type": "probe",
                "name": "fail_closed",
                "tolerance": PASSES,
                "provider": _ext("verdict", name="fail_closed"),
            },
            {
                "type": "probe",
                "name": "team",
                "tolerance": PASSES,
                "provider": _ext(
                    "verdict", name="team", provider=_python("share_of_nothing"), tolerance=[0.5, 1]
                ),
            },
        ],
    },
    "method": [
        {
            "type": "action",
            "name": "burst",
            "provider": _ext("load", regular_posts=2, celebrity_posts=1, spread_s=4),
        },
        {
            "type": "action",
            "name": "outage",
            "provider": _ext("fault", name="dedup-outage", offset_s=2, duration_s=5),
        },
        {
            "type": "action",
            "name": "429s",
            "provider": _ext(
                "fault",
                name="apns-status",
                offset_s=3,
                duration_s=4,
                params={"p": 0.5, "status": 429},
            ),
        },
        {
            "type": "action",
            "name": "cut",
            "provider": _ext(
                "fault",
                name="cut",
                offset_s=1,
                duration_s=2,
                provider=_python("cut_nothing", seconds=3),
            ),
        },
        {
            "type": "action",
            "name": "redrive",
            "provider": _ext("action", name="redrive-dlq", offset_s=20),
        },
        {
            "type": "action",
            "name": "say",
            "provider": _ext(
                "action", name="say", offset_s=5, provider=_python("note", label="hi")
            ),
        },
    ],
    "rollbacks": [
        {"type": "action", "name": "redrive", "provider": _ext("rollback", name="redrive-dlq")},
        {
            "type": "action",
            "name": "stop",
            "provider": {"type": "python", "module": "harness.chaostoolkit", "func": "stop"},
        },
    ],
}


def test_the_chaos_toolkit_form_means_what_the_shorthand_means():
    assert parse(CHAOS_TOOLKIT, "t") == parse(SHORTHAND, "t")


def _changed(path, value):
    data = copy.deepcopy(CHAOS_TOOLKIT)
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return data


PROBE0 = ("steady-state-hypothesis", "probes", 0)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            _changed((*PROBE0, "tolerance"), True),
            "tolerance must accept a passing or switched-off verdict and refuse a failing or unknown one",
        ),
        (
            _changed(
                (*PROBE0, "tolerance"),
                {"type": "regex", "target": "verdict", "pattern": "pass|unknown"},
            ),
            "refuse a failing or unknown one",
        ),
        (_changed((*PROBE0, "type"), "action"), "a steady-state probe has type: probe"),
        (
            _changed(("method", 1, "pauses"), {"before": 3}),
            "unknown key(s) pauses (a step's timing is its arguments' offset_s)",
        ),
        (_changed(("method", 1, "background"), True), "unknown key(s) background"),
        (
            _changed(("method", 1, "provider", "func"), "explode"),
            "harness.chaostoolkit.explode is not a step here",
        ),
        (
            _changed(("method", 1, "provider", "func"), "rollback"),
            "harness.chaostoolkit.rollback is not a step here",
        ),
        (
            _changed(("method", 1, "type"), "probe"),
            "a step of the harness is a Chaos Toolkit action",
        ),
        (
            _changed(("method", 1, "provider", "arguments", "offset"), 3),
            "method[1]: unknown key(s) offset",
        ),
        (
            _changed(("rollbacks", 1, "provider", "arguments"), {"now": True}),
            "stop takes no arguments",
        ),
    ],
)
def test_chaos_toolkit_form_mistakes_are_named(data, message):
    with pytest.raises(ScenarioError) as info:
        parse(data, "t")
    assert message in str(info.value)


def test_every_shipped_scenario_is_a_chaos_toolkit_experiment():
    """``chaos validate`` would say so (chaostoolkit-lib imports the extension and binds every
    activity's arguments); and every step is an activity, so ``chaos run`` runs them all."""
    from chaoslib.caching import clear_cache
    from chaoslib.experiment import ensure_experiment_is_valid

    for path in sorted(SCENARIO_DIR.glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        ensure_experiment_is_valid(data)
        clear_cache()
        activities = data["steady-state-hypothesis"]["probes"] + data["method"] + data["rollbacks"]
        for activity in activities:
            assert activity["type"] in ("probe", "action"), (path.name, activity)
            assert activity["provider"]["module"] == "harness.chaostoolkit", (path.name, activity)
        assert data["runtime"]["hypothesis"]["strategy"] == "after-method-only", path.name
        assert data["rollbacks"][-1]["provider"]["func"] == "stop", path.name
        assert parse(data, path.stem) == scenarios.get(path.stem)


def test_the_harness_reads_a_scenario_with_chaos_toolkit_keys_it_does_not_use():
    # Chaos Toolkit's own keys (version, tags, secrets, extensions) change nothing for the run.
    extra = {
        **CHAOS_TOOLKIT,
        "version": "1.0.0",
        "tags": ["fanout"],
        "secrets": {},
        "extensions": [],
    }
    assert parse(extra, "t") == parse(CHAOS_TOOLKIT, "t")


# -- push transports ------------------------------------------------------------------------
# docs/PROMISES.md "Push transports": per checker, whether a verdict can be judged on both push
# paths (SNS mobile push and straight to APNs/FCM) and which shipped scenarios judge it on each.

TRANSPORTS = ("sns", "direct")
# Checkers whose promise both paths could judge but that no shipped scenario judges on direct
# yet (each named, with why, in the doc's table). Closing one means removing it here.
TRANSPORT_GAPS: frozenset[str] = frozenset()


def _probed_by_transport() -> dict[str, dict[str, list[str]]]:
    """checker -> transport -> the shipped scenarios that probe it on that transport."""
    from harness.stack.reference import DEFAULT_PUSH_TRANSPORT

    probed: dict[str, dict[str, list[str]]] = {}
    for name in scenarios.known():
        scenario = scenarios.get(name)
        transport = scenario.reference.get("push_transport", DEFAULT_PUSH_TRANSPORT)
        for probe in scenario.probes:
            probed.setdefault(probe.name, {t: [] for t in TRANSPORTS})[transport].append(name)
    return probed


def _transport_table() -> dict[str, dict[str, str]]:
    """The rows of docs/PROMISES.md's "Push transports" table, by checker."""
    text = (SCENARIO_DIR.parent / "docs" / "PROMISES.md").read_text()
    section = text.split("\n## Push transports\n", 1)[1].split("\n## ", 1)[0]
    columns = ("evidence", "can", "judged", "sns", "direct", "why")
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 7 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = dict(zip(columns, cells[1:], strict=True))
    return rows


def test_every_promise_judgeable_on_both_push_transports_is_judged_on_both():
    """From the scenario files alone: each checker the table says both paths can judge is
    probed by a shipped scenario that sends through SNS and by one that sends direct (the
    named gaps excepted, and those must still be gaps)."""
    from harness.checkers import registry

    table = _transport_table()
    assert set(table) == set(registry.known())
    probed = _probed_by_transport()
    for checker, row in table.items():
        assert row["can"] in ("both", "either", *TRANSPORTS), (checker, row["can"])
        on = probed.get(checker, {t: [] for t in TRANSPORTS})
        missing = [t for t in TRANSPORTS if not on[t]]
        if row["can"] in TRANSPORTS:  # only that path meets what it judges (the why says so)
            assert on[row["can"]], f"{checker}: not probed on {row['can']}, the one path it has"
        elif row["can"] == "either":
            assert len(missing) < 2, f"{checker}: no shipped scenario probes it"
        elif checker in TRANSPORT_GAPS:
            assert missing, f"{checker} is judged on both now: drop it from TRANSPORT_GAPS"
            assert row["why"].startswith("gap"), checker
        else:
            assert not missing, f"{checker} is not judged on {missing} by any shipped scenario"


def test_the_transport_table_names_the_scenarios_that_judge_each_checker():
    """The doc's columns are the scenario files' truth: which shipped scenarios probe each
    checker through SNS and direct, and so on which path it is judged."""
    probed = _probed_by_transport()
    for checker, row in _transport_table().items():
        on = probed.get(checker, {t: [] for t in TRANSPORTS})
        for transport in TRANSPORTS:
            assert row[transport] == (", ".join(on[transport]) or "—"), (checker, transport)
        judged = [t for t in TRANSPORTS if on[t]]
        assert row["judged"] == ("both" if len(judged) == 2 else judged[0]), checker
