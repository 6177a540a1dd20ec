"""The local stand-in for API Gateway: uvicorn serving a Lambda-shaped handler.

On AWS, API Gateway parses HTTP, applies its limits and hands the function an event (HTTP API,
payload format 2.0). Here uvicorn does the HTTP (llhttp through httptools: Content-Length and
chunked framing, keep-alive, flow control, graceful shutdown; uvloop as the event loop), and
``LambdaAdapter`` turns each request into the same event and the handler's answer back into a
response. The handler decides every request; this module only answers what never reaches it:

* 400 (JSON) for malformed framing (``Content-Length: abc`` or ``-1``, bad chunking), where
  uvicorn would answer plain text;
* 408 when a request's headers, or its body, do not arrive within ``read_timeout_seconds``
  (uvicorn has no such timeout: a client that sends half a body would hold its task forever);
* 413 for a body over ``max_body_bytes`` (declared, or counted as chunks arrive), before it is
  read; 431 for headers over ``MAX_HEADER_BYTES``;
* 503 for a connection over ``max_connections`` (each is a file descriptor).

Idle connections cost no thread: the handler runs on a fixed pool of ``handler_threads`` (boto3
blocks), so 1,000 idle connections are 1,000 small protocol objects, closed after the read
timeout (never sent a request) or the keep-alive timeout (between requests).

``serve`` listens once and forks ``processes - 1`` more processes onto the socket (each its own
uvicorn), as concurrent Lambda instances take their own requests; the first passes SIGTERM or
SIGINT on to the others and waits for them.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import resource
import signal
import socket
import sys
import threading
from collections.abc import Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import uvicorn
import uvloop
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("reference.api_gateway")

Handler = Callable[[dict[str, Any], Any], dict[str, Any]]
MAX_HEADER_BYTES = 64 * 1024
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@dataclass(frozen=True)
class GatewayLimits:
    max_body_bytes: int = 1_000_000
    read_timeout_seconds: float = 10.0
    keep_alive_seconds: float = 60.0
    max_connections: int = 4096
    handler_threads: int = 16


def error_response(status: int, message: str) -> bytes:
    """A whole HTTP/1.1 response (JSON error, connection closed) for the transport itself."""
    from http import HTTPStatus

    body = json.dumps({"error": message}).encode()
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode() + body


def api_gateway_event(scope: dict[str, Any], body: bytes) -> dict[str, Any]:
    """An API Gateway HTTP API (payload 2.0) event for one request. ``rawPath`` stays
    percent-encoded, as sent (a device token may hold an encoded '/'); repeated headers are
    joined with commas, as API Gateway does."""
    headers: dict[str, str] = {}
    for name, value in scope["headers"]:
        key, text = name.decode("latin-1").lower(), value.decode("latin-1")
        headers[key] = f"{headers[key]},{text}" if key in headers else text
    raw_path = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1")
    client = scope.get("client") or ("", 0)
    return {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": raw_path,
        "rawQueryString": scope.get("query_string", b"").decode("latin-1"),
        "headers": headers,
        "requestContext": {
            "http": {
                "method": scope["method"],
                "path": scope["path"],
                "protocol": f"HTTP/{scope.get('http_version', '1.1')}",
                "sourceIp": client[0],
            }
        },
        "body": base64.b64encode(body).decode(),
        "isBase64Encoded": True,
    }


class _BodyError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class LambdaAdapter:
    """An ASGI application that calls a Lambda-shaped handler, on a fixed pool of threads."""

    def __init__(self, handler: Handler, limits: GatewayLimits) -> None:
        self.handler = handler
        self.limits = limits
        self.executor = ThreadPoolExecutor(limits.handler_threads, thread_name_prefix="handler")

    def close(self) -> None:
        self.executor.shutdown(wait=True, cancel_futures=True)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        try:
            body = await self._read_body(scope, receive)
        except _BodyError as exc:
            await self._send(send, exc.status, {"content-type": "application/json"},
                             json.dumps({"error": str(exc)}).encode(), close=True)  # fmt: skip
            return
        if body is None:  # the client went away
            return
        event = api_gateway_event(scope, body)
        loop = asyncio.get_running_loop()
        try:
            response = await loop.run_in_executor(self.executor, self.handler, event, None)
        except Exception:
            log.exception("handler failed")
            response = {"statusCode": 500, "body": json.dumps({"error": "internal error"})}
        payload = response.get("body") or ""
        data = (
            base64.b64decode(payload)
            if response.get("isBase64Encoded")
            else payload.encode()
            if isinstance(payload, str)
            else bytes(payload)
        )
        headers = {"content-type": "application/json", **(response.get("headers") or {})}
        await self._send(send, int(response["statusCode"]), headers, data)

    async def _read_body(self, scope: dict[str, Any], receive: Any) -> bytes | None:
        limit = self.limits.max_body_bytes
        for name, value in scope["headers"]:
            if name.lower() == b"content-length":
                # The parser has checked the framing: this is a non-negative integer.
                if int(value) > limit:
                    raise _BodyError(413, f"body over {limit} bytes")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.read_timeout_seconds
        chunks: list[bytes] = []
        size = 0
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                raise _BodyError(
                    408,
                    f"the request body did not arrive within "
                    f"{self.limits.read_timeout_seconds:g} s",
                ) from None
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise _BodyError(413, f"body over {limit} bytes")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    @staticmethod
    async def _send(
        send: Any, status: int, headers: dict[str, str], body: bytes, close: bool = False
    ) -> None:
        raw = [(k.lower().encode("latin-1"), str(v).encode("latin-1")) for k, v in headers.items()]
        raw.append((b"content-length", str(len(body)).encode()))
        if close:
            # The rest of the request was never read: the connection cannot carry another.
            raw.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": status, "headers": raw})
        await send({"type": "http.response.body", "body": body})

    @staticmethod
    async def _lifespan(receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return


class GatewayProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits it lacks: a deadline for a request's
    headers (from the connection, or from a request's first byte), a cap on their size and on
    open connections, and JSON for the answers it gives itself."""

    limits = GatewayLimits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None
        self._reading_headers = True
        self._header_bytes = 0
        self._unparsed_header_bytes = 0
        self._headers_too_large = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            # Headers and body go out in two writes: without TCP_NODELAY the body waits for the
            # client's delayed ACK (40 ms a request).
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if len(self.connections) > self.limits.max_connections:
            self._refuse(503, f"over {self.limits.max_connections} open connections; retry")
            return
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._reading_headers and not self.transport.is_closing():
            # Counted only while the headers are still incomplete after this chunk, so a body
            # arriving with them is not: at most MAX_HEADER_BYTES plus one read is buffered.
            self._unparsed_header_bytes += len(data)
            if self._unparsed_header_bytes > MAX_HEADER_BYTES:
                self._refuse(431, f"request headers over {MAX_HEADER_BYTES} bytes")

    def on_url(self, url: bytes) -> None:
        self._count_header_bytes(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_header_bytes(len(name) + len(value))
        super().on_header(name, value)

    def _count_header_bytes(self, size: int) -> None:
        """Headers that arrived whole in one read: counted as the parser reports them. Raising
        stops the parser; uvicorn then calls send_400_response, which answers 431."""
        self._header_bytes += size
        if self._header_bytes > MAX_HEADER_BYTES:
            self._headers_too_large = True
            raise ValueError("request headers too large")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._reading_headers = True
        self._header_bytes = 0
        self._unparsed_header_bytes = 0
        if self._header_timer is None:
            self._arm_header_timer()

    def on_headers_complete(self) -> None:
        self._reading_headers = False
        self._cancel_header_timer()
        super().on_headers_complete()

    def send_400_response(self, msg: str) -> None:
        if self._headers_too_large:
            self._refuse(431, f"request headers over {MAX_HEADER_BYTES} bytes")
        else:
            self._refuse(400, f"malformed HTTP request: {msg}")

    def _refuse(self, status: int, message: str) -> None:
        self._cancel_header_timer()
        if not self.transport.is_closing():
            self.transport.write(error_response(status, message))
            self.transport.close()

    def _arm_header_timer(self) -> None:
        self._header_timer = self.loop.call_later(
            self.limits.read_timeout_seconds, self._headers_too_slow
        )

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self.cycle is not None and not self.cycle.response_complete:
            return  # a request is being answered; its body has its own deadline
        self._refuse(
            408, f"no complete request headers within {self.limits.read_timeout_seconds:g} s"
        )


def protocol_class(limits: GatewayLimits) -> type[GatewayProtocol]:
    return type("ConfiguredGatewayProtocol", (GatewayProtocol,), {"limits": limits})


def uvicorn_config(app: Any, limits: GatewayLimits) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        http=protocol_class(limits),
        interface="asgi3",
        lifespan="off",
        log_config=None,
        access_log=False,
        proxy_headers=False,
        server_header=False,
        timeout_keep_alive=limits.keep_alive_seconds,  # type: ignore[arg-type]
        timeout_graceful_shutdown=5,
    )


class _Server(uvicorn.Server):
    """Signals are ours (``_serve_process``): this process also stops its forked siblings."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def listening_socket(host: str, port: int, backlog: int = 2048) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    # Every process waits on the same socket and all wake for one connection: one accepts it,
    # the others must not block in accept().
    sock.setblocking(False)
    return sock


def _raise_file_limit(wanted: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def serve(
    make_handler: Callable[[], Handler],
    host: str,
    port: int,
    processes: int = 1,
    limits: GatewayLimits | None = None,
    banner: str = "listening",
) -> int:
    """Serve until SIGTERM/SIGINT with ``processes`` processes on one listening socket. The
    first process is the parent of the others: it passes its signal on and waits for them, so
    stopping it (or its process group) stops them all. ``make_handler`` runs in each process
    after the fork (boto3 clients and Redis connections do not survive one)."""
    limits = limits or GatewayLimits()
    _raise_file_limit(limits.max_connections + 256)
    try:
        sock = listening_socket(host, port)
    except OSError as exc:
        print(f"error: cannot listen on {host}:{port}: {exc.strerror}", file=sys.stderr)
        return 2
    # Held until each process has its handlers: a stop that comes mid-fork is not lost.
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    children = []
    # Fork before any thread or event loop exists.
    for _ in range(processes - 1):
        pid = os.fork()
        if pid == 0:
            os._exit(_serve_process(sock, make_handler, limits, children=[]))
        children.append(pid)
    print(f"{banner} on http://{host}:{port} ({processes} process(es))", flush=True)
    return _serve_process(sock, make_handler, limits, children)


def _serve_process(
    sock: socket.socket,
    make_handler: Callable[[], Handler],
    limits: GatewayLimits,
    children: list[int],
) -> int:
    stop = threading.Event()
    server: list[_Server] = []

    def _stop(*_: Any) -> None:
        if not stop.is_set():
            stop.set()
            for pid in children:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        for running in server:
            running.should_exit = True

    # The handlers go first: a signal while the handler is made still stops this process
    # and its children.
    for signum in _STOP_SIGNALS:
        signal.signal(signum, _stop)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    app = LambdaAdapter(make_handler(), limits)
    try:
        server.append(_Server(uvicorn_config(app, limits)))
        if not stop.is_set():
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                runner.run(server[0].serve(sockets=[sock]))
    finally:
        app.close()
        sock.close()
        for pid in children:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
    return 0
