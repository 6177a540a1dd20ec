"""The SNS endpoint's outbound transports: APNs and FCM over HTTP/2, SQS for topic deliveries.

Connections persist: each provider origin has an :class:`emulators.h2_client.H2Pool` (a few
HTTP/2 connections, many streams each), opened on first use, so a publish costs one stream and
no connection setup. ``https://`` URLs use TLS (the CA file given, ALPN h2); ``http://`` ones
h2c with prior knowledge, which both simulators speak.

FCM's OAuth2 access token comes from the token endpoint of the FCM URL (``<fcm-url>/token``,
which the FCM simulator serves; never the ``token_uri`` in a credential, which would be
Google's): a JWT-bearer grant signed with the service account's key, cached until a minute
before it expires, fetched once for all publishes waiting on it, and fetched again once when
FCM answers 401. A token endpoint that answers 404 is taken as absent: sends then go without
``Authorization`` (the simulator accepts that).

SQS deliveries (topic subscriptions) are ``SendMessage`` calls in the AWS JSON 1.0 protocol to
the configured SQS endpoint, the queue URL built from the subscription's queue ARN, signed with
SigV4 for the queue's region (:mod:`emulators.sns.sigv4`). HTTP/S deliveries are
:mod:`emulators.sns.http_delivery`'s.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

import httpx

from emulators.h2_client import H2ClientError, H2Pool
from emulators.sns import sigv4
from emulators.sns.common import SqsTarget
from emulators.sns.credentials import FcmCredential
from emulators.sns.messages import ProviderRequest

JWT_BEARER_GRANT = "urn:ietf:params:oauth:grant-type:jwt-bearer"
TOKEN_MARGIN = 60.0


class TransportError(Exception):
    """No answer from the provider (refused, reset, timed out, TLS failure)."""


@dataclass
class ProviderAnswer:
    status: int
    headers: dict[str, str]
    body: bytes


def client_tls(ca_file: str | None) -> ssl.SSLContext:
    context = (
        ssl.create_default_context(cafile=ca_file) if ca_file else ssl.create_default_context()
    )
    context.set_alpn_protocols(["h2"])
    return context


class _Origin:
    """One provider base URL: its pool and the path prefix to put before request paths."""

    def __init__(self, url: str, ca_file: str | None, connections: int) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.prefix = parts.path.rstrip("/")
        tls = client_tls(ca_file) if parts.scheme == "https" else None
        self.pool = H2Pool(
            f"{parts.scheme}://{parts.netloc}", ssl_context=tls, connections=connections
        )

    async def request(
        self, method: str, path: str, headers: dict[str, str], body: bytes, timeout: float
    ) -> ProviderAnswer:
        try:
            answer = await self.pool.request(
                method, self.prefix + path, headers, body, timeout=timeout
            )
        except (H2ClientError, OSError, TimeoutError, ssl.SSLError) as exc:
            raise TransportError(f"{type(exc).__name__}: {exc}") from exc
        return ProviderAnswer(answer.status, answer.headers, answer.body)

    def close(self) -> None:
        self.pool.close()


class ApnsTransport:
    """APNs (``/3/device/<token>``): production and sandbox may be different URLs."""

    def __init__(
        self,
        url: str | None,
        sandbox_url: str | None = None,
        ca_file: str | None = None,
        *,
        connections: int = 2,
        timeout: float = 10.0,
    ) -> None:
        self.urls = {"APNS": url, "APNS_SANDBOX": sandbox_url or url}
        self.ca_file = ca_file
        self.connections = connections
        self.timeout = timeout
        self._origins: dict[str, _Origin] = {}

    def configured(self, platform: str) -> bool:
        return bool(self.urls.get(platform))

    async def send(
        self, platform: str, request: ProviderRequest, group: str = ""
    ) -> ProviderAnswer:
        """``group``: whose credentials the request carries; each group has its own
        connections, as Apple ties a connection to one provider token."""
        url = self.urls.get(platform)
        if not url:
            raise TransportError(f"no APNs URL configured for {platform}")
        origin = self._origins.get(f"{url} {group}")
        if origin is None:
            origin = _Origin(url, self.ca_file, self.connections)
            self._origins[f"{url} {group}"] = origin
        return await origin.request(
            "POST", request.path, request.headers, request.body, self.timeout
        )

    @property
    def connections_opened(self) -> int:
        return sum(origin.pool.opened for origin in self._origins.values())

    def close(self) -> None:
        for origin in self._origins.values():
            origin.close()
        self._origins.clear()


class FcmTransport:
    """FCM HTTP v1, with access tokens from the simulator's token endpoint."""

    def __init__(
        self,
        url: str | None,
        ca_file: str | None = None,
        *,
        connections: int = 2,
        timeout: float = 10.0,
    ) -> None:
        self.url = url.rstrip("/") if url else None
        self.origin = _Origin(self.url, ca_file, connections) if self.url else None
        self.timeout = timeout
        self.token_url = f"{self.url}/token" if self.url else ""
        self.no_token_endpoint = False
        self._tokens: dict[str, tuple[str, float]] = {}  # client_email -> (token, expires)
        self._fetching: dict[str, asyncio.Future[str | None]] = {}
        self.tokens_fetched = 0

    def configured(self) -> bool:
        return self.origin is not None

    async def send(self, credential: FcmCredential, request: ProviderRequest) -> ProviderAnswer:
        if self.origin is None:
            raise TransportError("no FCM URL configured")
        answer: ProviderAnswer | None = None
        for attempt in range(2):
            token = await self.access_token(credential, refresh=attempt == 1)
            headers = dict(request.headers)
            if token:
                headers["authorization"] = f"Bearer {token}"
            answer = await self.origin.request(
                "POST", request.path, headers, request.body, self.timeout
            )
            if answer.status != 401 or not token:
                return answer
        assert answer is not None
        return answer

    async def access_token(self, credential: FcmCredential, refresh: bool = False) -> str | None:
        if self.no_token_endpoint:
            return None
        key = credential.client_email
        cached = self._tokens.get(key)
        if cached is not None and not refresh and cached[1] > time.monotonic():
            return cached[0]
        waiting = self._fetching.get(key)
        if waiting is not None:
            return await waiting
        future: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        self._fetching[key] = future
        try:
            token = await self._fetch_token(credential)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved here: waiters, if any, get it too
            raise
        else:
            future.set_result(token)
            return token
        finally:
            del self._fetching[key]

    async def _fetch_token(self, credential: FcmCredential) -> str | None:
        assert self.origin is not None
        body = urlencode(
            {"grant_type": JWT_BEARER_GRANT, "assertion": credential.assertion(self.token_url)}
        ).encode()
        answer = await self.origin.request(
            "POST",
            "/token",
            {"content-type": "application/x-www-form-urlencoded"},
            body,
            self.timeout,
        )
        if answer.status == 404:
            self.no_token_endpoint = True
            return None
        try:
            grant = json.loads(answer.body)
            token = str(grant["access_token"])
            lifetime = float(grant.get("expires_in", 3600))
        except (ValueError, KeyError, TypeError):
            raise TransportError(
                f"token endpoint answered {answer.status}: {answer.body[:200]!r}"
            ) from None
        if answer.status != 200:
            raise TransportError(f"token endpoint answered {answer.status}")
        self.tokens_fetched += 1
        self._tokens[credential.client_email] = (
            token,
            time.monotonic() + max(0.0, lifetime - TOKEN_MARGIN),
        )
        return token

    @property
    def connections_opened(self) -> int:
        return self.origin.pool.opened if self.origin is not None else 0

    def close(self) -> None:
        if self.origin is not None:
            self.origin.close()


class SqsTransport:
    """``SendMessage`` to the SQS endpoint (HTTP/1.1 keep-alive: low volume, any SQS)."""

    def __init__(self, url: str | None, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/") if url else None
        self._http = httpx.AsyncClient(timeout=timeout) if self.url else None

    def configured(self) -> bool:
        return self._http is not None

    def queue_url(self, target: SqsTarget) -> str:
        return f"{self.url}/{target.account}/{target.queue}"

    async def send_message(
        self,
        target: SqsTarget,
        body: str,
        attributes: dict[str, Any] | None = None,
        *,
        group_id: str | None = None,
        deduplication_id: str | None = None,
    ) -> str:
        """The new message's id; TransportError when the queue did not take it."""
        if self._http is None or self.url is None:
            raise TransportError("no SQS URL configured")
        payload: dict[str, Any] = {"QueueUrl": self.queue_url(target), "MessageBody": body}
        if attributes:
            payload["MessageAttributes"] = attributes
        if group_id is not None:
            payload["MessageGroupId"] = group_id
        if deduplication_id is not None:
            payload["MessageDeduplicationId"] = deduplication_id
        content = json.dumps(payload).encode()
        headers = sigv4.sign(
            "POST",
            self.url + "/",
            {
                "content-type": "application/x-amz-json-1.0",
                "x-amz-target": "AmazonSQS.SendMessage",
            },
            content,
            target.region,
        )
        headers.pop("host")  # httpx sets the same one
        try:
            response = await self._http.post(self.url + "/", content=content, headers=headers)
        except httpx.HTTPError as exc:
            raise TransportError(f"{type(exc).__name__}: {exc}") from exc
        if response.status_code != 200:
            raise TransportError(f"SendMessage answered {response.status_code}: {response.text}")
        return str(response.json().get("MessageId", ""))

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()
