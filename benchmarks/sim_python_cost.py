"""Our Python per request of the APNs and FCM simulators, without granian: the RSGI application
called in a loop with granian's scope and protocol stood in for (CPU time, best of 5).

    .venv/bin/python benchmarks/sim_python_cost.py [apns|fcm]

What ``bench_simulators.py`` measures under granian less this is granian's own cost (hyper's
HTTP/2 and its bridge to Python). Not part of ``make bench``: a profiling aid for the hot path.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from emulators.providers.serving import PROVIDER_ENV, RsgiApp, rsgi_app_from_env  # noqa: E402
from emulators.providers.shared import STATE_DIR_ENV, SharedDir  # noqa: E402

TOKENS = [f"{i:064x}" for i in range(1, 17)]
ROUNDS = 5
PER_ROUND = 50_000


class FakeHeaders:
    """granian's header map, as far as the application reads it."""

    def __init__(self, items: list[tuple[str, str]]) -> None:
        self._items = items

    def items(self) -> list[tuple[str, str]]:
        return list(self._items)


class FakeScope:
    proto = "http"
    method = "POST"
    query_string = ""
    authority = "127.0.0.1:8443"
    http_version = "2"

    def __init__(self, path: str, headers: list[tuple[str, str]]) -> None:
        self.path = path
        self.headers = FakeHeaders(headers)


class FakeProtocol:
    """Hands out the body, counts the answers by status."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.statuses: dict[int, int] = {}

    async def __call__(self) -> bytes:
        return self.body

    def response_empty(self, status: int, headers: list[tuple[str, str]]) -> None:
        self.statuses[status] = self.statuses.get(status, 0) + 1

    def response_bytes(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.statuses[status] = self.statuses.get(status, 0) + 1


def load(provider: str) -> tuple[list[FakeScope], bytes]:
    """The requests ``bench_simulators.py`` sends, as scopes, and their body."""
    if provider == "apns":
        payload: dict[str, Any] = {
            "aps": {"alert": {"title": "New post", "body": "someone you follow posted"}},
            "tenant_id": "t0",
            "notification_id": "n1",
        }
        body = json.dumps(payload).encode()
        headers = [("apns-topic", "com.example.app"), ("apns-push-type", "alert")]
        paths = [f"/3/device/{t}" for t in TOKENS]
    else:
        payload = {"message": {"token": TOKENS[0], "data": {"tenant_id": "t0"}}}
        body = json.dumps(payload).encode()
        headers = [("content-type", "application/json")]
        paths = [f"/v1/projects/p{i % 2}/messages:send" for i in range(len(TOKENS))]
    headers += [("user-agent", "h2load"), ("content-length", str(len(body)))]
    return [FakeScope(path, headers) for path in paths], body


async def cost_per_request(app: RsgiApp, scopes: list[FakeScope], proto: FakeProtocol) -> float:
    """Best of ``ROUNDS`` rounds, in µs of this process's CPU per request."""

    async def run(count: int) -> None:
        for i in range(count):
            await app.__rsgi__(scopes[i % len(scopes)], proto)

    await run(PER_ROUND // 2)  # warm-up
    best = float("inf")
    for _ in range(ROUNDS):
        start = time.process_time()
        await run(PER_ROUND)
        best = min(best, time.process_time() - start)
    return best / PER_ROUND * 1e6


def main(argv: list[str]) -> int:
    provider = argv[0] if argv else "apns"
    if provider not in ("apns", "fcm"):
        print("usage: sim_python_cost.py [apns|fcm]", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="sim-python-cost-") as state_dir:
        SharedDir.create(Path(state_dir)).close()
        os.environ[PROVIDER_ENV] = provider
        os.environ[STATE_DIR_ENV] = state_dir
        app = rsgi_app_from_env()
        scopes, body = load(provider)
        proto = FakeProtocol(body)
        try:
            micros = asyncio.run(cost_per_request(app, scopes, proto))
        finally:
            app.state.close()
    if set(proto.statuses) != {200}:
        print(f"error: answers other than 200: {proto.statuses}", file=sys.stderr)
        return 1
    print(f"{provider}: {micros:.2f} µs of CPU per request in our Python (best of {ROUNDS})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
