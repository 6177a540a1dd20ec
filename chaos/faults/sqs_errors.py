"""sqs-errors: SQS throttles or fails calls."""

from __future__ import annotations

from chaos.faults import fault
from chaos.faults.adapters import sqs_fault

start = fault(
    "sqs-errors",
    "SQS throttles or fails calls",
    required=("p",),
    needs="sqs_url",
    needs_what="SQS endpoint with fault injection (the harness's own, sqs_control)",
)(sqs_fault("errors"))
