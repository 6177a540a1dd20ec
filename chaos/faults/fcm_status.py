"""fcm-status: FCM answers 503 UNAVAILABLE / 500 INTERNAL to a fraction p."""

from __future__ import annotations

from chaos.faults import fault
from chaos.faults.adapters import simulator_fault

start = fault(
    "fcm-status",
    "FCM answers 503 UNAVAILABLE / 500 INTERNAL to a fraction p",
    required=("p", "status"),
    needs="fcm_url",
    needs_what="FCM simulator",
)(simulator_fault("fcm", "status"))
