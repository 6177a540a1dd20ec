"""dedup-outage: dedup store unreachable: the fault proxy is disabled (connection refused)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from chaos.faults import DEDUP_STORE, ChaosTargets, fault
from chaos.faults.adapters import toxiproxy_proxy


@fault(
    "dedup-outage",
    "dedup store unreachable: the fault proxy is disabled (connection refused)",
    needs="toxiproxy_url",
    needs_what="fault proxy in front of its dedup store (dedup_listen, or toxiproxy_url)",
    takes_away=DEDUP_STORE,
)
def start(targets: ChaosTargets, params: dict[str, Any]) -> Callable[[], None]:
    proxy = toxiproxy_proxy(targets)
    proxy.disable()  # listener closed, open connections dropped: connection refused
    return proxy.enable
