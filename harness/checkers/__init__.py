"""Checkers: pure functions over a run's history and population that return a verdict."""

from harness.checkers.verdict import Verdict

__all__ = ["Verdict"]
