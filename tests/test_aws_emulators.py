"""The npm AWS emulators as the stack runs them (emulators/node/aws_emulator.js)."""

from __future__ import annotations

import shutil
import socket
import struct
import subprocess

import boto3
import pytest

from emulators.ports import free_port
from harness.stack.supervisor import NODE_EMULATOR, ROOT, stop_process, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture(params=["dynalite", "kinesalite"])
def emulator(request):
    port = free_port()
    proc = subprocess.Popen(
        [shutil.which("node"), str(NODE_EMULATOR), request.param, "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    service = "dynamodb" if request.param == "dynalite" else "kinesis"
    client = boto3.client(
        service,
        endpoint_url=f"http://127.0.0.1:{port}",
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    call = client.list_tables if service == "dynamodb" else client.list_streams

    def ready() -> bool:
        try:
            call()
            return True
        except Exception:
            return False

    try:
        wait_until(ready, 20, f"{request.param} to answer")
        yield proc, port, call
    finally:
        stop_process(proc)


def test_a_client_killed_mid_request_does_not_take_the_emulator_down(emulator):
    proc, port, call = emulator
    for _ in range(3):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-amz-json-1.0\r\n"
            b'X-Amz-Target: DynamoDB_20120810.ListTables\r\nContent-Length: 1000\r\n\r\n{"a":'
        )
        # What kill -9 of a worker does to its sockets: an abortive close (RST).
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
    wait_until(lambda: _answers(call), 10, "the emulator to answer after the aborted requests")
    assert proc.poll() is None


def _answers(call) -> bool:
    try:
        call()
        return True
    except Exception:
        return False
