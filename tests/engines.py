"""Run the checkers' own tests on both engines: pandas (the history in memory) and DuckDB (the
history written to Parquet and queried out of core, ``harness.checkers.store``).

A test module that judges histories with ``<checker>.check(...)`` uses the ``engine`` fixture
(``pytestmark = pytest.mark.usefixtures("engine")``): under ``duckdb`` each ported module's
``check`` is swapped for one that writes the same history to a store and calls the module's
``check_store`` with the same arguments, so every assertion of the test holds for both paths.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pandas as pd
import pytest

from harness.checkers import (
    audit_complete,
    audit_fields,
    audit_outcomes,
    audit_per_copy,
    backpressure,
    consent,
    dead_tokens,
    dlq_accountability,
    effectively_once,
    fail_closed,
    fcm_stickiness,
    push_order,
    quiet_hours,
    rate_limit,
    tenant_isolation,
)
from harness.checkers.store import HistoryStore
from harness.model.oracle import Expectation

ENGINES = ("pandas", "duckdb")
PORTED: tuple[ModuleType, ...] = (
    audit_complete,
    audit_fields,
    audit_outcomes,
    audit_per_copy,
    backpressure,
    consent,
    dead_tokens,
    dlq_accountability,
    effectively_once,
    fail_closed,
    fcm_stickiness,
    push_order,
    quiet_hours,
    rate_limit,
    tenant_isolation,
)


def on_store(check: Callable[..., Any], check_store: Callable[..., Any]) -> Callable[..., Any]:
    """``check``'s signature, run through ``check_store`` over a store of the same history."""
    signature = inspect.signature(check)

    def run(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        arguments = dict(bound.arguments)
        history: pd.DataFrame = arguments.pop("history")
        expectation = arguments.pop("expectation", None) or Expectation(
            pd.DataFrame(
                columns=["tenant_id", "notification_id", "token", "user_id", "quiet_until"]
            )
        )
        with HistoryStore.from_frame(history, expectation) as store:
            return check_store(store, **arguments)

    return run


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if request.param == "duckdb":
        for module in PORTED:
            if hasattr(module, "check_store"):
                monkeypatch.setattr(module, "check", on_store(module.check, module.check_store))
    yield request.param
