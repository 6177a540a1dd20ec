"""ses-status: SES answers 429 TooManyRequestsException / 500 InternalFailure / 503
ServiceUnavailable to a fraction p of SendEmail calls (nothing is sent for them)."""

from __future__ import annotations

from chaos.faults import fault
from chaos.faults.adapters import simulator_fault

start = fault(
    "ses-status",
    "SES answers 429 / 500 / 503 to a fraction p of SendEmail calls",
    required=("p", "status"),
    needs="ses_url",
    needs_what="SES simulator",
)(simulator_fault("ses", "status"))
