"""apns-accepted-then-error: APNs delivers, then answers 5xx (a naive retry duplicates)."""

from __future__ import annotations

from chaos.faults import fault
from chaos.faults.adapters import simulator_fault

start = fault(
    "apns-accepted-then-error",
    "APNs delivers, then answers 5xx (a naive retry duplicates)",
    required=("p",),
    needs="apns_url",
    needs_what="APNs simulator",
)(simulator_fault("apns", "accepted_then_error"))
