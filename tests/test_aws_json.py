"""The lean JSON client for the delivery path's AWS calls (reference_impl/aws_json.py): signed as
botocore signs, answering what boto3 answers against the stack's SQS endpoint and dynalite, the
same errors, retries and binary values."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials, ReadOnlyCredentials
from botocore.exceptions import BotoCoreError, ClientError
from freezegun import freeze_time

from emulators.ports import free_port
from harness.stack.supervisor import AWS_KEYS, REGION, Stack
from reference_impl.aws import client, new_client
from reference_impl.aws_json import (
    JsonCaller,
    LeanClient,
    decode_dynamodb_binary,
    error_code,
    python_name,
    sigv4_headers,
)
from reference_impl.config import Config

BODY = b'{"QueueUrl":"https://sqs.us-east-1.amazonaws.com/123/q","MaxNumberOfMessages":10}'


@pytest.mark.parametrize("token", [None, "session-token"])
def test_the_signature_is_the_one_botocore_computes(token):
    creds = Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token)
    with freeze_time("2026-11-24 20:15:30"):
        request = AWSRequest(
            method="POST",
            url="https://sqs.us-east-1.amazonaws.com/",
            data=BODY,
            headers={
                "Content-Type": "application/x-amz-json-1.0",
                "X-Amz-Target": "AmazonSQS.ReceiveMessage",
            },
        )
        SigV4Auth(creds, "sqs", "us-east-1").add_auth(request)
    ours = sigv4_headers(
        host="sqs.us-east-1.amazonaws.com",
        path="/",
        body=BODY,
        target="AmazonSQS.ReceiveMessage",
        content_type="application/x-amz-json-1.0",
        region="us-east-1",
        service="sqs",
        access_key=creds.access_key,
        secret_key=creds.secret_key,
        token=token,
        amz_date="20261124T201530Z",
    )
    assert ours["authorization"] == request.headers["Authorization"]
    assert ours["x-amz-date"] == request.headers["X-Amz-Date"]
    assert ours.get("x-amz-security-token") == request.headers.get("X-Amz-Security-Token")


def test_pure_helpers():
    assert python_name("BatchGetItem") == "batch_get_item"
    assert python_name("ReceiveMessage") == "receive_message"
    item = {"k": {"B": "AAEC"}, "m": {"M": {"s": {"BS": ["AQ=="]}, "n": {"S": "B"}}}}
    assert decode_dynamodb_binary(item) == {
        "k": {"B": b"\x00\x01\x02"},
        "m": {"M": {"s": {"BS": [b"\x01"]}, "n": {"S": "B"}}},
    }
    assert error_code({"__type": "com.amazonaws.dynamodb.v20120810#ResourceNotFound"}, {}) == (
        "ResourceNotFound"
    )
    assert error_code({}, {"x-amzn-errortype": "ThrottlingException:http://x"}) == (
        "ThrottlingException"
    )


@pytest.fixture(scope="module")
def aws(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with Stack(
        tmp_path_factory.mktemp("lean"), parts=["dynamodb", "sqs"], with_workers=False
    ) as stack:
        yield stack


def _config(stack: Stack, **overrides) -> Config:
    return Config(
        region=REGION,
        dynamodb_endpoint=stack.info.url("dynamodb"),
        sqs_endpoint=stack.info.url("sqs"),
        **AWS_KEYS,
        **overrides,
    )


@pytest.mark.integration
def test_sqs_calls_answer_what_boto3_answers(aws: Stack):
    sqs = client(_config(aws), "sqs")
    assert isinstance(sqs, LeanClient)
    url = sqs.create_queue(QueueName=f"lean-{uuid.uuid4().hex[:8]}")["QueueUrl"]  # boto3's
    entries = [
        {
            "Id": str(i),
            "MessageBody": f"body {i}",
            "MessageAttributes": {"tenant_id": {"DataType": "String", "StringValue": "t0"}},
        }
        for i in range(3)
    ]
    sent = sqs.send_message_batch(QueueUrl=url, Entries=entries)
    assert sorted(s["Id"] for s in sent["Successful"]) == ["0", "1", "2"]
    got = []
    for _ in range(10):  # bounded: three messages, at most ten receives
        got += sqs.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=1,
            AttributeNames=["All"],
            MessageAttributeNames=["All"],
        ).get("Messages", [])
        if len(got) == 3:
            break
    assert sorted(m["Body"] for m in got) == ["body 0", "body 1", "body 2"]
    assert got[0]["Attributes"]["ApproximateReceiveCount"] == "1"
    assert got[0]["MessageAttributes"]["tenant_id"]["StringValue"] == "t0"
    sqs.change_message_visibility(
        QueueUrl=url, ReceiptHandle=got[0]["ReceiptHandle"], VisibilityTimeout=0
    )
    done = sqs.delete_message_batch(
        QueueUrl=url,
        Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)],
    )
    assert len(done["Successful"]) == 3
    plain = new_client("sqs", region_name=REGION, endpoint_url=aws.info.url("sqs"), **AWS_KEYS)
    attrs = plain.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attrs["ApproximateNumberOfMessages"] == "0"
    assert attrs["ApproximateNumberOfMessagesNotVisible"] == "0"
    with pytest.raises(ClientError) as error:
        sqs.send_message(QueueUrl=url + "-missing", MessageBody="x")
    assert error.value.response["Error"]["Code"] in (
        "QueueDoesNotExist",
        "AWS.SimpleQueueService.NonExistentQueue",
    )


@pytest.mark.integration
def test_dynamodb_calls_bytes_and_conditional_errors(aws: Stack):
    ddb = client(_config(aws), "dynamodb")
    table = f"lean-{uuid.uuid4().hex[:8]}"
    ddb.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    raw = bytes(range(32))
    item = {"pk": {"S": "a"}, "key": {"B": raw}, "prefs": {"S": '{"x": 1}'}}
    ddb.put_item(TableName=table, Item=item, ConditionExpression="attribute_not_exists(pk)")
    with pytest.raises(ClientError) as error:
        ddb.put_item(TableName=table, Item=item, ConditionExpression="attribute_not_exists(pk)")
    assert error.value.response["Error"]["Code"] == "ConditionalCheckFailedException"
    got = ddb.batch_get_item(
        RequestItems={
            table: {
                "Keys": [{"pk": {"S": "a"}}, {"pk": {"S": "b"}}],
                "ConsistentRead": True,
                "ProjectionExpression": "pk, prefs",
            }
        }
    )
    assert got["Responses"][table] == [{"pk": {"S": "a"}, "prefs": {"S": '{"x": 1}'}}]
    whole = ddb.batch_get_item(RequestItems={table: {"Keys": [{"pk": {"S": "a"}}]}})
    assert whole["Responses"][table] == [item]  # the binary value as bytes
    assert ddb.get_item(TableName=table, Key={"pk": {"S": "a"}})["Item"] == item
    plain = new_client(
        "dynamodb", region_name=REGION, endpoint_url=aws.info.url("dynamodb"), **AWS_KEYS
    )
    assert plain.get_item(TableName=table, Key={"pk": {"S": "a"}})["Item"] == item


def test_no_answer_is_a_botocore_error_after_the_retries(monkeypatch):
    frozen = ReadOnlyCredentials("a", "b", None)
    caller = JsonCaller(
        f"http://127.0.0.1:{free_port()}",
        "us-east-1",
        "sqs",
        "AmazonSQS",
        lambda: frozen,
        connect_timeout=1,
        read_timeout=1,
        max_attempts=3,
    )
    waits: list[int] = []
    monkeypatch.setattr(JsonCaller, "_backoff", staticmethod(waits.append))
    started = time.monotonic()
    with pytest.raises(BotoCoreError):
        caller.call("ReceiveMessage", {"QueueUrl": "x"})
    assert waits == [1, 2]  # tried three times
    assert time.monotonic() - started < 10


def test_the_lean_client_can_be_turned_off(tmp_path: Path):
    config = Config(sqs_endpoint="http://127.0.0.1:9", aws_lean_client=False, **AWS_KEYS)
    assert not isinstance(client(config, "sqs"), LeanClient)
    assert isinstance(
        client(Config(sqs_endpoint="http://127.0.0.1:9", **AWS_KEYS), "sqs"), LeanClient
    )
    assert not isinstance(
        client(Config(s3_endpoint="http://127.0.0.1:9", **AWS_KEYS), "s3"), LeanClient
    )
