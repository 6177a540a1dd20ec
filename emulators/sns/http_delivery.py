"""HTTP/S subscriptions: SNS's POSTs, to loopback endpoints only.

What an endpoint gets is what SNS sends (AWS's "HTTP/HTTPS headers" reference): a ``POST`` with
``Content-Type: text/plain; charset=UTF-8`` (or the subscription delivery policy's
``requestPolicy.headerContentType``), ``User-Agent: Amazon Simple Notification Service Agent``,
``x-amz-sns-message-type``, ``x-amz-sns-message-id``, ``x-amz-sns-topic-arn``, for notifications
``x-amz-sns-subscription-arn``, and ``x-amz-sns-rawdelivery: true`` for a raw one; the body is the
JSON document (or the raw message). A 2xx answer is a delivery; anything else, or no answer,
is a failure the caller may retry.

Our rule, not AWS's: load and fault traffic goes to loopback only. A subscription may name any
URL (Subscribe accepts it, as AWS does), but nothing is ever sent to a host other than
``127.0.0.1``, ``::1`` or ``localhost``: :func:`refusal` says why, the delivery is recorded as
refused and never retried, and the subscription stays pending (nobody received its token).
"""

from __future__ import annotations

import ssl
from urllib.parse import urlsplit

import httpx

from emulators.sns.delivery import TransportError

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})
USER_AGENT = "Amazon Simple Notification Service Agent"
CONTENT_TYPE = "text/plain; charset=UTF-8"


class Refused(TransportError):
    """Not sent: the URL is not a loopback one (never retried)."""


def refusal(url: str) -> str | None:
    """Why ``url`` may not be delivered to, or None when it may."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:
        return f"refused: {url!r} is not a URL"
    if parts.scheme not in ("http", "https") or not host:
        return f"refused: {url!r} is not an http(s) URL"
    if host.lower() not in LOOPBACK_HOSTS:
        return (
            f"refused: {host} is not a loopback host; this SNS endpoint delivers HTTP/S only to "
            "127.0.0.1, ::1 and localhost (load and fault traffic never leaves the machine)"
        )
    return None


def headers_for(
    kind: str,
    message_id: str,
    topic_arn: str,
    subscription_arn: str | None = None,
    raw: bool = False,
    content_type: str | None = None,
) -> dict[str, str]:
    headers = {
        "content-type": content_type or CONTENT_TYPE,
        "user-agent": USER_AGENT,
        "x-amz-sns-message-type": kind,
        "x-amz-sns-message-id": message_id,
        "x-amz-sns-topic-arn": topic_arn,
    }
    if subscription_arn is not None:
        headers["x-amz-sns-subscription-arn"] = subscription_arn
    if raw:
        headers["x-amz-sns-rawdelivery"] = "true"
    return headers


class HttpTransport:
    """POSTs to HTTP/S subscriptions (HTTP/1.1 keep-alive; ``ca_file`` to trust for https)."""

    def __init__(self, timeout: float = 15.0, ca_file: str | None = None) -> None:
        verify: ssl.SSLContext | bool = (
            ssl.create_default_context(cafile=ca_file) if ca_file else True
        )
        self._http = httpx.AsyncClient(timeout=timeout, verify=verify, follow_redirects=False)

    async def post(self, url: str, body: str, headers: dict[str, str]) -> int:
        """The endpoint's status; Refused for a non-loopback URL, TransportError for no answer."""
        why = refusal(url)
        if why is not None:
            raise Refused(why)
        try:
            response = await self._http.post(url, content=body.encode("utf-8"), headers=headers)
        except httpx.HTTPError as exc:
            raise TransportError(f"{type(exc).__name__}: {exc}") from exc
        return response.status_code

    async def close(self) -> None:
        await self._http.aclose()
