"""Chaos Toolkit's probe tolerances as the harness judges them: the same answers as
chaostoolkit-lib's own ``within_tolerance`` for every form the harness accepts."""

from __future__ import annotations

import pytest

from harness.model.tolerance import (
    VERDICT_TOLERANCE,
    ToleranceError,
    check_tolerance,
    judges_verdicts,
    within_tolerance,
)

chaoslib_hypothesis = pytest.importorskip("chaoslib.hypothesis")

PASS = {"checker": "x", "verdict": "pass", "valid": True, "lost": 0}
FAIL = {"checker": "x", "verdict": "fail", "valid": False, "lost": 3}
UNKNOWN = {"checker": "x", "verdict": "unknown", "valid": None}

CASES = [
    (True, True),
    (True, False),
    (False, False),
    (True, 1),
    (0, 0),
    (0, 1),
    (200, {"status": 200}),
    (200, {"status": 500}),
    ("ok", "ok"),
    ("ok", "OK"),
    ([1, 5], 3),
    ([1, 5], 5),
    ([1, 5], 6),
    ([1, 5], 0.5),
    (["a", "b", "c"], "b"),
    (["a", "b", "c"], "d"),
    ([200, 201], {"status": 201}),
    ({"type": "range", "range": [0, 10]}, 10),
    ({"type": "range", "range": [0, 10]}, 10.5),
    ({"type": "range", "range": [0.9, 1.0], "target": "share"}, {"share": 0.95}),
    ({"type": "range", "range": [0.9, 1.0], "target": "share"}, {"share": 0.5}),
    ({"type": "regex", "pattern": "^pass$", "target": "verdict"}, PASS),
    ({"type": "regex", "pattern": "^pass$", "target": "verdict"}, FAIL),
    ({"type": "regex", "pattern": "^pass$", "target": "verdict"}, UNKNOWN),
    ({"type": "regex", "pattern": "pass|unknown", "target": "verdict"}, UNKNOWN),
    ({"type": "regex", "pattern": "^de"}, "deviated"),
    ({"type": "range", "range": [1, 1], "target": "valid"}, PASS),
    ({"type": "range", "range": [1, 1], "target": "valid"}, FAIL),
]


@pytest.mark.parametrize(("tolerance", "value"), CASES)
def test_the_harness_judges_as_chaos_toolkit_does(tolerance, value):
    expected = chaoslib_hypothesis.within_tolerance(tolerance, value)
    assert within_tolerance(tolerance, value) == expected


def test_where_chaos_toolkit_raises_the_harness_says_not_met():
    # A regex over a number, a range over None: chaoslib raises; a probe must not crash the run.
    assert within_tolerance({"type": "regex", "pattern": "1"}, 1) is False
    assert within_tolerance({"type": "range", "range": [0, 1], "target": "valid"}, UNKNOWN) is False
    assert within_tolerance([1, 5], "three") is False


@pytest.mark.parametrize(
    ("tolerance", "message"),
    [
        ({"type": "probe", "name": "x"}, "tolerance type 'probe' is not judged"),
        ({"type": "jsonpath", "path": "$.a"}, "tolerance type 'jsonpath' is not judged"),
        ({"type": "range", "range": [1]}, "two numbers"),
        ({"type": "regex", "pattern": "("}, "is invalid"),
        (1.5, "not float"),
    ],
)
def test_tolerances_the_harness_cannot_judge_are_named(tolerance, message):
    with pytest.raises(ToleranceError, match=message):
        check_tolerance(tolerance)


def test_the_shipped_verdict_tolerance_accepts_a_pass_only():
    assert judges_verdicts(VERDICT_TOLERANCE)
    assert not judges_verdicts({"type": "regex", "target": "verdict", "pattern": "pass|unknown"})
    # A switched-off checker must not make Chaos Toolkit deviate where the harness passes.
    assert not judges_verdicts({"type": "regex", "target": "verdict", "pattern": "^pass$"})
    assert not judges_verdicts(True)
    assert not judges_verdicts({"type": "regex", "target": "verdict", "pattern": "fail"})
