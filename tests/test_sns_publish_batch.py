"""PublishBatch through an unmodified boto3 client against the real SNS and SQS endpoint
processes: what a batch delivers (standard and FIFO topics), AWS's batch errors, and a throttle
fault that fails some entries of a batch (``Failed``, not the sender's fault), which is what a
batch publisher has to handle."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sns_topic_helpers import attrs, client, drain, error_of, messages, queue, topic

from emulators.sns.faults import SnsControl
from harness.stack.supervisor import Stack

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with Stack(tmp_path_factory.mktemp("sns-batch"), parts=["sqs", "sns"]) as up:
        yield up


@pytest.fixture(scope="module")
def sns(stack: Stack) -> Any:
    return client(stack.info.url("sns"))


@pytest.fixture(scope="module")
def sqs(stack: Stack) -> Any:
    return client(stack.info.url("sqs"), "sqs")


@pytest.fixture
def control(stack: Stack) -> Iterator[SnsControl]:
    with SnsControl(stack.info.url("sns")) as ctl:
        yield ctl
        ctl.stop_all()


def subscribed_queue(sns: Any, sqs: Any, arn: str, **attributes: str) -> str:
    url, queue_arn = queue(sqs, fifo=arn.endswith(".fifo"))
    sns.subscribe(TopicArn=arn, Protocol="sqs", Endpoint=queue_arn, Attributes=attributes)
    return url


def test_a_batch_delivers_each_entry_as_publish_would(sns: Any, sqs: Any) -> None:
    arn = topic(sns)
    url = subscribed_queue(sns, sqs, arn)
    filtered = subscribed_queue(sns, sqs, arn, FilterPolicy=json.dumps({"kind": ["b"]}))
    answer = sns.publish_batch(
        TopicArn=arn,
        PublishBatchRequestEntries=[
            {"Id": "a", "Message": "first", "Subject": "s-a", "MessageAttributes": attrs(kind="a")},
            {"Id": "b-2", "Message": "second", "MessageAttributes": attrs(kind="b")},
            {
                "Id": "c_3",
                "Message": json.dumps({"default": "third", "sqs": "third for sqs"}),
                "MessageStructure": "json",
            },
        ],
    )
    assert [s["Id"] for s in answer["Successful"]] == ["a", "b-2", "c_3"]
    assert answer.get("Failed", []) == []
    got = {json.loads(m["Body"])["MessageId"]: json.loads(m["Body"]) for m in drain(sqs, url)}
    assert {s["MessageId"] for s in answer["Successful"]} == set(got)
    by_text = {body["Message"]: body for body in got.values()}
    assert set(by_text) == {"first", "second", "third for sqs"}
    assert by_text["first"]["Subject"] == "s-a"
    assert by_text["second"]["MessageAttributes"] == {"kind": {"Type": "String", "Value": "b"}}
    assert messages(sqs, filtered) == ["second"]


def test_a_fifo_batch_keeps_its_order_and_deduplicates(sns: Any, sqs: Any) -> None:
    arn = topic(sns, fifo=True)
    url = subscribed_queue(sns, sqs, arn, RawMessageDelivery="true")
    entries = [
        {"Id": f"e{i}", "Message": text, "MessageGroupId": "g", "MessageDeduplicationId": dedup}
        for i, (text, dedup) in enumerate([("one", "d1"), ("two", "d2"), ("one again", "d1")])
    ]
    answer = sns.publish_batch(TopicArn=arn, PublishBatchRequestEntries=entries)
    ok = {s["Id"]: s for s in answer["Successful"]}
    assert list(ok) == ["e0", "e1", "e2"]
    assert int(ok["e1"]["SequenceNumber"]) > int(ok["e0"]["SequenceNumber"])
    assert ok["e2"]["MessageId"] == ok["e0"]["MessageId"]  # deduplicated within the batch
    assert [m["Body"] for m in drain(sqs, url)] == ["one", "two"]
    without_group = [{"Id": "x", "Message": "m", "MessageDeduplicationId": "d9"}]
    assert (
        error_of(lambda: sns.publish_batch(TopicArn=arn, PublishBatchRequestEntries=without_group))[
            2
        ]
        == "Invalid parameter: The MessageGroupId parameter is required for FIFO topics"
    )


def test_the_batch_errors_of_aws(stack: Stack, sns: Any, sqs: Any) -> None:
    arn = topic(sns)
    url = subscribed_queue(sns, sqs, arn)

    def batch(entries: list[dict]) -> tuple[str, int, str]:
        return error_of(lambda: sns.publish_batch(TopicArn=arn, PublishBatchRequestEntries=entries))

    assert batch([{"Id": str(i), "Message": "m"} for i in range(11)]) == (
        "TooManyEntriesInBatchRequest",
        400,
        "The batch request contains more entries than permissible.",
    )
    assert batch([{"Id": "same", "Message": "m"}] * 2)[:2] == ("BatchEntryIdsNotDistinct", 400)
    assert batch([{"Id": "some id", "Message": "m"}]) == (
        "InvalidBatchEntryId",
        400,
        "The Id of a batch entry in the batch request contains an impermissible character: some id",
    )
    big = "x" * 100_000
    assert batch([{"Id": str(i), "Message": big} for i in range(3)]) == (
        "BatchRequestTooLong",
        400,
        "The length of all the messages put together is more than the limit.",
    )
    # one malformed entry fails the whole request, as on AWS: nothing is delivered
    assert batch(
        [
            {"Id": "good", "Message": "fine"},
            {"Id": "bad", "Message": "m", "MessageAttributes": {"a": {"DataType": "String"}}},
        ]
    )[:2] == ("ParameterValueInvalid", 400)
    assert drain(sqs, url) == []
    gone = arn + "-gone"
    assert error_of(
        lambda: sns.publish_batch(
            TopicArn=gone, PublishBatchRequestEntries=[{"Id": "a", "Message": "m"}]
        )
    ) == ("NotFound", 404, "Topic does not exist")
    empty = httpx.post(stack.info.url("sns"), data={"Action": "PublishBatch", "TopicArn": arn})
    assert empty.status_code == 400 and "<Code>EmptyBatchRequest</Code>" in empty.text


def test_a_throttled_entry_is_failed_and_not_delivered(
    sns: Any, sqs: Any, control: SnsControl
) -> None:
    arn = topic(sns)
    url = subscribed_queue(sns, sqs, arn)
    control.throttle(p=0.5, targets=[arn], seed=7)
    entries = [{"Id": f"e{i}", "Message": f"m{i}"} for i in range(10)]
    answer = sns.publish_batch(TopicArn=arn, PublishBatchRequestEntries=entries)
    failed = answer.get("Failed", [])
    assert failed and answer["Successful"], "p=0.5 over ten entries fails some, not all"
    assert all(
        (f["Code"], f["Message"], f["SenderFault"]) == ("Throttling", "Rate exceeded", False)
        for f in failed
    )
    delivered = sorted(messages(sqs, url))
    assert delivered == sorted(f"m{s['Id'][1:]}" for s in answer["Successful"])
    assert {f["Id"] for f in failed}.isdisjoint(s["Id"] for s in answer["Successful"])
