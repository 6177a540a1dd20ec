"""Docs that cannot drift (as Hypothesis's do): what the code registers, the docs name, each in
the one place a reader looks for it, and no doc states a total the code can outgrow.

* every registered checker is in the checker column of a promise table of docs/PROMISES.md and
  of docs/SCENARIOS.md's "Promises and their checkers" (PROMISES.md, "How to keep this page
  true": a new checker adds its row in both);
* every fault of the catalogue (``chaos.faults.CATALOGUE``) is in docs/SCENARIOS.md's
  "Faults (`chaos/faults/`, ...)" paragraph;
* every shipped scenario (``scenarios/*.yaml``) has a row in README.md's scenario table;
* every ``python -m harness`` subcommand is named as ``python -m harness <command>`` in README.md
  or docs/RUNS.md (whose "Every command" table lists them all);
* every key a target file accepts (``Target``'s fields, ``policy``'s, and the names ``hooks``,
  ``processes``, ``job_fields`` and ``job_template`` take) is in docs/TARGETS.md
  (``test_docs_contract.py`` holds the reverse: nothing documented that the code lacks);
* no page of the docs site, nor README.md, states how many checkers, scenarios or faults there
  are in all ("all 24 checkers"): the number is the registry's, and a page says "every checker".

Each failure names what is missing and the file (and place in it) where it goes.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable
from dataclasses import fields
from pathlib import Path

import pytest
from conftest import ROOT
from test_docs_site import outside_pages

import chaos.faults
from harness.checkers import known
from harness.cli import build_parser
from harness.contract.system import JOB_FIELDS, TEMPLATE_VALUES
from harness.model.system import SystemPolicy
from harness.stack.target import HOOKS, PROCESS_HOOKS, Target

DOCS = ROOT / "docs"


def _read(path: Path) -> str:
    return path.read_text()


def _section(text: str, heading: str) -> str:
    """The body of the Markdown section headed exactly ``heading`` (``## Name``), up to the
    next heading of the same or a higher level outside a code block; empty when there is none."""
    level = len(heading.split(" ", 1)[0])
    lines = text.splitlines()
    if heading not in lines:
        return ""
    body: list[str] = []
    fenced = False
    for line in lines[lines.index(heading) + 1 :]:
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(rf"#{{1,{level}}} ", line):
            break
        body.append(line)
    return "\n".join(body)


def _column(text: str, header: str, column: int) -> str:
    """Column ``column`` of every table whose header row starts with ``header``, joined."""
    cells: list[str] = []
    in_table = False
    for line in text.splitlines():
        if line.startswith(header):
            in_table = True
            continue
        if not line.startswith("|"):
            in_table = False
            continue
        row = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if in_table and len(row) > column and not row[0].startswith("---"):
            cells.append(row[column])
    return "\n".join(cells)


def _ticked(text: str) -> set[str]:
    """Every name written in backticks in ``text`` (also inside a longer code span's words)."""
    names: set[str] = set()
    for span in re.findall(r"`([^`\n]+)`", text):
        names.update(re.findall(r"[A-Za-z0-9_.-]+", span))
    return names


def _missing(names: Iterable[str], where: set[str]) -> list[str]:
    return sorted(n for n in names if n not in where)


# -- 1. checkers ------------------------------------------------------------------------------


def test_every_checker_is_in_the_promise_tables_of_promises_md():
    column = _column(_read(DOCS / "PROMISES.md"), "| promise (seed) | checker", 1)
    assert column, "docs/PROMISES.md has no promise table (| promise (seed) | checker ...)"
    missing = _missing(known(), _ticked(column))
    assert not missing, (
        f"checkers missing from docs/PROMISES.md: {', '.join(missing)}; give each a row in the "
        "promise table of its section (Delivery; Quiet hours, consent, preferences; Read side, "
        "tenants, order; Audit and erasure), named in backticks in the checker column"
    )


def test_every_checker_is_in_the_checker_table_of_scenarios_md():
    section = _section(_read(DOCS / "SCENARIOS.md"), "### Promises and their checkers")
    column = _column(section, "| promise (seed) | checker", 1)
    assert column, "docs/SCENARIOS.md has no table under ### Promises and their checkers"
    missing = _missing(known(), _ticked(column))
    assert not missing, (
        f"checkers missing from docs/SCENARIOS.md: {', '.join(missing)}; give each a row in the "
        "table of ### Promises and their checkers, named in backticks in the checker column"
    )


# -- 2. faults --------------------------------------------------------------------------------

FAULTS_PARAGRAPH = "Faults (`chaos/faults/`, one module each):"


def test_every_fault_is_in_the_faults_paragraph_of_scenarios_md():
    text = _read(DOCS / "SCENARIOS.md")
    start = text.find(FAULTS_PARAGRAPH)
    assert start >= 0, f"docs/SCENARIOS.md no longer has the paragraph {FAULTS_PARAGRAPH!r}"
    paragraph = text[start:].split("\n\n", 1)[0]
    missing = _missing(chaos.faults.CATALOGUE, _ticked(paragraph))
    assert not missing, (
        f"faults missing from docs/SCENARIOS.md: {', '.join(missing)}; name each in backticks, "
        f"with its params and what it does, in the paragraph {FAULTS_PARAGRAPH!r} "
        "(## Scenario files)"
    )


# -- 3. scenarios -----------------------------------------------------------------------------


def test_every_shipped_scenario_has_a_row_in_the_readme_scenario_table():
    section = _section(_read(ROOT / "README.md"), "## Scenarios")
    first_cells = _column(section, "| scenario |", 0)
    assert first_cells, "README.md has no scenario table (| scenario | ...) under ## Scenarios"
    shipped = {p.stem for p in (ROOT / "scenarios").glob("*.yaml")}
    assert shipped, "no scenarios/*.yaml"
    missing = _missing(shipped, _ticked(first_cells))
    assert not missing, (
        f"shipped scenarios missing from README.md: {', '.join(missing)}; give each a row "
        "(| `name` | what happens | what must hold |) in the table under ## Scenarios"
    )


# -- 4. commands ------------------------------------------------------------------------------


def _subcommands() -> list[str]:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return list(sub.choices)


def test_every_subcommand_is_in_the_readme_or_runs_md():
    text = _read(ROOT / "README.md") + "\n" + _read(DOCS / "RUNS.md")
    commands = _subcommands()
    assert "run" in commands
    missing = [c for c in commands if not re.search(rf"python -m harness\s+{re.escape(c)}\b", text)]
    assert not missing, (
        f"`python -m harness` subcommands missing from README.md and docs/RUNS.md: "
        f"{', '.join(missing)}; give each a row (| `python -m harness <command>` | what it does "
        "| where |) in docs/RUNS.md's table under ## Every command"
    )


# -- 5. target keys ---------------------------------------------------------------------------


def _headings(section: str) -> set[str]:
    return set(re.findall(r"^### (\S+)$", section, flags=re.M))


@pytest.mark.parametrize(
    ("what", "keys", "section"),
    [("target", Target, "## Target keys"), ("policy", SystemPolicy, "## Policy keys")],
)
def test_every_target_and_policy_key_is_in_targets_md(what, keys, section):
    missing = _missing(
        (f.name for f in fields(keys)), _headings(_section(_read(DOCS / "TARGETS.md"), section))
    )
    assert not missing, (
        f"{what} keys missing from docs/TARGETS.md: {', '.join(missing)}; give each a "
        f"### <key> heading (type, default, what it does) under {section}"
    )


# The names a target key's own mapping takes, as target.py accepts them.
NESTED = {
    "hooks": HOOKS,
    "processes": PROCESS_HOOKS,
    "job_fields": JOB_FIELDS,
    "job_template": TEMPLATE_VALUES,  # as ${tenant}, ...
}


def test_every_name_a_target_key_takes_is_in_its_section_of_targets_md():
    doc = _read(DOCS / "TARGETS.md")
    gaps = []
    for key, names in NESTED.items():
        missing = _missing(names, _ticked(_section(doc, f"### {key}")))
        if missing:
            gaps.append(f"{', '.join(missing)} (in backticks under ### {key})")
    assert not gaps, f"docs/TARGETS.md does not name: {'; '.join(gaps)}"


# -- 6. totals --------------------------------------------------------------------------------

_NUMBER = (
    r"\d[\d,]*|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|"
    r"fourteen|fifteen|sixteen|seventeen|eighteen|nineteen|"
    r"(?:twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety)(?:[- ](?:one|two|three|four|"
    r"five|six|seven|eight|nine))?"
)
_NOUN = r"(?:checkers|scenarios|scenario files|faults)"
# A total: "all 24 checkers", "all of the 22 scenarios", "every one of the 29 faults", "each of
# the 18 checkers", "the 22 shipped scenarios", "29 registered checkers". A count of one run's
# probes ("its 18 checkers", "17 checkers" of celebrity-scale) is not one.
TOTAL = re.compile(
    rf"\b(?:(?:all|every one|each)(?:\s+of)?(?:\s+the)?\s+(?:{_NUMBER})\s+(?:\w+\s+)?{_NOUN}"
    rf"|(?:{_NUMBER})\s+(?:shipped|registered|known|built-in)\s+{_NOUN})\b",
    flags=re.I,
)


def _pages() -> dict[str, Path]:
    """README.md and every page of the docs site (docs/*.md and what docs/hooks.py brings in)."""
    pages = {"README.md": ROOT / "README.md"}
    pages |= {f"docs/{p.name}": p for p in sorted(DOCS.glob("*.md"))}
    pages |= {str(p.relative_to(ROOT)): p for p in outside_pages().values()}
    return pages


def test_no_doc_states_how_many_checkers_scenarios_or_faults_there_are():
    totals = {
        "checker": len(known()),
        "scenario": len(list((ROOT / "scenarios").glob("*.yaml"))),
        "fault": len(chaos.faults.CATALOGUE),
    }
    found = []
    for name, path in _pages().items():
        text = _read(path)
        for match in TOTAL.finditer(text):  # \s+ between words: a phrase may wrap
            phrase = " ".join(match.group(0).split())
            noun = next(n for n in totals if n in phrase.lower())
            line = text.count("\n", 0, match.start()) + 1
            found.append(
                f"{name}:{line}: {phrase!r} (the code has {totals[noun]} {noun}s now): say "
                f"'every {noun}', or tie the number to what it counted ('registered then')"
            )
    assert not found, "docs state a total the code will outgrow:\n" + "\n".join(found)


def test_the_totals_pattern_catches_a_total_and_leaves_a_runs_count():
    assert TOTAL.search("among all 24 checkers, whose total")
    assert TOTAL.search("every one of the twenty-two shipped scenarios")
    assert TOTAL.search("the 29 registered faults")
    assert not TOTAL.search("a DLQ redrive, 17 checkers) at about")
    assert not TOTAL.search("its 18 checkers over the store")
