"""Dead-token hygiene (seed 000: "invalid-token responses from both providers must immediately
stop sends to that token"): after a token answers 410 Unregistered or 400 BadDeviceToken (APNs)
or 404 UNREGISTERED (FCM), nothing more is sent to it.

Only requests already in flight when the dead answer went out are forgiven, measured from the
ledger: a request that reached the provider after the dead answer *left* it (``answered_at``,
after any latency the provider added), plus ``transit_s``, was sent by a system that had been
told. ``transit_s`` covers a round trip plus the queuing a request meets on a loaded machine
before the provider reads it (measured: 63 ms on this 2-core machine in a smoke run; the default
leaves room for an order of magnitude more). A system that never deactivates a dead token meets
it again at the next notification, seconds later, far outside it. Per (tenant, token): a token two tenants' apps share is dead for
each only once its own answer says so.

A token brought back (the ``reinstall-devices`` action: the app installed again, the token valid
again at the provider and registered again with the system) may be sent to from the instant the
harness revived it: those requests are forgiven (``sends_after_reinstall``), the requests between
the dead answer and the reinstall are not.

Through SNS (the system publishes to SNS mobile push endpoints, and SNS's own logs are in the
history: :mod:`harness.run.sns_ledger`), SNS turns an endpoint off on the dead answer and
delivers nothing more to it, so the provider rule above holds whatever the publisher does. The
publisher's own hygiene is judged at SNS's door: once a publish of a tenant was answered
``EndpointDisabled`` (how SNS tells a publisher the endpoint is off), no publish of that tenant
may reach the endpoint later than ``transit_s`` after, until a registration turned it on again
(``publishes_to_disabled``). Only the endpoints SNS itself turned off count: one a caller
disabled is the caller's business.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from harness.checkers.evidence import Evidence
from harness.checkers.keys import rows_with
from harness.checkers.registry import checker
from harness.checkers.store import HistoryStore
from harness.checkers.verdict import Verdict

TRANSIT_S = 0.5


def _is(column: pd.Series, value: object) -> pd.Series:
    """Equality with a missing value read as False (the columns hold None and NA alike)."""
    return column.eq(value).fillna(False).astype(bool)


def _dead_answers(provider: pd.DataFrame) -> pd.Series:
    status, reason = provider["status"], provider["reason"]
    apns = _is(provider["provider"], "apns") & (
        _is(status, 410) | (_is(status, 400) & _is(reason, "BadDeviceToken"))
    )
    fcm = _is(provider["provider"], "fcm") & _is(reason, "UNREGISTERED")
    return apns | fcm


def reinstalled_at(history: pd.DataFrame) -> dict[tuple[str, str], float]:
    """(tenant, token) -> when the harness revived the token and registered it again (the
    ``change`` rows of ``reinstall-devices`` the system acknowledged)."""
    rows = history.loc[history["kind"] == "change", ["tenant_id", "time", "detail"]]
    out: dict[tuple[str, str], float] = {}
    for row in rows.itertuples(index=False):
        detail = json.loads(row.detail) if isinstance(row.detail, str) else {}
        if detail.get("change") != "reinstall" or detail.get("ok") is False:
            continue
        for token in detail.get("tokens", []):
            key = (str(row.tenant_id), str(token))
            out[key] = min(out.get(key, float(row.time)), float(row.time))
    return out


def _after_reinstall(frame: pd.DataFrame, revived: Mapping[tuple[str, str], float]) -> pd.Series:
    """Rows (tenant_id, token, time) sent once their token had been brought back."""
    since = [
        revived.get((str(t), str(k)), np.inf)
        for t, k in zip(frame["tenant_id"], frame["token"], strict=True)
    ]
    return pd.Series(frame["time"].to_numpy(dtype=float) >= np.array(since, dtype=float),
                     index=frame.index, dtype=bool)  # fmt: skip


def check(history: pd.DataFrame, transit_s: float = TRANSIT_S) -> Verdict:
    is_provider = (history["kind"] == "provider").to_numpy(dtype=bool, na_value=False)
    answers = history[["provider", "status", "reason"]]
    is_dead = _dead_answers(answers).fillna(False).to_numpy(dtype=bool)
    columns = ["tenant_id", "token", "time", "end"]
    dead = history[columns].iloc[np.flatnonzero(is_provider & is_dead)]
    # When the first dead answer left; a ledger without answer times: when it was received.
    left = dead["end"].fillna(dead["time"])
    first_dead = (
        dead.assign(told=left)
        .groupby(["tenant_id", "token"])["told"]
        .min()
        .rename("dead_at")
        .reset_index()
    )
    # Only requests to a token that answered dead can join it; the join keeps their order.
    to_dead = is_provider & rows_with(history, "token", set(first_dead["token"]))
    later = (
        history[columns].iloc[np.flatnonzero(to_dead)].merge(first_dead, on=["tenant_id", "token"])
    )
    gap = later["time"] - later["dead_at"]
    revived = _after_reinstall(later, reinstalled_at(history))
    after = later[(gap > transit_s) & ~revived]
    counts = {
        "dead_tokens": int(len(first_dead)),
        "sends_after_dead": int(len(after)),
        "in_flight_forgiven": int(((gap > 0) & (gap <= transit_s)).sum()),
        "sends_after_reinstall": int(((gap > transit_s) & revived).sum()),
    }
    details = {
        "transit_s": transit_s,
        "latest_after_dead_s": round(float(gap.max()), 3) if len(gap) and gap.max() > 0 else 0.0,
        "examples": after[["tenant_id", "token", "dead_at", "time"]].head(5).to_dict("records"),
    }
    sns_counts, sns_details = check_sns(history, transit_s)
    counts.update(sns_counts)
    details.update(sns_details)
    return Verdict("dead_tokens", _ok(counts), counts, details)


def _ok(counts: Mapping[str, int]) -> bool:
    return counts["sends_after_dead"] == 0 and counts.get("publishes_to_disabled", 0) == 0


def check_sns(history: pd.DataFrame, transit_s: float) -> tuple[dict[str, int], dict[str, Any]]:
    """Publishes that reached an endpoint SNS had turned off, after SNS had told the publishing
    tenant so (its first ``EndpointDisabled`` answer of that off period) plus ``transit_s``.
    Nothing when the history holds no SNS rows (a system that does not publish through SNS)."""
    events = history.loc[
        history["kind"] == "sns_endpoint", ["time", "provider", "reason", "detail"]
    ]
    publishes = history.loc[
        history["kind"] == "sns_publish", ["time", "tenant_id", "token", "reason", "detail"]
    ]
    if not len(events) and not len(publishes):
        return {}, {}
    # Off periods: from SNS's own "off" to the next change that turned it on (or deleted it).
    turned_off = (events["provider"] == "sns") & (events["reason"] == "off")
    ends = events["reason"].isin(["on", "deleted"])
    changes = events.loc[turned_off | ends].assign(off=turned_off[turned_off | ends])
    changes = changes.sort_values("time", kind="stable")
    counts = {"endpoints_turned_off": int(turned_off.sum()), "publishes_to_disabled": 0}
    details: dict[str, Any] = {"sns_examples": []}
    if not turned_off.any() or not len(publishes):
        return counts, details
    seen = publishes.dropna(subset=["detail"]).sort_values("time", kind="stable")
    # The endpoint's last change at or before each publish: inside an off period or not.
    placed = pd.merge_asof(
        seen,
        changes[["time", "detail", "off"]].rename(columns={"time": "changed_at"}),
        left_on="time",
        right_on="changed_at",
        by="detail",
    )
    inside = placed[placed["off"].fillna(False).astype(bool)]
    # A publish whose payload named no tenant is grouped as one tenant of its own.
    inside = inside.assign(tenant_id=inside["tenant_id"].fillna(""))
    told = (
        inside[inside["reason"] == "EndpointDisabled"]
        .groupby(["detail", "changed_at", "tenant_id"])["time"]
        .min()
        .rename("told_at")
        .reset_index()
    )
    later = inside.merge(told, on=["detail", "changed_at", "tenant_id"])
    after = later[later["time"] - later["told_at"] > transit_s]
    counts["publishes_to_disabled"] = int(len(after))
    details["sns_examples"] = (
        after[["tenant_id", "token", "detail", "told_at", "time"]]
        .rename(columns={"detail": "endpoint_arn"})
        .head(5)
        .to_dict("records")
    )
    return counts, details


def check_store(store: HistoryStore, transit_s: float = 0.05) -> Verdict:
    """:func:`check` over a history on disk (a null tenant or token is never grouped, as in
    pandas)."""
    store.run(
        """CREATE OR REPLACE TABLE first_dead AS
        SELECT p.tenant, p.tok, min(coalesce(p."end", p.time)) AS dead_at FROM prov p
        WHERE coalesce((p.provider = 'apns' AND (p.status = 410
                        OR (p.status = 400 AND p.reason = 'BadDeviceToken')))
                       OR (p.provider = 'fcm' AND p.reason = 'UNREGISTERED'), false)
          AND p.tenant <> ? AND p.tok <> ?
        GROUP BY p.tenant, p.tok""",
        [store.null_code("tenants"), store.null_code("tokens")],
    )
    store.run(
        """CREATE OR REPLACE TABLE after_dead AS
        SELECT p.pos, p.tenant, p.tok, d.dead_at, p.time, p.time - d.dead_at AS gap
        FROM prov p JOIN first_dead d ON d.tenant = p.tenant AND d.tok = p.tok"""
    )
    dead, after, forgiven, latest = store.one(
        f"""SELECT (SELECT count(*) FROM first_dead), count(*) FILTER (gap > {transit_s}),
                   count(*) FILTER (gap > 0 AND gap <= {transit_s}), max(gap)
            FROM after_dead"""
    )
    revived = reinstalled_at(store.rows(["change"]))
    forgiven_after_reinstall = 0
    if revived:
        # Few rows (a correct system's sends to revived tokens): judged here, not in SQL.
        late = store.sql(
            f"SELECT tenant, tok, dead_at, time FROM after_dead WHERE gap > {transit_s} "
            "ORDER BY pos"
        ).fetchall()
        names = zip(store.decode("tenants", [r[0] for r in late]),
                    store.decode("tokens", [r[1] for r in late]), strict=True)  # fmt: skip
        kept = []
        for (tenant, token), row in zip(names, late, strict=True):
            if row[3] >= revived.get((str(tenant), str(token)), float("inf")):
                forgiven_after_reinstall += 1
            else:
                kept.append(row)
        after, first = len(kept), kept[:5]
    else:
        first = store.sql(
            f"SELECT tenant, tok, dead_at, time FROM after_dead WHERE gap > {transit_s} "
            "ORDER BY pos LIMIT 5"
        ).fetchall()
    counts = {
        "dead_tokens": int(dead),
        "sends_after_dead": int(after),
        "in_flight_forgiven": int(forgiven),
        "sends_after_reinstall": forgiven_after_reinstall,
    }
    tenants = store.decode("tenants", [t for t, _, _, _ in first])
    tokens = store.decode("tokens", [k for _, k, _, _ in first])
    details = {
        "transit_s": transit_s,
        "latest_after_dead_s": round(float(latest), 3)
        if latest is not None and latest > 0
        else 0.0,
        "examples": [
            {"tenant_id": tenant, "token": token, "dead_at": dead_at, "time": time}
            for tenant, token, (_, _, dead_at, time) in zip(tenants, tokens, first, strict=True)
        ],
    }
    # SNS's logs are rows of other kinds: small beside the provider rows, read as a frame.
    sns_counts, sns_details = check_sns(store.rows(["sns_endpoint", "sns_publish"]), transit_s)
    counts.update(sns_counts)
    details.update(sns_details)
    return Verdict("dead_tokens", _ok(counts), counts, details)


@checker(
    "dead_tokens",
    summary="nothing sent to a token after the provider's dead answer left, nor published to "
    "an endpoint SNS turned off after SNS said so (in flight excepted)",
    tolerances={"transit_s": TRANSIT_S},
    out_of_core=True,
)
def probe(evidence: Evidence, tolerance: Mapping[str, Any]) -> Verdict:
    if evidence.store is not None:
        return check_store(evidence.store, transit_s=float(tolerance["transit_s"]))
    return check(evidence.history, transit_s=float(tolerance["transit_s"]))
