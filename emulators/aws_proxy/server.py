"""The fault proxy for AWS JSON-protocol APIs: forwards every request, holds Kinesis shards,
and, with ``--dynamodb-streams``, gives a DynamoDB without streams (dynalite) DynamoDB Streams.

Run: ``python -m emulators.aws_proxy --upstream URL --port N [--host 127.0.0.1]
[--dynamodb-streams [--stream-max-records N] [--stream-max-mib N] [--stream-retention-hours H]]``
(foreground). Prints ``aws proxy listening on http://HOST:PORT -> URL`` when ready; exits 2 on
a taken port or a bad upstream URL, 0 on SIGTERM/SIGINT.

Every request that is not for the control API goes upstream as it came: method, path, query,
headers (``Host`` and the SigV4 ``Authorization`` included: the signature still matches) and
body; only hop-by-hop headers are dropped, as any HTTP proxy must. The answer comes back the
same way (bodies are not decompressed). Whole bodies only: event streams (SubscribeToShard)
are not supported.

Control API (``/_proxy/...``, JSON, in the style of the SQS endpoint's ``/_sqs/faults``):

* ``GET /_proxy/health`` -> ``{"ok": true, "upstream", "active_faults": [...],
  "known_iterators": n, "counts": {"forwarded", "held_answers", "unknown_iterators",
  "upstream_errors"}}``
* ``POST /_proxy/faults`` ``{"fault": "hold_shard" | "latency", "params": {...},
  "duration"?: seconds}`` -> ``{"id", "window"}`` (see :mod:`emulators.aws_proxy.faults`)
* ``DELETE /_proxy/faults/{id}`` -> ``{"window"}``; ``DELETE /_proxy/faults`` -> ``{"stopped"}``
* ``GET /_proxy/faults/log`` -> ``{"windows": [{id, fault, params, started_at, stopped_at,
  ...}, ...]}`` (epoch seconds)

Bad control input is answered 400 with ``{"error": "..."}``.

With ``--dynamodb-streams`` the proxy also serves the DynamoDB Streams API
(``DynamoDBStreams_20120810.*``) on the same port, records a stream record for every write
that goes through it to a table whose stream is enabled, and adds the stream fields to table
descriptions (:mod:`emulators.aws_proxy.stream_capture`), and answers UpdateTimeToLive /
DescribeTimeToLive per table (the status only: nothing is deleted when it expires); health then has
``"dynamodb_streams": {"streams", "records", "record_bytes", "trimmed", "trimmed_early",
"recorded", "unchanged_writes", "image_reads", "capture_errors"}``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode, urlsplit

# aiohttp, not httpx, upstream: its client costs less CPU per request (the proxy sits on every
# PutRecord and every GetRecords poll of a run, on a 2-core machine), it can leave bodies
# compressed as they came (auto_decompress=False) and keeps a Host header given to it.
import aiohttp
from multidict import CIMultiDict
from yarl import URL

from emulators.aws_proxy.answers import aws_error, rewritten
from emulators.aws_proxy.dynamodb import is_dynamodb, is_dynamodb_streams
from emulators.aws_proxy.dynamodb_streams import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_RECORDS,
    RETENTION_SECONDS,
    StreamStore,
)
from emulators.aws_proxy.faults import FaultState
from emulators.aws_proxy.kinesis import (
    DEFAULT_ITERATOR_CAPACITY,
    IteratorMap,
    held_answer,
    is_kinesis,
    json_object,
    operation_of,
    requested_shard,
)
from emulators.aws_proxy.stream_capture import StreamCapture
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

log = logging.getLogger(__name__)

CONTROL_PREFIX = "/_proxy/"
# RFC 9110 7.6.1: connection-specific, never forwarded (content-length is recomputed).
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
    }
)
# Headers aiohttp would add of its own: the upstream must see only what the client sent.
NO_AUTO_HEADERS = ("Accept", "Accept-Encoding", "User-Agent", "Content-Type")
START_KEYS = frozenset({"fault", "params", "duration"})
UPSTREAM_TIMEOUT_SECONDS = 120.0
UPSTREAM_KEEPALIVE_SECONDS = 2.0  # below Node's 5 s keepAliveTimeout


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def check_upstream(url: str) -> str:
    """The upstream base URL without a trailing slash; ValueError when it is not http(s)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(
            f"upstream must be an http(s) URL such as http://127.0.0.1:4567, not {url!r}"
        )
    return url.rstrip("/")


def _error(status: int, kind: str, message: str) -> Response:
    """An error in the AWS JSON protocol's shape, so SDKs report it by name."""
    return aws_error(status, kind, message)


class AwsProxy:
    """Forwarding, fault decisions and the control API of one proxy."""

    def __init__(
        self,
        upstream: str,
        clock: Callable[[], float] = time.time,
        iterator_capacity: int = DEFAULT_ITERATOR_CAPACITY,
        streams: StreamStore | None = None,
    ) -> None:
        self.upstream = check_upstream(upstream)
        self.faults = FaultState(clock)
        self.iterators = IteratorMap(iterator_capacity)
        self.counts: Counter[str] = Counter()
        self.base_url = ""
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._session: aiohttp.ClientSession | None = None
        # DynamoDB Streams for an upstream DynamoDB without them (None: DynamoDB is forwarded).
        self.capture = StreamCapture(streams, self._send) if streams is not None else None

    async def handle(self, request: Request) -> Response:
        if request.path.startswith(CONTROL_PREFIX):
            return self.control(request)
        return await self.forward(request)

    # -- forwarding -----------------------------------------------------------------------------
    async def forward(self, request: Request) -> Response:
        operation = operation_of(request.headers)
        if operation is not None:
            delay = self.faults.latency_for(operation)
            if delay > 0:
                await asyncio.sleep(delay)
        if self.capture is not None:
            if is_dynamodb_streams(request.headers):
                return self.capture.streams_api(request, operation or "")
            if is_dynamodb(request.headers):
                return await self.capture.dynamodb(request, operation)
        kinesis = is_kinesis(request.headers)
        if kinesis and operation == "GetRecords":
            return await self._get_records(request)
        answer = await self._send(request)
        if kinesis and operation == "GetShardIterator" and answer.status == 200:
            asked = json_object(request.body, request.headers.get("content-encoding", ""))
            ref = requested_shard(asked) if asked is not None else None
            given = json_object(answer.body, answer.headers.get("content-encoding", ""))
            if ref is not None and given is not None:
                self.iterators.learn(given.get("ShardIterator"), ref)
        return answer

    async def _get_records(self, request: Request) -> Response:
        asked = json_object(request.body, request.headers.get("content-encoding", ""))
        iterator = asked.get("ShardIterator") if asked is not None else None
        ref = self.iterators.get(iterator)
        if ref is None:
            self.counts["unknown_iterators"] += 1
        # Upstream is asked even while the shard is held: it says how far behind the reader is
        # (MillisBehindLatest) and whether the iterator is still valid (expired after 5 min).
        answer = await self._send(request)
        if answer.status != 200 or ref is None:
            return answer
        given = json_object(answer.body, answer.headers.get("content-encoding", ""))
        if given is None:
            return answer
        holding = self.faults.holding(ref)
        if not holding:
            self.iterators.learn(given.get("NextShardIterator"), ref)
            return answer
        assert isinstance(iterator, str)  # ref is known, so the iterator was a string
        held, withheld = held_answer(given, iterator)
        for fault in holding:
            fault.held_answers += 1
            fault.max_held_records = max(fault.max_held_records, withheld)
        self.counts["held_answers"] += 1
        return rewritten(answer, held)

    def _session_for_loop(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                auto_decompress=False,
                timeout=aiohttp.ClientTimeout(total=UPSTREAM_TIMEOUT_SECONDS),
                # Node's servers (dynalite, kinesalite) close a keep-alive connection idle
                # for 5 s; aiohttp would keep it 15 s and could send on it just as it closes
                # (ServerDisconnectedError, a 502 for a request that upstream never saw).
                connector=aiohttp.TCPConnector(
                    limit=0, ttl_dns_cache=None, keepalive_timeout=UPSTREAM_KEEPALIVE_SECONDS
                ),
                skip_auto_headers=NO_AUTO_HEADERS,
            )
        return self._session

    async def _send(self, request: Request) -> Response:
        headers = CIMultiDict((k, v) for k, v in request.raw_headers if k not in HOP_BY_HOP)
        if "host" not in headers and "host" in request.headers:  # HTTP/2: from :authority
            headers["host"] = request.headers["host"]
        target = request.path + (f"?{urlencode(request.query)}" if request.query else "")
        url = URL(self.upstream + target, encoded=True)
        self.counts["forwarded"] += 1
        try:
            async with self._session_for_loop().request(
                request.method,
                url,
                data=request.body or None,
                headers=headers,
                allow_redirects=False,
            ) as upstream:
                body = await upstream.read()
                answer: dict[str, str] = {}
                for name, value in upstream.headers.items():
                    name = name.lower()
                    if name not in HOP_BY_HOP:
                        answer[name] = f"{answer[name]}, {value}" if name in answer else value
                return Response(upstream.status, answer, body)
        except TimeoutError:
            self.counts["upstream_errors"] += 1
            return _error(504, "ProxyUpstreamTimeout", f"upstream {self.upstream} did not answer")
        except aiohttp.ClientError as exc:
            self.counts["upstream_errors"] += 1
            return _error(
                502, "ProxyUpstreamUnavailable", f"upstream {self.upstream} failed: {exc}"
            )

    # -- control API ----------------------------------------------------------------------------
    def control(self, request: Request) -> Response:
        path = request.path[len(CONTROL_PREFIX) :].rstrip("/")
        method = request.method
        if path == "health" and method == "GET":
            health: dict[str, Any] = {
                "ok": True,
                "upstream": self.upstream,
                "active_faults": [f.window() for f in self.faults.active()],
                "known_iterators": len(self.iterators),
                "counts": {
                    key: self.counts[key]
                    for key in ("forwarded", "held_answers", "unknown_iterators", "upstream_errors")
                },
            }
            if self.capture is not None:
                health["dynamodb_streams"] = self.capture.health()
            return json_response(200, health)
        if path == "faults/log" and method == "GET":
            return json_response(200, {"windows": self.faults.log()})
        if path == "faults" and method == "POST":
            return self._start_fault(request)
        if path == "faults" and method == "DELETE":
            return json_response(200, {"stopped": [f.window() for f in self._stop_all()]})
        if path.startswith("faults/") and method == "DELETE":
            fault_id = path[len("faults/") :]
            stopped = self._stop(fault_id)
            if stopped is not None:
                return json_response(200, {"window": stopped.window()})
            known = self.faults.get(fault_id)
            if known is None:
                return json_response(404, {"error": f"no fault {fault_id!r}"})
            return json_response(200, {"window": known.window()})  # already stopped: idempotent
        return json_response(
            404,
            {
                "error": f"no control route {method} {request.path}; routes: GET /_proxy/health, "
                "POST|DELETE /_proxy/faults, DELETE /_proxy/faults/{id}, GET /_proxy/faults/log"
            },
        )

    def _start_fault(self, request: Request) -> Response:
        try:
            body = request.json()
        except ValueError:
            return json_response(400, {"error": "body must be JSON"})
        if not isinstance(body, dict):
            return json_response(400, {"error": "body must be a JSON object"})
        unknown = sorted(set(body) - START_KEYS)
        if unknown:
            return json_response(
                400,
                {"error": f"unknown key(s) {', '.join(unknown)}; known: fault, params, duration"},
            )
        duration = body.get("duration")
        if duration is not None and (
            isinstance(duration, bool) or not isinstance(duration, int | float) or duration <= 0
        ):
            return json_response(400, {"error": "duration must be a positive number of seconds"})
        try:
            active = self.faults.start(str(body.get("fault")), body.get("params"))
        except ValueError as exc:
            return json_response(400, {"error": str(exc)})
        if duration is not None:
            loop = asyncio.get_running_loop()
            self._timers[active.id] = loop.call_later(float(duration), self._stop, active.id)
        return json_response(200, {"id": active.id, "window": active.window()})

    def _stop(self, fault_id: str) -> Any:
        timer = self._timers.pop(fault_id, None)
        if timer is not None:
            timer.cancel()
        return self.faults.stop(fault_id)

    def _stop_all(self) -> list[Any]:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        return self.faults.stop_all()

    # -- serving --------------------------------------------------------------------------------
    async def start(self, host: str, port: int) -> tuple[asyncio.Server, ConnectionRegistry]:
        registry = ConnectionRegistry()
        server = await start_server(self.handle, host, port, registry=registry)
        self.base_url = f"http://{_url_host(host)}:{server_port(server)}"
        return server, registry

    async def close(self) -> None:
        self._stop_all()
        if self._session is not None:
            await self._session.close()
            self._session = None


async def serve(upstream: str, host: str, port: int, streams: StreamStore | None = None) -> None:
    """Serve until SIGTERM/SIGINT. Raises PortInUseError when the port is taken."""
    proxy = AwsProxy(upstream, streams=streams)
    server, registry = await proxy.start(host, port)
    try:
        with stop_on_signals() as stop:
            extra = " (with DynamoDB Streams)" if streams is not None else ""
            print(f"aws proxy listening on {proxy.base_url} -> {proxy.upstream}{extra}", flush=True)
            await stop.wait()
    finally:
        server.close()
        registry.close_all()
        await server.wait_closed()
        await proxy.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m emulators.aws_proxy",
        description="Fault proxy for AWS JSON-protocol APIs (Kinesis shard holds, latency), and "
        "DynamoDB Streams for a DynamoDB without them (--dynamodb-streams).",
    )
    parser.add_argument("--upstream", required=True, help="the real endpoint, e.g. kinesalite's")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: any free port")
    parser.add_argument("--log-level", default="WARNING")
    parser.add_argument(
        "--dynamodb-streams",
        action="store_true",
        help="upstream is a DynamoDB without streams (dynalite): record and serve them here",
    )
    parser.add_argument(
        "--stream-max-records",
        type=int,
        default=DEFAULT_MAX_RECORDS,
        help=f"records kept per stream before the oldest are trimmed (default {DEFAULT_MAX_RECORDS})",
    )
    parser.add_argument(
        "--stream-max-mib",
        type=int,
        default=DEFAULT_MAX_BYTES >> 20,
        help=f"MiB of records kept per stream (default {DEFAULT_MAX_BYTES >> 20})",
    )
    parser.add_argument(
        "--stream-retention-hours",
        type=float,
        default=RETENTION_SECONDS / 3600,
        help="records older than this are trimmed, as AWS does after 24 h (default 24)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s %(message)s")
    try:
        check_upstream(args.upstream)
        streams = None
        if args.dynamodb_streams:
            streams = StreamStore(
                time.time,
                max_records=args.stream_max_records,
                max_bytes=args.stream_max_mib << 20,
                retention_seconds=args.stream_retention_hours * 3600,
            )
    except ValueError as exc:
        print(f"aws proxy: {exc}", file=sys.stderr, flush=True)
        return 2
    try:
        asyncio.run(serve(args.upstream, args.host, args.port, streams))
    except PortInUseError as exc:
        print(f"aws proxy: {exc}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        pass
    return 0
