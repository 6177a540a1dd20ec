"""The SNS endpoint through an unmodified boto3 ``sns`` client, delivering to the real APNs (TLS)
and FCM simulator processes and to our SQS endpoint: one stack of those four parts, started as
the harness starts them (``Stack(parts=[...])``), for the whole module."""

from __future__ import annotations

import base64
import json
import os
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding

from emulators.ports import free_port
from emulators.providers.apns_keys import new_signing_key
from emulators.providers.fcm import write_service_account_file
from emulators.sns.faults import SnsControl, SnsControlError
from harness.stack.supervisor import ROOT, Stack

pytestmark = pytest.mark.integration

WAIT = 10.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with Stack(tmp_path_factory.mktemp("sns-stack"), parts=["sqs", "apns", "fcm", "sns"]) as up:
        # The platform applications' signing key, registered as its team did with Apple.
        answer = httpx.put(
            f"{up.info.url('apns')}/_sim/apns/keys",
            json=APNS_KEY.registration(["com.example.fanout"]),
            verify=ssl.create_default_context(cafile=up.info.tls_ca),
        )
        assert answer.status_code == 200, answer.text
        yield up


@pytest.fixture(scope="module")
def urls(stack: Stack) -> dict[str, str]:
    return {part: stack.info.url(part) for part in ("sqs", "apns", "fcm", "sns")}


@pytest.fixture(scope="module")
def ca(stack: Stack) -> ssl.SSLContext:
    """What to trust for the APNs simulator's TLS (its generated CA)."""
    assert stack.info.tls_ca
    return ssl.create_default_context(cafile=stack.info.tls_ca)


def client(url: str, service: str = "sns", attempts: int = 1, **config: Any) -> Any:
    return boto3.client(
        service,
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(retries={"total_max_attempts": attempts, **config}, read_timeout=30),
    )


@pytest.fixture(scope="module")
def sns(urls: dict[str, str]) -> Any:
    return client(urls["sns"])


@pytest.fixture(scope="module")
def sqs(urls: dict[str, str]) -> Any:
    return client(urls["sqs"], "sqs")


@pytest.fixture(scope="module")
def control(urls: dict[str, str]) -> Iterator[SnsControl]:
    with SnsControl(urls["sns"]) as ctl:
        yield ctl


@pytest.fixture(autouse=True)
def no_faults(urls: dict[str, str], ca: ssl.SSLContext, control: SnsControl) -> Iterator[None]:
    yield
    control.stop_all()
    httpx.delete(urls["apns"] + "/_sim/faults", verify=ca)
    httpx.delete(urls["fcm"] + "/_sim/faults")


def sim_ledger(url: str, ca: ssl.SSLContext | None = None, since: int = 0) -> list[dict]:
    return httpx.get(f"{url}/_sim/ledger?since={since}", verify=ca or True).json()["rows"]


def sim_next(url: str, ca: ssl.SSLContext | None = None) -> int:
    return httpx.get(f"{url}/_sim/ledger?since=0", verify=ca or True).json()["next"]


APNS_KEY = new_signing_key(team_id="TEAM123456", key_id="ABCDE12345")


def p8_key() -> str:
    return APNS_KEY.private_pem


def new_token() -> str:
    return uuid.uuid4().hex + uuid.uuid4().hex


def apns_app(sns: Any, **attributes: str) -> str:
    return sns.create_platform_application(
        Name=f"ios-{uuid.uuid4().hex[:8]}",
        Platform="APNS",
        Attributes={
            "PlatformCredential": p8_key(),
            "PlatformPrincipal": "ABCDE12345",
            "ApplePlatformTeamID": "TEAM123456",
            "ApplePlatformBundleID": "com.example.fanout",
            **attributes,
        },
    )["PlatformApplicationArn"]


def fcm_app(sns: Any, fcm_url: str, project: str, **attributes: str) -> str:
    path = Path(tempfile.mkdtemp()) / "sa.json"
    write_service_account_file(path, fcm_url + "/token", project)
    return sns.create_platform_application(
        Name=f"android-{uuid.uuid4().hex[:8]}",
        Platform="GCM",
        Attributes={"PlatformCredential": path.read_text(), **attributes},
    )["PlatformApplicationArn"]


def endpoint(sns: Any, app: str, token: str | None = None, **kw: Any) -> str:
    return sns.create_platform_endpoint(
        PlatformApplicationArn=app, Token=token or new_token(), **kw
    )["EndpointArn"]


def error_code(call: Callable[[], Any]) -> tuple[str, int, str]:
    with pytest.raises(ClientError) as info:
        call()
    err = info.value.response
    return err["Error"]["Code"], err["ResponseMetadata"]["HTTPStatusCode"], err["Error"]["Message"]


def wait_for(condition: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
    deadline = time.monotonic() + timeout
    delay = 0.02
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(delay)  # back-off between polls of a condition, bounded by the deadline
        delay = min(delay * 2, 0.25)


def apns_json(payload: dict) -> str:
    return json.dumps({"APNS": json.dumps(payload)})


def string_attrs(**values: str) -> dict[str, dict[str, str]]:
    return {k: {"DataType": "String", "StringValue": v} for k, v in values.items()}


# -- platform applications and endpoints -----------------------------------------------------------
def test_create_idempotent_create_and_the_conflicting_attributes_error(sns: Any) -> None:
    app = apns_app(sns)
    token = new_token()
    arn = endpoint(sns, app, token, CustomUserData="user-1")
    assert endpoint(sns, app, token, CustomUserData="user-1") == arn
    code, status, message = error_code(
        lambda: sns.create_platform_endpoint(
            PlatformApplicationArn=app, Token=token, CustomUserData="user-2"
        )
    )
    assert (code, status) == ("InvalidParameter", 400)
    assert message == (
        f"Invalid parameter: Token Reason: Endpoint {arn} already exists with the same Token, "
        "but different attributes."
    )
    with pytest.raises(sns.exceptions.InvalidParameterException):
        sns.create_platform_endpoint(PlatformApplicationArn=app, Token=token, CustomUserData="x")
    assert sns.get_endpoint_attributes(EndpointArn=arn)["Attributes"] == {
        "Enabled": "true",
        "Token": token,
        "CustomUserData": "user-1",
    }
    attributes = sns.get_platform_application_attributes(PlatformApplicationArn=app)["Attributes"]
    assert attributes["ApplePlatformBundleID"] == "com.example.fanout"
    assert "PlatformCredential" not in attributes
    listed = [
        a["PlatformApplicationArn"]
        for page in sns.get_paginator("list_platform_applications").paginate()
        for a in page["PlatformApplications"]
    ]
    assert app in listed


def test_list_endpoints_pages_through_250(sns: Any) -> None:
    app = apns_app(sns)
    created = [endpoint(sns, app) for _ in range(250)]
    first = sns.list_endpoints_by_platform_application(PlatformApplicationArn=app)
    assert len(first["Endpoints"]) == 100 and first["NextToken"]
    for arn in created[90:105]:  # deleted between pages: nothing after them is skipped
        sns.delete_endpoint(EndpointArn=arn)
    sns.delete_endpoint(EndpointArn=created[95])  # idempotent
    rest = [
        e["EndpointArn"]
        for page in sns.get_paginator("list_endpoints_by_platform_application").paginate(
            PlatformApplicationArn=app, PaginationConfig={"StartingToken": first["NextToken"]}
        )
        for e in page["Endpoints"]
    ]
    assert rest == created[105:]
    seen = [e["EndpointArn"] for e in first["Endpoints"]]
    assert seen == created[:100]


# -- delivery ---------------------------------------------------------------------------------------
def test_publish_reaches_the_apns_simulator_with_the_headers_sns_sets(
    sns: Any, urls: dict[str, str], ca: ssl.SSLContext, control: SnsControl
) -> None:
    app = apns_app(sns)
    token = new_token()
    arn = endpoint(sns, app, token)
    since = sim_next(urls["apns"], ca)
    answer = sns.publish(
        TargetArn=arn,
        MessageStructure="json",
        Message=apns_json({"aps": {"alert": "hi"}, "tenant_id": "t1", "notification_id": "n-1"}),
        MessageAttributes=string_attrs(
            **{"AWS.SNS.MOBILE.APNS.COLLAPSE_ID": "n-1", "AWS.SNS.MOBILE.APNS.TTL": "3600"}
        ),
    )
    rows = [r for r in sim_ledger(urls["apns"], ca, since) if r["token"] == token]
    assert len(rows) == 1
    row = rows[0]
    assert (row["status"], row["delivered"], row["collapse_id"]) == (200, True, "n-1")
    assert (row["apns_id"], row["tenant_id"], row["notification_id"]) == (
        answer["MessageId"],
        "t1",
        "n-1",
    )
    ours = [r for r in control.ledger()["rows"] if r["message_id"] == answer["MessageId"]]
    assert [(r["outcome"], r["status"], r["platform"], r["answer"]) for r in ours] == [
        ("delivered", 200, "APNS", None)
    ]


def test_publish_reaches_the_fcm_simulator_with_an_oauth_token(
    sns: Any, urls: dict[str, str], control: SnsControl
) -> None:
    project = f"sender-{uuid.uuid4().hex[:6]}"
    app = fcm_app(sns, urls["fcm"], project)
    token = f"fcm:{uuid.uuid4().hex}"
    arn = endpoint(sns, app, token)
    since = sim_next(urls["fcm"])
    message = {
        "fcmV1Message": {
            "message": {
                "data": {"tenant_id": "t2", "notification_id": "n-2"},
                "android": {"collapse_key": "n-2"},
            }
        }
    }
    fetched = control.health()["fcm_tokens_fetched"]
    for _ in range(3):
        sns.publish(
            TargetArn=arn, MessageStructure="json", Message=json.dumps({"GCM": json.dumps(message)})
        )
    rows = [r for r in sim_ledger(urls["fcm"], since=since) if r["token"] == token]
    assert [(r["status"], r["project"], r["collapse_id"], r["notification_id"]) for r in rows] == [
        (200, project, "n-2", "n-2")
    ] * 3
    # one access token for this service account, fetched from the simulator's token endpoint
    assert control.health()["fcm_tokens_fetched"] == fetched + 1


def test_a_dead_token_disables_the_endpoint_and_the_events_reach_sqs(
    sns: Any, sqs: Any, urls: dict[str, str], ca: ssl.SSLContext, control: SnsControl
) -> None:
    topic = sns.create_topic(Name=f"app-events-{uuid.uuid4().hex[:6]}")["TopicArn"]
    queue = sqs.create_queue(QueueName=f"app-events-{uuid.uuid4().hex[:6]}")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn)
    app = apns_app(sns, EventDeliveryFailure=topic, EventEndpointUpdated=topic)
    dead = new_token()
    arn = endpoint(sns, app, dead)
    httpx.post(urls["apns"] + "/_sim/tokens/unregistered", json={"tokens": [dead]}, verify=ca)
    first = sns.publish(TargetArn=arn, Message="you there?")  # AWS accepts it
    assert sns.get_endpoint_attributes(EndpointArn=arn)["Attributes"]["Enabled"] == "false"
    sent = sim_next(urls["apns"], ca)
    code, status, message = error_code(lambda: sns.publish(TargetArn=arn, Message="again"))
    assert (code, status, message) == ("EndpointDisabled", 400, "Endpoint is disabled")
    with pytest.raises(sns.exceptions.EndpointDisabledException):
        # A platform payload's ids: the ledger attributes even a refused publish.
        payload = {"aps": {"alert": "hi"}, "tenant_id": "t-9", "notification_id": "n-9"}
        sns.publish(
            TargetArn=arn,
            MessageStructure="json",
            Message=json.dumps({"default": "hi", "APNS": json.dumps(payload)}),
        )
    assert sim_next(urls["apns"], ca) == sent, "a disabled endpoint's publish reached APNs"
    outcomes = [
        (r["outcome"], r["status"], r["endpoint_disabled"], r["answer"], r["tenant_id"])
        for r in control.ledger()["rows"]
        if r["endpoint_arn"] == arn
    ]
    assert outcomes == [
        ("token_invalid", 410, True, None, None),
        ("endpoint_disabled", None, False, "EndpointDisabled", None),
        ("endpoint_disabled", None, False, "EndpointDisabled", "t-9"),
    ]

    events: dict[str, dict] = {}

    def both_events() -> bool:
        for m in sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, WaitTimeSeconds=1).get(
            "Messages", []
        ):
            envelope = json.loads(m["Body"])
            events[json.loads(envelope["Message"])["EventType"]] = envelope
        return {"DeliveryFailure", "EndpointUpdated"} <= set(events)

    wait_for(both_events, "the DeliveryFailure and EndpointUpdated events in SQS")
    failure = json.loads(events["DeliveryFailure"]["Message"])
    assert failure["EndpointArn"] == arn and failure["Resource"] == app
    assert failure["FailureType"] == "InvalidPlatformToken"
    assert failure["MessageId"] == first["MessageId"] and failure["Service"] == "SNS"
    updated = json.loads(events["EndpointUpdated"]["Message"])
    assert updated["EndpointArn"] == arn and updated["Attributes"] == {"Enabled": "false"}
    envelope = events["DeliveryFailure"]
    assert envelope["Type"] == "Notification" and envelope["TopicArn"] == topic
    assert envelope["Subject"].startswith("DeliveryFailure event for app ios-")
    # the envelope is signed as SNS signs (SignatureVersion 1, SHA1withRSA)
    pem = urllib.request.urlopen(envelope["SigningCertURL"], timeout=5).read()
    canonical = "".join(
        f"{k}\n{envelope[k]}\n"
        for k in ("Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type")
    )
    x509.load_pem_x509_certificate(pem).public_key().verify(
        base64.b64decode(envelope["Signature"]),
        canonical.encode(),
        padding.PKCS1v15(),
        hashes.SHA1(),
    )
    # re-enabled with a fresh token, it delivers again
    fresh = new_token()
    sns.set_endpoint_attributes(EndpointArn=arn, Attributes={"Token": fresh, "Enabled": "true"})
    sns.publish(TargetArn=arn, Message="welcome back")
    assert [r["status"] for r in sim_ledger(urls["apns"], ca, sent) if r["token"] == fresh] == [200]
    # The endpoint log tells who changed what: the API created it, SNS turned it off on the
    # provider's dead answer, the API turned it back on with the new token.
    changes = [
        (e["event"], e["by"], e["enabled"], e["changed"], e["token"])
        for e in control.endpoint_events()["rows"]
        if e["endpoint_arn"] == arn
    ]
    assert changes == [
        ("created", "api", True, {}, dead),
        ("updated", "sns", False, {"Enabled": "false"}, dead),
        ("updated", "api", True, {"Token": fresh, "Enabled": "true"}, fresh),
    ]


def test_fcm_unregistered_disables_the_endpoint(
    sns: Any, urls: dict[str, str], control: SnsControl
) -> None:
    app = fcm_app(sns, urls["fcm"], "sender-dead")
    token = f"fcm:{uuid.uuid4().hex}"
    arn = endpoint(sns, app, token)
    httpx.post(urls["fcm"] + "/_sim/tokens/unregistered", json={"tokens": [token]})
    sns.publish(TargetArn=arn, Message="hello")
    assert sns.get_endpoint_attributes(EndpointArn=arn)["Attributes"]["Enabled"] == "false"
    assert error_code(lambda: sns.publish(TargetArn=arn, Message="x"))[0] == "EndpointDisabled"
    rows = [r for r in control.ledger()["rows"] if r["endpoint_arn"] == arn]
    assert (rows[0]["outcome"], rows[0]["status"], rows[0]["reason"]) == (
        "token_invalid",
        404,
        "UNREGISTERED",
    )


def test_provider_throttling_is_an_sdk_retried_throttling_error(
    sns: Any, urls: dict[str, str], ca: ssl.SSLContext, control: SnsControl
) -> None:
    app = apns_app(sns)
    token = new_token()
    arn = endpoint(sns, app, token)
    httpx.post(
        urls["apns"] + "/_sim/faults",
        json={"fault": "status", "params": {"status": 429, "retry_after": 3, "tokens": [token]}},
        verify=ca,
    ).raise_for_status()
    raw = httpx.post(
        urls["sns"] + "/", data={"Action": "Publish", "TargetArn": arn, "Message": "m"}
    )
    assert raw.status_code == 400 and raw.headers["retry-after"] == "3"
    assert "<Code>Throttling</Code>" in raw.text and "<Type>Sender</Type>" in raw.text
    since = sim_next(urls["apns"], ca)
    retrying = client(urls["sns"], attempts=3, mode="standard")
    with pytest.raises(ClientError) as info:
        retrying.publish(TargetArn=arn, Message="m")
    response = info.value.response
    assert (response["Error"]["Code"], response["Error"]["Message"]) == (
        "Throttling",
        "Rate exceeded",
    )
    assert response["ResponseMetadata"]["RetryAttempts"] == 2
    rows = [r for r in sim_ledger(urls["apns"], ca, since) if r["token"] == token]
    assert [r["status"] for r in rows] == [429, 429, 429], "the SDK retried Throttling twice"
    assert sns.get_endpoint_attributes(EndpointArn=arn)["Attributes"]["Enabled"] == "true"


def test_provider_5xx_is_internal_error_and_503_service_unavailable(
    sns: Any, urls: dict[str, str], ca: ssl.SSLContext
) -> None:
    app = apns_app(sns)
    token_500, token_503 = new_token(), new_token()
    arn_500, arn_503 = endpoint(sns, app, token_500), endpoint(sns, app, token_503)
    for status, token in ((500, token_500), (503, token_503)):
        httpx.post(
            urls["apns"] + "/_sim/faults",
            json={"fault": "status", "params": {"status": status, "tokens": [token]}},
            verify=ca,
        ).raise_for_status()
    assert error_code(lambda: sns.publish(TargetArn=arn_500, Message="m"))[:2] == (
        "InternalError",
        500,
    )
    assert error_code(lambda: sns.publish(TargetArn=arn_503, Message="m"))[:2] == (
        "ServiceUnavailable",
        503,
    )


def test_a_goaway_loses_and_doubles_nothing(
    sns: Any, urls: dict[str, str], ca: ssl.SSLContext, control: SnsControl
) -> None:
    app = apns_app(sns)
    tokens = [new_token() for _ in range(60)]
    arns = [endpoint(sns, app, t) for t in tokens]
    httpx.post(
        urls["apns"] + "/_sim/faults",
        json={"fault": "goaway", "params": {"after_streams": 4}},
        verify=ca,
    ).raise_for_status()
    since = sim_next(urls["apns"], ca)
    opened = control.health()["connections_opened"]["apns"]
    # 8 publishers at once: streams go out on a connection after its GOAWAY's last stream id,
    # are refused, and must be sent again on a fresh connection, once
    with ThreadPoolExecutor(8) as pool:
        ids = list(pool.map(lambda arn: sns.publish(TargetArn=arn, Message="m")["MessageId"], arns))
    rows = [r for r in sim_ledger(urls["apns"], ca, since) if r["token"] in set(tokens)]
    assert sorted(r["token"] for r in rows) == sorted(tokens)
    assert sorted(r["apns_id"] for r in rows) == sorted(ids)
    assert all(r["status"] == 200 for r in rows)
    assert control.health()["connections_opened"]["apns"] - opened >= 60 // 4 - 2


def test_connections_persist_across_publishes(
    sns: Any, urls: dict[str, str], control: SnsControl
) -> None:
    app = apns_app(sns)
    arn = endpoint(sns, app)
    before = control.health()["connections_opened"]["apns"]
    for _ in range(40):
        sns.publish(TargetArn=arn, Message="m")
    assert control.health()["connections_opened"]["apns"] - before <= 2


# -- the SNS throttle fault --------------------------------------------------------------------------
def test_throttle_fault_answers_throttling_and_sends_nothing(
    sns: Any, urls: dict[str, str], ca: ssl.SSLContext, control: SnsControl
) -> None:
    app = apns_app(sns)
    other = apns_app(sns)
    arn, other_arn = endpoint(sns, app), endpoint(sns, other)
    fault = control.throttle(p=1.0, targets=[app])
    sent = sim_next(urls["apns"], ca)
    assert error_code(lambda: sns.publish(TargetArn=arn, Message="m"))[:2] == ("Throttling", 400)
    sns.publish(TargetArn=other_arn, Message="m")  # another application is not throttled
    assert sim_next(urls["apns"], ca) == sent + 1
    rows = [r for r in control.ledger()["rows"] if r["endpoint_arn"] == arn]
    assert [(r["outcome"], r["fault"], r["answer"]) for r in rows] == [
        ("sns_throttled", fault["id"], "Throttling")
    ]
    control.stop(fault["id"])
    sns.publish(TargetArn=arn, Message="m")
    # one publish a second (the bucket's exact arithmetic is unit-tested with a fake clock):
    # even at 300 ms a publish on a busy machine, at least 3 of 10 are throttled
    rate = control.throttle(rate=1, targets=[app])
    outcomes = []
    for _ in range(10):
        try:
            sns.publish(TargetArn=arn, Message="m")
            outcomes.append("ok")
        except ClientError as exc:
            outcomes.append(exc.response["Error"]["Code"])
    assert outcomes[0] == "ok" and outcomes.count("Throttling") >= 3, outcomes
    log = {w["id"]: w for w in control.fault_log()}
    assert log[fault["id"]]["stopped_at"] is not None and log[rate["id"]]["stopped_at"] is None


# -- error codes ----------------------------------------------------------------------------------
def test_error_codes(sns: Any, urls: dict[str, str]) -> None:
    app = apns_app(sns)
    arn = endpoint(sns, app)
    gone = arn[: -len("0000")] + "0000"
    assert error_code(lambda: sns.get_endpoint_attributes(EndpointArn=gone)) == (
        "NotFound",
        404,
        "Endpoint does not exist",
    )
    with pytest.raises(sns.exceptions.NotFoundException):
        sns.get_platform_application_attributes(PlatformApplicationArn=app + "x")
    code, status, message = error_code(lambda: sns.publish(TargetArn=gone, Message="m"))
    assert (code, status) == ("InvalidParameter", 400) and "No endpoint found" in message
    foreign = arn.replace(":000000000000:", ":123456789012:")
    assert error_code(lambda: sns.publish(TargetArn=foreign, Message="m"))[:2] == (
        "AuthorizationError",
        403,
    )
    with pytest.raises(sns.exceptions.InvalidParameterValueException) as bad_attribute:
        sns.publish(
            TargetArn=arn,
            Message="m",
            MessageAttributes={"n": {"DataType": "Number", "StringValue": "ten"}},
        )
    assert bad_attribute.value.response["Error"]["Code"] == "ParameterValueInvalid"
    assert error_code(lambda: sns.publish(TargetArn=arn, Message="{", MessageStructure="json")) == (
        "InvalidParameter",
        400,
        "Invalid parameter: Message Structure - JSON message body failed to parse",
    )
    assert (
        error_code(
            lambda: sns.publish(
                TargetArn=arn, MessageStructure="json", Message=json.dumps({"GCM": "{}"})
            )
        )[2]
        == "Invalid parameter: Message Structure - No default entry in JSON message body"
    )
    assert (
        error_code(
            lambda: sns.create_platform_application(
                Name="x", Platform="GCM", Attributes={"PlatformCredential": "legacy-key"}
            )
        )[0]
        == "InvalidParameter"
    )
    unknown = httpx.post(urls["sns"] + "/", data={"Action": "Frobnicate"})
    assert unknown.status_code == 400 and "<Code>InvalidAction</Code>" in unknown.text
    missing = httpx.post(urls["sns"] + "/", data={"Action": "Publish", "TargetArn": arn})
    assert missing.status_code == 400 and "<Code>ValidationError</Code>" in missing.text


# -- SMS ----------------------------------------------------------------------------------------------
def test_sms_ledger_attributes_and_opt_out(sns: Any, control: SnsControl) -> None:
    number = f"+1555{uuid.uuid4().int % 10**7:07d}"
    sns.set_sms_attributes(
        attributes={"DefaultSMSType": "Transactional", "DefaultSenderID": "Fanout"}
    )
    assert sns.get_sms_attributes(attributes=["DefaultSMSType"])["attributes"] == {
        "DefaultSMSType": "Transactional"
    }
    since = control.sms()["next"]
    sent = sns.publish(
        PhoneNumber=number,
        Message="Your code is 123456",
        MessageAttributes=string_attrs(
            **{"AWS.SNS.SMS.SenderID": "MyApp", "tenant_id": "t3", "notification_id": "n-3"}
        ),
    )
    assert error_code(lambda: sns.publish(PhoneNumber="555-0100", Message="x")) == (
        "InvalidParameter",
        400,
        "Invalid parameter: PhoneNumber Reason: 555-0100 is not valid to publish to",
    )
    bad_type = string_attrs(**{"AWS.SNS.SMS.SMSType": "Bulk"})
    with pytest.raises(sns.exceptions.InvalidParameterValueException):
        sns.publish(PhoneNumber=number, Message="x", MessageAttributes=bad_type)
    assert not sns.check_if_phone_number_is_opted_out(phoneNumber=number)["isOptedOut"]
    assert control.reply(number, "stop") == {"optedOut": True}
    assert sns.check_if_phone_number_is_opted_out(phoneNumber=number)["isOptedOut"]
    listed = [
        n
        for page in sns.get_paginator("list_phone_numbers_opted_out").paginate()
        for n in page["phoneNumbers"]
    ]
    assert number in listed
    blocked = sns.publish(PhoneNumber=number, Message="Your code is 654321")
    rows = control.sms(since)["rows"]
    assert [
        (r["message_id"], r["token"], r["delivered"], r["status"], r["reason"], r["sms_type"])
        for r in rows
    ] == [
        (sent["MessageId"], number, True, 200, None, "Transactional"),
        (blocked["MessageId"], number, False, 400, "OPTED_OUT", "Transactional"),
    ]
    assert (rows[0]["sender_id"], rows[0]["tenant_id"], rows[0]["message"]) == (
        "MyApp",
        "t3",
        "Your code is 123456",
    )
    sns.opt_in_phone_number(phoneNumber=number)
    assert not sns.check_if_phone_number_is_opted_out(phoneNumber=number)["isOptedOut"]
    control.reply(number, "STOP")
    assert "30 days" in error_code(lambda: sns.opt_in_phone_number(phoneNumber=number))[2]
    throttle = control.throttle(p=1.0, targets=["sms"])
    assert error_code(lambda: sns.check_if_phone_number_is_opted_out(phoneNumber=number))[:2] == (
        "Throttled",
        429,
    )
    with pytest.raises(sns.exceptions.ThrottledException):
        sns.list_phone_numbers_opted_out()
    control.stop(throttle["id"])


def test_many_numbers_opt_out_in_one_control_call(sns: Any, control: SnsControl) -> None:
    """The harness's population: numbers that replied STOP before the run, told in one call;
    a bad number refuses the whole call and changes nothing."""
    numbers = [f"+1555{uuid.uuid4().int % 10**7:07d}" for _ in range(3)]
    with pytest.raises(SnsControlError, match="400"):
        control.opt_out([numbers[0], "555-0100"])
    assert not sns.check_if_phone_number_is_opted_out(phoneNumber=numbers[0])["isOptedOut"]
    assert control.opt_out(numbers[:2]) == 2
    assert control.opt_out(numbers[:2]) == 0  # already opted out: nothing new
    assert [
        sns.check_if_phone_number_is_opted_out(phoneNumber=n)["isOptedOut"] for n in numbers
    ] == [True, True, False]


def test_topic_publish_reaches_a_raw_and_an_enveloped_subscription(sns: Any, sqs: Any) -> None:
    topic = sns.create_topic(Name=f"news-{uuid.uuid4().hex[:6]}")["TopicArn"]
    assert sns.create_topic(Name=topic.rsplit(":", 1)[1])["TopicArn"] == topic
    queues = {}
    for kind in ("raw", "env"):
        url = sqs.create_queue(QueueName=f"{kind}-{uuid.uuid4().hex[:6]}")["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        attributes = {"RawMessageDelivery": "true"} if kind == "raw" else {}
        sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn, Attributes=attributes)
        queues[kind] = url
    sent = sns.publish(
        TopicArn=topic,
        Message=json.dumps({"default": "hello", "sqs": "hello sqs"}),
        MessageStructure="json",
        Subject="greeting",
    )

    def one(url: str) -> dict:
        got = sqs.receive_message(
            QueueUrl=url, WaitTimeSeconds=2, MessageAttributeNames=["All"]
        ).get("Messages", [])
        return got[0] if got else {}

    raw = wait_for(lambda: one(queues["raw"]), "the raw delivery")
    assert raw["Body"] == "hello sqs"
    env = json.loads(wait_for(lambda: one(queues["env"]), "the enveloped delivery")["Body"])
    assert (env["Message"], env["MessageId"], env["Subject"]) == (
        "hello sqs",
        sent["MessageId"],
        "greeting",
    )
    subs = sns.list_subscriptions_by_topic(TopicArn=topic)["Subscriptions"]
    assert {s["Protocol"] for s in subs} == {"sqs"} and len(subs) == 2
    # there is no Lambda here to deliver to: refused, with the reason
    code, _, message = error_code(
        lambda: sns.subscribe(
            TopicArn=topic,
            Protocol="lambda",
            Endpoint="arn:aws:lambda:us-east-1:000000000000:function:f",
        )
    )
    assert code == "InvalidParameter" and "lambda is not delivered" in message


def test_harness_serve_sns_next_to_a_running_stack(
    stack: Stack, urls: dict[str, str], ca: ssl.SSLContext, tmp_path: Path
) -> None:
    stack_file = tmp_path / "stack.json"
    stack_file.write_text(stack.info.to_json())
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", "serve", "sns", "--port", str(port)],
        cwd=ROOT,
        env={**os.environ, "HARNESS_STACK_FILE": str(stack_file)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"

        def health() -> dict | None:
            try:
                return httpx.get(f"{url}/_sns/health", timeout=2).json()
            except httpx.HTTPError:
                return None

        # 90 s: under a full suite on 2 cores (load 16) the start took over 30.
        providers = wait_for(health, "harness serve sns to answer", timeout=90)["providers"]
        assert (providers["apns"], providers["fcm"], providers["sqs"]) == (
            urls["apns"],
            urls["fcm"],
            urls["sqs"],
        )
        own = client(url)
        token = new_token()
        arn = endpoint(own, apns_app(own), token)
        since = sim_next(urls["apns"], ca)
        own.publish(TargetArn=arn, Message="from harness serve")
        assert [
            r["status"] for r in sim_ledger(urls["apns"], ca, since) if r["token"] == token
        ] == [200]
    finally:
        proc.terminate()
        assert proc.wait(15) == 0


def test_created_and_deleted_events_and_deleting_an_application(
    sns: Any, sqs: Any, control: SnsControl
) -> None:
    topic = sns.create_topic(Name=f"lifecycle-{uuid.uuid4().hex[:6]}")["TopicArn"]
    queue = sqs.create_queue(QueueName=f"lifecycle-{uuid.uuid4().hex[:6]}")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    sns.subscribe(
        TopicArn=topic,
        Protocol="sqs",
        Endpoint=queue_arn,
        Attributes={"RawMessageDelivery": "true"},
    )
    app = apns_app(sns)
    sns.set_platform_application_attributes(
        PlatformApplicationArn=app,
        Attributes={"EventEndpointCreated": topic, "EventEndpointDeleted": topic},
    )
    arn = endpoint(sns, app)
    endpoint(sns, app, sns.get_endpoint_attributes(EndpointArn=arn)["Attributes"]["Token"])
    sns.delete_endpoint(EndpointArn=arn)
    seen: list[tuple[str, str]] = []

    def two_events() -> bool:
        for m in sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, WaitTimeSeconds=1).get(
            "Messages", []
        ):
            event = json.loads(m["Body"])
            seen.append((event["EventType"], event["EndpointArn"]))
        return len(seen) >= 2

    wait_for(two_events, "the EndpointCreated and EndpointDeleted events")
    # the repeated (idempotent) create announced nothing
    assert sorted(seen) == [("EndpointCreated", arn), ("EndpointDeleted", arn)]
    wait_for(lambda: control.health()["pending_deliveries"] == 0, "no delivery in flight")
    to_topic = [r for r in control.deliveries()["rows"] if r["topic_arn"] == topic]
    assert [(r["event_type"], r["delivered"]) for r in to_topic] == [
        ("EndpointCreated", True),
        ("EndpointDeleted", True),
    ]
    kept = endpoint(sns, app)
    sns.delete_platform_application(PlatformApplicationArn=app)
    assert error_code(lambda: sns.get_platform_application_attributes(PlatformApplicationArn=app))[
        :2
    ] == ("NotFound", 404)
    assert error_code(lambda: sns.get_endpoint_attributes(EndpointArn=kept))[0] == "NotFound"
