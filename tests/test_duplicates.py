"""The duplicate report: per-million figures by scenario and fault, and cause attribution."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd
import pytest
from fake_run import FAULT, T0, TENANT, TOKENS, deliver, fault, population, synthetic_run, write_run

from harness.analysis import duplicates, metrics
from harness.checkers.windows import Window
from harness.model.history import History


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    duplicates.add_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["duplicates", *argv])


def test_faults_at_names_every_open_window() -> None:
    windows = [Window("a", 10.0, 20.0), Window("b", 15.0, 30.0)]
    assert metrics.faults_at([5.0, 12.0, 16.0, 25.0, 31.0], windows) == [
        "no fault",
        "a",
        "a+b",
        "b",
        "no fault",
    ]


def test_attempt_and_delivery_numbers() -> None:
    h = History()
    deliver(h, 1.0, "n1", "u1", status=429)
    deliver(h, 2.0, "n1", "u1", status=500, delivered=True)
    deliver(h, 3.0, "n1", "u1")
    deliver(h, 3.0, "n1", "u2")
    attempts = metrics.provider_attempts(h.frame())
    u1 = attempts[attempts["token"] == TOKENS["u1"]]
    assert list(u1["attempt"]) == [1, 2, 3]
    assert list(u1["delivery_number"]) == [0, 1, 2]
    assert list(attempts[attempts["token"] == TOKENS["u2"]]["delivery_number"]) == [1]


def test_cause_attribution(tmp_path: Path) -> None:
    run = metrics.load_run(synthetic_run(tmp_path / "run"))
    traces = metrics.duplicate_rows(run.history).set_index("notification_id")
    # n2/tok1: the second delivery came inside the window: blamed on it directly.
    inside = traces.loc["n2"]
    assert (inside["cause"], inside["cause_basis"], inside["path"]) == (
        FAULT,
        "at duplicate",
        "visible",
    )
    # n1/tok3: re-sent after the window closed; the delivery it repeats was inside it.
    after = traces.loc["n1"]
    assert (after["fault_at_delivery"], after["cause"], after["cause_basis"]) == (
        "no fault",
        FAULT,
        "at previous delivery",
    )
    assert after["path"] == "collapsed" and after["previous_status"] == 500


def test_duplicate_without_any_fault_says_no_fault(tmp_path: Path) -> None:
    h = History()
    h.append("inject", time=T0, tenant_id=TENANT, author_id="a", notification_id="n1")
    fault(h, 10.0, "start")
    fault(h, 11.0, "stop")
    deliver(h, 1.0, "n1", "u1")
    deliver(h, 2.0, "n1", "u1")
    traces = metrics.duplicate_rows(h.frame())
    assert list(traces["cause"]) == ["no fault"] and list(traces["cause_basis"]) == ["-"]


def test_per_million_by_scenario_and_fault(tmp_path: Path) -> None:
    table = duplicates.duplicate_report([synthetic_run(tmp_path / "run")]).set_index("fault")
    total = table.loc["(all)"]
    assert (total["unique_deliveries"], total["duplicates"]) == (7, 2)
    assert total["per_million"] == pytest.approx(285714.3)
    assert total["visible_per_million"] == pytest.approx(142857.1)
    # Four pairs were first delivered inside the window (n1/tok3 +2.5, n1/tok4 +3.0,
    # n2/tok3 +2.2, n2/tok1 +3.0), and both duplicates are its doing: 2 / 4.
    in_fault = table.loc[FAULT]
    assert (in_fault["unique_deliveries"], in_fault["duplicates"]) == (4, 2)
    assert (in_fault["visible"], in_fault["collapsed"]) == (1, 1)
    assert in_fault["per_million"] == pytest.approx(500000.0)
    clean = table.loc["no fault"]
    assert (clean["unique_deliveries"], clean["duplicates"], clean["per_million"]) == (3, 0, 0.0)


def test_runs_aggregate_by_scenario(tmp_path: Path) -> None:
    first = synthetic_run(tmp_path / "one", scenario="storm")
    second = synthetic_run(tmp_path / "two", scenario="storm")
    h = History()
    h.append("inject", time=T0, tenant_id=TENANT, author_id="a", notification_id="n1")
    for t, user in ((0.5, "u1"), (0.7, "u2"), (0.9, "u3"), (6.0, "u4")):
        deliver(h, t, "n1", user)
    clean = write_run(tmp_path / "three", h, pop=population(), scenario="smoke")
    table = duplicates.duplicate_report([first, second, clean])
    totals = table[table["fault"] == "(all)"].set_index("scenario")
    assert totals.loc["storm", "runs"] == 2
    assert (totals.loc["storm", "unique_deliveries"], totals.loc["storm", "duplicates"]) == (14, 4)
    assert totals.loc["storm", "per_million"] == pytest.approx(285714.3)
    assert (totals.loc["smoke", "duplicates"], totals.loc["smoke", "per_million"]) == (0, 0.0)


def test_markdown_gives_the_honest_effectively_once_figure(tmp_path: Path) -> None:
    report = duplicates.build([synthetic_run(tmp_path / "run")])
    text = duplicates.render_markdown(report)
    assert "5/8 expected pairs exactly once (62.5%), 2 more than once, 1 lost" in text
    assert "285714.3 duplicates per million (142857.1 visible)" in text
    traced = [line for line in text.splitlines() if line.startswith("| fake-synthetic |")]
    assert len(traced) == 2
    assert any(
        "| collapsed | apns-accepted-then-error | at previous delivery |" in r for r in traced
    )


def test_cli_json_to_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = synthetic_run(tmp_path / "run")
    out = tmp_path / "dups.json"
    args = parse(str(run_dir), "--json", "--out", str(out))
    assert args.func(args) == 0
    data = json.loads(out.read_text())
    totals = pd.DataFrame(data["table"]).set_index("fault").loc["(all)"]
    assert totals["duplicates"] == 2
    assert {t["cause"] for t in data["traces"]} == {FAULT}
    assert data["runs"][0]["exactly_once"]["lost"] == 1
    assert "wrote" in capsys.readouterr().out


def test_cli_markdown_to_stdout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = parse(str(synthetic_run(tmp_path / "run")))
    assert args.func(args) == 0
    assert capsys.readouterr().out.startswith("# Duplicate report")


def test_cli_bad_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = parse(str(tmp_path / "missing"))
    assert args.func(args) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_figures_agree_with_the_checker(tmp_path: Path) -> None:
    run = metrics.load_run(synthetic_run(tmp_path / "run"))
    checker = run.summary["checkers"]["effectively_once"]
    figures = metrics.duplicate_figures(run.history)
    for name in ("duplicated", "collapsed", "visible_duplicates", "duplicates_per_million"):
        assert figures[name] == checker[name], name
