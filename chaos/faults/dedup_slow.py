"""dedup-slow: dedup store slow: latency toxic."""

from __future__ import annotations

from chaos.faults import fault
from chaos.faults.adapters import dedup_toxic

start = fault(
    "dedup-slow",
    "dedup store slow: latency toxic",
    needs="toxiproxy_url",
    needs_what="fault proxy in front of its dedup store (dedup_listen, or toxiproxy_url)",
)(
    dedup_toxic(
        "latency",
        lambda p: {"latency": int(p.get("latency_ms", 100)), "jitter": int(p.get("jitter_ms", 0))},
    )
)
