"""The pure topic model of the SNS endpoint (``emulators.sns.topics``) on a clock the test
moves: the FIFO deduplication window, confirmation tokens' lifetime, subscription idempotency,
permissions and tags. No sockets."""

from __future__ import annotations

import hashlib
import json

import pytest

from emulators.sns.errors import SnsError
from emulators.sns.topics import DEDUP_WINDOW, TOKEN_LIFETIME, Topics, check_fifo_parameters

ACCOUNT = "123456789012"
QUEUE = f"arn:aws:sqs:us-east-1:{ACCOUNT}:q"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def topics(clock: Clock) -> Topics:
    return Topics("us-east-1", ACCOUNT, clock)


def error(call, *args, **kwargs) -> SnsError:  # noqa: ANN001 - any callable
    with pytest.raises(SnsError) as caught:
        call(*args, **kwargs)
    return caught.value


def test_fifo_deduplication_lasts_five_minutes(topics: Topics, clock: Clock) -> None:
    topic = topics.create_topic("t.fifo", {"FifoTopic": "true"})
    first = topics.publish_fifo(topic, "m", "g", "d")
    clock.now += DEDUP_WINDOW - 1
    repeat = topics.publish_fifo(topic, "m", "g", "d")
    assert repeat.duplicate and (repeat.message_id, repeat.sequence_number) == (
        first.message_id,
        first.sequence_number,
    )
    clock.now += 2  # the window has passed: a new message
    later = topics.publish_fifo(topic, "m", "g", "d")
    assert not later.duplicate and later.message_id != first.message_id
    assert int(later.sequence_number or 0) > int(first.sequence_number or 0)


def test_deduplication_scope_and_content_based_ids(topics: Topics) -> None:
    topic = topics.create_topic(
        "t.fifo", {"FifoTopic": "true", "ContentBasedDeduplication": "true"}
    )
    first = topics.publish_fifo(topic, "same body", "g1", None)
    # AWS: a SHA-256 of the body (not the attributes) is the deduplication id
    assert first.deduplication_id == hashlib.sha256(b"same body").hexdigest()
    assert topics.publish_fifo(topic, "same body", "g2", None).duplicate  # the topic's scope
    grouped = topics.create_topic(
        "g.fifo", {"FifoTopic": "true", "FifoThroughputScope": "MessageGroup"}
    )
    topics.publish_fifo(grouped, "b", "g1", "d")
    assert not topics.publish_fifo(grouped, "b", "g2", "d").duplicate  # per message group
    assert topics.publish_fifo(grouped, "b", "g2", "d").duplicate


def test_fifo_parameters(topics: Topics) -> None:
    fifo = topics.create_topic("f.fifo", {"FifoTopic": "true"})
    standard = topics.create_topic("s", {})
    check_fifo_parameters(standard, "g", None)  # a group id on a standard topic: fair queues
    assert (
        "not valid for this topic type" in error(check_fifo_parameters, standard, None, "d").message
    )
    assert "required for FIFO topics" in error(check_fifo_parameters, fifo, None, "d").message
    assert "ContentBasedDeduplication" in error(check_fifo_parameters, fifo, "g", None).message
    assert "1 to 128" in error(check_fifo_parameters, fifo, "g" * 129, "d").message
    assert error(
        topics.set_topic_attribute, standard.arn, "ContentBasedDeduplication", "true"
    ).code == ("InvalidParameter")


def test_confirmation_tokens_last_two_days(topics: Topics, clock: Clock) -> None:
    topic = topics.create_topic("t", {})
    sub, created = topics.subscribe(topic.arn, "http", "http://127.0.0.1:9/x", {})
    assert created and sub.pending and sub.listed_arn == "PendingConfirmation"
    token = topics.new_token(sub)
    clock.now += TOKEN_LIFETIME + 1
    assert error(topics.confirm, topic.arn, token, False).message == "Invalid parameter: Token"
    token = topics.new_token(sub)
    assert topics.confirm(topic.arn, token, True) is sub
    assert not sub.pending and sub.authenticated
    assert error(topics.confirm, topic.arn, "not hex", False).message == "Invalid token"
    assert error(topics.confirm, "nope", token, False).message == "Invalid parameter: Topic"


def test_subscribing_again_is_idempotent_unless_the_attributes_differ(topics: Topics) -> None:
    topic = topics.create_topic("t", {})
    sub, _ = topics.subscribe(topic.arn, "sqs", QUEUE, {"RawMessageDelivery": "true"})
    assert topics.subscribe(topic.arn, "sqs", QUEUE, {})[0] is sub
    assert topics.subscribe(topic.arn, "sqs", QUEUE, {"RawMessageDelivery": "True"})[0] is sub
    assert error(
        topics.subscribe, topic.arn, "sqs", QUEUE, {"RawMessageDelivery": "false"}
    ).message == (
        "Invalid parameter: Attributes Reason: Subscription already exists with different attributes"
    )
    other = f"arn:aws:sqs:us-east-1:{'1' * 12}:q"
    assert topics.subscribe(topic.arn, "sqs", other, {})[0].pending  # another account confirms
    assert error(topics.subscribe, topic.arn, "smtp", "x", {}).message == (
        "Invalid parameter: Amazon SNS does not support this protocol string: smtp"
    )


def test_permissions_keep_a_policy_set_by_hand(topics: Topics) -> None:
    topic = topics.create_topic("t", {"Policy": json.dumps({"Version": "2012-10-17"})})
    topics.add_permission(
        topic.arn, "p", ["999999999999", "888888888888"], ["Publish", "Subscribe"]
    )
    policy = json.loads(topics.topic_attributes(topic)["Policy"])
    assert policy["Version"] == "2012-10-17"
    assert policy["Statement"][0]["Principal"]["AWS"] == [
        "arn:aws:iam::999999999999:root",
        "arn:aws:iam::888888888888:root",
    ]
    assert (
        "out of service scope"
        in error(topics.add_permission, topic.arn, "q", ["999999999999"], ["Fly"]).message
    )
    topics.remove_permission(topic.arn, "p")
    assert json.loads(topics.topic_attributes(topic)["Policy"])["Statement"] == []


def test_tags_are_limited_to_fifty(topics: Topics) -> None:
    topic = topics.create_topic("t", {}, {f"k{i}": "v" for i in range(49)})
    topics.tag(topic.arn, [("k49", "v")])
    err = error(topics.tag, topic.arn, [("k50", "v")])
    assert (err.code, err.message) == (
        "TagLimitExceeded",
        "Could not complete request: tag quota of per resource exceeded",
    )
    assert len(topics.tags(topic.arn)) == 50
    assert error(topics.tag, topic.arn, [("a", "1"), ("a", "2")]).message == (
        "Invalid parameter: Duplicated keys are not allowed."
    )
