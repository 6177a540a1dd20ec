"""fcm-accepted-then-error: FCM delivers, then answers 5xx."""

from __future__ import annotations

from chaos.faults import fault
from chaos.faults.adapters import simulator_fault

start = fault(
    "fcm-accepted-then-error",
    "FCM delivers, then answers 5xx",
    required=("p",),
    needs="fcm_url",
    needs_what="FCM simulator",
)(simulator_fault("fcm", "accepted_then_error"))
