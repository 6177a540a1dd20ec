"""dedup-crash: kill -9 redis-server at start, restart it at stop (state survives only with AOF)."""

from __future__ import annotations

from chaos.faults import fault
from chaos.faults.adapters import process_crash

start = fault(
    "dedup-crash",
    "kill -9 redis-server at start, restart it at stop (state survives only with AOF)",
    needs="processes",
    needs_what="processes the harness started itself (a target's are not ours to kill)",
)(process_crash("redis"))
