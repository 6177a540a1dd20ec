"""Sizing a drill of any size from the whole drills bench_scale measured: the extension of
each cost past the largest run, the machines it takes, and ``capacity --drill`` around it."""

from __future__ import annotations

import json

import pytest

from harness.analysis import capacity
from harness.analysis.drill_size import DrillSizeError, estimate_drill, extend


def _run(deliveries: int, fixed: float = 0.0) -> dict:
    """A measured run whose costs are a fixed part and a cost per delivery."""
    return {
        "deliveries": deliveries,
        "verdict": "pass",
        "parts": {
            "push-consumer": {"cpu_s": fixed + 0.004 * deliveries, "peak_rss_mb": 80},
            "apns": {"cpu_s": 0.001 * deliveries, "peak_rss_mb": 60},
        },
        "harness_cpu_s": 5 + 0.0005 * deliveries,
        "harness_peak_rss_mb": 300 + 0.002 * deliveries,
        "history_rows": 8 * deliveries,
        "history_bytes": 200 * deliveries,
        "phase_seconds": {"collect": 0.0004 * deliveries, "judge": 0.0003 * deliveries},
    }


BENCH = {"runs": [_run(1_000, fixed=10), _run(10_000, fixed=10), _run(100_000, fixed=10)]}


def test_a_cost_grows_along_the_line_through_the_two_largest_runs():
    # fixed 10 + 0.004 a delivery: the line through the last two runs finds both parts.
    points = [(1_000.0, 14.0), (10_000.0, 50.0), (100_000.0, 410.0)]
    assert extend(points, 1e7, exponent=1.0) == pytest.approx(10 + 0.004 * 1e7)
    assert extend(points[:1], 1e4, exponent=None) == pytest.approx(140.0)  # one run: in proportion
    # Worse than linear: along the power law from the largest run (here 100x at exponent 1.5).
    assert extend(points, 1e7, exponent=1.5) == pytest.approx(410.0 * 1000)
    # Past the largest run, never below its cost (a cost measured to fall does not go negative).
    assert extend([(10.0, 9.0), (100.0, 5.0)], 1e6, exponent=None) == 5.0


def test_a_ten_million_drill_takes_the_stack_cores_its_cpu_needs_within_the_drain():
    estimate = estimate_drill(BENCH, 1e7, drain_s=900, machine_cores=16, machine_memory_gb=64)
    assert estimate.stack_cpu_s == pytest.approx(10 + 0.005 * 1e7, rel=1e-3)
    assert estimate.stack_cores == pytest.approx((10 + 0.005 * 1e7) / 900, rel=1e-3)
    assert estimate.stack_machines == 4  # 55.6 cores on 16-core machines
    assert estimate.machines == 5  # and one for the harness
    assert estimate.part_cores["push-consumer"] > estimate.part_cores["apns"]
    assert estimate.history_rows == 8e7 and estimate.judged_out_of_core
    assert estimate.harness_peak_memory_gb == pytest.approx((300 + 0.002 * 1e7) / 1024, rel=1e-2)
    assert estimate.harness_fits_one_machine
    assert estimate.harness_phase_seconds["judge"] == pytest.approx(3000, rel=1e-3)
    assert any("extended 100 times past" in note for note in estimate.notes)


def test_a_harness_over_one_machine_says_it_does_not_spread():
    small = estimate_drill(BENCH, 1e7, machine_memory_gb=8)
    assert not small.harness_fits_one_machine
    assert any("do not spread over machines" in note for note in small.notes)


@pytest.mark.parametrize(
    "bench, message",
    [
        ({}, "holds no runs"),
        ({"runs": [{"deliveries": 0}]}, "delivered anything"),
    ],
)
def test_a_bench_that_cannot_size_a_drill_is_a_clear_error(bench, message):
    with pytest.raises(DrillSizeError, match=message):
        estimate_drill(bench, 1e7)


def test_capacity_drill_prints_the_section_and_exits_2_without_its_bench(tmp_path, capsys):
    assert capacity.main(["--bench", str(tmp_path), "--drill", "1e7"]) == 2
    assert "--drill needs" in capsys.readouterr().err
    (tmp_path / "scale.json").write_text(json.dumps(BENCH))
    assert capacity.main(["--bench", str(tmp_path), "--drill", "1e7"]) == 0
    out = capsys.readouterr().out
    assert "## A drill of 10,000,000 deliveries" in out and "| stack machines | 4 |" in out
    assert capacity.main(["--bench", str(tmp_path), "--drill", "1e7", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["drill"]["machines"] == 5
    assert capacity.main(["--bench", str(tmp_path), "--drill", "1e7", "--machine-cores", "0"]) == 2
    assert "--machine-cores" in capsys.readouterr().err
    assert capacity.main(["--bench", str(tmp_path), "--drill", "-5"]) == 2
