"""apns-unregister: APNs tokens turn Unregistered."""

from __future__ import annotations

from chaos.faults import fault
from chaos.faults.adapters import simulator_fault

start = fault(
    "apns-unregister",
    "APNs tokens turn Unregistered",
    needs="apns_url",
    needs_what="APNs simulator",
)(simulator_fault("apns", "unregister"))
