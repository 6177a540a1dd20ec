"""Load plans: how many users run at each second of a run, and when celebrities post.

Pure functions, no Locust import: the Locust shape (``harness.load.users.PlanShape``) asks
``users_at`` each tick, the celebrity users ask ``celebrity_post_times`` when to post, and the
tests check recorded load against the same functions.

The shapes (issue vocabulary):

* ``steady_state``: a constant background of authors, inbox readers, read-all users and users
  changing their preferences;
* ``celebrity_burst``: that background, then ``celebrities`` post within ``burst_window_s``
  (the seed's scenario: one post, millions of followers, a 60 s delivery SLA);
* ``like_storm``: ``likes`` like events inside ``burst_window_s`` (500 in a minute by default),
  spread over the regular authors, on top of a small background;
* ``game_day``: the celebrity burst with readers opening the app afterwards; the scenario file
  puts the chaos schedule on top.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

SHAPES = ("steady_state", "celebrity_burst", "like_storm", "game_day")

# Background user classes and their default weights (authors generate the oracle's load; the
# others exercise the read and preference paths the design must keep fast during a burst).
DEFAULT_WEIGHTS = {"Author": 4, "InboxReader": 3, "ReadAllUser": 1, "PreferenceChanger": 1}


class PlanError(ValueError):
    """A load plan that cannot run (unknown shape, negative counts, burst after the end)."""


@dataclass(frozen=True)
class LoadPlan:
    shape: str = "celebrity_burst"
    duration_s: float = 30.0
    background_users: int = 8
    spawn_rate: float = 50.0
    # Events per second each Author user injects (Locust's constant_throughput).
    author_rate: float = 0.5
    # Readers and the others pace themselves the same way: one action per user per second.
    reader_rate: float = 1.0
    burst_at_s: float = 5.0
    burst_window_s: float = 5.0
    celebrities: int = 1
    posts_per_celebrity: int = 1
    likes: int = 0
    # After the burst, readers open the app: the background grows by this factor (game day).
    after_burst_factor: float = 1.0
    # Inbox readers walk newest first, ``page_limit`` items a page, up to ``max_pages`` pages
    # by cursor; read-all users then mark up to ``marks_per_visit`` new items read one by one.
    page_limit: int = 20
    max_pages: int = 2
    marks_per_visit: int = 2
    weights: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_WEIGHTS))

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_mapping(cls, values: dict[str, Any]) -> LoadPlan:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise PlanError(
                f"unknown load parameter(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        shape = values.get("shape", "celebrity_burst")
        if shape not in SHAPES:
            raise PlanError(f"unknown shape {shape!r}; shapes: {', '.join(SHAPES)}")
        base = preset(shape)
        plan = replace(base, **values)
        validate(plan)
        return plan

    @classmethod
    def from_json(cls, text: str) -> LoadPlan:
        return cls.from_mapping(json.loads(text))

    @property
    def celebrity_users(self) -> int:
        return self.celebrities if self.shape in ("celebrity_burst", "game_day") else 0

    @property
    def like_users(self) -> int:
        return 1 if self.shape == "like_storm" and self.likes > 0 else 0


def preset(shape: str) -> LoadPlan:
    if shape == "steady_state":
        return LoadPlan(shape=shape, celebrities=0)
    if shape == "like_storm":
        return LoadPlan(
            shape=shape, celebrities=0, likes=500, burst_at_s=2.0, burst_window_s=60.0,
            duration_s=65.0, background_users=2,
        )  # fmt: skip
    if shape == "game_day":
        return LoadPlan(shape=shape, duration_s=40.0, burst_at_s=5.0, after_burst_factor=2.0)
    return LoadPlan(shape=shape)


def validate(plan: LoadPlan) -> None:
    problems = []
    for name in ("duration_s", "spawn_rate", "author_rate", "reader_rate"):
        if getattr(plan, name) <= 0:
            problems.append(f"{name} must be positive")
    for name in ("page_limit", "max_pages"):
        if not 1 <= getattr(plan, name) <= 100:
            problems.append(f"{name} must be between 1 and 100")
    for name in ("background_users", "celebrities", "posts_per_celebrity", "likes",
                 "marks_per_visit"):  # fmt: skip
        if getattr(plan, name) < 0:
            problems.append(f"{name} must not be negative")
    if plan.burst_at_s < 0 or plan.burst_window_s < 0:
        problems.append("burst_at_s and burst_window_s must not be negative")
    if plan.shape in ("celebrity_burst", "game_day", "like_storm"):
        if plan.burst_at_s + plan.burst_window_s > plan.duration_s:
            problems.append(
                f"the burst ends at {plan.burst_at_s + plan.burst_window_s:g}s, "
                f"after the run ({plan.duration_s:g}s)"
            )
    if plan.after_burst_factor < 0:
        problems.append("after_burst_factor must not be negative")
    unknown = sorted(set(plan.weights) - set(DEFAULT_WEIGHTS))
    if unknown:
        problems.append(f"unknown user class(es) in weights: {', '.join(unknown)}")
    if any(w < 0 for w in plan.weights.values()):
        problems.append("weights must not be negative")
    if problems:
        raise PlanError("; ".join(problems))


def background_at(plan: LoadPlan, t: float) -> int:
    """Background users wanted ``t`` seconds into the run."""
    if plan.shape == "game_day" and t >= plan.burst_at_s + plan.burst_window_s:
        return round(plan.background_users * plan.after_burst_factor)
    return plan.background_users


def users_at(plan: LoadPlan, t: float) -> int | None:
    """Total Locust users at ``t`` (fixed celebrity/like users first), None once the run ends."""
    if t >= plan.duration_s:
        return None
    return plan.celebrity_users + plan.like_users + background_at(plan, t)


def _spread(count: int, start: float, window: float) -> list[float]:
    if count <= 0:
        return []
    if count == 1:
        return [start]
    return [start + window * i / (count - 1) for i in range(count)]


def celebrity_post_times(plan: LoadPlan) -> list[list[float]]:
    """For each celebrity user, the offsets (s) of its posts, all inside the burst window."""
    users = plan.celebrity_users
    times = _spread(users * plan.posts_per_celebrity, plan.burst_at_s, plan.burst_window_s)
    return [times[i::users] for i in range(users)]


def like_times(plan: LoadPlan) -> list[float]:
    """Offsets of the like storm's events, evenly spread over the burst window."""
    return _spread(plan.likes if plan.shape == "like_storm" else 0, plan.burst_at_s,
                   plan.burst_window_s)  # fmt: skip


def max_events(plan: LoadPlan) -> int:
    """An upper bound on the events a plan injects: every load loop is bounded in count."""
    peak_background = max(plan.background_users, round(plan.background_users *
                                                        plan.after_burst_factor))  # fmt: skip
    authors = peak_background  # at most every background user is an author
    return (
        int(authors * plan.author_rate * plan.duration_s) + authors
        + plan.celebrity_users * plan.posts_per_celebrity
        + (plan.likes if plan.shape == "like_storm" else 0)
    )  # fmt: skip
