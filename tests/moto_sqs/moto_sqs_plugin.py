"""pytest plugin loaded (``-p moto_sqs_plugin``) into the run of moto's own SQS tests that
``tests/moto_sqs/run.py`` starts against our endpoint.

* ``moto.mock_aws`` becomes a stand-in that mocks nothing: boto3 reaches our endpoint through
  ``AWS_ENDPOINT_URL_SQS``. Like moto's own server mode (``ServerModeMockAWS``, which POSTs
  ``/moto-api/reset`` to its server), it resets the endpoint when a mocked test starts, so
  each test sees an empty account as it would under moto.
* Tests that do not apply to an SQS endpoint alone are skipped with the reason
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

RESET_URL_ENV = "MOTO_SQS_SUITE_RESET_URL"

# node id (relative to moto's checkout) -> why it does not apply to an SQS endpoint
NOT_APPLICABLE: dict[str, str] = {
    "tests/test_sqs/test_sqs_multiaccount.py::TestStsAssumeRole::"
    "test_list_queues_in_different_account": (
        "the second account's credentials come from moto's STS (AssumeRole); an SQS endpoint "
        "alone cannot know which account an STS-issued access key belongs to"
    ),
}


def _reset_endpoint() -> None:
    url = os.environ.get(RESET_URL_ENV)
    if not url:
        return
    request = urllib.request.Request(url, data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        response.read()


class NoMock:
    """What ``mock_aws`` returns here: a decorator and context manager that mocks nothing and
    resets our endpoint when a test starts (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, func: Any = None, *args: Any, **kwargs: Any) -> Any:
        if func is None:
            return self
        if inspect.isclass(func):  # a decorated TestCase: its test methods run unmocked
            return func

        @functools.wraps(func)
        def wrapper(*f_args: Any, **f_kwargs: Any) -> Any:
            _reset_endpoint()
            return func(*f_args, **f_kwargs)

        return wrapper

    def __enter__(self) -> NoMock:
        _reset_endpoint()
        return self

    def __exit__(self, *exc: object) -> bool:
        return False

    def start(self, *args: Any, **kwargs: Any) -> None:
        _reset_endpoint()

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
