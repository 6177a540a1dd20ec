"""Preference changes take effect mid-run (seed 000: "a consent withdrawal invalidates the cache
via the DynamoDB-Streams Pipe immediately"; the 5-minute TTL is only a backstop).

The run changes some users while the load goes on: push consent withdrawn or granted, quiet
hours moved over the present, the zone moved so the window now covers the present; some through
the system's API, some written straight to its preferences table (then only the table's change
stream can tell the system). The oracle knows when each change was sent and acknowledged
(:mod:`harness.model.timeline`). Every delivery to a changed user's device is judged by the
states a correct system may act on at that instant: the new state from when the change was
sent, the old one until ``bound_s`` (the scenario's ``preference_bound_s``) after it was
acknowledged. A delivery no such state allows is a violation, by reason (``after_withdrawal``,
whether the consent was removed or kept with a ``revoked_at``; ``after_push_switched_off``, the
user turned push off with consent kept; ``inside_quiet_hours``). A notification a granted consent makes due is required as any other:
``missed`` counts those never delivered.

Two mechanisms stand behind the promise in a system like the seed's: the API's own write-through
invalidation and the table's change stream. While a fault stopped the stream (a window whose
record says it took ``preferences_stream`` away), an API change must still take effect within
``bound_s`` (``api_changes_while_stream_stopped`` were judged so: write-through alone), and a
change written straight to the table is bounded by the system's stated cache TTL alone
(``ttl_bounded_changes``; :mod:`harness.model.timeline`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

import numpy as np

from harness.checkers.evidence import Evidence
from harness.checkers.registry import checker
from harness.checkers.verdict import Verdict
from harness.checkers.windows import delivery_rows

EXAMPLES = 5
REASONS = {
    "no_consent": "after_withdrawal",
    "push_switched_off": "after_push_switched_off",
    "quiet_hours_pending": "inside_quiet_hours",
    "quiet_hours": "inside_quiet_hours",
    "unknown_zone": "to_an_unknown_zone",
    "unreadable_quiet_hours": "despite_unreadable_quiet_hours",
    "erased": "after_erasure",
    "not_following": "not_following",
    "dead_token": "to_a_dead_token",
    "no_state": "no_state",
}


def judge_deliveries(
    evidence: Evidence, users: set[tuple[str, str]]
) -> tuple[Counter[str], list[dict[str, Any]], int]:
    """Violations by reason among deliveries to ``users``' devices, examples, and how many
    deliveries were judged."""
    timeline = evidence.timeline
    assert timeline is not None
    history = evidence.history
    devices = {
        (d.tenant_id, d.token): d
        for d in evidence.population.devices
        if (d.tenant_id, d.user_id) in users
    }
    authors = {
        (str(t), str(n)): str(a)
        for t, n, a in history.loc[
            history["kind"].isin(["inject", "inject_info"]),
            ["tenant_id", "notification_id", "author_id"],
        ].itertuples(index=False, name=None)
    }
    rows = delivery_rows(history)
    tokens = history["token"].to_numpy(dtype=object)[rows]
    tenants = history["tenant_id"].to_numpy(dtype=object)[rows]
    wanted = np.fromiter(
        ((str(t), str(k)) in devices for t, k in zip(tenants, tokens, strict=True)),
        dtype=bool,
        count=len(rows),
    )
    violations: Counter[str] = Counter()
    examples: list[dict[str, Any]] = []
    judged = 0
    for i in rows[wanted]:
        row = history.iloc[int(i)]
        tenant, token, at = str(row["tenant_id"]), str(row["token"]), float(row["time"])
        author = authors.get((tenant, str(row["notification_id"])))
        if author is None:
            continue  # not an injected notification (a digest): the rate_limit checker's
        device = devices[(tenant, token)]
        judged += 1
        allowed, why = timeline.allowed_at(tenant, device.user_id, (tenant, author), device, at)
        if allowed:
            continue
        reason = REASONS.get(str(why), str(why))
        violations[reason] += 1
        if len(examples) < EXAMPLES:
            examples.append({"reason": reason, "tenant_id": tenant, "user_id": device.user_id,
                             "notification_id": str(row["notification_id"]), "time": at})  # fmt: skip
    return violations, examples, judged


def check(evidence: Evidence) -> Verdict:
    timeline = evidence.timeline
    changes = Counter()
    users: set[tuple[str, str]] = set()
    if timeline is not None:
        for key, states in timeline.states.items():
            if key in timeline.erasures or key in timeline.registrations:
                continue
            users.add(key)
            changes["changed_users"] += 1
            changes["changes"] += len(states) - 1
    if timeline is None or not users:
        return Verdict("preference_changes", True, {"changed_users": 0, "changes": 0})
    violations, examples, judged = judge_deliveries(evidence, users)
    expected = evidence.expectation.deliveries
    mine = expected[
        [(t, u) in users for t, u in zip(expected["tenant_id"], expected["user_id"], strict=True)]
    ]
    delivered = {
        (str(t), str(n), str(k))
        for t, n, k in evidence.history.iloc[delivery_rows(evidence.history)][
            ["tenant_id", "notification_id", "token"]
        ].itertuples(index=False, name=None)
    }
    missed = sum(
        (str(t), str(n), str(k)) not in delivered
        for t, n, k in mine[["tenant_id", "notification_id", "token"]].itertuples(
            index=False, name=None
        )
    )
    counts = {
        **changes,
        "api_changes_while_stream_stopped": len(timeline.api_while_stream_stopped),
        "ttl_bounded_changes": len(timeline.ttl_bounded),
        "deliveries_judged": judged,
        "required_after_change": int(len(mine)),
        "missed": int(missed),
        "violations": sum(violations.values()),
        **{k: int(v) for k, v in sorted(violations.items())},
    }
    valid = not violations and missed == 0
    details: dict[str, Any] = {"bound_s": timeline.bound_s, "examples": examples}
    if timeline.stream_stops:
        details["stream_stopped"] = [[a, b] for a, b in timeline.stream_stops]
        details["cache_ttl_s"] = timeline.cache_ttl_s
    return Verdict("preference_changes", valid, counts, details)


@checker(
    "preference_changes",
    summary="a consent, quiet-hours or zone change takes effect within the stated bound",
    # With the history on disk these kinds come as a frame (see registry.in_memory_for).
    reads=("inject", "inject_info", "provider", "expected"),
)
def probe(evidence: Evidence, tolerance: Mapping[str, Any]) -> Verdict:
    return check(evidence)
