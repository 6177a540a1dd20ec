"""Checkers: pure functions over a run's history and population that return a verdict.

Each module registers itself (:mod:`harness.checkers.registry`); a scenario's steady-state
probe names a checker and its tolerance, and :func:`run_probe` runs it.
"""

from __future__ import annotations

from harness.checkers.evidence import Evidence
from harness.checkers.registry import Checker, checker, get, known, run_probe
from harness.checkers.verdict import Verdict

__all__ = ["Checker", "Evidence", "Verdict", "checker", "get", "known", "run_probe"]
