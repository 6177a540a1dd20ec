"""The judging logic of tests/moto_sqs/run.py (the runner of moto's SQS suite), on made-up
JUnit XML: no download, no servers."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

RUN = Path(__file__).resolve().parent / "moto_sqs" / "run.py"
spec = importlib.util.spec_from_file_location("moto_sqs_run", RUN)
assert spec is not None and spec.loader is not None
run = importlib.util.module_from_spec(spec)
sys.modules["moto_sqs_run"] = run
spec.loader.exec_module(run)

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests.test_sqs.test_sqs" name="test_ok" time="0.1"/>
<testcase classname="tests.test_sqs.test_sqs" name="test_lenient" time="0.1">
  <failure message="moto accepts it">trace</failure></testcase>
<testcase classname="tests.test_sqs.test_sqs" name="test_broken[a-b]" time="0.1">
  <error message="setup failed">trace</error></testcase>
<testcase classname="tests.test_sqs.test_x.TestCls" name="test_m" time="0.1">
  <skipped type="pytest.skip" message="not applicable: sts">skip</skipped></testcase>
</testsuite></testsuites>
"""


def test_read_junit_names_tests_by_node_id(tmp_path: Path) -> None:
    path = tmp_path / "junit.xml"
    path.write_text(JUNIT)
    outcomes = {o.nodeid: o.status for o in run.read_junit(path)}
    assert outcomes == {
        "tests/test_sqs/test_sqs.py::test_ok": "passed",
        "tests/test_sqs/test_sqs.py::test_lenient": "failed",
        "tests/test_sqs/test_sqs.py::test_broken[a-b]": "failed",
        "tests/test_sqs/test_x.py::TestCls::test_m": "skipped",
    }


def test_judge_accepts_only_listed_failures_and_flags_stale_entries(tmp_path: Path) -> None:
    path = tmp_path / "junit.xml"
    path.write_text(JUNIT)
    outcomes = run.read_junit(path)
    lenient = "tests/test_sqs/test_sqs.py::test_lenient"
    broken = "tests/test_sqs/test_sqs.py::test_broken[a-b]"
    verdict = run.judge(outcomes, {lenient: "why", broken: "why"})
    assert verdict.ok and verdict.failed_expected == sorted([lenient, broken])
    verdict = run.judge(outcomes, {lenient: "why"})
    assert not verdict.ok and [o.nodeid for o in verdict.failed_unexpected] == [broken]
    ok = "tests/test_sqs/test_sqs.py::test_ok"
    verdict = run.judge(outcomes, {lenient: "why", broken: "why", ok: "listed, but passes"})
    assert not verdict.ok and verdict.stale_leniency == [ok]


def test_only_the_suite_and_its_helpers_are_extracted() -> None:
    assert run.wanted_member("moto-5.2.5/tests/test_sqs/test_sqs.py")
    assert run.wanted_member("moto-5.2.5/tests/__init__.py")
    assert not run.wanted_member("moto-5.2.5/tests/test_s3/test_s3.py")
    assert not run.wanted_member("moto-5.2.5/moto/sqs/models.py")
    assert not run.wanted_member("moto-5.2.5/tests/test_sqs/data.json")


def test_every_listed_failure_names_a_test_of_the_suite() -> None:
    for nodeid, reason in run.MOTO_LENIENCY.items():
        assert nodeid.startswith(run.SUITE_FILES[0] + "::") and reason
