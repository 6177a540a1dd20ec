"""invalidator-stop: kill the stream invalidator (the consumer of the preferences table's change
stream) at start, start it again at stop. For the window no change written to the table reaches
the cache through the stream: a change made through the API must still take effect by its own
write-through invalidation, one written straight to the table is bounded only by the cache's
TTL (what the window records as taken away tells preference_changes so)."""

from __future__ import annotations

from chaos.faults import PREFERENCES_STREAM, fault
from chaos.faults.adapters import process_crash

start = fault(
    "invalidator-stop",
    "kill the preferences stream's invalidator at start, start it again at stop",
    needs="processes",
    needs_what="process hooks (the harness's own stack, or a target's processes: map)",
    part="stream-invalidator",
    actions=("kill", "start"),
    takes_away=PREFERENCES_STREAM,
)(process_crash("stream-invalidator"))
