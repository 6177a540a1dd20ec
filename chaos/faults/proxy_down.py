"""proxy-down: a dependency the target names in its proxies: map unreachable (the proxy is
disabled: connection refused) from start to stop. params: {proxy: name}."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from chaos.faults import NAMED_PROXY, ChaosTargets, fault
from chaos.faults.adapters import named_proxy


@fault(
    "proxy-down",
    "a named dependency unreachable: its proxy disabled (connection refused)",
    needs="toxiproxy_url",
    needs_what="fault proxy (a proxies: map in the target file, or toxiproxy_url)",
    required=("proxy",),
    takes_away=NAMED_PROXY,
)
def start(targets: ChaosTargets, params: dict[str, Any]) -> Callable[[], None]:
    proxy = named_proxy(targets, params)
    proxy.disable()
    return proxy.enable
