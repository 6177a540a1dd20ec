"""FCM project stickiness (seeds 000/004: FCM is sharded over K sender projects, one SNS platform
application each, and "the push consumer routes by recipient_user_id mod K, which keeps a given
device sticky to one project").

Over the FCM ledger: every request for one user goes to one project (``users_on_several``), and
when the system states its projects (``fcm_projects``) and how it maps a user to one
(``fcm_mapping``: ``digits-mod``, the reference's ``recipient_user_id mod K``, an expression or a
function, :mod:`harness.model.fcm_mapping`), that project is the one the mapping names
(``wrong_project``). With no mapping stated, only stickiness is judged, and the verdict says so.
A run with no FCM request to a device of the population is *unknown*, never a pass.
Requests are matched to users through the population's tokens (a token shared by two tenants'
apps belongs to each tenant's own user).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from harness.checkers.evidence import Evidence
from harness.checkers.registry import checker, unknown_verdict
from harness.checkers.store import HistoryStore
from harness.checkers.verdict import Verdict
from harness.model.fcm_mapping import ProjectOf, project_function
from harness.model.population import Population

EXAMPLES = 5
NO_MAPPING = "no fcm_mapping stated: stickiness judged, not which project"


def fcm_owners(population: Population) -> dict[tuple[str, str], str]:
    """(tenant, token) -> user of every FCM device (both engines match requests by these)."""
    return {(d.tenant_id, d.token): d.user_id for d in population.devices if d.platform == "fcm"}


def check(
    population: Population,
    history: Any,
    projects: tuple[str, ...] = (),
    project_of: ProjectOf | None = None,
) -> Verdict:
    owners = fcm_owners(population)
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
        expected = project_of(str(row.tenant_id), user) if project_of else None
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
    return _verdict(counts, details, project_of, not several and wrong == 0)


def _verdict(
    counts: dict[str, int], details: dict[str, Any], project_of: ProjectOf | None, ok: bool
) -> Verdict:
    if counts["fcm_requests"] == 0:
        return unknown_verdict(
            "fcm_stickiness", "no FCM request to a device of this run's population", **counts
        )
    if project_of is None:
        details["mapping"] = NO_MAPPING
    return Verdict("fcm_stickiness", ok, counts, details)


def check_store(
    store: HistoryStore,
    population: Population,
    projects: tuple[str, ...] = (),
    project_of: ProjectOf | None = None,
) -> Verdict:
    """:func:`check` over a history on disk."""
    owners = fcm_owners(population)
    store.register(
        "fcm_owner_strings",
        pa.table(
            {
                "tenant_id": pa.array([t for t, _ in owners], pa.string()),
                "token": pa.array([k for _, k in owners], pa.string()),
                "user_id": pa.array(list(owners.values()), pa.string()),
                "expected": pa.array(
                    [project_of(t, u) if project_of else None for (t, _), u in owners.items()],
                    pa.string(),
                ),
            }
        ),
    )
    # A null project reads as "<NA>", as str() of the frame's missing value.
    store.run(
        """CREATE OR REPLACE TABLE fcm_requests AS
        SELECT p.pos, p.tenant, o.user_id, coalesce(p.project, '<NA>') AS project, o.expected
        FROM prov p
        LEFT JOIN (SELECT t.code AS tenant, k.code AS tok, s.user_id, s.expected
                   FROM fcm_owner_strings s JOIN tenants t ON t.value = s.tenant_id
                   JOIN tokens k ON k.value = s.token) o
          ON o.tenant = p.tenant AND o.tok = p.tok
        WHERE p.provider = 'fcm'"""
    )
    requests, unknown, wrong, users = store.one(
        """SELECT count(user_id), count(*) - count(user_id),
                  count(*) FILTER (expected IS NOT NULL AND project <> expected),
                  count(DISTINCT (tenant, user_id)) FILTER (user_id IS NOT NULL)
           FROM fcm_requests"""
    )
    several = store.sql(
        """SELECT tenant, user_id, list_sort(list(DISTINCT project)) AS projects
        FROM fcm_requests WHERE user_id IS NOT NULL GROUP BY tenant, user_id
        HAVING count(DISTINCT project) > 1 ORDER BY min(pos)"""
    ).fetchall()
    wrong_rows = store.sql(
        f"""SELECT tenant, user_id, project, expected FROM fcm_requests
        WHERE expected IS NOT NULL AND project <> expected ORDER BY pos LIMIT {EXAMPLES}"""
    ).fetchall()
    counts = {
        "fcm_requests": int(requests),
        "fcm_users": int(users),
        "projects": len(projects),
        "users_on_several_projects": len(several),
        "wrong_project": int(wrong),
        "requests_to_unknown_tokens": int(unknown),
    }
    tenants = store.decode("tenants", [r[0] for r in several[:5]])
    wrong_tenants = store.decode("tenants", [r[0] for r in wrong_rows])
    details = {
        "several_examples": [
            {"tenant_id": t, "user_id": u, "projects": list(p)}
            for t, (_, u, p) in zip(tenants, several[:5], strict=True)
        ],
        "wrong_examples": [
            {"tenant_id": t, "user_id": u, "project": p, "expected": e}
            for t, (_, u, p, e) in zip(wrong_tenants, wrong_rows, strict=True)
        ],
    }
    return _verdict(counts, details, project_of, not several and wrong == 0)


@checker(
    "fcm_stickiness",
    summary="every FCM send for a user goes to one project, the one the stated mapping names",
    out_of_core=True,
)
def probe(evidence: Evidence, tolerance: Mapping[str, Any]) -> Verdict:
    projects = tuple(evidence.policy.fcm_projects)
    project_of = project_function(evidence.policy.fcm_mapping, projects)
    if evidence.store is not None:
        return check_store(evidence.store, evidence.population, projects, project_of)
    return check(evidence.population, evidence.history, projects, project_of)
