"""The dependency rules that keep the verifier honest (docs/ARCHITECTURE.md), checked on every
import statement of every module, function-level ones included:

* the reference implementation is one target: only ``harness/stack/reference.py`` imports it;
* the checkers know a system only through the model and the contract;
* the emulators stand alone, as moto does; chaos sits below the harness (it imports neither the
  harness nor the reference); the reference knows nothing of what tests it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import ROOT

REFERENCE_ADAPTER = "harness/stack/reference.py"


def imported(source: str) -> set[str]:
    """Every module a source file imports (``from a.b import c`` counts as ``a.b``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _top(name: str) -> str:
    return name.split(".")[0]


def violations(relative: str, source: str) -> list[str]:
    """What ``relative`` (a path from the repository root) imports that the rules forbid."""
    found = []
    package = relative.split("/")[0]
    for name in sorted(imported(source)):
        top = _top(name)
        if top == "reference_impl" and package in ("harness", "chaos", "locustfiles", "emulators"):
            if relative != REFERENCE_ADAPTER:
                found.append(f"{relative} imports {name}: only {REFERENCE_ADAPTER} may")
        if package == "emulators" and top in ("harness", "chaos", "reference_impl", "systems"):
            found.append(f"{relative} imports {name}: the emulators stand alone")
        if package == "chaos" and top in ("harness", "reference_impl"):
            found.append(f"{relative} imports {name}: chaos acts from outside, below the harness")
        if package == "reference_impl" and top in ("harness", "chaos", "emulators", "locustfiles"):
            found.append(f"{relative} imports {name}: the system under test knows no tester")
        if relative.startswith("harness/checkers/") and top == "harness":
            allowed = ("harness.model", "harness.contract", "harness.checkers")
            if not name.startswith(allowed):
                found.append(f"{relative} imports {name}: checkers read the model and contract")
    return found


def _modules() -> list[Path]:
    roots = ("harness", "chaos", "emulators", "reference_impl", "locustfiles")
    return sorted(p for r in roots for p in (ROOT / r).rglob("*.py"))


def test_the_dependency_rules_hold_in_every_module():
    found = [
        v for path in _modules() for v in violations(str(path.relative_to(ROOT)), path.read_text())
    ]
    assert found == []
    assert len(_modules()) > 100  # the walk really saw the code


@pytest.mark.parametrize(
    ("where", "line", "message"),
    [
        ("harness/run/runner.py", "from reference_impl.config import Config", "only harness/stack"),
        ("chaos/faults.py", "import reference_impl.ids", "only harness/stack"),
        ("emulators/sqs/model.py", "from harness.model import history", "stand alone"),
        ("chaos/nemesis.py", "from harness.model.history import History", "below the harness"),
        ("reference_impl/inbox.py", "from harness.checkers import inbox", "knows no tester"),
        ("harness/checkers/inbox.py", "from harness.run.runner import run", "model and contract"),
        (
            "harness/checkers/consent.py",
            "def f():\n    from harness.stack.supervisor import Stack",
            "model and contract",
        ),
    ],
)
def test_a_forbidden_import_is_caught(where, line, message):
    assert any(message in v for v in violations(where, line))


def test_what_is_allowed_stays_allowed():
    assert violations(REFERENCE_ADAPTER, "from reference_impl.config import Config") == []
    assert violations("harness/checkers/inbox.py", "from harness.model.inbox import walks") == []
    assert violations("harness/checkers/x.py", "from harness.contract.system import Queues") == []
