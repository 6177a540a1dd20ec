"""consumer-crash: kill -9 the push consumer at start, restart it at stop."""

from __future__ import annotations

from chaos.faults import fault
from chaos.faults.adapters import process_crash

start = fault(
    "consumer-crash",
    "kill -9 the push consumer at start, restart it at stop",
    needs="processes",
    needs_what="process hooks (the harness's own stack, or a target's processes: map)",
    part="push-consumer",
    actions=("kill", "start"),
)(process_crash("push-consumer"))
