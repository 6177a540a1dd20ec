"""The reference's SNS push transport (reference_impl/sns_push.py) against the real SNS endpoint,
APNs (TLS) and FCM simulators and SQS endpoint, started as the harness starts them; the
sns-throttle fault through the chaos catalogue; and the dead_tokens checker's SNS rule.

Whole runs on SNS (smoke, sns-throttle, a dead token never deactivated) are in
test_chaos_scenarios.py."""

from __future__ import annotations

import json
import ssl
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pandas as pd
import pytest
from botocore.exceptions import ClientError

from chaos.faults import ChaosTargets, make_fault
from harness.checkers.dead_tokens import check_sns
from harness.model.history import to_frame
from harness.stack.supervisor import Stack
from reference_impl.aws import client
from reference_impl.config import Config
from reference_impl.providers import fcm_project_for
from reference_impl.sns_push import (
    THROTTLE_PAUSE_SECONDS,
    EndpointRegistry,
    SnsPushClient,
    classify_error,
    provision_sns,
    publish_request,
)

PROJECTS = ("sender-a", "sender-b")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with Stack(tmp_path_factory.mktemp("sns-push"), parts=["sqs", "apns", "fcm", "sns"]) as up:
        yield up


@pytest.fixture(scope="module")
def config(stack: Stack) -> Config:
    prefix = f"t{uuid.uuid4().hex[:6]}"
    return Config.from_mapping(
        {
            "region": "us-east-1",
            "aws_access_key_id": "testing",
            "aws_secret_access_key": "testing",
            "sqs_endpoint": stack.info.url("sqs"),
            "sns_endpoint": stack.info.url("sns"),
            "fcm_url": stack.info.url("fcm"),
            "push_transport": "sns",
            "fcm_projects": list(PROJECTS),
            "queue_prefix": prefix,
            "sns_application_prefix": prefix,
            # the stack's signing key, as the reference's APNs application uses it
            **{
                k: v
                for k, v in stack.reference_values().items()
                if k in ("apns_key_file", "apns_key_id", "apns_team_id")
            },
        }
    )


@pytest.fixture(scope="module")
def applications(config: Config) -> dict[str, str]:
    return provision_sns(config, client(config, "sqs"))


@pytest.fixture(scope="module")
def ca(stack: Stack) -> ssl.SSLContext:
    assert stack.info.tls_ca
    return ssl.create_default_context(cafile=stack.info.tls_ca)


def ledger(url: str, ca: ssl.SSLContext | None = None) -> list[dict[str, Any]]:
    return httpx.get(f"{url}/_sim/ledger?since=0", verify=ca or True).json()["rows"]


def job(tenant: str = "t-1", nid: str | None = None) -> dict[str, Any]:
    return {"tenant_id": tenant, "notification_id": nid or uuid.uuid4().hex}


def test_provisioning_is_idempotent_and_makes_one_fcm_application_per_project(
    config: Config, applications: dict[str, str]
) -> None:
    prefix = config.sns_application_prefix
    assert set(applications) == {f"{prefix}-apns", *(f"{prefix}-fcm-{p}" for p in PROJECTS)}
    assert provision_sns(config, client(config, "sqs")) == applications


def test_a_device_is_registered_once_in_its_users_fcm_application_and_delivered(
    stack: Stack, config: Config, applications: dict[str, str]
) -> None:
    registry = EndpointRegistry(config)
    sns = client(config, "sns")
    for user in ("u000001", "u000002"):
        token = uuid.uuid4().hex
        arn = registry.register(user, token, "fcm")
        assert registry.register(user, token, "fcm") == arn  # idempotent
        project = fcm_project_for(user, PROJECTS)
        app = applications[f"{config.sns_application_prefix}-fcm-{project}"]
        listed = sns.list_endpoints_by_platform_application(PlatformApplicationArn=app)
        assert arn in [e["EndpointArn"] for e in listed["Endpoints"]]
        nid = uuid.uuid4().hex
        result, message_id = SnsPushClient(config).publish(
            arn, publish_request(job(nid=nid), "fcm", "hello", nid)
        )
        assert result.outcome == "sent" and message_id
        rows = [r for r in ledger(stack.info.url("fcm")) if r["token"] == token]
        # The simulator's ledger is the ground truth: the user's project, the ids, the collapse.
        assert [(r["project"], r["notification_id"], r["collapse_id"]) for r in rows] == [
            (project, nid, nid)
        ]


def test_a_dead_token_answers_endpoint_disabled_until_the_device_registers_again(
    stack: Stack, config: Config, applications: dict[str, str], ca: ssl.SSLContext
) -> None:
    registry, push = EndpointRegistry(config), SnsPushClient(config)
    token = uuid.uuid4().hex * 2
    arn = registry.register("u000007", token, "apns")
    apns = stack.info.url("apns")
    httpx.post(f"{apns}/_sim/tokens/unregistered", json={"tokens": [token]}, verify=ca)
    first, _ = push.publish(arn, publish_request(job(), "apns", "one", None))
    assert first.outcome == "sent"  # SNS accepts it; the provider's 410 turns the endpoint off
    second, message_id = push.publish(arn, publish_request(job(), "apns", "two", None))
    assert (second.outcome, second.reason, message_id) == ("dead_token", "EndpointDisabled", "")
    assert [r["status"] for r in ledger(apns, ca) if r["token"] == token] == [410]
    # The device registers the token again: the endpoint is turned on and SNS tries it again
    # (the simulator still calls it dead, so it answers 410 again and SNS turns it off again).
    assert registry.register("u000007", token, "apns") == arn
    attributes = client(config, "sns").get_endpoint_attributes(EndpointArn=arn)["Attributes"]
    assert attributes["Enabled"] == "true"
    third, _ = push.publish(arn, publish_request(job(), "apns", "three", None))
    assert third.outcome == "sent"
    assert [r["status"] for r in ledger(apns, ca) if r["token"] == token] == [410, 410]


def test_sns_throttling_from_the_fault_catalogue_is_retried_after_a_pause(
    stack: Stack, config: Config, applications: dict[str, str], ca: ssl.SSLContext
) -> None:
    arn = EndpointRegistry(config).register("u000003", uuid.uuid4().hex * 2, "apns")
    push = SnsPushClient(config)
    fault = make_fault("sns-throttle", {"p": 1.0, "seed": 1})
    targets = ChaosTargets(sns_url=stack.info.url("sns"))
    apns = stack.info.url("apns")
    before = len(ledger(apns, ca))
    fault.start(targets, None)
    try:
        result, _ = push.publish(arn, publish_request(job(), "apns", "x", None))
    finally:
        fault.stop(targets, None)
    assert (result.outcome, result.reason) == ("retry", "Throttling")
    assert result.retry_after == THROTTLE_PAUSE_SECONDS
    assert len(ledger(apns, ca)) == before, "a throttled publish reached APNs"
    again, _ = push.publish(arn, publish_request(job(), "apns", "x", None))
    assert again.outcome == "sent"


def test_the_sns_throttle_fault_needs_an_sns_endpoint() -> None:
    with pytest.raises(ValueError, match="no SNS endpoint"):
        make_fault("sns-throttle", {"p": 1.0}).start(ChaosTargets(), None)


def _error(code: str, status: int, retry_after: str | None = None, message: str = "") -> Any:
    headers = {"retry-after": retry_after} if retry_after else {}
    return ClientError(
        {
            "Error": {"Code": code, "Message": message},
            "ResponseMetadata": {"HTTPStatusCode": status, "HTTPHeaders": headers},
        },
        "Publish",
    )


def test_sns_errors_map_to_the_direct_paths_outcomes() -> None:
    assert classify_error(_error("EndpointDisabled", 400)).outcome == "dead_token"
    gone = _error("InvalidParameter", 400, message="No endpoint found for the target arn")
    assert classify_error(gone).outcome == "dead_token"
    provider_429 = classify_error(_error("Throttling", 400, "3"))
    assert (provider_429.outcome, provider_429.retry_after) == ("retry", 3.0)
    assert classify_error(_error("InternalError", 500)).retry_after is None
    assert classify_error(_error("ServiceUnavailable", 503, "2")).retry_after == 2.0
    assert classify_error(_error("InvalidParameter", 400, message="bad")).outcome == "rejected"


def test_publish_request_carries_ids_and_collapse_ids_per_platform() -> None:
    apns = publish_request(job("t", "n"), "apns", "text", "c1")
    body = json.loads(apns["Message"])
    assert json.loads(body["APNS"])["notification_id"] == "n"
    assert apns["MessageAttributes"]["AWS.SNS.MOBILE.APNS.COLLAPSE_ID"]["StringValue"] == "c1"
    fcm = json.loads(json.loads(publish_request(job("t", "n"), "fcm", "x", "c2")["Message"])["GCM"])
    message = fcm["fcmV1Message"]["message"]
    assert message["data"] == {"tenant_id": "t", "notification_id": "n"}
    assert message["android"]["collapse_key"] == "c2"


def _history(rows: list[dict[str, Any]]) -> pd.DataFrame:
    return to_frame([{"seq": i, "mono": 0.0, **r} for i, r in enumerate(rows)])


def _publish(t: float, tenant: str, answer: str | None, arn: str = "arn:e1") -> dict[str, Any]:
    return {"kind": "sns_publish", "time": t, "tenant_id": tenant, "reason": answer, "detail": arn}


def _change(t: float, by: str, state: str, arn: str = "arn:e1") -> dict[str, Any]:
    return {"kind": "sns_endpoint", "time": t, "provider": by, "reason": state, "detail": arn}


def test_dead_tokens_judges_publishes_after_sns_said_the_endpoint_is_off() -> None:
    rows = [
        _change(0.0, "api", "on"),
        _publish(1.0, "t0", None),
        _change(1.1, "sns", "off"),  # the provider's dead answer
        _publish(2.0, "t0", "EndpointDisabled"),  # how t0 learns: forgiven
        _publish(2.3, "t0", "EndpointDisabled"),  # in flight (within transit_s): forgiven
        _publish(2.1, "t1", "EndpointDisabled"),  # another tenant learns on its own
        _publish(5.0, "t0", "EndpointDisabled"),  # told 3 s ago: a violation
        _change(6.0, "api", "on"),  # registered again
        _publish(7.0, "t0", None),
        _change(8.0, "api", "off"),  # a caller turned it off: not SNS's doing
        _publish(9.0, "t0", "EndpointDisabled"),
        _publish(12.0, "t0", "EndpointDisabled"),
    ]
    counts, details = check_sns(_history(rows), transit_s=0.5)
    assert counts == {"endpoints_turned_off": 1, "publishes_to_disabled": 1}
    assert [e["time"] for e in details["sns_examples"]] == [5.0]
    assert check_sns(_history([{"kind": "provider", "time": 1.0}]), 0.5) == ({}, {})


def test_the_lean_publisher_answers_as_boto3_does(
    stack: Stack, config: Config, applications: dict[str, str], ca: ssl.SSLContext
) -> None:
    """The same publishes through the lean query-protocol client and through boto3: the same
    MessageId shape, the same error code, message and status, headers kept (Retry-After)."""
    from dataclasses import replace

    lean = SnsPushClient(config).sns
    boto = SnsPushClient(replace(config, aws_lean_client=False)).sns
    assert type(lean).__name__ == "LeanPublisher" and type(boto).__name__ == "SNS"
    token = uuid.uuid4().hex * 2
    arn = EndpointRegistry(config).register("u000011", token, "apns")
    nid = uuid.uuid4().hex
    request = publish_request(job(nid=nid), "apns", "héllo & <you>", "c-1")
    assert len(lean.publish(TargetArn=arn, **request)["MessageId"]) == 36
    rows = [r for r in ledger(stack.info.url("apns"), ca) if r["token"] == token]
    assert [(r["notification_id"], r["collapse_id"]) for r in rows] == [(nid, "c-1")]
    apns = stack.info.url("apns")
    httpx.post(f"{apns}/_sim/tokens/unregistered", json={"tokens": [token]}, verify=ca)
    lean.publish(TargetArn=arn, **request)  # accepted, then the 410 turns the endpoint off
    errors = []
    for publisher in (lean, boto):
        with pytest.raises(ClientError) as caught:
            publisher.publish(TargetArn=arn, **request)
        response = caught.value.response
        errors.append(
            (response["Error"]["Code"], response["Error"]["Message"],
             response["ResponseMetadata"]["HTTPStatusCode"])
        )  # fmt: skip
    assert errors[0] == errors[1] == ("EndpointDisabled", "Endpoint is disabled", 400)
    httpx.post(
        f"{apns}/_sim/faults",
        json={"fault": "status", "params": {"p": 1.0, "status": 429, "retry_after": 2}},
        verify=ca,
    )
    fresh = EndpointRegistry(config).register("u000011", uuid.uuid4().hex * 2, "apns")
    try:
        result, _ = SnsPushClient(config).publish(fresh, request)
    finally:
        httpx.delete(f"{apns}/_sim/faults", verify=ca)
    assert (result.outcome, result.reason, result.retry_after) == ("retry", "Throttling", 2.0)


def test_a_failure_event_overtaking_its_note_is_looked_at_again_by_age_not_receives() -> None:
    """SQS's duplicate delivery handed one delivery-failure event out five times in 6 ms, before
    the publisher's round had noted its MessageId: a receive count is no clock. The event is
    kept while it is young, whatever its receive count."""
    from reference_impl.push_consumer import FEEDBACK_PATIENCE_SECONDS, look_again

    now = 1_800_000_000.0

    def record(sent_ago: float | None, receives: int) -> dict[str, Any]:
        attributes = {"ApproximateReceiveCount": str(receives)}
        if sent_ago is not None:
            attributes["SentTimestamp"] = str(int((now - sent_ago) * 1000))
        return {"attributes": attributes}

    assert look_again(record(0.01, 5), now)
    assert look_again(record(FEEDBACK_PATIENCE_SECONDS - 1, 50), now)
    assert not look_again(record(FEEDBACK_PATIENCE_SECONDS + 1, 1), now)
    # A record that does not say when it was sent: a few receives, then it is dropped.
    assert look_again(record(None, 2), now)
    assert not look_again(record(None, 5), now)
