"""Consent is default-deny: no delivery to a user whose push consent the population withheld.

Users whose preferences the run changed are judged by the ``preference_changes`` checker."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from harness.checkers.evidence import Evidence
from harness.checkers.keys import rows_with
from harness.checkers.registry import checker
from harness.checkers.store import HistoryStore
from harness.checkers.verdict import Verdict
from harness.checkers.windows import delivery_rows
from harness.model.population import Population


def refused_devices(
    population: Population,
    changed: set[tuple[str, str]] | frozenset[tuple[str, str]] = frozenset(),
) -> set[tuple[str, str]]:
    """(tenant, token) of the devices of users without consent (the run did not change them),
    less any pair another user of that tenant consented for: both engines judge these."""
    without = {
        (d.tenant_id, d.token)
        for u in population.users
        if u.consent is None and (u.tenant_id, u.user_id) not in changed
        for d in population.devices_of(u.tenant_id, u.user_id)
    }
    with_consent = {
        (d.tenant_id, d.token)
        for u in population.users
        if u.consent is not None
        for d in population.devices_of(u.tenant_id, u.user_id)
    }
    # A device shared by two tenants' apps may have consent in one and not the other: the
    # (tenant, token) pair decides.
    return without - with_consent


def check(
    population: Population,
    history: pd.DataFrame,
    changed: set[tuple[str, str]] | frozenset[tuple[str, str]] = frozenset(),
) -> Verdict:
    refused = refused_devices(population, changed)
    rows = delivery_rows(history)
    suspects = rows[rows_with(history, "token", {token for _, token in refused})[rows]]
    found = history[["tenant_id", "token"]].iloc[suspects]
    violations = [row for row in found.itertuples(index=False, name=None) if row in refused]
    counts = {
        "users_without_consent": sum(1 for u in population.users if u.consent is None),
        "deliveries_without_consent": len(violations),
    }
    details = {"examples": [{"tenant_id": t, "token": k} for t, k in violations[:5]]}
    return Verdict("consent", not violations, counts, details)


def check_store(
    store: HistoryStore,
    population: Population,
    changed: set[tuple[str, str]] | frozenset[tuple[str, str]] = frozenset(),
) -> Verdict:
    """:func:`check` over a history on disk."""
    store.require_decided()
    store.device_table("refused", refused_devices(population, changed))
    (violations,) = store.one(
        "SELECT count(*) FROM prov p JOIN refused r ON r.tenant = p.tenant AND r.tok = p.tok "
        "WHERE p.got"
    )
    first = store.sql(
        "SELECT p.tenant, p.tok FROM prov p JOIN refused r ON r.tenant = p.tenant "
        "AND r.tok = p.tok WHERE p.got ORDER BY p.pos LIMIT 5"
    ).fetchall()
    tenants = store.decode("tenants", [t for t, _ in first])
    tokens = store.decode("tokens", [k for _, k in first])
    counts = {
        "users_without_consent": sum(1 for u in population.users if u.consent is None),
        "deliveries_without_consent": int(violations),
    }
    details = {
        "examples": [{"tenant_id": t, "token": k} for t, k in zip(tenants, tokens, strict=True)]
    }
    return Verdict("consent", not violations, counts, details)


@checker(
    "consent",
    summary="no delivery to a user without push consent (default deny)",
    out_of_core=True,
)
def probe(evidence: Evidence, tolerance: Mapping[str, Any]) -> Verdict:
    changed = evidence.timeline.changed_users() if evidence.timeline else frozenset()
    if evidence.store is not None:
        return check_store(evidence.store, evidence.population, changed)
    return check(evidence.population, evidence.history, changed)
