"""pytest plugin loaded (``-p moto_sqs_plugin``) into the run of moto's own SQS tests that
``tests/moto_sqs/run.py`` starts against our endpoint.

* ``moto.mock_aws`` becomes a stand-in that mocks nothing (``moto_plugin.install``, shared with
  the SNS runner's plugin): boto3 reaches our endpoint through ``AWS_ENDPOINT_URL_SQS``, and the
  endpoint is reset when a mocked test starts, so each test sees an empty account as it would
  under moto.
* Tests that do not apply to an SQS endpoint alone are skipped with the reason
  (:data:`NOT_APPLICABLE`).
"""

from __future__ import annotations

import pytest
from moto_plugin import install, skip_not_applicable

install()  # now, at -p's import: before any test module imports mock_aws from moto

# node id (relative to moto's checkout) -> why it does not apply to an SQS endpoint
NOT_APPLICABLE: dict[str, str] = {
    "tests/test_sqs/test_sqs_multiaccount.py::TestStsAssumeRole::"
    "test_list_queues_in_different_account": (
        "the second account's credentials come from moto's STS (AssumeRole); an SQS endpoint "
        "alone cannot know which account an STS-issued access key belongs to"
    ),
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_not_applicable(items, NOT_APPLICABLE)
