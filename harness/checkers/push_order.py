"""Per-author order on the device (seed 000: Kinesis partition key = author, "so two posts from
the same account fan out in order"): each device gets an author's pushes in the order the
author posted them, judged at the providers, where the device is.

``author_order`` judges what readers see in their inbox; a system can keep the inbox in ULID
order and still push out of order (a consumer that holds some jobs back, or sends a batch in
reverse). This checker reads the provider ledgers: per (tenant, device token, author), the
*first successful delivery* of each notification the oracle requires on that device (a 200,
or accepted then an error), against the order the harness posted them (its ``inject`` rows).

What the design does not promise, and so is never judged:

* posts close together: SQS Standard queues (seed 004) give no order, and parallel consumers
  may take two jobs posted a moment apart in either order. A pair counts only when the later
  notification's request went out at least ``apart_s`` after the earlier one was accepted (its
  answer came back): the system had every chance to keep them in order
  (``close_together`` otherwise);
* jitter: an inversion counts only when the later notification's first delivery precedes the
  earlier's by more than ``slack_s``;
* retries: an earlier notification whose first delivery to the device came after a failed
  attempt there (a 429, a 5xx the device did not get) was retried, as the design wants
  (``earlier_retried``); nor is a pair judged whose earlier notification was on its way
  (from its post to its first delivery) while a stated fault was active, or within
  ``settle_s`` of its end: a fault makes the system retry and redeliver jobs (a dedup store
  that fails closed, SQS redeliveries, a consumer crash) and those come back in any order
  (``earlier_in_fault``);
* quiet hours and digests: a delivery the oracle defers to a quiet window's end is released
  then, whatever came after it (``deferred`` deliveries are left out), and a notification a
  stated rate limit may hold for a digest is not a required delivery at all;
* a notification posted more than once (the same id again: its later post may reach a device
  registered in between) and devices registered again after an erasure (the ``erasure``
  checker's) are left out (``posted_again``, ``reregistered``).

A lost delivery is ``effectively_once``'s; only delivered pairs are compared. Counts:
``pairs`` (ordered pairs of one author's notifications both delivered to one device),
``pairs_judged``, ``later_delivered_first`` (the violations), ``device_authors_out_of_order``
and ``worst_inversion_ms``. Nothing judged (no author with two notifications for one device, or
every pair excused) is *unknown*, never a pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from harness.checkers.evidence import Evidence
from harness.checkers.registry import checker
from harness.checkers.store import HistoryStore
from harness.checkers.verdict import Verdict
from harness.checkers.windows import Window, delivery_rows, fault_windows
from harness.model.oracle import Expectation

NAME = "push_order"
EXAMPLES = 5
DEFAULT_APART_S = 3.0
DEFAULT_SLACK_S = 1.0
DEFAULT_SETTLE_S = 2.0
KEY = ["tenant_id", "notification_id", "token"]
GROUP = ["tenant_id", "token", "author_id"]
# One row per judged delivery: what :func:`judge` reads.
FRAME_COLUMNS = [*KEY, "author_id", "sent", "accepted", "first", "retried"]
PAIR_COUNTS = (
    "pairs",
    "close_together",
    "earlier_retried",
    "earlier_in_fault",
    "pairs_judged",
    "later_delivered_first",
    "device_authors_out_of_order",
    "worst_inversion_ms",
)
PAIRS_PER_BATCH = 2_000_000


def posts(injected: pd.DataFrame) -> pd.DataFrame:
    """Per (tenant, notification) posted once: its author, when its first request went out
    (``sent``: an unanswered or 5xx attempt before the accepted one included, since the system
    may have taken it then) and when the accepted one's answer came back (``accepted``).
    ``injected``: the ``inject`` and ``inject_info`` rows. One accepted more than once (posted
    again with its id) is not in it."""
    rows = injected[["kind", "tenant_id", "notification_id", "author_id", "time", "end"]]
    rows = rows[rows["notification_id"].notna()]
    sent = rows.groupby(["tenant_id", "notification_id"], sort=False)["time"].min().rename("sent")
    accepted = rows[rows["kind"] == "inject"]
    table = (
        accepted.groupby(["tenant_id", "notification_id"], sort=False)
        .agg(
            author_id=("author_id", "first"),
            accepted=("end", "min"),
            answered_at=("time", "min"),
            posted=("time", "size"),
        )
        .join(sent)
        .reset_index()
    )
    table = table[table["posted"] == 1]
    table["sent"] = table["sent"].astype(float)
    answered = table["accepted"].astype(float)
    table["accepted"] = answered.where(answered.notna(), table["answered_at"].astype(float))
    columns = ["tenant_id", "notification_id", "author_id", "sent", "accepted"]
    return table[columns].reset_index(drop=True)


def deliveries_judged(
    expected: pd.DataFrame, table: pd.DataFrame, reregistered: set[tuple[str, str]]
) -> tuple[pd.DataFrame, dict[str, int]]:
    """``expected``: one row per required (tenant, notification, token) with its
    ``quiet_until``, its first provider request (``attempt``) and first delivery (``first``,
    NaN if none); ``table``: :func:`posts`. The deliveries :func:`judge` reads
    (``FRAME_COLUMNS``) and how many were left out, by reason."""
    deferred = expected["quiet_until"].notna().to_numpy(dtype=bool)
    again = np.fromiter(
        (
            (t, k) in reregistered
            for t, k in zip(expected["tenant_id"], expected["token"], strict=True)
        ),
        dtype=bool,
        count=len(expected),
    )
    delivered = expected["first"].notna().to_numpy(dtype=bool)
    rows = expected[~deferred & ~again & delivered].copy()
    rows["first"] = rows["first"].astype(float)
    rows["retried"] = rows["attempt"].astype(float).to_numpy() < rows["first"].to_numpy()
    rows = rows.merge(table, on=["tenant_id", "notification_id"], how="left")
    known = rows["sent"].notna().to_numpy(dtype=bool)
    excluded = {
        "deferred": int(deferred.sum()),
        "reregistered": int((again & ~deferred).sum()),
        "posted_again": int((~known).sum()),
    }
    return rows.loc[known, FRAME_COLUMNS].reset_index(drop=True), excluded


def judge(
    frame: pd.DataFrame,
    windows: list[Window],
    excluded: Mapping[str, int],
    apart_s: float = DEFAULT_APART_S,
    slack_s: float = DEFAULT_SLACK_S,
    settle_s: float = DEFAULT_SETTLE_S,
) -> Verdict:
    """The verdict over one row per delivered, required, not deferred (tenant, notification,
    device) (``FRAME_COLUMNS``); ``excluded``: deliveries left out before pairing, by reason.
    An author's pairs on one device grow with the square of their posts there: the (device,
    author) groups are paired a batch at a time, each batch at most ``PAIRS_PER_BATCH``."""
    frame = frame[FRAME_COLUMNS].reset_index(drop=True)
    group = frame.groupby(GROUP, sort=False).ngroup().to_numpy()
    sizes = np.bincount(group).astype(np.int64) if len(frame) else np.zeros(0, np.int64)
    batch = (np.cumsum(sizes * sizes) // PAIRS_PER_BATCH)[group] if len(frame) else group
    counts = dict.fromkeys(PAIR_COUNTS, 0)
    worst: list[pd.DataFrame] = []
    for part in (frame[batch == b] for b in np.unique(batch)):
        tally, bad = _pairs(part, windows, apart_s, slack_s, settle_s)
        for key, value in tally.items():
            counts[key] = (
                max(counts[key], value) if key == "worst_inversion_ms" else counts[key] + value
            )
        worst = [pd.concat([*worst, bad]).nlargest(EXAMPLES, "inversion_s")] if len(bad) else worst
    counts = {"deliveries": len(frame), **{k: int(v) for k, v in excluded.items()}, **counts}
    details: dict[str, Any] = {
        "apart_s": apart_s,
        "slack_s": slack_s,
        "settle_s": settle_s,
        "fault_windows": len(windows),
        "examples": [_example(r) for r in worst[0].itertuples()] if worst else [],
    }
    if not counts["pairs_judged"]:
        why = (
            "no author had two notifications delivered to one device"
            if not counts["pairs"]
            else "every pair of an author's notifications on one device was excused "
            "(posted close together, retried, or in a fault window)"
        )
        return Verdict(NAME, None, counts, {**details, "unknown": why})
    return Verdict(NAME, counts["later_delivered_first"] == 0, counts, details)


def _pairs(
    frame: pd.DataFrame, windows: list[Window], apart_s: float, slack_s: float, settle_s: float
) -> tuple[dict[str, int], pd.DataFrame]:
    """The counts of one batch of whole (device, author) groups, and its inverted pairs."""
    pairs = frame.merge(frame, on=GROUP, suffixes=("_m", "_n"))
    # m posted before n (by the instant each request went out).
    pairs = pairs[pairs["sent_n"].to_numpy(dtype=float) > pairs["sent_m"].to_numpy(dtype=float)]
    sent_m = pairs["sent_m"].to_numpy(dtype=float)
    first_m = pairs["first_m"].to_numpy(dtype=float)
    close = (
        pairs["sent_n"].to_numpy(dtype=float) < pairs["accepted_m"].to_numpy(dtype=float) + apart_s
    )
    retried = ~close & pairs["retried_m"].to_numpy(dtype=bool)
    in_fault = np.zeros(len(pairs), dtype=bool)
    for window in windows:
        in_fault |= (sent_m < window.stop + settle_s) & (first_m > window.start)
    in_fault &= ~close & ~retried
    judged = ~close & ~retried & ~in_fault
    inversion = first_m - pairs["first_n"].to_numpy(dtype=float)
    inverted = judged & (inversion > slack_s)
    bad = pairs[inverted].assign(inversion_s=inversion[inverted])
    tally = {
        "pairs": len(pairs),
        "close_together": int(close.sum()),
        "earlier_retried": int(retried.sum()),
        "earlier_in_fault": int(in_fault.sum()),
        "pairs_judged": int(judged.sum()),
        "later_delivered_first": int(inverted.sum()),
        "device_authors_out_of_order": len(bad[GROUP].drop_duplicates()),
        "worst_inversion_ms": int(round(float(bad["inversion_s"].max()) * 1000)) if len(bad) else 0,
    }
    return tally, bad


def _example(row: Any) -> dict[str, Any]:
    return {
        "tenant_id": row.tenant_id,
        "token": str(row.token)[:16],
        "author_id": row.author_id,
        "earlier": row.notification_id_m,
        "later": row.notification_id_n,
        "posted_apart_s": round(float(row.sent_n - row.accepted_m), 3),
        "earlier_delivered": round(float(row.first_m), 3),
        "later_delivered": round(float(row.first_n), 3),
        "inversion_s": round(float(row.inversion_s), 3),
    }


def check(
    expectation: Expectation,
    history: pd.DataFrame,
    apart_s: float = DEFAULT_APART_S,
    slack_s: float = DEFAULT_SLACK_S,
    settle_s: float = DEFAULT_SETTLE_S,
) -> Verdict:
    """The verdict over a history in memory."""
    provider = history[history["kind"] == "provider"]
    attempts = provider.groupby(KEY, sort=False)["time"].min().rename("attempt")
    got = history.iloc[delivery_rows(history)]
    firsts = got.groupby(KEY, sort=False)["time"].min().rename("first")
    expected = expectation.deliveries[[*KEY, "quiet_until"]].drop_duplicates(KEY)
    expected = expected.join(attempts, on=KEY).join(firsts, on=KEY)
    frame, excluded = deliveries_judged(
        expected.reset_index(drop=True),
        posts(history[history["kind"].isin(["inject", "inject_info"])]),
        set(expectation.reregistered),
    )
    return judge(frame, fault_windows(history), excluded, apart_s, slack_s, settle_s)


def check_store(
    store: HistoryStore,
    apart_s: float = DEFAULT_APART_S,
    slack_s: float = DEFAULT_SLACK_S,
    settle_s: float = DEFAULT_SETTLE_S,
) -> Verdict:
    """:func:`check` over a history on disk: the first request and first delivery of every
    expected (tenant, notification, device) in DuckDB; only those rows come out."""
    store.require_decided()
    faults = store.rows(["fault"], ["kind", "time", "detail"])
    injected = store.rows(
        ["inject", "inject_info"],
        ["kind", "tenant_id", "notification_id", "author_id", "time", "end"],
    )
    expected = store.frame(
        """WITH e AS (SELECT key, any_value(tenant) AS tenant, any_value(nid) AS nid,
                             any_value(tok) AS tok, any_value(quiet_until) AS quiet_until
                      FROM exp GROUP BY key),
        f AS (SELECT key, min(time) AS attempt, min(time) FILTER (WHERE got) AS first
              FROM prov WHERE key IN (SELECT key FROM e) GROUP BY key)
        SELECT t.value AS tenant_id, n.value AS notification_id, k.value AS token,
               e.quiet_until, f.attempt, f.first
        FROM e JOIN tenants t ON t.code = e.tenant JOIN nids n ON n.code = e.nid
        JOIN tokens k ON k.code = e.tok LEFT JOIN f ON f.key = e.key
        ORDER BY e.key"""
    )
    frame, excluded = deliveries_judged(
        expected, posts(injected), set(store.expectation.reregistered)
    )
    windows = fault_windows(faults, end=store.end_time)
    return judge(frame, windows, excluded, apart_s, slack_s, settle_s)


@checker(
    NAME,
    summary="each device gets an author's pushes in the order the author posted them",
    tolerances={
        "apart_s": DEFAULT_APART_S,
        "slack_s": DEFAULT_SLACK_S,
        "settle_s": DEFAULT_SETTLE_S,
    },
    out_of_core=True,
)
def probe(evidence: Evidence, tolerance: Mapping[str, Any]) -> Verdict:
    apart_s = float(tolerance["apart_s"])
    slack_s = float(tolerance["slack_s"])
    settle_s = float(tolerance["settle_s"])
    if evidence.store is not None:
        return check_store(evidence.store, apart_s, slack_s, settle_s)
    return check(evidence.expectation, evidence.history, apart_s, slack_s, settle_s)
