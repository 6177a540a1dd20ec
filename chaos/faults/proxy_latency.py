"""proxy-latency: a named dependency slow (latency toxic). params: {proxy, latency_ms,
jitter_ms, stream}."""

from __future__ import annotations

from chaos.faults import fault
from chaos.faults.adapters import proxy_toxic

start = fault(
    "proxy-latency",
    "a named dependency slow: latency toxic on its proxy",
    needs="toxiproxy_url",
    needs_what="fault proxy (a proxies: map in the target file, or toxiproxy_url)",
    required=("proxy",),
)(
    proxy_toxic(
        "latency",
        lambda p: {"latency": int(p.get("latency_ms", 100)), "jitter": int(p.get("jitter_ms", 0))},
    )
)
