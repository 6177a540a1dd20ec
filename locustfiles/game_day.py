"""Game day: the celebrity burst, readers opening the app afterwards; the scenario adds the chaos schedule.

Plain Locust: `locust -f locustfiles/game_day.py --headless` (host from the stack file or
`--host`; `--harness-plan '{"duration_s": 60}'` overrides the plan in harness/model/shapes.py).
Harness: `python -m harness run <scenario>` with `locustfile: game_day` in its load step.
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

install("game_day")


class Shape(PlanShape):
    """Users over time from harness.model.shapes.users_at."""
