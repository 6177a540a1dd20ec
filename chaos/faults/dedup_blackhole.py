"""dedup-blackhole: dedup store black hole: data stops flowing, connections hang (timeout toxic 0)."""

from __future__ import annotations

from chaos.faults import DEDUP_STORE, fault
from chaos.faults.adapters import dedup_toxic

start = fault(
    "dedup-blackhole",
    "dedup store black hole: data stops flowing, connections hang (timeout toxic 0)",
    needs="toxiproxy_url",
    needs_what="fault proxy in front of its dedup store (dedup_listen, or toxiproxy_url)",
    takes_away=DEDUP_STORE,
)(dedup_toxic("timeout", lambda p: {"timeout": int(p.get("timeout_ms", 0))}))
