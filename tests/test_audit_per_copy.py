"""Audit per copy: the SQS endpoint's receive log in the history, the consumers naming the copy
in every record, and the ``audit_per_copy`` checker (hand-made histories, one violation each)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pandas as pd
import pytest
from botocore.config import Config as BotoConfig
from engines import engine  # noqa: F401 - the fixture, pandas and DuckDB
from hypothesis import given, settings
from hypothesis import strategies as st

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


@pytest.mark.usefixtures("engine")
def test_a_trail_with_one_outcome_per_copy_and_subject_passes():
    verdict = audit_per_copy.check(_trail().frame())
    assert verdict.valid, verdict
    assert verdict.counts["copies"] == verdict.counts["audited_copies"] == 3
    assert verdict.counts["redelivered_copies"] == 1
    assert verdict.counts["outcome_records"] == 5
    assert verdict.counts["unaudited_copies"] == verdict.counts["double_outcomes"] == 0


@pytest.mark.usefixtures("engine")
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


@pytest.mark.usefixtures("engine")
def test_two_outcomes_for_one_device_of_one_copy_fail():
    history = _trail()
    _audit(history, "retry", "m1", 1, device_id="d1", token_sha256="d1" * 8)
    verdict = audit_per_copy.check(history.frame())
    assert not verdict.valid and verdict.counts["double_outcomes"] == 1
    (example,) = verdict.details["examples"]["double_outcomes"]
    assert example["subject"] == ["device", "d1"] and example["outcomes"] == ["sent", "retry"]


@pytest.mark.usefixtures("engine")
def test_two_job_outcomes_for_one_copy_fail_but_a_job_failure_beside_devices_does_not():
    history = _trail()
    _audit(history, "dedup_unavailable", "m1", 1)  # the job's own subject: not a double
    assert audit_per_copy.check(history.frame()).valid
    _audit(history, "deferred", "m2", 1)
    verdict = audit_per_copy.check(history.frame())
    assert not verdict.valid and verdict.counts["double_outcomes"] == 1


@pytest.mark.usefixtures("engine")
def test_a_record_naming_a_copy_never_handed_out_fails():
    history = _trail()
    _audit(history, "sent", "m9", 1, device_id="d1")
    verdict = audit_per_copy.check(history.frame())
    assert not verdict.valid and verdict.counts["unknown_copy_records"] == 1


@pytest.mark.usefixtures("engine")
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


@pytest.mark.usefixtures("engine")
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


# -- the query against a record-by-record reading of the rule ------------------------------
# The checker is one DuckDB query (a million-delivery trail parsed in Python took gigabytes);
# this reads the module docstring's rule record by record, as the checker once did, and the
# query must count as it does over any trail, on both engines.


def _whole(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return None


def _reference(history: History) -> dict[str, int] | None:
    from collections import Counter

    from harness.checkers.audit_complete import record_detail

    frame = history.frame()
    receives = frame[frame["kind"] == "receive"]
    if receives.empty:
        return None
    handouts: Counter = Counter()
    for detail in map(record_detail, receives["detail"]):
        count = _whole(detail.get("receive_count"))
        if isinstance(detail.get("message_id"), str) and count is not None:
            handouts[(detail["message_id"], count)] += 1
    records: dict = {}
    unknown = outcome_records = 0
    audits = frame[frame["kind"] == "audit"]
    for row in audits[["seq", "reason", "detail"]].itertuples(index=False):
        if not isinstance(row.reason, str):
            continue
        detail = record_detail(row.detail)
        mid, count = detail.get("sqs_message_id"), _whole(detail.get("receive_count"))
        if not isinstance(mid, str) or not mid or count is None:
            continue
        outcome = row.reason
        if outcome in audit_per_copy.NOT_OUTCOMES:
            continue
        readable = detail.get("decrypted")
        fields = readable if isinstance(readable, dict) else detail
        named = next(
            (fields[f] for f in audit_per_copy.SUBJECT_FIELDS if isinstance(fields.get(f), str)),
            None,
        )
        if outcome in audit_per_copy.JOB_OUTCOMES:
            subject: tuple = ("job",)
        elif named is not None:
            subject = ("device", named)
        elif outcome in audit_per_copy.DEVICE_OUTCOMES or detail.get("key_destroyed"):
            subject = ("unreadable", row.seq)
        else:
            subject = ("job",)
        outcome_records += 1
        if (mid, count) not in handouts:
            unknown += 1
            continue
        records.setdefault((mid, count), Counter())[subject] += 1
    unaudited = [key for key in handouts if key not in records]
    copies = sum(handouts.values())
    return {
        "copies": copies,
        "audited_copies": copies - sum(handouts[k] for k in unaudited),
        "unaudited_copies": sum(handouts[k] for k in unaudited),
        "double_outcomes": sum(
            1 for key, subjects in records.items() for n in subjects.values() if n > handouts[key]
        ),
        "unknown_copy_records": unknown,
        "redelivered_copies": sum(n for key, n in handouts.items() if key[1] > 1),
        "unaudited_redelivered_copies": sum(handouts[k] for k in unaudited if k[1] > 1),
        "outcome_records": outcome_records,
    }


_OUTCOMES = sorted(
    audit_per_copy.DEVICE_OUTCOMES | audit_per_copy.JOB_OUTCOMES | audit_per_copy.NOT_OUTCOMES
) + ["novel_outcome"]
_IDS = st.sampled_from(["m1", "m2", "m3", ""])
_COUNTS = st.one_of(
    st.integers(1, 3), st.sampled_from([2.7, "2", " 3", "x", True, None, "1.0", -1])
)
_DEVICE_FIELDS = st.dictionaries(
    st.sampled_from(list(audit_per_copy.SUBJECT_FIELDS)),
    st.one_of(st.sampled_from(["d1", "d2"]), st.integers(0, 2), st.none()),
    max_size=2,
)
_AUDIT_DETAIL = st.fixed_dictionaries(
    {},
    optional={
        "sqs_message_id": st.one_of(_IDS, st.integers(0, 1)),
        "receive_count": _COUNTS,
        "decrypted": st.one_of(_DEVICE_FIELDS, st.sampled_from(["sealed", None])),
        "key_destroyed": st.sampled_from([True, False, 0, 1, "", "yes", [], [1], {}]),
        "device_id": st.sampled_from(["d1", "d3", 7]),
    },
)


def _detail_text(detail: Any, malformed: bool) -> str:
    return "not json {" if malformed else json.dumps(detail)


@settings(max_examples=200, deadline=None)
@given(
    receives=st.lists(st.tuples(_IDS, _COUNTS, st.booleans()), max_size=8),
    audits=st.lists(
        st.tuples(st.sampled_from([*_OUTCOMES, None]), _AUDIT_DETAIL, st.booleans()),
        max_size=14,
    ),
)
def test_the_query_counts_as_the_rule_read_record_by_record_on_both_engines(receives, audits):
    from harness.checkers.store import HistoryStore
    from harness.model.oracle import Expectation

    history = History()
    for i, (mid, count, malformed) in enumerate(receives):
        history.append(
            "receive",
            time=1000.0 + i,
            detail=_detail_text(
                {"queue": "q", "message_id": mid, "receive_count": count}, malformed and i % 3 == 0
            ),
        )
    for outcome, detail, malformed in audits:
        history.append(
            "audit",
            tenant_id=T,
            notification_id="n1",
            reason=outcome,
            detail=_detail_text(detail, malformed and len(detail) == 0),
        )
    reference = _reference(history)
    verdict = audit_per_copy.check(history.frame())
    if reference is None:
        assert verdict.valid is None
        return
    assert verdict.counts == reference
    expectation = Expectation(pd.DataFrame(columns=["tenant_id", "notification_id", "token"]))
    with HistoryStore.from_frame(history.frame(), expectation) as store:
        assert audit_per_copy.check_store(store).to_dict() == verdict.to_dict()
