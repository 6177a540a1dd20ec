"""Serving the APNs and FCM simulators: one process or several on one port, on one of two
HTTP servers.

``--server h2`` (default): our asyncio server on the ``h2`` library
(:mod:`emulators.http_server`). Everything the simulators offer: TLS and plaintext on one
port, ``CONNECT`` to itself (clients that reach api.push.apple.com through an HTTPS proxy),
and the ``goaway`` fault. With ``--processes N`` the parent binds N sockets to the port with
``SO_REUSEPORT`` (the kernel spreads connections over them) and runs one worker per socket.

``--server granian``: granian (Rust, hyper's HTTP/1.1 and HTTP/2) with ``--processes`` workers
sharing its listening socket; our simulator is the RSGI application. HTTP/2 with prior
knowledge, HTTP/1.1, TLS (ALPN h2/http1.1, and h2 sniffed without ALPN, as aioapns connects).
Not: plaintext on a TLS port, ``CONNECT``, the ``goaway`` fault (the application has no hold
on a connection: starting it answers 400).

Concurrent streams per HTTP/2 connection, as each provider advertises them: every simulator
class declares its :class:`StreamLimits` (``STREAMS``; APNs 1 until a request with a valid
provider token, then 1000; FCM 100). Our server advertises ``first`` in a connection's first
SETTINGS frame and refuses streams over the limit with RST_STREAM REFUSED_STREAM; the APNs
simulator raises its connection to ``most`` when a provider token verifies. granian takes one
limit for all its connections (``--http2-max-concurrent-streams``, at least 10) and gives the
application no hold on a connection, so it advertises ``most`` from the start: under granian a
new APNs connection allows 1000 streams before any token, not 1. (hyper answers a stream over
the limit with REFUSED_STREAM too.)

Why both (``make bench``, ``benchmarks/bench_simulators.py --candidates``, 2-core machine,
h2load over h2c, the APNs success path with every request in the ledger; README has the
figures): our server spends 110-138 µs of CPU per request, nearly all of it in the pure-Python
``h2``/``hpack`` state machine and Huffman coding, so one process does 6,500-9,000 req/s on an
idle machine and two 12,000-14,000; under granian the same
simulator code costs 20-26 µs per request (about 6 µs of it our Python, the rest hyper's HTTP/2
and granian's bridge: a minimal RSGI application costs 14-16), five times less, and two workers
answered 65,000-73,000 req/s on the idle machine. The ``h2`` server stays the default because
only it offers every fault and both TLS modes; ``granian`` is for a load a real consumer fleet
drives.

The processes share one state directory (:mod:`emulators.providers.shared`): the control API
applies to all of them, and the ledger is one Arrow file per process, merged for readers
(``GET /_sim/ledger``, or the files themselves: ``GET /_sim/ledger/source`` says where).
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import errno
import gc
import importlib
import os
import selectors
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from emulators.certs import load_or_generate_tls_material, simulator_tls
from emulators.http_server import (
    ConnectionRegistry,
    Handler,
    PortInUseError,
    Request,
    Response,
    serve_forever,
    start_server,
    stop_on_signals,
)
from emulators.ports import free_port
from emulators.providers.ledger import ProviderState
from emulators.providers.shared import STATE_DIR_ENV, SharedDir

SERVERS = ("h2", "granian")
DEFAULT_SERVER = "h2"
DEFAULT_PROCESSES = 1
MAX_PROCESSES = 64
PROVIDER_ENV = "SIM_PROVIDER"
START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
SIMULATORS = {
    "apns": ("emulators.providers.apns", "ApnsSimulator"),
    "fcm": ("emulators.providers.fcm", "FcmSimulator"),
}
#: granian's lowest ``--http2-max-concurrent-streams``
GRANIAN_MIN_STREAMS = 10
GOAWAY_UNSUPPORTED = (
    "granian gives the application no hold on a connection; run the simulator with --server h2"
)


def positive_processes(text: str) -> int:
    """argparse type of ``--processes``: a whole number from 1 to 64."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if not 1 <= value <= MAX_PROCESSES:
        raise argparse.ArgumentTypeError(f"must be from 1 to {MAX_PROCESSES}, got {value}")
    return value


def add_serving_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every push simulator's command line takes."""
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tls", action="store_true", help="serve TLS with a generated cert")
    parser.add_argument(
        "--cert-dir",
        type=Path,
        default=None,
        help="where ca.pem/server.pem/server.key live (reused if present; default: temp dir)",
    )
    parser.add_argument(
        "--processes",
        type=positive_processes,
        default=DEFAULT_PROCESSES,
        help=f"processes serving the port (default {DEFAULT_PROCESSES})",
    )
    parser.add_argument(
        "--server",
        choices=SERVERS,
        default=DEFAULT_SERVER,
        help="h2: every fault and TLS mode; granian: several times the throughput, no goaway "
        "fault, no CONNECT (default h2)",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="shared state and the ledger's Arrow files (default: a temp dir, removed at exit)",
    )


@dataclass(frozen=True)
class StreamLimits:
    """SETTINGS_MAX_CONCURRENT_STREAMS of a simulator's HTTP/2 connections.

    ``first``: what a new connection advertises in its first SETTINGS frame. ``most``: what a
    connection may be raised to by the simulator (APNs: once a request's provider token
    verifies), and what a server that cannot tell connections apart (granian) advertises to all.
    """

    first: int
    most: int

    def __post_init__(self) -> None:
        if not 1 <= self.first <= self.most:
            raise ValueError(f"need 1 <= first <= most, got {self.first}, {self.most}")


def stream_limits(provider: str) -> StreamLimits:
    """The concurrent-stream limits the provider's simulator class declares (``STREAMS``)."""
    module, name = SIMULATORS[provider]
    # (no isinstance check: a worker runs this module as __main__, whose StreamLimits is
    # another class than the one the simulator module imported)
    limits: StreamLimits = getattr(importlib.import_module(module), name).STREAMS
    return limits


@dataclass
class ServeOptions:
    provider: str
    host: str
    port: int
    tls: bool = False
    cert_dir: Path | None = None
    processes: int = DEFAULT_PROCESSES
    server: str = DEFAULT_SERVER
    state_dir: Path | None = None

    @property
    def streams(self) -> StreamLimits:
        """Concurrent streams per connection: what the provider's simulator declares."""
        return stream_limits(self.provider)

    @classmethod
    def from_args(cls, provider: str, args: argparse.Namespace) -> ServeOptions:
        return cls(
            provider,
            args.host,
            args.port,
            args.tls,
            args.cert_dir,
            args.processes,
            args.server,
            args.state_dir,
        )


def make_simulator(provider: str, state: ProviderState) -> Any:
    """The provider's simulator object (its ``handle`` is the request handler)."""
    module, name = SIMULATORS[provider]
    return getattr(importlib.import_module(module), name)(state)


def serve(options: ServeOptions) -> int:
    """Run a simulator in the foreground until SIGTERM/SIGINT; the exit code (2: port taken).

    Prints ``<provider> simulator listening on <url>`` once every process serves."""
    temp_state = None
    state_dir = options.state_dir
    if state_dir is None:
        temp_state = Path(tempfile.mkdtemp(prefix=f"{options.provider}-sim-state-"))
        state_dir = temp_state
    ctx, temp_certs = simulator_tls(options.provider, options.tls, options.cert_dir)
    cert_dir = options.cert_dir or temp_certs
    shared = SharedDir.create(state_dir)
    try:
        if options.server == "granian":
            return _serve_granian(options, shared, cert_dir)
        if options.processes == 1:
            state = ProviderState(options.provider, shared=shared, process_name="p0")
            try:
                simulator = make_simulator(options.provider, state)
                tune_gc_for_serving()
                return serve_forever(
                    options.provider,
                    simulator.handle,
                    options.host,
                    options.port,
                    ctx,
                    max_concurrent_streams=options.streams.first,
                )
            finally:
                state.close()
        return _serve_h2_processes(options, shared, cert_dir)
    finally:
        shared.close()
        for temp in (temp_state, temp_certs):
            if temp is not None:
                shutil.rmtree(temp, ignore_errors=True)


# -- several processes ------------------------------------------------------------------------
def _url(options: ServeOptions, port: int) -> str:
    host = f"[{options.host}]" if ":" in options.host else options.host
    return f"{'https' if options.tls else 'http'}://{host}:{port}"


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _check_port_free(host: str, port: int) -> None:
    """Raise :class:`PortInUseError` when another socket holds the port.

    ``SO_REUSEPORT`` would quietly share a port with another process of the same user that set
    it too, so the check binds without it first."""
    if port == 0:
        return
    with socket.socket(_family(host), socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PortInUseError(port, host) from exc
            raise


def bind_reuseport(host: str, port: int, count: int) -> list[socket.socket]:
    """``count`` listening sockets on one port (``SO_REUSEPORT``: the kernel spreads new
    connections over them). Port 0: the first one's ephemeral port."""
    _check_port_free(host, port)
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(_family(host), socket.SOCK_STREAM)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, port))
            port = sock.getsockname()[1]
            sock.listen(1024)
            sock.set_inheritable(True)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


class _StopFlag:
    """SIGTERM/SIGINT in the parent: set, and its waits end."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.previous = {
            sig: signal.signal(sig, lambda *_: self.event.set())
            for sig in (signal.SIGTERM, signal.SIGINT)
        }

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def _wait_line(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            return ""
    return proc.stdout.readline()


def _supervise(name: str, procs: list[subprocess.Popen[str]], stop: _StopFlag, url: str) -> int:
    """Announce, then wait for a signal (0) or a process that ended on its own (1)."""
    print(f"{name} simulator listening on {url}", flush=True)
    while not stop.event.wait(0.2):
        dead = [p for p in procs if p.poll() is not None]
        if dead:
            print(
                f"{name} simulator: a serving process (pid {dead[0].pid}) exited with "
                f"{dead[0].returncode}; stopping the others",
                file=sys.stderr,
                flush=True,
            )
            return 1
    return 0


def _stop_all(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_TIMEOUT)
        if proc.stdout is not None:
            proc.stdout.close()


def _serve_h2_processes(options: ServeOptions, shared: SharedDir, cert_dir: Path | None) -> int:
    name = options.provider
    try:
        sockets = bind_reuseport(options.host, options.port, options.processes)
    except PortInUseError as exc:
        print(f"{name} simulator: {exc}", file=sys.stderr, flush=True)
        return 2
    port = sockets[0].getsockname()[1]
    stop = _StopFlag()
    procs: list[subprocess.Popen[str]] = []
    try:
        for index, sock in enumerate(sockets):
            argv = [
                sys.executable, "-m", "emulators.providers.serving", "worker", name,
                "--fd", str(sock.fileno()), "--index", str(index),
                "--state-dir", str(shared.path),
            ]  # fmt: skip
            if cert_dir is not None and options.tls:
                argv += ["--cert-dir", str(cert_dir)]
            procs.append(
                subprocess.Popen(argv, pass_fds=(sock.fileno(),), stdout=subprocess.PIPE, text=True)
            )
        for sock in sockets:
            sock.close()  # the workers hold them now
        deadline = time.monotonic() + START_TIMEOUT
        for proc in procs:
            line = _wait_line(proc, max(0.0, deadline - time.monotonic()))
            if line.strip() != "ready":
                print(
                    f"{name} simulator: a serving process did not start (pid {proc.pid})",
                    file=sys.stderr,
                    flush=True,
                )
                return 1
        return _supervise(name, procs, stop, _url(options, port))
    finally:
        _stop_all(procs)
        for sock in sockets:
            sock.close()
        stop.restore()


def _serve_granian(options: ServeOptions, shared: SharedDir, cert_dir: Path | None) -> int:
    name = options.provider
    port = options.port
    try:
        _check_port_free(options.host, port)
    except PortInUseError as exc:
        print(f"{name} simulator: {exc}", file=sys.stderr, flush=True)
        return 2
    if port == 0:
        port = free_port()
    argv = [
        sys.executable, "-m", "granian", "--interface", "rsgi", "--http", "auto", "--no-ws",
        "--workers", str(options.processes), "--runtime-threads", "1",
        "--host", options.host, "--port", str(port), "--backlog", "1024",
        "--http2-max-concurrent-streams", str(max(options.streams.most, GRANIAN_MIN_STREAMS)),
        "--log-level", "warning", "--no-access-log",
        "--workers-kill-timeout", "5", "--factory",
    ]  # fmt: skip
    if options.tls:
        assert cert_dir is not None
        argv += [
            "--ssl-certificate", str(cert_dir / "server.pem"),
            "--ssl-keyfile", str(cert_dir / "server.key"),
        ]  # fmt: skip
    argv.append("emulators.providers.serving:rsgi_app_from_env")
    env = {**os.environ, PROVIDER_ENV: name, STATE_DIR_ENV: str(shared.path)}
    stop = _StopFlag()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, text=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not _granian_ready(shared, options, port):
            if proc.poll() is not None or time.monotonic() > deadline or stop.event.is_set():
                print(f"{name} simulator: granian did not start", file=sys.stderr, flush=True)
                return 1
            time.sleep(0.05)  # polling a condition, bounded by the deadline
        return _supervise(name, [proc], stop, _url(options, port))
    finally:
        _stop_all([proc])
        stop.restore()


def _granian_ready(shared: SharedDir, options: ServeOptions, port: int) -> bool:
    if len(shared.live_processes()) < options.processes:
        return False  # a worker claims its slot when it builds the application
    try:
        with socket.create_connection((options.host, port), timeout=1):
            return True
    except OSError:
        return False


#: gen-0 threshold of a serving process (Python's default: 700)
GC_THRESHOLD = (50_000, 20, 100)


def tune_gc_for_serving() -> None:
    """Fewer cyclic garbage collections in a serving process, none over its start-up objects.

    Why: a request allocates many containers (the request, header dicts, the ledger row,
    granian's task), so at the default threshold (700) the collector ran every few dozen
    requests and took 12% of a granian worker's samples (py-spy); frozen start-up objects and a
    50,000 threshold cut 2-4 µs of CPU per request (``benchmarks/bench_simulators.py``, same-run comparison).
    Nothing on the request path makes cycles, so garbage is still freed by reference counting
    at once; the collector still runs for what does."""
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)


# -- granian's side -------------------------------------------------------------------------
class RsgiApp:
    """The simulator as an RSGI application (granian's native interface, cheaper per request
    than ASGI: one call for the body, one for the answer)."""

    def __init__(self, handler: Handler, state: ProviderState) -> None:
        self.handler = handler
        self.state = state

    def __rsgi_init__(self, loop: asyncio.AbstractEventLoop) -> None:
        pass

    def __rsgi_del__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.state.close()  # write the rows still buffered

    async def __rsgi__(self, scope: Any, proto: Any) -> None:
        if scope.proto != "http":
            return
        body = await proto()
        raw = scope.headers.items()  # lower-case names (hyper), repeated names repeated
        headers = dict(raw)
        if len(headers) != len(raw):
            headers = {}
            for key, value in raw:
                headers[key] = f"{headers[key]}, {value}" if key in headers else value
        if "host" not in headers and scope.authority:
            headers["host"] = scope.authority
        query = scope.query_string
        request = Request(  # positional: a third cheaper than keywords, on every request
            scope.method,
            scope.path,
            dict(parse_qsl(query, keep_blank_values=True)) if query else {},
            headers,
            body,
            "2" if scope.http_version == "2" else "1.1",
            raw,
        )
        response: Response = await self.handler(request)
        if response.body:
            proto.response_bytes(response.status, list(response.headers.items()), response.body)
        else:
            proto.response_empty(response.status, list(response.headers.items()))


def rsgi_app_from_env() -> RsgiApp:
    """granian's factory (in each worker): the simulator named by ``SIM_PROVIDER`` on the state
    directory named by ``SIM_STATE_DIR``."""
    provider = os.environ[PROVIDER_ENV]
    shared = SharedDir(os.environ[STATE_DIR_ENV])
    state = ProviderState(
        provider,
        shared=shared,
        process_name=f"g{os.getpid()}",
        unsupported_faults={"goaway": GOAWAY_UNSUPPORTED},
    )
    app = RsgiApp(make_simulator(provider, state).handle, state)
    tune_gc_for_serving()
    return app


# -- our server's worker process ---------------------------------------------------------------
def _die_with_parent() -> None:
    """Linux: SIGTERM this process when its parent dies (a killed parent leaves no server)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


async def _worker(
    handler: Handler,
    sock: socket.socket,
    ctx: ssl.SSLContext | None,
    state: ProviderState,
    streams: StreamLimits,
) -> None:
    registry = ConnectionRegistry()
    server = await start_server(
        handler,
        "",
        0,
        ctx,
        registry=registry,
        sock=sock,
        max_concurrent_streams=streams.first,
    )
    try:
        with stop_on_signals() as stop:
            print("ready", flush=True)
            await stop.wait()
    finally:
        server.close()
        registry.close_all()
        await server.wait_closed()
        state.close()


def worker_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m emulators.providers.serving worker")
    parser.add_argument("provider", choices=sorted(SIMULATORS))
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--cert-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    _die_with_parent()
    sock = socket.socket(fileno=args.fd)
    ctx = load_or_generate_tls_material(args.cert_dir).server_context if args.cert_dir else None
    shared = SharedDir(args.state_dir)
    state = ProviderState(args.provider, shared=shared, process_name=f"p{args.index}")
    simulator = make_simulator(args.provider, state)
    tune_gc_for_serving()
    try:
        asyncio.run(_worker(simulator.handle, sock, ctx, state, stream_limits(args.provider)))
    except KeyboardInterrupt:
        pass
    finally:
        shared.close()
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        sys.exit(worker_main(sys.argv[2:]))
    sys.exit("usage: python -m emulators.providers.serving worker PROVIDER --fd N ...")
