"""What the SNS topic tests share: boto3 clients for a stack's endpoints, queues, receiving
everything a queue holds, and AWS error answers."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

WAIT = 10.0


def client(url: str, service: str = "sns", region: str = "us-east-1") -> Any:
    return boto3.client(
        service,
        endpoint_url=url,
        region_name=region,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(retries={"total_max_attempts": 1}, read_timeout=30),
    )


def queue(sqs: Any, fifo: bool = False, **attributes: str) -> tuple[str, str]:
    """A new queue's (URL, ARN)."""
    name = f"q-{uuid.uuid4().hex[:10]}" + (".fifo" if fifo else "")
    if fifo:
        attributes["FifoQueue"] = "true"
    url = sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    return url, arn


def topic(sns: Any, fifo: bool = False, **attributes: str) -> str:
    name = f"t-{uuid.uuid4().hex[:10]}" + (".fifo" if fifo else "")
    if fifo:
        attributes["FifoTopic"] = "true"
    return sns.create_topic(Name=name, Attributes=attributes)["TopicArn"]


def drain(sqs: Any, url: str, wait: int = 0) -> list[dict[str, Any]]:
    """Every message the queue holds now (deleted as received), oldest first for FIFO queues.
    SNS makes its first attempt at an SQS delivery before Publish answers, so right after a
    Publish this is all of it."""
    got: list[dict[str, Any]] = []
    while True:
        batch = sqs.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=wait if not got else 0,
            MessageAttributeNames=["All"],
            AttributeNames=["All"],
        ).get("Messages", [])
        if not batch:
            return got
        got += batch
        sqs.delete_message_batch(
            QueueUrl=url,
            Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(batch)
            ],
        )


def messages(sqs: Any, url: str) -> list[str]:
    """The SNS messages the queue holds (the envelope's Message, or the raw body)."""
    out = []
    for m in drain(sqs, url):
        try:
            body = json.loads(m["Body"])
        except ValueError:
            body = None
        out.append(body["Message"] if isinstance(body, dict) and "Message" in body else m["Body"])
    return out


def error_of(call: Callable[[], Any]) -> tuple[str, int, str]:
    with pytest.raises(ClientError) as info:
        call()
    err = info.value.response
    return err["Error"]["Code"], err["ResponseMetadata"]["HTTPStatusCode"], err["Error"]["Message"]


def attrs(**values: Any) -> dict[str, dict[str, str]]:
    """Message attributes: str -> String, int/float -> Number, list -> String.Array."""
    out = {}
    for name, value in values.items():
        if isinstance(value, list):
            out[name] = {"DataType": "String.Array", "StringValue": json.dumps(value)}
        elif isinstance(value, int | float):
            out[name] = {"DataType": "Number", "StringValue": str(value)}
        else:
            out[name] = {"DataType": "String", "StringValue": value}
    return out
