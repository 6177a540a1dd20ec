"""Dead-token hygiene: after a token answers 410 Unregistered (APNs) or 404 UNREGISTERED (FCM),
nothing more is sent to it. Requests already in flight when the first answer came back are
allowed for ``grace_s``."""

from __future__ import annotations

import pandas as pd

from harness.checkers.verdict import Verdict


def _dead_answers(provider: pd.DataFrame) -> pd.Series:
    apns = (provider["provider"] == "apns") & (provider["status"] == 410)
    fcm = (provider["provider"] == "fcm") & (provider["reason"] == "UNREGISTERED")
    return apns | fcm


def check(history: pd.DataFrame, grace_s: float = 1.0) -> Verdict:
    provider = history[history["kind"] == "provider"]
    dead = provider[_dead_answers(provider).fillna(False)]
    first_dead = dead.groupby(["tenant_id", "token"])["time"].min().rename("dead_at").reset_index()
    later = provider.merge(first_dead, on=["tenant_id", "token"])
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
