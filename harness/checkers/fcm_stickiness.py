"""FCM project stickiness (seeds 000/004: FCM is sharded over K sender projects, one SNS platform
application each, and "the push consumer routes by recipient_user_id mod K, which keeps a given
device sticky to one project").

Over the FCM ledger: every request for one user goes to one project (``users_on_several``), and
when the system states its projects (``fcm_projects``, in the order ``mod K`` indexes them) and
the user id carries a number, that project is ``projects[number mod K]`` (``wrong_project``).
Requests are matched to users through the population's tokens (a token shared by two tenants'
apps belongs to each tenant's own user).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from harness.checkers.evidence import Evidence
from harness.checkers.registry import checker
from harness.checkers.verdict import Verdict
from harness.model.population import Population

EXAMPLES = 5
_DIGITS = re.compile(r"\d+")


def owner_project(user_id: str, projects: tuple[str, ...]) -> str | None:
    """The project ``recipient_user_id mod K`` names, when the id carries a number."""
    digits = "".join(_DIGITS.findall(user_id))
    if not projects or not digits:
        return None
    return projects[int(digits) % len(projects)]


def check(population: Population, history: Any, projects: tuple[str, ...] = ()) -> Verdict:
    owners = {(d.tenant_id, d.token): d.user_id for d in population.devices if d.platform == "fcm"}
    fcm = history[(history["kind"] == "provider") & (history["provider"] == "fcm")]
    used: dict[tuple[str, str], set[str]] = defaultdict(set)
    requests = wrong = unknown = 0
    examples: list[dict[str, Any]] = []
    for row in fcm[["tenant_id", "token", "project"]].itertuples(index=False):
        user = owners.get((str(row.tenant_id), str(row.token)))
        if user is None:
            unknown += 1
            continue
        requests += 1
        project = str(row.project)
        used[(str(row.tenant_id), user)].add(project)
        expected = owner_project(user, projects)
        if expected is not None and project != expected:
            wrong += 1
            if len(examples) < EXAMPLES:
                examples.append({"tenant_id": row.tenant_id, "user_id": user,
                                 "project": project, "expected": expected})  # fmt: skip
    several = {k: sorted(v) for k, v in used.items() if len(v) > 1}
    counts = {
        "fcm_requests": requests,
        "fcm_users": len(used),
        "projects": len(projects),
        "users_on_several_projects": len(several),
        "wrong_project": wrong,
        "requests_to_unknown_tokens": unknown,
    }
    details = {
        "several_examples": [
            {"tenant_id": t, "user_id": u, "projects": p} for (t, u), p in list(several.items())[:5]
        ],
        "wrong_examples": examples,
    }
    return Verdict("fcm_stickiness", not several and wrong == 0, counts, details)


@checker(
    "fcm_stickiness",
    summary="every FCM send for a user goes to one project, the one user mod K names",
)
def probe(evidence: Evidence, tolerance: Mapping[str, Any]) -> Verdict:
    return check(evidence.population, evidence.history, tuple(evidence.policy.fcm_projects))
