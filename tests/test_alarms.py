"""Threshold alarms: one event per crossing, per metric."""

from __future__ import annotations

import json

import pytest

from harness.model.history import History
from harness.run.alarms import DLQ_DEPTH_THRESHOLD, ThresholdAlarm
from harness.run.runner import QueueSampler


def test_each_crossing_is_one_event():
    alarm = ThresholdAlarm("dlq-depth", DLQ_DEPTH_THRESHOLD)
    samples = [0, 50, 100, 101, 150, 120, 100, 99, 101]
    events = [alarm.observe("push-dlq", v) for v in samples]
    assert events == [None, None, None, "ALARM", None, None, "OK", None, "ALARM"]


def test_metrics_keep_their_own_state():
    alarm = ThresholdAlarm("dlq-depth", 10)
    assert alarm.observe("a", 11) == "ALARM"
    assert alarm.observe("b", 5) is None
    assert alarm.observe("b", 12) == "ALARM"
    assert alarm.observe("a", 12) is None


@pytest.mark.integration
def test_the_run_records_a_dlq_over_100_as_an_alarm_event(stack):
    info = stack.info
    history = History()
    sampler = QueueSampler(info, history)
    sqs = info.aws_client("sqs")
    dlq = sqs.get_queue_url(QueueName=stack.reference_config().queue_name("push", "-dlq"))
    url = dlq["QueueUrl"]
    try:
        for start in range(0, 101, 10):
            entries = [
                {"Id": str(i), "MessageBody": "{}"} for i in range(start, min(101, start + 10))
            ]
            sqs.send_message_batch(QueueUrl=url, Entries=entries)
        sampler.sample()
        sampler.sample()
        _drain(sqs, url)
        sampler.sample()
    finally:
        _drain(sqs, url)
    frame = history.frame()
    alarms = frame[frame["kind"] == "alarm"]
    assert alarms["reason"].tolist() == ["ALARM", "OK"]
    assert json.loads(alarms["detail"].iloc[0])["depth"] == 101
    samples = frame[frame["kind"] == "sample"]
    assert len(samples) == 3 * len(sampler.queues)


def _drain(sqs, url: str) -> None:
    """Receive and delete until empty (PurgeQueue allows one call a minute, as on AWS)."""
    for _ in range(100):
        messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
        if not messages:
            return
        sqs.delete_message_batch(
            QueueUrl=url,
            Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)
            ],
        )
