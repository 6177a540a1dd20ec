"""Steady state: a constant background of authors, inbox readers, read-all users and preference changes.

Plain Locust: `locust -f locustfiles/steady_state.py --headless` (host from the stack file or
`--host`; `--harness-plan '{"duration_s": 60}'` overrides the plan in harness/model/shapes.py).
Harness: `python -m harness run <scenario>` with `locustfile: steady_state` in its load step.
"""

from harness.load.users import (  # noqa: F401 - Locust finds the user classes here
    Author,
    CelebrityPoster,
    InboxReader,
    LikeStorm,
    PlanShape,
    PreferenceChanger,
    ReadAllUser,
    install,
)

install("steady_state")


class Shape(PlanShape):
    """Users over time from harness.model.shapes.users_at."""
