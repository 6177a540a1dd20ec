"""pytest plugin loaded (``-p moto_sns_plugin``) into the run of moto's own SNS tests that
``tests/moto_sns/run.py`` starts against our SNS endpoint (and our SQS endpoint behind it).

* ``moto.mock_aws`` becomes a stand-in that mocks nothing: boto3 reaches our endpoints through
  ``AWS_ENDPOINT_URL_SNS`` / ``AWS_ENDPOINT_URL_SQS``. Like moto's own server mode
  (``ServerModeMockAWS``, which POSTs ``/moto-api/reset`` to its server), it resets our SNS and
  SQS endpoints when a mocked test starts, so each test sees an empty account as under moto.
* Tests that do not apply to an SNS endpoint are skipped with the reason
  (:data:`NOT_APPLICABLE`).

The module is imported by ``-p`` before any conftest or test module, so the names the tests
import from ``moto`` are already the stand-ins.
"""

from __future__ import annotations

import functools
import inspect
import os
import urllib.request
from collections.abc import Callable
from typing import Any

import moto
import pytest

RESET_URLS_ENV = "MOTO_SNS_SUITE_RESET_URLS"  # space-separated URLs, each POSTed

_CONFIG = (
    "reads the topics through AWS Config, which moto's server answers from moto's own SNS "
    "backend; our endpoint's topics are not in it (an SNS endpoint is not AWS Config)"
)
# node id (relative to moto's checkout) -> why it does not apply to an SNS endpoint
NOT_APPLICABLE: dict[str, str] = {
    "tests/test_sns/test_topics.py::test_list_config_service_resources": _CONFIG,
    "tests/test_sns/test_topics.py::test_get_config_resource": _CONFIG,
}


def _reset_endpoints() -> None:
    for url in os.environ.get(RESET_URLS_ENV, "").split():
        request = urllib.request.Request(url, data=b"", method="POST")
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()


class NoMock:
    """What ``mock_aws`` returns here: a decorator and context manager that mocks nothing and
    resets our endpoints when a test starts (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, func: Any = None, *args: Any, **kwargs: Any) -> Any:
        if func is None:
            return self
        if inspect.isclass(func):  # a decorated class: its test methods run unmocked
            return func

        @functools.wraps(func)
        def wrapper(*f_args: Any, **f_kwargs: Any) -> Any:
            _reset_endpoints()
            return func(*f_args, **f_kwargs)

        return wrapper

    def __enter__(self) -> NoMock:
        _reset_endpoints()
        return self

    def __exit__(self, *exc: object) -> bool:
        return False

    def start(self, *args: Any, **kwargs: Any) -> None:
        _reset_endpoints()

    def stop(self, *args: Any, **kwargs: Any) -> None:
        pass


def mock_aws(func: Callable[..., Any] | None = None, config: Any = None) -> Any:
    mock = NoMock()
    return mock(func) if func is not None else mock


moto.mock_aws = mock_aws  # type: ignore[attr-defined]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        reason = NOT_APPLICABLE.get(item.nodeid)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=f"not applicable: {reason}"))
