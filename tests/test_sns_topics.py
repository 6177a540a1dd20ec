"""SNS topics as a team's fan-out uses them, through an unmodified boto3 client against the real
SNS, SQS and APNs simulator processes (one stack for the module): subscription filter policies
applied on delivery, raw delivery, FIFO topics into FIFO queues, SMS and platform-endpoint
subscriptions, cross-account confirmation, and the topic's own API (attributes, permissions,
tags, regions)."""

from __future__ import annotations

import json
import ssl
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sns_topic_helpers import WAIT, attrs, client, drain, error_of, messages, queue, topic

from emulators.providers.apns_keys import new_signing_key
from harness.stack.supervisor import Stack, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with Stack(tmp_path_factory.mktemp("sns-topics"), parts=["sqs", "apns", "sns"]) as up:
        yield up


@pytest.fixture(scope="module")
def sns(stack: Stack) -> Any:
    return client(stack.info.url("sns"))


@pytest.fixture(scope="module")
def sqs(stack: Stack) -> Any:
    return client(stack.info.url("sqs"), "sqs")


def subscribed(sns: Any, sqs: Any, topic_arn: str, **attributes: str) -> tuple[str, str]:
    """A new queue subscribed to the topic: (queue URL, subscription ARN)."""
    url, arn = queue(sqs, fifo=topic_arn.endswith(".fifo"))
    sub = sns.subscribe(TopicArn=topic_arn, Protocol="sqs", Endpoint=arn, Attributes=attributes)
    return url, sub["SubscriptionArn"]


# -- filter policies -------------------------------------------------------------------------------
def test_a_filter_policy_on_attributes_decides_what_each_queue_gets(sns: Any, sqs: Any) -> None:
    arn = topic(sns)
    everything, _ = subscribed(sns, sqs, arn)
    policy = {
        "store": ["example_corp"],
        "price": [{"numeric": [">", 10, "<=", 100]}],
        "$or": [{"kind": [{"prefix": "order."}]}, {"tags": ["vip"]}],
    }
    filtered, _ = subscribed(sns, sqs, arn, FilterPolicy=json.dumps(policy))
    published = {
        "match-prefix": attrs(store="example_corp", price=50, kind="order.placed"),
        "match-array": attrs(store="example_corp", price=100, tags=["new", "vip"]),
        "wrong-store": attrs(store="other", price=50, kind="order.placed"),
        "price-out-of-range": attrs(store="example_corp", price=101, kind="order.placed"),
        "price-is-a-string": attrs(store="example_corp", price="50", kind="order.placed"),
        "no-alternative": attrs(store="example_corp", price=50, kind="refund"),
        "no-attributes": {},
    }
    for text, attributes in published.items():
        sns.publish(TopicArn=arn, Message=text, MessageAttributes=attributes)
    assert sorted(messages(sqs, everything)) == sorted(published)
    assert sorted(messages(sqs, filtered)) == ["match-array", "match-prefix"]


def test_a_filter_policy_on_the_body_matches_nested_properties(sns: Any, sqs: Any) -> None:
    arn = topic(sns)
    policy = {
        "Records": {"eventName": [{"prefix": "ObjectCreated:"}]},
        "detail": {"size": [{"numeric": [">=", 1024]}], "region": [{"anything-but": "eu"}]},
    }
    url, _ = subscribed(
        sns, sqs, arn, FilterPolicyScope="MessageBody", FilterPolicy=json.dumps(policy)
    )
    bodies = {
        "one-record-matches": {
            "Records": [{"eventName": "ObjectRemoved:Delete"}, {"eventName": "ObjectCreated:Put"}],
            "detail": {"size": 2048, "region": "us"},
        },
        "too-small": {
            "Records": [{"eventName": "ObjectCreated:Put"}],
            "detail": {"size": 10, "region": "us"},
        },
        "excluded-region": {
            "Records": [{"eventName": "ObjectCreated:Put"}],
            "detail": {"size": 2048, "region": "eu"},
        },
        "no-region": {"Records": [{"eventName": "ObjectCreated:Put"}], "detail": {"size": 2048}},
    }
    for name, body in bodies.items():
        sns.publish(TopicArn=arn, Message=json.dumps({**body, "name": name}))
    sns.publish(TopicArn=arn, Message="not json at all")
    assert [json.loads(m)["name"] for m in messages(sqs, url)] == ["one-record-matches"]


def test_filter_policy_attributes_are_checked_and_answered_as_aws_does(sns: Any, sqs: Any) -> None:
    arn = topic(sns)
    _, queue_arn = queue(sqs)
    code, status, message = error_of(
        lambda: sns.subscribe(
            TopicArn=arn,
            Protocol="sqs",
            Endpoint=queue_arn,
            Attributes={"FilterPolicy": json.dumps({"price": [{"numeric": ["<", "100"]}]})},
        )
    )
    assert (code, status) == ("InvalidParameter", 400)
    assert message == (
        "Invalid parameter: Attributes Reason: FilterPolicy: Value of < must be numeric"
    )
    sub = sns.subscribe(TopicArn=arn, Protocol="sqs", Endpoint=queue_arn)["SubscriptionArn"]
    nested = json.dumps({"store": {"name": ["x"]}})
    assert error_of(
        lambda: sns.set_subscription_attributes(
            SubscriptionArn=sub, AttributeName="FilterPolicy", AttributeValue=nested
        )
    )[2] == (
        "Invalid parameter: Filter policy scope MessageAttributes does not support nested filter "
        "policy"
    )
    for name, value in (("FilterPolicyScope", "MessageBody"), ("FilterPolicy", nested)):
        sns.set_subscription_attributes(
            SubscriptionArn=sub, AttributeName=name, AttributeValue=value
        )
    got = sns.get_subscription_attributes(SubscriptionArn=sub)["Attributes"]
    assert (got["FilterPolicy"], got["FilterPolicyScope"]) == (nested, "MessageBody")
    sns.set_subscription_attributes(
        SubscriptionArn=sub, AttributeName="FilterPolicy", AttributeValue=""
    )
    got = sns.get_subscription_attributes(SubscriptionArn=sub)["Attributes"]
    assert "FilterPolicy" not in got and "FilterPolicyScope" not in got
    assert error_of(
        lambda: sns.set_subscription_attributes(
            SubscriptionArn=sub, AttributeName="FilterPolicyScope", AttributeValue="Body"
        )
    )[2].startswith("Invalid parameter: FilterPolicyScope: Invalid value [Body].")


# -- raw delivery and the envelope -----------------------------------------------------------------
def test_raw_delivery_carries_the_attributes_as_sqs_attributes(sns: Any, sqs: Any) -> None:
    arn = topic(sns)
    raw, sub = subscribed(sns, sqs, arn, RawMessageDelivery="true")
    enveloped, _ = subscribed(sns, sqs, arn)
    attributes = {
        **attrs(store="corp", count=3, tags=["a", "b"]),
        "blob": {"DataType": "Binary", "BinaryValue": b"\x00\x01"},
    }
    sent = sns.publish(TopicArn=arn, Message="hello", Subject="hi", MessageAttributes=attributes)
    (got,) = drain(sqs, raw)
    assert got["Body"] == "hello"
    assert {
        k: v.get("StringValue", v.get("BinaryValue")) for k, v in got["MessageAttributes"].items()
    } == {
        "store": "corp",
        "count": "3",
        "tags": '["a", "b"]',
        "blob": b"\x00\x01",
    }
    (env,) = drain(sqs, enveloped)
    body = json.loads(env["Body"])
    assert (body["Type"], body["MessageId"], body["Subject"], body["Message"]) == (
        "Notification",
        sent["MessageId"],
        "hi",
        "hello",
    )
    assert body["MessageAttributes"]["blob"] == {"Type": "Binary", "Value": "AAE="}
    assert (
        sns.get_subscription_attributes(SubscriptionArn=sub)["Attributes"]["RawMessageDelivery"]
        == "true"
    )


# -- FIFO --------------------------------------------------------------------------------------
def test_a_fifo_topic_delivers_in_order_to_a_fifo_queue_and_drops_duplicates(
    sns: Any, sqs: Any
) -> None:
    arn = topic(sns, fifo=True)
    url, _ = subscribed(sns, sqs, arn, RawMessageDelivery="true")
    first = sns.publish(TopicArn=arn, Message="m1", MessageGroupId="g", MessageDeduplicationId="d1")
    again = sns.publish(
        TopicArn=arn, Message="m1 again", MessageGroupId="g", MessageDeduplicationId="d1"
    )
    second = sns.publish(
        TopicArn=arn, Message="m2", MessageGroupId="g", MessageDeduplicationId="d2"
    )
    # the duplicate is accepted, answers the first one's ids, and is not delivered
    assert again["MessageId"] == first["MessageId"]
    assert again["SequenceNumber"] == first["SequenceNumber"]
    assert int(second["SequenceNumber"]) > int(first["SequenceNumber"])
    got = drain(sqs, url)
    assert [m["Body"] for m in got] == ["m1", "m2"]
    assert [
        (m["Attributes"]["MessageGroupId"], m["Attributes"]["MessageDeduplicationId"]) for m in got
    ] == [
        ("g", "d1"),
        ("g", "d2"),
    ]


def test_fifo_rules_and_content_based_deduplication(sns: Any, sqs: Any) -> None:
    arn = topic(sns, fifo=True)
    assert error_of(lambda: sns.publish(TopicArn=arn, Message="m"))[2] == (
        "Invalid parameter: The MessageGroupId parameter is required for FIFO topics"
    )
    assert error_of(lambda: sns.publish(TopicArn=arn, Message="m", MessageGroupId="g"))[2] == (
        "Invalid parameter: The topic should either have ContentBasedDeduplication enabled or "
        "MessageDeduplicationId provided explicitly"
    )
    sns.set_topic_attributes(
        TopicArn=arn, AttributeName="ContentBasedDeduplication", AttributeValue="true"
    )
    # FIFO topics deliver to standard queues too (which would not deduplicate by themselves)
    standard_queue, standard_arn = queue(sqs)
    sns.subscribe(TopicArn=arn, Protocol="sqs", Endpoint=standard_arn)
    ids = {
        sns.publish(TopicArn=arn, Message="same", MessageGroupId="g")["MessageId"] for _ in range(3)
    }
    assert len(ids) == 1
    assert messages(sqs, standard_queue) == ["same"]
    standard = topic(sns)
    assert error_of(
        lambda: sns.publish(TopicArn=standard, Message="m", MessageDeduplicationId="d")
    )[2] == (
        "Invalid parameter: MessageDeduplicationId Reason: The request includes "
        "MessageDeduplicationId parameter that is not valid for this topic type"
    )
    _, fifo_queue = queue(sqs, fifo=True)
    assert error_of(lambda: sns.subscribe(TopicArn=standard, Protocol="sqs", Endpoint=fifo_queue))[
        2
    ] == (
        "Invalid parameter: Invalid parameter: Endpoint Reason: FIFO SQS Queues can not be "
        "subscribed to standard SNS topics"
    )
    assert (
        error_of(lambda: sns.create_topic(Name="no-suffix", Attributes={"FifoTopic": "true"}))[2]
        == "Invalid parameter: Topic Name"
    )
    attributes = sns.get_topic_attributes(TopicArn=arn)["Attributes"]
    assert (attributes["FifoTopic"], attributes["ContentBasedDeduplication"]) == ("true", "true")


def test_publish_checks_answer_as_aws_does(sns: Any, sqs: Any) -> None:
    arn = topic(sns)

    def refused(**kw: Any) -> str:
        return error_of(lambda: sns.publish(TopicArn=arn, **kw))[2]

    assert refused(Message="m", Subject="") == "Invalid parameter: Subject"
    assert refused(Message="m", Subject="s" * 101) == "Invalid parameter: Subject"
    structure = {"MessageStructure": "json"}
    assert refused(Message=json.dumps({"default": {"o": 1}}), **structure) == (
        "Invalid parameter: Message Structure - No default entry in JSON message body"
    )
    assert refused(Message="{", **structure) == (
        "Invalid parameter: Message Structure - JSON message body failed to parse"
    )
    big = "x" * 300_000
    assert refused(Message=big) == "Invalid parameter: Message too long"
    # a topic's MaximumMessageSize (up to 1 MiB) lets larger messages through
    sns.set_topic_attributes(
        TopicArn=arn, AttributeName="MaximumMessageSize", AttributeValue="1048576"
    )
    url, _ = subscribed(sns, sqs, arn, RawMessageDelivery="true")
    sns.publish(TopicArn=arn, Message=big, Subject="unicode subjects are fine: ünï")
    assert [len(m) for m in messages(sqs, url)] == [300_000]


# -- other protocols -----------------------------------------------------------------------------
def test_sms_subscriptions_are_texted_through_the_sms_ledger(stack: Stack, sns: Any) -> None:
    arn = topic(sns)
    sns.subscribe(TopicArn=arn, Protocol="sms", Endpoint="+1-555-010-0199")
    sns.subscribe(
        TopicArn=arn,
        Protocol="sms",
        Endpoint="+15550100188",
        Attributes={"FilterPolicy": json.dumps({"urgent": ["yes"]})},
    )
    assert (
        error_of(lambda: sns.subscribe(TopicArn=arn, Protocol="sms", Endpoint="+15--5501"))[2]
        == "Invalid SMS endpoint: +15--5501"
    )
    sns.publish(
        TopicArn=arn,
        Message=json.dumps({"default": "long text", "sms": "short"}),
        MessageStructure="json",
    )
    rows = httpx.get(stack.info.url("sns") + "/_sns/sms").json()["rows"]
    assert [(r["token"], r["message"], r["delivered"]) for r in rows] == [
        ("+15550100199", "short", True)
    ]


def test_platform_endpoints_subscribed_to_a_topic_get_the_push(stack: Stack, sns: Any) -> None:
    # The application's key and bundle as Apple knows them, its devices bound to the bundle.
    key = new_signing_key(team_id="TEAM123456", key_id="ABCDE12345")
    tokens = [uuid.uuid4().hex * 2 for _ in range(2)]
    tls = ssl.create_default_context(cafile=stack.info.tls_ca)
    apns = stack.info.url("apns")
    registered = httpx.put(
        f"{apns}/_sim/apns/keys", json=key.registration(["com.example.topics"]), verify=tls
    )
    bound = httpx.put(
        f"{apns}/_sim/apns/topics",
        json={"tokens": dict.fromkeys(tokens, "com.example.topics")},
        verify=tls,
    )
    assert (registered.status_code, bound.status_code) == (200, 200)
    app = sns.create_platform_application(
        Name=f"ios-{uuid.uuid4().hex[:8]}",
        Platform="APNS",
        Attributes={
            "PlatformCredential": key.private_pem,
            "PlatformPrincipal": key.key_id,
            "ApplePlatformTeamID": key.team_id,
            "ApplePlatformBundleID": "com.example.topics",
        },
    )["PlatformApplicationArn"]
    arn = topic(sns)
    for token in tokens:
        device = sns.create_platform_endpoint(PlatformApplicationArn=app, Token=token)
        sns.subscribe(TopicArn=arn, Protocol="application", Endpoint=device["EndpointArn"])
    gone = f"{app.replace(':app/', ':endpoint/')}/{uuid.uuid4()}"
    assert (
        error_of(lambda: sns.subscribe(TopicArn=arn, Protocol="application", Endpoint=gone))[2]
        == f"Invalid parameter: Endpoint Reason: Endpoint does not exist for endpoint arn{gone}"
    )
    payload = {"aps": {"alert": "sale"}, "notification_id": "n-topic"}
    sns.publish(
        TopicArn=arn,
        MessageStructure="json",
        Message=json.dumps({"default": "sale", "APNS": json.dumps(payload)}),
    )

    def pushed() -> list[tuple[str, int]]:
        rows = httpx.get(stack.info.url("apns") + "/_sim/ledger", verify=tls).json()["rows"]
        return sorted((r["token"], r["status"]) for r in rows if r["notification_id"] == "n-topic")

    wait_until(lambda: len(pushed()) == 2, WAIT, "both devices' pushes")
    assert pushed() == sorted((t, 200) for t in tokens)


def test_a_queue_of_another_account_confirms_from_its_queue(sns: Any, sqs: Any) -> None:
    arn = topic(sns)
    url, own_arn = queue(sqs)
    other = own_arn.replace(":000000000000:", ":111111111111:")
    answer = sns.subscribe(TopicArn=arn, Protocol="sqs", Endpoint=other)
    assert answer["SubscriptionArn"] == "pending confirmation"
    (note,) = drain(sqs, url, wait=5)  # sent after Subscribe answers, as on AWS
    confirmation = json.loads(note["Body"])
    assert confirmation["Type"] == "SubscriptionConfirmation"
    sns.publish(TopicArn=arn, Message="before")  # a pending subscription gets nothing
    assert drain(sqs, url) == []
    sub = sns.confirm_subscription(TopicArn=arn, Token=confirmation["Token"])["SubscriptionArn"]
    assert sub.startswith(arn + ":")
    sns.publish(TopicArn=arn, Message="after")
    assert messages(sqs, url) == ["after"]
    assert sns.get_topic_attributes(TopicArn=arn)["Attributes"]["SubscriptionsConfirmed"] == "1"


def test_publishing_to_a_disabled_endpoint_answers_endpoint_disabled_first(sns: Any) -> None:
    app = sns.create_platform_application(
        Name=f"ios-{uuid.uuid4().hex[:8]}",
        Platform="APNS",
        Attributes={
            "PlatformCredential": new_signing_key().private_pem,
            "PlatformPrincipal": "ABCDE12345",
            "ApplePlatformTeamID": "TEAM123456",
            "ApplePlatformBundleID": "com.example.topics",
        },
    )["PlatformApplicationArn"]
    device = sns.create_platform_endpoint(
        PlatformApplicationArn=app, Token=uuid.uuid4().hex * 2, Attributes={"Enabled": "false"}
    )["EndpointArn"]
    # AWS answers the endpoint's state before it reads the message (moto's AWS-verified test)
    assert error_of(
        lambda: sns.publish(TargetArn=device, Message="msg", MessageStructure="json")
    ) == ("EndpointDisabled", 400, "Endpoint is disabled")
    sns.set_endpoint_attributes(EndpointArn=device, Attributes={"Enabled": "true"})
    assert error_of(
        lambda: sns.publish(TargetArn=device, Message="msg", MessageStructure="json")
    ) == (
        "InvalidParameter",
        400,
        "Invalid parameter: Message Structure - JSON message body failed to parse",
    )


# -- the topic's own API -------------------------------------------------------------------------
def test_topic_attributes_permissions_and_tags(sns: Any) -> None:
    arn = sns.create_topic(
        Name=f"t-{uuid.uuid4().hex[:8]}", Tags=[{"Key": "team", "Value": "push"}]
    )["TopicArn"]
    attributes = sns.get_topic_attributes(TopicArn=arn)["Attributes"]
    assert attributes["DisplayName"] == "" and "DeliveryPolicy" not in attributes
    assert (
        json.loads(attributes["EffectiveDeliveryPolicy"])["http"]["defaultHealthyRetryPolicy"][
            "numRetries"
        ]
        == 3
    )
    sns.set_topic_attributes(
        TopicArn=arn, AttributeName="Policy", AttributeValue=json.dumps({"Version": "2012-10-17"})
    )
    assert (
        sns.get_topic_attributes(TopicArn=arn)["Attributes"]["Policy"] == '{"Version":"2012-10-17"}'
    )
    sns.set_topic_attributes(TopicArn=arn, AttributeName="Policy", AttributeValue="{}")
    sns.set_topic_attributes(TopicArn=arn, AttributeName="DisplayName", AttributeValue="Push")
    assert (
        error_of(
            lambda: sns.set_topic_attributes(
                TopicArn=arn, AttributeName="FifoTopic", AttributeValue="true"
            )
        )[2]
        == "Invalid parameter: AttributeName"
    )
    sns.add_permission(
        TopicArn=arn, Label="partner", AWSAccountId=["999999999999"], ActionName=["Publish"]
    )
    statements = json.loads(sns.get_topic_attributes(TopicArn=arn)["Attributes"]["Policy"])[
        "Statement"
    ]
    assert statements[-1] == {
        "Sid": "partner",
        "Effect": "Allow",
        "Principal": {"AWS": "arn:aws:iam::999999999999:root"},
        "Action": "SNS:Publish",
        "Resource": arn,
    }
    assert (
        error_of(
            lambda: sns.add_permission(
                TopicArn=arn, Label="partner", AWSAccountId=["999999999999"], ActionName=["Publish"]
            )
        )[2]
        == "Invalid parameter: Statement already exists"
    )
    sns.remove_permission(TopicArn=arn, Label="partner")
    policy = json.loads(sns.get_topic_attributes(TopicArn=arn)["Attributes"]["Policy"])
    assert [s.get("Sid") for s in policy.get("Statement", [])] == []
    sns.tag_resource(ResourceArn=arn, Tags=[{"Key": "tier", "Value": "1"}])
    sns.untag_resource(ResourceArn=arn, TagKeys=["team"])
    assert sns.list_tags_for_resource(ResourceArn=arn)["Tags"] == [{"Key": "tier", "Value": "1"}]
    assert error_of(lambda: sns.list_tags_for_resource(ResourceArn=arn + "-gone"))[:2] == (
        "ResourceNotFound",
        404,
    )
    assert (
        error_of(
            lambda: sns.create_topic(
                Name=arn.rsplit(":", 1)[1], Tags=[{"Key": "tier", "Value": "2"}]
            )
        )[2]
        == "Invalid parameter: Tags Reason: Topic already exists with different tags"
    )


def test_each_region_has_its_own_topics(stack: Stack, sns: Any) -> None:
    west = client(stack.info.url("sns"), region="us-west-2")
    arn = topic(west)
    assert ":us-west-2:" in arn
    assert arn in [t["TopicArn"] for t in west.list_topics()["Topics"]]
    assert arn not in [t["TopicArn"] for t in sns.list_topics()["Topics"]]
    assert error_of(lambda: sns.get_topic_attributes(TopicArn=arn))[2] == (
        "Invalid parameter: TopicArn"
    )


def test_a_queue_in_another_region_gets_its_messages(stack: Stack, sns: Any) -> None:
    west_sqs = client(stack.info.url("sqs"), "sqs", region="us-west-2")
    url, queue_arn = queue(west_sqs)
    assert ":us-west-2:" in queue_arn
    arn = topic(sns)
    sns.subscribe(TopicArn=arn, Protocol="sqs", Endpoint=queue_arn)
    sns.publish(TopicArn=arn, Message="cross-region")
    assert messages(west_sqs, url) == ["cross-region"]


def test_unsubscribe_and_listings(sns: Any, sqs: Any) -> None:
    arn = topic(sns)
    _, sub = subscribed(sns, sqs, arn)
    listed = sns.list_subscriptions()["Subscriptions"]
    assert sub in [s["SubscriptionArn"] for s in listed]
    sns.unsubscribe(SubscriptionArn=sub)
    sns.unsubscribe(SubscriptionArn=sub)  # AWS: not an error twice
    assert sns.list_subscriptions_by_topic(TopicArn=arn)["Subscriptions"] == []
    assert error_of(lambda: sns.get_subscription_attributes(SubscriptionArn=sub))[:2] == (
        "NotFound",
        404,
    )
    assert error_of(lambda: sns.unsubscribe(SubscriptionArn="pending confirmation"))[2] == (
        "Invalid parameter: SubscriptionArn Reason: An ARN must have at least 6 elements, not 1"
    )
