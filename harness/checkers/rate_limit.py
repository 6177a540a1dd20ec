"""Rate limits: at most ``per_window`` notifications per user in any sliding window, the excess
collapsed into one digest per window, nothing lost or counted twice on the way, and a daily cap
per (device, kind, local day). Redeliveries must not spend the budget.

Only the provider ledgers (and, for a system that publishes through SNS, SNS's own publish
ledger) and the oracle are read, never the system's state or logs:

* an *individual* request carries an injected notification id; its first attempt (any status)
  to any of the user's devices is when the limiter admitted it (give or take ``slack_s``);
* through SNS, the first publish of the notification to one of the user's endpoints is its first
  attempt when it came earlier: SNS's hop to the provider (a cold connection, an OAuth token
  fetched) is no part of the limiter's decision;
* a *digest* request carries an id nobody injected and a collapse id ``digest-<start ms>-<N>``:
  the window it closed and how many held notifications it stands for;
* the oracle says which notifications each user must get. Every one of them is either admitted
  (a request for it) or held and counted in exactly one digest the user received.

Counts:

* ``over_limit_sent``: admissions surely beyond ``per_window`` inside ``window_seconds -
  slack_s``: each decision lies between the notification's injection and its first attempt,
  and only admissions whose decisions must share a window count (:func:`over_limit`), so a
  slow send on a loaded machine is never the limiter's fault;
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
* ``over_daily_limit``: deliveries beyond the cap per (device, kind, local day), the day in the
  recipient's IANA zone *on the system's clock* (real time plus the offset a scenario moved it
  by, :mod:`harness.contract.clock`). A delivery's day is that of its decision, which lies
  between its injection and its first request to the device: one whose interval spans a
  midnight may count on either day, and is put where it breaks no cap if one has room;
  ``daily_buckets_at_limit``: those buckets the cap filled (not judged: it says the cap was
  exercised);
* ``withheld_below_daily_limit`` (the window off, the daily cap on): expected deliveries that
  never came to a device none of whose (kind, local day) buckets the notification's decision
  could fall in (from its injection to the run's last observation) was full: a cap that did
  not reset at the user's midnight, or counted another day's sends. (A delivery lost for
  another reason counts here too; effectively_once says which.)

With the daily cap on, a notification the cap blocked on every device of its user is not
distinguishable from a held one; it is allowed either way (the digest count may or may not
include it), if each device's bucket was full on a local day its decision can fall in.

A digest's collapse id names its window's start on the system's clock: it is read back in real
time (the offset taken off) before it is compared with the requests' times.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import numpy as np
import pandas as pd
import pyarrow as pa

from harness.checkers.evidence import Evidence
from harness.checkers.keys import joint_keys, member, sorted_unique
from harness.checkers.limited import parse_digest
from harness.checkers.registry import checker
from harness.checkers.store import HistoryStore
from harness.checkers.verdict import Verdict
from harness.checkers.windows import delivery_rows, injection_times
from harness.model.oracle import Expectation
from harness.model.population import Population


@dataclass(frozen=True)
class _Digest:
    tenant_id: str
    user_id: str
    start_ms: int
    count: int


def _strings(values: list[object]) -> pa.Array:
    return pa.array([v if isinstance(v, str) else None for v in values], pa.large_string())


def _local_day(instant: float, zone: str) -> date:
    """The calendar day in ``zone`` at ``instant`` (epoch seconds, on the system's clock)."""
    try:
        tz = ZoneInfo(zone)
    except Exception:  # the population only uses real zones; a bad one buckets in UTC
        tz = ZoneInfo("UTC")
    return datetime.fromtimestamp(instant, UTC).astimezone(tz).date()


def decision_days(after: float, before: float, zone: str, offset_s: float) -> tuple[date, date]:
    """The first and last local day (in ``zone``, on a clock ``offset_s`` ahead of real time)
    a decision taken between the real instants ``after`` and ``before`` can fall on; a missing
    (NaN) ``after`` is ``before``."""
    first = before if np.isnan(after) else min(after, before)
    return _local_day(first + offset_s, zone), _local_day(before + offset_s, zone)


def daily_overage(
    certain: Mapping[date, int], spanning: Iterable[tuple[date, date]], cap: int
) -> tuple[int, dict[date, int]]:
    """Sends beyond ``cap`` per day, and the count per day, when ``certain[d]`` sends surely
    fell on day ``d`` and each of ``spanning`` on some day in its (first, last) range: each is
    put on the earliest day of its range with room, the ranges taken by their last day (the
    greedy order that fits the most intervals under per-day capacities), else on its last."""
    counts = dict(certain)
    over = sum(max(0, n - cap) for n in counts.values())
    for first, last in sorted(spanning, key=lambda r: (r[1], r[0])):
        day = first
        while day <= last and counts.get(day, 0) >= cap:
            day += timedelta(days=1)
        if day > last:
            day, over = last, over + 1
        counts[day] = counts.get(day, 0) + 1
    return over, counts


def check(
    population: Population,
    expectation: Expectation,
    history: pd.DataFrame,
    per_window: int,
    window_seconds: float,
    daily_limit: int = 0,
    slack_s: float = 1.0,
    clock_offset_s: float = 0.0,
) -> Verdict:
    """``per_window`` / ``daily_limit`` 0 means that limit is off (its counts stay 0);
    ``clock_offset_s``: how far the system's clock ran ahead of real time."""
    owner = {(d.tenant_id, d.token): d.user_id for d in population.devices}
    injects = history[history["kind"] == "inject"]
    kinds, injected_at = event_kinds(injects), injection_times(injects).to_dict()
    window_on = per_window > 0
    is_provider = (history["kind"] == "provider").to_numpy(dtype=bool, na_value=False)
    delivered_row = np.zeros(len(history), dtype=bool)
    delivered_row[delivery_rows(history)] = True

    # Each provider row's device owner, from the same (tenant, token) -> user map (the last
    # device listed wins), joined as integer keys instead of one dict lookup per row.
    owner_frame = pd.DataFrame(
        {
            "tenant_id": pd.arrays.ArrowExtensionArray(_strings([k[0] for k in owner])),
            "token": pd.arrays.ArrowExtensionArray(_strings([k[1] for k in owner])),
        }
    )
    row_device, owner_device = joint_keys([history, owner_frame], ["tenant_id", "token"])
    device_order = np.argsort(owner_device)
    if owner:
        found = np.searchsorted(owner_device[device_order], row_device)
        found = np.minimum(found, len(owner) - 1)
        owned = is_provider & (owner_device[device_order][found] == row_device)
        device_of_row = device_order[found]
    else:
        owned = np.zeros(len(history), dtype=bool)
        device_of_row = np.zeros(len(history), dtype=np.int64)
    owner_users = list(owner.values())
    person: dict[tuple[str, str], int] = {}
    person_of_device = np.array(
        [
            person.setdefault((t, u), len(person))
            for (t, _), u in zip(owner, owner_users, strict=True)
        ],
        dtype=np.int64,
    )
    (row_event,) = joint_keys([history], ["tenant_id", "notification_id"])
    is_inject = (history["kind"] == "inject").to_numpy(dtype=bool, na_value=False)
    injected_event = member(row_event, sorted_unique(row_event[is_inject]))
    individual = np.flatnonzero(owned & injected_event)

    # First attempt per (tenant, user, notification): the earliest time, except that a NaN on
    # the first row stands, as it does in a running "keep it if earlier" (nothing is below NaN).
    events = np.searchsorted(sorted_unique(row_event[individual]), row_event[individual])
    group = events * max(len(person), 1) + person_of_device[device_of_row[individual]]
    order = np.argsort(group, kind="stable")
    ordered = group[order]
    new_group = np.r_[True, ordered[1:] != ordered[:-1]] if len(order) else np.zeros(0, bool)
    starts = np.flatnonzero(new_group)
    times = history["time"].to_numpy(dtype=np.float64, na_value=np.nan)[individual][order]
    if len(starts):
        earliest = np.fmin.reduceat(times, starts)
        earliest[np.isnan(times[starts])] = np.nan
    else:
        earliest = np.zeros(0, dtype=np.float64)
    admitted = len(starts)

    first_attempt: dict[tuple[str, str, str], float] = {}  # (tenant, user, nid) -> time
    delivered_individual: list[tuple[str, str, str, float]] = []  # tenant, token, nid, time
    if window_on or daily_limit > 0:
        rows = individual[order[starts]]
        tenants = history["tenant_id"].iloc[rows].tolist()
        nids = history["notification_id"].iloc[rows].tolist()
        users = [owner_users[d] for d in device_of_row[rows]]
        for tenant, user, nid, at in zip(tenants, users, nids, earliest.tolist(), strict=True):
            first_attempt[(tenant, user, nid)] = at
        sns = history.loc[
            history["kind"] == "sns_publish", ["tenant_id", "token", "notification_id", "time"]
        ]
        earlier_at_sns(first_attempt, owner, sns.itertuples(index=False, name=None))
    if daily_limit > 0:
        rows = individual[delivered_row[individual]]
        columns = ["tenant_id", "token", "notification_id", "time"]
        delivered_individual = [
            (tenant, token, nid, float(at))
            for tenant, token, nid, at in history[columns]
            .iloc[rows]
            .itertuples(index=False, name=None)
        ]

    # Requests for notifications nobody injected: digests, or unrecognised.
    others = np.flatnonzero(owned & ~injected_event)
    other_rows = [
        (*row, delivered)
        for row, delivered in zip(
            history[["tenant_id", "token", "notification_id", "time", "collapse_id"]]
            .iloc[others]
            .itertuples(index=False, name=None),
            delivered_row[others].tolist(),
            strict=True,
        )
    ]
    # Read only with a limit on (below); the row loop over every expected delivery is most of
    # the checker's time otherwise.
    # The pushes a limit may have withheld are this checker's to judge (checkers/limited.py).
    columns = ["tenant_id", "notification_id", "token", "user_id"]
    expected_rows = pd.concat([expectation.deliveries[columns], expectation.limited[columns]])
    return judge(
        population, owner, kinds, admitted, first_attempt, delivered_individual, other_rows,
        expected_rows.itertuples(index=False, name=None) if window_on or daily_limit > 0 else (),
        per_window, window_seconds, daily_limit, slack_s, injected_at, clock_offset_s,
    )  # fmt: skip


def earlier_at_sns(
    first_attempt: dict[tuple[str, str, str], float],
    owner: Mapping[tuple[str, str], str],
    publishes: Iterable[tuple[Any, Any, Any, Any]],
) -> None:
    """Move a first attempt earlier to the first SNS publish (tenant, token, notification, time)
    for the same user and notification; only notifications that reached a provider count."""
    for tenant, token, nid, at in publishes:
        user = owner.get((tenant, token))
        key = (tenant, user, nid)
        if user is not None and key in first_attempt and at < first_attempt[key]:
            first_attempt[key] = float(at)


def event_kinds(injected: pd.DataFrame) -> dict[tuple[Any, Any], str]:
    """(tenant, notification) -> its kind, of the injected events."""
    return {
        (t, n): (k if isinstance(k, str) else "post")
        for t, n, k in zip(
            injected["tenant_id"], injected["notification_id"], injected["detail"], strict=True
        )
    }


def over_limit(attempts: np.ndarray, injected: np.ndarray, per_window: int, span: float) -> int:
    """Admissions surely beyond ``per_window`` in a window shorter than ``span``, of one user.

    The harness never sees the limiter's decision, only bounds on it: after the notification
    was injected, before its first attempt at a provider. An admission ``i`` (by first attempt)
    is over the limit when more than ``per_window`` admissions ``j`` with ``attempt_j <=
    attempt_i`` were injected after ``attempt_i - span``: all of their decisions then fall in
    ``(attempt_i - span, attempt_i]``, however long each waited for its send. The first
    attempts alone (the rule before) blamed the limiter for a loaded machine's send lag: a
    clean like-storm run on a 2-core machine at load 18 had 8 admissions over."""
    order = np.argsort(attempts, kind="stable")
    at, inj = attempts[order], injected[order]
    hi = np.searchsorted(at, at, side="right")
    lo = np.searchsorted(at, at - span, side="right")
    over = 0
    # Only where the attempts alone crowd the window need the injections be looked at (only
    # there can the bound find more than per_window); a correct system has few such.
    for i in np.flatnonzero(hi - lo > per_window):
        if int((inj[lo[i] : hi[i]] > at[i] - span).sum()) > per_window:
            over += 1
    return over


def late_admissions(
    attempts: np.ndarray,
    injected: np.ndarray,
    earliest_injection: float,
    opened: float,
    window_seconds: float,
    slack_s: float,
) -> int:
    """Of one user's notifications (first ``attempts`` sorted, ``injected`` alongside), those
    first attempted more than ``slack_s`` after the digest window ``opened`` that can only
    have been admitted before it opened: injected by then, and sent before any later window
    could admit anything. A later window admits only once an entry of the window before it
    expired, and every entry was decided after the user's earliest injection and after
    ``opened - window_seconds``. A loaded machine sends an admitted notification seconds after
    its decision (CI, load ~20: two of three sends came more than 1 s after the digest opened,
    and a correct limiter was blamed for a redelivery)."""
    if np.isnan(earliest_injection):
        return 0
    next_window = max(opened - window_seconds, earliest_injection) + window_seconds
    lo = np.searchsorted(attempts, opened + slack_s, side="right")
    hi = np.searchsorted(attempts, next_window, side="left")
    return int((injected[lo:hi] <= opened).sum())


def judge(
    population: Population,
    owner: Mapping[tuple[str, str], str],
    kinds: Mapping[tuple[Any, Any], str],
    admitted: int,
    first_attempt: Mapping[tuple[str, str, str], float],
    delivered_individual: Iterable[tuple[str, str, str, float]],
    other_rows: Iterable[tuple[Any, Any, Any, Any, Any, bool]],
    expected_rows: Iterable[tuple[str, str, str, str]],
    per_window: int,
    window_seconds: float,
    daily_limit: int,
    slack_s: float,
    injected_at: Mapping[tuple[Any, Any], float],
    clock_offset_s: float = 0.0,
) -> Verdict:
    """The verdict from what both engines gather: per (tenant, user, notification) its first
    attempt (with a limit on), the individual deliveries (with the daily cap on), the requests
    for notifications nobody injected (tenant, token, notification, time, collapse id,
    delivered), and the expected deliveries (with the window on)."""
    window_on = per_window > 0
    digest_rows: dict[tuple[str, str, int], int] = defaultdict(int)  # (tenant, token, S) -> n
    digests: dict[tuple[str, str, int], _Digest] = {}
    unrecognised = 0
    for tenant, token, _nid, _at, collapse, delivered in other_rows:
        user = owner[(tenant, token)]
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

    span = float(window_seconds) - slack_s
    over_limit_sent = 0
    if window_on and span > 0:
        injected_by_user: dict[tuple[str, str], list[float]] = defaultdict(list)
        for tenant, user, nid in first_attempt:
            # Every first attempt is of an injected notification (the engines keep no other);
            # the same order as attempts_by_user's, filled from the same dict.
            injected_by_user[(tenant, user)].append(injected_at.get((tenant, nid), np.nan))
        over_limit_sent = sum(
            over_limit(np.array(v, dtype=float), np.array(injected_by_user[key]), per_window, span)
            for key, v in attempts_by_user.items()
        )

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

    over_daily = at_limit = withheld = 0
    withheld_examples: list[dict[str, Any]] = []
    # (tenant, token, kind) -> local day -> when the cap filled there (its cap-th delivery)
    full_days: dict[tuple[str, str, str], dict[date, float]] = defaultdict(dict)
    delivered_to: set[tuple[str, str, str]] = set()  # (tenant, token, notification)
    # The latest instant anything was seen: no decision the evidence shows is later.
    seen_until = max(
        [*first_attempt.values(), *(v for v in injected_at.values() if not np.isnan(v))],
        default=0.0,
    )
    zone_of = {key: population.user(key[0], user).zone for key, user in owner.items()}
    if daily_limit > 0:
        # (tenant, token, kind) -> notification -> its first delivery to that device
        sends: dict[tuple[str, str, str], dict[str, float]] = defaultdict(dict)
        for tenant, token, nid, at in delivered_individual:
            bucket = sends[(tenant, token, kinds[(tenant, nid)])]
            bucket[nid] = min(at, bucket.get(nid, at))
            delivered_to.add((tenant, token, nid))
            seen_until = max(seen_until, at)
        for key, sent in sends.items():
            tenant, token, _kind = key
            zone = zone_of[(tenant, token)]
            certain: dict[date, int] = defaultdict(int)
            spanning: list[tuple[date, date]] = []
            for nid, at in sent.items():
                first, last = decision_days(
                    injected_at.get((tenant, nid), np.nan), at, zone, clock_offset_s
                )
                if first == last:
                    certain[first] += 1
                else:
                    spanning.append((first, last))
            over, per_day = daily_overage(certain, spanning, daily_limit)
            over_daily += over
            at_limit += sum(1 for n in per_day.values() if n >= daily_limit)
            # A day the cap may have filled: its sends that can have been counted there (one
            # decided across midnight, on either day) reach the cap; filled at the cap-th of
            # them, the earliest the cap can have blocked anything that day.
            on_day: dict[date, list[float]] = defaultdict(list)
            for nid, at in sent.items():
                first, last = decision_days(
                    injected_at.get((tenant, nid), np.nan), at, zone, clock_offset_s
                )
                day = first
                while day <= last:
                    on_day[day].append(at)
                    day += timedelta(days=1)
            for day, times in on_day.items():
                if len(times) >= daily_limit:
                    full_days[key][day] = sorted(times)[daily_limit - 1]

    def capped_from(tenant: str, token: str, kind: str, nid: str) -> float | None:
        """When the device's cap can first have blocked the notification: the earliest fill
        of a full (kind, local day) its decision can fall on; None if no such day was full."""
        days = full_days.get((tenant, token, kind))
        if not days:
            return None
        first, last = decision_days(
            injected_at.get((tenant, nid), np.nan),
            seen_until,
            zone_of[(tenant, token)],
            clock_offset_s,
        )
        fills = [at for day, at in days.items() if first <= day <= last]
        return min(fills) if fills else None

    expected_by_user: dict[tuple[str, str], dict[str, set[str]]] = defaultdict(
        lambda: defaultdict(set)
    )
    for tenant, nid, token, user in expected_rows:
        expected_by_user[(tenant, user)][nid].add(token)

    # Notifications the window may have admitted (spending a slot) that the daily cap then
    # blocked on every device: never sent, so no request shows when. Not before every one of
    # their devices' buckets had filled: the earliest instant each can have spent a slot.
    capped_since: dict[tuple[str, str], np.ndarray] = {}
    capped_by_user: dict[tuple[str, str], set[str]] = defaultdict(set)
    if daily_limit > 0:
        for (tenant, user), expected in expected_by_user.items():
            attempted = attempted_by_user.get((tenant, user), set())
            since = []
            for nid, tokens in expected.items():
                kind = kinds[(tenant, nid)]
                froms = [capped_from(tenant, token, kind, nid) for token in tokens]
                if not window_on:
                    for token, capped_at in zip(tokens, froms, strict=True):
                        if capped_at is None and (tenant, token, nid) not in delivered_to:
                            withheld += 1
                            if len(withheld_examples) < 5:
                                withheld_examples.append(
                                    {
                                        "tenant_id": tenant,
                                        "user_id": user,
                                        "token": token,
                                        "notification_id": nid,
                                    }  # fmt: skip
                                )
                    continue
                if nid in attempted or any(f is None for f in froms):
                    continue
                capped_by_user[(tenant, user)].add(nid)
                since.append(max(f for f in froms if f is not None))
            if since:
                capped_since[(tenant, user)] = np.sort(np.array(since))

    redeliveries_counted = 0
    redelivery_examples = []
    # Per user: first attempts in order, each with its notification's injection.
    attempts_with_injection: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}
    if window_on and digests:
        pairs: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
        for (tenant, user, nid), at in first_attempt.items():
            pairs[(tenant, user)].append((at, injected_at.get((tenant, nid), np.inf)))
        for key, items in pairs.items():
            items.sort()
            attempts_with_injection[key] = (
                np.array([at for at, _ in items]),
                np.array([inj for _, inj in items]),
            )

    def earliest_injection(key: tuple[str, str]) -> float:
        tenant = key[0]
        known = [
            injected_at[(tenant, nid)]
            for nid in expected_by_user.get(key, {})
            if (tenant, nid) in injected_at
        ]
        _, injected = attempts_with_injection.get(key, (None, np.array([])))
        known += [float(v) for v in injected if np.isfinite(v)]
        known = [v for v in known if not np.isnan(v)]
        return min(known) if known else np.nan

    if window_on:
        for digest in digests.values():
            key = (digest.tenant_id, digest.user_id)
            times = sorted_attempts.get(key, np.array([]))
            # The window's start on the system's clock, back in real time.
            opened = digest.start_ms / 1000 - clock_offset_s
            lo = np.searchsorted(times, opened - window_seconds, side="right")
            hi = np.searchsorted(times, opened + slack_s, side="right")
            if hi - lo < per_window:
                attempts, injected = attempts_with_injection.get(key, (np.array([]),) * 2)
                hi += late_admissions(
                    attempts, injected, earliest_injection(key), opened, window_seconds, slack_s
                )
            # A slot a capped notification may have spent is not a redelivery's.
            capped = capped_since.get((digest.tenant_id, digest.user_id), np.array([]))
            unseen = np.searchsorted(capped, opened + slack_s, side="right")
            if hi - lo + unseen < per_window:
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
        capped = held & capped_by_user.get(key, set())
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
        "admitted": admitted,
        "held": held_total,
        "over_limit_sent": over_limit_sent,
        "digests_expected": digests_expected,
        "digests_delivered": len(digests),
        "digests_missing": digests_missing,
        "duplicate_digests": duplicate + overlapping,
        "digest_undercount": undercount,
        "digest_overcount": overcount,
        "redeliveries_counted": redeliveries_counted,
        "over_daily_limit": over_daily,
        "withheld_below_daily_limit": withheld,
        # (device, kind, local day) buckets the cap filled: the cap was exercised (not gating).
        "daily_buckets_at_limit": at_limit,
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
        "withheld_below_daily_limit",
    )
    details = {
        "per_window": per_window,
        "window_seconds": window_seconds,
        "daily_limit": daily_limit,
        "slack_s": slack_s,
        "count_examples": count_examples,
        "redelivery_examples": redelivery_examples,
        "withheld_examples": withheld_examples,
        "clock_offset_s": clock_offset_s,
    }
    return Verdict("rate_limit", all(counts[k] == 0 for k in gating), counts, details)


def check_store(
    store: HistoryStore,
    population: Population,
    per_window: int,
    window_seconds: float,
    daily_limit: int = 0,
    slack_s: float = 1.0,
    clock_offset_s: float = 0.0,
) -> Verdict:
    """:func:`check` over a history on disk: what :func:`judge` needs is gathered in DuckDB
    (the first attempts and individual deliveries only with a limit on, the expected
    deliveries only with the window on: with those on at scale, they are big)."""
    store.require_decided()
    owner = {(d.tenant_id, d.token): d.user_id for d in population.devices}
    injects = store.rows(["inject"], ["tenant_id", "notification_id", "detail", "time"])
    kinds, injected_at = event_kinds(injects), injection_times(injects).to_dict()
    window_on = per_window > 0
    store.register(
        "rl_owner_strings",
        pa.table(
            {
                "tenant_id": pa.array([t for t, _ in owner], pa.string()),
                "token": pa.array([k for _, k in owner], pa.string()),
                "user_id": pa.array(list(owner.values()), pa.string()),
            }
        ),
    )
    # Each owned provider row's owner; a person is (tenant, user).
    store.run(
        """CREATE OR REPLACE TABLE rl_owner AS
        SELECT t.code AS tenant, k.code AS tok, s.user_id,
               dense_rank() OVER (ORDER BY t.code, s.user_id) AS person
        FROM rl_owner_strings s JOIN tenants t ON t.value = s.tenant_id
        JOIN tokens k ON k.value = s.token"""
    )
    store.run(
        """CREATE OR REPLACE TABLE rl_events AS
        SELECT DISTINCT t.code AS tenant, n.code AS nid FROM other o
        JOIN tenants t ON t.value IS NOT DISTINCT FROM o.tenant_id
        JOIN nids n ON n.value IS NOT DISTINCT FROM o.notification_id
        WHERE o.kind = 'inject'"""
    )
    owned = "prov p JOIN rl_owner o ON o.tenant = p.tenant AND o.tok = p.tok"
    injected = "EXISTS (SELECT 1 FROM rl_events e WHERE e.tenant = p.tenant AND e.nid = p.nid)"
    (admitted,) = store.one(
        f"SELECT count(*) FROM (SELECT DISTINCT p.nid, o.person FROM {owned} WHERE {injected})"
    )
    decoded = """JOIN tenants tv ON tv.code = p.tenant JOIN nids nv ON nv.code = p.nid
        JOIN tokens kv ON kv.code = p.tok"""
    first_attempt: dict[tuple[str, str, str], float] = {}
    delivered_individual: list[tuple[str, str, str, float]] = []
    if window_on or daily_limit > 0:
        for tenant, user, nid, at in store.sql(
            f"""SELECT any_value(tv.value), o.user_id, any_value(nv.value), min(p.time)
            FROM {owned} {decoded} WHERE {injected} GROUP BY p.nid, o.person, o.user_id"""
        ).fetchall():
            first_attempt[(tenant, user, nid)] = at
        sns = store.rows(["sns_publish"], ["tenant_id", "token", "notification_id", "time"])
        earlier_at_sns(first_attempt, owner, sns.itertuples(index=False, name=None))
    if daily_limit > 0:
        delivered_individual = store.sql(
            f"""SELECT tv.value, kv.value, nv.value, p.time FROM {owned} {decoded}
            WHERE p.got AND {injected} ORDER BY p.pos"""
        ).fetchall()
    other_rows = store.sql(
        f"""SELECT tv.value, kv.value, nv.value, p.time, cv.value, p.got
        FROM {owned} {decoded} LEFT JOIN nids cv ON cv.code = p.col
        WHERE NOT {injected} ORDER BY p.pos"""
    ).fetchall()
    expected_rows: Iterable[tuple[str, str, str, str]] = ()
    if window_on or daily_limit > 0:
        expected_rows = store.sql(
            """SELECT tv.value, nv.value, kv.value, e.user_id FROM exp e
            JOIN tenants tv ON tv.code = e.tenant JOIN nids nv ON nv.code = e.nid
            JOIN tokens kv ON kv.code = e.tok ORDER BY e.pos"""
        ).fetchall() + list(
            # The pushes a limit may have withheld are this checker's (checkers/limited.py).
            store.expectation.limited[
                ["tenant_id", "notification_id", "token", "user_id"]
            ].itertuples(index=False, name=None)
        )
    return judge(
        population, owner, kinds, int(admitted), first_attempt, delivered_individual,
        other_rows, expected_rows, per_window, window_seconds, daily_limit, slack_s,
        injected_at, clock_offset_s,
    )  # fmt: skip


@checker(
    "rate_limit",
    summary="no push over the per-user window; one digest per window; redeliveries never count",
    # None: the limits the system states (its policy); a number overrides it.
    tolerances={"per_window": None, "window_seconds": None, "daily_limit": None, "slack_s": 1.0},
    out_of_core=True,
)
def probe(evidence: Evidence, tolerance: Mapping[str, Any]) -> Verdict:
    policy = evidence.policy

    def given(name: str, default: float) -> float:
        return default if tolerance[name] is None else float(tolerance[name])

    if evidence.store is not None:
        return check_store(
            evidence.store,
            evidence.population,
            per_window=int(given("per_window", policy.rate_limit_per_window)),
            window_seconds=given("window_seconds", policy.rate_limit_window_seconds),
            daily_limit=int(given("daily_limit", policy.daily_limit_per_device_type)),
            slack_s=float(tolerance["slack_s"]),
            clock_offset_s=evidence.clock_offset_s,
        )
    return check(
        evidence.population,
        evidence.expectation,
        evidence.history,
        per_window=int(given("per_window", policy.rate_limit_per_window)),
        window_seconds=given("window_seconds", policy.rate_limit_window_seconds),
        daily_limit=int(given("daily_limit", policy.daily_limit_per_device_type)),
        slack_s=float(tolerance["slack_s"]),
        clock_offset_s=evidence.clock_offset_s,
    )
