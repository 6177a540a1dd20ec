"""Back-pressure: Retry-After honoured, and the send rate within the configured cap.

After a provider answers 429 (or 5xx) with Retry-After R at time t, a request to the same
provider (and, for FCM, the same project) between t + slack_s and t + R is a violation; the
slack covers requests already in flight, and runs from the scope's first request read after
the answer when the scope was silent through the slack (:func:`requests_inside` says why). With ``cap_per_s`` set, no one-second bucket may hold
more provider requests than the cap.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from harness.checkers.evidence import Evidence
from harness.checkers.registry import checker
from harness.checkers.store import HistoryStore
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


@dataclass
class Inside:
    """What one scope's requests inside Retry-After windows come to (:func:`requests_inside`)."""

    requests: int = 0
    excused_after_silence: int = 0
    furthest_s: float = 0.0
    examples: list[dict[str, Any]] = field(default_factory=list)

    def add(self, other: Inside) -> None:
        self.requests += other.requests
        self.excused_after_silence += other.excused_after_silence
        self.furthest_s = max(self.furthest_s, other.furthest_s)
        self.examples += other.examples


def requests_inside(
    scope_name: str,
    times: np.ndarray,
    throttled: np.ndarray,
    retry_after: np.ndarray,
    slack_s: float,
    examples: int,
) -> Inside:
    """Within one scope (``times`` sorted): the requests after a throttling answer, past the
    slack, and before its Retry-After ran out; how far past the answer the furthest came
    (seconds: a client slow to react reaches just past the slack, one ignoring Retry-After to
    its end); up to ``examples`` examples. Both engines count here.

    The slack runs from the answer, or from the scope's first request read after it when the
    scope was silent through the whole slack: requests the simulator reads in a burst after a silence may have waited in its
    socket while it was starved of CPU, or been sent by a client starved before it could read
    the answer (a loaded machine: CI once read 12 so, past 0.3 s). Those are
    ``excused_after_silence``, counted, not failed; a client that goes on sending through the
    pause is still read at once after the answer, and caught."""
    answers = np.flatnonzero(throttled)
    if not len(answers):
        return Inside()
    answered = times[answers]
    after = np.searchsorted(times, answered, side="right")
    first_read = np.append(times, np.inf)[after]  # the scope's first request after the answer
    # Silent through the whole slack: it runs from the first read instead.
    begin = np.where(first_read > answered + slack_s, first_read, answered)
    begin = np.where(np.isfinite(begin), begin, answered)
    lo = np.searchsorted(times, begin + slack_s, side="right")
    lo_at_answer = np.searchsorted(times, answered + slack_s, side="right")
    hi = np.searchsorted(times, answered + retry_after[answers], side="left")
    inside = np.maximum(hi - lo, 0)
    excused = np.maximum(hi - lo_at_answer, 0) - inside
    hit = inside > 0
    furthest = float((times[hi[hit] - 1] - answered[hit]).max()) if hit.any() else 0.0
    found = []
    for answer, last, requests in zip(answers[hit], hi[hit] - 1, inside[hit], strict=True):
        if len(found) >= examples:
            break
        found.append(
            {
                "scope": scope_name,
                "throttled_at": float(times[answer]),
                "retry_after_s": float(retry_after[answer]),
                "requests": int(requests),
                "furthest_s": round(float(times[last] - times[answer]), 3),
            }
        )
    return Inside(int(inside.sum()), int(excused.sum()), furthest, found)


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
    inside = Inside()
    for code, scope_name in enumerate(scope_names):
        in_scope = scope == code
        inside.add(requests_inside(
            scope_name, times[in_scope], throttled[in_scope], retry_after[in_scope], slack_s,
            5 - len(inside.examples),
        ))  # fmt: skip
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
    return _verdict(throttles, inside, peak, over_cap, slack_s, cap_per_s)


def check_store(
    store: HistoryStore, slack_s: float = 0.3, cap_per_s: float | None = None
) -> Verdict:
    """:func:`check` over a history on disk: each scope's request times come out sorted, one
    scope at a time, and are counted as in memory."""
    scope = "coalesce(provider, '<NA>') || '/' || coalesce(project, '')"
    names = [n for (n,) in store.sql(f"SELECT DISTINCT {scope} FROM prov ORDER BY 1").fetchall()]
    inside, throttles = Inside(), 0
    for name in names:
        found = store.sql(
            f"SELECT time, retry_after FROM prov WHERE {scope} = ? ORDER BY time", [name]
        ).fetchnumpy()
        times = np.asarray(found["time"], dtype=float)
        retry_after = np.ma.filled(np.ma.asarray(found["retry_after"], dtype=float), np.nan)
        throttled = ~np.isnan(retry_after) & (retry_after > 0)
        throttles += int(np.count_nonzero(throttled))
        inside.add(
            requests_inside(name, times, throttled, retry_after, slack_s, 5 - len(inside.examples))
        )
        del found, times, retry_after, throttled
    peak, over_cap = store.one(
        f"""SELECT coalesce(max(n), 0), count(*) FILTER (n > {cap_per_s or 0})
        FROM (SELECT trunc(time)::BIGINT AS second, count(*) AS n FROM prov GROUP BY 1)"""
    )
    over = int(over_cap) if cap_per_s else 0
    return _verdict(throttles, inside, int(peak), over, slack_s, cap_per_s)


def _verdict(
    throttles: int,
    inside: Inside,
    peak: int,
    over_cap: int,
    slack_s: float,
    cap_per_s: float | None,
) -> Verdict:
    counts = {
        "throttle_answers": throttles,
        "requests_inside_retry_after": inside.requests,
        "excused_after_silence": inside.excused_after_silence,
        "furthest_inside_ms": round(inside.furthest_s * 1000),
        "peak_requests_per_s": peak,
        "seconds_over_cap": over_cap,
    }
    details = {"slack_s": slack_s, "cap_per_s": cap_per_s, "examples": inside.examples}
    return Verdict("backpressure", inside.requests == 0 and over_cap == 0, counts, details)


@checker(
    "backpressure",
    summary="Retry-After honoured per scope; send rate under the cap",
    tolerances={"slack_s": 0.3, "cap_per_s": None},
    out_of_core=True,
)
def probe(evidence: Evidence, tolerance: Mapping[str, Any]) -> Verdict:
    cap = tolerance["cap_per_s"]
    if evidence.store is not None:
        return check_store(
            evidence.store,
            slack_s=float(tolerance["slack_s"]),
            cap_per_s=None if cap is None else float(cap),
        )
    return check(
        evidence.history,
        slack_s=float(tolerance["slack_s"]),
        cap_per_s=None if cap is None else float(cap),
    )
