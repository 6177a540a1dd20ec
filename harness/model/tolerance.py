"""Chaos Toolkit's probe tolerances, judged as chaostoolkit-lib judges them
(``chaoslib/hypothesis.py::within_tolerance``), for the forms a scenario may use: a boolean, a
number, a string, a list (two numbers: a closed range; otherwise the allowed values) and the
``range`` and ``regex`` mappings (with an optional ``target`` key of a mapping output).

Written here rather than imported because the harness must not need Chaos Toolkit to run; a test
compares every form against chaostoolkit-lib's own function. Tolerances that call another probe
(``type: probe``) or need an extra package (``jsonpath``) are refused with a message.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from numbers import Number
from typing import Any

SUPPORTED = "a boolean, a number, a string, a list, or {type: range | regex}"


class ToleranceError(ValueError):
    """A tolerance the harness cannot judge."""


def check_tolerance(tolerance: Any) -> None:
    """Raise ToleranceError for a tolerance of a form the harness does not judge."""
    if isinstance(tolerance, bool | int | str | list):
        return
    if not isinstance(tolerance, Mapping):
        raise ToleranceError(f"a tolerance must be {SUPPORTED}, not {type(tolerance).__name__}")
    kind = tolerance.get("type")
    if kind == "range":
        bounds = tolerance.get("range")
        if (
            not isinstance(bounds, list)
            or len(bounds) != 2
            or not all(isinstance(b, Number) for b in bounds)
        ):
            raise ToleranceError("a range tolerance needs range: [low, high] (two numbers)")
    elif kind == "regex":
        pattern = tolerance.get("pattern")
        if not isinstance(pattern, str):
            raise ToleranceError("a regex tolerance needs a pattern (a string)")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ToleranceError(f"regex tolerance pattern {pattern!r} is invalid: {exc}") from exc
    else:
        raise ToleranceError(
            f"tolerance type {kind!r} is not judged by the harness; use {SUPPORTED}"
        )


def within_tolerance(tolerance: Any, value: Any) -> bool:
    """Whether ``value`` (a probe's output) meets ``tolerance``, as Chaos Toolkit decides."""
    check_tolerance(tolerance)
    # bool before int: True is an int too, and Chaos Toolkit dispatches on the exact type.
    if isinstance(tolerance, bool):
        return value == tolerance
    if isinstance(tolerance, str):
        return value == tolerance
    if isinstance(tolerance, int):
        if isinstance(value, Mapping) and "status" in value:
            return value["status"] == tolerance
        return value == tolerance
    if isinstance(tolerance, list):
        if isinstance(value, Mapping) and "status" in value:
            return value["status"] in tolerance
        if len(tolerance) == 2:
            try:
                return tolerance[0] <= value <= tolerance[1]
            except TypeError:
                return False
        return value in tolerance
    target = tolerance.get("target")
    if target and isinstance(value, Mapping):
        value = value.get(target, value)
    if tolerance["type"] == "regex":
        return isinstance(value, str) and re.search(tolerance["pattern"], value) is not None
    try:
        number = Decimal(value)
    except (InvalidOperation, TypeError, ValueError):
        return False
    low, high = tolerance["range"]
    return Decimal(low) <= number <= Decimal(high)


# What the harness's Chaos Toolkit probes return carries the checker's verdict under this key
# (pass, fail, unknown, or off: switched off on a system without what it needs), beside its
# counts; the shipped files' tolerance accepts a pass, or a checker the system cannot be judged
# by (the harness counts those neither way), and nothing else.
VERDICT_KEY = "verdict"
VERDICT_TOLERANCE = {"type": "regex", "target": VERDICT_KEY, "pattern": "^(pass|off)$"}


def judges_verdicts(tolerance: Any) -> bool:
    """Whether ``tolerance`` accepts a passing or switched-off verdict and refuses a failing or
    unknown one (what the harness itself decides), so that Chaos Toolkit and the harness agree."""
    outputs = {
        status: {"checker": "any", VERDICT_KEY: status, "valid": valid}
        for status, valid in (("pass", True), ("off", None), ("fail", False), ("unknown", None))
    }
    return (
        within_tolerance(tolerance, outputs["pass"])
        and within_tolerance(tolerance, outputs["off"])
        and not within_tolerance(tolerance, outputs["fail"])
        and not within_tolerance(tolerance, outputs["unknown"])
    )
