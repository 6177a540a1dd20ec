"""Why a device got the same notification twice: the causes the design admits, and the rest.

Seed 004 ("Effectively-once delivery"): "the honest guarantee is effectively-once, not
exactly-once: residual duplicates remain possible on an un-flushed write lost in failover or a
DLQ redrive after the 30-day TTL expires". Seed 000 adds the provider seam: a provider that
accepted a push and then answered 5xx leaves the sender no way to know (the collapse id is what
keeps the device from showing it twice). Every other duplicate is a bug.

Each duplicate delivery (the 2nd, 3rd... of one (tenant, notification, device)) is attributed
from the history alone, first rule that matches:

* ``accepted_then_error``: an earlier request of the key was delivered and answered non-200;
* ``consumer_killed``: a consumer was killed (``consumer-crash``) within ``kill_window_s`` after
  the key's previous delivery, or that delivery reached the provider while the consumer was
  down (a request the killed process had written, read by a loaded provider after the kill was
  recorded: nothing else can send before the restart), and the duplicate came after the kill:
  the send happened, its 'sent' mark did not;
* ``volatile_store_failover``: the dedup store crashed (``dedup-crash``) between the previous
  delivery and this one, or that delivery reached the provider while the store was down (a push
  claimed before the crash, read by a loaded provider after it was recorded: nothing claims
  while the store is down, and a push sent then is ``fail_closed``'s), and the system states a
  store that does not keep its keys;
* ``dedup_ttl_expired``: the previous delivery is older than the 30-day dedup window;
* otherwise ``unattributed``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from harness.checkers.windows import Window, delivery_rows, fault_windows

KEY = ["tenant_id", "notification_id", "token"]
DEDUP_WINDOW_S = 30 * 24 * 3600.0
DEFAULT_KILL_WINDOW_S = 5.0
UNATTRIBUTED = "unattributed"
ADMITTED = (
    "accepted_then_error",
    "consumer_killed",
    "volatile_store_failover",
    "dedup_ttl_expired",
)
CAUSE_COLUMNS = [*KEY, "time", "previous_time", "delivery_number", "cause"]


def cause_of(
    previous: pd.DataFrame,
    now: float,
    kills: list[Window],
    crashes: list[Window],
    durable: bool,
    kill_window_s: float,
) -> str:
    """The admitted cause of a delivery at ``now`` given the key's earlier delivered requests
    (``time``, ``status`` columns, oldest first), or ``unattributed``."""
    statuses = previous["status"].to_numpy(dtype=float, na_value=np.nan)
    last = float(previous["time"].iloc[-1])
    return cause_after(
        bool((statuses != 200).any()), last, now, kills, crashes, durable, kill_window_s
    )


def cause_after(
    earlier_error: bool,
    last: float,
    now: float,
    kills: list[Window],
    crashes: list[Window],
    durable: bool,
    kill_window_s: float,
) -> str:
    """:func:`cause_of` from what it reads of the earlier deliveries: whether any was answered
    other than 200 (``earlier_error``) and when the last one was (``last``). The live checks
    (harness.live.online) apply it one delivery at a time."""
    if earlier_error:
        return "accepted_then_error"
    if any(k.start - kill_window_s <= last < k.stop and k.start <= now for k in kills):
        return "consumer_killed"
    if not durable and any(last < c.stop and c.start <= now for c in crashes):
        return "volatile_store_failover"
    if now - last > DEDUP_WINDOW_S:
        return "dedup_ttl_expired"
    return UNATTRIBUTED


def attribute(
    history: pd.DataFrame,
    durable: bool = True,
    kill_window_s: float = DEFAULT_KILL_WINDOW_S,
    exclude: pd.Series | None = None,
) -> pd.DataFrame:
    """One row per duplicate delivery with its cause (``CAUSE_COLUMNS``). ``exclude``: a boolean
    mask over ``history`` of deliveries judged elsewhere (left out)."""
    rows = delivery_rows(history)
    if exclude is not None:
        rows = rows[~exclude.to_numpy(dtype=bool)[rows]]
    delivered = history.iloc[rows][[*KEY, "time", "status", "seq"]]
    keys = delivered[KEY].astype(object).fillna("")
    repeated = keys.duplicated(keep=False).to_numpy()
    if not repeated.any():
        return pd.DataFrame(columns=CAUSE_COLUMNS)
    kills = fault_windows(history, ("consumer-crash",))
    crashes = fault_windows(history, ("dedup-crash",))
    return attribute_repeated(delivered[repeated], kills, crashes, durable, kill_window_s)


def attribute_repeated(
    candidates: pd.DataFrame,
    kills: list[Window],
    crashes: list[Window],
    durable: bool,
    kill_window_s: float,
) -> pd.DataFrame:
    """:func:`attribute` given every delivery (``KEY``, ``time``, ``status``, ``seq``) of the
    keys delivered more than once: both engines end here."""
    if not len(candidates):
        return pd.DataFrame(columns=CAUSE_COLUMNS)
    candidates = candidates.sort_values(["time", "seq"], kind="stable")
    out = []
    for key, group in candidates.groupby(KEY, sort=True, dropna=False):
        for n in range(1, len(group)):
            now = float(group["time"].iloc[n])
            cause = cause_of(group.iloc[:n], now, kills, crashes, durable, kill_window_s)
            out.append((*key, now, float(group["time"].iloc[n - 1]), n + 1, cause))
    return pd.DataFrame(out, columns=CAUSE_COLUMNS)
