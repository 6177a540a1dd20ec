"""A small typed client for the Toxiproxy 2.x API (ours or the real one).

``toxiproxy-python`` 0.1.1 works against our server unchanged, but the chaos layer needs what it
lacks: one client per server (its host and port are class attributes shared by the whole
process), updating a toxic's attributes or toxicity on live connections (to ramp latency or
toxicity without a gap), reading one proxy or toxic, and the server-side ``/populate``.

Proxy updates use ``PATCH`` (Toxiproxy >= 2.6) and fall back to ``POST`` on a 405 from older
servers.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx


class ToxiproxyError(Exception):
    """An API error: ``status`` and Toxiproxy's message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


class NotFound(ToxiproxyError):
    """404: proxy not found / toxic not found."""


class AlreadyExists(ToxiproxyError):
    """409: proxy already exists / toxic already exists."""


class BadRequest(ToxiproxyError):
    """400: missing field, bad stream, bad toxic type or attributes."""


@dataclass(frozen=True)
class Toxic:
    name: str
    type: str
    stream: str
    toxicity: float
    attributes: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Toxic:
        return cls(
            name=obj["name"],
            type=obj["type"],
            stream=obj["stream"],
            toxicity=float(obj["toxicity"]),
            attributes=dict(obj.get("attributes") or {}),
        )


@dataclass(frozen=True)
class Proxy:
    name: str
    listen: str
    upstream: str
    enabled: bool
    toxics: tuple[Toxic, ...] = ()

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Proxy:
        return cls(
            name=obj["name"],
            listen=obj["listen"],
            upstream=obj["upstream"],
            enabled=bool(obj["enabled"]),
            toxics=tuple(Toxic.from_json(t) for t in obj.get("toxics") or ()),
        )

    @property
    def host(self) -> str:
        return self.listen.rsplit(":", 1)[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.listen.rsplit(":", 1)[1])


_ERRORS: dict[int, type[ToxiproxyError]] = {404: NotFound, 409: AlreadyExists, 400: BadRequest}


class ToxiproxyClient:
    """``ToxiproxyClient("http://127.0.0.1:8474")``; use as a context manager or ``close()``."""

    def __init__(self, url: str = "http://127.0.0.1:8474", *, timeout: float = 10.0) -> None:
        self.http = httpx.Client(
            base_url=url, timeout=timeout, headers={"user-agent": "chaos-toxiproxy-client"}
        )
        self._update_method = "PATCH"

    def __enter__(self) -> ToxiproxyClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        response = self.http.request(method, path, json=body)
        if response.status_code >= 400:
            try:
                message = response.json().get("error", response.text)
            except ValueError:
                message = response.text.strip()
            raise _ERRORS.get(response.status_code, ToxiproxyError)(response.status_code, message)
        if response.status_code == 204 or not response.content:
            return None
        return response.json()

    def _update(self, path: str, body: dict[str, Any]) -> Any:
        try:
            return self._call(self._update_method, path, body)
        except ToxiproxyError as exc:
            if exc.status != 405 or self._update_method == "POST":
                raise
            self._update_method = "POST"  # Toxiproxy < 2.6 has no PATCH
            return self._call("POST", path, body)

    # -- server -----------------------------------------------------------------------------------
    def version(self) -> str:
        return str(self._call("GET", "/version")["version"])

    def reset(self) -> None:
        """Enable every proxy and remove every toxic."""
        self._call("POST", "/reset")

    def populate(self, proxies: list[dict[str, Any]]) -> list[Proxy]:
        """Create or replace proxies (``{"name","listen","upstream","enabled"?}`` each)."""
        return [Proxy.from_json(p) for p in self._call("POST", "/populate", proxies)["proxies"]]

    # -- proxies ----------------------------------------------------------------------------------
    def proxies(self) -> dict[str, Proxy]:
        return {name: Proxy.from_json(p) for name, p in self._call("GET", "/proxies").items()}

    def proxy(self, name: str) -> Proxy:
        return Proxy.from_json(self._call("GET", f"/proxies/{name}"))

    def create_proxy(
        self, name: str, upstream: str, listen: str = "127.0.0.1:0", *, enabled: bool = True
    ) -> Proxy:
        body = {"name": name, "upstream": upstream, "listen": listen, "enabled": enabled}
        return Proxy.from_json(self._call("POST", "/proxies", body))

    def update_proxy(
        self,
        name: str,
        *,
        enabled: bool | None = None,
        listen: str | None = None,
        upstream: str | None = None,
    ) -> Proxy:
        body = {
            k: v
            for k, v in (("enabled", enabled), ("listen", listen), ("upstream", upstream))
            if v is not None
        }
        return Proxy.from_json(self._update(f"/proxies/{name}", body))

    def enable(self, name: str) -> Proxy:
        return self.update_proxy(name, enabled=True)

    def disable(self, name: str) -> Proxy:
        """Close the listener and every open connection: new connections are refused."""
        return self.update_proxy(name, enabled=False)

    def delete_proxy(self, name: str) -> None:
        self._call("DELETE", f"/proxies/{name}")

    @contextmanager
    def outage(self, name: str) -> Iterator[Proxy]:
        """The proxy is disabled inside the block and enabled again after it."""
        proxy = self.disable(name)
        try:
            yield proxy
        finally:
            self.enable(name)

    # -- toxics -----------------------------------------------------------------------------------
    def toxics(self, proxy: str) -> list[Toxic]:
        return [Toxic.from_json(t) for t in self._call("GET", f"/proxies/{proxy}/toxics")]

    def toxic(self, proxy: str, name: str) -> Toxic:
        return Toxic.from_json(self._call("GET", f"/proxies/{proxy}/toxics/{name}"))

    def add_toxic(
        self,
        proxy: str,
        type: str,
        attributes: dict[str, int] | None = None,
        *,
        stream: str = "downstream",
        name: str | None = None,
        toxicity: float = 1.0,
    ) -> Toxic:
        body: dict[str, Any] = {
            "type": type,
            "stream": stream,
            "toxicity": toxicity,
            "attributes": attributes or {},
        }
        if name:
            body["name"] = name
        return Toxic.from_json(self._call("POST", f"/proxies/{proxy}/toxics", body))

    def update_toxic(
        self,
        proxy: str,
        name: str,
        attributes: dict[str, int] | None = None,
        *,
        toxicity: float | None = None,
    ) -> Toxic:
        """Change attributes (merged) and/or toxicity; live connections apply it at once."""
        body: dict[str, Any] = {}
        if attributes:
            body["attributes"] = attributes
        if toxicity is not None:
            body["toxicity"] = toxicity
        return Toxic.from_json(self._update(f"/proxies/{proxy}/toxics/{name}", body))

    def remove_toxic(self, proxy: str, name: str) -> None:
        self._call("DELETE", f"/proxies/{proxy}/toxics/{name}")

    @contextmanager
    def toxic_applied(
        self,
        proxy: str,
        type: str,
        attributes: dict[str, int] | None = None,
        *,
        stream: str = "downstream",
        name: str | None = None,
        toxicity: float = 1.0,
    ) -> Iterator[Toxic]:
        """The toxic is on inside the block and removed after it."""
        toxic = self.add_toxic(proxy, type, attributes, stream=stream, name=name, toxicity=toxicity)
        try:
            yield toxic
        finally:
            try:
                self.remove_toxic(proxy, toxic.name)
            except NotFound:
                pass
