"""The APNs and FCM simulators as several processes on one port (``--processes N``, our h2
server or granian), one ledger streamed to Arrow files, the control API applying to every
process. Real processes, real sockets; each new HTTP/2 client is a new connection, which the
kernel gives to one of the processes (16 connections reach both of two processes but for a
chance of 2 in 65,536)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pyarrow as pa
import pytest
from sim_process import REPO, START_TIMEOUT, Sim, free_port, read_line, run_sim, stop

from emulators.providers.faults import token_draw
from emulators.providers.ledger_files import (
    SCHEMA,
    ArrowLedgerWriter,
    LedgerReader,
    _FileCursor,
    _read_complete_batches,
)
from emulators.providers.shared import SharedDir
from harness.run.provider_control import SimulatorControl

pytestmark = pytest.mark.integration

APNS = "emulators.providers.apns"
FCM = "emulators.providers.fcm"
CONNECTIONS = 16


def apns_token() -> str:
    return uuid.uuid4().hex + uuid.uuid4().hex


def push(sim: Sim, token: str, nid: str = "n") -> httpx.Response:
    """One push on a new HTTP/2 connection (so on whichever process the kernel picks)."""
    headers = sim.apns_headers()
    with httpx.Client(
        http1=False, http2=True, base_url=sim.url, timeout=20, headers=headers
    ) as client:
        return client.post(
            f"/3/device/{token}",
            json={"aps": {"alert": "x"}, "tenant_id": "t", "notification_id": nid},
        )


def ledger_files(state: Path) -> dict[str, int]:
    """Rows per process file in the current epoch."""
    shared = SharedDir(state)
    try:
        directory = shared.ledger_dir()
        return {
            p.name: sum(b.num_rows for b in _read_complete_batches(p, _FileCursor()))
            for p in sorted(directory.glob("*.arrow"))
        }
    finally:
        shared.close()


@pytest.fixture(params=["h2", "granian"])
def server(request: pytest.FixtureRequest) -> str:
    return request.param


def test_every_request_in_one_ledger(tmp_path: Path, server: str) -> None:
    state = tmp_path / "state"
    with run_sim(APNS, tmp_path, processes=2, server=server, state_dir=state) as sim:
        sent = []
        for i in range(CONNECTIONS):
            token = apns_token()
            r = push(sim, token, f"n{i}")
            assert r.status_code == 200
            sent.append((token, f"n{i}", r.headers["apns-id"]))
        rows = sim.ledger()
        # seq is gapless from 0, every answered request is one row, with the id it was given
        assert [r["seq"] for r in rows] == list(range(CONNECTIONS))
        assert sorted((r["token"], r["notification_id"], r["apns_id"]) for r in rows) == sorted(
            sent
        )
        assert sim.next_seq() == CONNECTIONS
        per_process = ledger_files(state)
        assert len(per_process) == 2 and all(per_process.values()), per_process
        assert sum(per_process.values()) == CONNECTIONS


def test_control_applies_to_every_process(tmp_path: Path, server: str) -> None:
    with run_sim(APNS, tmp_path, processes=2, server=server) as sim:
        dead = apns_token()
        assert sim.control("POST", "/_sim/tokens/unregistered", {"tokens": [dead]})[0] == 200
        assert {push(sim, dead).status_code for _ in range(CONNECTIONS)} == {410}

        fault = sim.start_fault("status", {"p": 1, "status": 503})
        assert {push(sim, apns_token()).status_code for _ in range(CONNECTIONS)} == {503}
        # the fault log is the same whichever process answers
        logs = {json.dumps(sim.control("GET", "/_sim/faults/log")[1]) for _ in range(8)}
        assert len(logs) == 1
        sim.stop_fault(fault["id"])
        assert {push(sim, apns_token()).status_code for _ in range(CONNECTIONS)} == {200}

        sim.reset()
        assert sim.control("GET", "/_sim/ledger")[1] == {"rows": [], "next": 0}
        assert {push(sim, dead).status_code for _ in range(CONNECTIONS)} == {200}
        assert [r["seq"] for r in sim.ledger()] == list(range(CONNECTIONS))
        assert sim.control("GET", "/_sim/faults/log")[1] == {"windows": []}


def test_unregister_draw_is_the_same_in_every_process(tmp_path: Path) -> None:
    with run_sim(APNS, tmp_path, processes=2, server="h2") as sim:
        fault = sim.start_fault("unregister", {"p": 0.5}, seed=7)
        tokens = [apns_token() for _ in range(24)]
        first = [push(sim, t).status_code for t in tokens]
        sim.stop_fault(fault["id"])
        again = [push(sim, t).status_code for t in tokens]  # other connections, other processes
    expected = [410 if token_draw(7, t) < 0.5 else 200 for t in tokens]
    assert first == again == expected
    assert {200, 410} <= set(first)


def test_fcm_quota_counts_across_processes(tmp_path: Path) -> None:
    with run_sim(FCM, tmp_path, processes=2, server="h2") as sim:
        sim.start_fault("quota", {"per_minute": 5, "window_seconds": 60})
        statuses = []
        for _ in range(CONNECTIONS):
            with httpx.Client(
                http1=False, http2=True, base_url=sim.url, timeout=20, headers=sim.fcm_headers()
            ) as client:
                body = {"message": {"token": f"tok-{uuid.uuid4().hex}"}}
                statuses.append(client.post("/v1/projects/a/messages:send", json=body).status_code)
    assert statuses == [200] * 5 + [429] * (CONNECTIONS - 5)


def test_harness_reads_the_files_while_the_simulator_is_stopped(tmp_path: Path) -> None:
    """The run's reader takes rows from the Arrow files: it needs nothing from the simulator
    once its rows are written (here every serving process is SIGSTOPped meanwhile)."""
    state = tmp_path / "state"
    with run_sim(APNS, tmp_path, processes=2, server="h2", state_dir=state) as sim:
        control = SimulatorControl(sim.url)
        try:
            for i in range(6):
                assert push(sim, apns_token(), f"a{i}").status_code == 200
            assert len(control.new_rows()) == 6
            assert control.ledger_files() is not None  # the files, not the JSON pages
            for i in range(4):
                assert push(sim, apns_token(), f"b{i}").status_code == 200
            expected = sim.ledger(6)  # also the flush barrier: every row is on disk now
            shared = SharedDir(state)
            pids = shared.live_processes()
            shared.close()
            assert len(pids) == 2
            for pid in (sim.proc.pid, *pids):
                os.kill(pid, signal.SIGSTOP)
            try:
                rows = control.new_rows()
            finally:
                for pid in (sim.proc.pid, *pids):
                    os.kill(pid, signal.SIGCONT)
            assert rows == expected
            assert [r["notification_id"] for r in rows] == [f"b{i}" for i in range(4)]
            assert control.new_rows() == []
            control.reset()
            assert push(sim, apns_token(), "c").status_code == 200
            [row] = control.new_rows()
            assert (row["seq"], row["notification_id"]) == (0, "c")
        finally:
            control.close()


def test_granian_refuses_goaway_and_checks_headers(tmp_path: Path) -> None:
    with run_sim(APNS, tmp_path, processes=2, server="granian") as sim:
        status, body = sim.control(
            "POST", "/_sim/faults", {"fault": "goaway", "params": {"after_streams": 1}}
        )
        assert status == 400 and "--server h2" in body["error"]
        with httpx.Client(http1=False, http2=True, base_url=sim.url, timeout=20) as client:
            r = client.post(
                f"/3/device/{apns_token()}",
                json={"aps": {}},
                headers=[("apns-priority", "10"), ("apns-priority", "5")],
            )
        assert (r.status_code, r.json()["reason"]) == (400, "DuplicateHeaders")


@pytest.mark.parametrize("server", ["h2", "granian"])
def test_port_in_use_exits_2(server: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", APNS, "--port", str(port), "--processes", "2"]
            + ["--server", server],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 2
    assert f"port {port} on 127.0.0.1 is already in use" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("processes", ["0", "65", "two"])
def test_bad_processes_exit_2(processes: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", APNS, "--port", "0", "--processes", processes],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "--processes" in proc.stderr and "Traceback" not in proc.stderr


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out


@pytest.mark.parametrize("server", ["h2", "granian"])
def test_sigterm_stops_every_process_and_frees_the_port(tmp_path: Path, server: str) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", APNS, "--port", str(port), "--processes", "2", "--server", server],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = read_line(proc, START_TIMEOUT)
        assert line.strip() == f"apns simulator listening on http://127.0.0.1:{port}"
        children = _children(proc.pid)
        assert children
        with socket.create_connection(("127.0.0.1", port), timeout=10):
            assert stop(proc, signal.SIGTERM) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=15)
    deadline = time.monotonic() + 15
    while any(Path(f"/proc/{c}").exists() for c in children):
        assert time.monotonic() < deadline, "a serving process outlived the simulator"
        time.sleep(0.05)  # polling a condition, bounded by the deadline
    with socket.socket() as again:
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as a restarted server
        again.bind(("127.0.0.1", port))  # nothing holds the port
    assert proc.stderr is not None
    err = proc.stderr.read()
    proc.stderr.close()
    assert "Traceback" not in err


# -- the ledger files, in one process ----------------------------------------------------------
def _row(i: int) -> tuple:
    # ... collapse_id, then what the push asked of its provider: push type, priority,
    # expiration, text
    return ("apns", 1.0, 2.0, "t", f"n{i}", "tok", None, 200, None, "id", True, None, None,
            None, "alert", "10", None, "hi")  # fmt: skip


def test_reader_takes_only_whole_batches(tmp_path: Path) -> None:
    shared = SharedDir.create(tmp_path / "s")
    shared.claim_slot()
    writer = ArrowLedgerWriter(shared, "p0")
    for i in range(3):
        writer.append(_row(i))  # no event loop: written at once
    path = shared.ledger_dir() / "p0.arrow"
    data = path.read_bytes()
    # a file cut inside its last batch: the reader takes the whole ones and waits for the rest
    cursor = _FileCursor()
    cut = tmp_path / "cut.arrow"
    cut.write_bytes(data[:-7])
    assert sum(b.num_rows for b in _read_complete_batches(cut, cursor)) == 2
    cut.write_bytes(data)
    assert [b.num_rows for b in _read_complete_batches(cut, cursor)] == [1]
    # any Arrow reader opens the file
    with pa.ipc.open_stream(path) as stream:
        table = stream.read_all()
    assert table.schema == SCHEMA and table.column("seq").to_pylist() == [0, 1, 2]
    writer.close()
    shared.close()


def test_reader_waits_for_published_seq_and_new_epochs(tmp_path: Path) -> None:
    shared = SharedDir.create(tmp_path / "s")
    shared.claim_slot()
    a = ArrowLedgerWriter(shared, "a")
    b = ArrowLedgerWriter(shared, "b")
    reader = LedgerReader(shared.path)

    async def two_processes() -> None:
        a.append(_row(0))
        b.append(_row(1))
        a.append(_row(2))
        b.flush()
        a.flush()

    asyncio.run(two_processes())
    table = reader.read_new()
    assert table.column("seq").to_pylist() == [0, 1, 2]
    # b's batch came first: seq follows the order of the batches, and each process's order
    assert table.column("notification_id").to_pylist() == ["n1", "n0", "n2"]
    assert reader.read_new().num_rows == 0
    # a reset: rows buffered before a process applies it are dropped, seq starts again
    with shared.locked():
        epoch = shared.new_epoch()
    a.append(_row(3))  # a has not applied the reset
    b.start_epoch(epoch)
    b.append(_row(4))
    assert reader.read_new().column("notification_id").to_pylist() == ["n4"]
    assert reader.next == 1 and reader.epoch == epoch
    for closing in (a, b, reader):
        closing.close()
    shared.close()


# -- the stack setting ------------------------------------------------------------------------------
def test_stack_runs_the_simulators_as_several_processes(tmp_path: Path) -> None:
    from emulators.providers.apns_keys import read_signing_key
    from harness.stack.supervisor import Stack

    with Stack(tmp_path / "stack", parts=["apns", "fcm"], sim_processes=2) as stack:
        for part in ("apns", "fcm"):
            argv = stack.part_argv(part, stack.info.parts[part].port)
            assert argv[argv.index("--processes") + 1] == "2"
        ca = stack.info.tls_ca
        control = SimulatorControl(stack.info.url("apns"), ca)
        try:
            # signed with the stack's own key, for the reference's bundle it was told
            assert stack.info.apns_key_dir is not None
            key = read_signing_key(Path(stack.info.apns_key_dir))
            headers = {
                "authorization": f"bearer {key.provider_token()}",
                "apns-topic": "com.example.fanout",
                "apns-push-type": "alert",
            }
            with httpx.Client(http2=True, verify=ssl_context(ca), timeout=20) as client:
                r = client.post(
                    f"{stack.info.url('apns')}/3/device/{apns_token()}",
                    json={"aps": {}, "notification_id": "s1"},
                    headers=headers,
                )
            assert r.status_code == 200
            [row] = control.new_rows()
            assert row["notification_id"] == "s1"
            assert control.ledger_files() is not None
            state = Path(stack.workdir) / "apns-state"
            shared = SharedDir(state)
            try:
                assert len(shared.live_processes()) == 2
            finally:
                shared.close()
        finally:
            control.close()


def ssl_context(ca: str | None):  # noqa: ANN201
    import ssl

    return ssl.create_default_context(cafile=ca)


@pytest.mark.parametrize(
    ("kwargs", "env", "message"),
    [
        ({"sim_processes": 0}, {}, "from 1 to 64"),
        ({"sim_server": "nginx"}, {}, "one of h2, granian"),
        ({}, {"HARNESS_SIM_PROCESSES": "many"}, "HARNESS_SIM_PROCESSES"),
        ({}, {"HARNESS_SIM_SERVER": "x"}, "one of h2, granian"),
    ],
)
def test_stack_refuses_bad_simulator_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kwargs: dict, env: dict, message: str
) -> None:
    from harness.stack.supervisor import Stack, StackError

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(StackError, match=message):
        Stack(tmp_path, parts=["apns"], **kwargs)
