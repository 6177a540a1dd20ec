"""Rough capacity check of the APNs simulator with a small asyncio + ``h2`` client.

``python -m emulators.providers.loadcheck [--port N] [--connections 4] [--streams 64]
[--requests 20000]``: without ``--port`` it starts ``python -m emulators.providers.apns`` on a
free loopback port itself (separate process) and stops it afterwards. Loopback only.

:class:`H2ClientConnection` is also a reusable minimal HTTP/2 client (many streams on one
connection, flow control on both directions).
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
from dataclasses import dataclass, field
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import hpack

WINDOW = 16 << 20
FLUSH_EVERY = 1 << 30


class H2ClientError(ConnectionError):
    pass


@dataclass
class H2Response:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> object:
        return json.loads(self.body)


@dataclass
class _Pending:
    future: asyncio.Future[H2Response]
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: bytearray = field(default_factory=bytearray)


class H2ClientConnection(asyncio.Protocol):
    """One HTTP/2 client connection (h2c prior knowledge, or TLS with ALPN h2)."""

    def __init__(self, authority: str, scheme: str) -> None:
        self.authority = authority
        self.scheme = scheme
        config = h2.config.H2Configuration(
            client_side=True,
            header_encoding=None,
            validate_inbound_headers=False,
            normalize_inbound_headers=False,
            validate_outbound_headers=False,
            normalize_outbound_headers=False,
        )
        self.conn = h2.connection.H2Connection(config=config)
        self.conn.local_settings = h2.settings.Settings(
            client=True,
            initial_values={
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: WINDOW,
                h2.settings.SettingCodes.ENABLE_PUSH: 0,
            },
        )
        self.transport: asyncio.Transport | None = None
        self.pending: dict[int, _Pending] = {}
        self.settled = asyncio.Event()  # the server's first SETTINGS arrived
        self.window_opened = asyncio.Event()
        self.closed: BaseException | None = None
        self._flush_scheduled = False
        self._unflushed = 0

    @classmethod
    async def open(
        cls,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        timeout: float = 10.0,
    ) -> H2ClientConnection:
        loop = asyncio.get_running_loop()
        scheme = "https" if ssl_context is not None else "http"
        authority = f"{server_hostname or host}:{port}"
        kwargs: dict[str, object] = {}
        if ssl_context is not None:
            kwargs = {"ssl": ssl_context, "server_hostname": server_hostname or host}
        _, proto = await asyncio.wait_for(
            loop.create_connection(lambda: cls(authority, scheme), host, port, **kwargs),
            timeout,
        )
        await asyncio.wait_for(proto.settled.wait(), timeout)
        return proto

    # -- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.conn.initiate_connection()
        self.conn.increment_flow_control_window(WINDOW - 65535)
        self._flush()

    def data_received(self, data: bytes) -> None:
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            self._fail_all(H2ClientError(f"protocol error: {exc}"))
            if self.transport is not None:
                self.transport.close()
            return
        for event in events:
            if isinstance(event, h2.events.ResponseReceived):
                entry = self.pending.get(event.stream_id)
                if entry is not None:
                    for name, value in event.headers or []:
                        key, val = name.decode(), value.decode()
                        if key == ":status":
                            entry.status = int(val)
                        else:
                            entry.headers[key] = val
            elif isinstance(event, h2.events.DataReceived):
                if event.flow_controlled_length:
                    self.conn.acknowledge_received_data(
                        event.flow_controlled_length, event.stream_id
                    )
                entry = self.pending.get(event.stream_id)
                if entry is not None and event.data:
                    entry.body += event.data
            elif isinstance(event, h2.events.StreamEnded):
                entry = self.pending.pop(event.stream_id, None)
                if entry is not None and not entry.future.done():
                    response = H2Response(entry.status, entry.headers, bytes(entry.body))
                    entry.future.set_result(response)
            elif isinstance(event, h2.events.StreamReset):
                entry = self.pending.pop(event.stream_id, None)
                if entry is not None and not entry.future.done():
                    msg = f"stream {event.stream_id} reset: {event.error_code!r}"
                    entry.future.set_exception(H2ClientError(msg))
            elif isinstance(event, (h2.events.WindowUpdated, h2.events.RemoteSettingsChanged)):
                self.window_opened.set()
                if isinstance(event, h2.events.RemoteSettingsChanged):
                    self.settled.set()
            elif isinstance(event, h2.events.ConnectionTerminated):
                self._fail_all(H2ClientError(f"GOAWAY {event.error_code!r}"))
        self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail_all(exc or H2ClientError("connection closed"))

    # -- API -----------------------------------------------------------------------------------
    async def request(
        self,
        method: str,
        path: str,
        headers: dict[str, str] | None = None,
        body: bytes = b"",
    ) -> H2Response:
        if self.closed is not None:
            raise H2ClientError(f"connection closed: {self.closed!r}")
        sid = self.conn.get_next_available_stream_id()
        hdrs = [
            (":method", method),
            (":scheme", self.scheme),
            (":authority", self.authority),
            # unique per request (device token): keep it out of the HPACK dynamic tables
            hpack.NeverIndexedHeaderTuple(":path", path),
        ]
        hdrs += [(k.lower(), v) for k, v in (headers or {}).items()]
        if body:
            hdrs.append(("content-length", str(len(body))))
        future: asyncio.Future[H2Response] = asyncio.get_running_loop().create_future()
        self.pending[sid] = _Pending(future)
        self.conn.send_headers(sid, hdrs, end_stream=not body)
        offset = 0
        while offset < len(body):
            window = min(
                self.conn.local_flow_control_window(sid), self.conn.max_outbound_frame_size
            )
            if window <= 0:
                self._flush()
                self.window_opened.clear()
                await self.window_opened.wait()
                if self.closed is not None:
                    raise H2ClientError(f"connection closed: {self.closed!r}")
                continue
            chunk = body[offset : offset + window]
            offset += len(chunk)
            self.conn.send_data(sid, chunk, end_stream=offset >= len(body))
        self._unflushed += 1
        if self._unflushed >= FLUSH_EVERY:
            self._flush()
        else:
            self._schedule_flush()
        return await future

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.conn.close_connection()
            self._flush()
            self.transport.close()

    # -- internals -----------------------------------------------------------------------------
    def _flush(self) -> None:
        self._flush_scheduled = False
        self._unflushed = 0
        if self.transport is not None and not self.transport.is_closing():
            data = self.conn.data_to_send()
            if data:
                self.transport.write(data)

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _fail_all(self, exc: BaseException) -> None:
        self.closed = exc
        self.settled.set()
        self.window_opened.set()
        for entry in self.pending.values():
            if not entry.future.done():
                entry.future.set_exception(exc)
        self.pending.clear()


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
                response = await conn.request("POST", path, headers, body)
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
