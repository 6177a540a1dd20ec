"""sqs-visibility-expiry: SQS in-flight messages become visible again early."""

from __future__ import annotations

from chaos.faults import fault
from chaos.faults.adapters import sqs_fault

start = fault(
    "sqs-visibility-expiry",
    "SQS in-flight messages become visible again early",
    needs="sqs_url",
    needs_what="SQS endpoint with fault injection (the harness's own, sqs_control)",
)(sqs_fault("visibility_expiry"))
