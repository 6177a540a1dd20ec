"""Rough capacity check of the APNs simulator with a small asyncio + ``h2`` client.

``python -m emulators.providers.loadcheck [--port N] [--connections 4] [--streams 64]
[--requests 20000]``: without ``--port`` it starts ``python -m emulators.providers.apns`` on a
free loopback port itself (separate process) and stops it afterwards. Loopback only.

The client is :class:`emulators.h2_client.H2ClientConnection` (re-exported here for the tests
that import it from this module).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import ssl
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from emulators.h2_client import H2ClientConnection, H2ClientError, H2Response
from emulators.providers.apns_keys import new_signing_key

__all__ = ["H2ClientConnection", "H2ClientError", "H2Response", "apns_request", "run_load"]


@dataclass
class LoadResult:
    requests: int
    seconds: float
    statuses: Counter[int]
    errors: int

    @property
    def rate(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0


def apns_request(i: int) -> tuple[str, dict[str, str], bytes]:
    """Path, headers, body of the i-th synthetic APNs push."""
    body = json.dumps(
        {"aps": {"alert": {"title": "t", "body": f"n{i}"}}, "tenant_id": "t0", "notification_id": i}
    ).encode()
    headers = {"apns-topic": "com.example.app", "apns-push-type": "alert"}
    return f"/3/device/{i:064x}", headers, body


#: the load's signing key, registered with the simulator before the load as Apple has a team's
LOAD_KEY = new_signing_key(key_id="LOADCHECK1")


async def run_load(
    host: str,
    port: int,
    *,
    connections: int = 4,
    streams: int = 64,
    requests: int = 20000,
    ssl_context: ssl.SSLContext | None = None,
) -> LoadResult:
    """``requests`` APNs POSTs over ``connections`` × ``streams`` concurrent streams."""
    conns = [await H2ClientConnection.open(host, port, ssl_context) for _ in range(connections)]
    registration = json.dumps(LOAD_KEY.registration(["com.example.app"])).encode()
    answer = await conns[0].request("PUT", "/_sim/apns/keys", {}, registration)
    if answer.status != 200:
        raise RuntimeError(f"the simulator refused the load's signing key: {answer.status}")
    auth = {"authorization": f"bearer {LOAD_KEY.provider_token()}"}
    statuses: Counter[int] = Counter()
    errors = 0
    next_index = 0

    async def worker(conn: H2ClientConnection) -> None:
        nonlocal next_index, errors
        while next_index < requests:
            i = next_index
            next_index += 1
            path, headers, body = apns_request(i)
            try:
                response = await conn.request("POST", path, {**headers, **auth}, body)
                statuses[response.status] += 1
            except (H2ClientError, OSError):
                errors += 1

    start = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in conns for _ in range(streams)))
    elapsed = time.perf_counter() - start
    for conn in conns:
        conn.close()
    return LoadResult(requests, elapsed, statuses, errors)


def _spawn_simulator() -> tuple[subprocess.Popen[str], int]:
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-m", "emulators.providers.apns", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.search(r":(\d+)\s*$", line)
    if not match:
        proc.kill()
        raise RuntimeError(f"simulator did not start: {line!r}")
    return proc, int(match.group(1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m emulators.providers.loadcheck")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=None, help="default: start a simulator")
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--warmup", type=int, default=2000)
    args = parser.parse_args(argv)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        parser.error("loopback only")
    proc = None
    port = args.port
    if port is None:
        proc, port = _spawn_simulator()
    try:
        if args.warmup:
            asyncio.run(run_load(args.host, port, requests=args.warmup))
        result = asyncio.run(
            run_load(
                args.host,
                port,
                connections=args.connections,
                streams=args.streams,
                requests=args.requests,
            )
        )
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=10)
    print(
        f"{result.requests} requests over {args.connections}x{args.streams} streams in "
        f"{result.seconds:.2f}s: {result.rate:,.0f} req/s; statuses {dict(result.statuses)}, "
        f"errors {result.errors}"
    )
    return 0 if result.errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
