"""The runner of moto's own test suites against our endpoints, shared by ``tests/moto_sqs/run.py``
and ``tests/moto_sns/run.py``; each of those gives a :class:`MotoSuite` (the service, its suite
files, its table of moto's leniency, which endpoints to start) and calls :func:`main`.

1. The suite comes from moto's source distribution on PyPI at a pinned version
   (:data:`MOTO_VERSION`, checked against :data:`MOTO_SDIST_SHA256`): ``pip download`` it once
   into a git-ignored cache (``.cache/moto-<service>/``) and extract moto's
   ``tests/test_<service>/`` and the test helpers it imports (:data:`HELPER_FILES`, and any the
   runner adds). Nothing of it is kept in this repository.
2. The runner's endpoints start, one of them on ``127.0.0.1:5000`` (where moto's server-mode
   suite, ``TEST_SERVER_MODE=true``, finds its server) with moto's default account
   (:data:`MOTO_ACCOUNT_ID`); moto's own server answers every other service (STS for the
   ``account_id`` fixture), so nothing leaves the machine.
3. pytest runs the suite with the runner's plugin (``moto_<service>_plugin``, built on
   ``moto_plugin.py`` beside this file: ``mock_aws`` mocks nothing and resets our endpoints).
4. Each test's outcome is read from the JUnit XML. The run passes (exit 0) when every failure is
   in the runner's ``MOTO_LENIENCY`` (moto accepts or answers what AWS documents otherwise; the
   reason is given) and each of those still fails (a stale entry is an error too). Exit 1
   otherwise; exit 2 when the suite cannot be fetched, port 5000 is taken or an endpoint does
   not start. A summary is written as JSON (``reports/moto_<service>/summary.json``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from moto_plugin import RESET_URLS_ENV

from emulators.ports import LOOPBACK, port_in_use
from emulators.sqs.processes import start_moto

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
ROOT = TESTS.parent

MOTO_VERSION = "5.2.5"
MOTO_SDIST_SHA256 = "391857257d5dac144334013c2c10e599def5f0562f553e979160140bd7bd9cf6"
MOTO_ACCOUNT_ID = "123456789012"
SERVER_MODE_PORT = 5000  # moto's suite hard-codes http://localhost:5000 in server mode
HELPER_FILES = ("tests/__init__.py", "tests/conftest.py", "tests/markers.py")


class SuiteError(RuntimeError):
    """The suite could not be fetched or started (exit 2)."""


@dataclass(frozen=True)
class Endpoints:
    """What a runner's started endpoints tell moto's suite: ``AWS_ENDPOINT_URL_<SERVICE>``
    variables, and the URLs the plugin POSTs to reset them when a mocked test starts."""

    env: dict[str, str]
    reset_urls: list[str]


@dataclass(frozen=True)
class MotoSuite:
    """One service's run of moto's suite: all a runner holds that is its own."""

    service: str  # "SQS": moto's tests/test_sqs/, tests/moto_sqs/moto_sqs_plugin.py, ...
    suite_files: tuple[str, ...]
    leniency: dict[str, str]  # node id -> why moto, not our endpoint, is the one that differs
    # starts the endpoints (each entered into the stack, which stops them) and says where they are
    start_endpoints: Callable[[ExitStack], Endpoints]
    doc: str = ""  # the runner's docstring; its first paragraph is the --help description
    helper_files: tuple[str, ...] = field(default=HELPER_FILES)

    @property
    def slug(self) -> str:
        return self.service.lower()

    @property
    def package(self) -> str:
        """moto's test package of the service, relative to moto's checkout."""
        return f"tests/test_{self.slug}/"

    @property
    def plugin(self) -> str:
        return f"moto_{self.slug}_plugin"

    @property
    def runner_dir(self) -> Path:
        return TESTS / f"moto_{self.slug}"

    @property
    def default_cache(self) -> Path:
        return ROOT / ".cache" / f"moto-{self.slug}"

    @property
    def default_json(self) -> Path:
        return ROOT / "reports" / f"moto_{self.slug}" / "summary.json"

    def wanted_member(self, name: str) -> bool:
        """Whether an sdist member (``moto-X/tests/...``) is part of what we extract."""
        _, _, rel = name.partition("/")
        return rel in self.helper_files or (rel.startswith(self.package) and rel.endswith(".py"))


# ---------------------------------------------------------------------------------------------
# Fetching the suite
# ---------------------------------------------------------------------------------------------
def suite_dir(cache: Path) -> Path:
    return cache / f"moto-{MOTO_VERSION}"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def ensure_suite(suite: MotoSuite, cache: Path) -> Path:
    """The extracted suite, fetched with pip at the pinned version if it is not cached yet."""
    target = suite_dir(cache)
    if all((target / f).is_file() for f in (*suite.suite_files, *suite.helper_files)):
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            f"moto=={MOTO_VERSION}",
            "--no-deps",
            "--no-binary",
            ":all:",
            "--disable-pip-version-check",
            "-q",
            "-d",
            tmp,
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        sdist = Path(tmp) / f"moto-{MOTO_VERSION}.tar.gz"
        if done.returncode != 0 or not sdist.is_file():
            raise SuiteError(f"pip download of moto=={MOTO_VERSION} failed:\n{done.stderr[-2000:]}")
        got = sha256_of(sdist)
        if got != MOTO_SDIST_SHA256:
            raise SuiteError(f"moto-{MOTO_VERSION}.tar.gz has sha256 {got}, not the pinned one")
        with tarfile.open(sdist) as tar:
            members = [m for m in tar.getmembers() if m.isfile() and suite.wanted_member(m.name)]
            tar.extractall(tmp, members=members, filter="data")
        extracted = Path(tmp) / f"moto-{MOTO_VERSION}"
        if target.exists():
            remove_tree(target)
        extracted.rename(target)
    return target


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


# ---------------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------------
def run_pytest(
    suite: MotoSuite,
    checkout: Path,
    endpoints: Endpoints,
    moto_url: str,
    args: argparse.Namespace,
) -> Path:
    """pytest over the suite's files in moto's extracted ``checkout``; the JUnit XML's path."""
    junit = checkout / "junit.xml"
    if junit.exists():
        junit.unlink()
    # Our own ini file in the suite's directory makes it pytest's rootdir, so this repository's
    # pytest settings (found in a parent directory otherwise) do not apply and node ids are
    # relative to moto's checkout.
    ini = checkout / "pytest.ini"
    ini.write_text("[pytest]\nmarkers =\n    aws_verified: verified against AWS by moto\n")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(suite.runner_dir), str(HERE), str(checkout)]),
        "TEST_SERVER_MODE": "true",
        "AWS_ENDPOINT_URL": moto_url,
        **endpoints.env,
        # moto's placeholder credentials, as its suite sets them; our endpoints read only the
        # region of a request's SigV4 scope, never the key
        "AWS_ACCESS_KEY_ID": "FOOBARKEY",
        "AWS_SECRET_ACCESS_KEY": "FOOBARSECRET",
        "AWS_DEFAULT_REGION": "us-east-1",
        RESET_URLS_ENV: " ".join(endpoints.reset_urls),
    }
    for var in (
        "AWS_PROFILE",
        "AWS_SESSION_TOKEN",
        "AWS_CONFIG_FILE",
        "AWS_SHARED_CREDENTIALS_FILE",
    ):
        env.pop(var, None)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        suite.plugin,
        "-c",
        str(ini),
        f"--rootdir={checkout}",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",
        "-q",
        "--tb=line",
        f"--junitxml={junit}",
        *([f"-k={args.k}"] if args.k else []),
        *suite.suite_files,
    ]
    log = checkout / "pytest.log"
    with log.open("w") as fh:
        try:
            subprocess.run(
                cmd,
                cwd=checkout,
                env=env,
                stdout=fh,
                stderr=subprocess.STDOUT,
                timeout=args.timeout,
            )
        except subprocess.TimeoutExpired:
            raise SuiteError(
                f"moto's {suite.service} suite did not finish within {args.timeout:.0f}s ({log})"
            ) from None
    if not junit.is_file():
        raise SuiteError(f"pytest wrote no results; its output: {log}")
    return junit


def main(suite: MotoSuite, argv: list[str] | None = None) -> int:
    """The runner's command line: fetch, start, run, judge; the exit code (0, 1 or 2)."""
    parser = argparse.ArgumentParser(
        prog=f"tests/moto_{suite.slug}/run.py", description=suite.doc.split("\n\n")[0]
    )
    parser.add_argument("--cache", type=Path, default=suite.default_cache)
    parser.add_argument(
        "--json", type=Path, default=suite.default_json, help="summary written here"
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds for the whole suite")
    parser.add_argument("-k", help="pytest -k expression (a partial run is never judged ok)")
    args = parser.parse_args(argv)
    try:
        checkout = ensure_suite(suite, args.cache)
        if port_in_use(SERVER_MODE_PORT, LOOPBACK):
            raise SuiteError(
                f"port {SERVER_MODE_PORT} on {LOOPBACK} is taken: moto's suite expects its server "
                "there in server mode; stop what holds it (ss -ltnp 'sport = :5000')"
            )
        started = time.monotonic()
        with ExitStack() as stack:  # stops moto's server, then the runner's endpoints
            endpoints = suite.start_endpoints(stack)
            other = stack.enter_context(start_moto())
            junit = run_pytest(suite, checkout, endpoints, other.url, args)
        elapsed = time.monotonic() - started
    except RuntimeError as exc:  # a SuiteError, or an endpoint that did not start
        print(f"moto-{suite.slug}: {exc}", file=sys.stderr)
        return 2
    verdict = judge(read_junit(junit), suite.leniency)
    summary = {**verdict.summary(suite.leniency), "seconds": round(elapsed, 1)}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(summary, indent=2) + "\n")
    print(
        f"moto {MOTO_VERSION} {suite.service} suite against our endpoint: {summary['passed']} of "
        f"{summary['ran']} passed, {len(verdict.failed_expected)} fail on moto's leniency, "
        f"{len(verdict.failed_unexpected)} unexpected failures, {len(verdict.skipped)} skipped "
        f"({elapsed:.0f}s; {args.json})"
    )
    for outcome in verdict.failed_unexpected:
        print(f"  UNEXPECTED FAILURE {outcome.nodeid}: {outcome.detail[:200]}")
    for nodeid in [] if args.k else verdict.stale_leniency:
        print(f"  STALE LENIENCY ENTRY (now passes or did not run) {nodeid}")
    if args.k:
        return 0 if not verdict.failed_unexpected else 1
    return 0 if verdict.ok else 1
