"""inapp-status: the API Gateway Management API answers 429 LimitExceededException / 500 to a
fraction p of PostToConnection calls (nothing is posted for them)."""

from __future__ import annotations

from chaos.faults import fault
from chaos.faults.adapters import simulator_fault

start = fault(
    "inapp-status",
    "the in-app gateway answers 429 / 500 to a fraction p of PostToConnection calls",
    required=("p", "status"),
    needs="inapp_url",
    needs_what="in-app (API Gateway Management API) simulator",
)(simulator_fault("inapp", "status"))
