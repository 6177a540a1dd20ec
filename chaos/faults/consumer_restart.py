"""consumer-restart: stop the push consumer as a deploy does (SIGTERM: its workers finish their
batches and exit) at start, start it again at stop. Nothing is cut mid-send, but whatever its
workers kept only in memory is gone: the recently dead tokens they shared, so from then on the
user records' deactivated devices alone keep sends from dead tokens."""

from __future__ import annotations

from chaos.faults import fault
from chaos.faults.adapters import process_restart

start = fault(
    "consumer-restart",
    "stop the push consumer gracefully (SIGTERM) at start, start it again at stop",
    needs="processes",
    needs_what="process hooks (the harness's own stack, or a target's processes: map)",
    part="push-consumer",
    actions=("stop", "start"),
)(process_restart("push-consumer"))
