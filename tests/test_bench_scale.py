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


def test_a_planted_run_is_caught_only_when_it_fails_on_effectively_once():
    run = {"defect": "d", "scale": 1000.0, "verdict": "fail", "effectively_once": {"duplicated": 9}}
    run["checkers"] = {"effectively_once": False, "fail_closed": True, "audit_per_copy": False}
    found = bench_scale.caught(run)
    assert found["caught"] and found["failed"] == ["audit_per_copy", "effectively_once"]
    assert found["effectively_once"] == {"duplicated": 9}
    # Failed for another reason, or passed: not caught.
    assert not bench_scale.caught({**run, "checkers": {"effectively_once": True}})["caught"]
    assert not bench_scale.caught({**run, "verdict": "pass"})["caught"]


def test_the_planted_scenario_is_celebrity_scale_with_the_defect_in_the_reference(tmp_path):
    import yaml

    path = bench_scale.planted(tmp_path, bench_scale.RARE_DEFECT)
    assert path.name == "celebrity-scale.yaml"
    data = yaml.safe_load(path.read_text())
    assert data["configuration"]["reference"]["defects"] == ["sent_twice_one_in_100k"]
    shipped = yaml.safe_load((ROOT / "scenarios" / "celebrity-scale.yaml").read_text())
    assert (
        data["method"] == shipped["method"]
        and data["steady-state-hypothesis"] == (shipped["steady-state-hypothesis"])
    )


def test_the_rare_defect_doubles_about_one_delivery_in_100k():
    from reference_impl.push_consumer import RARE_ONE_IN, rare_pick

    picked = sum(rare_pick("tenant-0", f"n{i:07d}", "tok") for i in range(1_000_000))
    assert RARE_ONE_IN == 100_000
    assert 2 <= picked <= 25  # Poisson with mean 10: outside this, the pick is not 1 in 100k
    assert rare_pick("t", "n", "x") == rare_pick("t", "n", "x")  # every process picks the same
