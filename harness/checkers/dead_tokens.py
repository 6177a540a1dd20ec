"""Dead-token hygiene: after a token answers 410 Unregistered (APNs) or 404 UNREGISTERED (FCM),
nothing more is sent to it. Requests already in flight when the first answer came back are
allowed for ``grace_s``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from harness.checkers.evidence import Evidence
from harness.checkers.keys import rows_with
from harness.checkers.registry import checker
from harness.checkers.verdict import Verdict


def _dead_answers(provider: pd.DataFrame) -> pd.Series:
    apns = (provider["provider"] == "apns") & (provider["status"] == 410)
    fcm = (provider["provider"] == "fcm") & (provider["reason"] == "UNREGISTERED")
    return apns | fcm


def check(history: pd.DataFrame, grace_s: float = 1.0) -> Verdict:
    is_provider = (history["kind"] == "provider").to_numpy(dtype=bool, na_value=False)
    answers = history[["provider", "status", "reason"]]
    is_dead = _dead_answers(answers).fillna(False).to_numpy(dtype=bool)
    columns = ["tenant_id", "token", "time"]
    dead = history[columns].iloc[np.flatnonzero(is_provider & is_dead)]
    first_dead = dead.groupby(["tenant_id", "token"])["time"].min().rename("dead_at").reset_index()
    # Only requests to a token that answered dead can join it; the join keeps their order.
    to_dead = is_provider & rows_with(history, "token", set(first_dead["token"]))
    later = (
        history[columns].iloc[np.flatnonzero(to_dead)].merge(first_dead, on=["tenant_id", "token"])
    )
    after = later[later["time"] > later["dead_at"] + grace_s]
    counts = {
        "dead_tokens": int(len(first_dead)),
        "sends_after_dead": int(len(after)),
    }
    details = {
        "grace_s": grace_s,
        "examples": after[["tenant_id", "token", "dead_at", "time"]].head(5).to_dict("records"),
    }
    return Verdict("dead_tokens", counts["sends_after_dead"] == 0, counts, details)


@checker(
    "dead_tokens",
    summary="nothing sent to a token after the provider said it is dead",
    tolerances={"grace_s": 1.0},
)
def probe(evidence: Evidence, tolerance: Mapping[str, Any]) -> Verdict:
    return check(evidence.history, grace_s=float(tolerance["grace_s"]))
