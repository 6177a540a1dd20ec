"""apns-status: APNs answers a status (429/500/503) to a fraction p."""

from __future__ import annotations

from chaos.faults import fault
from chaos.faults.adapters import simulator_fault

start = fault(
    "apns-status",
    "APNs answers a status (429/500/503) to a fraction p",
    required=("p", "status"),
    needs="apns_url",
    needs_what="APNs simulator",
)(simulator_fault("apns", "status"))
