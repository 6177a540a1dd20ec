"""Dead-letter queue redrive: move every message of a DLQ back to its source queue."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from harness.contract.system import Queues


def redrive(sqs: Any, dlq_url: str, source_url: str, limit: int = 1_000_000) -> int:
    """Receive, re-send (body and attributes kept), delete; returns how many moved.

    Works against any SQS endpoint (ours, moto, AWS). A message is deleted from the DLQ only
    after its copy is accepted by the source queue, so a failure midway duplicates at worst,
    never loses: the dedup store absorbs the duplicate.
    """
    moved = 0
    while moved < limit:
        messages = sqs.receive_message(
            QueueUrl=dlq_url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=0,
            MessageAttributeNames=["All"],
        ).get("Messages", [])
        if not messages:
            return moved
        entries = []
        for i, m in enumerate(messages):
            entry: dict[str, Any] = {"Id": str(i), "MessageBody": m["Body"]}
            if m.get("MessageAttributes"):
                entry["MessageAttributes"] = m["MessageAttributes"]
            entries.append(entry)
        result = sqs.send_message_batch(QueueUrl=source_url, Entries=entries)
        sent = {s["Id"] for s in result.get("Successful", [])}
        done = [
            {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
            for i, m in enumerate(messages)
            if str(i) in sent
        ]
        if done:
            sqs.delete_message_batch(QueueUrl=dlq_url, Entries=done)
        moved += len(done)
    return moved


def queue_urls(sqs: Any, queues: Queues, name: str) -> tuple[str, str]:
    """(source, dead-letter) URLs of one of a system's work queues."""
    source = sqs.get_queue_url(QueueName=queues.work[name])["QueueUrl"]
    return source, sqs.get_queue_url(QueueName=queues.dead[name])["QueueUrl"]


def redrive_all(sqs: Any, queues: Queues, names: Iterable[str] | None = None) -> dict[str, int]:
    """The runbook's redrive over every work queue that has a dead-letter queue (each
    channel's, and a fan-out's own page tasks); returns how many moved, by queue."""
    names = [n for n in (names or queues.work) if n in queues.dead]
    return {name: redrive(sqs, *reversed(queue_urls(sqs, queues, name))) for name in names}
