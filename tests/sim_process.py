"""A provider simulator as a subprocess for the simulator tests: start, wait healthy, stop."""

from __future__ import annotations

import base64
import functools
import json
import os
import selectors
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.settings
import pytest

from emulators.ports import free_port
from emulators.providers.apns_keys import new_signing_key

REPO = Path(__file__).resolve().parents[1]
START_TIMEOUT = 30.0
# The simulator tests run against one process by default; SIM_TEST_PROCESSES=2 (and
# SIM_TEST_SERVER=granian) run the same tests against several processes on one port.
PROCESSES = int(os.environ.get("SIM_TEST_PROCESSES", "1"))
SERVER = os.environ.get("SIM_TEST_SERVER", "h2")
#: for tests of what only our own HTTP/2 server offers (the goaway fault, CONNECT)
needs_h2_server = pytest.mark.skipif(
    SERVER != "h2", reason="granian: no goaway fault, no CONNECT tunnel (see serving.py)"
)
#: for tests of a connection's SETTINGS_MAX_CONCURRENT_STREAMS changing (only our server can)
needs_h2_stream_settings = pytest.mark.skipif(
    SERVER != "h2",
    reason="granian: one SETTINGS_MAX_CONCURRENT_STREAMS for all connections, which the "
    "application cannot change per connection (APNs: 1000 from the start; see serving.py)",
)


#: this test process's APNs team: one signing key, one provider token (Apple: no more than one
#: new token per 20 minutes and connection)
SIGNING_KEY = new_signing_key(key_id="TESTKEY001")
APNS_TOPIC = "com.example.app"


@functools.cache
def provider_token() -> str:
    return SIGNING_KEY.provider_token()


@dataclass
class Sim:
    proc: subprocess.Popen[str]
    port: int
    url: str
    cert_dir: Path | None
    #: the bundles the suite's team registered here
    apns_topics: set[str] = field(default_factory=set)

    @property
    def ca(self) -> Path:
        assert self.cert_dir is not None
        return self.cert_dir / "ca.pem"

    def client_ssl(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))

    def control(self, method: str, path: str, body: object = None) -> tuple[int, dict]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        ctx = self.client_ssl() if self.cert_dir is not None else None
        try:
            with urllib.request.urlopen(req, timeout=10, context=ctx) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    def apns_headers(self, topic: str = APNS_TOPIC) -> dict[str, str]:
        """Headers of a push Apple accepts from this suite's team: its signing key registered
        (for ``topic`` too), a provider token, the topic and an alert push type."""
        self.apns_topics.add(topic)
        status, answer = self.control(
            "PUT", "/_sim/apns/keys", SIGNING_KEY.registration([APNS_TOPIC, *self.apns_topics])
        )
        assert status == 200, answer
        return {
            "authorization": f"bearer {provider_token()}",
            "apns-topic": topic,
            "apns-push-type": "alert",
        }

    def fcm_headers(self) -> dict[str, str]:
        """The Authorization header of a send to this FCM simulator: an access token from its
        ``POST /token`` by the JWT-bearer grant google-auth makes (the assertion's signature is
        not checked)."""
        header = base64.urlsafe_b64encode(b'{"alg":"RS256","typ":"JWT"}').rstrip(b"=").decode()
        form = urllib.parse.urlencode(
            {
                "grant_type": "urn:ietf:params:oauth:grant-type:jwt-bearer",
                "assertion": f"{header}.e30.c2ln",
            }  # fmt: skip
        ).encode()
        request = urllib.request.Request(f"{self.url}/token", data=form, method="POST")
        ctx = self.client_ssl() if self.cert_dir is not None else None
        with urllib.request.urlopen(request, timeout=10, context=ctx) as answer:
            return {"authorization": f"Bearer {json.loads(answer.read())['access_token']}"}

    def register_apns_key(self, key_file: Path, key_id: str, team_id: str, topic: str) -> None:
        """Register a system's own ``.p8`` key with this APNs simulator, as its team did with
        Apple, for its bundle ``topic``."""
        body = {"key_id": key_id, "team_id": team_id, "private_key": key_file.read_text()}
        status, answer = self.control("PUT", "/_sim/apns/keys", {**body, "topics": [topic]})
        assert status == 200, answer

    def apns_signing(self, topic: str = "com.example.fanout") -> dict[str, str]:
        """The reference's config values that sign with the suite's key (registered here for
        ``topic``, the reference's bundle by default)."""
        self.apns_headers(topic)
        key_dir = Path(tempfile.gettempdir()) / f"apns-suite-key-{os.getpid()}"
        path = key_dir / SIGNING_KEY.file_name
        if not path.exists():
            SIGNING_KEY.write(key_dir)
        return {
            "apns_key_file": str(path),
            "apns_key_id": SIGNING_KEY.key_id,
            "apns_team_id": SIGNING_KEY.team_id,
        }

    def next_seq(self) -> int:
        return self.control("GET", "/_sim/ledger?since=0")[1]["next"]

    def ledger(self, since: int = 0) -> list[dict]:
        status, body = self.control("GET", f"/_sim/ledger?since={since}")
        assert status == 200
        return body["rows"]

    def reset(self) -> None:
        assert self.control("POST", "/_sim/reset") == (200, {"ok": True})

    def start_fault(self, fault: str, params: dict | None = None, seed: int | None = None) -> dict:
        """Start a fault (``POST /_sim/faults``); returns its descriptor (with ``id``)."""
        body: dict = {"fault": fault, "params": params or {}}
        if seed is not None:
            body["seed"] = seed
        status, answer = self.control("POST", "/_sim/faults", body)
        assert status == 200, answer
        return answer

    def stop_fault(self, fault_id: str) -> dict:
        status, window = self.control("DELETE", f"/_sim/faults/{fault_id}")
        assert status == 200, window
        return window


def read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            return ""
    return proc.stdout.readline()


def wait_healthy(sim: Sim, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    delay = 0.01
    while True:
        try:
            status, body = sim.control("GET", "/_sim/health")
            if status == 200 and body.get("ok"):
                return
        except OSError:
            pass
        if time.monotonic() > deadline or sim.proc.poll() is not None:
            raise AssertionError("simulator did not become healthy")
        time.sleep(delay)  # back-off between polls of a condition, bounded by the deadline
        delay = min(delay * 2, 0.2)


def stop(proc: subprocess.Popen[str], sig: int = signal.SIGTERM) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        return proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=15)
        raise
    finally:
        if proc.stdout is not None:
            proc.stdout.close()


@contextmanager
def run_sim(
    module: str,
    log_dir: Path,
    *,
    tls: bool = False,
    processes: int | None = None,
    server: str | None = None,
    state_dir: Path | None = None,
) -> Iterator[Sim]:
    port = free_port()
    cmd = [sys.executable, "-m", module, "--port", str(port)]
    if module.rsplit(".", 1)[-1] in ("apns", "fcm"):
        cmd += ["--processes", str(processes or PROCESSES), "--server", server or SERVER]
    if state_dir is not None:
        cmd += ["--state-dir", str(state_dir)]
    cert_dir = None
    if tls:
        cert_dir = log_dir / "certs"
        cmd += ["--tls", "--cert-dir", str(cert_dir)]
    stderr = open(log_dir / f"{module}-{port}.stderr", "w")  # noqa: SIM115
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        line = read_line(proc, START_TIMEOUT)
        scheme = "https" if tls else "http"
        assert (
            line.strip()
            == f"{module.rsplit('.', 1)[-1]} simulator listening on {scheme}://127.0.0.1:{port}"
        ), line
        sim = Sim(proc, port, f"{scheme}://127.0.0.1:{port}", cert_dir)
        wait_healthy(sim, START_TIMEOUT)
        yield sim
    finally:
        stop(proc)
        stderr.close()


class H2Probe:
    """hyper-h2 by hand over a blocking socket (h2c): every frame the server sends is seen, in
    order, as an event, and what a real client library would hide (a refused stream, the
    SETTINGS_MAX_CONCURRENT_STREAMS each SETTINGS frame announced) is asked directly."""

    def __init__(self, port: int, timeout: float = 10.0) -> None:
        self.port = port
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.conn.initiate_connection()
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.events: list[h2.events.Event] = []
        #: SETTINGS_MAX_CONCURRENT_STREAMS each time the server's SETTINGS set it
        self.max_streams_seen: list[int] = []
        self._flush()

    def __enter__(self) -> H2Probe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def _flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def open_stream(
        self, path: str, headers: dict[str, str], body: bytes = b"", *, end: bool = True
    ) -> int:
        """Start a POST (sent at once); ``end=False`` leaves the stream open for more body."""
        sid = self.conn.get_next_available_stream_id()
        fields = [
            (":method", "POST"),
            (":scheme", "http"),
            (":authority", f"127.0.0.1:{self.port}"),
            (":path", path),
            *headers.items(),
        ]
        self.conn.send_headers(sid, fields, end_stream=end and not body)
        if body:
            self.conn.send_data(sid, body, end_stream=end)
        self._flush()
        return sid

    def cancel(self, sid: int) -> None:
        """Reset stream ``sid`` from the client's side (RST_STREAM CANCEL)."""
        self.conn.reset_stream(sid, h2.errors.ErrorCodes.CANCEL)
        self._flush()

    def finish(self, sid: int, body: bytes = b"") -> None:
        self.conn.send_data(sid, body, end_stream=True)
        self._flush()

    def read_until(self, done: Callable[[h2.events.Event], bool]) -> h2.events.Event:
        """The first event, of those seen or still to come, that satisfies ``done`` (reading
        frames until one does; the socket's timeout bounds each read). Every event is kept in
        ``events``."""
        for event in self.events:
            if done(event):
                return event
        code = h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS
        while True:
            data = self.sock.recv(65536)
            assert data, "the server closed the connection"
            found = None
            for event in self.conn.receive_data(data):
                self.events.append(event)
                if isinstance(event, h2.events.RemoteSettingsChanged):
                    if code in event.changed_settings:
                        self.max_streams_seen.append(event.changed_settings[code].new_value)
                if found is None and done(event):
                    found = event
            self._flush()
            if found is not None:
                return found

    def settings(self) -> list[int]:
        """Wait for the server's first SETTINGS frame; the MAX_CONCURRENT_STREAMS values seen."""
        self.read_until(lambda e: isinstance(e, h2.events.RemoteSettingsChanged))
        return self.max_streams_seen

    def answer(self, sid: int) -> int:
        """Wait for stream ``sid`` to end; its :status."""
        self.read_until(lambda e: isinstance(e, h2.events.StreamEnded) and e.stream_id == sid)
        for event in self.events:
            if isinstance(event, h2.events.ResponseReceived) and event.stream_id == sid:
                return int(dict(event.headers)[b":status"])
        raise AssertionError(f"stream {sid} ended without a response")

    def reset(self, sid: int) -> h2.events.StreamReset:
        """Wait for stream ``sid`` to be reset; the event (its error_code)."""
        event = self.read_until(
            lambda e: isinstance(e, h2.events.StreamReset) and e.stream_id == sid
        )
        assert isinstance(event, h2.events.StreamReset)
        return event

    def terminated(self) -> bool:
        """Whether the server sent GOAWAY on this connection so far."""
        return any(isinstance(e, h2.events.ConnectionTerminated) for e in self.events)
