"""A small asyncio HTTP server for the provider simulators, built on the ``h2`` library.

One listening port accepts:

* HTTP/2 with prior knowledge (h2c: the client opens with the connection preface),
* HTTP/1.1 (keep-alive, ``Content-Length`` bodies, ``Expect: 100-continue``),
* with an :class:`ssl.SSLContext`: TLS (detected from the first byte, so plaintext still works
  on the same port), ALPN ``h2`` / ``http/1.1``; a client that offers no ALPN (aioapns does
  not) is sniffed after the handshake exactly like a plaintext one,
* ``CONNECT host:port`` over HTTP/1.1: answered ``200 Connection established``, and the tunnel
  leads back to this same server (TLS inside it when the server has a context). Clients that
  support an HTTPS proxy thereby reach the simulator with the provider's real host name for SNI
  and certificate checks (the generated certificate covers api.push.apple.com etc.).

Every complete request goes to ``async def handler(Request) -> Response``, run eagerly (no Task
unless it suspends). Each HTTP/2 stream is answered independently, with outbound flow control
honoured for large responses and inbound data acknowledged as it is buffered.

Concurrent streams: a connection's first SETTINGS frame advertises ``max_concurrent_streams``
(:func:`start_server`; 1000 unless told), and a handler may raise it for its own connection
(:meth:`H2ServerConnection.set_max_concurrent_streams`: a new SETTINGS frame; the APNs
simulator does so once a provider token verifies). A stream the client opens beyond the limit is
refused alone with ``RST_STREAM`` ``REFUSED_STREAM`` (RFC 9113 §5.1.2 and §8.7: never processed,
so the client may send it again), not by ending the whole connection as the ``h2`` library would
on its own (``TooManyStreamsError``, GOAWAY ``PROTOCOL_ERROR``): the server counts the streams
itself (:class:`_LocalSettings`).

Fault injection hooks (later): every request carries ``request.connection`` (the live
connection's mode object); :meth:`H2ServerConnection.goaway` sends GOAWAY (``drain=True``: the
graceful form, answering the streams already taken and closing afterwards), and a
:class:`ConnectionRegistry` passed to :func:`start_server` lists a server's live connections.
"""

from __future__ import annotations

import asyncio
import errno
import http
import json
import logging
import signal
import socket
import ssl
import sys
import time
import types
from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import hpack
from h2.errors import ErrorCodes
from hyperframe.frame import GoAwayFrame

log = logging.getLogger(__name__)

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DEFAULT_MAX_CONCURRENT_STREAMS = 1000
# what h2 is told the limit is (the server enforces the advertised one itself)
UNLIMITED_STREAMS = 2**31 - 1
_MAX_STREAMS = h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS
DEFAULT_MAX_BODY_SIZE = 16 * 1024 * 1024
MAX_H1_HEADER_BYTES = 64 * 1024
# Large receive windows: the server buffers whole bodies anyway, so let clients stream freely.
STREAM_WINDOW = 1 << 20
CONNECTION_WINDOW = 16 << 20
FLUSH_EVERY = 16
# response headers whose values are unique per response (not worth HPACK indexing)
UNIQUE_VALUE_HEADERS = frozenset({"apns-id", "apns-unique-id", "x-request-id"})
# after a graceful GOAWAY: how long a half-closed connection may linger before it is closed
GOAWAY_LINGER_SECONDS = 5.0


class PortInUseError(OSError):
    """The simulator's port is already bound by another socket."""

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self.port = port
        self.host = host
        super().__init__(errno.EADDRINUSE, f"port {port} on {host} is already in use")

    def __str__(self) -> str:
        return f"port {self.port} on {self.host} is already in use"


@dataclass(slots=True)  # slots: built and read for every request
class Request:
    method: str
    path: str
    query: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    #: "1.1" or "2"
    http_version: str = "2"
    #: every header as received (lower-cased names, in order, duplicates kept)
    raw_headers: list[tuple[str, str]] = field(default_factory=list)
    received_at: float = field(default_factory=time.time)
    stream_id: int | None = None
    #: the connection the request arrived on (hook for fault injection)
    connection: Any = field(default=None, repr=False, compare=False)

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass(slots=True)
class Response:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


Handler = Callable[[Request], Awaitable[Response]]


def json_response(status: int, obj: Any, headers: dict[str, str] | None = None) -> Response:
    """A ``Response`` with a compact JSON body and ``content-type: application/json``."""
    hdrs = {"content-type": "application/json"}
    if headers:
        hdrs.update(headers)
    return Response(status, hdrs, json.dumps(obj, separators=(",", ":")).encode())


def _split_target(target: str) -> tuple[str, dict[str, str]]:
    parts = urlsplit(target)
    return parts.path or "/", dict(parse_qsl(parts.query, keep_blank_values=True))


def _join_headers(raw: list[tuple[str, str]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in raw:
        out[name] = f"{out[name]}, {value}" if name in out else value
    return out


class ConnectionRegistry:
    """The live connections of one server (for shutdown and, later, fault injection)."""

    def __init__(self) -> None:
        self._live: set[_ServerProtocol] = set()

    def add(self, conn: _ServerProtocol) -> None:
        self._live.add(conn)

    def discard(self, conn: _ServerProtocol) -> None:
        self._live.discard(conn)

    def __len__(self) -> int:
        return len(self._live)

    def __iter__(self) -> Iterator[_ServerProtocol]:
        return iter(list(self._live))

    def close_all(self) -> None:
        for conn in list(self._live):
            conn.close()


@dataclass
class _Options:
    handler: Handler
    ssl_context: ssl.SSLContext | None
    plaintext_with_tls: bool
    max_concurrent_streams: int
    max_body_size: int
    registry: ConnectionRegistry


class _TlsLayer:
    """Server-side TLS over memory BIOs, so that the bytes used to sniff it are not lost."""

    def __init__(self, ctx: ssl.SSLContext) -> None:
        self.incoming = ssl.MemoryBIO()
        self.outgoing = ssl.MemoryBIO()
        self.obj = ctx.wrap_bio(self.incoming, self.outgoing, server_side=True)
        self.established = False

    def feed(self, data: bytes) -> tuple[bytes, bool]:
        """(decrypted application data, handshake completed by this call). Raises SSLError."""
        self.incoming.write(data)
        just_established = False
        if not self.established:
            try:
                self.obj.do_handshake()
            except ssl.SSLWantReadError:
                return b"", False
            self.established = just_established = True
        chunks = []
        while True:
            try:
                chunk = self.obj.read(256 * 1024)
            except (ssl.SSLWantReadError, ssl.SSLZeroReturnError):
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks), just_established

    def take_outgoing(self) -> bytes:
        return self.outgoing.read()

    def encrypt(self, data: bytes) -> bytes:
        self.obj.write(data)
        return self.outgoing.read()


class _ServerProtocol(asyncio.Protocol):
    """One connection: sniffs TLS vs plaintext, then HTTP/2 vs HTTP/1.1, and delegates."""

    def __init__(self, options: _Options) -> None:
        self.options = options
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.tls: _TlsLayer | None = None
        self.mode: H2ServerConnection | _H1Mode | None = None
        self._sniff = b""
        self._detect_tls = False
        self.closed = False
        self.eof_sent = False

    # -- asyncio.Protocol -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.options.registry.add(self)
        self._restart()

    def _restart(self) -> None:
        """Start of the connection, or of a CONNECT tunnel: sniff everything again."""
        self.mode = None
        self._sniff = b""
        self._detect_tls = self.options.ssl_context is not None and self.tls is None

    def data_received(self, data: bytes) -> None:
        if self._detect_tls:
            self._detect_tls = False
            if data[:1] == b"\x16":  # a TLS handshake record (ClientHello)
                assert self.options.ssl_context is not None
                self.tls = _TlsLayer(self.options.ssl_context)
            elif not self.options.plaintext_with_tls:
                self.close()
                return
        if self.tls is not None:
            try:
                data, established = self.tls.feed(data)
            except ssl.SSLError as exc:
                log.debug("TLS error: %s", exc)
                self._write_raw(self.tls.take_outgoing())
                self.close()
                return
            self._write_raw(self.tls.take_outgoing())
            if established:
                alpn = self.tls.obj.selected_alpn_protocol()
                if alpn == "h2":
                    self._start_mode(H2ServerConnection(self), b"")
                elif alpn == "http/1.1":
                    self._start_mode(_H1Mode(self), b"")
            if not data:
                return
        self._app_data(data)

    def _app_data(self, data: bytes) -> None:
        if self.mode is not None:
            self.mode.data_received(data)
            return
        buf = self._sniff + data
        n = min(len(buf), len(H2_PREFACE))
        if buf[:n] != H2_PREFACE[:n]:
            self._start_mode(_H1Mode(self), buf)
        elif len(buf) >= len(H2_PREFACE):
            self._start_mode(H2ServerConnection(self), buf)
        else:
            self._sniff = buf

    def _start_mode(self, mode: H2ServerConnection | _H1Mode, initial: bytes) -> None:
        self.mode = mode
        self._sniff = b""
        mode.start()
        if initial:
            mode.data_received(initial)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.options.registry.discard(self)
        if self.mode is not None:
            self.mode.connection_lost()

    def pause_writing(self) -> None:
        # Back-pressure: stop reading new requests while the socket buffer drains.
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    # -- helpers -----------------------------------------------------------------------------
    def get_extra_info(self, name: str) -> Any:
        """Like the transport's, with ``ssl_object`` from our own TLS layer."""
        if name == "ssl_object":
            return self.tls.obj if self.tls is not None else None
        return self.transport.get_extra_info(name) if self.transport is not None else None

    def _write_raw(self, data: bytes) -> None:
        if data and self.transport is not None and not self.closed and not self.eof_sent:
            self.transport.write(data)

    def write(self, data: bytes) -> None:
        if data and self.transport is not None and not self.closed and not self.eof_sent:
            self.transport.write(self.tls.encrypt(data) if self.tls is not None else data)

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()

    def close_gracefully(self, linger: float = GOAWAY_LINGER_SECONDS) -> None:
        """Half-close (TLS close_notify, then FIN) and close after ``linger`` seconds at most.

        Reading goes on meanwhile, so that frames the client sends late do not meet a closed
        socket (a TCP reset could destroy the answers it has not read yet).
        """
        if self.transport is None or self.closed or self.eof_sent:
            return
        if self.tls is not None:
            try:
                self.tls.obj.unwrap()
            except ssl.SSLError:
                pass  # SSLWantReadError: close_notify sent, the peer's not awaited
            self._write_raw(self.tls.take_outgoing())
        if not self.transport.can_write_eof():
            self.close()
            return
        self.transport.write_eof()
        self.eof_sent = True
        self.loop.call_later(linger, self.close)

    def begin_tunnel(self, leftover: bytes) -> bool:
        """After ``CONNECT``: the tunnel leads to this same server, so sniff afresh.

        Inside the tunnel a client may start TLS (unless the CONNECT itself came over TLS).
        """
        self._restart()
        if leftover:
            self.data_received(leftover)
        return True


@types.coroutine
def _resume(coro: Coroutine[Any, Any, None], waiting_on: Any) -> Generator[Any, Any, None]:
    """Continue, inside a Task, a coroutine that :func:`run_eagerly` started."""
    while True:
        if getattr(waiting_on, "_asyncio_future_blocking", None) is False:
            # run_eagerly cleared the flag (as a Task's step does); the Task needs it set
            waiting_on._asyncio_future_blocking = True
        try:
            yield waiting_on  # the Task waits for what the coroutine was waiting for
        except BaseException as exc:  # e.g. CancelledError: deliver it to the coroutine
            try:
                waiting_on = coro.throw(exc)
            except StopIteration:
                return
            continue
        break
    yield from coro  # type: ignore[misc]


def run_eagerly(
    loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, None]
) -> asyncio.Task[None] | None:
    """Run ``coro`` synchronously until it first suspends; only then hand it to a Task.

    Most handlers never suspend (no injected latency), so this saves a Task and an event-loop
    round trip per request, and lets responses go out in the same write as the batch that
    carried the requests (what ``eager_task_factory`` does in Python 3.12+).
    """
    try:
        waiting_on = coro.send(None)
    except StopIteration:
        return None
    if getattr(waiting_on, "_asyncio_future_blocking", None):
        # Taken, as a Task's step takes it: until the flag is cleared, another coroutine
        # awaiting the same pending future (several handlers waiting on one single-flight
        # fetch) fails with "await wasn't used with future". _resume sets it again.
        waiting_on._asyncio_future_blocking = False
    return loop.create_task(_resume(coro, waiting_on))  # type: ignore[arg-type]


async def _call_handler(options: _Options, request: Request) -> Response:
    try:
        return await options.handler(request)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - a handler bug must still answer the stream
        log.exception("handler failed for %s %s", request.method, request.path)
        return json_response(500, {"error": f"internal error: {exc!r}"})


class _LocalSettings(h2.settings.Settings):
    """The server's own settings, ``SETTINGS_MAX_CONCURRENT_STREAMS`` advertised as given but
    not enforced by ``h2``: its check of a new stream (``local_settings.max_concurrent_streams``,
    the one place h2 reads this property) would end the whole connection on one stream too
    many. :class:`H2ServerConnection` counts its open streams and refuses the excess ones itself.
    Reading the setting as a mapping (``settings[code]``, what the SETTINGS frames are made
    from) gives the advertised value."""

    @property
    def max_concurrent_streams(self) -> int:
        return UNLIMITED_STREAMS

    @max_concurrent_streams.setter
    def max_concurrent_streams(self, value: int) -> None:
        self[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS] = value


class _Stream:
    __slots__ = ("raw_headers", "body", "too_large")

    def __init__(self, raw_headers: list[tuple[str, str]]) -> None:
        self.raw_headers = raw_headers
        self.body = bytearray()
        self.too_large = False


class H2ServerConnection:
    """The HTTP/2 side of one connection."""

    def __init__(self, proto: _ServerProtocol) -> None:
        self.proto = proto
        self.options = proto.options
        config = h2.config.H2Configuration(
            client_side=False,
            header_encoding=None,
            validate_inbound_headers=False,
            normalize_inbound_headers=False,
            validate_outbound_headers=False,
            normalize_outbound_headers=False,
        )
        self.conn = h2.connection.H2Connection(config=config)
        self.conn.local_settings = _LocalSettings(
            client=False,
            initial_values={
                _MAX_STREAMS: self.options.max_concurrent_streams,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: 65536,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
            },
        )
        #: the SETTINGS_MAX_CONCURRENT_STREAMS last advertised, and the limit enforced: a lower
        #: one once the client acknowledged it, a higher one at once
        self.max_concurrent_streams = self.options.max_concurrent_streams
        self.stream_limit = self.max_concurrent_streams
        #: streams taken and not yet closed (answered in full, or reset)
        self.open_streams: set[int] = set()
        #: streams refused with REFUSED_STREAM for being over the limit
        self.refused_streams = 0
        self.streams: dict[int, _Stream] = {}
        # stream id -> (body, offset) still to send, blocked on flow control
        self.pending: dict[int, tuple[bytes, int]] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self._flush_scheduled = False
        self._unflushed = 0
        self.goaway_sent = False
        # graceful GOAWAY: its last_stream_id, the frame still to write, handler calls running
        self.draining: int | None = None
        self._goaway_frame = b""
        self.in_flight = 0
        self.last_dispatched = 0

    def start(self) -> None:
        self.conn.initiate_connection()
        self.conn.increment_flow_control_window(CONNECTION_WINDOW - 65535)
        self.flush()

    def set_max_concurrent_streams(self, value: int) -> None:
        """Advertise ``value`` as this connection's SETTINGS_MAX_CONCURRENT_STREAMS (a new
        SETTINGS frame, written with the next flush). A higher limit holds at once; a lower one
        once the client acknowledged the frame (until then the client may rightly use the old)."""
        if value == self.max_concurrent_streams or self.proto.closed:
            return
        self.max_concurrent_streams = value
        self.stream_limit = max(self.stream_limit, value)
        try:
            self.conn.update_settings({_MAX_STREAMS: value})
        except h2.exceptions.ProtocolError:
            return  # the connection is closing
        self.schedule_flush()

    # -- fault-injection hooks ---------------------------------------------------------------
    def goaway(
        self,
        error_code: int = ErrorCodes.NO_ERROR,
        last_stream_id: int | None = None,
        debug_data: bytes | None = None,
        *,
        drain: bool = False,
    ) -> None:
        """Send GOAWAY (new streams above ``last_stream_id`` will not be processed).

        ``drain=True`` is the graceful form (what APNs does): ``last_stream_id`` defaults to the
        highest stream handed to the handler, streams up to it are still answered (the GOAWAY
        goes out after the responses already queued), newer ones are ignored, and the connection
        closes once none is left. h2's own ``close_connection`` would refuse to send anything
        after the GOAWAY, so that frame is written beside h2.
        """
        if drain:
            if self.goaway_sent:
                return
            self.goaway_sent = True
            last = self.last_dispatched if last_stream_id is None else last_stream_id
            self.draining = last
            self._goaway_frame = GoAwayFrame(
                0, last_stream_id=last, error_code=error_code, additional_data=debug_data or b""
            ).serialize()
            self.schedule_flush()
            return
        self.goaway_sent = True
        self.conn.close_connection(
            error_code=error_code, additional_data=debug_data, last_stream_id=last_stream_id
        )
        self.flush()

    # -- I/O ----------------------------------------------------------------------------------
    def flush(self) -> None:
        self._flush_scheduled = False
        self._unflushed = 0
        self.proto.write(self.conn.data_to_send())
        if self.draining is not None:
            self._drain()

    def _drain(self) -> None:
        """After a graceful GOAWAY: write it, and close once every taken stream is answered."""
        assert self.draining is not None
        if self._goaway_frame:
            self.proto.write(self._goaway_frame)
            self._goaway_frame = b""
        if self.in_flight or self.pending or any(sid <= self.draining for sid in self.streams):
            return
        self.proto.close_gracefully()

    def schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.proto.loop.call_soon(self.flush)

    def data_received(self, data: bytes) -> None:
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            log.debug("HTTP/2 protocol error: %s", exc)
            self.flush()
            self.proto.close()
            return
        for event in events:
            if isinstance(event, h2.events.RequestReceived):
                self._on_request(event)
            elif isinstance(event, h2.events.DataReceived):
                self._on_data(event)
            elif isinstance(event, h2.events.StreamEnded):
                self._on_stream_ended(event.stream_id)
            elif isinstance(event, h2.events.StreamReset):
                self.streams.pop(event.stream_id, None)
                self.pending.pop(event.stream_id, None)
                self.open_streams.discard(event.stream_id)
            elif isinstance(event, h2.events.SettingsAcknowledged):
                self.stream_limit = self.conn.local_settings[_MAX_STREAMS]
            elif isinstance(event, h2.events.WindowUpdated):
                self._resume_pending(event.stream_id)
            elif isinstance(event, h2.events.RemoteSettingsChanged):
                if h2.settings.SettingCodes.INITIAL_WINDOW_SIZE in event.changed_settings:
                    self._resume_pending(0)
            elif isinstance(event, h2.events.ConnectionTerminated):
                self.flush()
                self.proto.close()
                return
        self.flush()

    def connection_lost(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        self.streams.clear()
        self.pending.clear()
        self.open_streams.clear()

    # -- requests -----------------------------------------------------------------------------
    def _on_request(self, event: h2.events.RequestReceived) -> None:
        sid = event.stream_id
        if len(self.open_streams) >= self.stream_limit:
            # Over the advertised limit: refuse this stream alone (never processed, so the
            # client may send it again), as RFC 9113 §5.1.2 allows, rather than the connection.
            self.refused_streams += 1
            try:
                self.conn.reset_stream(sid, ErrorCodes.REFUSED_STREAM)
            except h2.exceptions.ProtocolError:
                pass  # already closed
            self.schedule_flush()
            return
        self.open_streams.add(sid)
        raw = [
            (name.decode("latin-1").lower(), value.decode("utf-8", "replace"))
            for name, value in event.headers or []
        ]
        # END_STREAM on the HEADERS frame arrives as a separate StreamEnded event.
        self.streams[sid] = _Stream(raw)

    def _on_data(self, event: h2.events.DataReceived) -> None:
        sid = event.stream_id
        stream = self.streams.get(sid)
        if event.flow_controlled_length:
            self.conn.acknowledge_received_data(event.flow_controlled_length, sid)
        if stream is None or event.data is None:
            return
        if len(stream.body) + len(event.data) > self.options.max_body_size:
            stream.too_large = True
            stream.body.clear()
        elif not stream.too_large:
            stream.body += event.data

    def _on_stream_ended(self, sid: int) -> None:
        stream = self.streams.pop(sid, None)
        if stream is None:
            return
        if self.draining is not None and sid > self.draining:
            return  # opened after our GOAWAY: not processed (the client retries it elsewhere)
        self.last_dispatched = sid
        pseudo = {k: v for k, v in stream.raw_headers if k.startswith(":")}
        regular = [(k, v) for k, v in stream.raw_headers if not k.startswith(":")]
        if stream.too_large:
            self.respond(
                sid,
                json_response(
                    413, {"error": f"request body exceeds {self.options.max_body_size} bytes"}
                ),
            )
            return
        path, query = _split_target(pseudo.get(":path", "/"))
        headers = _join_headers(regular)
        if "host" not in headers and ":authority" in pseudo:
            headers["host"] = pseudo[":authority"]
        request = Request(
            method=pseudo.get(":method", "GET").upper(),
            path=path,
            query=query,
            headers=headers,
            body=bytes(stream.body),
            http_version="2",
            raw_headers=regular,
            stream_id=sid,
            connection=self,
        )
        task = run_eagerly(self.proto.loop, self._dispatch(sid, request))
        if task is not None:
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _dispatch(self, sid: int, request: Request) -> None:
        self.in_flight += 1
        try:
            response = await _call_handler(self.options, request)
        finally:
            self.in_flight -= 1
        if not self.proto.closed:
            self.respond(sid, response)

    def respond(self, sid: int, response: Response) -> None:
        """Send a whole response on stream ``sid`` (body paced by flow control)."""
        body = response.body or b""
        headers: list[tuple[str, str]] = [(":status", str(response.status))]
        for name, value in response.headers.items():
            name = name.lower()
            if name in UNIQUE_VALUE_HEADERS:
                # A value that never repeats: keep it out of the HPACK dynamic table.
                headers.append(hpack.NeverIndexedHeaderTuple(name, str(value)))
            else:
                headers.append((name, str(value)))
        headers.append(("content-length", str(len(body))))
        try:
            self.conn.send_headers(sid, headers, end_stream=not body)
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
            self.open_streams.discard(sid)
            return  # the client reset the stream or the connection is going away
        if body:
            self.pending[sid] = (body, 0)
            self._send_pending(sid)
        else:
            self.open_streams.discard(sid)
        # Write every few responses rather than once per batch: the client can start on the
        # first answers while the rest of a large batch is still being handled.
        self._unflushed += 1
        if self._unflushed >= FLUSH_EVERY:
            self.flush()
        else:
            self.schedule_flush()

    def _send_pending(self, sid: int) -> None:
        entry = self.pending.get(sid)
        if entry is None:
            return
        body, offset = entry
        try:
            while offset < len(body):
                window = self.conn.local_flow_control_window(sid)
                size = min(window, self.conn.max_outbound_frame_size, len(body) - offset)
                if size <= 0:
                    break
                end = offset + size
                self.conn.send_data(sid, body[offset:end], end_stream=end == len(body))
                offset = end
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
            self.pending.pop(sid, None)
            self.open_streams.discard(sid)
            return
        if offset >= len(body):
            self.pending.pop(sid, None)
            self.open_streams.discard(sid)
        else:
            self.pending[sid] = (body, offset)

    def _resume_pending(self, sid: int) -> None:
        targets = list(self.pending) if sid == 0 else [sid]
        for target in targets:
            self._send_pending(target)


class _H1Mode:
    """Minimal HTTP/1.1: one request at a time per connection, keep-alive, Content-Length."""

    def __init__(self, proto: _ServerProtocol) -> None:
        self.proto = proto
        self.options = proto.options
        self.buf = bytearray()
        self.busy = False
        self.sent_continue = False
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        pass

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self._process()

    def connection_lost(self) -> None:
        if self.task is not None:
            self.task.cancel()

    def _fail(self, status: int, message: str) -> None:
        self._write_response(json_response(status, {"error": message}), keep_alive=False)
        self.proto.close()

    def _process(self) -> None:
        if self.busy or self.proto.closed or self.proto.mode is not self:
            return
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buf) > MAX_H1_HEADER_BYTES:
                self._fail(431, "request header section too large")
            return
        try:
            head = bytes(self.buf[:end]).decode("latin-1")
            request_line, *header_lines = head.split("\r\n")
            method, target, version = request_line.split(" ", 2)
            if not version.startswith("HTTP/1."):
                raise ValueError(version)
            raw: list[tuple[str, str]] = []
            for line in header_lines:
                name, _, value = line.partition(":")
                if not name or name != name.strip():
                    raise ValueError(line)
                raw.append((name.lower(), value.strip()))
        except ValueError:
            self._fail(400, "malformed HTTP/1.1 request")
            return
        headers = _join_headers(raw)
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self._fail(501, "chunked request bodies are not supported; send Content-Length")
            return
        try:
            length = int(headers.get("content-length", "0") or "0")
            if length < 0:
                raise ValueError(length)
        except ValueError:
            self._fail(400, "bad Content-Length")
            return
        if length > self.options.max_body_size:
            self._fail(413, f"request body exceeds {self.options.max_body_size} bytes")
            return
        body_start = end + 4
        if len(self.buf) - body_start < length:
            expect = headers.get("expect", "").lower()
            if expect == "100-continue" and not self.sent_continue:
                self.sent_continue = True
                self.proto.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            return
        body = bytes(self.buf[body_start : body_start + length])
        del self.buf[: body_start + length]
        self.sent_continue = False
        method = method.upper()
        conn_tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
        if version == "HTTP/1.0":
            keep_alive = "keep-alive" in conn_tokens
        else:
            keep_alive = "close" not in conn_tokens
        if method == "CONNECT":
            self._connect(version)
            return
        path, query = _split_target(target)
        request = Request(
            method=method,
            path=path,
            query=query,
            headers=headers,
            body=body,
            http_version="1.1",
            raw_headers=raw,
            connection=self,
        )
        self.busy = True
        self.task = self.proto.loop.create_task(self._dispatch(request, keep_alive))

    def _connect(self, version: str) -> None:
        leftover = bytes(self.buf)
        self.buf.clear()
        self.proto.write(f"{version} 200 Connection established\r\n\r\n".encode())
        if not self.proto.begin_tunnel(leftover):
            self.proto.close()

    async def _dispatch(self, request: Request, keep_alive: bool) -> None:
        response = await _call_handler(self.options, request)
        self.busy = False
        self.task = None
        if self.proto.closed:
            return
        self._write_response(response, keep_alive)
        if keep_alive:
            self._process()
        else:
            self.proto.close()

    def _write_response(self, response: Response, keep_alive: bool) -> None:
        body = response.body or b""
        try:
            phrase = http.HTTPStatus(response.status).phrase
        except ValueError:
            phrase = "Unknown"
        lines = [f"HTTP/1.1 {response.status} {phrase}"]
        for name, value in response.headers.items():
            if name.lower() not in ("content-length", "connection"):
                lines.append(f"{name}: {value}")
        lines.append(f"content-length: {len(body)}")
        lines.append("connection: keep-alive" if keep_alive else "connection: close")
        self.proto.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)


async def start_server(
    handler: Handler,
    host: str,
    port: int,
    ssl_context: ssl.SSLContext | None = None,
    *,
    max_concurrent_streams: int = DEFAULT_MAX_CONCURRENT_STREAMS,
    max_body_size: int = DEFAULT_MAX_BODY_SIZE,
    registry: ConnectionRegistry | None = None,
    plaintext_with_tls: bool = True,
    sock: socket.socket | None = None,
) -> asyncio.Server:
    """Listen on ``host:port`` (h2c, HTTP/1.1, and TLS when ``ssl_context`` is given).

    With TLS, a connection whose first byte is not a TLS record is served as plaintext on the
    same port (``plaintext_with_tls=False`` refuses it): this is what lets a client use the
    port as its HTTPS proxy (``CONNECT``, then TLS to the simulator inside the tunnel).
    Raises :class:`PortInUseError` when the port is taken. Pass a :class:`ConnectionRegistry`
    to keep track of live connections (closing them on shutdown, fault injection). ``sock``: a
    socket bound already (one of several processes sharing a port); host and port are unused.
    ``max_concurrent_streams``: what an HTTP/2 connection's first SETTINGS frame advertises
    (streams beyond it are refused with REFUSED_STREAM; a handler may raise it for its
    connection, :meth:`H2ServerConnection.set_max_concurrent_streams`).
    """
    options = _Options(
        handler=handler,
        ssl_context=ssl_context,
        plaintext_with_tls=plaintext_with_tls,
        max_concurrent_streams=max_concurrent_streams,
        max_body_size=max_body_size,
        registry=registry if registry is not None else ConnectionRegistry(),
    )
    loop = asyncio.get_running_loop()
    if sock is not None:
        return await loop.create_server(lambda: _ServerProtocol(options), sock=sock, backlog=1024)
    try:
        return await loop.create_server(lambda: _ServerProtocol(options), host, port, backlog=1024)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE or "address already in use" in str(exc).lower():
            raise PortInUseError(port, host) from exc
        raise


def server_port(server: asyncio.Server) -> int:
    """The port a server actually listens on (useful after binding port 0)."""
    return int(server.sockets[0].getsockname()[1])


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


@contextmanager
def stop_on_signals() -> Iterator[asyncio.Event]:
    """An event set by SIGTERM or SIGINT while the block runs (the foreground servers' stop).

    Install it before announcing readiness, so a signal right after the announcement is a clean
    stop rather than the default handler's kill."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        yield stop
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


async def _serve_until_signalled(
    name: str,
    handler: Handler,
    host: str,
    port: int,
    ssl_context: ssl.SSLContext | None,
    max_concurrent_streams: int,
) -> None:
    registry = ConnectionRegistry()
    server = await start_server(
        handler,
        host,
        port,
        ssl_context,
        registry=registry,
        max_concurrent_streams=max_concurrent_streams,
    )
    scheme = "https" if ssl_context is not None else "http"
    try:
        with stop_on_signals() as stop:
            print(
                f"{name} simulator listening on {scheme}://{_url_host(host)}:{server_port(server)}",
                flush=True,
            )
            await stop.wait()
    finally:
        server.close()
        registry.close_all()
        await server.wait_closed()


def serve_forever(
    name: str,
    handler: Handler,
    host: str,
    port: int,
    ssl_context: ssl.SSLContext | None = None,
    *,
    max_concurrent_streams: int = DEFAULT_MAX_CONCURRENT_STREAMS,
) -> int:
    """Run a simulator in the foreground until SIGTERM/SIGINT.

    Prints ``<name> simulator listening on <url>`` once ready. Returns the process exit code:
    0 on a clean stop, 2 when the port is taken (message on stderr). ``max_concurrent_streams``:
    as :func:`start_server`'s.
    """
    try:
        asyncio.run(
            _serve_until_signalled(name, handler, host, port, ssl_context, max_concurrent_streams)
        )
    except PortInUseError as exc:
        print(f"{name} simulator: {exc}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        pass
    return 0
