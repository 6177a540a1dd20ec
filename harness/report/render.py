"""The document as Markdown and as a self-contained HTML page."""

from __future__ import annotations

import base64
import html
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd

from harness.analysis import metrics
from harness.analysis.metrics import Run
from harness.report.document import Document


def header_lines(run: Run) -> list[tuple[str, str]]:
    summary = run.summary
    t0 = metrics.run_start(run.history)
    started = datetime.fromtimestamp(t0, UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if t0 else "?"
    return [
        ("run", str(summary.get("run_id", run.path.name))),
        ("scenario", str(summary.get("scenario", "?"))),
        ("seed", str(summary.get("seed", "?"))),
        ("started", started),
        (
            "history rows",
            str(len(run.history) if run.partial else summary.get("history_rows", len(run.history))),
        ),
    ]


def render_markdown(doc: Document, out_dir: Path) -> str:
    lines = [f"# {doc.verdict}", ""]
    lines += [f"- **{k}**: {v}" for k, v in header_lines(doc.run)]
    for block in doc.blocks:
        lines.append("")
        if block.kind == "lead":
            lines.append(f"**{block.text}**")
        elif block.kind == "h2":
            lines.append(f"## {block.text}")
        elif block.kind == "h3":
            lines.append(f"### {block.text}")
        elif block.kind == "p":
            lines.append(block.text)
        elif block.kind == "note":
            lines.append(f"> {block.text}")
        elif block.kind == "table" and block.table is not None:
            lines.append(metrics.markdown_table(block.table))
        elif block.kind == "image" and block.image is not None:
            lines.append(f"![{block.text}]({block.image.relative_to(out_dir).as_posix()})")
    return "\n".join(lines) + "\n"


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;
max-width:1100px;color:#222;padding:0 1em}
.verdict{font-size:4em;font-weight:800;letter-spacing:.05em;padding:.2em .4em;border-radius:8px;
display:inline-block;color:#fff;margin:0}
.PASS{background:#2e7d32}.FAIL{background:#c62828}.ERROR{background:#ef6c00}
.INCOMPLETE,.UNKNOWN{background:#616161}
dl.meta{display:grid;grid-template-columns:max-content auto;gap:.2em 1em;color:#444}
dl.meta dt{font-weight:600}dl.meta dd{margin:0;font-family:ui-monospace,monospace}
table{border-collapse:collapse;margin:.6em 0 1.2em;font-size:.9em}
th,td{border:1px solid #ddd;padding:.3em .6em;text-align:left;vertical-align:top}
th{background:#f4f4f4}td{font-family:ui-monospace,Menlo,monospace}
td.res-PASS{color:#2e7d32;font-weight:700}td.res-FAIL{color:#c62828;font-weight:700}
td.res-ERROR{color:#ef6c00;font-weight:700}
.note{color:#555;border-left:3px solid #ccc;padding:.2em .8em;margin:.6em 0}
figure{margin:1em 0}figure img{max-width:100%;border:1px solid #eee}
figcaption{color:#555;font-size:.9em}
.lead{font-size:1.4em;font-weight:600;margin:.6em 0 1em}
"""


def html_table(frame: pd.DataFrame) -> str:
    if frame.empty:
        return "<p class='note'>(none)</p>"
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    body = []
    for row in frame.itertuples(index=False, name=None):
        cells = []
        for column, value in zip(frame.columns, row, strict=True):
            text = metrics.cell_text(value)
            css = f" class='res-{text}'" if column == "result" else ""
            cells.append(f"<td{css}>{html.escape(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def render_html(doc: Document) -> str:
    title = f"{doc.verdict}: {doc.run.summary.get('run_id', doc.run.path.name)}"
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>",
        f"<p class='verdict {doc.verdict}'>{doc.verdict}</p>",
        "<dl class='meta'>",
        *(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in header_lines(doc.run)),
        "</dl>",
    ]
    for block in doc.blocks:
        if block.kind == "lead":
            parts.append(f"<p class='lead'>{html.escape(block.text)}</p>")
        elif block.kind == "h2":
            parts.append(f"<h2>{html.escape(block.text)}</h2>")
        elif block.kind == "h3":
            parts.append(f"<h3>{html.escape(block.text)}</h3>")
        elif block.kind == "p":
            parts.append(f"<p>{html.escape(block.text)}</p>")
        elif block.kind == "note":
            parts.append(f"<p class='note'>{html.escape(block.text)}</p>")
        elif block.kind == "table" and block.table is not None:
            parts.append(html_table(block.table))
        elif block.kind == "image" and block.image is not None:
            data = base64.b64encode(block.image.read_bytes()).decode("ascii")
            parts.append(
                f"<figure><img alt='{html.escape(block.text)}' "
                f"src='data:image/png;base64,{data}'>"
                f"<figcaption>{html.escape(block.text)}</figcaption></figure>"
            )
    parts.append("</body></html>")
    return "\n".join(parts)
