"""Fault injection on our SQS endpoint, observed through boto3, and the fault log."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import httpx
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from emulators.sqs.faults import SqsFaultControl, SqsFaultControlError
from emulators.sqs.processes import EndpointProcess, start_ours

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def endpoint() -> Iterator[EndpointProcess]:
    with start_ours() as running:
        yield running


@pytest.fixture
def control(endpoint: EndpointProcess) -> Iterator[SqsFaultControl]:
    with SqsFaultControl(endpoint.url) as client:
        yield client
        client.stop_all()


def make_client(endpoint: EndpointProcess, **retries: Any) -> Any:
    return boto3.client(
        "sqs",
        endpoint_url=endpoint.url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(retries=retries or {"total_max_attempts": 1}, read_timeout=30),
    )


@pytest.fixture
def sqs(endpoint: EndpointProcess) -> Any:
    return make_client(endpoint)


@pytest.fixture
def queue(sqs: Any) -> tuple[str, str]:
    name = f"f-{uuid.uuid4().hex[:12]}"
    url = sqs.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "1"})["QueueUrl"]
    return name, url


def wait_for(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def receive(sqs: Any, url: str, wait: int = 1, **kw: Any) -> list[dict[str, Any]]:
    return sqs.receive_message(
        QueueUrl=url, WaitTimeSeconds=wait, MessageSystemAttributeNames=["All"], **kw
    ).get("Messages", [])


def in_flight(sqs: Any, url: str) -> int:
    attrs = sqs.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    return int(attrs["ApproximateNumberOfMessagesNotVisible"])


def test_duplicate_delivery_hands_the_same_message_out_twice(
    control: SqsFaultControl, sqs: Any, queue: tuple[str, str]
) -> None:
    name, url = queue
    sent = sqs.send_message(QueueUrl=url, MessageBody="once")
    window = control.duplicate_delivery(1.0, queues=[name], seed=1)
    [first] = receive(sqs, url, VisibilityTimeout=60)
    control.stop(window.id)
    [second] = receive(sqs, url, wait=0, VisibilityTimeout=60)
    assert first["MessageId"] == second["MessageId"] == sent["MessageId"]
    assert second["Attributes"]["ApproximateReceiveCount"] == "2"
    # The duplicate's receipt handle is the one that deletes; the first copy's is stale.
    sqs.delete_message(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"])
    assert in_flight(sqs, url) == 1
    sqs.delete_message(QueueUrl=url, ReceiptHandle=second["ReceiptHandle"])
    assert in_flight(sqs, url) == 0


def test_lost_delete_returns_the_message(
    control: SqsFaultControl, sqs: Any, queue: tuple[str, str]
) -> None:
    name, url = queue
    sent = sqs.send_message(QueueUrl=url, MessageBody="keep coming back")
    [msg] = receive(sqs, url)
    with control.inject("lost_delete", {"p": 1.0}, queues=[name], seed=2):
        response = sqs.delete_message(QueueUrl=url, ReceiptHandle=msg["ReceiptHandle"])
        assert response["ResponseMetadata"]["HTTPStatusCode"] == 200
    [back] = wait_for(lambda: receive(sqs, url), 15, "the message to return")
    assert back["MessageId"] == sent["MessageId"]
    assert back["Attributes"]["ApproximateReceiveCount"] == "2"
    sqs.delete_message(QueueUrl=url, ReceiptHandle=back["ReceiptHandle"])
    assert receive(sqs, url, wait=2) == []


def test_batch_entry_errors_fail_entries_alone_in_a_200(
    control: SqsFaultControl, sqs: Any, queue: tuple[str, str]
) -> None:
    """A SendMessageBatch taken in part: HTTP 200, some entries under Failed and not enqueued,
    the rest enqueued; a retry of only the failed entries completes the batch."""
    name, url = queue
    entries = [{"Id": str(i), "MessageBody": f"m{i}"} for i in range(10)]
    with control.inject("batch_entry_errors", {"p": 0.5}, queues=[name], seed=4):
        response = sqs.send_message_batch(QueueUrl=url, Entries=entries)
        assert response["ResponseMetadata"]["HTTPStatusCode"] == 200
        failed = {f["Id"] for f in response.get("Failed", [])}
        taken = {s["Id"] for s in response.get("Successful", [])}
        assert failed and taken and failed | taken == {e["Id"] for e in entries}
        assert all(
            f["Code"] == "InternalError" and not f["SenderFault"] for f in response["Failed"]
        )
    bodies: set[str] = set()  # the queue's 1 s visibility hands a message out again
    wait_for(
        lambda: (
            bodies.update(m["Body"] for m in receive(sqs, url, MaxNumberOfMessages=10))
            or len(bodies) >= len(taken)
        ),
        15,
        "the taken entries",
    )
    assert bodies == {f"m{i}" for i in taken}
    retry = [e for e in entries if e["Id"] in failed]
    assert not sqs.send_message_batch(QueueUrl=url, Entries=retry).get("Failed")


def test_errors_raise_the_right_botocore_exceptions(
    control: SqsFaultControl, sqs: Any, queue: tuple[str, str], endpoint: EndpointProcess
) -> None:
    name, url = queue
    other = sqs.create_queue(QueueName=f"{name}-other")["QueueUrl"]
    with control.inject("errors", {"p": 1.0, "kind": "throttling"}, queues=[name]):
        with pytest.raises(sqs.exceptions.RequestThrottled) as info:
            sqs.send_message(QueueUrl=url, MessageBody="x")
        assert info.value.response["Error"]["Code"] == "RequestThrottled"
        assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
        sqs.send_message(QueueUrl=other, MessageBody="another queue is not affected")
    with control.inject("errors", {"p": 1.0, "kind": "internal"}, queues=[name]):
        with pytest.raises(ClientError) as info:
            sqs.receive_message(QueueUrl=url)
        assert info.value.response["Error"]["Code"] == "InternalError"
        assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500
    # botocore's own retries see a throttle as retryable: with p=0.5 and retries, calls succeed.
    retrying = make_client(endpoint, mode="standard", max_attempts=10)
    with control.inject("errors", {"p": 0.5, "kind": "throttling"}, queues=[name], seed=3):
        for _ in range(5):
            response = retrying.send_message(QueueUrl=url, MessageBody="eventually")
        assert response["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert sqs.send_message(QueueUrl=url, MessageBody="after")["MessageId"]


def test_latency_is_added_to_every_call(
    control: SqsFaultControl, sqs: Any, queue: tuple[str, str]
) -> None:
    name, url = queue

    def timed() -> float:
        started = time.monotonic()
        sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])
        return time.monotonic() - started

    with control.inject("latency", {"ms": 400}, queues=[name]):
        slow = min(timed() for _ in range(3))
    assert slow >= 0.4
    assert min(timed() for _ in range(3)) < slow


def test_visibility_expiry_makes_in_flight_messages_receivable(
    control: SqsFaultControl, sqs: Any, queue: tuple[str, str]
) -> None:
    name, url = queue
    sent = sqs.send_message(QueueUrl=url, MessageBody="expire me")
    [held] = receive(sqs, url, VisibilityTimeout=600)
    assert receive(sqs, url, wait=0) == []
    window = control.visibility_expiry(1.0, queues=[name], seed=4)
    [again] = receive(sqs, url, wait=0, VisibilityTimeout=600)
    assert again["MessageId"] == held["MessageId"] == sent["MessageId"]
    assert again["Attributes"]["ApproximateReceiveCount"] == "2"
    # While active, a message received becomes visible again at once.
    [third] = receive(sqs, url, VisibilityTimeout=600)
    assert third["Attributes"]["ApproximateReceiveCount"] == "3"
    control.stop(window.id)
    sqs.delete_message(QueueUrl=url, ReceiptHandle=third["ReceiptHandle"])
    assert receive(sqs, url, wait=0) == []


def test_fault_log_records_windows(control: SqsFaultControl, queue: tuple[str, str]) -> None:
    name, _ = queue
    first = control.lost_delete(0.25, queues=[name], seed=11)
    second = control.latency(5)
    assert first.stopped_at is None and first.seed == 11 and first.params == {"p": 0.25}
    assert first.queues == [name] and second.queues is None
    stopped = control.stop(first.id)
    assert stopped.stopped_at is not None and stopped.stopped_at >= stopped.started_at
    assert {w.id for w in control.stop_all()} == {second.id}
    timed = control.start("duplicate_delivery", {"p": 0.1}, duration=0.2)
    log = {w.id: w for w in control.log()}
    assert log[first.id].stopped_at == stopped.stopped_at
    assert log[second.id].stopped_at is not None
    assert log[first.id].to_dict() == {
        "id": first.id,
        "fault": "lost_delete",
        "params": {"p": 0.25},
        "queues": [name],
        "seed": 11,
        "started_at": first.started_at,
        "stopped_at": stopped.stopped_at,
    }
    wait_for(
        lambda: {w.id: w for w in control.log()}[timed.id].stopped_at is not None,
        10,
        "the timed fault to stop by itself",
    )
    assert isinstance(log[second.id].seed, int)  # chosen and recorded when not given


def test_seeded_faults_repeat(control: SqsFaultControl, sqs: Any) -> None:
    def pattern() -> list[bool]:
        name = f"seeded-{uuid.uuid4().hex[:10]}"
        url = sqs.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "60"})["QueueUrl"]
        lost = []
        with control.inject("lost_delete", {"p": 0.5}, queues=[name], seed=1234):
            for _ in range(24):
                sqs.send_message(QueueUrl=url, MessageBody="x")
                [msg] = receive(sqs, url, wait=0)
                before = in_flight(sqs, url)
                sqs.delete_message(QueueUrl=url, ReceiptHandle=msg["ReceiptHandle"])
                lost.append(in_flight(sqs, url) == before)
        return lost

    first = pattern()
    assert first == pattern()
    assert any(first) and not all(first)


def test_control_api_errors_and_reset(
    control: SqsFaultControl, sqs: Any, endpoint: EndpointProcess
) -> None:
    for fault, params in [
        ("no_such_fault", {}),
        ("lost_delete", {"p": 2}),
        ("errors", {"p": 0.5, "kind": "teapot"}),
        ("latency", {}),
    ]:
        with pytest.raises(SqsFaultControlError, match="HTTP 400"):
            control.start(fault, params)
    with pytest.raises(SqsFaultControlError, match="HTTP 404"):
        control.stop("f999999")
    health = control.health()
    assert health["ok"] is True
    name = f"reset-{uuid.uuid4().hex[:10]}"
    sqs.create_queue(QueueName=name)
    control.latency(1)
    control.reset()
    assert control.health()["active_faults"] == []
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.get_queue_url(QueueName=name)
    with httpx.Client(base_url=endpoint.url) as http:
        assert http.get("/_sqs/nothing").status_code == 404
        assert http.get("/_sqs/queues").json() == {"queues": []}


def test_every_copy_handed_out_is_in_the_receive_log(
    control: SqsFaultControl, sqs: Any, queue: tuple[str, str], endpoint: EndpointProcess
) -> None:
    name, url = queue
    since = httpx.get(f"{endpoint.url}/_sqs/receives/position").json()["next"]
    assert since == httpx.get(f"{endpoint.url}/_sqs/receives?since=0&limit=10000").json()["next"]
    sent = sqs.send_message(QueueUrl=url, MessageBody="job")["MessageId"]
    control.duplicate_delivery(p=1.0, queues=[name])
    first = receive(sqs, url)
    second = wait_for(lambda: receive(sqs, url, wait=0), 5, "the duplicate copy")
    control.stop_all()
    assert first[0]["MessageId"] == second[0]["MessageId"] == sent
    rows = httpx.get(f"{endpoint.url}/_sqs/receives?since={since}").json()["rows"]
    mine = [r for r in rows if r["queue"] == name]
    assert [(r["message_id"], r["receive_count"]) for r in mine] == [(sent, 1), (sent, 2)]
    assert [r["seq"] for r in mine] == sorted(r["seq"] for r in mine)
    assert mine[0]["time"] <= mine[1]["time"] <= time.time()
    # A reader of what comes after now starts where the log ends (a long-lived endpoint's log
    # holds every earlier run's copies).
    assert httpx.get(f"{endpoint.url}/_sqs/receives/position").json()["next"] >= since + 2
    bad = httpx.get(f"{endpoint.url}/_sqs/receives?since=-1")
    assert bad.status_code == 400 and "since must be >= 0" in bad.json()["error"]


def test_fifo_copies_are_in_the_receive_log_and_faults_apply(
    control: SqsFaultControl, sqs: Any, endpoint: EndpointProcess
) -> None:
    name = f"log-{time.time_ns()}.fifo"
    url = sqs.create_queue(
        QueueName=name, Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"}
    )["QueueUrl"]
    since = httpx.get(f"{endpoint.url}/_sqs/receives?since=0&limit=10000").json()["next"]
    sent = sqs.send_message(QueueUrl=url, MessageBody="job", MessageGroupId="g")["MessageId"]
    control.duplicate_delivery(p=1.0, queues=[name])
    first = receive(sqs, url)
    second = wait_for(lambda: receive(sqs, url, wait=0), 5, "the duplicate copy")
    control.stop_all()
    assert first[0]["MessageId"] == second[0]["MessageId"] == sent
    rows = httpx.get(f"{endpoint.url}/_sqs/receives?since={since}").json()["rows"]
    mine = [r for r in rows if r["queue"] == name]
    assert [(r["message_id"], r["receive_count"], r["region"]) for r in mine] == [
        (sent, 1, "us-east-1"),
        (sent, 2, "us-east-1"),
    ]
    queues = httpx.get(f"{endpoint.url}/_sqs/queues").json()["queues"]
    assert {"name": name, "region": "us-east-1", "fifo": True} == {
        k: v
        for q in queues
        if q["name"] == name
        for k, v in q.items()
        if k in ("name", "region", "fifo")
    }
