"""The synthetic population: seeded, and its quiet windows really are what they claim."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from harness.population import Population, PopulationSpec, generate

START = datetime(2026, 11, 22, 12, 0, 7, tzinfo=UTC)


def _inside(instant: datetime, zone: str, window: dict[str, str]) -> bool:
    """An independent check: compare local wall-clock strings (HH:MM:SS sorts as time)."""
    local = instant.astimezone(ZoneInfo(zone)).strftime("%H:%M:%S")
    start, end = window["start"], window["end"]
    if start <= end:
        return start <= local < end
    return local >= start or local < end


def test_same_seed_same_population_other_seed_differs():
    a = generate(5, START).to_dict()
    assert a == generate(5, START).to_dict()
    assert a != generate(6, START).to_dict()


def test_round_trip_through_json(tmp_path):
    population = generate(5, START)
    population.save(tmp_path / "p.json")
    assert Population.load(tmp_path / "p.json").to_dict() == population.to_dict()


def test_every_case_the_run_needs_is_present():
    population = generate(3, START)
    states = {u.quiet_state for u in population.users}
    assert states == {"none", "outside", "ends_during_run", "whole_run"}
    assert any(u.consent is None for u in population.users)
    assert any(d.dead for d in population.devices)
    assert {d.platform for d in population.devices} == {"apns", "fcm"}
    assert any(a.celebrity for a in population.authors)
    zones = {u.zone for u in population.users}
    assert {"Asia/Kathmandu", "Asia/Kolkata"} <= zones
    # Both tenants reuse the same user ids: isolation has to come from the tenant prefix.
    ids = {
        t: {u.user_id for u in population.users if u.tenant_id == t}
        for t in ("tenant-0", "tenant-1")
    }
    assert ids["tenant-0"] == ids["tenant-1"]


def test_quiet_windows_match_their_labels():
    spec = PopulationSpec(quiet_release_seconds=20)
    population = generate(9, START, spec)
    for user in population.users:
        if user.quiet_state == "none":
            assert user.quiet_hours is None
            continue
        window = user.quiet_hours
        assert window is not None
        inside_now = _inside(START, user.zone, window)
        if user.quiet_state == "outside":
            assert not inside_now
            assert not _inside(START + timedelta(minutes=30), user.zone, window)
        elif user.quiet_state == "whole_run":
            assert inside_now and _inside(START + timedelta(hours=2), user.zone, window)
        else:
            assert inside_now, user
            assert user.quiet_until == pytest.approx(START.timestamp() + 20, abs=1)
            until = datetime.fromtimestamp(user.quiet_until, UTC)
            assert _inside(until - timedelta(seconds=1), user.zone, window)
            assert not _inside(until, user.zone, window)


def test_bad_spec_and_naive_start_are_refused():
    with pytest.raises(ValueError, match="timezone-aware"):
        generate(1, datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="celebrity_followers"):
        generate(1, START, PopulationSpec(users_per_tenant=10, celebrity_followers=10))
