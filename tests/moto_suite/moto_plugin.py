"""What the pytest plugins loaded into runs of moto's own suites (``moto_sqs_plugin``,
``moto_sns_plugin``, which ``moto_runner.py`` starts against our endpoints) share.

* :func:`install` makes ``moto.mock_aws`` a stand-in that mocks nothing: boto3 reaches our
  endpoints through ``AWS_ENDPOINT_URL_<SERVICE>``. Like moto's own server mode
  (``ServerModeMockAWS``, which POSTs ``/moto-api/reset`` to its server), it resets our endpoints
  (each URL of :data:`RESET_URLS_ENV`) when a mocked test starts, so each test sees an empty
  account as it would under moto.
* :func:`skip_not_applicable` skips, with the reason, the tests a plugin names as not applying
  to our endpoints.

A plugin calls :func:`install` when ``-p`` imports it, before any conftest or test module, so the
names the tests import from ``moto`` are already the stand-ins.
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

RESET_URLS_ENV = "MOTO_SUITE_RESET_URLS"  # space-separated URLs, each POSTed


def reset_endpoints() -> None:
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
            reset_endpoints()
            return func(*f_args, **f_kwargs)

        return wrapper

    def __enter__(self) -> NoMock:
        reset_endpoints()
        return self

    def __exit__(self, *exc: object) -> bool:
        return False

    def start(self, *args: Any, **kwargs: Any) -> None:
        reset_endpoints()

    def stop(self, *args: Any, **kwargs: Any) -> None:
        pass


def mock_aws(func: Callable[..., Any] | None = None, config: Any = None) -> Any:
    mock = NoMock()
    return mock(func) if func is not None else mock


def install() -> None:
    """Replace ``moto.mock_aws`` with :func:`mock_aws`."""
    moto.mock_aws = mock_aws  # type: ignore[attr-defined]


def skip_not_applicable(items: list[pytest.Item], not_applicable: dict[str, str]) -> None:
    """Mark each collected test named in ``not_applicable`` (node id -> why) to be skipped."""
    for item in items:
        reason = not_applicable.get(item.nodeid)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=f"not applicable: {reason}"))
