"""The burst benchmark's before/after: ``make bench`` runs this checkout's
``benchmarks/bench_locust.py`` on the baseline commit's harness and reference first
(``--baseline``, default ``BASELINE``), so the script must keep working against that older code.
A stop-grace change once broke it unseen: ``make bench`` is not part of ``make test``."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.integration, pytest.mark.wholerun]


def _bench_locust(monkeypatch: pytest.MonkeyPatch):
    # The script imports its sibling modules (bench_foundation, stack_cpu) as top-level ones.
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(
        "bench_locust", ROOT / "benchmarks/bench_locust.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_a_small_burst_runs_on_the_baseline_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bench = _bench_locust(monkeypatch)
    tree = bench.export_commit(bench.BASELINE, tmp_path / "tree")
    args = argparse.Namespace(deliveries=300, seed=3, warm_audit_keys=False)
    before = bench.bench_tree(tree, args, tmp_path / "before.json")
    assert before["burst_verdict"] == "pass", json.dumps(before, indent=2)[:4000]
    assert before["burst_delivered"] == before["burst_expected_deliveries"] > 0
    assert before["burst_cpu_ms_per_delivery"]["whole stack"] > 0
