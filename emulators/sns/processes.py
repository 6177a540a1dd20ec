"""Start the SNS endpoint as a subprocess: wait (bounded) until it answers, always stop it."""

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
class SnsProcess:
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

    def __enter__(self) -> SnsProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/_sns/health", timeout=2) as response:
            return response.status == 200
    except (OSError, urllib.error.URLError):
        return False


def start_sns(
    *,
    port: int | None = None,
    host: str = LOOPBACK,
    apns_url: str | None = None,
    apns_ca_file: str | Path | None = None,
    fcm_url: str | None = None,
    sqs_url: str | None = None,
    extra_args: list[str] | None = None,
    timeout: float = START_TIMEOUT,
) -> SnsProcess:
    """``python -m emulators.sns`` on a free port, healthy, or RuntimeError with its log tail."""
    port = port or free_port(host)
    argv = [sys.executable, "-m", "emulators.sns", "--host", host, "--port", str(port)]
    for flag, value in (
        ("--apns-url", apns_url),
        ("--apns-ca-file", apns_ca_file),
        ("--fcm-url", fcm_url),
        ("--sqs-url", sqs_url),
    ):
        if value:
            argv += [flag, str(value)]
    argv += extra_args or []
    log_file = tempfile.NamedTemporaryFile(prefix="sns-", suffix=".log", delete=False)
    proc = subprocess.Popen(
        argv, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
    )
    endpoint = SnsProcess(proc, host, port, log_file)
    deadline = time.monotonic() + timeout
    delay = 0.02
    while not _healthy(endpoint.url):
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = endpoint.log_tail()
            endpoint.stop()
            raise RuntimeError(
                f"SNS endpoint on port {port} did not start within {timeout:.0f}s "
                f"(exit code {proc.poll()}):\n{tail}"
            )
        time.sleep(delay)  # back-off between readiness probes, bounded by the deadline
        delay = min(delay * 2, 0.5)
    return endpoint
