"""Unit tests of the SQS model's FIFO queues, permissions, tags and regions: an injected clock
and RNG, no I/O, no sleeps."""

from __future__ import annotations

import hashlib
import json
import random
from typing import Any

import pytest

from emulators.sqs import model as sqs_model
from emulators.sqs.model import SendEntry, SqsError, SqsModel


class FakeClock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def sqs(clock: FakeClock) -> SqsModel:
    return SqsModel(clock=clock, rng=random.Random(11))


FIFO = {"FifoQueue": "true"}
CBD = {"FifoQueue": "true", "ContentBasedDeduplication": "true"}


def send(sqs: SqsModel, queue: str, body: str, group: str = "g", **kw: Any) -> Any:
    return sqs.send_message(queue, SendEntry("", body, group_id=group, **kw))


def bodies(received: list[Any]) -> list[str]:
    return [r.message.body for r in received]


def error(call: Any) -> SqsError:
    with pytest.raises(SqsError) as err:
        call()
    return err.value


# -- creating FIFO queues ---------------------------------------------------------------------
def test_fifo_queue_attributes_and_defaults(sqs: SqsModel) -> None:
    sqs.create_queue("q.fifo", FIFO)
    attrs = sqs.queue_attributes("q.fifo", ["All"])
    assert attrs["FifoQueue"] == "true"
    assert attrs["ContentBasedDeduplication"] == "false"
    assert attrs["DeduplicationScope"] == "queue"
    assert attrs["FifoThroughputLimit"] == "perQueue"
    sqs.create_queue("std")
    assert "FifoQueue" not in sqs.queue_attributes("std", ["All"])


def test_fifo_name_and_attribute_must_agree(sqs: SqsModel) -> None:
    assert error(lambda: sqs.create_queue("plain", FIFO)).code == "InvalidParameterValue"
    assert error(lambda: sqs.create_queue("q.fifo")).code == "InvalidParameterValue"
    assert error(lambda: sqs.create_queue("q.fifo", {"FifoQueue": "tru"})).shape == (
        "InvalidAttributeValue"
    )
    sqs.create_queue("std")
    # FIFO-only attributes on a standard queue, and FifoQueue after creation, are unknown.
    for attrs in ({"ContentBasedDeduplication": "true"}, {"FifoQueue": "true"}):
        assert error(lambda a=attrs: sqs.set_queue_attributes("std", a)).shape == (
            "InvalidAttributeName"
        )


def test_high_throughput_attributes(sqs: SqsModel) -> None:
    sqs.create_queue(
        "ht.fifo",
        {
            "FifoQueue": "true",
            "DeduplicationScope": "messageGroup",
            "FifoThroughputLimit": "perMessageGroupId",
        },
    )
    attrs = sqs.queue_attributes("ht.fifo", ["DeduplicationScope", "FifoThroughputLimit"])
    assert attrs == {
        "DeduplicationScope": "messageGroup",
        "FifoThroughputLimit": "perMessageGroupId",
    }
    # perMessageGroupId needs messageGroup deduplication; a refused change changes nothing.
    err = error(lambda: sqs.set_queue_attributes("ht.fifo", {"DeduplicationScope": "queue"}))
    assert err.shape == "InvalidAttributeValue"
    assert sqs.queue_attributes("ht.fifo", ["DeduplicationScope"]) == {
        "DeduplicationScope": "messageGroup"
    }
    bad = {"FifoQueue": "true", "DeduplicationScope": "everywhere"}
    assert error(lambda: sqs.create_queue("bad.fifo", bad)).shape == "InvalidAttributeValue"


def test_dead_letter_queue_must_be_the_same_type(sqs: SqsModel) -> None:
    sqs.create_queue("dlq.fifo", FIFO)
    sqs.create_queue("std-dlq")
    fifo_dlq = sqs.arn("dlq.fifo")
    std_dlq = sqs.arn("std-dlq")

    def policy(arn: str) -> dict[str, str]:
        return {"RedrivePolicy": json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": 2})}

    sqs.create_queue("src.fifo", {**FIFO, **policy(fifo_dlq)})
    assert error(lambda: sqs.create_queue("bad.fifo", {**FIFO, **policy(std_dlq)})).code == (
        "InvalidParameterValue"
    )
    assert error(lambda: sqs.create_queue("bad", policy(fifo_dlq))).code == "InvalidParameterValue"


# -- sending ----------------------------------------------------------------------------------
def test_send_errors_are_aws_errors(sqs: SqsModel) -> None:
    sqs.create_queue("q.fifo", FIFO)
    missing_group = error(lambda: sqs.send_message("q.fifo", SendEntry("", "b")))
    assert (missing_group.code, missing_group.message) == (
        "MissingParameter",
        "The request must contain the parameter MessageGroupId.",
    )
    missing_dedup = error(lambda: send(sqs, "q.fifo", "b"))
    assert missing_dedup.message == (
        "The queue should either have ContentBasedDeduplication enabled or "
        "MessageDeduplicationId provided explicitly"
    )
    delayed = error(lambda: send(sqs, "q.fifo", "b", deduplication_id="d", delay_seconds=5))
    assert delayed.message == (
        "Value 5 for parameter DelaySeconds is invalid. Reason: The request include parameter "
        "that is not valid for this queue type."
    )
    send(sqs, "q.fifo", "b", deduplication_id="d", delay_seconds=0)  # 0 is no delay: accepted
    assert error(
        lambda: send(sqs, "q.fifo", "b", group="has space", deduplication_id="x")
    ).code == ("InvalidParameterValue")
    # A whole batch fails when one entry lacks its group, as SQS answers.
    entries = [SendEntry("a", "x", group_id="g", deduplication_id="1"), SendEntry("b", "y")]
    assert error(lambda: sqs.send_message_batch("q.fifo", entries)).code == "MissingParameter"
    # A standard queue takes a group id (fair queues) but no deduplication id.
    sqs.create_queue("std")
    send(sqs, "std", "fair", group="tenant-1")
    assert error(lambda: send(sqs, "std", "b", deduplication_id="d")).code == (
        "InvalidParameterValue"
    )


def test_deduplication_within_five_minutes(sqs: SqsModel, clock: FakeClock) -> None:
    sqs.create_queue("q.fifo", FIFO)
    first = send(sqs, "q.fifo", "one", deduplication_id="d1")
    again = send(sqs, "q.fifo", "other body", group="h", deduplication_id="d1")
    # Accepted, not enqueued: the first message's id and sequence number.
    assert (again.id, again.sequence_number) == (first.id, first.sequence_number)
    assert sqs.queue_attributes("q.fifo", ["ApproximateNumberOfMessages"]) == {
        "ApproximateNumberOfMessages": "1"
    }
    # Still remembered after the message is received and deleted ...
    [got] = sqs.receive_message("q.fifo")
    sqs.delete_message("q.fifo", got.receipt_handle)
    clock.advance(299)
    assert send(sqs, "q.fifo", "one", deduplication_id="d1").id == first.id
    assert sqs.receive_message("q.fifo") == []
    # ... and forgotten 5 minutes after the first send.
    clock.advance(1)
    third = send(sqs, "q.fifo", "one", deduplication_id="d1")
    assert third.id != first.id
    assert int(third.sequence_number) > int(first.sequence_number)
    assert bodies(sqs.receive_message("q.fifo")) == ["one"]


def test_content_based_deduplication_is_sha256_of_the_body(sqs: SqsModel) -> None:
    sqs.create_queue("q.fifo", CBD)
    first = send(sqs, "q.fifo", "first")
    assert first.deduplication_id == hashlib.sha256(b"first").hexdigest()
    assert send(sqs, "q.fifo", "first", group="other").id == first.id
    # An explicit id equal to the body's hash is the same deduplication id.
    same = send(sqs, "q.fifo", "second", deduplication_id=first.deduplication_id)
    assert same.id == first.id
    assert send(sqs, "q.fifo", "second").id != first.id


def test_deduplication_scope_message_group(sqs: SqsModel) -> None:
    sqs.create_queue("q.fifo", {**FIFO, "DeduplicationScope": "messageGroup"})
    a = send(sqs, "q.fifo", "x", group="a", deduplication_id="d")
    b = send(sqs, "q.fifo", "x", group="b", deduplication_id="d")
    assert a.id != b.id  # one id in two groups: two messages
    assert send(sqs, "q.fifo", "x", group="a", deduplication_id="d").id == a.id


def test_sequence_numbers_grow_and_are_20_digits(sqs: SqsModel, clock: FakeClock) -> None:
    sqs.create_queue("q.fifo", CBD)
    numbers = []
    for i in range(5):
        numbers.append(send(sqs, "q.fifo", f"m{i}").sequence_number)
        if i == 2:
            clock.now -= 10  # even a clock going back does not make them shrink
    assert all(len(n) == 20 and n.isdigit() for n in numbers)
    assert [int(n) for n in numbers] == sorted({int(n) for n in numbers})


# -- receiving --------------------------------------------------------------------------------
def test_a_group_hands_out_nothing_while_a_message_of_it_is_in_flight(
    sqs: SqsModel, clock: FakeClock
) -> None:
    sqs.create_queue("q.fifo", {**CBD, "VisibilityTimeout": "30"})
    for body in ("g1", "g2", "g3"):
        send(sqs, "q.fifo", body, group="g")
    send(sqs, "q.fifo", "h1", group="h")
    # As many of one group as possible, in order.
    assert bodies(sqs.receive_message("q.fifo", 2)) == ["g1", "g2"]
    # The group is locked: another consumer gets the other group only.
    other = sqs.receive_message("q.fifo", 10)
    assert bodies(other) == ["h1"]
    sqs.delete_message("q.fifo", other[0].receipt_handle)
    assert sqs.receive_message("q.fifo", 10) == []
    # The in-flight messages time out: the group starts again from its first message.
    clock.advance(30)
    again = sqs.receive_message("q.fifo", 10)
    assert bodies(again) == ["g1", "g2", "g3"]
    assert [r.message.receive_count for r in again] == [2, 2, 1]
    for r in again[:2]:
        sqs.delete_message("q.fifo", r.receipt_handle)
    sqs.change_message_visibility("q.fifo", again[2].receipt_handle, 0)
    assert bodies(sqs.receive_message("q.fifo")) == ["g3"]


def test_deleting_the_first_message_unlocks_the_next(sqs: SqsModel) -> None:
    sqs.create_queue("q.fifo", CBD)
    send(sqs, "q.fifo", "one")
    send(sqs, "q.fifo", "two")
    [first] = sqs.receive_message("q.fifo")
    assert sqs.receive_message("q.fifo") == []
    sqs.delete_message("q.fifo", first.receipt_handle)
    assert bodies(sqs.receive_message("q.fifo")) == ["two"]


def test_groups_are_served_in_turn(sqs: SqsModel) -> None:
    sqs.create_queue("q.fifo", CBD)
    for i in range(3):
        for g in ("a", "b", "c"):
            send(sqs, "q.fifo", f"{g}{i}", group=g)
    got = sqs.receive_message("q.fifo", 10)
    assert bodies(got) == ["a0", "a1", "a2", "b0", "b1", "b2", "c0", "c1", "c2"]


def test_system_attributes_of_a_fifo_message(sqs: SqsModel) -> None:
    sqs.create_queue("q.fifo", FIFO)
    sent = send(sqs, "q.fifo", "b", group="g1", deduplication_id="d1")
    [got] = sqs.receive_message("q.fifo")
    values = got.message.system_attribute_values(["All"])
    assert values["MessageGroupId"] == "g1"
    assert values["MessageDeduplicationId"] == "d1"
    assert values["SequenceNumber"] == sent.sequence_number
    assert got.message.system_attribute_values(["SequenceNumber"]) == {
        "SequenceNumber": sent.sequence_number
    }


def test_dead_letter_queue_of_a_fifo_queue_keeps_the_group(sqs: SqsModel, clock: FakeClock) -> None:
    sqs.create_queue("dlq.fifo", CBD)
    policy = json.dumps({"deadLetterTargetArn": sqs.arn("dlq.fifo"), "maxReceiveCount": 1})
    sqs.create_queue("q.fifo", {**CBD, "RedrivePolicy": policy, "VisibilityTimeout": "1"})
    send(sqs, "q.fifo", "first", group="1")
    send(sqs, "q.fifo", "after", group="1")
    assert bodies(sqs.receive_message("q.fifo")) == ["first"]
    clock.advance(1)
    # "first" was received maxReceiveCount times: it moves to the DLQ and "after" comes next.
    assert bodies(sqs.receive_message("q.fifo")) == ["after"]
    [dead] = sqs.receive_message("dlq.fifo")
    assert (dead.message.body, dead.message.group_id) == ("first", "1")
    assert dead.message.dlq_source_arn == sqs.arn("q.fifo")


def test_receive_request_attempt_id_replays_the_same_receive(
    sqs: SqsModel, clock: FakeClock
) -> None:
    sqs.create_queue("q.fifo", {**CBD, "VisibilityTimeout": "30"})
    for body in ("a", "b"):
        send(sqs, "q.fifo", body)
    first = sqs.receive_message("q.fifo", 10, attempt_id="attempt-1")
    clock.advance(20)
    retry = sqs.receive_message("q.fifo", 10, attempt_id="attempt-1")
    assert [r.receipt_handle for r in retry] == [r.receipt_handle for r in first]
    clock.advance(20)  # 40 s after the first receive, 20 after the retry: still in flight
    assert sqs.queue_attributes("q.fifo", ["ApproximateNumberOfMessagesNotVisible"]) == {
        "ApproximateNumberOfMessagesNotVisible": "2"
    }
    # Once a message of it is deleted the attempt cannot be replayed: a fresh receive.
    sqs.delete_message("q.fifo", first[0].receipt_handle)
    assert sqs.receive_message("q.fifo", 10, attempt_id="attempt-1") == []
    bad = error(lambda: sqs.receive_message("q.fifo", attempt_id="not valid"))
    assert bad.code == "InvalidParameterValue"


def test_fifo_in_flight_limit_hands_out_nothing(
    sqs: SqsModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqs_model, "FIFO_MAX_INFLIGHT", 3)
    sqs.create_queue("q.fifo", CBD)
    for i in range(5):
        send(sqs, "q.fifo", f"m{i}", group=f"g{i}")
    assert len(sqs.receive_message("q.fifo", 10)) == 3
    assert sqs.receive_message("q.fifo", 10) == []  # no error, as the API reference says


def test_fifo_receive_work_does_not_grow_with_depth(clock: FakeClock) -> None:
    """Structure operations of the same receive/delete cycle at depth 400 and 20,000 (in one
    group and spread over many groups) are the same."""

    def work(depth: int, groups: int) -> list[int]:
        sqs = SqsModel(clock=clock, rng=random.Random(5), fifo_throughput_limits=False)
        sqs.create_queue("q.fifo", CBD)
        for i in range(depth):
            sqs.send_message("q.fifo", SendEntry("", f"m{i}", group_id=f"g{i % groups}"))
        queue = sqs.queues["q.fifo"]
        out = []
        for _ in range(20):
            before = queue.ops
            got = sqs.receive_message("q.fifo", 10)
            for r in got:
                sqs.delete_message("q.fifo", r.receipt_handle)
            out.append(queue.ops - before)
        return out

    for groups in (1, 7):
        assert work(20_000, groups) == work(400, groups)


# -- permissions, tags, policy, regions -------------------------------------------------------
def test_add_and_remove_permission_build_the_policy_as_aws(sqs: SqsModel) -> None:
    sqs.create_queue("q")
    arn = sqs.arn("q")
    sqs.add_permission("q", "one", ["111111111111"], ["*"])
    sqs.add_permission("q", "two", ["222222222222", "333333333333"], ["SendMessage", "PurgeQueue"])
    policy = json.loads(sqs.queue_attributes("q", ["Policy"])["Policy"])
    assert policy == {
        "Version": "2012-10-17",
        "Id": f"{arn}/SQSDefaultPolicy",
        "Statement": [
            {
                "Sid": "one",
                "Effect": "Allow",
                "Principal": {"AWS": "arn:aws:iam::111111111111:root"},
                "Action": "SQS:*",
                "Resource": arn,
            },
            {
                "Sid": "two",
                "Effect": "Allow",
                "Principal": {
                    "AWS": ["arn:aws:iam::222222222222:root", "arn:aws:iam::333333333333:root"]
                },
                "Action": ["SQS:SendMessage", "SQS:PurgeQueue"],
                "Resource": arn,
            },
        ],
    }
    assert error(lambda: sqs.add_permission("q", "one", ["111111111111"], ["*"])).message == (
        "Value one for parameter Label is invalid. Reason: Already exists."
    )
    owner = error(lambda: sqs.add_permission("q", "x", ["111111111111"], ["RemovePermission"]))
    assert "Only the queue owner" in owner.message
    too_many = error(lambda: sqs.add_permission("q", "x", ["111111111111"], ["SendMessage"] * 8))
    assert (too_many.code, too_many.status) == ("OverLimit", 403)
    assert error(lambda: sqs.add_permission("q", "x", [], ["SendMessage"])).message == (
        "Value [] for parameter PrincipalId is invalid. Reason: Unable to verify."
    )
    assert error(lambda: sqs.add_permission("q", "x", ["111111111111"], [])).code == (
        "MissingParameter"
    )
    sqs.remove_permission("q", "two")
    assert [
        s["Sid"] for s in json.loads(sqs.queue_attributes("q", ["Policy"])["Policy"])["Statement"]
    ] == ["one"]
    assert "can't find label" in error(lambda: sqs.remove_permission("q", "two")).message
    sqs.remove_permission("q", "one")
    assert sqs.queue_attributes("q", ["Policy"]) == {}


def test_empty_policy_removes_it_and_a_bad_one_is_refused(sqs: SqsModel) -> None:
    doc = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": "*"}]}
    sqs.create_queue("q", {"Policy": json.dumps(doc)})
    assert json.loads(sqs.queue_attributes("q", ["Policy"])["Policy"]) == doc
    sqs.set_queue_attributes("q", {"Policy": ""})
    assert "Policy" not in sqs.queue_attributes("q", ["All"])
    assert error(lambda: sqs.set_queue_attributes("q", {"Policy": "{not json"})).shape == (
        "InvalidAttributeValue"
    )


def test_tags_are_validated_and_a_refused_call_changes_nothing(sqs: SqsModel) -> None:
    sqs.create_queue("q", tags={"keep": "1"})
    assert error(lambda: sqs.tag_queue("q", {})).message == (
        "The request must contain the parameter Tags."
    )
    many = {f"k{i}": "v" for i in range(50)}
    assert error(lambda: sqs.tag_queue("q", many)).message == "Too many tags added for queue q."
    assert sqs.queue_tags("q") == {"keep": "1"}
    assert error(lambda: sqs.untag_queue("q", [])).message == (
        "Tag keys must be between 1 and 128 characters in length."
    )
    sqs.untag_queue("q", ["keep", "absent"])
    assert sqs.queue_tags("q") == {}


def test_attribute_name_prefix_wildcards(sqs: SqsModel) -> None:
    sqs.create_queue("q")
    attrs = {
        n: {"DataType": "String", "StringValue": n} for n in ("Custom1", "Custom.two", "Other")
    }
    sqs.send_message("q", SendEntry("", "b", attributes=attrs))
    [got] = sqs.receive_message("q")
    msg = got.message
    assert set(msg.select_attributes(["Custom.*"])) == {"Custom1", "Custom.two"}
    assert set(msg.select_attributes([".*"])) == set(attrs)
    assert set(msg.select_attributes(["All"])) == set(attrs)
    assert set(msg.select_attributes(["Other", "Nope"])) == {"Other"}
    assert msg.select_attributes(["Nope.*"]) == {}


def test_region_and_account_are_in_the_arn(clock: FakeClock) -> None:
    sqs = SqsModel(clock=clock, account_id="123456789012", region="eu-west-1")
    queue = sqs.create_queue("q")
    assert queue.arn == "arn:aws:sqs:eu-west-1:123456789012:q"
    assert sqs.queue_attributes("q", ["QueueArn"]) == {"QueueArn": queue.arn}


def test_a_group_stays_locked_while_a_later_message_of_it_is_in_flight(
    sqs: SqsModel, clock: FakeClock
) -> None:
    sqs.create_queue("q.fifo", {**CBD, "VisibilityTimeout": "10"})
    for body in ("one", "two"):
        send(sqs, "q.fifo", body)
    first, second = sqs.receive_message("q.fifo", 10)
    sqs.change_message_visibility("q.fifo", second.receipt_handle, 100)
    clock.advance(10)  # "one" is visible again, "two" still in flight: the group waits
    assert sqs.queue_attributes("q.fifo", ["ApproximateNumberOfMessages"]) == {
        "ApproximateNumberOfMessages": "1"
    }
    assert sqs.receive_message("q.fifo", 10) == []
    sqs.delete_message("q.fifo", second.receipt_handle)
    assert bodies(sqs.receive_message("q.fifo", 10)) == ["one"]


def test_fifo_throughput_quotas(sqs: SqsModel, clock: FakeClock) -> None:
    sqs.create_queue("q.fifo", CBD)
    for i in range(300):  # 300 calls in one instant: the quota for one second
        send(sqs, "q.fifo", f"m{i}")
    throttled = error(lambda: send(sqs, "q.fifo", "over"))
    assert (throttled.code, throttled.status) == ("RequestThrottled", 400)
    # Each action has its own quota; a batch is one call.
    entries = [SendEntry(str(i), f"b{i}", group_id="g") for i in range(10)]
    assert len(sqs.send_message_batch("q.fifo", entries)[0]) == 10
    clock.advance(0.011)  # 3.3 calls' worth of quota comes back
    for i in range(3):
        send(sqs, "q.fifo", f"later{i}")
    assert error(lambda: send(sqs, "q.fifo", "over")).code == "RequestThrottled"
    sqs.create_queue("std")
    for i in range(400):  # standard queues are not throttled here
        send(sqs, "std", f"s{i}", group=None)


def test_high_throughput_quota_is_per_message_group(sqs: SqsModel, clock: FakeClock) -> None:
    sqs.create_queue(
        "ht.fifo",
        {**CBD, "DeduplicationScope": "messageGroup", "FifoThroughputLimit": "perMessageGroupId"},
    )
    for i in range(300):
        send(sqs, "ht.fifo", f"a{i}", group="a")
    assert error(lambda: send(sqs, "ht.fifo", "over", group="a")).code == "RequestThrottled"
    for i in range(300):  # another group has its own 300
        send(sqs, "ht.fifo", f"b{i}", group="b")
    clock.advance(1)
    send(sqs, "ht.fifo", "a-again", group="a")
    # Idle groups' buckets are dropped: memory does not grow with the number of groups.
    clock.advance(2)
    send(sqs, "ht.fifo", "c", group="c")
    assert set(sqs.queues["ht.fifo"].group_rates) == {("SendMessage", "c")}
    unthrottled = SqsModel(clock=clock, fifo_throughput_limits=False)
    unthrottled.create_queue("q.fifo", CBD)
    for i in range(400):
        send(unthrottled, "q.fifo", f"m{i}")


def test_visibility_cannot_reach_past_12_hours_after_the_receive(
    sqs: SqsModel, clock: FakeClock
) -> None:
    sqs.create_queue("q")
    sqs.send_message("q", SendEntry("", "b"))
    [got] = sqs.receive_message("q")
    sqs.change_message_visibility("q", got.receipt_handle, 360)
    clock.advance(300)
    err = error(lambda: sqs.change_message_visibility("q", got.receipt_handle, 43_200))
    assert err.code == "InvalidParameterValue" and "beyond the limit" in err.message
    sqs.change_message_visibility("q", got.receipt_handle, 43_200 - 300)  # exactly what is left
