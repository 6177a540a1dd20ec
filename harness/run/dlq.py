"""Dead-letter queue redrive: move every message of a DLQ back to its source queue."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from harness.contract.system import Queues
from harness.model.history import History


def redrive(
    sqs: Any,
    dlq_url: str,
    source_url: str,
    limit: int = 1_000_000,
    moved_body: Callable[[str], None] | None = None,
) -> int:
    """Receive, re-send (body and attributes kept), delete; returns how many moved, and hands
    ``moved_body`` the body of each (the run records which jobs waited for the operator).

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
        if moved_body is not None:
            for i, m in enumerate(messages):
                if str(i) in sent:
                    moved_body(m["Body"])
        moved += len(done)
    return moved


def queue_urls(sqs: Any, queues: Queues, name: str) -> tuple[str, str]:
    """(source, dead-letter) URLs of one of a system's work queues."""
    source = sqs.get_queue_url(QueueName=queues.work[name])["QueueUrl"]
    return source, sqs.get_queue_url(QueueName=queues.dead[name])["QueueUrl"]


def redrive_all(
    sqs: Any,
    queues: Queues,
    names: Iterable[str] | None = None,
    moved_body: Callable[[str, str], None] | None = None,
) -> dict[str, int]:
    """The runbook's redrive over every work queue that has a dead-letter queue (each
    channel's, and a fan-out's own page tasks); returns how many moved, by queue, and hands
    ``moved_body`` (queue name, body) of each message moved."""
    names = [n for n in (names or queues.work) if n in queues.dead]
    moved = {}
    for name in names:
        each = None if moved_body is None else (lambda body, name=name: moved_body(name, body))
        moved[name] = redrive(sqs, *reversed(queue_urls(sqs, queues, name)), moved_body=each)
    return moved


def redrive_recorded(
    sqs: Any, queues: Queues, history: History, ours: Callable[[str], bool]
) -> dict[str, int]:
    """:func:`redrive_all`, each job moved whose tenant ``ours`` accepts a ``redriven`` history
    row (tenant, notification and recipient as the contract's job fields name them; the
    queue): delivery_latency measures the push that waited in the DLQ from it, since the wait
    was the operator's. Another run's jobs are moved too (the runbook empties the DLQ), not
    recorded."""

    def record(queue: str, body: str) -> None:
        tenant, notification, recipient = queues.read_job(body)
        if tenant is None or not ours(str(tenant)):
            return
        history.append(
            "redriven", tenant_id=tenant, notification_id=notification, user_id=recipient,
            detail=json.dumps({"queue": queue}),
        )  # fmt: skip

    return redrive_all(sqs, queues, moved_body=record)
