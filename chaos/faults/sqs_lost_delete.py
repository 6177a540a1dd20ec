"""sqs-lost-delete: SQS answers DeleteMessage 200 but the message returns."""

from __future__ import annotations

from chaos.faults import fault
from chaos.faults.adapters import sqs_fault

start = fault(
    "sqs-lost-delete",
    "SQS answers DeleteMessage 200 but the message returns",
    required=("p",),
    needs="sqs_url",
    needs_what="SQS endpoint with fault injection (the harness's own, sqs_control)",
)(sqs_fault("lost_delete"))
