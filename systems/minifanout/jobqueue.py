"""The push queue and its dead-letter queue on SQS, through boto3 (run in threads: boto3 is
synchronous and its clients are thread-safe)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import boto3
from botocore.config import Config as BotoConfig
from botocore.exceptions import BotoCoreError, ClientError

log = logging.getLogger("minifanout.queue")

SQS_BATCH = 10
RETENTION_S = 14 * 24 * 3600


# How often a batch's refused entries are sent again before the enqueue fails.
ENTRY_RETRIES = 8


class QueueError(RuntimeError):
    """SQS refused or failed a call."""


@dataclass(frozen=True)
class Received:
    body: str
    receipt: str
    receive_count: int
    message_id: str


def sqs_client(endpoint: str | None, region: str, connections: int = 32) -> Any:
    """A boto3 SQS client. With a local endpoint and no credentials in the environment, the
    dummy ones a local endpoint accepts."""
    kwargs: dict[str, Any] = {
        "region_name": region,
        "config": BotoConfig(
            max_pool_connections=connections,
            retries={"total_max_attempts": 3, "mode": "standard"},
            connect_timeout=5,
            read_timeout=30,
        ),
    }
    if endpoint:
        kwargs["endpoint_url"] = endpoint
        if not os.environ.get("AWS_ACCESS_KEY_ID"):
            kwargs["aws_access_key_id"] = "testing"
            kwargs["aws_secret_access_key"] = "testing"
    return boto3.client("sqs", **kwargs)


class JobQueue:
    def __init__(self, sqs: Any, name: str, dead_name: str, poison_name: str | None = None) -> None:
        self.sqs = sqs
        self.name, self.dead_name = name, dead_name
        # Malformed jobs apart from the ones that ran out of receives, when a name is given.
        self.poison_name = poison_name
        self.url = ""
        self.dead_url = ""
        self.poison_url = ""

    def ensure(self, visibility_timeout_s: int, max_receives: int) -> None:
        """Create both queues (or bring their attributes to these values): a job received more
        than ``max_receives`` times moves to the dead-letter queue."""
        self.dead_url = self._create(self.dead_name, {"MessageRetentionPeriod": str(RETENTION_S)})
        arn = self.sqs.get_queue_attributes(QueueUrl=self.dead_url, AttributeNames=["QueueArn"])[
            "Attributes"
        ]["QueueArn"]
        redrive = json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": str(max_receives)})
        self.url = self._create(
            self.name,
            {"VisibilityTimeout": str(visibility_timeout_s), "RedrivePolicy": redrive},
        )
        self.poison_url = (
            self._create(self.poison_name, {"MessageRetentionPeriod": str(RETENTION_S)})
            if self.poison_name
            else self.dead_url
        )

    def _create(self, name: str, attributes: dict[str, str]) -> str:
        try:
            return self.sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
        except ClientError as exc:
            if exc.response["Error"]["Code"] not in ("QueueAlreadyExists", "QueueNameExists"):
                raise
        url = self.sqs.get_queue_url(QueueName=name)["QueueUrl"]
        self.sqs.set_queue_attributes(QueueUrl=url, Attributes=attributes)
        return url

    async def _call(self, method: str, **kwargs: Any) -> dict[str, Any]:
        try:
            return await asyncio.to_thread(getattr(self.sqs, method), **kwargs)
        except (BotoCoreError, ClientError) as exc:
            raise QueueError(f"SQS {method}: {exc}") from exc

    async def send(
        self, bodies: Sequence[str], tenant: str, delay_s: int = 0, parallel: int = 8
    ) -> None:
        """Enqueue, ten a call, ``parallel`` calls at a time; raises QueueError naming how many
        SQS refused (the rest are on the queue: a retry of the whole is safe, the consumer's
        claim sends each once)."""
        gate = asyncio.Semaphore(parallel)

        async def batch(chunk: Sequence[str]) -> int:
            entries = [
                {
                    "Id": str(i),
                    "MessageBody": body,
                    "DelaySeconds": delay_s,
                    "MessageAttributes": {
                        "tenant_id": {"DataType": "String", "StringValue": tenant}
                    },
                }
                for i, body in enumerate(chunk)
            ]
            # SQS takes a batch in part (HTTP 200, the rest under Failed): the refused entries
            # are sent again, as AWS advises, a few times before the caller hears of them.
            for attempt in range(ENTRY_RETRIES + 1):
                async with gate:
                    answer = await self._call(
                        "send_message_batch", QueueUrl=self.url, Entries=entries
                    )
                failed = {f["Id"] for f in answer.get("Failed") or []}
                entries = [e for e in entries if e["Id"] in failed]
                if not entries or attempt == ENTRY_RETRIES:
                    break
                await asyncio.sleep(min(0.05 * 2**attempt, 0.4))
            return len(entries)

        chunks = [bodies[i : i + SQS_BATCH] for i in range(0, len(bodies), SQS_BATCH)]
        results = await asyncio.gather(*(batch(c) for c in chunks), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        refused = sum(r for r in results if isinstance(r, int))
        if errors:
            raise QueueError(
                f"{len(errors)} of {len(chunks)} SendMessageBatch calls failed: {errors[0]}"
            )
        if refused:
            raise QueueError(f"SQS refused {refused} of {len(bodies)} job(s)")

    async def receive(self, wait_s: int = 1) -> list[Received]:
        answer = await self._call(
            "receive_message",
            QueueUrl=self.url,
            MaxNumberOfMessages=SQS_BATCH,
            WaitTimeSeconds=wait_s,
            MessageSystemAttributeNames=["ApproximateReceiveCount"],
        )
        return [
            Received(
                m["Body"],
                m["ReceiptHandle"],
                int((m.get("Attributes") or {}).get("ApproximateReceiveCount", "1")),
                m["MessageId"],
            )
            for m in answer.get("Messages") or []
        ]

    async def delete(self, message: Received) -> None:
        await self._call("delete_message", QueueUrl=self.url, ReceiptHandle=message.receipt)

    async def delete_batch(self, messages: Sequence[Received]) -> None:
        """Delete finished jobs, ten a call; raises QueueError when SQS failed any (those come
        back after their visibility timeout)."""
        for start in range(0, len(messages), SQS_BATCH):
            chunk = messages[start : start + SQS_BATCH]
            entries = [{"Id": str(i), "ReceiptHandle": m.receipt} for i, m in enumerate(chunk)]
            answer = await self._call("delete_message_batch", QueueUrl=self.url, Entries=entries)
            failed = answer.get("Failed") or []
            if failed:
                raise QueueError(f"SQS did not delete {len(failed)} job(s): {failed[0]}")

    async def hide(self, message: Received, seconds: float) -> None:
        """Keep the job invisible for ``seconds`` more (SQS: 0-43200, whole seconds)."""
        await self._call(
            "change_message_visibility",
            QueueUrl=self.url,
            ReceiptHandle=message.receipt,
            VisibilityTimeout=max(0, min(43200, int(seconds + 0.999))),
        )

    async def to_dead_letter(self, message: Received, why: str, poison: bool = False) -> None:
        """A job that can never succeed goes to the dead-letter queue at once, with why (a
        malformed one, ``poison``, to the poison queue when there is one)."""
        await self._call(
            "send_message",
            QueueUrl=self.poison_url if poison else self.dead_url,
            MessageBody=message.body,
            MessageAttributes={"reason": {"DataType": "String", "StringValue": why[:256]}},
        )
        await self.delete(message)
