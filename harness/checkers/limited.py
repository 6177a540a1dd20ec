"""Expected deliveries a stated rate limit may have withheld: not lost, but ``rate_limit``'s.

The oracle's expectation knows the population and the load, not how a correct limiter spends
its budget: with a daily cap or a sliding window on (``SystemPolicy``), which expected push
a correct system withholds (the cap's excess, a window's excess collapsed into a digest)
depends on what it sent first. Left as required, every withheld push read as lost to
``effectively_once``, ``dlq_accountability`` and ``quiet_hours`` (a clean reference with a cap
of one a day failed all three on smoke: 52 "lost"), a false verdict for any team whose system
states a limit. So an expected push not delivered, whose limit the history shows exhausted,
becomes optional (``why`` "limited"); ``rate_limit`` judges it with the rest of its budget
(``withheld_below_daily_limit``, the digests' counts), from ``Expectation.limited``.

Exhausted is read generously, the limit's whole run at once: a device that got ``daily limit``
pushes of the event's kind on any day, a user who had ``per window`` notifications attempted
at all. The finer judgement (which day, which window) is ``rate_limit``'s own.
"""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pandas as pd

from harness.checkers.windows import delivery_rows
from harness.model.oracle import OPTIONAL_COLUMNS, Expectation
from harness.model.system import SystemPolicy

KEY = ["tenant_id", "notification_id", "token"]
# A digest's collapse id: the window's start (ms, on the system's clock) and how many
# notifications it stands for (seed 000's "collapse the excess into a digest").
_DIGEST = re.compile(r"^digest-(\d+)-(\d+)$")


def parse_digest(collapse_id: object) -> tuple[int, int] | None:
    """``(window start ms, count)`` from a digest's collapse id, None for anything else."""
    if not isinstance(collapse_id, str):
        return None
    match = _DIGEST.match(collapse_id)
    return (int(match[1]), int(match[2])) if match else None


def _kinds(history: pd.DataFrame) -> pd.DataFrame:
    """(tenant_id, notification_id) -> kind of each injected event ("post" when unnamed)."""
    injected = history.loc[history["kind"] == "inject", ["tenant_id", "notification_id"]]
    detail = history.loc[history["kind"] == "inject", "detail"]
    kinds = injected.assign(event_kind=[d if isinstance(d, str) else "post" for d in detail])
    return kinds.drop_duplicates(["tenant_id", "notification_id"])


def _provider_rows(history: pd.DataFrame, delivered: bool) -> pd.DataFrame:
    if delivered:
        rows = history.iloc[delivery_rows(history)]
    else:
        rows = history[history["kind"].isin(["provider", "sns_publish"])]
    return rows[KEY].drop_duplicates()


def withheld_by_limits(
    expectation: Expectation, history: pd.DataFrame, policy: SystemPolicy
) -> np.ndarray:
    """A mask over ``expectation.deliveries``: not delivered, and a limit the policy states
    was exhausted for its device (the daily cap) or its user (the window)."""
    expected = expectation.deliveries
    mask = np.zeros(len(expected), dtype=bool)
    daily, per_window = policy.daily_limit_per_device_type, policy.rate_limit_per_window
    if not len(expected) or (daily <= 0 and per_window <= 0):
        return mask
    delivered = _provider_rows(history, delivered=True)
    got = expected[KEY].merge(delivered.assign(got=True), on=KEY, how="left")["got"]
    missing = got.isna().to_numpy()
    if daily > 0:
        kinds = _kinds(history)
        sent = delivered.merge(kinds, on=["tenant_id", "notification_id"])
        full = (
            sent.groupby(["tenant_id", "token", "event_kind"])["notification_id"]
            .nunique()
            .loc[lambda n: n >= daily]
            .reset_index()[["tenant_id", "token", "event_kind"]]
            .assign(full=True)
        )
        wanted = expected[KEY].merge(kinds, on=["tenant_id", "notification_id"], how="left")
        capped = wanted.merge(full, on=["tenant_id", "token", "event_kind"], how="left")["full"]
        mask |= missing & capped.notna().to_numpy()
    if per_window > 0:
        owners = expected[["tenant_id", "token", "user_id"]].drop_duplicates(["tenant_id", "token"])
        tried = _provider_rows(history, delivered=False).merge(owners, on=["tenant_id", "token"])
        busy = (
            tried.groupby(["tenant_id", "user_id"])["notification_id"]
            .nunique()
            .loc[lambda n: n >= per_window]
            .reset_index()[["tenant_id", "user_id"]]
            .assign(busy=True)
        )
        held = expected[["tenant_id", "user_id"]].merge(
            busy, on=["tenant_id", "user_id"], how="left"
        )
        mask |= missing & held["busy"].notna().to_numpy()
    return mask


def digest_deliveries(history: pd.DataFrame) -> pd.DataFrame:
    """The digests the system sent (OPTIONAL_COLUMNS, ``why`` "digest"): no injected
    notification's, so each would read as unexpected; ``rate_limit`` judges their counts."""
    provider = history[history["kind"] == "provider"]
    injected = history.loc[history["kind"] == "inject", "notification_id"]
    is_digest = provider["collapse_id"].map(lambda c: parse_digest(c) is not None).astype(bool)
    rows = provider[is_digest & ~provider["notification_id"].isin(injected)]
    return rows[KEY].drop_duplicates().assign(user_id=None, why="digest")[OPTIONAL_COLUMNS]


def exempt_limited(
    expectation: Expectation, history: pd.DataFrame, policy: SystemPolicy
) -> Expectation:
    """``expectation`` with the pushes a limit may have withheld moved from the required
    deliveries to the optional ones (``why`` "limited") and kept in ``limited``."""
    mask = withheld_by_limits(expectation, history, policy)
    digests = digest_deliveries(history) if policy.rate_limit_per_window > 0 else None
    if not mask.any() and (digests is None or not len(digests)):
        return expectation
    expected = expectation.deliveries
    limited = expected[mask].reset_index(drop=True)
    optional = pd.concat(
        [expectation.optional, limited.assign(why="limited")[OPTIONAL_COLUMNS], digests],
        ignore_index=True,
    )
    return replace(
        expectation,
        deliveries=expected[~mask].reset_index(drop=True),
        optional=optional,
        limited=limited,
    )
