"""consumer-pause: SIGSTOP the push consumer at start (its connections stay open, nothing
answers), SIGCONT at stop: a process that hangs rather than dies (a long GC, a stuck host)."""

from __future__ import annotations

from chaos.faults import fault
from chaos.faults.adapters import process_pause

start = fault(
    "consumer-pause",
    "pause the push consumer (SIGSTOP) at start, resume it (SIGCONT) at stop",
    needs="processes",
    needs_what="process hooks (the harness's own stack, or a target's processes: map)",
    part="push-consumer",
    actions=("pause", "resume"),
)(process_pause("push-consumer"))
