"""Effectively-once delivery: every expected (notification, device) delivered exactly once.

Deliveries are the provider ledger rows the device got (a 200, or "accepted then 5xx"); the
expectation comes from the oracle. A delivery the oracle did not expect (no consent, still in
quiet hours, a dead token, another tenant's device, an id never injected) counts as unexpected;
one the oracle marks optional (an event whose acceptance is unknown, a recipient who changed
mid-run) may arrive once or not at all.

``duplicated`` counts every delivery beyond the first. Each is attributed to a cause the design
admits (:mod:`harness.checkers.duplicate_causes`: accepted-then-error, a consumer killed between
its send and its 'sent' mark, a volatile store's failover, a redrive past the 30-day TTL) or
counted ``unattributed``: any unattributed duplicate fails the verdict, collapse id or not. Of
the duplicates, ``collapsed`` carried the same collapse id as the first (APNs
``apns-collapse-id``, FCM ``collapse_key``): the device shows them as one notification.
``visible_duplicates`` = duplicated - collapsed is what a user sees; a scenario gates on it
(default none) and may also gate on the raw count (``max_duplicated``); every figure is always
reported so the raw rate stays honest.

Deliveries to a device whose user was erased and registered again are judged by the
``erasure`` checker from the registration on (the same ids, a new person in law).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from harness.checkers import duplicate_causes
from harness.checkers.evidence import Evidence
from harness.checkers.keys import codes, first_rows, joint_keys, member, rows_with, sorted_unique
from harness.checkers.registry import checker
from harness.checkers.store import HistoryStore
from harness.checkers.verdict import Verdict
from harness.checkers.windows import delivery_rows, fault_windows
from harness.model.oracle import Expectation

KEY = ["tenant_id", "notification_id", "token"]
EXAMPLES = 5


def _per_key(keys: np.ndarray, collapse: np.ndarray, width: int) -> tuple[np.ndarray, ...]:
    """Distinct keys (sorted), deliveries per key, and per key the smallest and largest
    collapse code of its deliveries."""
    if len(keys) and int(keys.max()) < 2**62 // width:
        # One sort of (key, collapse code) packed in one int64.
        packed = np.sort(keys * width + collapse)
        keys, collapse = packed // width, packed % width
    else:
        order = np.argsort(keys)
        keys, collapse = keys[order], collapse[order]
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]]) if len(keys) else keys[:0]
    n = np.diff(np.r_[starts, len(keys)])
    if not len(keys):
        return keys, n, n, n
    low = np.minimum.reduceat(collapse, starts)
    high = np.maximum.reduceat(collapse, starts)
    return keys[starts], n, low, high


def reregistered_mask(history: pd.DataFrame, expectation: Expectation) -> pd.Series:
    """Provider rows to a device of an erased user at or after their registration again."""
    mask = np.zeros(len(history), dtype=bool)
    if expectation.reregistered:
        tokens = {token for _, token in expectation.reregistered}
        candidates = np.flatnonzero(
            (history["kind"] == "provider").to_numpy(dtype=bool, na_value=False)
            & rows_with(history, "token", tokens)
        )
        for i in candidates:
            row = history.iloc[i]
            since = expectation.reregistered.get((str(row["tenant_id"]), str(row["token"])))
            mask[i] = since is not None and float(row["time"]) >= since
    return pd.Series(mask, index=history.index)


def check(
    expectation: Expectation,
    history: pd.DataFrame,
    max_visible_duplicates: int = 0,
    max_lost: int = 0,
    max_duplicated: int | None = None,
    max_unattributed: int = 0,
    durable: bool = True,
    kill_window_s: float = duplicate_causes.DEFAULT_KILL_WINDOW_S,
) -> Verdict:
    """Tolerances default to none: a scenario may accept a residual (e.g. a volatile dedup
    store losing its keys in a crash) and still see the figure reported."""
    excluded = reregistered_mask(history, expectation)
    rows = delivery_rows(history)
    rows = rows[~excluded.to_numpy(dtype=bool)[rows]]
    expected_keys, optional_keys, history_keys = joint_keys(
        [expectation.deliveries, expectation.optional, history], KEY
    )
    delivered_keys = history_keys[rows]
    # Keys are integers that sort as the key tuples do: the outer merge of expected keys with
    # per-key delivery counts lists the smallest first, and examples are its first rows.
    expected = sorted_unique(expected_keys)
    optional = sorted_unique(optional_keys)
    (collapse_codes,), distinct_ids = codes((history, "collapse_id"))
    missing_id = history["collapse_id"].isna().to_numpy(dtype=bool)[rows]
    collapse = np.where(missing_id, distinct_ids, collapse_codes[rows])
    keys, n, low, high = _per_key(delivered_keys, collapse, distinct_ids + 1)
    expected_hit = member(keys, expected, ordered=True)
    optional_hit = member(keys, optional, ordered=True) & ~expected_hit
    lost_mask = ~member(expected, keys, ordered=True)
    # One collapse id, carried by every delivery of the key: the device shows one notification.
    collapsed_per_key = np.where((low == high) & (high != distinct_ids), n - 1, 0)

    lost = int(lost_mask.sum())
    delivered = int(expected_hit.sum())
    duplicated = int(len(delivered_keys) - len(keys))
    unexpected = int(n[~expected_hit & ~optional_hit].sum())
    causes = duplicate_causes.attribute(history, durable, kill_window_s, excluded)
    by_cause = causes["cause"].value_counts()
    unattributed = int(by_cause.get(duplicate_causes.UNATTRIBUTED, 0))
    collapsed = int(collapsed_per_key[expected_hit].sum())
    visible_duplicates = duplicated - collapsed
    counts = {
        "expected": int(len(expected)),
        "delivered": delivered,
        "duplicated": duplicated,
        "collapsed": collapsed,
        "visible_duplicates": visible_duplicates,
        "lost": lost,
        "unexpected": unexpected,
        "optional_delivered": int(optional_hit.sum()),
        "optional_expected": int(len(optional)),
        "unattributed_duplicates": unattributed,
        **{f"duplicates_{c}": int(by_cause.get(c, 0)) for c in duplicate_causes.ADMITTED},
    }
    duplicate_rate = duplicated / delivered * 1_000_000 if delivered else 0.0
    suppressed = {f"suppressed_{k}": int(v) for k, v in sorted(expectation.suppressed.items())}

    def records(frame: pd.DataFrame, frame_keys: np.ndarray, wanted: np.ndarray) -> list:
        found = frame[KEY].iloc[first_rows(frame_keys, wanted[:EXAMPLES])]
        return found.astype(object).to_dict("records")

    duplicated_keys = np.flatnonzero(expected_hit & (n > 1))[:EXAMPLES]
    duplicate_examples = records(history, history_keys, keys[duplicated_keys])
    # The merge leaves n as float once a lost key gives it a missing value.
    as_n = float if lost else int
    for record, index in zip(duplicate_examples, duplicated_keys, strict=True):
        record["n"] = as_n(n[index])
    examples = {
        "duplicates_per_million": round(duplicate_rate, 1),
        "tolerance": {
            "max_visible_duplicates": max_visible_duplicates,
            "max_lost": max_lost,
            "max_duplicated": max_duplicated,
            "max_unattributed": max_unattributed,
            "kill_window_s": kill_window_s,
        },
        "lost_examples": records(expectation.deliveries, expected_keys, expected[lost_mask]),
        "duplicate_examples": duplicate_examples,
        "unexpected_examples": records(history, history_keys, keys[~expected_hit & ~optional_hit]),
        "unattributed_examples": causes[causes["cause"] == duplicate_causes.UNATTRIBUTED]
        .head(EXAMPLES)
        .astype(object)
        .to_dict("records"),
    }
    valid = (
        visible_duplicates <= max_visible_duplicates
        and lost <= max_lost
        and unexpected == 0
        and unattributed <= max_unattributed
        and (max_duplicated is None or duplicated <= max_duplicated)
    )
    return Verdict("effectively_once", valid, {**counts, **suppressed}, examples)


def check_store(
    store: HistoryStore,
    max_visible_duplicates: int = 0,
    max_lost: int = 0,
    max_duplicated: int | None = None,
    max_unattributed: int = 0,
    durable: bool = True,
    kill_window_s: float = duplicate_causes.DEFAULT_KILL_WINDOW_S,
) -> Verdict:
    """:func:`check` over a history on disk: the same counts, in DuckDB (the expectation is the
    store's)."""
    store.require_decided()
    expectation = store.expectation
    rereg = [
        (tenant, token, float(since)) for (tenant, token), since in expectation.reregistered.items()
    ]
    store.register(
        "rereg",
        pa.table(
            {
                "tenant_id": pa.array([t for t, _, _ in rereg], pa.string()),
                "token": pa.array([k for _, k, _ in rereg], pa.string()),
                "since": pa.array([s for _, _, s in rereg], pa.float64()),
            }
        ),
    )
    if rereg:
        # Deliveries less those to a re-registered device from its registration on.
        store.run(
            """CREATE OR REPLACE TABLE once_rows AS
            SELECT p.pos, p.key, p.col, p.time, p.status, p.seq FROM prov p
            WHERE p.got AND NOT EXISTS (
                SELECT 1 FROM rereg r JOIN tenants t ON t.value = r.tenant_id
                JOIN tokens k ON k.value = r.token
                WHERE t.code = p.tenant AND k.code = p.tok AND p.time >= r.since)"""
        )
        store.run(
            """CREATE OR REPLACE TABLE once_per_key AS
            SELECT key, count(*) AS n, count(col) = count(*) AND min(col) = max(col) AS one_id
            FROM once_rows GROUP BY key"""
        )
        rows, per_key = "once_rows", "once_per_key"
    else:
        rows, per_key = "(SELECT * FROM prov WHERE got)", store.delivered_keys()
    expected_keys = store.expected_keys()
    store.run(
        f"""CREATE OR REPLACE TABLE once_keys AS
        SELECT d.key, d.n, d.one_id, x.key IS NOT NULL AS expected,
               x.key IS NULL AND o.key IS NOT NULL AS optional
        FROM {per_key} d
        LEFT JOIN {expected_keys} x ON x.key = d.key
        LEFT JOIN opt o ON o.key = d.key"""
    )
    delivered, optional_hit, unexpected, collapsed, distinct, total = store.one(
        """SELECT count(*) FILTER (expected), count(*) FILTER (optional),
                  coalesce(sum(n) FILTER (NOT expected AND NOT optional), 0),
                  coalesce(sum(n - 1) FILTER (expected AND one_id), 0),
                  count(*), coalesce(sum(n), 0)
           FROM once_keys"""
    )
    (expected,) = store.one(f"SELECT count(*) FROM {expected_keys}")
    (optional,) = store.one("SELECT count(*) FROM opt")
    lost_keys = [
        k
        for (k,) in store.sql(
            f"""SELECT key FROM {expected_keys} x ANTI JOIN {per_key} d ON d.key = x.key
            ORDER BY key"""
        ).fetchall()
    ]
    lost = len(lost_keys)
    duplicated = int(total) - int(distinct)
    # Every delivery of a key delivered more than once: few, attributed as in memory.
    repeated = store.frame(
        f"""SELECT r.key, r.time, r.status, r.seq FROM {rows} r
        WHERE r.key IN (SELECT key FROM once_keys WHERE n > 1) ORDER BY r.pos"""
    )
    decoded = pd.DataFrame(store.decode_keys(repeated["key"].tolist()), columns=KEY)
    candidates = pd.concat(
        [decoded, repeated[["time", "status", "seq"]].reset_index(drop=True)], axis=1
    )
    faults = store.rows(["fault"], ["kind", "time", "detail"])
    kills = fault_windows(faults, ("consumer-crash",), end=store.end_time)
    crashes = fault_windows(faults, ("dedup-crash",), end=store.end_time)
    causes = duplicate_causes.attribute_repeated(candidates, kills, crashes, durable, kill_window_s)
    by_cause = causes["cause"].value_counts()
    unattributed = int(by_cause.get(duplicate_causes.UNATTRIBUTED, 0))
    visible_duplicates = duplicated - int(collapsed)
    counts = {
        "expected": int(expected),
        "delivered": int(delivered),
        "duplicated": duplicated,
        "collapsed": int(collapsed),
        "visible_duplicates": visible_duplicates,
        "lost": lost,
        "unexpected": int(unexpected),
        "optional_delivered": int(optional_hit),
        "optional_expected": int(optional),
        "unattributed_duplicates": unattributed,
        **{f"duplicates_{c}": int(by_cause.get(c, 0)) for c in duplicate_causes.ADMITTED},
    }
    duplicate_rate = duplicated / delivered * 1_000_000 if delivered else 0.0
    suppressed = {f"suppressed_{k}": int(v) for k, v in sorted(expectation.suppressed.items())}
    as_n = float if lost else int
    duplicate_rows = store.sql(
        f"SELECT key, n FROM once_keys WHERE expected AND n > 1 ORDER BY key LIMIT {EXAMPLES}"
    ).fetchall()
    duplicate_examples = store.decode_keys([k for k, _ in duplicate_rows])
    for record, (_, n) in zip(duplicate_examples, duplicate_rows, strict=True):
        record["n"] = as_n(n)
    unexpected_keys = store.sql(
        "SELECT key FROM once_keys WHERE NOT expected AND NOT optional "
        f"ORDER BY key LIMIT {EXAMPLES}"
    ).fetchall()
    examples = {
        "duplicates_per_million": round(duplicate_rate, 1),
        "tolerance": {
            "max_visible_duplicates": max_visible_duplicates,
            "max_lost": max_lost,
            "max_duplicated": max_duplicated,
            "max_unattributed": max_unattributed,
            "kill_window_s": kill_window_s,
        },
        "lost_examples": store.decode_keys(lost_keys[:EXAMPLES]),
        "duplicate_examples": duplicate_examples,
        "unexpected_examples": store.decode_keys([k for (k,) in unexpected_keys]),
        "unattributed_examples": causes[causes["cause"] == duplicate_causes.UNATTRIBUTED]
        .head(EXAMPLES)
        .astype(object)
        .to_dict("records"),
    }
    valid = (
        visible_duplicates <= max_visible_duplicates
        and lost <= max_lost
        and unexpected == 0
        and unattributed <= max_unattributed
        and (max_duplicated is None or duplicated <= max_duplicated)
    )
    return Verdict("effectively_once", valid, {**counts, **suppressed}, examples)


@checker(
    "effectively_once",
    summary="every expected (notification, device) delivered exactly once, none lost",
    tolerances={
        "max_visible_duplicates": 0,
        "max_lost": 0,
        "max_duplicated": None,
        "max_unattributed": 0,
        "kill_window_s": duplicate_causes.DEFAULT_KILL_WINDOW_S,
    },
    out_of_core=True,
)
def probe(evidence: Evidence, tolerance: Mapping[str, Any]) -> Verdict:
    limit = tolerance["max_duplicated"]
    if evidence.store is not None:
        return check_store(
            evidence.store,
            max_visible_duplicates=int(tolerance["max_visible_duplicates"]),
            max_lost=int(tolerance["max_lost"]),
            max_duplicated=None if limit is None else int(limit),
            max_unattributed=int(tolerance["max_unattributed"]),
            durable=evidence.policy.durable_dedup_store,
            kill_window_s=float(tolerance["kill_window_s"]),
        )
    return check(
        evidence.expectation,
        evidence.history,
        max_visible_duplicates=int(tolerance["max_visible_duplicates"]),
        max_lost=int(tolerance["max_lost"]),
        max_duplicated=None if limit is None else int(limit),
        max_unattributed=int(tolerance["max_unattributed"]),
        durable=evidence.policy.durable_dedup_store,
        kill_window_s=float(tolerance["kill_window_s"]),
    )
