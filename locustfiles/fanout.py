"""The fan-out load: one locustfile, every shape (``harness/model/shapes.py``: steady_state,
celebrity_burst, like_storm, game_day), chosen by the plan.

Plain Locust: ``locust -f locustfiles/fanout.py --headless --harness-plan '{"shape":
"game_day", "duration_s": 60}'`` (host from the stack file or ``--host``; a team's own system:
``--harness-driver package.module:Class``). Harness: ``python -m harness run <scenario>`` with
``locustfile: game_day`` (the shape's name) in its locust step.
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

install()


class Shape(PlanShape):
    """Users over time from harness.model.shapes.users_at."""
