"""The redrive checker over hand-made histories: the redrive policy SQS states for each
delivery queue, and the receive counts of the copies the SQS endpoint handed out."""

from __future__ import annotations

import json

import pytest

from harness.checkers import redrive
from harness.model.history import History

ARN = "arn:aws:sqs:us-east-1:000000000000:"


def _history(max_receive_count=3, target="fanout-push-dlq", counts=(1, 2, 3)):
    history = History()
    history.append("queue_policy", detail=json.dumps({
        "queue": "fanout-push", "dead": "fanout-push-dlq",
        "dead_letter_target": ARN + target if target else None,
        "max_receive_count": max_receive_count,
    }))  # fmt: skip
    for i, n in enumerate(counts):
        history.append("receive", detail=json.dumps(
            {"queue": "fanout-push", "message_id": f"m{i}", "receive_count": n}))  # fmt: skip
    return history.frame()


def test_a_redrive_to_the_dlq_after_three_receives_passes():
    verdict = redrive.check(_history(), 3)
    assert verdict.valid, verdict.counts
    assert verdict.counts == {"queues": 1, "no_redrive": 0, "wrong_max_receives": 0,
                              "copies": 3, "copies_past_redrive": 0}  # fmt: skip


@pytest.mark.parametrize(
    ("history", "count"),
    [
        (_history(max_receive_count=10), "wrong_max_receives"),
        (_history(target=None), "no_redrive"),
        (_history(target="fanout-email-dlq"), "no_redrive"),
        (_history(counts=(1, 4)), "copies_past_redrive"),
    ],
)
def test_each_way_a_redrive_goes_wrong_is_caught(history, count):
    verdict = redrive.check(history, 3)
    assert verdict.valid is False and verdict.counts[count] == 1


def test_no_policy_read_is_unknown_never_pass():
    assert redrive.check(History().frame(), 3).valid is None
