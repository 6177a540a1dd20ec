"""The harness on the second system: minifanout (systems/minifanout) as a team would run it,
started by hand beside its own Redis and SQS, described by a target file, and verified with
``python -m harness run <scenario> --target <file>``: the shipped scenarios pass on it, its
planted bugs fail the promise they break, and a scenario it cannot take says so.

Everything talks over real sockets: two redis-servers (its data, its dedup claims behind the
harness's fault proxy), our SQS endpoint, minifanout's own API and consumer, and the APNs and
FCM simulators the harness starts where the target file says minifanout sends.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis
import yaml
from conftest import run_cli

from emulators.ports import free_port
from emulators.sqs.processes import EndpointProcess, start_ours
from harness.stack.supervisor import ROOT, stop_process, wait_until

pytestmark = pytest.mark.integration


@dataclass
class Deps:
    """What minifanout needs besides itself, up for the module."""

    log_dir: Path
    data_port: int
    dedup_port: int
    sqs: EndpointProcess


def _redis(port: int, log: Path) -> subprocess.Popen[bytes]:
    argv = ["redis-server", "--bind", "127.0.0.1", "--port", str(port)]
    argv += ["--save", "", "--appendonly", "no", "--logfile", str(log)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, start_new_session=True)

    def pings() -> bool:
        try:
            return bool(redis.Redis(port=port, socket_connect_timeout=0.5).ping())
        except redis.RedisError:
            return proc.poll() is not None

    wait_until(pings, 20, f"redis-server on {port}")
    assert proc.poll() is None, f"redis-server on {port} exited"
    return proc


@pytest.fixture(scope="module")
def deps(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deps]:
    log_dir = tmp_path_factory.mktemp("minifanout-harness")
    data_port, dedup_port = free_port(), free_port()
    data = _redis(data_port, log_dir / "redis-data.log")
    dedup = _redis(dedup_port, log_dir / "redis-dedup.log")
    try:
        with start_ours() as sqs:
            yield Deps(log_dir, data_port, dedup_port, sqs)
    finally:
        stop_process(data)
        stop_process(dedup)


@contextmanager
def minifanout(deps: Deps, bugs: tuple[str, ...] = ()) -> Iterator[Path]:
    """minifanout running with ``bugs``, and the target file that describes it."""
    api, apns, fcm, dedup_listen = free_port(), free_port(), free_port(), free_port()
    queue = f"mini-{uuid.uuid4().hex[:8]}"
    target = {
        "name": "minifanout",
        "driver": "systems.minifanout.driver:MiniFanoutDriver",
        "event_api": f"http://127.0.0.1:{api}",
        "region": "us-east-1",
        "sqs_endpoint": deps.sqs.url,
        "aws_access_key_id": "testing",
        "aws_secret_access_key": "testing",
        "queues": {"work": {"push": queue}, "dead": {"push": f"{queue}-dead"}},
        "job_fields": {"tenant": "tenant", "notification": "id", "recipient": "user"},
        "sqs_control": deps.sqs.url,
        "policy": {
            "channels_by_kind": {},
            "fcm_projects": ["minifanout"],
            "dedup_key_pattern": "mini:once:*",
        },
        "dedup_redis": f"127.0.0.1:{deps.dedup_port}",
        "dedup_listen": f"127.0.0.1:{dedup_listen}",
        "apns_listen": f"127.0.0.1:{apns}",
        "apns_tls": False,
        "fcm_listen": f"127.0.0.1:{fcm}",
    }
    path = deps.log_dir / f"target-{queue}.yaml"
    path.write_text(yaml.safe_dump(target))
    argv = [
        sys.executable, "-m", "systems.minifanout", "--port", str(api),
        "--redis", f"redis://127.0.0.1:{deps.data_port}/0",
        "--dedup-redis", f"redis://127.0.0.1:{dedup_listen}/0",
        "--sqs-endpoint", deps.sqs.url, "--queue", queue,
        "--apns-url", f"http://127.0.0.1:{apns}", "--fcm-url", f"http://127.0.0.1:{fcm}",
        "--bugs", ",".join(bugs),
    ]  # fmt: skip
    with open(deps.log_dir / f"minifanout-{queue}.log", "wb") as log:
        proc = subprocess.Popen(argv, cwd=ROOT, stderr=log, start_new_session=True)

    def healthy() -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{api}/api/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return proc.poll() is not None

    try:
        wait_until(healthy, 30, "minifanout's API")
        assert proc.poll() is None, "minifanout exited while starting"
        yield path
    finally:
        stop_process(proc)


def run(target: Path, scenario: str, out: Path) -> tuple[int, dict, str]:
    result = run_cli(
        "run", scenario, "--target", str(target), "--seed", "5", "--out", str(out), "--no-report",
        timeout=400,
    )  # fmt: skip
    output = result.stdout + result.stderr
    runs = sorted(p for p in out.iterdir() if p.is_dir())
    assert runs, output
    return result.returncode, json.loads((runs[-1] / "summary.json").read_text()), output


@pytest.mark.wholerun
def test_shipped_scenarios_pass_on_minifanout_run_after_run(deps, tmp_path):
    """smoke, memorydb-outage and sqs-redelivery, one after another on the same long-lived
    system: each run's tenants are its own, so what an earlier run left is never judged again."""
    prefixes = set()
    with minifanout(deps) as target:
        for scenario in ("smoke", "memorydb-outage", "sqs-redelivery"):
            code, summary, output = run(target, scenario, tmp_path / scenario)
            assert code == 0 and summary["verdict"] == "pass", output
            # What minifanout lacks is switched off and says why; the rest was judged.
            audit = summary["checkers"].get("audit_complete")
            if audit is not None:
                assert audit["switched_off"].endswith("it has no audit_trail"), audit
            # No poison queue in its contract: the malformed jobs are not sent, not judged.
            poison = summary["checkers"].get("poison_queue")
            if poison is not None:
                assert poison["switched_off"].endswith("it has no poison_queue"), poison
            judged = [c for c in summary["checkers"].values() if "switched_off" not in c]
            assert judged and all(c["valid"] for c in judged)
            if scenario != "memorydb-outage":  # its own 'sent' claims, read by their pattern
                assert summary["checkers"]["dedup_window"]["full_window"] > 0
            prefixes.add(summary["tenant_prefix"])
    assert len(prefixes) == 3


@pytest.mark.wholerun
@pytest.mark.parametrize(
    ("bug", "scenario", "checker", "count"),
    [
        ("no_dedup", "sqs-redelivery", "effectively_once", "duplicated"),
        ("fail_open", "memorydb-outage", "fail_closed", "decided_during_outage"),
    ],
)
def test_minifanouts_planted_bugs_are_caught(deps, tmp_path, bug, scenario, checker, count):
    with minifanout(deps, bugs=(bug,)) as target:
        code, summary, output = run(target, scenario, tmp_path)
    assert code == 1 and summary["verdict"] == "fail", output
    assert summary["checkers"][checker]["valid"] is False, output
    assert summary["checkers"][checker][count] > 0


def test_a_scenario_needing_what_minifanout_lacks_says_so_before_loading(deps, tmp_path):
    with minifanout(deps) as target:
        code, summary, output = run(target, "read-side", tmp_path)
    assert code == 1 and summary["verdict"] == "unknown", output
    assert "cannot run on minifanout: kinesis-shard-hold is not available" in summary["error"]
    assert "kinesis_listen" in summary["error"]  # what the target file would need
    assert not summary["checkers"]
    run_dir = next(p for p in tmp_path.iterdir() if p.is_dir())
    assert not (run_dir / "population.json").exists()  # stopped before loading anything
