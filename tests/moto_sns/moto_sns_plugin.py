"""pytest plugin loaded (``-p moto_sns_plugin``) into the run of moto's own SNS tests that
``tests/moto_sns/run.py`` starts against our SNS endpoint (and our SQS endpoint behind it).

* ``moto.mock_aws`` becomes a stand-in that mocks nothing (``moto_plugin.install``, shared with
  the SQS runner's plugin): boto3 reaches our endpoints through ``AWS_ENDPOINT_URL_SNS`` /
  ``AWS_ENDPOINT_URL_SQS``, and our SNS and SQS endpoints are reset when a mocked test starts, so
  each test sees an empty account as under moto.
* Tests that do not apply to an SNS endpoint are skipped with the reason
  (:data:`NOT_APPLICABLE`).
"""

from __future__ import annotations

import pytest
from moto_plugin import install, skip_not_applicable

install()  # now, at -p's import: before any test module imports mock_aws from moto

_CONFIG = (
    "reads the topics through AWS Config, which moto's server answers from moto's own SNS "
    "backend; our endpoint's topics are not in it (an SNS endpoint is not AWS Config)"
)
# node id (relative to moto's checkout) -> why it does not apply to an SNS endpoint
NOT_APPLICABLE: dict[str, str] = {
    "tests/test_sns/test_topics.py::test_list_config_service_resources": _CONFIG,
    "tests/test_sns/test_topics.py::test_get_config_resource": _CONFIG,
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_not_applicable(items, NOT_APPLICABLE)
