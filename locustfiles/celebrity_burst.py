"""Celebrity burst: steady background, then one or several celebrities post within the burst window.

Plain Locust: `locust -f locustfiles/celebrity_burst.py --headless` (host from the stack file or
`--host`; `--harness-plan '{"duration_s": 60}'` overrides the plan in harness/model/shapes.py).
Harness: `python -m harness run <scenario>` with `locustfile: celebrity_burst` in its load step.
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

install("celebrity_burst")


class Shape(PlanShape):
    """Users over time from harness.model.shapes.users_at."""
