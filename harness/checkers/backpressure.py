"""Back-pressure: Retry-After honoured, and the send rate within the configured cap.

After a provider answers 429 (or 5xx) with Retry-After R at time t, a request to the same
provider (and, for FCM, the same project) between t + slack_s and t + R is a violation; the
slack covers requests already in flight. With ``cap_per_s`` set, no one-second bucket may hold
more provider requests than the cap.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from harness.checkers.evidence import Evidence
from harness.checkers.registry import checker
from harness.checkers.verdict import Verdict


def _scopes(history: pd.DataFrame, rows: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Each row's scope (an index into the sorted scope names, -1 when the scope string is
    missing); "provider/project" is built once per distinct pair, not once per row."""
    provider_codes, providers = pd.factorize(history["provider"], use_na_sentinel=False)
    project_codes, projects = pd.factorize(history["project"], use_na_sentinel=False)
    width = max(len(projects), 1)
    pair = provider_codes[rows].astype(np.int64) * width + project_codes[rows]
    pair_codes, pairs = pd.factorize(pair)
    names = (
        pd.Series(providers.take(pairs // width)).astype(str)
        + "/"
        + pd.Series(projects.take(pairs % width)).fillna("").astype(str)
    )
    known = names.notna().to_numpy(dtype=bool)
    ordered = sorted(set(names[known]))
    index = {name: i for i, name in enumerate(ordered)}
    pair_scope = [index[name] if ok else -1 for name, ok in zip(names, known, strict=True)]
    return np.array(pair_scope, dtype=np.int64)[pair_codes], ordered


def check(history: pd.DataFrame, slack_s: float = 0.3, cap_per_s: float | None = None) -> Verdict:
    rows = np.flatnonzero((history["kind"] == "provider").to_numpy(dtype=bool, na_value=False))
    time = history["time"].to_numpy(dtype=float, na_value=np.nan)[rows]
    # The order ``sort_values("time")`` gives the provider rows (ties included).
    order = pd.Series(time).sort_values().index.to_numpy()
    times = time[order]
    retry_after = history["retry_after"].to_numpy(dtype=float, na_value=np.nan)[rows][order]
    scope, scope_names = _scopes(history, rows)
    scope = scope[order]
    throttled = ~np.isnan(retry_after) & (retry_after > 0)
    ignored = 0
    examples = []
    for code, scope_name in enumerate(scope_names):
        in_scope = scope == code
        scope_times = times[in_scope]
        answers = np.flatnonzero(in_scope & throttled)
        lo = np.searchsorted(scope_times, times[answers] + slack_s, side="right")
        hi = np.searchsorted(scope_times, times[answers] + retry_after[answers], side="left")
        inside = np.maximum(hi - lo, 0)
        ignored += int(inside.sum())
        for answer, requests in zip(answers[inside > 0], inside[inside > 0], strict=True):
            if len(examples) >= 5:
                break
            examples.append(
                {
                    "scope": scope_name,
                    "throttled_at": float(times[answer]),
                    "requests": int(requests),
                }
            )
    throttles = int(np.count_nonzero(throttled))
    # Per whole second (``time.astype("int64")``, which truncates): times are sorted, so each
    # second is one run.
    seconds = pd.Series(times).astype("int64").to_numpy()
    if len(seconds):
        starts = np.flatnonzero(np.r_[True, seconds[1:] != seconds[:-1]])
        buckets = np.diff(np.r_[starts, len(seconds)])
    else:
        buckets = np.zeros(0, dtype=np.int64)
    peak = int(buckets.max()) if len(buckets) else 0
    over_cap = int((buckets > cap_per_s).sum()) if cap_per_s else 0
    counts = {
        "throttle_answers": throttles,
        "requests_inside_retry_after": ignored,
        "peak_requests_per_s": peak,
        "seconds_over_cap": over_cap,
    }
    details = {"slack_s": slack_s, "cap_per_s": cap_per_s, "examples": examples}
    return Verdict("backpressure", ignored == 0 and over_cap == 0, counts, details)


@checker(
    "backpressure",
    summary="Retry-After honoured per scope; send rate under the cap",
    tolerances={"slack_s": 0.3, "cap_per_s": None},
)
def probe(evidence: Evidence, tolerance: Mapping[str, Any]) -> Verdict:
    cap = tolerance["cap_per_s"]
    return check(
        evidence.history,
        slack_s=float(tolerance["slack_s"]),
        cap_per_s=None if cap is None else float(cap),
    )
