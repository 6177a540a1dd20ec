"""Run moto's own SNS test suite against our SNS endpoint, and judge the result.

    .venv/bin/python tests/moto_sns/run.py [--cache DIR] [--json PATH] [--timeout S] [-k EXPR]

This file holds what is the SNS run's own; ``tests/moto_suite/moto_runner.py`` (shared with
``tests/moto_sqs/run.py``) does the rest.

1. The suite comes from moto's source distribution on PyPI at the pinned version
   (``moto_runner.MOTO_VERSION``, checked against its sha256, the SQS run's pin): ``pip
   download`` it once into a git-ignored cache (``.cache/moto-sns/``) and extract
   ``tests/test_sns/`` and the test helpers it imports (``tests/__init__.py``,
   ``tests/conftest.py``, ``tests/markers.py``). Nothing of it is kept in this repository.
2. Our SNS endpoint starts on ``127.0.0.1:5000`` (where moto's server-mode suite finds its
   server) with moto's default account (123456789012), delivering ``sqs`` subscriptions to our
   SQS endpoint (same account, a free port); moto's own server answers every other service (STS
   for the ``account_id`` fixture), so nothing leaves the machine.
3. pytest runs the suite with ``moto_sns_plugin`` (``mock_aws`` mocks nothing; see there).
4. Each test's outcome is read from the JUnit XML. The run passes (exit 0) when every failure is
   one of :data:`MOTO_LENIENCY` (moto accepts or answers what AWS documents otherwise; the
   reason is given) and each of those still fails (a stale entry is an error too). Exit 1
   otherwise; exit 2 when the suite cannot be fetched, port 5000 is taken or an endpoint does
   not start.

Files of moto's ``tests/test_sns/`` not run, and why: ``test_server.py`` drives moto's own Flask
app in-process; ``test_sns_cloudformation.py`` tests moto's CloudFormation; ``test_utils.py``
unit-tests moto's own ``FilterPolicyMatcher`` class; ``test_http_message_verification.py`` runs
only in moto's decorator mode (it skips itself in server mode) and imports moto's
``tests/test_core``. Our HTTP delivery is tested by ``tests/test_sns_http.py``.
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

from emulators.sns.processes import start_sns  # noqa: E402
from emulators.sqs.processes import start_ours  # noqa: E402

SUITE_FILES = (
    "tests/test_sns/test_application.py",
    "tests/test_sns/test_publish_batch.py",
    "tests/test_sns/test_publishing.py",
    "tests/test_sns/test_subscriptions.py",
    "tests/test_sns/test_topics.py",
)
HELPER_FILES = (*moto_runner.HELPER_FILES, "tests/test_sns/__init__.py")

# Tests that fail because moto accepts or answers what AWS documents (or answers) otherwise. node
# id -> why. "Recorded": AWS's answer as LocalStack's AWS-validated snapshot tests
# (tests/aws/services/sns/*.snapshot.json) recorded it.
_A = "tests/test_sns/test_application.py::"
_B = "tests/test_sns/test_publish_batch.py::"
_P = "tests/test_sns/test_publishing.py::"
_S = "tests/test_sns/test_subscriptions.py::"
_T = "tests/test_sns/test_topics.py::"
_CREDENTIALS = (
    "creates a platform application with placeholder credentials, which moto accepts; SNS checks "
    "them (moto's own test_publish_to_deleted_platform_endpoint says AWS now answers 'Invalid "
    "parameter: Attributes Reason: Platform credentials are invalid'), and so does our endpoint, "
    "which signs real APNs tokens and FCM OAuth grants with them"
)
_PENDING = (
    "subscribes http://example.com and expects the subscription confirmed at once; SNS holds an "
    "HTTP/S subscription pending until the endpoint confirms it (Subscribe: 'the string \"pending "
    "confirmation\" if the subscription requires confirmation'; ListSubscriptions then shows "
    "PendingConfirmation, GetSubscriptionAttributes PendingConfirmation true), and our endpoint "
    "sends nothing to a non-loopback host, so nobody ever confirms it"
)
_OPAQUE_TOKEN = (
    "expects NextToken to be moto's list offset ('100'); SNS's NextToken is opaque ('Token to "
    "pass along to the next ... request'), and ours survives deletions between pages"
)
_OPT_OUT = (
    "expects moto's invented opted-out numbers (any number ending in 99, a preset list); a "
    "number is opted out only when its owner replied STOP (CheckIfPhoneNumberIsOptedOut), and "
    "none has here"
)
_SMS_ATTRIBUTE = (
    "sets the SMS attribute 'test', which moto keeps; SetSMSAttributes takes the documented "
    "attributes only (recorded: 'InvalidAttribute is not a valid attribute')"
)
MOTO_LENIENCY: dict[str, str] = {
    **{
        _A + name: _CREDENTIALS
        for name in (
            "test_create_platform_application",
            "test_get_platform_application_attributes",
            "test_set_platform_application_attributes",
            "test_list_platform_applications",
            "test_delete_platform_application",
            "test_create_platform_endpoint",
            "test_create_duplicate_default_platform_endpoint",
            "test_create_duplicate_platform_endpoint_with_attrs",
            "test_get_list_endpoints_by_platform_application",
            "test_get_endpoint_attributes",
            "test_set_endpoint_attributes",
            "test_delete_endpoint",
            "test_publish_to_platform_endpoint",
            "test_publish_to_disabled_platform_endpoint",
            "test_publish_to_deleted_platform_endpoint",
            "test_delete_endpoints_of_delete_app",
        )
    },
    _A + "test_set_sms_attributes": _SMS_ATTRIBUTE,
    _A + "test_get_sms_attributes_filtered": _SMS_ATTRIBUTE,
    _B + "test_publish_with_upper_cased_message_attributes": (
        "uses the batch entry Id 'some id', which moto accepts; PublishBatchRequestEntry: 'can "
        "have up to 80 characters. The following characters are accepted: alphanumeric "
        "characters, hyphens(-), and underscores (_)' (recorded: InvalidBatchEntryId 'The Id of a "
        "batch entry in the batch request contains an impermissible character')"
    ),
    _P + "test_publish_to_sqs_bad": (
        "expects InvalidParameter for a message attribute without a value; SNS answers "
        'ParameterValueInvalid (InvalidParameterValueException; recorded: "The message attribute '
        "'attr1' must contain non-empty message attribute value for message attribute type "
        "'String'.\")"
    ),
    _P + "test_publish_bad_sms": (
        "expects moto's wording 'not meet the E164'; SNS answers 'Invalid parameter: PhoneNumber "
        "Reason: NAA+15551234567 is not valid to publish to' (recorded)"
    ),
    _P + "test_publish_large_subject": (
        "expects moto's wording 'Subject must be less than 100 characters'; SNS answers "
        "'Invalid parameter: Subject' (recorded for a subject it refuses)"
    ),
    _P + "test_publish_fifo_needs_group_id": (
        "expects SQS's wording 'The request must contain the parameter MessageGroupId'; SNS "
        "answers 'Invalid parameter: The MessageGroupId parameter is required for FIFO topics' "
        "(recorded), the words moto's own PublishBatch test expects"
    ),
    _P + "test_publish_with_message_structure_errors": (
        "expects moto's wording 'Message is not valid JSON.'; SNS answers 'Invalid parameter: "
        "Message Structure - JSON message body failed to parse' (recorded)"
    ),
    _S + "test_creating_subscription": _PENDING,
    _S + "test_unsubscribe_from_deleted_topic": _PENDING,
    _S + "test_subscribe_attributes": _PENDING,
    _S + "test_creating_subscription_with_attributes": _PENDING,
    _S + "test_set_subscription_attributes": _PENDING,
    _S + "test_subscription_paging": _OPAQUE_TOKEN,
    _T + "test_topic_paging": _OPAQUE_TOKEN,
    _S + "test_subscribe_invalid_filter_policy": (
        "expects SetSubscriptionAttributes' wording from Subscribe; SNS words a filter policy's "
        "faults from Subscribe as 'Invalid parameter: Attributes Reason: FilterPolicy: ...' "
        "(recorded), and AWS's parser position ('\\n at [Source: ...]') where moto writes '\\n "
        "at ...'"
    ),
    _S + "test_check_opted_out": _OPT_OUT,
    _S + "test_list_opted_out": _OPT_OUT,
    _S + "test_opt_in": _OPT_OUT,
    _S + "test_confirm_subscription": (
        "confirms with a token SNS never sent, which moto accepts; ConfirmSubscription: 'validating "
        "the token sent to the endpoint by an earlier Subscribe action' (recorded for an unknown "
        "token: 'Invalid parameter: Token')"
    ),
    _T + "test_create_topic_in_multiple_regions": (
        "expects NotFound for a topic ARN of another region; SNS answers 'Invalid parameter: "
        "TopicArn' (recorded: cross-region GetTopicAttributes)"
    ),
    _T + "test_topic_attributes": (
        "expects DeliveryPolicy '' on a new topic and moto's EffectiveDeliveryPolicy; SNS answers "
        "no DeliveryPolicy until one is set, and its effective policy is the HTTP one "
        '({"http": {"defaultHealthyRetryPolicy": ...}}) (GetTopicAttributes, recorded)'
    ),
    _T + "test_add_permission_errors": (
        "expects moto's wording 'Statement already exists'; SNS answers 'Invalid parameter: "
        "Statement already exists' (recorded)"
    ),
    _T + "test_create_fifo_topic": (
        "expects moto's wording 'Fifo Topic names must end with .fifo ...'; SNS answers "
        "'Invalid parameter: Topic Name' (recorded for every name it refuses)"
    ),
}


def start_endpoints(stack: ExitStack) -> Endpoints:
    """Our SQS endpoint (a free port), and our SNS endpoint on moto's server-mode port delivering
    to it, both in moto's account."""
    sqs = stack.enter_context(start_ours(account_id=MOTO_ACCOUNT_ID))
    sns = stack.enter_context(
        start_sns(
            port=SERVER_MODE_PORT,
            sqs_url=sqs.url,
            extra_args=["--account-id", MOTO_ACCOUNT_ID],
        )
    )
    return Endpoints(
        env={"AWS_ENDPOINT_URL_SNS": sns.url, "AWS_ENDPOINT_URL_SQS": sqs.url},
        reset_urls=[f"{sns.url}/_sns/reset", f"{sqs.url}/_sqs/reset"],
    )


SUITE = MotoSuite(
    "SNS", SUITE_FILES, MOTO_LENIENCY, start_endpoints, helper_files=HELPER_FILES, doc=__doc__ or ""
)

if __name__ == "__main__":
    sys.exit(moto_runner.main(SUITE))
