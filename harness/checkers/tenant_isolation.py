"""Tenant isolation: a tenant's notification reaches only that tenant's devices, and two
tenants minting the same ULID (or sharing one physical device) never suppress each other."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from harness.checkers.evidence import Evidence
from harness.checkers.keys import lookup, member, rows_with, sorted_unique
from harness.checkers.registry import checker
from harness.checkers.store import HistoryStore
from harness.checkers.verdict import Verdict
from harness.checkers.windows import delivery_rows
from harness.model.oracle import Expectation
from harness.model.population import Population

KEY = ["tenant_id", "notification_id", "token"]
# Up to this many (tenant, token) combinations a lookup table beats a search.
_TABLE_LIMIT = 2**26


def _known_pairs(
    history: pd.DataFrame, rows: np.ndarray, devices: set[tuple[str, str]]
) -> np.ndarray:
    """Per delivery (row position): is its (tenant, token) one of the population's devices?"""
    pairs = [(t, k) for t, k in devices if isinstance(t, str) and isinstance(k, str)]
    tenant_of_device = pa.array([t for t, _ in pairs], pa.large_string())
    token_of_device = pa.array([k for _, k in pairs], pa.large_string())
    tenants, tokens = pc.unique(tenant_of_device), pc.unique(token_of_device)
    allowed = _positions(tenant_of_device, tenants) * len(tokens)
    allowed += _positions(token_of_device, tokens)
    tenant_index = lookup(history, "tenant_id", tenants)[rows]
    token_index = lookup(history, "token", tokens)[rows]
    known = (tenant_index >= 0) & (token_index >= 0)
    pair = tenant_index[known] * len(tokens) + token_index[known]
    if len(tenants) * len(tokens) <= _TABLE_LIMIT:
        table = np.zeros(len(tenants) * len(tokens), dtype=bool)
        table[allowed] = True
        known[known] = table[pair]
    else:
        known[known] = member(pair, sorted_unique(allowed))
    return known


def _positions(values: pa.Array, vocabulary: pa.Array) -> np.ndarray:
    found = pc.index_in(values, value_set=vocabulary).to_numpy(zero_copy_only=False)
    return found.astype(np.int64)


def ids_of_several_tenants(injected: pd.DataFrame) -> set[str]:
    """Notification ids that more than one tenant injected (both engines)."""
    tenants_per_id = injected.groupby("notification_id")["tenant_id"].nunique()
    return set(tenants_per_id[tenants_per_id > 1].index)


def shared_devices(devices: set[tuple[str, str]]) -> int:
    """Tokens that more than one tenant's devices carry."""
    tenants_per_token = Counter(token for _, token in devices)
    return sum(1 for n in tenants_per_token.values() if n > 1)


def check(population: Population, expectation: Expectation, history: pd.DataFrame) -> Verdict:
    devices = {(d.tenant_id, d.token) for d in population.devices}
    rows = delivery_rows(history)
    foreign = int((~_known_pairs(history, rows, devices)).sum())
    shared_ids = ids_of_several_tenants(history[history["kind"] == "inject"])
    expected = expectation.deliveries.iloc[
        np.flatnonzero(rows_with(expectation.deliveries, "notification_id", shared_ids))
    ]
    shared = rows[rows_with(history, "notification_id", shared_ids)[rows]]
    seen = set(history[KEY].iloc[shared].itertuples(index=False, name=None))
    missing = [row for row in expected[KEY].itertuples(index=False, name=None) if row not in seen]
    counts = {
        "ids_minted_by_several_tenants": len(shared_ids),
        "devices_shared_by_tenants": shared_devices(devices),
        "deliveries_to_foreign_devices": foreign,
        "shared_id_deliveries_lost": len(missing),
    }
    details = {"missing_examples": [dict(zip(KEY, row, strict=True)) for row in missing[:5]]}
    valid = not foreign and not missing
    return Verdict("tenant_isolation", valid, counts, details)


def check_store(store: HistoryStore, population: Population) -> Verdict:
    """:func:`check` over a history on disk."""
    store.require_decided()
    devices = {(d.tenant_id, d.token) for d in population.devices}
    store.device_table("known_devices", devices)
    (foreign,) = store.one(
        "SELECT count(*) FROM prov p WHERE p.got AND NOT EXISTS (SELECT 1 FROM known_devices d "
        "WHERE d.tenant = p.tenant AND d.tok = p.tok)"
    )
    shared_ids = ids_of_several_tenants(store.rows(["inject"], ["tenant_id", "notification_id"]))
    store.register("shared_ids", pa.table({"value": pa.array(sorted(shared_ids), pa.string())}))
    store.run(
        f"""CREATE OR REPLACE TABLE shared_lost AS
        SELECT e.pos, e.key FROM exp e
        WHERE e.nid IN (SELECT n.code FROM nids n JOIN shared_ids s ON s.value = n.value)
          AND e.key NOT IN (SELECT key FROM {store.delivered_keys()})"""
    )
    (missing,) = store.one("SELECT count(*) FROM shared_lost")
    first = [k for (k,) in store.sql("SELECT key FROM shared_lost ORDER BY pos LIMIT 5").fetchall()]
    counts = {
        "ids_minted_by_several_tenants": len(shared_ids),
        "devices_shared_by_tenants": shared_devices(devices),
        "deliveries_to_foreign_devices": int(foreign),
        "shared_id_deliveries_lost": int(missing),
    }
    details = {"missing_examples": store.decode_keys(first)}
    return Verdict("tenant_isolation", not foreign and not missing, counts, details)


@checker(
    "tenant_isolation",
    summary="no delivery to another tenant's device; no loss of a ULID two tenants minted",
    out_of_core=True,
)
def probe(evidence: Evidence, tolerance: Mapping[str, Any]) -> Verdict:
    if evidence.store is not None:
        return check_store(evidence.store, evidence.population)
    return check(evidence.population, evidence.expectation, evidence.history)
