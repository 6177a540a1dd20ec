"""Like storm: 500 likes in a minute (the digest path) over a small background.

Plain Locust: `locust -f locustfiles/like_storm.py --headless` (host from the stack file or
`--host`; `--harness-plan '{"duration_s": 60}'` overrides the plan in harness/model/shapes.py).
Harness: `python -m harness run <scenario>` with `locustfile: like_storm` in its load step.
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

install("like_storm")


class Shape(PlanShape):
    """Users over time from harness.model.shapes.users_at."""
