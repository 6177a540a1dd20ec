"""Dead-token hygiene (seed 000: "invalid-token responses from both providers must immediately
stop sends to that token"): after a token answers 410 Unregistered (APNs) or 404 UNREGISTERED
(FCM), nothing more is sent to it.

Only requests already in flight when the dead answer went out are forgiven, measured from the
ledger: a request that reached the provider after the dead answer *left* it (``answered_at``,
after any latency the provider added), plus ``transit_s``, was sent by a system that had been
told. ``transit_s`` covers a round trip plus the queuing a request meets on a loaded machine
before the provider reads it (measured: 63 ms on this 2-core machine in a smoke run; the default
leaves room for an order of magnitude more). A system that never deactivates a dead token meets
it again at the next notification, seconds later, far outside it. Per (tenant, token): a token two tenants' apps share is dead for
each only once its own answer says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from harness.checkers.evidence import Evidence
from harness.checkers.keys import rows_with
from harness.checkers.registry import checker
from harness.checkers.verdict import Verdict

TRANSIT_S = 0.5


def _dead_answers(provider: pd.DataFrame) -> pd.Series:
    apns = (provider["provider"] == "apns") & (provider["status"] == 410)
    fcm = (provider["provider"] == "fcm") & (provider["reason"] == "UNREGISTERED")
    return apns | fcm


def check(history: pd.DataFrame, transit_s: float = TRANSIT_S) -> Verdict:
    is_provider = (history["kind"] == "provider").to_numpy(dtype=bool, na_value=False)
    answers = history[["provider", "status", "reason"]]
    is_dead = _dead_answers(answers).fillna(False).to_numpy(dtype=bool)
    columns = ["tenant_id", "token", "time", "end"]
    dead = history[columns].iloc[np.flatnonzero(is_provider & is_dead)]
    # When the first dead answer left; a ledger without answer times: when it was received.
    left = dead["end"].fillna(dead["time"])
    first_dead = (
        dead.assign(told=left)
        .groupby(["tenant_id", "token"])["told"]
        .min()
        .rename("dead_at")
        .reset_index()
    )
    # Only requests to a token that answered dead can join it; the join keeps their order.
    to_dead = is_provider & rows_with(history, "token", set(first_dead["token"]))
    later = (
        history[columns].iloc[np.flatnonzero(to_dead)].merge(first_dead, on=["tenant_id", "token"])
    )
    gap = later["time"] - later["dead_at"]
    after = later[gap > transit_s]
    counts = {
        "dead_tokens": int(len(first_dead)),
        "sends_after_dead": int(len(after)),
        "in_flight_forgiven": int(((gap > 0) & (gap <= transit_s)).sum()),
    }
    details = {
        "transit_s": transit_s,
        "latest_after_dead_s": round(float(gap.max()), 3) if len(gap) and gap.max() > 0 else 0.0,
        "examples": after[["tenant_id", "token", "dead_at", "time"]].head(5).to_dict("records"),
    }
    return Verdict("dead_tokens", counts["sends_after_dead"] == 0, counts, details)


@checker(
    "dead_tokens",
    summary="nothing sent to a token after the provider's dead answer left (in flight excepted)",
    tolerances={"transit_s": TRANSIT_S},
)
def probe(evidence: Evidence, tolerance: Mapping[str, Any]) -> Verdict:
    return check(evidence.history, transit_s=float(tolerance["transit_s"]))
