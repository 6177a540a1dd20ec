"""Toxiproxy 2.x's HTTP API (``api.go``) on the project's asyncio HTTP server.

Routes, status codes, JSON shapes and error messages follow Toxiproxy:

=============================================  =============================================
``GET /proxies``                               200 ``{name: proxy}``
``POST /proxies``                              201 proxy; 400 missing name/upstream or bad
                                               body; 409 "proxy already exists"; 500 when
                                               the listen address cannot be bound
``POST /populate``                             201 ``{"proxies": [...]}`` (create or replace;
                                               an unchanged proxy keeps its toxics)
``GET /proxies/{p}``                           200 proxy; 404 "proxy not found"
``POST|PATCH /proxies/{p}``                    200 proxy (fields left out keep their value)
``DELETE /proxies/{p}``                        204
``GET /proxies/{p}/toxics``                    200 ``[toxic, ...]`` (upstream ones first)
``POST /proxies/{p}/toxics``                   200 toxic; 400 bad stream/type/attributes;
                                               409 "toxic already exists"
``GET /proxies/{p}/toxics/{t}``                200 toxic; 404 "toxic not found"
``POST|PATCH /proxies/{p}/toxics/{t}``         200 toxic (``attributes`` merged, ``toxicity``)
``DELETE /proxies/{p}/toxics/{t}``             204
``POST /reset``                                204: every proxy enabled, every toxic removed
``GET /version``                               200 ``{"version": "..."}``
=============================================  =============================================

A proxy is ``{"name","listen","upstream","enabled","toxics"}``, a toxic is
``{"attributes","name","type","stream","toxicity"}``, an error is ``{"error","status"}``.
Browsers (a ``Mozilla/`` user agent) get 403, as in Toxiproxy.

Deviations, all in the strict direction (what works here works on Toxiproxy): a negative
attribute is refused with 400; a create without ``listen`` listens on ``127.0.0.1:0`` rather
than on every interface.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from chaos.toxiproxy.proxy import (
    ApiError,
    Proxy,
    ProxyCollection,
    ToxicSpec,
    parse_direction,
)
from chaos.toxiproxy.toxics import new_toxic
from emulators.http_server import (
    ConnectionRegistry,
    PortInUseError,
    Request,
    Response,
    server_port,
    start_server,
    stop_on_signals,
)

#: the Toxiproxy release whose API this implements
VERSION = "2.12.0"
DEFAULT_PORT = 8474


def _error(exc: ApiError) -> Response:
    body = json.dumps(exc.to_json(), separators=(",", ":")).encode() + b"\n"
    return Response(exc.status, {"content-type": "application/json"}, body)


def _json(status: int, obj: Any) -> Response:
    body = json.dumps(obj, separators=(",", ":")).encode()
    return Response(status, {"content-type": "application/json"}, body)


def _no_content() -> Response:
    return Response(204, {}, b"")


def _decode(body: bytes) -> Any:
    """The first JSON value of the body, like Go's ``json.Decoder.Decode``."""
    try:
        text = body.decode("utf-8").lstrip()
    except UnicodeDecodeError:
        raise ApiError("bad request body: invalid UTF-8", 400) from None
    if not text:
        raise ApiError("bad request body: EOF", 400)
    try:
        value, _ = json.JSONDecoder().raw_decode(text)
    except json.JSONDecodeError as exc:
        raise ApiError(f"bad request body: {exc.msg}", 400) from None
    return value


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _lookup(obj: dict[str, Any], key: str) -> Any:
    """Go's encoding/json: exact key first, else a case-insensitive match."""
    if key in obj:
        return obj[key]
    folded = key.casefold()
    for name, value in obj.items():
        if name.casefold() == folded:
            return value
    return None


def _object(value: Any, go_type: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ApiError(
            f"bad request body: json: cannot unmarshal {_kind(value)} into Go value of type "
            f"{go_type}",
            400,
        )
    return value


def _string(obj: dict[str, Any], key: str, default: str, go_struct: str) -> str:
    value = _lookup(obj, key)
    if value is None:
        return default
    if not isinstance(value, str):
        raise ApiError(
            f"bad request body: json: cannot unmarshal {_kind(value)} into Go struct field "
            f"{go_struct}.{key} of type string",
            400,
        )
    return value


def _bool(obj: dict[str, Any], key: str, default: bool, go_struct: str) -> bool:
    value = _lookup(obj, key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ApiError(
            f"bad request body: json: cannot unmarshal {_kind(value)} into Go struct field "
            f"{go_struct}.{key} of type bool",
            400,
        )
    return value


def _float(obj: dict[str, Any], key: str, default: float, go_struct: str) -> float:
    value = _lookup(obj, key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ApiError(
            f"bad request body: json: cannot unmarshal {_kind(value)} into Go struct field "
            f"{go_struct}.{key} of type float32",
            400,
        )
    return float(value)


class ToxiproxyApi:
    """The request handler: ``await api.handle(request)``. One request at a time changes the
    proxies (Toxiproxy's collection and toxic locks)."""

    def __init__(self, collection: ProxyCollection | None = None, *, version: str = VERSION):
        self.collection = collection if collection is not None else ProxyCollection()
        self.version = version

    async def handle(self, request: Request) -> Response:
        response = await self._route(request)
        response.headers.setdefault("x-toxiproxy-request-id", os.urandom(10).hex())
        return response

    async def _metrics(self) -> Response:
        """Prometheus text: Toxiproxy 2.12's proxy metrics (its ``-proxy-metrics``), the bytes
        each proxy received and sent per direction, labelled as Toxiproxy labels them."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_ProxyBytes(self.collection))
        return Response(200, {"content-type": CONTENT_TYPE_LATEST}, generate_latest(registry))

    async def _route(self, request: Request) -> Response:
        if request.headers.get("user-agent", "").startswith("Mozilla/"):
            return Response(
                403, {"content-type": "text/plain; charset=utf-8"}, b"User agent not allowed\n"
            )
        parts = [unquote(p) for p in request.path.split("/")[1:]]
        method = request.method
        routes: dict[str, Callable[[], Awaitable[Response]]] | None = None
        if parts == ["version"]:
            routes = {"GET": self._version}
        elif parts == ["metrics"]:
            routes = {"GET": self._metrics}
        elif parts == ["reset"]:
            routes = {"POST": self._reset}
        elif parts == ["populate"]:
            routes = {"POST": lambda: self._populate(request)}
        elif parts == ["proxies"]:
            routes = {"GET": self._proxy_index, "POST": lambda: self._proxy_create(request)}
        elif len(parts) >= 2 and parts[0] == "proxies" and all(parts[1:]):
            name = parts[1]
            if len(parts) == 2:
                update = lambda: self._proxy_update(name, request)  # noqa: E731
                routes = {
                    "GET": lambda: self._proxy_show(name),
                    "POST": update,
                    "PATCH": update,
                    "DELETE": lambda: self._proxy_delete(name),
                }
            elif len(parts) == 3 and parts[2] == "toxics":
                routes = {
                    "GET": lambda: self._toxic_index(name),
                    "POST": lambda: self._toxic_create(name, request),
                }
            elif len(parts) == 4 and parts[2] == "toxics":
                toxic = parts[3]
                update = lambda: self._toxic_update(name, toxic, request)  # noqa: E731
                routes = {
                    "GET": lambda: self._toxic_show(name, toxic),
                    "POST": update,
                    "PATCH": update,
                    "DELETE": lambda: self._toxic_delete(name, toxic),
                }
        if routes is None:
            return Response(
                404, {"content-type": "text/plain; charset=utf-8"}, b"404 page not found\n"
            )
        action = routes.get(method)
        if action is None:
            return Response(405, {}, b"")
        async with self.collection.lock:
            try:
                return await action()
            except ApiError as exc:
                return _error(exc)

    # -- handlers ---------------------------------------------------------------------------------
    async def _version(self) -> Response:
        body = f'{{"version": "{self.version}"}}\n'.encode()
        return Response(200, {"content-type": "application/json;charset=utf-8"}, body)

    async def _reset(self) -> Response:
        for proxy in list(self.collection.proxies.values()):
            await proxy.start()
            proxy.reset_toxics()
        return _no_content()

    async def _proxy_index(self) -> Response:
        return _json(200, {p.name: p.to_json() for p in self.collection.proxies.values()})

    async def _proxy_create(self, request: Request) -> Response:
        obj = _object(_decode(request.body), "toxiproxy.Proxy")
        name = _string(obj, "name", "", "Proxy")
        listen = _string(obj, "listen", "", "Proxy")
        upstream = _string(obj, "upstream", "", "Proxy")
        enabled = _bool(obj, "enabled", True, "Proxy")
        if not name:
            raise ApiError("missing required field: name", 400)
        if not upstream:
            raise ApiError("missing required field: upstream", 400)
        proxy = self.collection.new_proxy(name, listen, upstream)
        await self.collection.add(proxy, enabled)
        return _json(201, proxy.to_json())

    async def _populate(self, request: Request) -> Response:
        value = _decode(request.body)
        if not isinstance(value, list):
            raise ApiError(
                f"bad request body: json: cannot unmarshal {_kind(value)} into Go value of "
                "type []toxiproxy.Proxy",
                400,
            )
        wanted: list[tuple[str, str, str, bool]] = []
        for index, item in enumerate(value, start=1):
            obj = _object(item, "toxiproxy.Proxy")
            name = _string(obj, "name", "", "Proxy")
            listen = _string(obj, "listen", "", "Proxy")
            upstream = _string(obj, "upstream", "", "Proxy")
            enabled = _bool(obj, "enabled", True, "Proxy")
            if not name:
                raise ApiError(f"missing required field: name at proxy {index}", 400)
            if not upstream:
                raise ApiError(f"missing required field: upstream at proxy {index}", 400)
            wanted.append((name, listen, upstream, enabled))
        done: list[Proxy] = []
        failure: ApiError | None = None
        for name, listen, upstream, enabled in wanted:
            try:
                proxy = await self.collection.add_or_replace(
                    self.collection.new_proxy(name, listen, upstream), enabled
                )
            except ApiError as exc:
                failure = exc
                break
            done.append(proxy)
        body: dict[str, Any] = failure.to_json() if failure is not None else {}
        body["proxies"] = [p.to_json() for p in done]
        return _json(failure.status if failure is not None else 201, body)

    async def _proxy_show(self, name: str) -> Response:
        return _json(200, self.collection.get(name).to_json())

    async def _proxy_update(self, name: str, request: Request) -> Response:
        proxy = self.collection.get(name)
        obj = _object(_decode(request.body), "toxiproxy.Proxy")
        listen = _string(obj, "listen", proxy.listen, "Proxy")
        upstream = _string(obj, "upstream", proxy.upstream, "Proxy")
        enabled = _bool(obj, "enabled", proxy.enabled, "Proxy")
        await proxy.update(listen, upstream, enabled)
        return _json(200, proxy.to_json())

    async def _proxy_delete(self, name: str) -> Response:
        self.collection.remove(name)
        return _no_content()

    async def _toxic_index(self, name: str) -> Response:
        proxy = self.collection.get(name)
        return _json(200, [t.to_json() for t in proxy.toxic_list()])

    async def _toxic_create(self, name: str, request: Request) -> Response:
        proxy = self.collection.get(name)
        obj = _object(_decode(request.body), "toxics.ToxicWrapper")
        toxic_name = _string(obj, "name", "", "ToxicWrapper")
        toxic_type = _string(obj, "type", "", "ToxicWrapper")
        stream = _string(obj, "stream", "downstream", "ToxicWrapper")
        toxicity = _float(obj, "toxicity", 1.0, "ToxicWrapper")
        direction = parse_direction(stream)
        if not toxic_name:
            toxic_name = f"{toxic_type}_{stream}"
        toxic = new_toxic(toxic_type)
        if toxic is None:
            raise ApiError("invalid toxic type", 400)
        if any(t.name == toxic_name for t in proxy.toxic_list()):
            raise ApiError("toxic already exists", 409)
        try:
            toxic = toxic.updated(_lookup(obj, "attributes"))
        except ValueError as exc:
            raise ApiError(f"bad request body: {exc}", 400) from None
        spec = ToxicSpec(toxic_name, toxic_type, stream, toxicity, toxic, direction)
        proxy.add_toxic(spec)
        return _json(200, spec.to_json())

    async def _toxic_show(self, name: str, toxic: str) -> Response:
        return _json(200, self.collection.get(name).get_toxic(toxic).to_json())

    async def _toxic_update(self, name: str, toxic: str, request: Request) -> Response:
        proxy = self.collection.get(name)
        spec = proxy.get_toxic(toxic)
        obj = _object(_decode(request.body), "toxics.ToxicWrapper")
        toxicity = _float(obj, "toxicity", spec.toxicity, "ToxicWrapper")
        try:
            updated = spec.toxic.updated(_lookup(obj, "attributes"))
        except ValueError as exc:
            raise ApiError(f"bad request body: {exc}", 400) from None
        proxy.update_toxic(toxic, updated, toxicity)
        return _json(200, spec.to_json())

    async def _toxic_delete(self, name: str, toxic: str) -> Response:
        self.collection.get(name).remove_toxic(toxic)
        return _no_content()


class ToxiproxyServer:
    """The API server and its proxies in the running event loop.

    ``await server.start()`` listens (PortInUseError when the port is taken; port 0 picks
    one); ``await server.close()`` stops the API and closes every proxy and connection.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        *,
        rng: random.Random | None = None,
    ) -> None:
        self.host = host
        self.requested_port = port
        self.api = ToxiproxyApi(ProxyCollection(rng))
        self._server: asyncio.Server | None = None
        self._registry = ConnectionRegistry()

    @property
    def collection(self) -> ProxyCollection:
        return self.api.collection

    @property
    def port(self) -> int:
        assert self._server is not None, "not started"
        return server_port(self._server)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        self._server = await start_server(
            self.api.handle, self.host, self.requested_port, registry=self._registry
        )

    async def populate(self, proxies: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Create or replace proxies as ``POST /populate`` does; ApiError on failure."""
        request = Request("POST", "/populate", body=json.dumps(proxies).encode())
        response = await self.api.handle(request)
        body = json.loads(response.body)
        if response.status != 201:
            raise ApiError(body.get("error", "populate failed"), response.status)
        return list(body["proxies"])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self._registry.close_all()
        self.collection.clear()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None


class ConfigError(Exception):
    """The ``--config`` file could not be read or applied."""


async def _serve(host: str, port: int, config: Path | None, seed: int | None) -> None:
    server = ToxiproxyServer(host, port, rng=random.Random(seed))
    await server.start()
    try:
        if config is not None:
            try:
                await server.populate(json.loads(config.read_text()))
            except (ApiError, OSError, ValueError) as exc:
                raise ConfigError(f"config {config}: {exc}") from exc
        with stop_on_signals() as stop:
            print(f"toxiproxy listening on {server.url}", flush=True)
            await stop.wait()
    finally:
        await server.close()


def serve(
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    *,
    config: Path | None = None,
    seed: int | None = None,
) -> int:
    """Run the Toxiproxy-compatible server in the foreground until SIGTERM/SIGINT.

    Prints ``toxiproxy listening on http://HOST:PORT`` when ready. ``config``: a JSON array of
    proxies to populate at start (Toxiproxy's ``-config``). Returns the exit code: 0 on a clean
    stop (every proxy closed), 2 when the port is taken or the config is unusable.
    """
    try:
        asyncio.run(_serve(host, port, config, seed))
    except PortInUseError as exc:
        print(f"toxiproxy: {exc}", file=sys.stderr, flush=True)
        return 2
    except ConfigError as exc:
        print(f"toxiproxy: {exc}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


class _ProxyBytes(Collector):
    """The proxies' byte counters, read when scraped (plain ints kept on the event loop)."""

    def __init__(self, collection: ProxyCollection) -> None:
        self.collection = collection

    def collect(self) -> Iterator[Metric]:
        labels = ["direction", "listener", "proxy", "upstream"]
        for name, attribute, what in (
            ("toxiproxy_proxy_received_bytes", "received_bytes", "received"),
            ("toxiproxy_proxy_sent_bytes", "sent_bytes", "sent"),
        ):
            family = CounterMetricFamily(
                name, f"The number of bytes {what} on a proxy link", labels=labels
            )
            for proxy in sorted(self.collection.proxies.values(), key=lambda p: p.name):
                for direction, count in getattr(proxy, attribute).items():
                    family.add_metric([direction, proxy.listen, proxy.name, proxy.upstream], count)
            yield family
