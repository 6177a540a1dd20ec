"""The synthetic population: seeded, and its quiet windows really are what they claim."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from harness.model.population import Population, PopulationSpec, generate

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


def test_followers_who_never_registered_hold_no_record_and_expect_nothing():
    spec = PopulationSpec(
        tenants=1, users_per_tenant=2001, celebrity_followers=2000, push_enabled_fraction=0.2
    )
    population = generate(9, START, spec)
    celebrity = next(a for a in population.authors if a.celebrity)
    assert len(celebrity.followers) == 2000  # everyone still follows
    assert 300 < len(population.users) < 500  # ~20% hold a record
    lurker = next(f for f in celebrity.followers if f not in {u.user_id for u in population.users})
    user = population.user("tenant-0", lurker)
    assert user.consent is None and user.email is None and not user.online
    assert population.devices_of("tenant-0", lurker) == []
    # At 1.0 the records are drawn exactly as before the fraction existed.
    full = generate(
        9, START, PopulationSpec(tenants=1, users_per_tenant=50, celebrity_followers=20)
    )
    assert len(full.users) == 50
    with pytest.raises(KeyError):
        full.user("tenant-0", "nobody")
    with pytest.raises(ValueError):
        generate(9, START, PopulationSpec(push_enabled_fraction=1.5))


def test_the_oracle_expects_no_push_for_a_follower_without_a_record():
    import pandas as pd

    from harness.model.oracle import expected_deliveries

    spec = PopulationSpec(
        tenants=1, users_per_tenant=401, celebrity_followers=400, push_enabled_fraction=0.25
    )
    population = generate(4, START, spec)
    celebrity = next(a for a in population.authors if a.celebrity)
    injected = pd.DataFrame(
        [{"tenant_id": "tenant-0", "author_id": celebrity.user_id, "notification_id": "n1"}]
    )
    expected = expected_deliveries(population, injected)
    registered = {u.user_id for u in population.users}
    assert set(expected.deliveries["user_id"]) <= registered
    lurkers = sum(1 for f in celebrity.followers if f not in registered)
    assert expected.suppressed["no_device"] >= lurkers


def test_each_author_follower_list_loads_as_one_ordered_chain():
    from harness.contract.driver import FanoutApiDriver
    from harness.load.loader import _follower_calls

    spec = PopulationSpec(tenants=2, users_per_tenant=25_100, celebrity_followers=25_000)
    population = generate(2, START, spec)
    driver = FanoutApiDriver()
    chains = _follower_calls(population, driver)
    assert len(chains) == len(population.authors)
    for author, chain in zip(population.authors, chains, strict=True):
        sent = [f for call in chain for f in call.body["followers"]]
        assert sent == list(author.followers)
        assert all(len(c.body["followers"]) <= driver.followers_per_call for c in chain)
    assert max(len(chain) for chain in chains) == 3  # 25,000 followers: 10,000 a call


def test_a_celebrity_loaded_a_few_followers_a_call_and_its_latest_followers():
    # gdpr-erasure loads 10 a call, so a system's celebrity threshold is crossed part way and
    # the users it erases (the last followers loaded) followed an author already above it.
    from harness.contract.driver import FanoutApiDriver
    from harness.load.loader import _follower_calls
    from harness.run.actions import latest_followers

    spec = PopulationSpec(tenants=1, users_per_tenant=120, celebrity_followers=60,
                          followers_per_call=10)  # fmt: skip
    population = generate(2, START, spec)
    celebrity = next(a for a in population.authors if a.celebrity)
    [chain] = [c for a, c in zip(population.authors, _follower_calls(population,
               FanoutApiDriver()), strict=True) if a is celebrity]  # fmt: skip
    assert [len(c.body["followers"]) for c in chain] == [10] * 6
    assert [f for c in chain for f in c.body["followers"]] == list(celebrity.followers)
    late = latest_followers([celebrity], 0.1)
    assert late == {("tenant-0", f) for f in celebrity.followers[-6:]}
    assert spec.problem() is None
    assert PopulationSpec(followers_per_call=-1).problem() is not None


def test_a_moved_clock_places_windows_in_system_time_and_states_instants_in_real_time():
    """The system's clock 17 h ahead: its windows are the wall-clock times it reads, and each
    ends, on its clock, at the real instant the population states plus the offset."""
    from harness.model import local_time

    start = datetime(2026, 11, 25, 7, 0, tzinfo=UTC)
    offset = 17 * 3600 + 7
    plain = generate(3, start)
    moved = generate(3, start, clock_offset_s=offset)
    ending = [u for u in moved.users if u.quiet_state == "ends_during_run"]
    assert ending
    for user, same in zip(moved.users, plain.users, strict=True):
        assert user.quiet_until == same.quiet_until  # a real instant either way
        if user.quiet_state == "ends_during_run":
            shown = start.timestamp() + 1 + offset
            assert local_time.window_end(user.quiet_hours, user.zone, shown) == (
                user.quiet_until + offset
            )
        if user.quiet_state == "whole_run":
            assert local_time.inside(user.quiet_hours, user.zone, start.timestamp() + offset)
    assert any(
        u.quiet_hours != p.quiet_hours for u, p in zip(moved.users, plain.users, strict=True)
    )


def test_warm_reads_follow_an_authors_first_follow_call():
    """Red team 3: read-side loads the celebrity ten followers a call and the first ten read
    their inbox right after the first call, before the author crosses the threshold (the
    reference's is 50): a cache of what they follow then predates the crossing."""
    from harness.contract.driver import FanoutApiDriver
    from harness.load.loader import _follower_calls

    spec = PopulationSpec(tenants=1, users_per_tenant=120, celebrity_followers=60,
                          followers_per_call=10, warm_reads_while_following=4)  # fmt: skip
    population = generate(2, START, spec)
    celebrity = next(a for a in population.authors if a.celebrity)
    [chain] = [c for a, c in zip(population.authors, _follower_calls(population,
               FanoutApiDriver()), strict=True) if a is celebrity]  # fmt: skip
    kinds = ["follow" if c.method == "POST" else "read" for c in chain]
    assert kinds == ["follow", "read", "read", "read", "read"] + ["follow"] * 5
    reads = [c.path for c in chain if c.method == "GET"]
    assert all(c.query == {"limit": "1"} for c in chain if c.method == "GET")
    assert [r.rsplit("/", 2)[-2] for r in reads] == list(celebrity.followers[:4])
    follows = [f for c in chain if c.method == "POST" for f in c.body["followers"]]
    assert follows == list(celebrity.followers)
    # Off by default, and an author loaded in one call gets none either.
    plain = generate(2, START, PopulationSpec(tenants=1, users_per_tenant=120,
                                              celebrity_followers=60, followers_per_call=10))  # fmt: skip
    assert all(c.method == "POST" for chain in _follower_calls(plain, FanoutApiDriver())
               for c in chain)  # fmt: skip
