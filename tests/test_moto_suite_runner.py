"""The runners of moto's own SQS and SNS suites (tests/moto_sqs/run.py, tests/moto_sns/run.py, both
on tests/moto_suite/moto_runner.py): the judging logic on made-up JUnit XML, and each runner's
own table, files and paths. No download, no servers."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

TESTS = Path(__file__).resolve().parent


def load_runner(service: str) -> ModuleType:
    """``tests/moto_<service>/run.py`` as a module (it is a script, not in a package)."""
    name = f"moto_{service}_run"
    spec = importlib.util.spec_from_file_location(name, TESTS / f"moto_{service}" / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


RUNNERS = {service: load_runner(service) for service in ("sqs", "sns")}
moto_runner = RUNNERS["sqs"].moto_runner

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
OK = "tests/test_sqs/test_sqs.py::test_ok"
LENIENT = "tests/test_sqs/test_sqs.py::test_lenient"
BROKEN = "tests/test_sqs/test_sqs.py::test_broken[a-b]"


def test_both_runners_share_one_runner() -> None:
    assert RUNNERS["sns"].moto_runner is moto_runner


def test_read_junit_names_tests_by_node_id(tmp_path: Path) -> None:
    path = tmp_path / "junit.xml"
    path.write_text(JUNIT)
    outcomes = {o.nodeid: o.status for o in moto_runner.read_junit(path)}
    assert outcomes == {
        OK: "passed",
        LENIENT: "failed",
        BROKEN: "failed",
        "tests/test_sqs/test_x.py::TestCls::test_m": "skipped",
    }


def test_judge_accepts_only_listed_failures_and_flags_stale_entries(tmp_path: Path) -> None:
    path = tmp_path / "junit.xml"
    path.write_text(JUNIT)
    outcomes = moto_runner.read_junit(path)
    verdict = moto_runner.judge(outcomes, {LENIENT: "why", BROKEN: "why"})
    assert verdict.ok and verdict.failed_expected == sorted([LENIENT, BROKEN])
    verdict = moto_runner.judge(outcomes, {LENIENT: "why"})
    assert not verdict.ok and [o.nodeid for o in verdict.failed_unexpected] == [BROKEN]
    leniency = {LENIENT: "why", BROKEN: "why", OK: "listed, but passes"}
    verdict = moto_runner.judge(outcomes, leniency)
    assert not verdict.ok and verdict.stale_leniency == [OK]
    summary = verdict.summary(leniency)
    assert summary["ran"] == 3 and summary["passed"] == 1


@pytest.mark.parametrize(
    ("service", "member", "wanted"),
    [
        ("sqs", "moto-5.2.5/tests/test_sqs/test_sqs.py", True),
        ("sqs", "moto-5.2.5/tests/__init__.py", True),
        ("sqs", "moto-5.2.5/tests/test_s3/test_s3.py", False),
        ("sqs", "moto-5.2.5/moto/sqs/models.py", False),
        ("sqs", "moto-5.2.5/tests/test_sqs/data.json", False),
        ("sns", "moto-5.2.5/tests/test_sns/test_topics.py", True),
        ("sns", "moto-5.2.5/tests/conftest.py", True),
        ("sns", "moto-5.2.5/tests/test_sqs/test_sqs.py", False),
        ("sns", "moto-5.2.5/moto/sns/models.py", False),
    ],
)
def test_only_the_suite_and_its_helpers_are_extracted(
    service: str, member: str, wanted: bool
) -> None:
    assert RUNNERS[service].SUITE.wanted_member(member) is wanted


@pytest.mark.parametrize("service", sorted(RUNNERS))
def test_every_listed_failure_names_a_test_of_the_suite_and_says_why(service: str) -> None:
    run = RUNNERS[service]
    assert run.SUITE.leniency is run.MOTO_LENIENCY and run.MOTO_LENIENCY
    for nodeid, reason in run.MOTO_LENIENCY.items():
        path, _, name = nodeid.partition("::")
        assert path in run.SUITE_FILES and name.startswith("test_") and len(reason) > 40, nodeid


@pytest.mark.parametrize("service", sorted(RUNNERS))
def test_each_runner_keeps_its_files_plugin_and_paths(service: str) -> None:
    suite = RUNNERS[service].SUITE
    assert all(f.startswith(f"tests/test_{service}/") for f in suite.suite_files)
    assert (TESTS / f"moto_{service}" / f"moto_{service}_plugin.py").is_file()
    assert (
        suite.plugin == f"moto_{service}_plugin" and suite.runner_dir == TESTS / f"moto_{service}"
    )
    assert suite.default_cache == TESTS.parent / ".cache" / f"moto-{service}"
    assert suite.default_json == TESTS.parent / "reports" / f"moto_{service}" / "summary.json"
