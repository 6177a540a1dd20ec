"""Start an SQS endpoint (ours, or moto's server for comparison) as a subprocess.

Used by the endpoint's tests and benchmark: start, wait (bounded) until it answers
``ListQueues``, and always stop it (SIGTERM, then SIGKILL after a timeout).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from emulators.ports import LOOPBACK, free_port

START_TIMEOUT = 60.0


@dataclass
class EndpointProcess:
    """A running endpoint subprocess; ``kind`` is ``"ours"`` or ``"moto"``."""

    kind: str
    proc: subprocess.Popen[bytes]
    host: str
    port: int
    log_file: IO[bytes] = field(repr=False)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = Path(self.log_file.name).read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        self.log_file.close()

    def __enter__(self) -> EndpointProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _answers(url: str) -> bool:
    request = urllib.request.Request(
        url + "/",
        data=b"{}",
        method="POST",
        headers={
            "X-Amz-Target": "AmazonSQS.ListQueues",
            "Content-Type": "application/x-amz-json-1.0",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            response.read()
            return response.status == 200
    except (OSError, urllib.error.URLError):
        return False


def _spawn(kind: str, argv: list[str], host: str, port: int, timeout: float) -> EndpointProcess:
    log_file = tempfile.NamedTemporaryFile(prefix=f"sqs-{kind}-", suffix=".log", delete=False)
    proc = subprocess.Popen(
        argv, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
    )
    endpoint = EndpointProcess(kind, proc, host, port, log_file)
    deadline = time.monotonic() + timeout
    delay = 0.02
    while not _answers(endpoint.url):
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = endpoint.log_tail()
            endpoint.stop()
            raise RuntimeError(
                f"{kind} SQS endpoint on port {port} did not start within {timeout:.0f}s "
                f"(exit code {proc.poll()}):\n{tail}"
            )
        time.sleep(delay)  # back-off between readiness probes, bounded by the deadline
        delay = min(delay * 2, 0.5)
    return endpoint


def start_ours(
    port: int | None = None,
    host: str = LOOPBACK,
    seed: int | None = None,
    timeout: float = START_TIMEOUT,
    account_id: str | None = None,
) -> EndpointProcess:
    port = port or free_port(host)
    argv = [sys.executable, "-m", "emulators.sqs", "--host", host, "--port", str(port)]
    if seed is not None:
        argv += ["--seed", str(seed)]
    if account_id is not None:
        argv += ["--account-id", account_id]
    return _spawn("ours", argv, host, port, timeout)


def start_moto(
    port: int | None = None, host: str = LOOPBACK, timeout: float = START_TIMEOUT
) -> EndpointProcess:
    port = port or free_port(host)
    argv = [sys.executable, "-m", "moto.server", "-H", host, "-p", str(port)]
    return _spawn("moto", argv, host, port, timeout)
