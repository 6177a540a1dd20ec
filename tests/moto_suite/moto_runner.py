"""What the runners of moto's own test suites (``tests/moto_sqs/run.py``,
``tests/moto_sns/run.py``) share: the pinned moto version, reading pytest's JUnit XML and judging
the outcomes against a runner's table of moto's leniency."""

from __future__ import annotations

import hashlib
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

MOTO_VERSION = "5.2.5"
MOTO_SDIST_SHA256 = "391857257d5dac144334013c2c10e599def5f0562f553e979160140bd7bd9cf6"
MOTO_ACCOUNT_ID = "123456789012"
SERVER_MODE_PORT = 5000  # moto's suite hard-codes http://localhost:5000 in server mode


class SuiteError(RuntimeError):
    """The suite could not be fetched or started (exit 2)."""


# ---------------------------------------------------------------------------------------------
# Fetching the suite
# ---------------------------------------------------------------------------------------------
def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def remove_tree(path: Path) -> None:
    for child in sorted(path.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        child.rmdir() if child.is_dir() else child.unlink()
    path.rmdir()


# ---------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------
@dataclass
class Outcome:
    nodeid: str
    status: str  # passed | failed | skipped
    detail: str = ""


def read_junit(path: Path) -> list[Outcome]:
    """Outcomes per test from pytest's JUnit XML (a setup error counts as a failure)."""
    out: dict[str, Outcome] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        classname = case.get("classname", "")
        name = case.get("name", "")
        parts = classname.split(".")
        # classname is "tests.test_sqs.test_sqs" or "...test_x.TestClass"
        module_parts = [p for p in parts if not p[:1].isupper()]
        klass = [p for p in parts if p[:1].isupper()]
        nodeid = "/".join(module_parts) + ".py::" + "::".join([*klass, name])
        status, detail = "passed", ""
        for tag in ("failure", "error"):
            el = case.find(tag)
            if el is not None:
                status, detail = "failed", (el.get("message") or "")[:500]
        skipped = case.find("skipped")
        if status == "passed" and skipped is not None:
            status, detail = "skipped", (skipped.get("message") or "")[:300]
        previous = out.get(nodeid)
        if previous is None or status == "failed":
            out[nodeid] = Outcome(nodeid, status, detail)
    return list(out.values())


@dataclass
class Verdict:
    passed: list[str]
    failed_expected: list[str]
    failed_unexpected: list[Outcome]
    stale_leniency: list[str]
    skipped: list[Outcome]

    @property
    def ok(self) -> bool:
        return not self.failed_unexpected and not self.stale_leniency

    def summary(self, leniency: dict[str, str]) -> dict[str, object]:
        ran = len(self.passed) + len(self.failed_expected) + len(self.failed_unexpected)
        return {
            "moto_version": MOTO_VERSION,
            "ran": ran,
            "passed": len(self.passed),
            "failed_moto_leniency": {n: leniency[n] for n in self.failed_expected},
            "failed_unexpected": {o.nodeid: o.detail for o in self.failed_unexpected},
            "stale_leniency_entries": self.stale_leniency,
            "skipped": {o.nodeid: o.detail for o in self.skipped},
            "ok": self.ok,
        }


def judge(outcomes: list[Outcome], leniency: dict[str, str]) -> Verdict:
    passed = [o.nodeid for o in outcomes if o.status == "passed"]
    failed = [o for o in outcomes if o.status == "failed"]
    seen = {o.nodeid: o.status for o in outcomes}
    return Verdict(
        passed=sorted(passed),
        failed_expected=sorted(o.nodeid for o in failed if o.nodeid in leniency),
        failed_unexpected=[o for o in failed if o.nodeid not in leniency],
        stale_leniency=sorted(n for n in leniency if seen.get(n) not in (None, "failed")),
        skipped=[o for o in outcomes if o.status == "skipped"],
    )
