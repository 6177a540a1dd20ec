"""Back-pressure: Retry-After honoured, and the send rate within the configured cap.

After a provider answers 429 (or 5xx) with Retry-After R at time t, a request to the same
provider (and, for FCM, the same project) between t + slack_s and t + R is a violation; the
slack covers requests already in flight. With ``cap_per_s`` set, no one-second bucket may hold
more provider requests than the cap.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from harness.checkers.verdict import Verdict


def check(history: pd.DataFrame, slack_s: float = 0.3, cap_per_s: float | None = None) -> Verdict:
    provider = history[history["kind"] == "provider"].sort_values("time")
    scope = provider["provider"].astype(str) + "/" + provider["project"].fillna("").astype(str)
    provider = provider.assign(scope=scope)
    throttles = provider[provider["retry_after"].notna() & (provider["retry_after"] > 0)]
    ignored = 0
    examples = []
    for scope_name, group in provider.groupby("scope"):
        times = group["time"].to_numpy()
        for row in throttles[throttles["scope"] == scope_name].itertuples(index=False):
            lo = np.searchsorted(times, row.time + slack_s, side="right")
            hi = np.searchsorted(times, row.time + float(row.retry_after), side="left")
            if hi > lo:
                ignored += int(hi - lo)
                if len(examples) < 5:
                    examples.append(
                        {"scope": scope_name, "throttled_at": row.time, "requests": int(hi - lo)}
                    )
    buckets = provider.groupby(provider["time"].astype("int64")).size()
    peak = int(buckets.max()) if len(buckets) else 0
    over_cap = int((buckets > cap_per_s).sum()) if cap_per_s else 0
    counts = {
        "throttle_answers": int(len(throttles)),
        "requests_inside_retry_after": ignored,
        "peak_requests_per_s": peak,
        "seconds_over_cap": over_cap,
    }
    details = {"slack_s": slack_s, "cap_per_s": cap_per_s, "examples": examples}
    return Verdict("backpressure", ignored == 0 and over_cap == 0, counts, details)
