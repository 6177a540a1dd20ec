"""Dead-letter queue redrive: move every message of a DLQ back to its source queue."""

from __future__ import annotations

from typing import Any


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
