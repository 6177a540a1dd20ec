"""A small blocking HTTP/2 client for the providers (APNs, FCM): one connection, one request at
a time, on the ``h2`` library.

Why by hand: httpx's HTTP/2 client spent about 1 ms of CPU per request here (the design's own
measurement: ~850 req/s against any server, the client the limit; a py-spy profile of the push
consumer put a third of its CPU in httpx/httpcore/h2), where a bare ``h2`` connection needs a
tenth of that. A consumer thread sends one push at a time and waits for its answer (the next
send depends on it: a Retry-After pauses the scope, a dead token is not tried twice), so the
client needs no multiplexing, pool or event loop: a socket, the ``h2`` state machine, and
RFC 9113's rules for GOAWAY (a stream above the peer's last stream id was never processed and is
sent again on a new connection; one at or below it still completes).

Plaintext URLs (``http://``) speak h2c with prior knowledge, as the simulators' h2c mode does;
``https://`` negotiates ``h2`` by ALPN (APNs, FCM), verifying with the given CA file or the
system's.
"""

from __future__ import annotations

import socket
import ssl
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import hpack
from h2.errors import ErrorCodes

WINDOW = 16 << 20
READ_BYTES = 65536
# A stream the peer never processed (GOAWAY below it, REFUSED_STREAM) is safe to send again.
REFUSED_ATTEMPTS = 3
# Request headers whose values differ on every request: indexing them would only churn HPACK's
# dynamic tables on both sides.
UNIQUE_HEADERS = frozenset({"apns-id", "apns-collapse-id", "authorization"})


class PlainEncoder(hpack.Encoder):
    """HPACK without Huffman coding (RFC 7541 §5.2 leaves it to the sender): a few more bytes
    per request, and a third less client CPU per request measured against the APNs simulator
    (251 -> 174 µs); a pure-Python Huffman coder is the costliest part of encoding the
    per-request headers (the token in the path, apns-id, collapse id), and the peer saves the
    decoding too."""

    def encode(self, headers: Any, huffman: bool = False) -> bytes:
        return super().encode(headers, huffman=False)


class Http2Error(ConnectionError):
    """No complete answer: the connection failed, closed or timed out mid-request."""


class _Refused(Http2Error):
    """The peer never processed the stream."""


@dataclass(frozen=True)
class Http2Response:
    status: int
    headers: dict[str, str]
    body: bytes


class Http2Client:
    """One HTTP/2 connection to ``url``'s origin, (re)opened when needed. Not thread-safe: one
    per thread, as the consumer's provider clients are."""

    def __init__(self, url: str, ca_file: str | None = None, timeout: float = 5.0) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.host = parts.hostname
        self.tls = parts.scheme == "https"
        self.port = parts.port or (443 if self.tls else 80)
        default_port = self.port == (443 if self.tls else 80)
        self.authority = self.host if default_port else f"{self.host}:{self.port}"
        self.scheme = parts.scheme
        self.timeout = timeout
        self.ssl_context: ssl.SSLContext | None = None
        if self.tls:
            self.ssl_context = ssl.create_default_context(cafile=ca_file)
            self.ssl_context.set_alpn_protocols(["h2"])
        self.sock: socket.socket | None = None
        self.conn: h2.connection.H2Connection | None = None
        self.going_away = False

    # -- connection -----------------------------------------------------------------------------

    def _open(self, deadline: float) -> None:
        self.close()
        sock = socket.create_connection((self.host, self.port), timeout=self._left(deadline))
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.ssl_context is not None:
                sock = self.ssl_context.wrap_socket(sock, server_hostname=self.host)
                if sock.selected_alpn_protocol() != "h2":
                    raise Http2Error(f"{self.authority} did not agree to HTTP/2 (ALPN)")
            config = h2.config.H2Configuration(
                client_side=True,
                header_encoding=None,
                validate_inbound_headers=False,
                normalize_inbound_headers=False,
                validate_outbound_headers=False,
                normalize_outbound_headers=False,
            )
            conn = h2.connection.H2Connection(config=config)
            conn.encoder = PlainEncoder()
            conn.local_settings = h2.settings.Settings(
                client=True,
                initial_values={
                    h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: WINDOW,
                    h2.settings.SettingCodes.ENABLE_PUSH: 0,
                },
            )
            conn.initiate_connection()
            conn.increment_flow_control_window(WINDOW - 65535)
            sock.sendall(conn.data_to_send())
        except BaseException:
            sock.close()
            raise
        self.sock, self.conn, self.going_away = sock, conn, False

    def close(self) -> None:
        if self.sock is not None:
            try:
                if self.conn is not None:
                    self.conn.close_connection()
                    self.sock.sendall(self.conn.data_to_send())
            except (OSError, h2.exceptions.ProtocolError):
                pass
            self.sock.close()
        self.sock = self.conn = None

    @staticmethod
    def _left(deadline: float) -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise Http2Error("timed out")
        return left

    # -- requests -------------------------------------------------------------------------------

    def post(self, path: str, headers: dict[str, str], body: bytes) -> Http2Response:
        """POST ``body`` to ``path``; raises :class:`Http2Error` without a complete answer."""
        deadline = time.monotonic() + self.timeout
        for attempt in range(REFUSED_ATTEMPTS):
            try:
                if self.conn is None or self.going_away:
                    self._open(deadline)
                return self._exchange(path, headers, body, deadline)
            except _Refused:
                self.close()
                if attempt == REFUSED_ATTEMPTS - 1:
                    raise
            except (OSError, h2.exceptions.H2Error) as exc:
                self.close()
                if isinstance(exc, Http2Error):
                    raise
                raise Http2Error(f"{type(exc).__name__}: {exc}") from exc
        raise Http2Error("unreachable")  # pragma: no cover - the loop returns or raises

    def _exchange(
        self, path: str, headers: dict[str, str], body: bytes, deadline: float
    ) -> Http2Response:
        conn, sock = self.conn, self.sock
        assert conn is not None and sock is not None
        sid = conn.get_next_available_stream_id()
        fields: list[tuple[str, str]] = [
            (":method", "POST"),
            (":scheme", self.scheme),
            (":authority", self.authority),
            hpack.NeverIndexedHeaderTuple(":path", path),
        ]
        for name, value in headers.items():
            name = name.lower()
            unique = name in UNIQUE_HEADERS
            fields.append(hpack.NeverIndexedHeaderTuple(name, value) if unique else (name, value))
        fields.append(("content-length", str(len(body))))
        conn.send_headers(sid, fields, end_stream=not body)
        sent = 0
        status = 0
        answer_headers: dict[str, str] = {}
        answer = bytearray()
        ended = False
        while not ended:
            while sent < len(body):
                window = min(conn.local_flow_control_window(sid), conn.max_outbound_frame_size)
                if window <= 0:
                    break  # wait for a WINDOW_UPDATE below
                chunk = body[sent : sent + window]
                sent += len(chunk)
                conn.send_data(sid, chunk, end_stream=sent >= len(body))
            out = conn.data_to_send()
            if out:
                sock.sendall(out)
            sock.settimeout(self._left(deadline))
            data = sock.recv(READ_BYTES)
            if not data:
                raise Http2Error("the connection closed before the answer")
            # Every event of what arrived is handled, also those after our stream's end (a
            # GOAWAY right behind the answer still retires the connection).
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived) and event.stream_id == sid:
                    for name, value in event.headers:
                        key = name.decode() if isinstance(name, bytes) else name
                        text = value.decode() if isinstance(value, bytes) else value
                        if key == ":status":
                            status = int(text)
                        else:
                            answer_headers[key] = text
                elif isinstance(event, h2.events.DataReceived):
                    if event.flow_controlled_length:
                        conn.acknowledge_received_data(
                            event.flow_controlled_length, event.stream_id
                        )
                    if event.stream_id == sid:
                        answer += event.data
                elif isinstance(event, h2.events.StreamEnded) and event.stream_id == sid:
                    ended = True
                elif isinstance(event, h2.events.StreamReset) and event.stream_id == sid:
                    if event.error_code == ErrorCodes.REFUSED_STREAM:
                        raise _Refused(f"stream {sid} refused")
                    raise Http2Error(f"stream {sid} reset: {event.error_code!r}")
                elif isinstance(event, h2.events.ConnectionTerminated):
                    self.going_away = True  # no new stream on this connection
                    if not ended and (event.last_stream_id is None or event.last_stream_id < sid):
                        raise _Refused(f"GOAWAY below stream {sid}")
                    # At or below the last stream id: the peer still answers this one.
        out = conn.data_to_send()  # window updates, acknowledgements
        if out:
            try:
                sock.sendall(out)
            except OSError:
                self.going_away = True  # the answer is complete; the next request reconnects
        return Http2Response(status, answer_headers, bytes(answer))
