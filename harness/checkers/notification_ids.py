"""Notification ids as the design mints them (seed 000: a ULID, a 48-bit millisecond timestamp
from the minting worker's clock then 80 random bits, so that lexical order is time order and
the newest-first inbox is one range read).

For every event the system accepted (its first acceptance: an id posted again keeps its
first), an id shaped as a ULID must carry a time inside [sent - ``skew_s``, answered +
``skew_s``] of that event's POST: ``minted_off_acceptance`` counts those outside (a clock
read in the wrong unit, seconds where milliseconds belong, a time taken from elsewhere; red
team 3: python-ulid reads an int as milliseconds, and ids minted from whole seconds fell in
1970, which nothing judged). An id of another shape names no time and is counted apart
(``not_judged``), never a violation: a system's own id format is its own. Ids the harness
sent (``event_id``) are judged too and always agree; the ones that matter are those the system
minted itself, which a scenario asks for with ``load.system_minted_ids``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd
from ulid import ULID

from harness.checkers.evidence import Evidence
from harness.checkers.registry import checker, unknown_verdict
from harness.checkers.verdict import Verdict

EXAMPLES = 5


def ulid_seconds(notification_id: Any) -> float | None:
    """The epoch seconds a canonical ULID carries, else None."""
    if not isinstance(notification_id, str) or len(notification_id) != 26:
        return None
    try:
        parsed = ULID.from_str(notification_id)
    except ValueError:
        return None
    if str(parsed) != notification_id:  # lower case or another non-canonical spelling
        return None
    return parsed.milliseconds / 1000.0


def check(history: pd.DataFrame, skew_s: float, clock_offset_s: float = 0.0) -> Verdict:
    """``clock_offset_s``: how far the system's clock ran ahead (a scenario that moved it): the
    id's time is the minting worker's clock, read back in real time."""
    injected = history[(history["kind"] == "inject") & history["notification_id"].notna()]
    if injected.empty:
        return unknown_verdict("notification_ids", "the run accepted no event")
    first = injected.sort_values("time").drop_duplicates(["tenant_id", "notification_id"])
    counts = {"ids": 0, "judged": 0, "not_judged": 0, "minted_off_acceptance": 0}
    examples: list[dict[str, Any]] = []
    for row in first[["tenant_id", "notification_id", "time", "end"]].itertuples(index=False):
        counts["ids"] += 1
        at = ulid_seconds(row.notification_id)
        if at is None or pd.isna(row.time) or pd.isna(row.end):
            counts["not_judged"] += 1
            continue
        counts["judged"] += 1
        at -= clock_offset_s
        if float(row.time) - skew_s <= at <= float(row.end) + skew_s:
            continue
        counts["minted_off_acceptance"] += 1
        if len(examples) < EXAMPLES:
            examples.append({"tenant_id": row.tenant_id, "notification_id": row.notification_id,
                             "id_time": at, "sent": float(row.time), "answered": float(row.end)})  # fmt: skip
    return Verdict(
        "notification_ids",
        counts["minted_off_acceptance"] == 0,
        counts,
        {"skew_s": skew_s, "examples": examples},
    )


@checker(
    "notification_ids",
    summary="every ULID notification id carries the time its event was accepted",
    tolerances={"skew_s": 1.0},
    reads=("inject",),
)
def probe(evidence: Evidence, tolerance: Mapping[str, Any]) -> Verdict:
    return check(evidence.history, float(tolerance["skew_s"]), evidence.clock_offset_s)
