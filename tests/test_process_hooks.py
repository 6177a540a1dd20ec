"""A target's reach, the way Jepsen's is: process hooks (shell commands per role) that the
process faults act through, and proxies for any TCP dependency that the proxy faults name."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import httpx
import pytest
from test_toxiproxy_api import spawn_toxiproxy

from chaos.faults import ChaosTargets, FaultError, make_fault, unavailable
from emulators.ports import LOOPBACK, free_port
from harness.stack.hooks import ShellProcesses
from harness.stack.supervisor import stop_process, wait_until

pytestmark = pytest.mark.integration


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def _pid(pid_file: Path) -> int:
    wait_until(lambda: pid_file.exists() and pid_file.read_text().strip() != "", 10, "a pid")
    return int(pid_file.read_text())


def test_process_faults_act_through_a_targets_shell_hooks(tmp_path):
    pid_file = tmp_path / "consumer.pid"
    start = f"nohup sleep 300 >/dev/null 2>&1 & echo $! > {pid_file}"
    hooks = ShellProcesses(
        {
            "push-consumer": {
                "kill": f"kill -9 $(cat {pid_file})",
                "start": start,
                "pause": f"kill -STOP $(cat {pid_file})",
                "resume": f"kill -CONT $(cat {pid_file})",
            }
        }
    )
    subprocess.run(["sh", "-c", start], check=True)
    first = _pid(pid_file)
    targets = ChaosTargets(processes=hooks)
    try:
        pause = make_fault("consumer-pause")
        pause.start(targets, None)
        wait_until(lambda: _state(first) == "T", 5, "the consumer stopped")
        pause.stop(targets, None)
        wait_until(lambda: _state(first) in ("S", "R"), 5, "the consumer running again")
        crash = make_fault("consumer-crash")
        crash.start(targets, None)
        wait_until(lambda: _state(first) in ("gone", "Z"), 5, "the consumer killed")
        crash.stop(targets, None)
        second = _pid(pid_file)
        assert second != first and _state(second) in ("S", "R")
    finally:
        subprocess.run(["sh", "-c", f"kill -9 $(cat {pid_file})"], check=False)


def test_a_restart_stops_the_part_gracefully_and_an_invalidator_stop_kills_its_part(tmp_path):
    """consumer-restart asks the part to stop (the ``stop`` hook: SIGTERM, as a deploy does; a
    part that traps it finishes first) and starts it at the fault's stop; invalidator-stop
    kills the stream invalidator and starts it again."""
    files = {part: (tmp_path / f"{part}.pid", tmp_path / f"{part}.out")
             for part in ("push-consumer", "stream-invalidator")}  # fmt: skip
    # A process that, told to stop, writes that it finished its batch and exits.
    starts = {
        part: f'nohup sh -c \'trap "echo drained > {out}; exit 0" TERM; '
        f"while true; do sleep 0.1; done' >/dev/null 2>&1 & echo $! > {pid}"
        for part, (pid, out) in files.items()
    }
    hooks = ShellProcesses(
        {
            part: {"kill": f"kill -9 $(cat {pid})", "stop": f"kill -TERM $(cat {pid})",
                   "start": starts[part]}
            for part, (pid, _) in files.items()
        }
    )  # fmt: skip
    targets = ChaosTargets(processes=hooks)
    try:
        for part, (pid, out) in files.items():
            subprocess.run(["sh", "-c", starts[part]], check=True)
            first = _pid(pid)
            fault = make_fault(
                "consumer-restart" if part == "push-consumer" else "invalidator-stop"
            )
            fault.start(targets, None)
            wait_until(lambda first=first: _state(first) in ("gone", "Z"), 5, f"{part} gone")
            # Stopped (its batch drained) or killed (nothing run on the way out).
            drained = part == "push-consumer"
            wait_until(
                lambda out=out, d=drained: out.exists() == d, 5, f"{part} drained: {drained}"
            )
            pid.unlink()
            fault.stop(targets, None)
            second = _pid(pid)
            assert second != first and _state(second) not in ("gone", "Z", "T")
    finally:
        for pid, _ in files.values():
            subprocess.run(["sh", "-c", f"kill -9 $(cat {pid})"], check=False)


def test_a_fault_whose_hooks_a_target_lacks_is_named_before_the_run():
    pause_only = ChaosTargets(
        processes=ShellProcesses({"push-consumer": {"pause": "true", "resume": "true"}})
    )
    why = unavailable("consumer-crash", pause_only)
    assert why is not None and "no kill and start hook for push-consumer" in why
    assert unavailable("consumer-pause", pause_only) is None
    assert "no kill and start hook for redis" in (unavailable("dedup-crash", pause_only) or "")
    assert "has no process hooks" in (unavailable("consumer-crash", ChaosTargets()) or "")
    why = unavailable("consumer-restart", pause_only)
    assert why is not None and "no stop and start hook for push-consumer" in why


def test_a_failing_hook_is_the_faults_failure_with_its_exit_code():
    hooks = ShellProcesses({"push-consumer": {"kill": "echo gone wrong >&2; exit 3",
                                              "start": "true"}})  # fmt: skip
    with pytest.raises(FaultError, match=r"kill hook of push-consumer exited 3.*gone wrong"):
        make_fault("consumer-crash").start(ChaosTargets(processes=hooks), None)
    slow = ShellProcesses({"push-consumer": {"kill": "sleep 5", "start": "true"}}, timeout_s=0.5)
    with pytest.raises(FaultError, match="did not finish"):
        slow.kill_part("push-consumer")


def _echo_server() -> tuple[socket.socket, int]:
    server = socket.create_server((LOOPBACK, 0))
    server.settimeout(0.1)
    return server, server.getsockname()[1]


def test_proxy_faults_act_on_the_dependency_a_target_names(tmp_path):
    proc, api_port = spawn_toxiproxy()
    api = f"http://{LOOPBACK}:{api_port}"
    upstream, upstream_port = _echo_server()
    listen = f"{LOOPBACK}:{free_port()}"
    try:
        httpx.post(f"{api}/proxies", json={"name": "datastore", "listen": listen,
                                           "upstream": f"{LOOPBACK}:{upstream_port}"})  # fmt: skip
        targets = ChaosTargets(toxiproxy_url=api)
        host, port = listen.rsplit(":", 1)
        socket.create_connection((host, int(port)), timeout=2).close()
        down = make_fault("proxy-down", {"proxy": "datastore"})
        down.start(targets, None)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((host, int(port)), timeout=2)
        down.stop(targets, None)
        socket.create_connection((host, int(port)), timeout=2).close()
        for name, toxic in (("proxy-latency", "latency"), ("proxy-timeout", "timeout")):
            fault = make_fault(name, {"proxy": "datastore", "latency_ms": 50})
            fault.start(targets, None)
            toxics = httpx.get(f"{api}/proxies/datastore/toxics").json()
            assert [t["type"] for t in toxics] == [toxic]
            fault.stop(targets, None)
            assert httpx.get(f"{api}/proxies/datastore/toxics").json() == []
        with pytest.raises(FaultError, match="needs parameter"):
            make_fault("proxy-down")
        with pytest.raises(FaultError, match=r"no proxy named 'cache' \(it has: datastore\)"):
            make_fault("proxy-down", {"proxy": "cache"}).start(targets, None)
    finally:
        upstream.close()
        stop_process(proc)  # type: ignore[arg-type]
