"""Rate limits: at most ``per_window`` notifications per user in any sliding window, the excess
collapsed into one digest per window, nothing lost or counted twice on the way, and a daily cap
per (device, kind, local day). Redeliveries must not spend the budget.

Only the provider ledgers and the oracle are read, never the system's state or logs:

* an *individual* request carries an injected notification id; its first attempt (any status)
  to any of the user's devices is when the limiter admitted it (give or take ``slack_s``);
* a *digest* request carries an id nobody injected and a collapse id ``digest-<start ms>-<N>``:
  the window it closed and how many held notifications it stands for;
* the oracle says which notifications each user must get. Every one of them is either admitted
  (a request for it) or held and counted in exactly one digest the user received.

Counts:

* ``over_limit_sent``: admissions beyond ``per_window`` inside ``window_seconds - slack_s``
  (the slack covers the time between the limiter's decision and the request);
* ``digests_expected`` / ``digests_delivered`` / ``digests_missing``: users with held
  notifications, digest windows delivered, users whose held notifications got no digest;
* ``duplicate_digests``: a digest delivered again to a device, or a second digest window of a
  user opened before the first had closed;
* ``digest_undercount`` / ``digest_overcount``: held notifications no digest counted (lost), and
  digest counts beyond the notifications that were held (a redelivery counted, or a
  notification both sent and digested);
* ``redeliveries_counted``: digest windows opened while the sliding window before them held
  fewer than ``per_window`` admitted notifications: the budget went to something other than
  distinct notifications;
* ``over_daily_limit``: deliveries beyond the cap per (device, kind, local day).

With the daily cap on, a notification the cap blocked on every device of its user is not
distinguishable from a held one; it is allowed either way (the digest count may or may not
include it).
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import numpy as np
import pandas as pd

from harness.checkers.verdict import Verdict
from harness.oracle import Expectation
from harness.population import Population

_DIGEST = re.compile(r"^digest-(\d+)-(\d+)$")


@dataclass(frozen=True)
class _Digest:
    tenant_id: str
    user_id: str
    start_ms: int
    count: int


def parse_digest(collapse_id: object) -> tuple[int, int] | None:
    """``(window start ms, count)`` from a digest's collapse id, None for anything else."""
    if not isinstance(collapse_id, str):
        return None
    match = _DIGEST.match(collapse_id)
    return (int(match[1]), int(match[2])) if match else None


def _over_limit(times: np.ndarray, per_window: int, span: float) -> int:
    """How many of the sorted instants are beyond the ``per_window``-th inside some half-open
    span ``(t - span, t]``."""
    lo = np.searchsorted(times, times - span, side="right")
    inside = np.arange(len(times)) - lo + 1
    return int((inside > per_window).sum())


def _local_day(instant: float, zone: str) -> str:
    try:
        tz = ZoneInfo(zone)
    except Exception:  # the population only uses real zones; a bad one buckets in UTC
        tz = ZoneInfo("UTC")
    return datetime.fromtimestamp(instant, UTC).astimezone(tz).date().isoformat()


def check(
    population: Population,
    expectation: Expectation,
    history: pd.DataFrame,
    per_window: int,
    window_seconds: float,
    daily_limit: int = 0,
    slack_s: float = 1.0,
) -> Verdict:
    """``per_window`` / ``daily_limit`` 0 means that limit is off (its counts stay 0)."""
    owner = {(d.tenant_id, d.token): d.user_id for d in population.devices}
    injected = history[history["kind"] == "inject"]
    kinds = {
        (t, n): (k if isinstance(k, str) else "post")
        for t, n, k in zip(
            injected["tenant_id"], injected["notification_id"], injected["detail"], strict=True
        )
    }
    provider = history[history["kind"] == "provider"]
    delivered_flag = (
        provider["delivered"].fillna(provider["status"] == 200).astype(bool)
        if "delivered" in provider.columns
        else provider["status"] == 200
    )

    first_attempt: dict[tuple[str, str, str], float] = {}  # (tenant, user, nid) -> time
    delivered_individual: list[tuple[str, str, str, float]] = []  # tenant, token, nid, time
    digest_rows: dict[tuple[str, str, int], int] = defaultdict(int)  # (tenant, token, S) -> n
    digests: dict[tuple[str, str, int], _Digest] = {}
    unrecognised = 0
    for row, delivered in zip(
        provider[["tenant_id", "token", "notification_id", "time", "collapse_id"]].itertuples(
            index=False, name=None
        ),
        delivered_flag,
        strict=True,
    ):
        tenant, token, nid, at, collapse = row
        user = owner.get((tenant, token))
        if user is None:
            continue  # another tenant's device: tenant_isolation's business
        if (tenant, nid) in kinds:
            key = (tenant, user, nid)
            if key not in first_attempt or at < first_attempt[key]:
                first_attempt[key] = float(at)
            if delivered:
                delivered_individual.append((tenant, token, nid, float(at)))
            continue
        parsed = parse_digest(collapse)
        if parsed is None:
            unrecognised += 1
            continue
        if not delivered:
            continue
        start, count = parsed
        digest_rows[(tenant, token, start)] += 1
        previous = digests.get((tenant, user, start))
        # Copies of one digest carry one count; should they differ, the larger is charged.
        if previous is None or count > previous.count:
            digests[(tenant, user, start)] = _Digest(tenant, user, start, count)

    attempts_by_user: dict[tuple[str, str], list[float]] = defaultdict(list)
    attempted_by_user: dict[tuple[str, str], set[str]] = defaultdict(set)
    for (tenant, user, nid), at in first_attempt.items():
        attempts_by_user[(tenant, user)].append(at)
        attempted_by_user[(tenant, user)].add(nid)
    sorted_attempts = {key: np.sort(np.array(v)) for key, v in attempts_by_user.items()}

    window_on = per_window > 0
    span = float(window_seconds) - slack_s
    over_limit = 0
    if window_on and span > 0:
        over_limit = sum(_over_limit(t, per_window, span) for t in sorted_attempts.values())

    digests_by_user: dict[tuple[str, str], list[_Digest]] = defaultdict(list)
    for digest in digests.values():
        digests_by_user[(digest.tenant_id, digest.user_id)].append(digest)
    duplicate = sum(n - 1 for n in digest_rows.values() if n > 1)
    overlapping = 0
    for items in digests_by_user.values():
        starts = sorted(d.start_ms for d in items)
        overlapping += sum(
            1 for a, b in zip(starts, starts[1:], strict=False) if b - a < window_seconds * 1000
        )

    redeliveries_counted = 0
    redelivery_examples = []
    if window_on:
        for digest in digests.values():
            times = sorted_attempts.get((digest.tenant_id, digest.user_id), np.array([]))
            opened = digest.start_ms / 1000
            lo = np.searchsorted(times, opened - window_seconds, side="right")
            hi = np.searchsorted(times, opened + slack_s, side="right")
            if hi - lo < per_window:
                redeliveries_counted += 1
                if len(redelivery_examples) < 5:
                    redelivery_examples.append(
                        {
                            "tenant_id": digest.tenant_id,
                            "user_id": digest.user_id,
                            "window_start_ms": digest.start_ms,
                            "admitted_before": int(hi - lo),
                        }
                    )

    over_daily = 0
    full_buckets: set[tuple[str, str, str]] = set()  # (tenant, token, kind) capped on some day
    if daily_limit > 0:
        day_counts: dict[tuple[str, str, str, str], set[str]] = defaultdict(set)
        for tenant, token, nid, at in delivered_individual:
            zone = population.user(tenant, owner[(tenant, token)]).zone
            day_counts[(tenant, token, kinds[(tenant, nid)], _local_day(at, zone))].add(nid)
        over_daily = sum(max(0, len(n) - daily_limit) for n in day_counts.values())
        full_buckets = {key[:3] for key, n in day_counts.items() if len(n) >= daily_limit}

    expected_by_user: dict[tuple[str, str], dict[str, set[str]]] = defaultdict(
        lambda: defaultdict(set)
    )
    for tenant, nid, token, user in expectation.deliveries[
        ["tenant_id", "notification_id", "token", "user_id"]
    ].itertuples(index=False, name=None):
        expected_by_user[(tenant, user)][nid].add(token)

    digests_expected = digests_missing = undercount = overcount = held_total = 0
    count_examples = []
    # Without the window nothing is held: an expected notification that never came is lost,
    # which is effectively_once's verdict, not this one's.
    users = set(expected_by_user) | set(digests_by_user) if window_on else set()
    for key in sorted(users):
        tenant, user = key
        expected = expected_by_user.get(key, {})
        held = set(expected) - attempted_by_user.get(key, set())
        # A notification the daily cap blocked on every one of its devices was never sent
        # either; it may or may not also sit in a digest.
        capped = {
            nid
            for nid in held
            if all((tenant, token, kinds[(tenant, nid)]) in full_buckets for token in expected[nid])
        }
        counted = sum(d.count for d in digests_by_user.get(key, []))
        must, may = len(held) - len(capped), len(held)
        held_total += len(held)
        if must > 0:
            digests_expected += 1
            if not digests_by_user.get(key):
                digests_missing += 1
        if counted < must:
            undercount += must - counted
        if counted > may:
            overcount += counted - may
        if (counted < must or counted > may) and len(count_examples) < 5:
            count_examples.append(
                {"tenant_id": tenant, "user_id": user, "held": len(held), "in_digests": counted}
            )

    counts = {
        "admitted": len(first_attempt),
        "held": held_total,
        "over_limit_sent": over_limit,
        "digests_expected": digests_expected,
        "digests_delivered": len(digests),
        "digests_missing": digests_missing,
        "duplicate_digests": duplicate + overlapping,
        "digest_undercount": undercount,
        "digest_overcount": overcount,
        "redeliveries_counted": redeliveries_counted,
        "over_daily_limit": over_daily,
        "unrecognised_requests": unrecognised,
    }
    gating = (
        "over_limit_sent",
        "digests_missing",
        "duplicate_digests",
        "digest_undercount",
        "digest_overcount",
        "redeliveries_counted",
        "over_daily_limit",
    )
    details = {
        "per_window": per_window,
        "window_seconds": window_seconds,
        "daily_limit": daily_limit,
        "slack_s": slack_s,
        "count_examples": count_examples,
        "redelivery_examples": redelivery_examples,
    }
    return Verdict("rate_limit", all(counts[k] == 0 for k in gating), counts, details)
