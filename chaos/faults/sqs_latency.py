"""sqs-latency: SQS answers late."""

from __future__ import annotations

from chaos.faults import fault
from chaos.faults.adapters import sqs_fault

start = fault(
    "sqs-latency",
    "SQS answers late",
    required=("ms",),
    needs="sqs_url",
    needs_what="SQS endpoint with fault injection (the harness's own, sqs_control)",
)(sqs_fault("latency"))
