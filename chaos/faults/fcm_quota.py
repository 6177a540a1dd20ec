"""fcm-quota: FCM per-project quota: 429 QUOTA_EXCEEDED with Retry-After."""

from __future__ import annotations

from chaos.faults import fault
from chaos.faults.adapters import simulator_fault

start = fault(
    "fcm-quota",
    "FCM per-project quota: 429 QUOTA_EXCEEDED with Retry-After",
    required=("per_minute",),
    needs="fcm_url",
    needs_what="FCM simulator",
)(simulator_fault("fcm", "quota"))
