"""A run's reports: ``report.md``, a self-contained ``report.html``, charts and ``junit.xml``.

Everything here is read back from the run directory (summary.json, history.parquet and, when
present, population.json), so a report can be regenerated for any old run. The figures come
from ``harness.analysis.metrics`` (shared with ``compare`` and ``duplicates``); this package
only lays them out (``document``, ``build``, ``charts``, ``render``, ``junit``) and finds the
evidence behind each failed checker (``evidence``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.analysis import metrics
from harness.report.build import build_document
from harness.report.evidence import quiet_hours_by_zone
from harness.report.junit import junit_xml
from harness.report.render import render_html, render_markdown

__all__ = ["junit_xml", "quiet_hours_by_zone", "write_reports"]


def write_reports(run_dir: Path) -> dict[str, Path]:
    """Write report.md, report.html, junit.xml and charts/*.png into ``run_dir``.

    Returns the written paths by name (``markdown``, ``html``, ``junit``, ``chart:<name>``).
    Raises ``metrics.RunDirError`` when the directory is not a readable run.
    """
    run_dir = Path(run_dir)
    run = metrics.load_run(run_dir)
    doc = build_document(run, run_dir)
    written: dict[str, Path] = {}
    md_path, html_path, junit_path = (
        run_dir / "report.md",
        run_dir / "report.html",
        run_dir / "junit.xml",
    )
    md_path.write_text(render_markdown(doc, run_dir))
    html_path.write_text(render_html(doc))
    history = run.history
    duration = float(history["time"].max() - history["time"].min()) if len(history) else 0.0
    junit_path.write_text(junit_xml(run.summary, duration))
    written.update(markdown=md_path, html=html_path, junit=junit_path)
    for block in doc.blocks:
        if block.kind == "image" and block.image is not None:
            written[f"chart:{block.image.stem}"] = block.image
    return written


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("report", help="(re)write a run directory's reports")
    parser.add_argument("run_dir", nargs="+", metavar="RUN", help="run directory")
    parser.set_defaults(func=run_command)


def run_command(args: argparse.Namespace) -> int:
    status = 0
    for run_dir in args.run_dir:
        try:
            written = write_reports(Path(run_dir))
        except metrics.RunDirError as exc:
            print(f"error: {exc}", file=sys.stderr)
            status = 2
            continue
        print(f"{run_dir}: {written['html']}")
    return status
