"""The checker registry: every checker registers itself, tolerances are validated against the
registered defaults, and a checker that crashes or cannot judge reports unknown, never pass."""

from __future__ import annotations

import pandas as pd
import pytest

from harness.checkers import Evidence, Verdict, checker, registry, run_probe
from harness.checkers.verdict import SWITCHED_OFF, result_status, switched_off
from harness.model.history import to_frame
from harness.model.oracle import Expectation, expected_deliveries
from harness.model.population import PopulationSpec, generate
from harness.model.scenarios import ScenarioError, parse
from harness.run.runner import overall_verdict

BUILT_IN = {
    "audit_complete",
    "audit_per_copy",
    "backpressure",
    "channel_delivery",
    "consent",
    "dead_tokens",
    "dlq_accountability",
    "effectively_once",
    "fail_closed",
    "push_order",
    "push_attributes",
    "quiet_hours",
    "rate_limit",
    "tenant_isolation",
}


def _evidence() -> Evidence:
    from datetime import UTC, datetime

    population = generate(1, datetime(2026, 11, 24, 12, tzinfo=UTC), PopulationSpec())
    injected = pd.DataFrame(columns=["tenant_id", "author_id", "notification_id"])
    return Evidence(population, expected_deliveries(population, injected), to_frame([]))


def test_every_built_in_checker_is_registered_with_a_summary():
    assert BUILT_IN <= set(registry.known())
    for name in registry.known():
        spec = registry.get(name)
        assert spec.summary and spec.name == name


def test_unknown_checker_names_the_known_ones():
    with pytest.raises(KeyError, match="effectively_once"):
        registry.get("vibes")


def test_a_scenario_with_an_unknown_tolerance_is_refused():
    data = {
        "title": "t",
        "steady-state-hypothesis": {
            "probes": [{"name": "effectively_once", "tolerance": {"max_lsot": 3}}]
        },
        "method": [{"type": "load"}],
    }
    with pytest.raises(ScenarioError, match=r"unknown tolerance\(s\) max_lsot; allowed: "):
        parse(data, "t")


def test_tolerance_defaults_come_from_the_registry():
    defaults = {"release_bound_s": 30.0, "recovery_s": 30.0}
    assert registry.tolerance_for("quiet_hours", {}) == defaults
    assert registry.tolerance_for("quiet_hours", {"release_bound_s": 5}) == {
        **defaults,
        "release_bound_s": 5,
    }


def test_a_crashing_checker_reports_unknown_never_pass():
    @checker("test_crashes", summary="always raises")
    def probe(evidence, tolerance):
        raise RuntimeError("boom")

    try:
        verdict = run_probe("test_crashes", {}, _evidence())
        assert verdict.valid is None and verdict.status == "unknown"
        assert "RuntimeError: boom" in verdict.details["unknown"]
        assert overall_verdict([Verdict("a", True), verdict], None) == "unknown"
    finally:
        registry._REGISTRY.pop("test_crashes")


def test_a_checker_needing_what_the_target_lacks_is_switched_off_and_says_why():
    verdict = run_probe("audit_complete", {}, _evidence(), capabilities=frozenset())
    assert verdict.valid is None and verdict.status == "off" and not verdict.applies
    assert "not available on this target: it has no audit_trail" in verdict.details[SWITCHED_OFF]
    assert result_status(verdict.to_dict()) == "off"
    # The same checker on a system that has the trail is judged (here: nothing to judge).
    judged = run_probe("audit_complete", {}, _evidence(), capabilities=frozenset({"audit_trail"}))
    assert judged.applies and judged.status != "off"


def test_overall_verdict():
    ok, bad, unknown = Verdict("a", True), Verdict("b", False), Verdict("c", None)
    assert overall_verdict([ok], None) == "pass"
    assert overall_verdict([ok, unknown, bad], None) == "fail"
    assert overall_verdict([ok, unknown], None) == "unknown"
    assert overall_verdict([ok], "stack died") == "fail"
    assert overall_verdict([], None) == "fail"


def test_switched_off_checkers_neither_pass_nor_fail_a_run():
    ok, bad = Verdict("a", True), Verdict("b", False)
    off = switched_off("c", "not available on this target: it has no audit_trail")
    assert overall_verdict([ok, off], None) == "pass"
    assert overall_verdict([bad, off], None) == "fail"
    # A run whose every checker was switched off proved nothing: never a pass.
    assert overall_verdict([off], None) == "unknown"
    assert overall_verdict([off, off], "stack died") == "fail"


def test_an_empty_history_passes_the_checkers_that_need_nothing():
    evidence = _evidence()
    verdict = run_probe("effectively_once", {}, evidence)
    assert verdict.valid is True and isinstance(evidence.expectation, Expectation)


def test_the_worked_example_in_extending_md_is_a_working_checker():
    """docs/EXTENDING.md's checker, exactly as printed, registers itself and judges a history."""
    import re
    import types
    from pathlib import Path

    from harness.model.history import History

    text = (Path(__file__).resolve().parents[1] / "docs" / "EXTENDING.md").read_text()
    source = re.search(r"```python\n(# harness/checkers/no_night_sends.py.*?)```", text, re.S)
    assert source is not None
    module = types.ModuleType("harness.checkers.no_night_sends")
    try:
        exec(compile(source.group(1), "EXTENDING.md", "exec"), module.__dict__)
        evidence = _evidence()
        device = evidence.population.devices[0]
        zone = next(u.zone for u in evidence.population.users if u.user_id == device.user_id)
        from datetime import datetime
        from zoneinfo import ZoneInfo

        night = datetime(2026, 11, 25, 3, 0, tzinfo=ZoneInfo(zone)).timestamp()
        history = History()
        history.extend_provider([{"received_at": night, "tenant_id": device.tenant_id,
                                  "notification_id": "n", "token": device.token,
                                  "provider": "apns", "project": None, "status": 200,
                                  "reason": None}])  # fmt: skip
        night_evidence = Evidence(evidence.population, evidence.expectation, history.frame())
        verdict = run_probe("no_night_sends", {}, night_evidence)
        assert verdict.valid is False and verdict.counts == {"night_sends": 1}
        assert run_probe("no_night_sends", {}, evidence).valid is True
    finally:
        registry._REGISTRY.pop("no_night_sends", None)
