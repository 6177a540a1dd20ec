"""The run report: numbers in report.md, junit.xml, the self-contained HTML, the evidence.

Core tests build fake run directories (tests/fake_run.py) with hand-counted violations; no
server is needed. One test renders a real run directory when one exists.
"""

from __future__ import annotations

import json
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from fake_run import (
    FAULT,
    T0,
    TENANT,
    TOKENS,
    deliver,
    population,
    synthetic_history,
    synthetic_run,
    write_run,
)

from harness.analysis import metrics
from harness.model.history import History
from harness.report import junit_xml, quiet_hours_by_zone, write_reports

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    """Rendered once for the module: the tests below only read what it wrote."""
    run_dir = synthetic_run(tmp_path_factory.mktemp("synthetic") / "run")
    return run_dir, write_reports(run_dir)


def table_row(markdown: str, first_cell: str) -> list[str]:
    for line in markdown.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first_cell:
            return cells
    raise AssertionError(f"no table row starting with {first_cell!r}")


def test_report_files_are_written(synthetic: tuple[Path, dict[str, Path]]) -> None:
    run_dir, written = synthetic
    assert written["markdown"] == run_dir / "report.md"
    assert written["html"] == run_dir / "report.html"
    assert written["junit"] == run_dir / "junit.xml"
    charts = {k for k in written if k.startswith("chart:")}
    # No depth samples in this history: that chart must be absent, not empty.
    assert charts == {
        "chart:throughput",
        "chart:latency",
        "chart:status",
        "chart:duplicates",
        "chart:quiet_hours",
    }
    for path in written.values():
        assert path.stat().st_size > 0
    assert all(p.read_bytes()[:4] == b"\x89PNG" for k, p in written.items() if k in charts)


def test_markdown_verdict_and_counts(synthetic: tuple[Path, dict[str, Path]]) -> None:
    md = synthetic[1]["markdown"].read_text()
    assert md.startswith("# FAIL\n")
    assert "**2 of 2 checkers failed: effectively_once, quiet_hours.**" in md
    once = table_row(md, "effectively_once")
    assert once[1] == "FAIL"
    assert "expected=8" in once[2] and "duplicated=2" in once[2] and "lost=1" in once[2]
    assert "visible_duplicates=1" in once[2]
    assert table_row(md, "quiet_hours")[1] == "FAIL"
    assert "delivered_inside_window=1" in table_row(md, "quiet_hours")[2]


def test_markdown_headline_figures(synthetic: tuple[Path, dict[str, Path]]) -> None:
    md = synthetic[1]["markdown"].read_text()
    assert table_row(md, "duplicates per million (all / visible)")[1] == "285714.3 / 142857.1"
    latency = table_row(md, "latency p50 / p95 / p99 / max")[1]
    assert latency.startswith("1.500s / ") and latency.endswith("(5 deliveries)")
    assert "2 delivery(ies) the oracle deferred" in md
    assert "5 of 8 expected" in table_row(md, "effectively once")[1]
    window = table_row(md, FAULT)
    # Times count from the first history row (the phase row one second before T0).
    assert window[1:4] == ["+3.00s", "+5.00s", "2.0"]


def test_markdown_evidence_traces_duplicates_and_losses(
    synthetic: tuple[Path, dict[str, Path]],
) -> None:
    md = synthetic[1]["markdown"].read_text()
    evidence = md[md.index("## Evidence") :]
    tok3 = TOKENS["u3"][:16] + "…"
    tok1 = TOKENS["u1"][:16] + "…"
    rows = [line for line in evidence.splitlines() if line.startswith(f"| {TENANT} |")]
    tok3_rows = [r for r in rows if tok3 in r and "| n1 |" in r]
    # Both attempts of the collapsed duplicate: the 'accepted then 500' one inside the window,
    # and the re-send after it closed, which still names the fault as its cause.
    assert len(tok3_rows) == 2
    assert "| 500 | yes | 1 | apns-accepted-then-error | collapsed |" in tok3_rows[0]
    assert "| 200 | yes | 2 | no fault | collapsed | apns-accepted-then-error |" in tok3_rows[1]
    assert any(tok1 in r and "| visible |" in r for r in rows)
    lost = [r for r in evidence.splitlines() if TOKENS["u2"][:16] in r]
    assert len(lost) == 1 and "| u2 | 0 |" in lost[0]
    quiet = [r for r in evidence.splitlines() if "inside window" in r]
    assert quiet and "Asia/Kathmandu" in quiet[0] and "| -2.0 |" in quiet[0]


def test_evidence_puts_the_broken_tolerance_first(tmp_path: Path) -> None:
    """Only a loss breaks effectively_once here: the collapsed duplicate (after an 'accepted
    then 500', a cause the design admits) is context."""
    h = History()
    h.append("inject", time=T0, tenant_id=TENANT, author_id="a", notification_id="n1")
    deliver(h, 1.0, "n1", "u1", status=500, delivered=True)
    deliver(h, 2.0, "n1", "u1")
    deliver(h, 1.0, "n1", "u3")
    deliver(h, 1.0, "n1", "u4", collapse=None)
    run_dir = write_run(tmp_path / "run", h, pop=population())
    md = write_reports(run_dir)["markdown"].read_text()
    evidence = md[md.index("### effectively_once") :]
    assert evidence.index("Lost: first 1 of 1") < evidence.index("Duplicated")
    assert "(within tolerance, shown for context)" in evidence


def test_html_is_self_contained(synthetic: tuple[Path, dict[str, Path]]) -> None:
    page = synthetic[1]["html"].read_text()
    assert "<p class='verdict FAIL'>FAIL</p>" in page
    assert page.index("verdict FAIL") < page.index("effectively_once") < page.index("<img")
    images = re.findall(r"<img [^>]*src='([^']*)'", page)
    assert len(images) == 5
    assert all(src.startswith("data:image/png;base64,") for src in images)
    assert "charts/" not in page and "<script" not in page


def test_junit_counts(synthetic: tuple[Path, dict[str, Path]]) -> None:
    root = ET.parse(synthetic[1]["junit"]).getroot()
    suites = root.findall("testsuite")
    assert len(suites) == 1
    suite = suites[0]
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == ["effectively_once", "quiet_hours"]
    assert len(suite.findall("testcase/failure")) == 2
    assert suite.get("tests") == "2" and suite.get("failures") == "2"
    assert suite.get("errors") == "0"
    message = cases[0].find("failure").get("message")
    assert "lost=1" in message and "duplicated=2" in message


def test_junit_passing_and_errored_runs() -> None:
    passing = {
        "run_id": "r",
        "scenario": "s",
        "verdict": "pass",
        "checkers": {"consent": {"valid": True, "deliveries_without_consent": 0}},
        "error": None,
    }
    suite = ET.fromstring(junit_xml(passing)).find("testsuite")
    assert suite.get("tests") == "1" and suite.get("failures") == "0"
    assert suite.find("testcase/failure") is None and suite.find("testcase/error") is None
    errored = {**passing, "verdict": "fail", "error": "stack part redis died during the run"}
    suite = ET.fromstring(junit_xml(errored)).find("testsuite")
    assert suite.get("tests") == "2" and suite.get("errors") == "1"
    error = suite.find("testcase[@name='run']/error")
    assert error is not None and "redis died" in error.get("message")


def test_errored_run_without_checkers(tmp_path: Path) -> None:
    h = History()
    h.append("phase", time=T0, detail="population_loaded")
    summary = {
        "run_id": "boom",
        "scenario": "smoke",
        "seed": 1,
        "verdict": "fail",
        "checkers": {},
        "history_rows": 1,
        "error": "RuntimeError: dynalite did not start",
    }
    written = write_reports(write_run(tmp_path / "run", h, summary=summary))
    md = written["markdown"].read_text()
    assert md.startswith("# ERROR\n")
    assert "**The run itself failed: RuntimeError: dynalite did not start." in md
    assert "No checker ran" in md
    assert "| (run) | ERROR | RuntimeError: dynalite did not start |" in md
    assert "no population.json" in md
    assert not [k for k in written if k.startswith("chart:")]
    suite = ET.parse(written["junit"]).getroot().find("testsuite")
    assert suite.get("errors") == "1" and suite.get("tests") == "1"


def test_quiet_run_says_so_instead_of_drawing_empty_charts(tmp_path: Path) -> None:
    h = History()
    h.append("inject", time=T0, tenant_id=TENANT, author_id="a", notification_id="n1")
    for t, user in ((0.5, "u1"), (0.7, "u2"), (0.9, "u3"), (6.0, "u4")):
        deliver(h, t, "n1", user)
    written = write_reports(write_run(tmp_path / "run", h, pop=population()))
    md = written["markdown"].read_text()
    assert md.startswith("# PASS\n")
    assert "chart:duplicates" not in written and "chart:depth" not in written
    assert "No duplicate deliveries in this run" in md
    assert "the history holds no depth samples" in md
    assert "No fault was injected in this run." in md
    assert "Every checker passed" in md


def test_depth_samples_and_dlq_events(tmp_path: Path) -> None:
    h = synthetic_history()
    for t, depth in ((0.0, 0), (2.0, 40), (4.0, 12), (6.0, 0)):
        h.append("dlq", time=T0 + t, detail=json.dumps({"queue": "push-dlq", "depth": depth}))
    h.append("action", time=T0 + 5, detail="redrive-dlq: moved 12 message(s) back ({})")
    written = write_reports(write_run(tmp_path / "run", h, pop=population()))
    assert "chart:depth" in written
    md = written["markdown"].read_text()
    assert table_row(md, "+6.00s")[1:3] == ["redrive-dlq", "12"]


def test_quiet_hours_by_zone_counts(tmp_path: Path) -> None:
    run = metrics.load_run(synthetic_run(tmp_path / "run"))
    table = quiet_hours_by_zone(run, metrics.oracle(run), bound_s=30.0)
    row = table.set_index("zone").loc["Asia/Kathmandu"]
    assert (row["deferred"], row["released on time"], row["inside window"]) == (2, 1, 1)
    assert row["released late"] == 0 and row["not delivered"] == 0


def test_old_history_without_newer_columns(tmp_path: Path) -> None:
    """Early runs wrote no delivered/collapse_id/retry_after columns; they still render."""
    h = synthetic_history()
    frame = h.frame().drop(columns=["delivered", "collapse_id", "retry_after"])
    run_dir = write_run(tmp_path / "run", h)
    frame.to_parquet(run_dir / "history.parquet", index=False)
    written = write_reports(run_dir)
    md = written["markdown"].read_text()
    # Without 'delivered', the 500 no longer counts as a delivery: one duplicate (tok1) is left.
    assert "1 more than once" in table_row(md, "effectively once")[1]


def test_not_a_run_directory(tmp_path: Path) -> None:
    with pytest.raises(metrics.RunDirError, match="summary.json is missing"):
        write_reports(tmp_path)


def _real_run_dirs() -> list[Path]:
    candidates = sorted(Path("/tmp/runs").glob("*/summary.json")) + sorted(
        (ROOT / "reports").glob("2026*/summary.json")
    )
    return [p.parent for p in candidates if (p.parent / "history.parquet").exists()]


@pytest.mark.skipif(not _real_run_dirs(), reason="no real run directory on this machine")
def test_renders_a_real_run(tmp_path: Path) -> None:
    source = _real_run_dirs()[-1]
    run_dir = tmp_path / source.name
    run_dir.mkdir()
    for name in ("summary.json", "history.parquet", "population.json"):
        if (source / name).exists():
            shutil.copy(source / name, run_dir / name)
    written = write_reports(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    md = written["markdown"].read_text()
    assert md.startswith(f"# {'PASS' if summary['verdict'] == 'pass' else 'FAIL'}")
    suite = ET.parse(written["junit"]).getroot().find("testsuite")
    assert int(suite.get("tests")) >= len(summary["checkers"])
