"""HTTP/S subscriptions of the SNS endpoint, through boto3 and a loopback listener each test
starts itself: the SubscriptionConfirmation SNS POSTs (signed, with SNS's headers), confirming by
ConfirmSubscription or by a GET of the SubscribeURL, notifications (enveloped or raw), retries,
the UnsubscribeConfirmation, and the loopback-only rule (nothing is sent anywhere else)."""

from __future__ import annotations

import base64
import json
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding
from sns_topic_helpers import WAIT, client, error_of, topic

from emulators.sns.processes import SnsProcess, start_sns
from harness.stack.supervisor import wait_until

pytestmark = pytest.mark.integration


class Listener:
    """An HTTP endpoint on 127.0.0.1: keeps every POST, answers the statuses queued first."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.statuses: list[int] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server hook's name
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                outer.requests.append(
                    {
                        "path": self.path,
                        "headers": {k.lower(): v for k, v in self.headers.items()},
                        "body": body.decode(),
                    }
                )
                self.send_response(outer.statuses.pop(0) if outer.statuses else 200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str = "/hook", host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def wait(self, count: int) -> list[dict[str, Any]]:
        wait_until(lambda: len(self.requests) >= count, WAIT, f"{count} requests at the listener")
        return self.requests

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def endpoint() -> Iterator[SnsProcess]:
    with start_sns() as process:
        yield process


@pytest.fixture
def sns(endpoint: SnsProcess) -> Any:
    return client(endpoint.url)


@pytest.fixture
def listener() -> Iterator[Listener]:
    up = Listener()
    yield up
    up.close()


def verified(document: dict[str, Any], keys: tuple[str, ...]) -> bool:
    """Check a document's signature as AWS's guide tells subscribers to (the certificate from
    SigningCertURL, SHA1withRSA for SignatureVersion 1, SHA256withRSA for 2)."""
    pem = urllib.request.urlopen(document["SigningCertURL"], timeout=5).read()
    text = "".join(f"{k}\n{document[k]}\n" for k in keys if k in document)
    digest = hashes.SHA256() if document["SignatureVersion"] == "2" else hashes.SHA1()
    x509.load_pem_x509_certificate(pem).public_key().verify(  # type: ignore[call-arg]
        base64.b64decode(document["Signature"]), text.encode(), padding.PKCS1v15(), digest
    )
    return True


def deliveries(endpoint: SnsProcess, subscription_arn: str | None = None) -> list[dict]:
    rows = httpx.get(endpoint.url + "/_sns/deliveries").json()["rows"]
    return [
        r for r in rows if subscription_arn is None or r["subscription_arn"] == subscription_arn
    ]


CONFIRMATION_KEYS = (
    "Message",
    "MessageId",
    "SubscribeURL",
    "Timestamp",
    "Token",
    "TopicArn",
    "Type",
)
NOTIFICATION_KEYS = ("Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type")


def test_an_http_subscription_is_confirmed_by_its_subscribe_url_then_notified(
    sns: Any, listener: Listener, endpoint: SnsProcess
) -> None:
    arn = topic(sns)
    assert (
        sns.subscribe(TopicArn=arn, Protocol="http", Endpoint=listener.url())["SubscriptionArn"]
        == "pending confirmation"
    )
    (request,) = listener.wait(1)
    headers, document = request["headers"], json.loads(request["body"])
    assert request["path"] == "/hook"
    assert headers["x-amz-sns-message-type"] == "SubscriptionConfirmation"
    assert headers["x-amz-sns-topic-arn"] == arn
    assert headers["x-amz-sns-message-id"] == document["MessageId"]
    assert headers["content-type"] == "text/plain; charset=UTF-8"
    assert headers["user-agent"] == "Amazon Simple Notification Service Agent"
    assert document["Type"] == "SubscriptionConfirmation" and len(document["Token"]) == 288
    assert verified(document, CONFIRMATION_KEYS)
    (sub,) = sns.list_subscriptions_by_topic(TopicArn=arn)["Subscriptions"]
    assert sub["SubscriptionArn"] == "PendingConfirmation"
    sns.publish(TopicArn=arn, Message="too early")  # nothing for a pending subscription
    # the SubscribeURL is a GET of ConfirmSubscription on the endpoint itself, as on AWS
    answer = httpx.get(document["SubscribeURL"])
    assert answer.status_code == 200 and "<SubscriptionArn>" in answer.text
    (sub,) = sns.list_subscriptions_by_topic(TopicArn=arn)["Subscriptions"]
    attributes = sns.get_subscription_attributes(SubscriptionArn=sub["SubscriptionArn"])[
        "Attributes"
    ]
    assert (attributes["PendingConfirmation"], attributes["ConfirmationWasAuthenticated"]) == (
        "false",
        "false",
    )
    assert (
        json.loads(attributes["EffectiveDeliveryPolicy"])["healthyRetryPolicy"]["numRetries"] == 3
    )
    sent = sns.publish(
        TopicArn=arn,
        Message="hello",
        Subject="greeting",
        MessageAttributes={"k": {"DataType": "String", "StringValue": "v"}},
    )
    notice = listener.wait(2)[1]
    document = json.loads(notice["body"])
    assert notice["headers"]["x-amz-sns-message-type"] == "Notification"
    assert notice["headers"]["x-amz-sns-subscription-arn"] == sub["SubscriptionArn"]
    assert (document["MessageId"], document["Message"], document["Subject"]) == (
        sent["MessageId"],
        "hello",
        "greeting",
    )
    assert document["MessageAttributes"] == {"k": {"Type": "String", "Value": "v"}}
    assert document["UnsubscribeURL"].endswith(sub["SubscriptionArn"])
    assert verified(document, NOTIFICATION_KEYS)
    assert len(listener.requests) == 2


def test_raw_delivery_signature_v2_and_the_unsubscribe_confirmation(
    sns: Any, listener: Listener
) -> None:
    arn = topic(sns, SignatureVersion="2")
    sub = sns.subscribe(
        TopicArn=arn,
        Protocol="http",
        Endpoint=listener.url("/raw"),
        Attributes={"RawMessageDelivery": "true"},
        ReturnSubscriptionArn=True,
    )["SubscriptionArn"]
    assert sub.startswith(arn + ":")
    token = json.loads(listener.wait(1)[0]["body"])["Token"]
    assert error_of(lambda: sns.confirm_subscription(TopicArn=arn, Token="ab" * 20))[2] == (
        "Invalid parameter: Token"
    )
    confirmed = sns.confirm_subscription(
        TopicArn=arn, Token=token, AuthenticateOnUnsubscribe="true"
    )["SubscriptionArn"]
    assert confirmed == sub
    attributes = sns.get_subscription_attributes(SubscriptionArn=sub)["Attributes"]
    assert attributes["ConfirmationWasAuthenticated"] == "true"
    sns.publish(TopicArn=arn, Message="raw text")
    raw = listener.wait(2)[1]
    assert raw["body"] == "raw text" and raw["headers"]["x-amz-sns-rawdelivery"] == "true"
    sns.unsubscribe(SubscriptionArn=sub)
    goodbye = listener.wait(3)[2]
    document = json.loads(goodbye["body"])
    assert goodbye["headers"]["x-amz-sns-message-type"] == "UnsubscribeConfirmation"
    assert document["Type"] == "UnsubscribeConfirmation" and verified(document, CONFIRMATION_KEYS)
    assert sns.list_subscriptions_by_topic(TopicArn=arn)["Subscriptions"] == []
    # its token brings the subscription back, as the message says
    assert sns.confirm_subscription(TopicArn=arn, Token=document["Token"])["SubscriptionArn"] == sub
    assert len(sns.list_subscriptions_by_topic(TopicArn=arn)["Subscriptions"]) == 1


def test_a_failing_endpoint_is_tried_again(
    sns: Any, listener: Listener, endpoint: SnsProcess
) -> None:
    arn = topic(sns)
    sub = sns.subscribe(
        TopicArn=arn, Protocol="http", Endpoint=listener.url(), ReturnSubscriptionArn=True
    )["SubscriptionArn"]
    sns.confirm_subscription(TopicArn=arn, Token=json.loads(listener.wait(1)[0]["body"])["Token"])
    listener.statuses = [500, 503]
    sent = sns.publish(TopicArn=arn, Message="eventually")["MessageId"]
    listener.wait(4)
    assert [json.loads(r["body"])["MessageId"] for r in listener.requests[1:]] == [sent] * 3

    def notified() -> list[dict]:
        return [r for r in deliveries(endpoint, sub) if r["kind"] == "Notification"]

    wait_until(lambda: notified(), WAIT, "the delivery's ledger row")
    (row,) = notified()
    assert (row["provider"], row["delivered"], row["attempts"], row["status"]) == (
        "http",
        True,
        3,
        200,
    )


def test_http_deliveries_are_filtered_like_any_other(sns: Any, listener: Listener) -> None:
    arn = topic(sns)
    sub = sns.subscribe(
        TopicArn=arn,
        Protocol="http",
        Endpoint=listener.url(host="localhost"),
        Attributes={"FilterPolicy": json.dumps({"level": ["error"]})},
        ReturnSubscriptionArn=True,
    )["SubscriptionArn"]
    sns.confirm_subscription(TopicArn=arn, Token=json.loads(listener.wait(1)[0]["body"])["Token"])
    for level in ("info", "error", "debug"):
        sns.publish(
            TopicArn=arn,
            Message=level,
            MessageAttributes={"level": {"DataType": "String", "StringValue": level}},
        )
    listener.wait(2)
    sns.publish(
        TopicArn=arn,
        Message="sentinel",
        MessageAttributes={"level": {"DataType": "String", "StringValue": "error"}},
    )
    listener.wait(3)
    assert [json.loads(r["body"])["Message"] for r in listener.requests[1:]] == [
        "error",
        "sentinel",
    ]
    assert sub


def test_nothing_is_sent_beyond_loopback(sns: Any, endpoint: SnsProcess) -> None:
    arn = topic(sns)
    assert (
        error_of(
            lambda: sns.subscribe(TopicArn=arn, Protocol="http", Endpoint="https://127.0.0.1/")
        )[2]
        == "Invalid parameter: Endpoint must match the specified protocol"
    )
    for url in ("http://example.com/hook", "https://10.1.2.3:8443/hook"):
        # accepted, as AWS accepts any URL; never contacted, so never confirmed
        sub = sns.subscribe(
            TopicArn=arn,
            Protocol=url.split(":", 1)[0],
            Endpoint=url,
            ReturnSubscriptionArn=True,
        )["SubscriptionArn"]

        def refused(sub: str = sub) -> list[dict]:
            return deliveries(endpoint, sub)

        wait_until(lambda: refused(), WAIT, f"the refusal of {url}")
        (row,) = refused()
        host = url.split("/")[2].split(":")[0]
        assert (row["kind"], row["delivered"], row["attempts"]) == (
            "SubscriptionConfirmation",
            False,
            1,
        )
        assert row["error"].startswith(f"refused: {host} is not a loopback host")
        attributes = sns.get_subscription_attributes(SubscriptionArn=sub)["Attributes"]
        assert attributes["PendingConfirmation"] == "true"
