"""sqs-duplicate-delivery: SQS hands a message out twice with probability p."""

from __future__ import annotations

from chaos.faults import fault
from chaos.faults.adapters import sqs_fault

start = fault(
    "sqs-duplicate-delivery",
    "SQS hands a message out twice with probability p",
    required=("p",),
    needs="sqs_url",
    needs_what="SQS endpoint with fault injection (the harness's own, sqs_control)",
)(sqs_fault("duplicate_delivery"))
