"""Run moto's own SQS test suite against our SQS endpoint, and judge the result.

    .venv/bin/python tests/moto_sqs/run.py [--cache DIR] [--json PATH] [--timeout S] [-k EXPR]

This file holds what is the SQS run's own; ``tests/moto_suite/moto_runner.py`` (shared with
``tests/moto_sns/run.py``) does the rest.

1. The suite comes from moto's source distribution on PyPI at the pinned version
   (``moto_runner.MOTO_VERSION``, checked against its sha256): ``pip download`` it once into a
   git-ignored cache (``.cache/moto-sqs/``) and extract ``tests/test_sqs/`` and the test helpers
   it imports (``tests/__init__.py``, ``tests/conftest.py``, ``tests/markers.py``). Nothing of it
   is kept in this repository.
2. Our endpoint starts on ``127.0.0.1:5000`` with moto's default account (123456789012): in
   server mode (``TEST_SERVER_MODE=true``, the mode moto's suite has for an out-of-process
   server) the tests expect queue URLs under ``http://localhost:5000``. moto's own server serves
   every other service (STS for the ``account_id`` fixture), so nothing leaves the machine.
3. pytest runs the suite with ``moto_sqs_plugin`` (``mock_aws`` mocks nothing; see there).
4. Each test's outcome is read from the JUnit XML. The run passes (exit 0) when every failure is
   one of :data:`MOTO_LENIENCY` (moto accepts or answers what AWS's documentation says it does
   not; the reason is given) and each of those still fails (a stale entry is an error too).
   Exit 1 otherwise; exit 2 when the suite cannot be fetched, port 5000 is taken or an endpoint
   does not start.

Files of moto's ``tests/test_sqs/`` not run, and why: ``test_server.py`` drives moto's own
Flask app in-process; ``test_sqs_cloudformation.py`` tests moto's CloudFormation;
``test_sqs_integration.py`` needs moto's Lambda and Docker; ``test_sqs_authentication.py``
tests moto's IAM enforcement (decorator mode only).
"""

from __future__ import annotations

import sys
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for _path in (ROOT, ROOT / "tests" / "moto_suite"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import moto_runner  # noqa: E402
from moto_runner import MOTO_ACCOUNT_ID, SERVER_MODE_PORT, Endpoints, MotoSuite  # noqa: E402

from emulators.sqs.processes import start_ours  # noqa: E402

SUITE_FILES = (
    "tests/test_sqs/test_sqs.py",
    "tests/test_sqs/test_sqs_message_attributes.py",
    "tests/test_sqs/test_sqs_multiaccount.py",
)

# Tests that fail because moto accepts or answers what AWS's documentation says it does not
# (or, for the old receipt handles, where the documentation allows both answers). node id ->
# the documentation's word (API reference 2012-11-05, as botocore ships it).
_T = "tests/test_sqs/test_sqs.py::"
_UNKNOWN_ATTRIBUTE = (
    'creates the queue with the attribute name "VisibilityTimeout " (trailing space), which '
    "moto ignores; the attribute names are a fixed set (QueueAttributeName) and an unknown one "
    'is InvalidAttributeName (CreateQueue: "The specified attribute doesn\'t exist.")'
)
_OLD_HANDLE = (
    "uses a receipt handle from an earlier receive: DeleteMessage's reference says \"If you use "
    'an old ReceiptHandle, the request will succeed, but the message might not be deleted", and '
    "the endpoint keeps that reading (an old handle neither deletes nor changes the message; the "
    "harness's redelivery faults rely on it), where moto lets old handles act"
)
_HANDLE_MESSAGE = (
    'expects moto\'s wording "The input receipt handle is invalid."; SQS answers '
    'ReceiptHandleIsInvalid with \'The input receipt handle "<handle>" is not a valid receipt '
    "handle.' (the code, which the test also checks, is the same)"
)
MOTO_LENIENCY: dict[str, str] = {
    _T + "test_create_queue_with_different_attributes_fail": (
        'creates a queue with FifoQueue="tru", which moto takes for false; CreateQueue: '
        '"FifoQueue – Designates a queue as FIFO. Valid values are true and false."'
    ),
    _T + "test_message_retention_period": (
        'creates a queue with MessageRetentionPeriod=1; CreateQueue: "Valid values: An integer '
        'from 60 seconds (1 minute) to 1,209,600 seconds (14 days)."'
    ),
    _T + "test_get_queue_attributes": (
        "expects RedrivePolicy rendered by Python's json.dumps (with spaces); SQS returns it as "
        'compact JSON (GetQueueAttributes examples: "{\\"deadLetterTargetArn\\":\\"arn:...'
        '\\",\\"maxReceiveCount\\":1000}")'
    ),
    _T + "test_message_becomes_inflight_when_received": _UNKNOWN_ATTRIBUTE,
    _T + "test_receive_message_with_explicit_visibility_timeout": _UNKNOWN_ATTRIBUTE,
    _T + "test_change_message_visibility": _UNKNOWN_ATTRIBUTE,
    _T + "test_queue_length": _UNKNOWN_ATTRIBUTE,
    _T + "test_delete_batch_operation": _UNKNOWN_ATTRIBUTE,
    _T + "test_delete_message_after_visibility_timeout": _UNKNOWN_ATTRIBUTE,
    _T + "test_change_message_visibility_on_unknown_receipt_handle": _HANDLE_MESSAGE,
    _T + "test_delete_message_errors": _HANDLE_MESSAGE,
    _T + "test_change_message_visibility_on_old_message": _OLD_HANDLE,
    _T + "test_delete_message_using_old_receipt_handle": _OLD_HANDLE,
    _T + "test_batch_change_message_visibility_on_old_message": _OLD_HANDLE,
    _T + "test_message_delay_is_more_than_15_minutes": (
        "sends MessageDeduplicationId to a standard queue; SendMessageBatchRequestEntry: "
        '"This parameter applies only to FIFO (first-in-first-out) queues", and SQS refuses it '
        '("The request include parameter that is not valid for this queue type")'
    ),
}


def start_endpoints(stack: ExitStack) -> Endpoints:
    """Our SQS endpoint on moto's server-mode port, in moto's account."""
    ours = stack.enter_context(start_ours(port=SERVER_MODE_PORT, account_id=MOTO_ACCOUNT_ID))
    return Endpoints(
        env={"AWS_ENDPOINT_URL_SQS": f"http://localhost:{SERVER_MODE_PORT}"},
        reset_urls=[f"{ours.url}/_sqs/reset"],
    )


SUITE = MotoSuite("SQS", SUITE_FILES, MOTO_LENIENCY, start_endpoints, doc=__doc__ or "")

if __name__ == "__main__":
    sys.exit(moto_runner.main(SUITE))
