"""The whole-run live-view benchmark's arithmetic (benchmarks/bench_live_run.py): a run's
deliveries, rate and CPU per delivery from its summary and history, and the live view's cost
against the run without it. The runs themselves are ``make bench``'s."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pandas as pd
import pytest

from harness.model.history import History

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location(
        "bench_live_run", ROOT / "benchmarks/bench_live_run.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _history(delivered_at: list[float], refused_at: list[float]):
    history = History()
    rows = [
        {"received_at": at, "tenant_id": "t", "notification_id": f"n{i}", "token": "k",
         "provider": "apns", "status": 200, "delivered": True}
        for i, at in enumerate(delivered_at)
    ] + [
        {"received_at": at, "tenant_id": "t", "notification_id": "r", "token": "k",
         "provider": "apns", "status": 429, "delivered": False, "retry_after": 1.0}
        for at in refused_at
    ]  # fmt: skip
    history.extend_provider(rows)
    history.append("inject", time=0.0, tenant_id="t", notification_id="n0")
    return history.frame()


def test_a_runs_figures_count_only_what_the_providers_accepted(bench):
    summary = {"verdict": "pass", "harness_cpu_s": 2.0}
    run = bench.figures(summary, _history([10.0, 11.0, 12.0, 14.0], [10.5, 30.0]))
    assert run["deliveries"] == 4
    assert run["deliveries_per_s"] == 1.0  # 4 over the 4 s from the first to the last
    assert run["harness_cpu_us_per_delivery"] == 500_000.0


def test_the_live_views_cost_is_its_extra_cpu_per_delivery(bench):
    base = {"harness_cpu_us_per_delivery": 100.0, "deliveries_per_s": 50.0}
    cheap = {"harness_cpu_us_per_delivery": 104.0, "deliveries_per_s": 49.0}
    dear = {"harness_cpu_us_per_delivery": 110.0, "deliveries_per_s": 50.0}
    assert bench.compare(cheap, base) == {
        "cost_fraction": 0.04, "under_limit": True, "rate_ratio": 0.98
    }  # fmt: skip
    assert bench.compare(dear, base)["under_limit"] is False
    nothing = {"harness_cpu_us_per_delivery": None, "deliveries_per_s": None}
    assert bench.compare(nothing, base)["under_limit"] is None


def test_the_live_views_own_cpu_is_replayed_over_every_row_of_the_history(bench):
    frame = _history([10.0, 11.0, 12.0, 14.0], [10.5, 30.0])
    history = History()
    history.extend_provider(
        [{"received_at": 31.0, "tenant_id": "t", "notification_id": "n0", "token": "k",
          "provider": "apns", "status": 200, "delivered": True}]  # n0 again, the last row
    )  # fmt: skip
    cpu, counts = bench.replayed_cpu_s(pd.concat([frame, history.frame()], ignore_index=True))
    assert cpu > 0
    assert counts["duplicates"] == 1  # the last batch was fed and judged
