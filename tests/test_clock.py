"""The clock the harness moves (harness/contract/clock.py): libfaketime really shifts a child
process's wall clock and leaves its monotonic clock alone, re-reads the offset file; the offset
aims a zone's midnight; the run records it; a system that cannot move its clock does not fit a
scenario that needs it (the run ends "unknown", never "pass")."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from harness.checkers.verdict import Verdict
from harness.contract.clock import (
    SystemClock,
    faked_environment,
    faketime_library,
    midnight_at,
    offset_of,
    offset_to_midnight,
    phase_detail,
    summary,
)
from harness.contract.driver import FanoutApiDriver
from harness.contract.system import SystemContract
from harness.model.history import History
from harness.model.scenarios import ScenarioError, get, parse
from harness.run.runner import ScenarioDoesNotFit, _require_fit, boundary_crossed, overall_verdict
from harness.stack.target import parse as parse_target

LIBRARY = faketime_library()
needs_faketime = pytest.mark.skipif(LIBRARY is None, reason="libfaketime is not installed")

_PROBE = (
    "import time, json; "
    "print(json.dumps([time.time(), time.monotonic(), __import__('datetime').datetime.now("
    "__import__('datetime').UTC).timestamp()]), flush=True)"
)


def _read_child(env: dict[str, str]) -> tuple[float, float, float, float, float]:
    """(child wall, child monotonic, child datetime.now, our wall, our monotonic) at once."""
    before_wall, before_mono = time.time(), time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    wall, mono, now = json.loads(out.stdout)
    return wall, mono, now, before_wall, before_mono


@needs_faketime
def test_libfaketime_moves_a_child_wall_clock_not_its_monotonic_and_rereads_the_file(tmp_path):
    assert LIBRARY is not None
    rc = tmp_path / "faketimerc"
    clock = SystemClock(rc)
    clock.set_offset(50_000)
    assert rc.read_text() == "+50000s\n"
    env = faked_environment({"PATH": "/usr/bin:/bin"}, rc, LIBRARY)
    wall, mono, now, our_wall, our_mono = _read_child(env)
    assert 50_000 - 1 < wall - our_wall < 50_000 + 10
    assert 50_000 - 1 < now - our_wall < 50_000 + 10  # datetime.now reads the same clock
    assert 0 <= mono - our_mono < 10  # monotonic runs true: timeouts and sleeps unchanged
    # A process already running sees a new offset within the cache duration (1 s).
    script = (
        "import time, sys\n"
        "deadline = time.monotonic() + 20\n"
        "while time.monotonic() < deadline:\n"
        "    if time.time() - float(sys.argv[1]) > 200_000: print('moved', flush=True); break\n"
        "    time.sleep(0.1)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(time.time() + 60)],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(0.5)
        clock.set_offset(250_000)
        assert child.communicate(timeout=30)[0].strip() == "moved"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=5)


def test_the_offset_is_whole_forward_seconds():
    with pytest.raises(ValueError):
        SystemClock(Path("/nonexistent/rc")).set_offset(-1)


@pytest.mark.parametrize(
    "zone", ["UTC", "Asia/Kolkata", "Asia/Kathmandu", "Pacific/Chatham", "America/St_Johns"]
)
@pytest.mark.parametrize(
    "aim",
    [
        datetime(2026, 11, 25, 7, 0, 30, 250_000, tzinfo=UTC).timestamp(),
        # New York's autumn DST day (25 hours) and the hour before a midnight.
        datetime(2026, 11, 1, 3, 59, 59, tzinfo=UTC).timestamp(),
        datetime(2026, 3, 28, 23, 0, 0, tzinfo=UTC).timestamp(),
    ],
)
def test_the_offset_makes_the_system_clock_show_the_zones_next_midnight(zone, aim):
    offset = offset_to_midnight(aim, zone)
    assert 0 <= offset < 36 * 3600
    boundary = midnight_at(offset, aim, zone)
    assert aim - 1 < boundary <= aim  # within a second before the instant aimed at
    shown = datetime.fromtimestamp(boundary + offset, ZoneInfo(zone))
    assert (shown.hour, shown.minute, shown.second, shown.microsecond) == (0, 0, 0, 0)


def test_the_run_records_its_clock_and_the_summary_says_where_the_boundary_fell():
    history = History()
    history.append("phase", time=100.0, detail=json.dumps({"stack_up": {}}))
    assert offset_of(history.frame()) == 0.0 and summary(history.frame()) is None
    history.append("phase", time=101.0, detail=phase_detail(3600, "UTC", 200.0))
    for at in (150.0, 199.0, 200.0, 250.0, 260.0):
        history.append("inject", time=at, tenant_id="t", notification_id=f"n{at}")
    assert offset_of(history.frame()) == 3600.0
    said = summary(history.frame())
    assert said is not None
    assert (said["injected_before"], said["injected_after"]) == (2, 3)
    assert said["system_shows"] == "1970-01-01T01:03:20+00:00"


def test_a_run_whose_load_did_not_cross_the_midnight_is_unknown_not_a_pass():
    """Every event after the system's midnight (a storm started late): no calendar promise was
    exercised, so the run cannot pass on it."""
    history = History()
    assert boundary_crossed(history.frame()) is None  # the clock was not moved
    history.append("phase", time=101.0, detail=phase_detail(3600, "UTC", 200.0))
    for at in (210.0, 250.0):
        history.append("inject", time=at, tenant_id="t", notification_id=f"n{at}")
    verdict = boundary_crossed(history.frame())
    assert verdict is not None and verdict.valid is None and verdict.applies
    assert verdict.counts == {"injected_before": 0, "injected_after": 2}
    assert overall_verdict([Verdict("rate_limit", True), verdict], None) == "unknown"
    history.append("inject", time=199.0, tenant_id="t", notification_id="early")
    assert boundary_crossed(history.frame()) is None


def test_a_scenario_names_its_midnight_in_an_iana_zone():
    shipped = get("day-boundary")
    assert shipped.clock is not None and shipped.clock.midnight == "UTC"
    data = {
        "configuration": {"clock": {"midnight": "Mars/Olympus_Mons"}},
        "steady-state-hypothesis": {"probes": [{"name": "rate_limit"}]},
    }
    with pytest.raises(ScenarioError, match="IANA zone"):
        parse(data, "x")
    data["configuration"]["clock"] = {"at_s": -1}
    with pytest.raises(ScenarioError, match="at_s"):
        parse(data, "x")


def test_a_system_without_a_movable_clock_does_not_fit_a_scenario_that_moves_it():
    """Before any load: the run then ends "unknown" with this reason (runner: DOES_NOT_FIT)."""
    scenario = get("day-boundary")
    fixed = SystemContract("fixed", "http://127.0.0.1:1", FanoutApiDriver())
    assert "clock" not in fixed.capabilities()
    with pytest.raises(ScenarioDoesNotFit, match="no clock the harness can move"):
        _require_fit(scenario, fixed, None)  # type: ignore[arg-type]
    movable = SystemContract(
        "movable", "http://127.0.0.1:1", FanoutApiDriver(), clock=SystemClock(Path("rc"))
    )
    assert "clock" in movable.capabilities()
    _require_fit(scenario, movable, None)  # type: ignore[arg-type]


def test_a_target_declares_its_clock_by_the_offset_file_its_processes_read():
    good = {
        "name": "t",
        "event_api": "http://127.0.0.1:18080",
        "apns_listen": "127.0.0.1:18443",
        "fcm_listen": "127.0.0.1:18444",
    }
    assert "clock" not in parse_target(good, "t").contract(None).capabilities()
    target = parse_target({**good, "clock_file": "/run/team/faketimerc"}, "t")
    contract = target.contract(None)
    assert "clock" in contract.capabilities()
    assert contract.clock == SystemClock(Path("/run/team/faketimerc"))


def test_the_report_says_where_the_clock_was():
    from harness.report.document import verdict_sentence

    clock = {"offset_s": 60806.0, "midnight": "UTC", "system_shows": "2026-11-26T00:00:00+00:00",
             "injected_before": 32, "injected_after": 28}  # fmt: skip
    passed = {"verdict": "pass", "checkers": {"rate_limit": {"valid": True}}}
    assert "clock" not in verdict_sentence(passed)
    said = verdict_sentence({**passed, "clock": clock})
    assert said.startswith("All 1 checkers passed.")
    assert "60806 s ahead" in said and "32 event(s) injected before it and 28 after" in said
