"""Audit per copy: the SQS endpoint's receive log in the history, the consumers naming the copy
in every record, and the ``audit_per_copy`` checker (hand-made histories, one violation each)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.config import Config as BotoConfig

from emulators.sqs.faults import SqsFaultControl
from emulators.sqs.processes import EndpointProcess, start_ours
from harness.checkers import audit_per_copy
from harness.checkers.registry import get
from harness.model.history import History
from harness.run.sqs_receives import collect_receives
from reference_impl.event_source import SqsPoller
from reference_impl.job_consumer import copy_identity

T = "t1"


def _receive(history: History, message_id: str, count: int, queue: str = "fanout-push") -> None:
    history.append(
        "receive",
        time=1000.0 + count,
        detail=json.dumps({"queue": queue, "message_id": message_id, "receive_count": count}),
    )


def _audit(
    history: History,
    outcome: str,
    message_id: str | None,
    count: int | None,
    **fields: Any,
) -> None:
    detail: dict[str, Any] = {"recipient_user_id": "u1", **fields}
    if message_id is not None:
        detail["sqs_message_id"] = message_id
    if count is not None:
        detail["receive_count"] = count
    history.append(
        "audit", tenant_id=T, notification_id="n1", reason=outcome, detail=json.dumps(detail)
    )


def _trail() -> History:
    """m1 handed out twice (sent on the first copy, deduped on the second, each for two
    devices), m2 once (denied consent); plus records that are not outcomes."""
    history = History()
    _receive(history, "m1", 1)
    _receive(history, "m1", 2)
    _receive(history, "m2", 1)
    _audit(history, "enqueued", None, None)  # the fan-out's: names no copy
    for count, outcome in ((1, "sent"), (2, "deduped")):
        for device in ("d1", "d2"):
            _audit(history, outcome, "m1", count, device_id=device, token_sha256=device * 8)
    _audit(history, "denied_consent", "m2", 1)
    _audit(history, "dlq", "m2", 1)  # accompanies an outcome, never one itself
    return history


def test_a_trail_with_one_outcome_per_copy_and_subject_passes():
    verdict = audit_per_copy.check(_trail().frame())
    assert verdict.valid, verdict
    assert verdict.counts["copies"] == verdict.counts["audited_copies"] == 3
    assert verdict.counts["redelivered_copies"] == 1
    assert verdict.counts["outcome_records"] == 5
    assert verdict.counts["unaudited_copies"] == verdict.counts["double_outcomes"] == 0


def test_a_copy_without_any_outcome_fails_unless_tolerated():
    history = _trail()
    _receive(history, "m2", 2)  # handed out again, and nothing says what became of it
    _audit(history, "dlq", "m2", 2)  # a marker alone does not settle a copy
    verdict = audit_per_copy.check(history.frame())
    assert not verdict.valid
    assert verdict.counts["unaudited_copies"] == verdict.counts["unaudited_redelivered_copies"] == 1
    (example,) = verdict.details["examples"]["unaudited_copies"]
    assert (example["message_id"], example["receive_count"]) == ("m2", 2)
    assert audit_per_copy.check(history.frame(), max_unaudited_copies=1).valid


def test_two_outcomes_for_one_device_of_one_copy_fail():
    history = _trail()
    _audit(history, "retry", "m1", 1, device_id="d1", token_sha256="d1" * 8)
    verdict = audit_per_copy.check(history.frame())
    assert not verdict.valid and verdict.counts["double_outcomes"] == 1
    (example,) = verdict.details["examples"]["double_outcomes"]
    assert example["subject"] == ["device", "d1"] and example["outcomes"] == ["sent", "retry"]


def test_two_job_outcomes_for_one_copy_fail_but_a_job_failure_beside_devices_does_not():
    history = _trail()
    _audit(history, "dedup_unavailable", "m1", 1)  # the job's own subject: not a double
    assert audit_per_copy.check(history.frame()).valid
    _audit(history, "deferred", "m2", 1)
    verdict = audit_per_copy.check(history.frame())
    assert not verdict.valid and verdict.counts["double_outcomes"] == 1


def test_a_record_naming_a_copy_never_handed_out_fails():
    history = _trail()
    _audit(history, "sent", "m9", 1, device_id="d1")
    verdict = audit_per_copy.check(history.frame())
    assert not verdict.valid and verdict.counts["unknown_copy_records"] == 1


def test_devices_are_read_from_the_decrypted_fields_and_unreadable_ones_never_double():
    history = History()
    _receive(history, "m1", 1)
    sealed = {"sealed": [{"kid": "k1", "iv": "x", "ct": "y"}]}
    for _ in range(2):
        history.append(
            "audit",
            tenant_id=T,
            notification_id="n1",
            reason="sent",
            detail=json.dumps(
                {
                    "sqs_message_id": "m1",
                    "receive_count": 1,
                    **sealed,
                    "decrypted": {"device_id": "d1"},
                }
            ),
        )
    assert audit_per_copy.check(history.frame()).counts["double_outcomes"] == 1
    destroyed = History()
    _receive(destroyed, "m1", 1)
    for _ in range(2):
        destroyed.append(
            "audit",
            tenant_id=T,
            notification_id="n1",
            reason="sent",
            detail=json.dumps(
                {"sqs_message_id": "m1", "receive_count": 1, **sealed, "key_destroyed": True}
            ),
        )
    verdict = audit_per_copy.check(destroyed.frame())
    assert verdict.valid and verdict.counts["audited_copies"] == 1


def test_without_a_receive_log_the_verdict_is_unknown_never_pass():
    history = History()
    _audit(history, "sent", "m1", 1, device_id="d1")
    verdict = audit_per_copy.check(history.frame())
    assert verdict.valid is None and "receive log" in verdict.details["unknown"]


def test_the_checker_registers_itself_with_its_tolerance():
    spec = get("audit_per_copy")
    assert spec.tolerances == {"max_unaudited_copies": 0}
    assert "audit_trail" in spec.needs


def test_copy_identity_comes_from_the_lambda_event_record():
    record = {"messageId": "m1", "attributes": {"ApproximateReceiveCount": "3"}}
    assert copy_identity(record) == {"sqs_message_id": "m1", "receive_count": 3}
    assert copy_identity({"messageId": "m1"}) == {"sqs_message_id": "m1"}  # never guessed


# -- against a real SQS endpoint --------------------------------------------------------------


@pytest.fixture(scope="module")
def endpoint() -> Iterator[EndpointProcess]:
    with start_ours() as running:
        yield running


@pytest.fixture
def sqs(endpoint: EndpointProcess) -> Any:
    return boto3.client(
        "sqs",
        endpoint_url=endpoint.url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=BotoConfig(retries={"total_max_attempts": 1}),
    )


@pytest.mark.integration
def test_the_receive_log_becomes_one_history_row_per_copy_of_the_named_queues(endpoint, sqs):
    names = [f"rq-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    urls = [sqs.create_queue(QueueName=n)["QueueUrl"] for n in names]
    sent = [
        sqs.send_message(QueueUrl=urls[0], MessageBody=f"job {i}")["MessageId"] for i in range(3)
    ]
    sqs.send_message(QueueUrl=urls[1], MessageBody="elsewhere")
    with SqsFaultControl(endpoint.url) as control:
        control.duplicate_delivery(p=1.0, queues=[names[0]])
        got = []
        for _ in range(20):  # bounded: every message twice (the fault leaves each visible)
            got += sqs.receive_message(
                QueueUrl=urls[0],
                MaxNumberOfMessages=10,
                VisibilityTimeout=30,
                AttributeNames=["ApproximateReceiveCount"],
            ).get("Messages", [])
            if len(got) >= 6:
                break
        control.stop_all()
    sqs.receive_message(QueueUrl=urls[1], MaxNumberOfMessages=10)
    history = History()
    # A page of 2 rows: the collector must follow ``next`` to the end of the log.
    added = collect_receives(endpoint.url, history, {names[0]}, page_size=2)
    rows = history.frame()
    assert added == len(rows) == len(got) >= 6
    details = [json.loads(d) for d in rows["detail"]]
    assert {d["queue"] for d in details} == {names[0]}
    assert sorted((d["message_id"], d["receive_count"]) for d in details) == sorted(
        (m["MessageId"], int(m["Attributes"]["ApproximateReceiveCount"])) for m in got
    )
    assert {d["message_id"] for d in details} == set(sent)
    assert (rows["kind"] == "receive").all() and rows["time"].notna().all()


@pytest.mark.integration
def test_the_poller_asks_sqs_for_the_receive_count_and_hands_it_to_the_handler(sqs):
    url = sqs.create_queue(QueueName=f"pq-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    message_id = sqs.send_message(QueueUrl=url, MessageBody="{}")["MessageId"]
    events: list[dict[str, Any]] = []

    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        events.append(event)
        return {"batchItemFailures": [{"itemIdentifier": r["messageId"]} for r in event["Records"]]}

    poller = SqsPoller(sqs, url, "arn:aws:sqs:us-east-1:000000000000:pq", handler, "test")
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"VisibilityTimeout": "0"})
    for _ in range(20):  # bounded: until the second receive of the message
        poller.poll_once()
        if len(events) >= 2:
            break
    identities = [copy_identity(e["Records"][0]) for e in events[:2]]
    assert identities == [
        {"sqs_message_id": message_id, "receive_count": 1},
        {"sqs_message_id": message_id, "receive_count": 2},
    ]
