"""Scenario files: every shipped one parses; mistakes are named precisely."""

from __future__ import annotations

import pytest
import yaml
from conftest import run_cli

from harness.model import scenarios
from harness.model.scenarios import ScenarioError, parse

SHIPPED = (
    "smoke",
    "memorydb-outage",
    "memorydb-outage-fallback",
    "apns-429-storm",
    "sqs-redelivery",
    "consumer-crash",
    "dedup-failover",
    "dedup-failover-volatile",
    "tenant-collision",
)


def test_every_shipped_scenario_parses():
    assert set(SHIPPED) <= set(scenarios.known())
    for name in SHIPPED:
        scenario = scenarios.get(name)
        assert scenario.probes, name
        assert scenario.description, name


def test_chaos_scenarios_schedule_the_faults_they_are_named_for():
    assert {f.name for f in scenarios.get("memorydb-outage").faults} == {"dedup-outage"}
    assert scenarios.get("memorydb-outage-fallback").reference["dedup_fallback"] is True
    assert "apns-status" in {f.name for f in scenarios.get("apns-429-storm").faults}
    assert scenarios.get("dedup-failover").durable_redis is True
    assert scenarios.get("dedup-failover-volatile").durable_redis is False


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
        ({"method": [{"type": "locust", "locustfile": "tsunami"}]}, "unknown locustfile 'tsunami'"),
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


def test_scale_grows_every_count_together():
    from harness.model.scenarios import get, scaled

    base = get("game-day")
    big = scaled(base, 3)
    assert big.population.users_per_tenant == 3 * base.population.users_per_tenant
    assert big.population.celebrity_followers == 3 * base.population.celebrity_followers
    assert big.population.regular_authors == 3 * base.population.regular_authors
    assert big.locust.plan["background_users"] == 3 * base.locust.plan["background_users"]
    assert big.locust.plan["celebrities"] == 3 * base.locust.plan["celebrities"]
    assert big.faults == base.faults and big.probes == base.probes
    small = scaled(base, 0.01)
    assert small.population.users_per_tenant > small.population.celebrity_followers >= 1
    with pytest.raises(ScenarioError, match="positive"):
        scaled(base, 0)
