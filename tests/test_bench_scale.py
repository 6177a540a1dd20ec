"""benchmarks/bench_scale.py's arithmetic: the growth exponent of each cost over the sizes, its
class in words, and which phase grows worst (a cost too small to matter is not ranked)."""

from __future__ import annotations

import math
import sys

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_scale  # noqa: E402

SIZES = [10_000, 100_000, 1_000_000]


@pytest.mark.parametrize(
    ("cost", "exponent", "grows"),
    [
        (lambda n: 5.0, 0.0, "constant"),
        (lambda n: n**0.5, 0.5, "sublinear"),
        (lambda n: 3e-4 * n, 1.0, "linear"),
        (lambda n: 1e-5 * n * math.log(n), None, "n log n"),
        (lambda n: 1e-9 * n**2, 2.0, "worse than n log n"),
    ],
)
def test_the_exponent_of_a_cost_is_its_log_log_slope(cost, exponent, grows):
    found = bench_scale.growth(SIZES, [cost(n) for n in SIZES])
    assert found is not None
    if exponent is not None:
        assert found == pytest.approx(exponent, abs=1e-9)
    assert bench_scale.growth_class(found) == grows


def test_too_few_points_have_no_exponent():
    assert bench_scale.growth([10_000], [3.0]) is None
    assert bench_scale.growth(SIZES, [0.0, 0.0, 4.0]) is None  # a zero cost is no point
    assert bench_scale.growth([5, 5], [1.0, 2.0]) is None  # one size twice: no slope
    assert bench_scale.growth_class(None) == "unknown"


def _run(n, judge, collect, tiny):
    return {
        "deliveries": n,
        "phase_seconds": {"judge": judge, "collect": collect, "report": tiny},
        "checker_seconds": {"effectively_once": judge / 2},
        "wall_s": judge + collect,
        "harness_cpu_s": judge,
        "harness_peak_rss_mb": 200 + n / 1e4,
        "parts": {"push-consumer": {"cpu_s": n / 500, "peak_rss_mb": 80}},
        "history_bytes": 100 * n,
        "report_bytes": 2e6,
    }


def test_the_worst_phase_is_the_steepest_that_costs_something():
    """judge grows as n^2, collect linearly; report grows fastest of all but stays under a
    second, so it is not ranked."""
    runs = [_run(n, 1e-9 * n**2, 1e-4 * n, 1e-18 * n**2.5) for n in SIZES]
    result = bench_scale.fit(runs)
    costs = result["costs"]
    assert costs["phase:judge"]["grows"] == "worse than n log n"
    assert costs["phase:collect"]["grows"] == "linear"
    assert costs["phase:report"]["exponent"] > costs["phase:judge"]["exponent"]
    assert costs["report_bytes"]["grows"] == "constant"
    assert costs["stack_cpu_s"]["exponent"] == pytest.approx(1.0)
    assert result["worst_phase"] == "judge"
    # A run that delivered nothing is left out of the fit, never a point at zero.
    failed = {**_run(1, 0, 0, 0), "deliveries": 0}
    assert bench_scale.fit([failed, *runs])["costs"] == costs
