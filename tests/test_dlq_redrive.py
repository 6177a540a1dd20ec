"""The operator's DLQ redrive as the harness performs it (harness.run.dlq), against our SQS
endpoint over a real socket: every message goes back to its work queue, body kept, and each of
this run's jobs leaves a ``redriven`` row that names it (delivery_latency measures from it)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.config import Config as BotoConfig

from emulators.sqs.processes import EndpointProcess, start_ours
from harness.contract.system import Queues, job_reader
from harness.model.history import History
from harness.run.dlq import redrive_recorded


@pytest.fixture(scope="module")
def endpoint() -> Iterator[EndpointProcess]:
    with start_ours() as running:
        yield running


@pytest.fixture
def sqs(endpoint: EndpointProcess) -> Any:
    return boto3.client(
        "sqs",
        endpoint_url=endpoint.url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=BotoConfig(retries={"total_max_attempts": 1}),
    )


def _drain(sqs: Any, url: str) -> list[str]:
    bodies: list[str] = []
    for _ in range(20):  # bounded: a handful of messages
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0)
        if not got.get("Messages"):
            return bodies
        bodies += [m["Body"] for m in got["Messages"]]
    return bodies


@pytest.mark.integration
def test_a_redrive_moves_every_job_back_and_records_this_runs_own(sqs):
    name = f"push-{uuid.uuid4().hex[:8]}"
    work = sqs.create_queue(QueueName=name)["QueueUrl"]
    dead = sqs.create_queue(QueueName=f"{name}-dlq")["QueueUrl"]
    # A team's own job schema: the identity lives where its contract says.
    queues = Queues(
        work={"push": name},
        dead={"push": f"{name}-dlq"},
        read_job=job_reader({"tenant": "org", "notification": "ids.n", "recipient": "to"}),
    )
    jobs = [
        {"org": "run1-a", "ids": {"n": "N1"}, "to": "u1"},
        {"org": "run1-a", "ids": {"n": "N2"}},  # names no recipient
        {"org": "other-run", "ids": {"n": "N3"}, "to": "u3"},  # an earlier run's: moved only
    ]
    for job in jobs:
        sqs.send_message(QueueUrl=dead, MessageBody=json.dumps(job))
    history = History()
    moved = redrive_recorded(sqs, queues, history, lambda tenant: tenant.startswith("run1-"))
    assert moved == {"push": 3}
    assert sorted(_drain(sqs, work)) == sorted(json.dumps(j) for j in jobs)
    assert _drain(sqs, dead) == []
    rows = history.frame()
    rows = rows[rows["kind"] == "redriven"]
    assert sorted(zip(rows["notification_id"], rows["user_id"].fillna("-"), strict=True)) == [
        ("N1", "u1"),
        ("N2", "-"),
    ]
    assert set(rows["tenant_id"]) == {"run1-a"}
    assert {json.loads(d)["queue"] for d in rows["detail"]} == {"push"}
