"""The TCP proxies: one asyncio listener per proxy, two toxic chains per connection.

Model (Toxiproxy's ``proxy.go``, ``link.go``, ``toxic_collection.go``):

* a :class:`Proxy` listens on ``listen`` and, for every accepted client, dials ``upstream``;
* a :class:`Connection` has two :class:`Link` s: *upstream* (client -> server) and
  *downstream* (server -> client);
* a link runs the proxy's toxics of its direction as a chain of :class:`Stage` s, in the order
  they were added. With no toxic in a direction, bytes go straight from one socket to the other.

Live changes: adding a toxic appends a stage (what the last stage emits from then on goes
through it); removing one moves the bytes it still held to the next stage, in order; updating
one restarts it on the bytes it holds. Toxics never pop a chunk before passing it on, and every
change happens in one event-loop step, so no byte is lost or reordered (Toxiproxy's
``TestNoDataDropped``). Toxicity is decided per connection per toxic, when the toxic is attached
to the connection and again when it is updated.

End of stream follows Toxiproxy: when one link's source ends, the end goes through the chain and
then the destination socket is closed (fully: Toxiproxy does not half-close), which in turn ends
the other link. ``enabled: false`` closes the listener and aborts every open connection.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import logging
import random
import socket
import struct
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from chaos.toxiproxy.toxics import Chunk, Toxic

log = logging.getLogger(__name__)

DIRECTIONS = ("upstream", "downstream")
#: default listen address when a create/populate request gives none (loopback only)
DEFAULT_LISTEN = "127.0.0.1:0"
#: pause reading a socket while this many bytes sit inside a link's toxics (a latency toxic
#: passes at most HIGH_WATER per latency period: 160 MB/s at 100 ms) ...
HIGH_WATER = 16 * 1024 * 1024
#: ... and resume below this
LOW_WATER = 4 * 1024 * 1024
BACKLOG = 1024


class ApiError(Exception):
    """An error with Toxiproxy's message and HTTP status (``{"error": ..., "status": ...}``)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.message = message
        self.status = status

    def to_json(self) -> dict[str, Any]:
        return {"error": self.message, "status": self.status}


def proxy_not_found() -> ApiError:
    return ApiError("proxy not found", 404)


def proxy_exists() -> ApiError:
    return ApiError("proxy already exists", 409)


def toxic_not_found() -> ApiError:
    return ApiError("toxic not found", 404)


def toxic_exists() -> ApiError:
    return ApiError("toxic already exists", 409)


def parse_direction(stream: str) -> str:
    value = stream.lower()
    if value not in DIRECTIONS:
        raise ApiError("stream was invalid, can be either upstream or downstream", 400)
    return value


def _json_number(value: float) -> float | int:
    """Go marshals float32 1.0 as ``1``: keep integral toxicities integral in JSON."""
    return int(value) if float(value).is_integer() else value


@dataclass(eq=False)
class ToxicSpec:
    """A toxic as the API knows it (Toxiproxy's ``ToxicWrapper``)."""

    name: str
    type: str
    stream: str
    toxicity: float
    toxic: Toxic
    direction: str = ""

    def __post_init__(self) -> None:
        if not self.direction:
            self.direction = parse_direction(self.stream)

    def to_json(self) -> dict[str, Any]:
        return {
            "attributes": self.toxic.attributes(),
            "name": self.name,
            "type": self.type,
            "stream": self.stream,
            "toxicity": _json_number(self.toxicity),
        }


# -- the data path -------------------------------------------------------------------------------


class Stage:
    """One toxic running on one direction of one connection (a ``ToxicStub``).

    ``output`` is where it passes chunks on: the next stage's :meth:`push`, or the link's
    delivery to the destination socket. The link rewires it when the chain changes. Standalone
    use (tests): give ``output``, and optionally ``on_release`` (bytes that left the chain or
    were dropped) and ``on_reset``.
    """

    def __init__(
        self,
        spec: ToxicSpec,
        *,
        rng: random.Random,
        output: Callable[[Chunk | None], None],
        on_release: Callable[[int], None] | None = None,
        on_reset: Callable[[], None] | None = None,
    ) -> None:
        self.spec = spec
        self.toxic = spec.toxic
        self.rng = rng
        self.output = output
        self.on_release = on_release
        self.on_reset = on_reset
        self.state: Any = spec.toxic.new_state()
        self.queue: deque[Chunk | None] = deque()
        self.active = False
        self.closed = False
        self.task: asyncio.Task[None] | None = None
        self._waiter: asyncio.Future[bool] | None = None
        self._loop = asyncio.get_running_loop()

    # -- lifecycle (the link calls these) ---------------------------------------------------------
    def start(self) -> None:
        """Roll toxicity for this connection and run the toxic (or pass through)."""
        self.toxic = self.spec.toxic
        self.active = self.rng.random() < self.spec.toxicity and not self.toxic.passthrough
        if self.active:
            self.task = self._loop.create_task(self._run())
        else:
            self._flush()

    def stop(self) -> None:
        """Stop the toxic; whatever it had not passed on stays queued, in order."""
        if self.task is not None:
            self.task.cancel()
            self.task = None
        self._waiter = None

    def restart(self) -> None:
        self.stop()
        if not self.closed:
            self.start()

    def drain(self) -> list[Chunk | None]:
        """Take every queued item (the stage is being removed)."""
        items = list(self.queue)
        self.queue.clear()
        return items

    async def _run(self) -> None:
        try:
            await self.toxic.pipe(self)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - a toxic bug must not kill the proxy
            log.exception("toxic %s failed; closing its stream", self.spec.name)
            self.close()

    def _flush(self) -> None:
        while self.queue and not self.closed:
            self.output(self.queue.popleft())

    def push(self, item: Chunk | None) -> None:
        if self.closed:
            if item is not None and self.on_release is not None:
                self.on_release(len(item.data))
            return
        if not self.active:
            self.output(item)
            return
        self.queue.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(True)

    # -- the Stub interface the toxics use --------------------------------------------------------
    def now(self) -> float:
        return self._loop.time()

    async def wait(self, deadline: float | None = None) -> bool:
        while not self.queue:
            if self.closed:
                await self._loop.create_future()  # a closed stage never gets data again
            waiter = self._loop.create_future()
            self._waiter = waiter
            timer = None
            if deadline is not None:
                if deadline <= self._loop.time():
                    return False
                timer = self._loop.call_at(
                    deadline, lambda w=waiter: w.done() or w.set_result(False)
                )
            try:
                got = await waiter
            finally:
                if timer is not None:
                    timer.cancel()
                if self._waiter is waiter:
                    self._waiter = None
            if not got and not self.queue:
                return False
        return True

    def peek(self) -> Chunk | None:
        return self.queue[0]

    def forward(self) -> None:
        self.output(self.queue.popleft())

    def forward_part(self, size: int) -> None:
        chunk = self.queue[0]
        if chunk is None or size >= len(chunk.data):
            self.forward()
            return
        data = memoryview(chunk.data)
        self.queue[0] = Chunk(data[size:], chunk.ts)
        self.output(Chunk(data[:size], chunk.ts))

    def drop(self) -> None:
        chunk = self.queue.popleft()
        if chunk is not None and self.on_release is not None:
            self.on_release(len(chunk.data))

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        dropped = sum(len(c.data) for c in self.queue if c is not None)
        self.queue.clear()
        if dropped and self.on_release is not None:
            self.on_release(dropped)
        self.output(None)

    def reset(self) -> None:
        if self.on_reset is not None:
            self.on_reset()
        else:
            self.close()


class _Side(asyncio.Protocol):
    """One socket of a proxied connection: the client's, or the upstream's."""

    def __init__(self, conn: Connection, role: str) -> None:
        self.conn = conn
        self.role = role
        self.transport: asyncio.Transport | None = None
        self.reader: Link  # the link that reads from this socket
        self.writer: Link  # the link that writes to it
        self.write_paused = False
        self.lost = False
        self._holds: set[str] = set()

    # -- asyncio.Protocol -------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if self.role == "client":
            self.conn.client_connected()

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)

    def eof_received(self) -> bool:
        self.reader.feed_eof()
        return True  # keep writing: the other link closes this socket when it ends

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.reader.feed_eof()
        self.conn.side_lost()

    def pause_writing(self) -> None:
        self.write_paused = True
        self.writer.update_flow()

    def resume_writing(self) -> None:
        self.write_paused = False
        self.writer.update_flow()

    # -- helpers ----------------------------------------------------------------------------------
    @property
    def usable(self) -> bool:
        return self.transport is not None and not self.lost and not self.transport.is_closing()

    def write(self, data: bytes | memoryview) -> None:
        if self.usable:
            assert self.transport is not None
            self.transport.write(data)

    def hold(self, reason: str, held: bool) -> None:
        """Pause reading while any reason holds it."""
        before = bool(self._holds)
        if held:
            self._holds.add(reason)
        else:
            self._holds.discard(reason)
        after = bool(self._holds)
        if before != after and self.usable:
            assert self.transport is not None
            if after:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    def close(self) -> None:
        """Flush what is buffered, then close (FIN); nothing more is read from it."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
        self.reader.feed_eof()

    def abort(self, *, rst: bool = False) -> None:
        if self.transport is None:
            return
        if rst:
            sock = self.transport.get_extra_info("socket")
            if sock is not None:
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                except OSError:
                    pass
        self.transport.abort()


class Link:
    """One direction of a connection: source socket -> toxic stages -> destination socket."""

    def __init__(self, conn: Connection, direction: str, src: _Side, dst: _Side) -> None:
        self.conn = conn
        self.direction = direction
        self.src = src
        self.dst = dst
        self.stages: list[Stage] = []
        self.inflight = 0  # bytes inside the stages
        self.eof = False  # the source ended
        self.done = False  # the end went through: destination closed
        self._over_high = False
        self._pending: list[bytes | None] | None = []

    # -- data -------------------------------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        if self.eof or self.done:
            return
        self.conn.proxy.received_bytes[self.direction] += len(data)
        if self._pending is not None:  # not linked yet: the upstream is being dialled
            self._pending.append(data)
            self.inflight += len(data)
        elif not self.stages:
            self._write(data)
            return
        else:
            self.inflight += len(data)
            self.stages[0].push(Chunk(data, self.conn.loop.time()))
        if self.inflight > HIGH_WATER:
            self.update_flow()

    def feed_eof(self) -> None:
        if self.eof:
            return
        self.eof = True
        if self._pending is not None:
            self._pending.append(None)
        elif self.stages:
            self.stages[0].push(None)
        else:
            self._deliver(None)

    def activate(self, specs: Iterable[ToxicSpec]) -> None:
        """Start the toxics and let through what arrived while the upstream was dialled."""
        for spec in specs:
            self.add(spec)
        pending, self._pending = self._pending or [], None
        eof, self.eof = self.eof, False
        for item in pending:
            if item is None:
                break
            self.inflight -= len(item)
            self.conn.proxy.received_bytes[self.direction] -= len(item)  # counted on arrival
            self.feed(item)
        if eof:
            self.feed_eof()
        self.update_flow()

    def _write(self, data: bytes | memoryview) -> None:
        if self.dst.usable:
            self.conn.proxy.sent_bytes[self.direction] += len(data)
        self.dst.write(data)

    def _deliver(self, item: Chunk | None) -> None:
        if item is None:
            if not self.done:
                self.done = True
                self.dst.close()
            return
        self.inflight -= len(item.data)
        self._write(item.data)
        if self._over_high and self.inflight < LOW_WATER:
            self.update_flow()

    def _released(self, size: int) -> None:
        self.inflight -= size
        if self._over_high and self.inflight < LOW_WATER:
            self.update_flow()

    def update_flow(self) -> None:
        if self.inflight > HIGH_WATER:
            self._over_high = True
        elif self.inflight < LOW_WATER:
            self._over_high = False
        self.src.hold(f"flow-{self.direction}", self._over_high or self.dst.write_paused)

    # -- toxics -----------------------------------------------------------------------------------
    def add(self, spec: ToxicSpec) -> None:
        stage = Stage(
            spec,
            rng=self.conn.rng,
            output=self._deliver,
            on_release=self._released,
            on_reset=self.conn.reset,
        )
        if self.stages:
            self.stages[-1].output = stage.push
        self.stages.append(stage)
        stage.start()

    def remove(self, name: str) -> None:
        index = next((i for i, s in enumerate(self.stages) if s.spec.name == name), None)
        if index is None:
            return
        stage = self.stages.pop(index)
        stage.stop()
        if index > 0:
            self.stages[index - 1].output = stage.output
        if stage.closed:
            return
        if stage.active and stage.toxic.close_on_remove:
            stage.close()  # Toxiproxy's TimeoutToxic.Cleanup: the connection closes
            return
        for item in stage.drain():
            stage.output(item)

    def update(self, name: str) -> None:
        for stage in self.stages:
            if stage.spec.name == name:
                stage.restart()
                return

    def stop(self) -> None:
        for stage in self.stages:
            stage.stop()


class Connection:
    """A client connection and its upstream connection."""

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy
        self.loop = asyncio.get_running_loop()
        self.rng = proxy.rng
        self.client = _Side(self, "client")
        self.server = _Side(self, "upstream")
        self.links = {
            "upstream": Link(self, "upstream", self.client, self.server),
            "downstream": Link(self, "downstream", self.server, self.client),
        }
        self.client.reader = self.server.writer = self.links["upstream"]
        self.server.reader = self.client.writer = self.links["downstream"]
        self._connect_task: asyncio.Task[None] | None = None
        self.linked = False
        self.closed = False

    def client_connected(self) -> None:
        if not self.proxy.enabled:
            # Accepted by the kernel before the listener closed, handed to us after the proxy
            # was disabled (asyncio accepts in a task of its own): dropped like every other
            # connection of a disabled proxy. On a loaded machine this one outlived an outage.
            self.closed = True
            self.client.abort()
            return
        self.proxy.connections.add(self)
        self._connect_task = self.loop.create_task(self._connect())

    async def _connect(self) -> None:
        host, port = split_host_port(self.proxy.upstream)
        try:
            await self.loop.create_connection(lambda: self.server, host, port)
        except (OSError, ValueError) as exc:
            log.info("proxy %s: cannot reach upstream %s: %s", self.proxy.name, host, exc)
            self.client.close()
            self.close()
            return
        finally:
            self._connect_task = None
        if self.closed:
            self.server.abort()
            return
        self.linked = True
        for direction, link in self.links.items():
            link.activate(self.proxy.chain(direction))

    def add_toxic(self, spec: ToxicSpec) -> None:
        if self.linked and not self.closed:
            self.links[spec.direction].add(spec)

    def remove_toxic(self, spec: ToxicSpec) -> None:
        if self.linked:
            self.links[spec.direction].remove(spec.name)

    def update_toxic(self, spec: ToxicSpec) -> None:
        if self.linked:
            self.links[spec.direction].update(spec.name)

    def side_lost(self) -> None:
        if self.client.lost and (self.server.lost or self.server.transport is None):
            self.close()

    def close(self) -> None:
        """Forget the connection (its sockets are closed or closing)."""
        if self.closed:
            return
        self.closed = True
        if self._connect_task is not None:
            self._connect_task.cancel()
        for link in self.links.values():
            link.stop()
        self.proxy.connections.discard(self)

    def abort(self) -> None:
        """Close both sockets now (proxy disabled or deleted)."""
        self.client.abort()
        self.server.abort()
        self.close()

    def reset(self) -> None:
        """TCP RST to both peers (reset_peer)."""
        self.client.abort(rst=True)
        self.server.abort(rst=True)
        self.close()


# -- addresses -----------------------------------------------------------------------------------


def split_host_port(address: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` -> (host, port); ValueError with Go's wording."""
    if address.startswith("["):
        end = address.find("]")
        if end < 0:
            raise ValueError(f"address {address}: missing ']' in address")
        host, rest = address[1:end], address[end + 1 :]
        if not rest.startswith(":"):
            raise ValueError(f"address {address}: missing port in address")
        port_text = rest[1:]
    else:
        host, sep, port_text = address.rpartition(":")
        if not sep:
            raise ValueError(f"address {address}: missing port in address")
        if ":" in host:
            raise ValueError(f"address {address}: too many colons in address")
    try:
        port = int(port_text) if port_text else 0
    except ValueError:
        raise ValueError(f"lookup tcp/{port_text}: unknown port") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"address {port_text}: invalid port")
    return host, port


def join_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def resolve_listen(listen: str) -> tuple[socket.AddressFamily, str, int]:
    """The one address a listen string binds (IPv4 preferred, as Go does for ``localhost``)."""
    try:
        host, port = split_host_port(listen or DEFAULT_LISTEN)
    except ValueError as exc:
        raise ApiError(f"listen tcp: {exc}", 500) from None
    if not host:
        host = "127.0.0.1"
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise ApiError(f"listen tcp: lookup {host}: {exc}", 500) from None
        infos.sort(key=lambda info: info[0] != socket.AF_INET)
        family, _, _, _, sockaddr = infos[0]
        return family, str(sockaddr[0]), port
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    return family, str(ip), port


# -- proxies -------------------------------------------------------------------------------------


@dataclass(eq=False)
class Proxy:
    """One proxy: its listener, its toxics (per direction, in order) and its connections."""

    name: str
    listen: str
    upstream: str
    rng: random.Random = field(default_factory=random.Random, repr=False)
    enabled: bool = False
    toxics: dict[str, list[ToxicSpec]] = field(
        default_factory=lambda: {d: [] for d in DIRECTIONS}, repr=False
    )
    connections: set[Connection] = field(default_factory=set, repr=False)
    _server: asyncio.Server | None = field(default=None, repr=False)
    # Bytes each direction read from its source and wrote to its destination, for the API's
    # /metrics (Toxiproxy's toxiproxy_proxy_received_bytes_total / _sent_bytes_total).
    received_bytes: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(DIRECTIONS, 0), repr=False
    )
    sent_bytes: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(DIRECTIONS, 0), repr=False
    )

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "listen": self.listen,
            "upstream": self.upstream,
            "enabled": self.enabled,
            "toxics": [t.to_json() for t in self.toxic_list()],
        }

    # -- listener ---------------------------------------------------------------------------------
    async def start(self) -> None:
        """Listen (``enabled: true``). ``listen`` becomes the real address ("localhost:0" ->
        "127.0.0.1:40123"). ApiError 500 with Go's message when the address cannot be bound."""
        if self.enabled:
            return
        family, host, port = await resolve_listen(self.listen)
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
        except OSError as exc:
            sock.close()
            reason = (
                "address already in use"
                if exc.errno == errno.EADDRINUSE
                else (exc.strerror or str(exc)).lower()
            )
            raise ApiError(
                f"listen tcp {join_host_port(host, port)}: bind: {reason}", 500
            ) from None
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: Connection(self).client, sock=sock, backlog=BACKLOG
        )
        bound = sock.getsockname()
        self.listen = join_host_port(str(bound[0]), int(bound[1]))
        self.enabled = True
        log.info("proxy %s listening on %s -> %s", self.name, self.listen, self.upstream)

    def stop(self) -> None:
        """Close the listener and every open connection (``enabled: false``)."""
        if self._server is not None:
            self._server.close()
            self._server = None
        self.enabled = False
        for conn in list(self.connections):
            conn.abort()

    async def update(self, listen: str, upstream: str, enabled: bool) -> None:
        """POST/PATCH /proxies/{name}: a new address restarts the listener."""
        if not await same_listen(listen, self.listen) or upstream != self.upstream:
            self.stop()
            self.listen = listen
            self.upstream = upstream
        if enabled and not self.enabled:
            await self.start()
        elif not enabled and self.enabled:
            self.stop()

    # -- toxics -----------------------------------------------------------------------------------
    def chain(self, direction: str) -> list[ToxicSpec]:
        return self.toxics[direction]

    def toxic_list(self) -> list[ToxicSpec]:
        return [t for d in DIRECTIONS for t in self.toxics[d]]

    def get_toxic(self, name: str) -> ToxicSpec:
        for spec in self.toxic_list():
            if spec.name == name:
                return spec
        raise toxic_not_found()

    def add_toxic(self, spec: ToxicSpec) -> ToxicSpec:
        if any(t.name == spec.name for t in self.toxic_list()):
            raise toxic_exists()
        self.toxics[spec.direction].append(spec)
        for conn in list(self.connections):
            conn.add_toxic(spec)
        return spec

    def update_toxic(self, name: str, toxic: Toxic, toxicity: float) -> ToxicSpec:
        spec = self.get_toxic(name)
        spec.toxic = toxic
        spec.toxicity = toxicity
        for conn in list(self.connections):
            conn.update_toxic(spec)
        return spec

    def remove_toxic(self, name: str) -> None:
        spec = self.get_toxic(name)
        self.toxics[spec.direction].remove(spec)
        for conn in list(self.connections):
            conn.remove_toxic(spec)

    def reset_toxics(self) -> None:
        for spec in self.toxic_list():
            self.remove_toxic(spec.name)


async def same_listen(a: str, b: str) -> bool:
    """Whether two listen strings bind the same address (port 0 never matches)."""
    if a == b:
        return not a.endswith(":0")
    try:
        ra, rb = await resolve_listen(a), await resolve_listen(b)
    except ApiError:
        return False
    return ra == rb and ra[2] != 0


class ProxyCollection:
    """Every proxy of one server, by name (Toxiproxy's ``ProxyCollection``).

    Mutating calls are serialised by :attr:`lock` in the API layer, as Go's mutexes do.
    """

    def __init__(self, rng: random.Random | None = None) -> None:
        self.rng = rng if rng is not None else random.Random()
        self.proxies: dict[str, Proxy] = {}
        self.lock = asyncio.Lock()

    def new_proxy(self, name: str, listen: str, upstream: str) -> Proxy:
        return Proxy(name, listen or DEFAULT_LISTEN, upstream, rng=self.rng)

    def get(self, name: str) -> Proxy:
        proxy = self.proxies.get(name)
        if proxy is None:
            raise proxy_not_found()
        return proxy

    async def add(self, proxy: Proxy, start: bool) -> Proxy:
        if proxy.name in self.proxies:
            raise proxy_exists()
        if start:
            await proxy.start()
        self.proxies[proxy.name] = proxy
        return proxy

    async def add_or_replace(self, proxy: Proxy, start: bool) -> Proxy:
        """Populate: keep an existing proxy with the same listen and upstream (and its
        toxics), replace one that differs."""
        existing = self.proxies.get(proxy.name)
        if existing is not None:
            if existing.upstream == proxy.upstream and await same_listen(
                proxy.listen, existing.listen
            ):
                return existing
            existing.stop()
        if start:
            await proxy.start()
        self.proxies[proxy.name] = proxy
        return proxy

    def remove(self, name: str) -> None:
        proxy = self.get(name)
        proxy.stop()
        del self.proxies[name]

    def clear(self) -> None:
        for proxy in list(self.proxies.values()):
            proxy.stop()
        self.proxies.clear()
