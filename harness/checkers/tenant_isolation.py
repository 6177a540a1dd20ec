"""Tenant isolation: a tenant's notification reaches only that tenant's devices, and two
tenants minting the same ULID (or sharing one physical device) never suppress each other."""

from __future__ import annotations

from collections import Counter

import pandas as pd

from harness.checkers.verdict import Verdict
from harness.checkers.windows import deliveries
from harness.oracle import Expectation
from harness.population import Population

KEY = ["tenant_id", "notification_id", "token"]


def check(population: Population, expectation: Expectation, history: pd.DataFrame) -> Verdict:
    devices = {(d.tenant_id, d.token) for d in population.devices}
    delivered = deliveries(history)
    foreign = [
        row
        for row in delivered[["tenant_id", "token"]].itertuples(index=False, name=None)
        if row not in devices
    ]
    injected = history[history["kind"] == "inject"]
    tenants_per_id = injected.groupby("notification_id")["tenant_id"].nunique()
    shared_ids = set(tenants_per_id[tenants_per_id > 1].index)
    expected = expectation.deliveries[expectation.deliveries["notification_id"].isin(shared_ids)]
    seen = set(delivered[KEY].itertuples(index=False, name=None))
    missing = [row for row in expected[KEY].itertuples(index=False, name=None) if row not in seen]
    tenants_per_token = Counter(token for _, token in devices)
    shared_tokens = [token for token, n in tenants_per_token.items() if n > 1]
    counts = {
        "ids_minted_by_several_tenants": len(shared_ids),
        "devices_shared_by_tenants": len(shared_tokens),
        "deliveries_to_foreign_devices": len(foreign),
        "shared_id_deliveries_lost": len(missing),
    }
    details = {"missing_examples": [dict(zip(KEY, row, strict=True)) for row in missing[:5]]}
    valid = not foreign and not missing
    return Verdict("tenant_isolation", valid, counts, details)
