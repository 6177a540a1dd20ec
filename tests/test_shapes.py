"""Load plans (pure): users over time, when celebrities post, bad plans named."""

from __future__ import annotations

import pytest

from harness.model.shapes import (
    LoadPlan,
    PlanError,
    celebrity_post_times,
    like_times,
    max_events,
    users_at,
)


def test_steady_state_is_flat_then_ends():
    plan = LoadPlan.from_mapping({"shape": "steady_state", "duration_s": 10, "background_users": 7})
    assert [users_at(plan, t) for t in (0, 3, 9.9)] == [7, 7, 7]
    assert users_at(plan, 10) is None


def test_celebrity_burst_adds_one_fixed_user_per_celebrity():
    plan = LoadPlan.from_mapping(
        {"shape": "celebrity_burst", "background_users": 4, "celebrities": 3, "duration_s": 20}
    )
    assert users_at(plan, 0) == 7
    times = celebrity_post_times(plan)
    assert len(times) == 3 and all(len(t) == 1 for t in times)
    flat = sorted(t for user in times for t in user)
    assert flat[0] == plan.burst_at_s and flat[-1] == plan.burst_at_s + plan.burst_window_s


def test_posts_per_celebrity_share_the_window_round_robin():
    plan = LoadPlan.from_mapping(
        {"celebrities": 2, "posts_per_celebrity": 3, "burst_at_s": 2, "burst_window_s": 10}
    )
    first, second = celebrity_post_times(plan)
    assert len(first) == len(second) == 3
    assert first == sorted(first) and first[0] < second[0] < first[1]
    assert all(2 <= t <= 12 for t in first + second)


def test_game_day_doubles_the_background_after_the_burst():
    plan = LoadPlan.from_mapping(
        {"shape": "game_day", "background_users": 5, "celebrities": 1, "after_burst_factor": 2}
    )
    before = users_at(plan, plan.burst_at_s)
    after = users_at(plan, plan.burst_at_s + plan.burst_window_s)
    assert before == 6 and after == 11


def test_like_storm_spreads_its_likes_over_the_window():
    plan = LoadPlan.from_mapping({"shape": "like_storm"})
    times = like_times(plan)
    assert len(times) == 500
    assert times[0] == plan.burst_at_s and times[-1] == plan.burst_at_s + 60
    assert users_at(plan, 0) == plan.background_users + 1


def test_every_plan_is_bounded_in_events():
    plan = LoadPlan.from_mapping({"background_users": 10, "author_rate": 2, "duration_s": 30})
    assert max_events(plan) >= 10 * 2 * 30
    assert max_events(plan) < 10 * 2 * 30 + 100


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"shape": "tsunami"}, "unknown shape 'tsunami'"),
        ({"followers": 10}, "unknown load parameter(s) followers"),
        ({"duration_s": 0}, "duration_s must be positive"),
        ({"celebrities": -1}, "celebrities must not be negative"),
        ({"burst_at_s": 50, "duration_s": 30}, "after the run"),
        ({"weights": {"Lurker": 1}}, "unknown user class(es) in weights: Lurker"),
    ],
)
def test_bad_plans_are_named(values, message):
    with pytest.raises(PlanError, match=None) as caught:
        LoadPlan.from_mapping(values)
    assert message in str(caught.value)


def test_a_plan_survives_json():
    plan = LoadPlan.from_mapping({"shape": "game_day", "celebrities": 4})
    assert LoadPlan.from_json(plan.to_json()) == plan
