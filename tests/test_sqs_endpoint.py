"""The SQS endpoint through an unmodified boto3 client, against ours and against moto's server.

Every case runs on both backends, so our semantics are checked against an independent
implementation; a case moto cannot pass is skipped on moto with the reason.
"""

from __future__ import annotations

import hashlib
import json
import signal
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import httpx
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from emulators.sqs.processes import EndpointProcess, start_moto, start_ours

pytestmark = pytest.mark.integration

ACCOUNT = {"ours": "000000000000", "moto": "123456789012"}


@dataclass
class Backend:
    kind: str
    endpoint: EndpointProcess

    @property
    def url(self) -> str:
        return self.endpoint.url

    def client(self, region_name: str = "us-east-1", **config: Any) -> Any:
        return boto3.client(
            "sqs",
            endpoint_url=self.url,
            region_name=region_name,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            config=Config(
                retries={"total_max_attempts": 1}, read_timeout=40, connect_timeout=5, **config
            ),
        )

    def arn(self, name: str) -> str:
        return f"arn:aws:sqs:us-east-1:{ACCOUNT[self.kind]}:{name}"

    def skip_on_moto(self, reason: str) -> None:
        if self.kind == "moto":
            pytest.skip(f"moto 5.2.5: {reason}")


@pytest.fixture(scope="module", params=["ours", "moto"])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    endpoint = (start_ours if request.param == "ours" else start_moto)()
    try:
        yield Backend(request.param, endpoint)
    finally:
        endpoint.stop()


@pytest.fixture
def sqs(backend: Backend) -> Any:
    return backend.client()


def new_name(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def queue(sqs: Any) -> str:
    """A fresh queue with a 1-second visibility timeout."""
    return sqs.create_queue(QueueName=new_name(), Attributes={"VisibilityTimeout": "1"})["QueueUrl"]


def wait_for(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``condition`` until it returns something truthy; each poll is itself a long poll
    or a quick call, so there is no sleep here."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def receive(sqs: Any, url: str, wait: int = 1, **kw: Any) -> list[dict[str, Any]]:
    return sqs.receive_message(
        QueueUrl=url,
        WaitTimeSeconds=wait,
        MessageSystemAttributeNames=["All"],
        MessageAttributeNames=["All"],
        **kw,
    ).get("Messages", [])


def receive_all(sqs: Any, url: str, count: int, timeout: float = 15) -> list[dict[str, Any]]:
    """Receive (visibility 60 s) until ``count`` messages are held."""
    held: list[dict[str, Any]] = []

    def enough() -> bool:
        held.extend(receive(sqs, url, MaxNumberOfMessages=10, VisibilityTimeout=60))
        return len(held) >= count

    wait_for(enough, timeout, f"{count} messages")
    return held


def counts(sqs: Any, url: str) -> tuple[int, int, int]:
    attrs = sqs.get_queue_attributes(
        QueueUrl=url,
        AttributeNames=[
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed",
        ],
    )["Attributes"]
    return (
        int(attrs["ApproximateNumberOfMessages"]),
        int(attrs["ApproximateNumberOfMessagesNotVisible"]),
        int(attrs["ApproximateNumberOfMessagesDelayed"]),
    )


def expect_error(call: Callable[[], Any], code: str, exception: type | None = None) -> ClientError:
    with pytest.raises(ClientError) as info:
        call()
    if exception is not None:
        assert isinstance(info.value, exception), type(info.value)
    assert info.value.response["Error"]["Code"] == code, info.value.response["Error"]
    return info.value


def status(err: ClientError) -> int:
    return err.response["ResponseMetadata"]["HTTPStatusCode"]


# Independent MD5 of message attributes (the algorithm in the SQS Developer Guide), written
# here again so that the test does not trust the implementation under test.
def expected_attributes_md5(attrs: dict[str, dict[str, Any]]) -> str:
    out = b""
    for name in sorted(attrs):
        value = attrs[name]
        for part in (name.encode(), value["DataType"].encode()):
            out += struct.pack("!I", len(part)) + part
        if "BinaryValue" in value:
            data = value["BinaryValue"]
            out += b"\x02" + struct.pack("!I", len(data)) + data
        else:
            data = value["StringValue"].encode()
            out += b"\x01" + struct.pack("!I", len(data)) + data
    return hashlib.md5(out).hexdigest()


ATTRIBUTES = {
    "tenant": {"DataType": "String", "StringValue": "acme ünïcode"},
    "attempt": {"DataType": "Number", "StringValue": "3"},
    "blob": {"DataType": "Binary", "BinaryValue": b"\x00\x01\xfe\xff"},
    "kind.custom": {"DataType": "String.kind", "StringValue": "post"},
}


# -- queues ------------------------------------------------------------------------------------
def test_queue_lifecycle(backend: Backend, sqs: Any) -> None:
    name = new_name("life")
    attributes = {
        "VisibilityTimeout": "7",
        "MaximumMessageSize": "2048",
        "MessageRetentionPeriod": "3600",
        "DelaySeconds": "0",
        "ReceiveMessageWaitTimeSeconds": "0",
    }
    url = sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
    assert url.endswith("/" + name)
    assert sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"] == url
    assert sqs.get_queue_url(QueueName=name)["QueueUrl"] == url
    assert url in sqs.list_queues(QueueNamePrefix="life-")["QueueUrls"]
    got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert {k: got[k] for k in attributes} == attributes
    assert got["QueueArn"] == backend.arn(name)
    assert got["ApproximateNumberOfMessages"] == "0"
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"VisibilityTimeout": "9"})
    got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["VisibilityTimeout"])
    assert got["Attributes"] == {"VisibilityTimeout": "9"}
    sqs.delete_queue(QueueUrl=url)
    expect_error(
        lambda: sqs.get_queue_url(QueueName=name),
        "AWS.SimpleQueueService.NonExistentQueue",
        sqs.exceptions.QueueDoesNotExist,
    )
    assert url not in sqs.list_queues(QueueNamePrefix="life-").get("QueueUrls", [])


def test_redrive_policy_attributes(backend: Backend, sqs: Any) -> None:
    dlq = sqs.create_queue(QueueName=new_name("dlq"))["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    allow = json.dumps({"redrivePermission": "allowAll"})
    sqs.set_queue_attributes(QueueUrl=dlq, Attributes={"RedriveAllowPolicy": allow})
    policy = {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 4}
    src = sqs.create_queue(
        QueueName=new_name("src"), Attributes={"RedrivePolicy": json.dumps(policy)}
    )["QueueUrl"]
    got = sqs.get_queue_attributes(QueueUrl=src, AttributeNames=["RedrivePolicy"])["Attributes"]
    assert json.loads(got["RedrivePolicy"]) == policy
    assert sqs.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"] == [src]
    backend.skip_on_moto("GetQueueAttributes does not know RedriveAllowPolicy")
    got = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["RedriveAllowPolicy"])
    assert json.loads(got["Attributes"]["RedriveAllowPolicy"]) == {"redrivePermission": "allowAll"}


# -- messages ----------------------------------------------------------------------------------
def test_send_receive_with_attributes_and_md5s(sqs: Any, queue: str) -> None:
    body = '{"notification": "n-1", "emoji": "🚀"}'
    sent = sqs.send_message(QueueUrl=queue, MessageBody=body, MessageAttributes=ATTRIBUTES)
    assert sent["MD5OfMessageBody"] == hashlib.md5(body.encode()).hexdigest()
    assert sent["MD5OfMessageAttributes"] == expected_attributes_md5(ATTRIBUTES)
    before = int(time.time() * 1000)
    [msg] = receive(sqs, queue)
    assert msg["MessageId"] == sent["MessageId"]
    assert msg["Body"] == body
    assert msg["MD5OfBody"] == sent["MD5OfMessageBody"]
    assert msg["MessageAttributes"] == ATTRIBUTES
    assert msg["MD5OfMessageAttributes"] == expected_attributes_md5(ATTRIBUTES)
    attrs = msg["Attributes"]
    assert attrs["ApproximateReceiveCount"] == "1"
    assert abs(int(attrs["SentTimestamp"]) - before) < 60_000
    assert int(attrs["ApproximateFirstReceiveTimestamp"]) >= int(attrs["SentTimestamp"])


def test_message_attribute_md5_known_vector(sqs: Any, queue: str) -> None:
    # Published vector (npm aws-md5-of-message-attributes, "attribName1").
    attrs = {"attribName1": {"DataType": "String", "StringValue": "attribValue 1"}}
    sent = sqs.send_message(QueueUrl=queue, MessageBody="x", MessageAttributes=attrs)
    assert sent["MD5OfMessageAttributes"] == "19e27d4e946b072f3f58da80d94fd778"


def test_send_batch_receive_delete_batch(sqs: Any, queue: str) -> None:
    entries = [
        {"Id": f"e{i}", "MessageBody": f"body-{i}", "MessageAttributes": ATTRIBUTES}
        for i in range(10)
    ]
    result = sqs.send_message_batch(QueueUrl=queue, Entries=entries)
    assert sorted(e["Id"] for e in result["Successful"]) == sorted(e["Id"] for e in entries)
    assert not result.get("Failed")
    for entry in result["Successful"]:
        i = int(entry["Id"][1:])
        assert entry["MD5OfMessageBody"] == hashlib.md5(f"body-{i}".encode()).hexdigest()
        assert entry["MD5OfMessageAttributes"] == expected_attributes_md5(ATTRIBUTES)
    got = {m["MessageId"]: m for m in receive_all(sqs, queue, 10)}
    assert len(got) == 10
    assert {m["Body"] for m in got.values()} == {f"body-{i}" for i in range(10)}
    assert counts(sqs, queue) == (0, 10, 0)
    deleted = sqs.delete_message_batch(
        QueueUrl=queue,
        Entries=[
            {"Id": f"d{i}", "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got.values())
        ],
    )
    assert len(deleted["Successful"]) == 10 and not deleted.get("Failed")
    assert counts(sqs, queue) == (0, 0, 0)


def test_receive_at_most_max_number(sqs: Any, queue: str) -> None:
    for start in range(0, 15, 5):
        sqs.send_message_batch(
            QueueUrl=queue,
            Entries=[{"Id": str(i), "MessageBody": "x"} for i in range(start, start + 5)],
        )
    assert len(receive(sqs, queue, MaxNumberOfMessages=3, VisibilityTimeout=30)) <= 3
    assert len(receive(sqs, queue, VisibilityTimeout=30)) == 1  # the default is one


def test_visibility_timeout_redelivers_with_rising_receive_count(sqs: Any, queue: str) -> None:
    sent = sqs.send_message(QueueUrl=queue, MessageBody="again")
    [first] = receive(sqs, queue)
    assert first["Attributes"]["ApproximateReceiveCount"] == "1"
    assert receive(sqs, queue, wait=0) == []  # invisible for its 1-second timeout
    for count in (2, 3):
        [msg] = wait_for(lambda: receive(sqs, queue), 15, f"redelivery number {count}")
        assert msg["MessageId"] == sent["MessageId"]
        assert msg["Attributes"]["ApproximateReceiveCount"] == str(count)
        assert msg["ReceiptHandle"] != first["ReceiptHandle"]
        assert (
            msg["Attributes"]["ApproximateFirstReceiveTimestamp"]
            == first["Attributes"]["ApproximateFirstReceiveTimestamp"]
        )
    sqs.delete_message(QueueUrl=queue, ReceiptHandle=msg["ReceiptHandle"])
    assert counts(sqs, queue) == (0, 0, 0)


def test_change_message_visibility(sqs: Any, queue: str) -> None:
    sqs.send_message_batch(
        QueueUrl=queue, Entries=[{"Id": str(i), "MessageBody": str(i)} for i in range(3)]
    )
    held = receive_all(sqs, queue, 3)
    assert counts(sqs, queue) == (0, 3, 0)
    sqs.change_message_visibility(
        QueueUrl=queue, ReceiptHandle=held[0]["ReceiptHandle"], VisibilityTimeout=0
    )
    [again] = receive_all(sqs, queue, 1)
    assert again["MessageId"] == held[0]["MessageId"]
    result = sqs.change_message_visibility_batch(
        QueueUrl=queue,
        Entries=[
            {"Id": "a", "ReceiptHandle": held[1]["ReceiptHandle"], "VisibilityTimeout": 0},
            {"Id": "b", "ReceiptHandle": held[2]["ReceiptHandle"], "VisibilityTimeout": 0},
        ],
    )
    assert sorted(e["Id"] for e in result["Successful"]) == ["a", "b"]
    ids = {m["MessageId"] for m in receive_all(sqs, queue, 2)}
    assert ids == {held[1]["MessageId"], held[2]["MessageId"]}


def test_delay_seconds(sqs: Any) -> None:
    url = sqs.create_queue(QueueName=new_name("delay"), Attributes={"DelaySeconds": "1"})[
        "QueueUrl"
    ]
    sqs.send_message(QueueUrl=url, MessageBody="later")
    sqs.send_message(QueueUrl=url, MessageBody="now", DelaySeconds=0)
    assert counts(sqs, url) == (1, 0, 1)
    [now] = receive(sqs, url, wait=0, VisibilityTimeout=30)
    assert now["Body"] == "now"
    [later] = wait_for(lambda: receive(sqs, url, VisibilityTimeout=30), 10, "delayed message")
    assert later["Body"] == "later"


def test_long_polling_wakes_on_send(backend: Backend, sqs: Any, queue: str) -> None:
    result: dict[str, Any] = {}
    waiter = backend.client()

    def long_poll() -> None:
        started = time.monotonic()
        result["messages"] = receive(waiter, queue, wait=20)
        result["elapsed"] = time.monotonic() - started

    thread = threading.Thread(target=long_poll)
    thread.start()
    started = time.monotonic()
    if backend.kind == "ours":
        health = httpx.Client(base_url=backend.url, timeout=5)
        wait_for(
            lambda: health.get("/_sqs/health").json()["waiting_receives"] >= 1,
            10,
            "the receive to be parked",
        )
    else:
        # moto shows no parked receives: the condition is that the call is still outstanding
        # after half a second (it would have returned at once had it not long-polled).
        wait_for(lambda: time.monotonic() - started > 0.5 or not thread.is_alive(), 5, "0.5 s")
        assert thread.is_alive(), "the long poll returned before any message was sent"
    sent_at = time.monotonic()
    sqs.send_message(QueueUrl=queue, MessageBody="wake up")
    thread.join(25)
    assert not thread.is_alive()
    assert [m["Body"] for m in result["messages"]] == ["wake up"]
    assert time.monotonic() - sent_at < 5, "woke long after the send"
    assert result["elapsed"] < 15, "waited for WaitTimeSeconds instead of waking on the send"


def test_long_poll_returns_empty_after_wait_time(sqs: Any, queue: str) -> None:
    started = time.monotonic()
    assert sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=1).get("Messages", []) == []
    assert time.monotonic() - started >= 0.9


def test_dead_letter_queue_after_max_receive_count(backend: Backend, sqs: Any) -> None:
    dlq = sqs.create_queue(QueueName=new_name("dlq"))["QueueUrl"]
    policy = {"deadLetterTargetArn": backend.arn(dlq.rsplit("/", 1)[1]), "maxReceiveCount": 2}
    src = sqs.create_queue(
        QueueName=new_name("src"),
        Attributes={"RedrivePolicy": json.dumps(policy), "VisibilityTimeout": "1"},
    )["QueueUrl"]
    sent = sqs.send_message(QueueUrl=src, MessageBody="poison")
    for count in ("1", "2"):
        [msg] = wait_for(lambda: receive(sqs, src), 15, f"receive {count}")
        assert msg["Attributes"]["ApproximateReceiveCount"] == count
    # Received twice and never deleted: the next receive moves it to the dead-letter queue.
    [dead] = wait_for(
        lambda: receive(sqs, src, VisibilityTimeout=30) or receive(sqs, dlq), 15, "DLQ"
    )
    assert dead["MessageId"] == sent["MessageId"]
    assert dead["Body"] == "poison"
    assert counts(sqs, src) == (0, 0, 0)


def test_redrive_dead_letters_back_with_message_move_task(backend: Backend, sqs: Any) -> None:
    backend.skip_on_moto("StartMessageMoveTask and ListMessageMoveTasks are not implemented")
    dlq = sqs.create_queue(QueueName=new_name("dlq"))["QueueUrl"]
    dlq_arn = backend.arn(dlq.rsplit("/", 1)[1])
    policy = {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 1}
    src = sqs.create_queue(
        QueueName=new_name("src"), Attributes={"RedrivePolicy": json.dumps(policy)}
    )["QueueUrl"]
    sqs.send_message_batch(
        QueueUrl=src, Entries=[{"Id": str(i), "MessageBody": f"m{i}"} for i in range(5)]
    )

    def all_dead() -> bool:
        receive(sqs, src, MaxNumberOfMessages=10, VisibilityTimeout=0)
        return counts(sqs, dlq)[0] == 5

    wait_for(all_dead, 15, "five messages in the DLQ")
    handle = sqs.start_message_move_task(SourceArn=dlq_arn)["TaskHandle"]
    assert handle
    [task] = wait_for(
        lambda: [
            t
            for t in sqs.list_message_move_tasks(SourceArn=dlq_arn)["Results"]
            if t["Status"] == "COMPLETED"
        ],
        15,
        "the move task to complete",
    )
    assert task["ApproximateNumberOfMessagesMoved"] == 5
    assert task["ApproximateNumberOfMessagesToMove"] == 5
    assert task["SourceArn"] == dlq_arn
    assert counts(sqs, dlq) == (0, 0, 0)
    back = receive(sqs, src, MaxNumberOfMessages=10, VisibilityTimeout=30)
    assert {m["Body"] for m in back} <= {f"m{i}" for i in range(5)} and back
    assert {m["Attributes"]["ApproximateReceiveCount"] for m in back} == {"1"}


def test_purge_queue(backend: Backend, sqs: Any, queue: str) -> None:
    sqs.send_message_batch(
        QueueUrl=queue, Entries=[{"Id": str(i), "MessageBody": "x"} for i in range(4)]
    )
    sqs.purge_queue(QueueUrl=queue)
    assert counts(sqs, queue) == (0, 0, 0)
    err = expect_error(
        lambda: sqs.purge_queue(QueueUrl=queue),
        "AWS.SimpleQueueService.PurgeQueueInProgress",
        sqs.exceptions.PurgeQueueInProgress,
    )
    assert status(err) == 403


def test_stale_receipt_handle_delete_succeeds_without_deleting(sqs: Any, queue: str) -> None:
    sqs.send_message(QueueUrl=queue, MessageBody="x")
    [first] = receive(sqs, queue)
    [second] = wait_for(lambda: receive(sqs, queue), 15, "redelivery")
    sqs.delete_message(QueueUrl=queue, ReceiptHandle=second["ReceiptHandle"])
    sqs.delete_message(QueueUrl=queue, ReceiptHandle=first["ReceiptHandle"])  # no error
    assert counts(sqs, queue) == (0, 0, 0)


# -- errors ------------------------------------------------------------------------------------
def test_error_no_such_queue(backend: Backend, sqs: Any) -> None:
    url = sqs.create_queue(QueueName=new_name("gone"))["QueueUrl"]
    sqs.delete_queue(QueueUrl=url)
    for call in (
        lambda: sqs.get_queue_url(QueueName=new_name("never")),
        lambda: sqs.send_message(QueueUrl=url, MessageBody="x"),
        lambda: sqs.receive_message(QueueUrl=url),
        lambda: sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"]),
        lambda: sqs.delete_queue(QueueUrl=url),
    ):
        err = expect_error(
            call, "AWS.SimpleQueueService.NonExistentQueue", sqs.exceptions.QueueDoesNotExist
        )
        assert status(err) == 400
        assert err.response["Error"]["QueryErrorCode"] == "QueueDoesNotExist"


def test_error_invalid_receipt_handle(backend: Backend, sqs: Any, queue: str) -> None:
    for call in (
        lambda: sqs.delete_message(QueueUrl=queue, ReceiptHandle="garbage"),
        lambda: sqs.change_message_visibility(
            QueueUrl=queue, ReceiptHandle="garbage", VisibilityTimeout=5
        ),
    ):
        err = expect_error(call, "ReceiptHandleIsInvalid", sqs.exceptions.ReceiptHandleIsInvalid)
        if backend.kind == "ours":
            assert status(err) == 404  # AWS's service model; moto answers 400
    result = sqs.delete_message_batch(
        QueueUrl=queue, Entries=[{"Id": "bad", "ReceiptHandle": "garbage"}]
    )
    [failed] = result["Failed"]
    assert failed["Id"] == "bad" and failed["Code"] == "ReceiptHandleIsInvalid"
    assert failed["SenderFault"] is True
    result = sqs.change_message_visibility_batch(
        QueueUrl=queue, Entries=[{"Id": "bad", "ReceiptHandle": "garbage", "VisibilityTimeout": 1}]
    )
    assert [f["Code"] for f in result["Failed"]] == ["ReceiptHandleIsInvalid"]


@pytest.mark.parametrize("operation", ["send", "delete", "visibility"])
def test_error_batch_shape(backend: Backend, sqs: Any, queue: str, operation: str) -> None:
    if operation == "delete":
        backend.skip_on_moto("DeleteMessageBatch checks repeated receipt handles, not entry ids")
    if operation == "visibility":
        backend.skip_on_moto("ChangeMessageVisibilityBatch does not validate the batch at all")

    def call(entries: list[dict[str, Any]]) -> Callable[[], Any]:
        if operation == "send":
            full = [{**e, "MessageBody": "x"} for e in entries]
            return lambda: sqs.send_message_batch(QueueUrl=queue, Entries=full)
        if operation == "delete":
            full = [{**e, "ReceiptHandle": f"h{i}"} for i, e in enumerate(entries)]
            return lambda: sqs.delete_message_batch(QueueUrl=queue, Entries=full)
        full = [
            {**e, "ReceiptHandle": f"h{i}", "VisibilityTimeout": 1} for i, e in enumerate(entries)
        ]
        return lambda: sqs.change_message_visibility_batch(QueueUrl=queue, Entries=full)

    expect_error(
        call([{"Id": "a"}, {"Id": "a"}]),
        "AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
        sqs.exceptions.BatchEntryIdsNotDistinct,
    )
    expect_error(
        call([{"Id": str(i)} for i in range(11)]),
        "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
        sqs.exceptions.TooManyEntriesInBatchRequest,
    )
    expect_error(
        call([]), "AWS.SimpleQueueService.EmptyBatchRequest", sqs.exceptions.EmptyBatchRequest
    )
    expect_error(
        call([{"Id": "not valid!"}]),
        "AWS.SimpleQueueService.InvalidBatchEntryId",
        sqs.exceptions.InvalidBatchEntryId,
    )


def test_error_body_over_maximum_message_size(sqs: Any) -> None:
    url = sqs.create_queue(QueueName=new_name("small"), Attributes={"MaximumMessageSize": "1024"})[
        "QueueUrl"
    ]
    sqs.send_message(QueueUrl=url, MessageBody="x" * 1024)
    err = expect_error(
        lambda: sqs.send_message(QueueUrl=url, MessageBody="x" * 1025), "InvalidParameterValue"
    )
    assert "Message must be shorter than 1024 bytes" in err.response["Error"]["Message"]
    assert status(err) == 400


def test_error_batch_entry_over_maximum_message_size(backend: Backend, sqs: Any) -> None:
    backend.skip_on_moto(
        "fails the whole SendMessageBatch; SQS fails only the oversized entry (localstack#8570)"
    )
    url = sqs.create_queue(QueueName=new_name("small"), Attributes={"MaximumMessageSize": "1024"})[
        "QueueUrl"
    ]
    result = sqs.send_message_batch(
        QueueUrl=url,
        Entries=[{"Id": "big", "MessageBody": "x" * 1025}, {"Id": "ok", "MessageBody": "fine"}],
    )
    assert [e["Id"] for e in result["Successful"]] == ["ok"]
    [failed] = result["Failed"]
    assert failed["Id"] == "big" and failed["Code"] == "InvalidParameterValue"
    assert failed["SenderFault"] is True


def test_error_bad_attribute_names(backend: Backend, sqs: Any, queue: str) -> None:
    err = expect_error(
        lambda: sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["NoSuchAttribute"]),
        "InvalidAttributeName",
        sqs.exceptions.InvalidAttributeName,
    )
    assert status(err) == 400


def test_error_bad_attributes_on_create_and_set(backend: Backend, sqs: Any, queue: str) -> None:
    backend.skip_on_moto("CreateQueue and SetQueueAttributes accept unknown names and bad values")
    expect_error(
        lambda: sqs.set_queue_attributes(QueueUrl=queue, Attributes={"NoSuch": "1"}),
        "InvalidAttributeName",
        sqs.exceptions.InvalidAttributeName,
    )
    expect_error(
        lambda: sqs.create_queue(QueueName=new_name(), Attributes={"VisibilityTimeout": "43201"}),
        "InvalidAttributeValue",
        sqs.exceptions.InvalidAttributeValue,
    )
    expect_error(
        lambda: sqs.set_queue_attributes(QueueUrl=queue, Attributes={"MaximumMessageSize": "10"}),
        "InvalidAttributeValue",
        sqs.exceptions.InvalidAttributeValue,
    )


def test_error_queue_name_exists(sqs: Any) -> None:
    name = new_name("exists")
    sqs.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "5"})
    expect_error(
        lambda: sqs.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "6"}),
        "QueueAlreadyExists",
        sqs.exceptions.QueueNameExists,
    )


def test_error_bad_queue_name(sqs: Any) -> None:
    expect_error(lambda: sqs.create_queue(QueueName="bad name!"), "InvalidParameterValue")


def test_error_receive_parameters(sqs: Any, queue: str) -> None:
    expect_error(
        lambda: sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=11), "InvalidParameterValue"
    )
    expect_error(
        lambda: sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=21), "InvalidParameterValue"
    )


def test_error_queue_deleted_recently(backend: Backend, sqs: Any) -> None:
    backend.skip_on_moto("does not enforce the 60-second wait after DeleteQueue")
    name = new_name("recent")
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    sqs.delete_queue(QueueUrl=url)
    expect_error(
        lambda: sqs.create_queue(QueueName=name),
        "AWS.SimpleQueueService.QueueDeletedRecently",
        sqs.exceptions.QueueDeletedRecently,
    )


def test_error_change_visibility_of_message_not_in_flight(
    backend: Backend, sqs: Any, queue: str
) -> None:
    sqs.send_message(QueueUrl=queue, MessageBody="x")
    [msg] = receive(sqs, queue, VisibilityTimeout=60)
    sqs.delete_message(QueueUrl=queue, ReceiptHandle=msg["ReceiptHandle"])
    backend.skip_on_moto(
        "answers ReceiptHandleIsInvalid; SQS answers InvalidParameterValue (the handle is well "
        "formed, the message is gone)"
    )
    err = expect_error(
        lambda: sqs.change_message_visibility(
            QueueUrl=queue, ReceiptHandle=msg["ReceiptHandle"], VisibilityTimeout=5
        ),
        "InvalidParameterValue",
    )
    assert "not available for visibility timeout change" in err.response["Error"]["Message"]


def test_error_change_visibility_of_visible_message(backend: Backend, sqs: Any, queue: str) -> None:
    sqs.send_message(QueueUrl=queue, MessageBody="x")
    [msg] = receive(sqs, queue, VisibilityTimeout=60)
    sqs.change_message_visibility(
        QueueUrl=queue, ReceiptHandle=msg["ReceiptHandle"], VisibilityTimeout=0
    )
    backend.skip_on_moto("changes the visibility of a message that is not in flight")
    expect_error(
        lambda: sqs.change_message_visibility(
            QueueUrl=queue, ReceiptHandle=msg["ReceiptHandle"], VisibilityTimeout=5
        ),
        "AWS.SimpleQueueService.MessageNotInflight",
        sqs.exceptions.MessageNotInflight,
    )


def test_server_process_lifecycle() -> None:
    """Prints where it listens, exits 2 when the port is taken, 0 on SIGTERM."""
    with start_ours() as first:
        taken = subprocess.run(
            [sys.executable, "-m", "emulators.sqs", "--port", str(first.port)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert taken.returncode == 2
        assert f"port {first.port} on 127.0.0.1 is already in use" in taken.stderr
        first.proc.send_signal(signal.SIGTERM)
        assert first.proc.wait(15) == 0
        assert f"sqs endpoint listening on {first.url}" in first.log_tail()


def test_queue_url_of_another_host_form(backend: Backend, sqs: Any, queue: str) -> None:
    name = queue.rsplit("/", 1)[1]
    aws_form = f"https://sqs.us-east-1.amazonaws.com/{ACCOUNT[backend.kind]}/{name}"
    sent = sqs.send_message(QueueUrl=aws_form, MessageBody="routed by name")
    [msg] = receive(sqs, queue)
    assert msg["MessageId"] == sent["MessageId"]


# -- FIFO queues, permissions, regions ----------------------------------------------------------
def fifo_queue(sqs: Any, **attributes: str) -> str:
    return sqs.create_queue(
        QueueName=new_name("f") + ".fifo",
        Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true", **attributes},
    )["QueueUrl"]


def test_fifo_group_order_and_lock(sqs: Any) -> None:
    url = fifo_queue(sqs, VisibilityTimeout="60")
    sent = [
        sqs.send_message(QueueUrl=url, MessageBody=body, MessageGroupId=group)
        for body, group in (("a1", "a"), ("a2", "a"), ("b1", "b"))
    ]
    assert len(sent) == 3
    first = receive(sqs, url, wait=0, MaxNumberOfMessages=1)
    assert [m["Body"] for m in first] == ["a1"]
    assert first[0]["Attributes"]["MessageGroupId"] == "a"
    # Group "a" is locked while "a1" is in flight: the next consumer gets "b1" only.
    assert [m["Body"] for m in receive(sqs, url, wait=0, MaxNumberOfMessages=10)] == ["b1"]
    sqs.delete_message(QueueUrl=url, ReceiptHandle=first[0]["ReceiptHandle"])
    assert [m["Body"] for m in receive(sqs, url, wait=0, MaxNumberOfMessages=10)] == ["a2"]


def test_fifo_sequence_numbers(backend: Backend, sqs: Any) -> None:
    backend.skip_on_moto("SendMessage answers no SequenceNumber for a FIFO queue")
    url = fifo_queue(sqs)
    sent = [
        sqs.send_message(QueueUrl=url, MessageBody=f"m{i}", MessageGroupId="g")["SequenceNumber"]
        for i in range(3)
    ]
    assert all(len(n) == 20 for n in sent)
    assert [int(n) for n in sent] == sorted({int(n) for n in sent})
    got = receive(sqs, url, wait=0, MaxNumberOfMessages=10)
    assert [m["Attributes"]["SequenceNumber"] for m in got] == sent


def test_fifo_deduplication(sqs: Any) -> None:
    url = fifo_queue(sqs)
    for _ in range(3):  # content-based: one message
        sqs.send_message(QueueUrl=url, MessageBody="same", MessageGroupId="g")
    for _ in range(2):  # an explicit id: one more
        sqs.send_message(
            QueueUrl=url, MessageBody="other", MessageGroupId="g", MessageDeduplicationId="x"
        )
    assert counts(sqs, url) == (2, 0, 0)
    got = receive(sqs, url, wait=0, MaxNumberOfMessages=10)
    assert [m["Body"] for m in got] == ["same", "other"]
    assert got[1]["Attributes"]["MessageDeduplicationId"] == "x"


def test_fifo_misuse_errors(sqs: Any) -> None:
    url = sqs.create_queue(QueueName=new_name("f") + ".fifo", Attributes={"FifoQueue": "true"})[
        "QueueUrl"
    ]
    err = expect_error(
        lambda: sqs.send_message(QueueUrl=url, MessageBody="x", MessageDeduplicationId="d"),
        "MissingParameter",
    )
    assert err.response["Error"]["Message"] == (
        "The request must contain the parameter MessageGroupId."
    )
    err = expect_error(
        lambda: sqs.send_message(QueueUrl=url, MessageBody="x", MessageGroupId="g"),
        "InvalidParameterValue",
    )
    assert "ContentBasedDeduplication" in err.response["Error"]["Message"]
    expect_error(
        lambda: sqs.create_queue(QueueName=new_name(), Attributes={"FifoQueue": "true"}),
        "InvalidParameterValue",
    )


def test_add_and_remove_permission(backend: Backend, sqs: Any, queue: str) -> None:
    name = queue.rsplit("/", 1)[-1]
    sqs.add_permission(
        QueueUrl=queue, Label="send", AWSAccountIds=["111111111111"], Actions=["SendMessage"]
    )
    policy = json.loads(
        sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["Policy"])["Attributes"]["Policy"]
    )
    assert policy["Id"] == f"{backend.arn(name)}/SQSDefaultPolicy"
    assert policy["Statement"] == [
        {
            "Sid": "send",
            "Effect": "Allow",
            "Principal": {"AWS": "arn:aws:iam::111111111111:root"},
            "Action": "SQS:SendMessage",
            "Resource": backend.arn(name),
        }
    ]
    sqs.remove_permission(QueueUrl=queue, Label="send")
    expect_error(
        lambda: sqs.remove_permission(QueueUrl=queue, Label="send"), "InvalidParameterValue"
    )


def test_message_attribute_prefix_wildcard(sqs: Any, queue: str) -> None:
    attrs = {n: {"DataType": "String", "StringValue": "v"} for n in ("Custom1", "Custom2", "Other")}
    sqs.send_message(QueueUrl=queue, MessageBody="x", MessageAttributes=attrs)
    [msg] = sqs.receive_message(QueueUrl=queue, MessageAttributeNames=["Custom.*"])["Messages"]
    assert set(msg["MessageAttributes"]) == {"Custom1", "Custom2"}


def test_queues_are_scoped_by_region(backend: Backend) -> None:
    west1 = backend.client(region_name="us-west-1")
    west2 = backend.client(region_name="us-west-2")
    name = new_name("r")
    url = west2.create_queue(QueueName=name)["QueueUrl"]
    assert url not in west1.list_queues(QueueNamePrefix=name).get("QueueUrls", [])
    expect_error(
        lambda: west1.get_queue_url(QueueName=name), "AWS.SimpleQueueService.NonExistentQueue"
    )
    arn = west2.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]
    assert arn["QueueArn"].split(":")[3] == "us-west-2"
