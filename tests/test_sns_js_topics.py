"""The SNS endpoint's topics driven by a client that did not come from us: the AWS SDK for
JavaScript v3 (``@aws-sdk/client-sns`` from npm, pinned in package-lock.json) subscribes queues
with filter policies and publishes (one by one and by PublishBatch, standard and FIFO);
``tests/sns_js_topics.mjs`` does the SNS calls, this test makes the queues, runs it, and reads
what each queue got from the real SQS endpoint."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sns_topic_helpers import client, drain, queue
from test_sns_js_client import require_sdk

from harness.stack.supervisor import ROOT, Stack

pytestmark = pytest.mark.integration

SCRIPT = ROOT / "tests" / "sns_js_topics.mjs"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with Stack(tmp_path_factory.mktemp("sns-js-topics"), parts=["sqs", "sns"]) as up:
        yield up


def ids(sqs: Any, url: str) -> list[str]:
    return sorted(json.loads(m["Body"])["id"] for m in drain(sqs, url))


def test_filter_policies_and_publish_batch_through_the_javascript_sdk(stack: Stack) -> None:
    node = require_sdk()
    sqs = client(stack.info.url("sqs"), "sqs")
    queues = {
        kind: queue(sqs, fifo=kind == "fifo") for kind in ("all", "attributes", "body", "fifo")
    }
    config = {
        "sns": stack.info.url("sns"),
        "name": f"js-{uuid.uuid4().hex[:8]}",
        "queues": {kind: arn for kind, (_, arn) in queues.items()},
    }
    done = subprocess.run(
        [node, str(SCRIPT), json.dumps(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])

    assert ids(sqs, queues["all"][0]) == sorted(
        ["gold-150", "gold-50", "silver-500", "batch-platinum", "batch-bronze"]
    )
    assert ids(sqs, queues["attributes"][0]) == ["batch-platinum", "gold-150"]
    assert ids(sqs, queues["body"][0]) == ["batch-bronze", "gold-150", "silver-500"]
    assert seen["badPolicy"] == {
        "name": "InvalidParameterException",
        "status": 400,
        "message": "Invalid parameter: Attributes Reason: FilterPolicy: exists match pattern "
        "must be either true or false.",
    }
    assert (seen["batchSuccessful"], seen["batchFailed"]) == (["b1", "b2"], 0)
    assert (seen["tooMany"]["name"], seen["tooMany"]["status"]) == (
        "TooManyEntriesInBatchRequestException",
        400,
    )
    assert seen["notDistinct"]["name"] == "BatchEntryIdsNotDistinctException"
    sequence = [int(n) for n in seen["fifoSequence"]]
    assert sequence == sorted(sequence) and len(set(sequence)) == 3
    assert [m["Body"] for m in drain(sqs, queues["fifo"][0])] == ["f1", "f2", "f3"]
    assert seen["fifoNoGroup"]["message"] == (
        "Invalid parameter: The MessageGroupId parameter is required for FIFO topics"
    )
