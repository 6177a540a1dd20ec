"""sqs-batch-entry-errors: SQS takes a SendMessageBatch in part (some entries under Failed)."""

from __future__ import annotations

from chaos.faults import fault
from chaos.faults.adapters import sqs_fault

start = fault(
    "sqs-batch-entry-errors",
    "SQS answers SendMessageBatch 200 with a fraction p of its entries under Failed",
    required=("p",),
    needs="sqs_url",
    needs_what="SQS endpoint with fault injection (the harness's own, sqs_control)",
)(sqs_fault("batch_entry_errors"))
