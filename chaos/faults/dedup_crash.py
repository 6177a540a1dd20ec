"""dedup-crash: kill -9 redis-server at start, restart it at stop (state survives only with AOF)."""

from __future__ import annotations

from chaos.faults import DEDUP_STORE, fault
from chaos.faults.adapters import process_crash

start = fault(
    "dedup-crash",
    "kill -9 redis-server at start, restart it at stop (state survives only with AOF)",
    needs="processes",
    needs_what="process hooks (the harness's own stack, or a target's processes: map)",
    part="redis",
    actions=("kill", "start"),
    takes_away=DEDUP_STORE,
)(process_crash("redis"))
