"""apns-latency: APNs answers late."""

from __future__ import annotations

from chaos.faults import fault
from chaos.faults.adapters import simulator_fault

start = fault(
    "apns-latency",
    "APNs answers late",
    required=("ms",),
    needs="apns_url",
    needs_what="APNs simulator",
)(simulator_fault("apns", "latency"))
