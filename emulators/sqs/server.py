"""The SQS endpoint server: the SQS API and the control API on one port.

Run: ``python -m emulators.sqs [--host 127.0.0.1] [--port N] [--seed S] [--account-id ID]
[--region R]`` (foreground; ``--region``: for requests whose signature names none). Prints
``sqs endpoint listening on http://HOST:PORT`` when ready; exits 2 when the port is taken and
0 on SIGTERM/SIGINT.

Control API (``/_sqs/...``, JSON):

* ``GET /_sqs/health`` -> ``{"ok": true, "queues": n, "waiting_receives": n,
  "active_faults": [...]}`` (``waiting_receives``: long polls parked right now)
* ``GET /_sqs/queues`` -> every queue (of every region) with its message counts
* ``POST /_sqs/faults`` ``{"fault", "params", "queues": [names] | null, "seed"?, "duration"?}``
  -> ``{"id", "window"}`` (see :mod:`emulators.sqs.faults`; ``duration`` seconds: auto-stop)
* ``DELETE /_sqs/faults/{id}`` -> ``{"window"}``; ``DELETE /_sqs/faults`` -> ``{"stopped"}``
* ``GET /_sqs/faults/log`` -> ``{"windows": [{id, fault, params, queues, seed, started_at,
  stopped_at}, ...]}`` (epoch seconds)
* ``GET /_sqs/receives?since=N&limit=M`` -> ``{"rows": [{"seq", "time", "queue",
  "message_id", "receive_count", "region"}, ...], "next": N}``: every copy of a message handed out by a
  ReceiveMessage, in order (``since``: the first ``seq`` wanted; ``limit``: at most 10,000)
* ``GET /_sqs/receives/position`` -> ``{"next": N}``: where the log ends now (a run that shares
  a long-lived endpoint reads from there, not the copies of every run before it)
* ``POST /_sqs/reset``: drop every queue and stop every active fault (the logs are kept)
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import re
import sys
import time
from collections.abc import Callable
from typing import Any

from emulators.http_server import (
    ConnectionRegistry,
    PortInUseError,
    Request,
    Response,
    json_response,
    server_port,
    start_server,
    stop_on_signals,
)
from emulators.sqs.faults import ActiveFault, FaultState
from emulators.sqs.model import ACCOUNT_ID, REGION, SqsModel
from emulators.sqs.protocol import SqsProtocol

CONTROL_PREFIX = "/_sqs/"
MAX_RECEIVES_PAGE = 10_000


class SqsEndpoint:
    """The whole endpoint in one object: model, faults, protocol, control API."""

    def __init__(
        self,
        seed: int | None = None,
        clock: Callable[[], float] = time.time,
        account_id: str = ACCOUNT_ID,
        region: str = REGION,
        fifo_throughput_limits: bool = True,
    ) -> None:
        self.faults = FaultState(clock)
        self.model = SqsModel(
            clock=clock,
            rng=random.Random(seed),
            hooks=self.faults,
            account_id=account_id,
            region=region,
            fifo_throughput_limits=fifo_throughput_limits,
        )
        self.protocol = SqsProtocol(self.model, self.faults)
        self._timers: dict[str, asyncio.TimerHandle] = {}

    async def handle(self, request: Request) -> Response:
        if request.path.startswith(CONTROL_PREFIX):
            return self.control(request)
        return await self.protocol.handle(request)

    # -- control API ----------------------------------------------------------------------------
    def control(self, request: Request) -> Response:
        path = request.path[len(CONTROL_PREFIX) :].rstrip("/")
        method = request.method
        if path == "health" and method == "GET":
            return json_response(
                200,
                {
                    "ok": True,
                    "queues": sum(len(m.queues) for m in self.protocol.models.values()),
                    "waiting_receives": sum(len(w) for w in self.protocol.waiters.values()),
                    "active_faults": [f.window() for f in self.faults.active()],
                },
            )
        if path == "queues" and method == "GET":
            return json_response(200, {"queues": self._queue_summary()})
        if path == "receives" and method == "GET":
            return self._receives(request)
        if path == "receives/position" and method == "GET":
            # Where the log ends now: a reader that wants only what comes after starts here.
            return json_response(200, {"next": len(self.protocol.handouts)})
        if path == "faults/log" and method == "GET":
            return json_response(200, {"windows": self.faults.log()})
        if path == "faults" and method == "POST":
            return self._start_fault(request)
        if path == "faults" and method == "DELETE":
            return json_response(200, {"stopped": [self._stopped(f) for f in self._stop_all()]})
        if path.startswith("faults/") and method == "DELETE":
            fault_id = path[len("faults/") :]
            stopped = self._stop(fault_id)
            if stopped is None:
                known = self.faults.get(fault_id)
                if known is None:
                    return json_response(404, {"error": f"no fault {fault_id}"})
                return json_response(200, {"window": known.window()})
            return json_response(200, {"window": stopped.window()})
        if path == "reset" and method == "POST":
            stopped = self._stop_all()
            for model in self.protocol.models.values():
                model.reset()
            self.protocol.wake_all()
            return json_response(200, {"ok": True, "stopped_faults": len(stopped)})
        return json_response(404, {"error": f"no control route {method} {request.path}"})

    def _receives(self, request: Request) -> Response:
        try:
            since = int(request.query.get("since", "0"))
            limit = int(request.query.get("limit", str(MAX_RECEIVES_PAGE)))
        except ValueError:
            return json_response(400, {"error": "since and limit must be whole numbers"})
        if since < 0 or not 1 <= limit <= MAX_RECEIVES_PAGE:
            return json_response(
                400, {"error": f"since must be >= 0 and limit between 1 and {MAX_RECEIVES_PAGE}"}
            )
        rows = self.protocol.handouts[since : since + limit]
        return json_response(
            200,
            {
                "rows": [
                    {
                        "seq": since + i,
                        "time": at,
                        "queue": queue,
                        "message_id": message_id,
                        "receive_count": count,
                        "region": region,
                    }
                    for i, (at, queue, message_id, count, region) in enumerate(rows)
                ],
                "next": since + len(rows),
            },
        )

    def _queue_summary(self) -> list[dict[str, Any]]:
        out = []
        for region, model in sorted(self.protocol.models.items()):
            for name in sorted(model.queues):
                queue = model.queue(name)
                out.append(
                    {
                        "name": name,
                        "region": region,
                        "fifo": queue.fifo,
                        "visible": len(queue.visible),
                        "inflight": queue.inflight_count,
                        "delayed": queue.delayed_count,
                    }
                )
        return out

    def _start_fault(self, request: Request) -> Response:
        try:
            body = request.json()
        except ValueError:
            return json_response(400, {"error": "body must be JSON"})
        if not isinstance(body, dict):
            return json_response(400, {"error": "body must be a JSON object"})
        duration = body.get("duration")
        if duration is not None and (
            isinstance(duration, bool) or not isinstance(duration, int | float) or duration <= 0
        ):
            return json_response(400, {"error": "duration must be a positive number of seconds"})
        try:
            active = self.faults.start(
                str(body.get("fault")), body.get("params"), body.get("queues"), body.get("seed")
            )
        except (ValueError, TypeError) as exc:
            return json_response(400, {"error": str(exc)})
        expired = 0
        if active.fault == "visibility_expiry":
            expired = sum(
                model.force_visibility_expiry(active.queues, active.params["p"], active.rng)
                for model in self.protocol.models.values()
            )
        if duration is not None:
            loop = asyncio.get_running_loop()
            self._timers[active.id] = loop.call_later(float(duration), self._stop, active.id)
        return json_response(200, {"id": active.id, "window": active.window(), "expired": expired})

    def _stop(self, fault_id: str) -> ActiveFault | None:
        timer = self._timers.pop(fault_id, None)
        if timer is not None:
            timer.cancel()
        return self.faults.stop(fault_id)

    def _stop_all(self) -> list[ActiveFault]:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        return self.faults.stop_all()

    @staticmethod
    def _stopped(active: ActiveFault) -> dict[str, Any]:
        return active.window()

    # -- serving --------------------------------------------------------------------------------
    async def start(self, host: str, port: int) -> tuple[asyncio.Server, ConnectionRegistry]:
        registry = ConnectionRegistry()
        server = await start_server(self.handle, host, port, registry=registry)
        self.protocol.base_url = f"http://{_url_host(host)}:{server_port(server)}"
        return server, registry


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


async def serve(
    host: str,
    port: int,
    seed: int | None = None,
    account_id: str = ACCOUNT_ID,
    region: str = REGION,
    fifo_throughput_limits: bool = True,
) -> None:
    """Serve until SIGTERM/SIGINT. Raises PortInUseError when the port is taken."""
    endpoint = SqsEndpoint(
        seed=seed,
        account_id=account_id,
        region=region,
        fifo_throughput_limits=fifo_throughput_limits,
    )
    server, registry = await endpoint.start(host, port)
    try:
        with stop_on_signals() as stop:
            print(f"sqs endpoint listening on {endpoint.protocol.base_url}", flush=True)
            await stop.wait()
    finally:
        server.close()
        registry.close_all()
        await server.wait_closed()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m emulators.sqs",
        description="SQS-compatible endpoint (AWS JSON 1.0) with fault injection.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: any free port")
    parser.add_argument("--seed", type=int, help="seed for message ids (repeatable runs)")
    parser.add_argument(
        "--account-id", default=ACCOUNT_ID, help=f"account in queue URLs and ARNs ({ACCOUNT_ID})"
    )
    parser.add_argument("--region", default=REGION, help=f"region of unsigned requests ({REGION})")
    parser.add_argument(
        "--no-fifo-throughput-limits",
        action="store_true",
        help="do not throttle FIFO queues at SQS's per-second quotas",
    )
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    if not re.fullmatch(r"\d{12}", args.account_id):
        parser.error("--account-id must be 12 digits")
    if not re.fullmatch(r"[a-z]{2}(-[a-z]+)+-\d", args.region):
        parser.error("--region must look like us-east-1")
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s %(message)s")
    try:
        asyncio.run(
            serve(
                args.host,
                args.port,
                args.seed,
                args.account_id,
                args.region,
                not args.no_fifo_throughput_limits,
            )
        )
    except PortInUseError as exc:
        print(f"sqs endpoint: {exc}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        pass
    return 0
