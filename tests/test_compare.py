"""Comparing two runs: the figures side by side, and exit codes 0 / 1 / 2."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from fake_run import T0, TENANT, deliver, population, write_run

from harness.analysis import compare
from harness.model.history import History

USERS = ("u1", "u2", "u3")


def steady_run(
    run_dir: Path, spread_s: float = 0.5, latency_s: float = 0.2, repeat: int = 0
) -> Path:
    """Ten notifications to u1..u3 (u4 is in quiet hours and left out of latency), all sent
    within ``spread_s`` of a ten-second boundary, each ``latency_s`` after its inject.
    ``repeat`` notifications are delivered twice to u1 (visible duplicates)."""
    h = History()
    for n in range(10):
        nid = f"n{n}"
        start = T0 + 10.0 + spread_s * n / 10
        h.append("inject", time=start, tenant_id=TENANT, author_id="a", notification_id=nid)
        for user in USERS:
            deliver(h, start - T0 + latency_s, nid, user)
        deliver(h, 16.0, nid, "u4")
        if n < repeat:
            deliver(h, start - T0 + latency_s + 0.1, nid, "u1", collapse=None)
    return write_run(run_dir, h, pop=population())


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    compare.add_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["compare", *argv])


def gated(result: dict, metric: str) -> dict:
    return next(r for r in result["rows"] if r["metric"] == metric)


def test_same_run_is_not_a_regression(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = steady_run(tmp_path / "a")
    result = compare.compare_runs(run, run)
    assert not result["regressed"]
    assert gated(result, "latency p95")["a"] == pytest.approx(0.2)
    assert gated(result, "duplicates/million")["b"] == 0.0
    args = parse(str(run), str(run))
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "result: B is ok" in out and "latency p95 (s)" in out


def test_latency_regression(tmp_path: Path) -> None:
    a = steady_run(tmp_path / "a", latency_s=0.2)
    b = steady_run(tmp_path / "b", latency_s=0.4)
    result = compare.compare_runs(a, b)
    row = gated(result, "latency p95")
    assert row["regressed"] and row["change"] == pytest.approx(1.0)
    assert result["regressed"]
    assert parse(str(a), str(b)).func(parse(str(a), str(b))) == 1
    # Allowed a 150% rise, the same runs pass.
    loose = parse(str(a), str(b), "--max-latency-increase", "1.5")
    assert loose.func(loose) == 0


def test_throughput_regression(tmp_path: Path) -> None:
    # A sends its 30 first deliveries in one second, B spreads them over five.
    a = steady_run(tmp_path / "a", spread_s=0.5)
    b = steady_run(tmp_path / "b", spread_s=4.5)
    result = compare.compare_runs(a, b)
    row = gated(result, "deliveries/s")
    assert row["a"] > row["b"] and row["regressed"]
    assert not gated(result, "latency p95")["regressed"]
    args = parse(str(a), str(b), "--max-throughput-drop", "0.99")
    assert args.func(args) == 0


def test_duplicate_rate_regression(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = steady_run(tmp_path / "a")
    b = steady_run(tmp_path / "b", repeat=2)
    result = compare.compare_runs(a, b)
    row = gated(result, "duplicates/million")
    # 2 duplicates over 40 unique (notification, device) deliveries.
    assert row["b"] == pytest.approx(50000.0) and row["regressed"]
    args = parse(str(a), str(b), "--json")
    assert args.func(args) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["regressed"] and data["b"]["duplicates"]["visible_duplicates"] == 2
    # The reverse direction is an improvement, not a regression.
    back = parse(str(b), str(a))
    assert back.func(back) == 0


@pytest.mark.parametrize("broken", ["missing", "empty", "bad-json"])
def test_bad_run_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str], broken: str) -> None:
    good = steady_run(tmp_path / "good")
    bad = tmp_path / broken
    if broken == "empty":
        bad.mkdir()
    elif broken == "bad-json":
        steady_run(bad)
        (bad / "summary.json").write_text("{not json")
    args = parse(str(good), str(bad))
    assert args.func(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and str(bad) in err


def test_negative_threshold_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        parse("a", "b", "--max-throughput-drop", "-0.1")
