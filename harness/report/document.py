"""The report's document model (blocks both renderers read) and its small pure helpers."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.analysis import metrics
from harness.analysis.metrics import KEY, Run
from harness.checkers.verdict import STATUS_WORDS, SWITCHED_OFF, result_status
from harness.checkers.windows import Window
from harness.model.provider_limits import sentence as limits_sentence

MAX_EVIDENCE_ROWS = 10

TOKEN_CHARS = 16

CHART_DIR = "charts"


@dataclass
class Block:
    kind: str  # lead | h2 | h3 | p | note | table | image
    text: str = ""
    table: pd.DataFrame | None = None
    image: Path | None = None


@dataclass
class Document:
    run: Run
    verdict: str  # PASS | FAIL | ERROR
    blocks: list[Block] = field(default_factory=list)

    def h2(self, text: str) -> None:
        self.blocks.append(Block("h2", text))

    def h3(self, text: str) -> None:
        self.blocks.append(Block("h3", text))

    def p(self, text: str) -> None:
        self.blocks.append(Block("p", text))

    def note(self, text: str) -> None:
        self.blocks.append(Block("note", text))

    def table(self, frame: pd.DataFrame) -> None:
        self.blocks.append(Block("table", table=frame))

    def image(self, path: Path, caption: str) -> None:
        self.blocks.append(Block("image", caption, image=path))


def verdict_word(summary: dict[str, Any]) -> str:
    if summary.get("verdict") == "incomplete":
        return "INCOMPLETE"
    if summary.get("error"):
        return "ERROR"
    words = {"pass": "PASS", "unknown": "UNKNOWN", "aborted": "ABORTED"}
    return words.get(str(summary.get("verdict")), "FAIL")


def verdict_sentence(summary: dict[str, Any]) -> str:
    checkers = summary.get("checkers") or {}
    failed = [name for name, result in checkers.items() if result_status(result) == "fail"]
    undecided = [name for name, result in checkers.items() if result_status(result) == "unknown"]
    off = [name for name, result in checkers.items() if result_status(result) == "off"]
    judged = len(checkers) - len(off)
    off_text = (
        f" {len(off)} switched off (the system does not offer what they need): {', '.join(off)}."
        if off
        else ""
    )
    off_text += clock_sentence(summary)
    off_text += limits_sentence(summary.get("provider_limits"))
    off_text += live_sentence(summary)
    if summary.get("verdict") == "incomplete":
        return (
            f"The run did not finish: {summary.get('error') or 'it was stopped'}. There is "
            "no verdict; this report shows only what it recorded before it stopped. Do not "
            "release on this run."
        )
    if summary.get("error"):
        ran = f" ({len(checkers)} checker(s) ran, {len(failed)} failed)" if checkers else ""
        return f"The run itself failed: {summary['error']}{ran}. Do not release on this run."
    stopped = summary.get("stopped")
    if stopped:
        first = ", ".join(f"{k} {v}" for k, v in stopped["first_evidence"].items())
        off_text = (
            f" The drill was ABORTED by its stop condition {stopped['condition']} at "
            f"{_utc(stopped['at'])} (first evidence: {first}): the load stopped, every fault was "
            "rolled back, and what had been accepted was judged." + off_text
        )
    if not checkers:
        return "No checker ran: this run proves nothing."
    if not judged:
        return f"Every checker was switched off: this run proves nothing.{off_text}"
    if failed:
        return f"{len(failed)} of {judged} checkers failed: {', '.join(failed)}.{off_text}"
    if undecided:
        return (
            f"No checker failed, but {len(undecided)} of {judged} could not decide: "
            f"{', '.join(undecided)}. Do not release on this run.{off_text}"
        )
    return f"All {judged} checkers passed.{off_text}"


def _utc(epoch: float) -> str:
    return datetime.fromtimestamp(float(epoch), UTC).strftime("%H:%M:%S.%f")[:-3] + " UTC"


def live_sentence(summary: dict[str, Any]) -> str:
    """When each promise was first seen broken while the run went (harness.live.online)."""
    live = summary.get("live") or {}
    first = live.get("first_seen") or {}
    if not first:
        return ""
    counts = live.get("violations") or {}
    seen = [
        f"{check} first at {_utc(evidence['at'])} ({counts.get(check, '?')} in all)"
        for check, evidence in sorted(first.items(), key=lambda kv: kv[1]["at"])
    ]
    return " Seen broken live: " + "; ".join(seen) + "."


def clock_sentence(summary: dict[str, Any]) -> str:
    """Where the run put the system's clock (``configuration.clock``), or nothing."""
    clock = summary.get("clock")
    if not clock:
        return ""
    return (
        f" The system's clock ran {float(clock['offset_s']):.0f} s ahead of real time: it showed"
        f" midnight in {clock['midnight']} ({clock['system_shows']}) with"
        f" {clock['injected_before']} event(s) injected before it and"
        f" {clock['injected_after']} after."
    )


def short_token(token: Any) -> str:
    if token is None or token is pd.NA or (isinstance(token, float) and math.isnan(token)):
        return ""
    text = str(token)
    return text if len(text) <= TOKEN_CHARS else text[:TOKEN_CHARS] + "…"


def since(t: Any, t0: float) -> str:
    if t is None or t is pd.NA or (isinstance(t, float) and math.isnan(t)):
        return ""
    return f"+{float(t) - t0:.2f}s"


def counts_text(result: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in metrics.checker_counts(result).items())


def verdict_rows(summary: dict[str, Any]) -> pd.DataFrame:
    rows = [
        {
            "checker": name,
            "result": STATUS_WORDS[result_status(result)],
            "counts": result.get(SWITCHED_OFF) or counts_text(result),
        }
        for name, result in summary.get("checkers", {}).items()
    ]
    if summary.get("error"):
        rows.append({"checker": "(run)", "result": "ERROR", "counts": str(summary["error"])})
    return pd.DataFrame(rows, columns=["checker", "result", "counts"])


def window_rows(windows: list[Window], t0: float) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "fault": w.fault,
                "start": since(w.start, t0),
                "stop": since(w.stop, t0),
                "seconds": round(w.stop - w.start, 2),
            }
            for w in windows
        ],
        columns=["fault", "start", "stop", "seconds"],
    )


def attempts_of(
    keys: pd.DataFrame,
    attempts: pd.DataFrame,
    windows: list[Window],
    t0: float,
    extra: tuple[str, ...] = (),
) -> pd.DataFrame:
    """Every provider attempt for the given keys, in time order, with the fault window open at
    it: the context a person needs to see why a key ended the way it did. ``extra`` names
    columns of ``keys`` carried onto each of the key's rows."""
    if keys.empty:
        return pd.DataFrame()
    wanted = keys[[*KEY, *extra]].drop_duplicates(subset=KEY)
    rows = attempts.merge(wanted, on=KEY, how="inner").sort_values(["time", "seq"])
    table = pd.DataFrame(
        {
            "tenant": rows["tenant_id"].astype(str),
            "notification": rows["notification_id"].astype(str),
            "token": [short_token(t) for t in rows["token"]],
            "attempt": rows["attempt"].astype(int),
            "at": [since(t, t0) for t in rows["time"]],
            "status": rows["status"].astype("string").fillna(""),
            "device got it": np.where(rows["got"], "yes", "no"),
            "delivery #": [int(n) if n else "" for n in rows["delivery_number"]],
            "fault window": metrics.faults_at(rows["time"], windows),
        }
    )
    for column in extra:
        table[column] = rows[column].to_numpy()
    return table.reset_index(drop=True)
