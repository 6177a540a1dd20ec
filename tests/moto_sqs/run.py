"""Run moto's own SQS test suite against our SQS endpoint, and judge the result.

    .venv/bin/python tests/moto_sqs/run.py [--cache DIR] [--json PATH] [--timeout S] [-k EXPR]

1. The suite comes from moto's source distribution on PyPI at a pinned version
   (:data:`MOTO_VERSION`, checked against :data:`MOTO_SDIST_SHA256`): ``pip download`` it once
   into a git-ignored cache (``.cache/moto-sqs/``) and extract ``tests/test_sqs/`` and the
   test helpers it imports (``tests/__init__.py``, ``tests/conftest.py``, ``tests/markers.py``).
   Nothing of it is kept in this repository.
2. Our endpoint starts on ``127.0.0.1:5000`` with moto's default account (123456789012): in
   server mode (``TEST_SERVER_MODE=true``, the mode moto's suite has for an out-of-process
   server) the tests expect queue URLs under ``http://localhost:5000``. moto's own server serves
   every other service (STS for the ``account_id`` fixture), so nothing leaves the machine.
3. pytest runs the suite with ``moto_sqs_plugin`` (``mock_aws`` mocks nothing; see there).
4. Each test's outcome is read from the JUnit XML. The run passes (exit 0) when every failure is
   one of :data:`MOTO_LENIENCY` (moto accepts or answers what AWS's documentation says it does
   not; the reason is given) and each of those still fails (a stale entry is an error too).
   Exit 1 otherwise; exit 2 when the suite cannot be fetched or port 5000 is taken.

Files of moto's ``tests/test_sqs/`` not run, and why: ``test_server.py`` drives moto's own
Flask app in-process; ``test_sqs_cloudformation.py`` tests moto's CloudFormation;
``test_sqs_integration.py`` needs moto's Lambda and Docker; ``test_sqs_authentication.py``
tests moto's IAM enforcement (decorator mode only).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for _path in (ROOT, HERE.parent / "moto_suite"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from moto_runner import (  # noqa: E402
    MOTO_ACCOUNT_ID,
    MOTO_SDIST_SHA256,
    MOTO_VERSION,
    SERVER_MODE_PORT,
    SuiteError,
    judge,
    read_junit,
    remove_tree,
    sha256_of,
)

from emulators.ports import LOOPBACK, port_in_use  # noqa: E402
from emulators.sqs.processes import EndpointProcess, start_moto, start_ours  # noqa: E402

SUITE_FILES = (
    "tests/test_sqs/test_sqs.py",
    "tests/test_sqs/test_sqs_message_attributes.py",
    "tests/test_sqs/test_sqs_multiaccount.py",
)
HELPER_FILES = ("tests/__init__.py", "tests/conftest.py", "tests/markers.py")
DEFAULT_CACHE = ROOT / ".cache" / "moto-sqs"
DEFAULT_JSON = ROOT / "reports" / "moto_sqs" / "summary.json"

# Tests that fail because moto accepts or answers what AWS's documentation says it does not
# (or, for the old receipt handles, where the documentation allows both answers). node id ->
# the documentation's word (API reference 2012-11-05, as botocore ships it).
_T = "tests/test_sqs/test_sqs.py::"
_UNKNOWN_ATTRIBUTE = (
    'creates the queue with the attribute name "VisibilityTimeout " (trailing space), which '
    "moto ignores; the attribute names are a fixed set (QueueAttributeName) and an unknown one "
    'is InvalidAttributeName (CreateQueue: "The specified attribute doesn\'t exist.")'
)
_OLD_HANDLE = (
    "uses a receipt handle from an earlier receive: DeleteMessage's reference says \"If you use "
    'an old ReceiptHandle, the request will succeed, but the message might not be deleted", and '
    "the endpoint keeps that reading (an old handle neither deletes nor changes the message; the "
    "harness's redelivery faults rely on it), where moto lets old handles act"
)
_HANDLE_MESSAGE = (
    'expects moto\'s wording "The input receipt handle is invalid."; SQS answers '
    'ReceiptHandleIsInvalid with \'The input receipt handle "<handle>" is not a valid receipt '
    "handle.' (the code, which the test also checks, is the same)"
)
MOTO_LENIENCY: dict[str, str] = {
    _T + "test_create_queue_with_different_attributes_fail": (
        'creates a queue with FifoQueue="tru", which moto takes for false; CreateQueue: '
        '"FifoQueue – Designates a queue as FIFO. Valid values are true and false."'
    ),
    _T + "test_message_retention_period": (
        'creates a queue with MessageRetentionPeriod=1; CreateQueue: "Valid values: An integer '
        'from 60 seconds (1 minute) to 1,209,600 seconds (14 days)."'
    ),
    _T + "test_get_queue_attributes": (
        "expects RedrivePolicy rendered by Python's json.dumps (with spaces); SQS returns it as "
        'compact JSON (GetQueueAttributes examples: "{\\"deadLetterTargetArn\\":\\"arn:...'
        '\\",\\"maxReceiveCount\\":1000}")'
    ),
    _T + "test_message_becomes_inflight_when_received": _UNKNOWN_ATTRIBUTE,
    _T + "test_receive_message_with_explicit_visibility_timeout": _UNKNOWN_ATTRIBUTE,
    _T + "test_change_message_visibility": _UNKNOWN_ATTRIBUTE,
    _T + "test_queue_length": _UNKNOWN_ATTRIBUTE,
    _T + "test_delete_batch_operation": _UNKNOWN_ATTRIBUTE,
    _T + "test_delete_message_after_visibility_timeout": _UNKNOWN_ATTRIBUTE,
    _T + "test_change_message_visibility_on_unknown_receipt_handle": _HANDLE_MESSAGE,
    _T + "test_delete_message_errors": _HANDLE_MESSAGE,
    _T + "test_change_message_visibility_on_old_message": _OLD_HANDLE,
    _T + "test_delete_message_using_old_receipt_handle": _OLD_HANDLE,
    _T + "test_batch_change_message_visibility_on_old_message": _OLD_HANDLE,
    _T + "test_message_delay_is_more_than_15_minutes": (
        "sends MessageDeduplicationId to a standard queue; SendMessageBatchRequestEntry: "
        '"This parameter applies only to FIFO (first-in-first-out) queues", and SQS refuses it '
        '("The request include parameter that is not valid for this queue type")'
    ),
}


# ---------------------------------------------------------------------------------------------
# Fetching the suite
# ---------------------------------------------------------------------------------------------
def suite_dir(cache: Path) -> Path:
    return cache / f"moto-{MOTO_VERSION}"


def wanted_member(name: str) -> bool:
    """Whether an sdist member (``moto-X/tests/...``) is part of what we extract."""
    _, _, rel = name.partition("/")
    return rel in HELPER_FILES or (rel.startswith("tests/test_sqs/") and rel.endswith(".py"))


def ensure_suite(cache: Path) -> Path:
    """The extracted suite, fetched with pip at the pinned version if it is not cached yet."""
    target = suite_dir(cache)
    if all((target / f).is_file() for f in (*SUITE_FILES, *HELPER_FILES)):
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
            members = [m for m in tar.getmembers() if m.isfile() and wanted_member(m.name)]
            tar.extractall(tmp, members=members, filter="data")
        extracted = Path(tmp) / f"moto-{MOTO_VERSION}"
        if target.exists():
            remove_tree(target)
        extracted.rename(target)
    return target


# ---------------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------------
def run_suite(suite: Path, ours: EndpointProcess, moto_url: str, args: argparse.Namespace) -> Path:
    junit = suite / "junit.xml"
    if junit.exists():
        junit.unlink()
    # Our own ini file in the suite's directory makes it pytest's rootdir, so this repository's
    # pytest settings (found in a parent directory otherwise) do not apply and node ids are
    # relative to moto's checkout.
    ini = suite / "pytest.ini"
    ini.write_text("[pytest]\nmarkers =\n    aws_verified: verified against AWS by moto\n")
    endpoint = f"http://localhost:{SERVER_MODE_PORT}"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), str(suite)]),
        "TEST_SERVER_MODE": "true",
        "AWS_ENDPOINT_URL": moto_url,
        "AWS_ENDPOINT_URL_SQS": endpoint,
        "AWS_ACCESS_KEY_ID": "FOOBARKEY",
        "AWS_SECRET_ACCESS_KEY": "FOOBARSECRET",
        "AWS_DEFAULT_REGION": "us-east-1",
        "MOTO_SQS_SUITE_RESET_URL": f"{ours.url}/_sqs/reset",
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
        "moto_sqs_plugin",
        "-c",
        str(ini),
        f"--rootdir={suite}",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",
        "-q",
        "--tb=line",
        f"--junitxml={junit}",
        *([f"-k={args.k}"] if args.k else []),
        *SUITE_FILES,
    ]
    log = suite / "pytest.log"
    with log.open("w") as fh:
        try:
            subprocess.run(
                cmd, cwd=suite, env=env, stdout=fh, stderr=subprocess.STDOUT, timeout=args.timeout
            )
        except subprocess.TimeoutExpired:
            raise SuiteError(
                f"moto's SQS suite did not finish within {args.timeout:.0f}s ({log})"
            ) from None
    if not junit.is_file():
        raise SuiteError(f"pytest wrote no results; its output: {log}")
    return junit


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tests/moto_sqs/run.py", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="summary written here")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds for the whole suite")
    parser.add_argument("-k", help="pytest -k expression (a partial run is never judged ok)")
    args = parser.parse_args(argv)
    try:
        suite = ensure_suite(args.cache)
        if port_in_use(SERVER_MODE_PORT, LOOPBACK):
            raise SuiteError(
                f"port {SERVER_MODE_PORT} on {LOOPBACK} is taken: moto's suite expects its server "
                "there in server mode; stop what holds it (ss -ltnp 'sport = :5000')"
            )
        started = time.monotonic()
        with (
            start_ours(port=SERVER_MODE_PORT, account_id=MOTO_ACCOUNT_ID) as ours,
            start_moto() as other,
        ):
            junit = run_suite(suite, ours, other.url, args)
        elapsed = time.monotonic() - started
    except (SuiteError, RuntimeError) as exc:
        print(f"moto-sqs: {exc}", file=sys.stderr)
        return 2
    verdict = judge(read_junit(junit), MOTO_LENIENCY)
    summary = {**verdict.summary(MOTO_LENIENCY), "seconds": round(elapsed, 1)}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(summary, indent=2) + "\n")
    print(
        f"moto {MOTO_VERSION} SQS suite against our endpoint: {summary['passed']} of "
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


if __name__ == "__main__":
    sys.exit(main())
