"""The judging logic of tests/moto_sns/run.py (the runner of moto's SNS suite), on made-up JUnit
XML: no download, no servers."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

RUN = Path(__file__).resolve().parent / "moto_sns" / "run.py"
spec = importlib.util.spec_from_file_location("moto_sns_run", RUN)
assert spec is not None and spec.loader is not None
run = importlib.util.module_from_spec(spec)
sys.modules["moto_sns_run"] = run
spec.loader.exec_module(run)

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests.test_sns.test_topics" name="test_ok" time="0.1"/>
<testcase classname="tests.test_sns.test_topics" name="test_lenient" time="0.1">
  <failure message="moto accepts it">trace</failure></testcase>
<testcase classname="tests.test_sns.test_publishing" name="test_broken" time="0.1">
  <error message="setup failed">trace</error></testcase>
<testcase classname="tests.test_sns.test_topics" name="test_config" time="0.1">
  <skipped type="pytest.skip" message="not applicable: config">skip</skipped></testcase>
</testsuite></testsuites>
"""


def test_judge_accepts_only_listed_failures_and_flags_stale_entries(tmp_path: Path) -> None:
    path = tmp_path / "junit.xml"
    path.write_text(JUNIT)
    outcomes = run.read_junit(path)
    assert {o.nodeid: o.status for o in outcomes} == {
        "tests/test_sns/test_topics.py::test_ok": "passed",
        "tests/test_sns/test_topics.py::test_lenient": "failed",
        "tests/test_sns/test_publishing.py::test_broken": "failed",
        "tests/test_sns/test_topics.py::test_config": "skipped",
    }
    lenient = "tests/test_sns/test_topics.py::test_lenient"
    broken = "tests/test_sns/test_publishing.py::test_broken"
    assert run.judge(outcomes, {lenient: "why", broken: "why"}).ok
    verdict = run.judge(outcomes, {lenient: "why"})
    assert not verdict.ok and [o.nodeid for o in verdict.failed_unexpected] == [broken]
    ok = "tests/test_sns/test_topics.py::test_ok"
    verdict = run.judge(outcomes, {lenient: "why", broken: "why", ok: "listed, but passes"})
    assert not verdict.ok and verdict.stale_leniency == [ok]
    summary = verdict.summary({lenient: "why", broken: "why", ok: "x"})
    assert summary["ran"] == 3 and summary["passed"] == 1


def test_only_the_suite_and_its_helpers_are_extracted() -> None:
    assert run.wanted_member("moto-5.2.5/tests/test_sns/test_topics.py")
    assert run.wanted_member("moto-5.2.5/tests/conftest.py")
    assert not run.wanted_member("moto-5.2.5/tests/test_sqs/test_sqs.py")
    assert not run.wanted_member("moto-5.2.5/moto/sns/models.py")


def test_every_listed_failure_names_a_test_of_the_suite_and_says_why() -> None:
    for nodeid, reason in run.MOTO_LENIENCY.items():
        path, _, name = nodeid.partition("::")
        assert path in run.SUITE_FILES and name.startswith("test_") and len(reason) > 40, nodeid
