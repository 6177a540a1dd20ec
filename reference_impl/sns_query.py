"""A lean SNS Publish for the push path, beside boto3 for everything else.

Why by hand, as for the JSON calls (:mod:`reference_impl.aws_json`): through boto3, one Publish
cost the push consumer about 0.85 ms of CPU more per delivery than the direct HTTP/2 send
(``benchmarks/bench_locust.py``, README "The reference implementation"), botocore's generic
serialising, signing and parsing. SNS speaks the AWS query protocol: the request is the
operation's parameters form-encoded (``Action=Publish&Version=2010-03-31&...``, maps as
``Name.entry.N.key`` / ``.value``), the answer XML. Publish needs one small serialiser and two
regular expressions over the answer, signed with the same SigV4 code as the JSON calls (no
``x-amz-target``: the query protocol has none).

What it keeps of boto3's behaviour: the boto3 client's endpoint, region and credentials; the
answer ``{"MessageId": ...}``; errors as ``botocore.exceptions.ClientError`` with SNS's code,
message, HTTP status and the answer's headers (``Retry-After``), a connection failure as
``EndpointConnectionError``. No retries: the push consumer turns them off (the queue retries).
"""

from __future__ import annotations

import html
import http.client
import re
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

from botocore.exceptions import ClientError, EndpointConnectionError

from reference_impl.aws_json import JsonCaller

API_VERSION = "2010-03-31"
FORM_CONTENT_TYPE = "application/x-www-form-urlencoded; charset=utf-8"
_MESSAGE_ID = re.compile(rb"<MessageId>([^<]*)</MessageId>")
_CODE = re.compile(rb"<Code>([^<]*)</Code>")
_MESSAGE = re.compile(rb"<Message>([^<]*)</Message>")


def _encode(value: str) -> str:
    return quote(value, safe="-_.~")


def publish_body(params: Mapping[str, Any]) -> bytes:
    """Publish's parameters as the query protocol's form body (botocore's serialisation:
    scalars by name, ``MessageAttributes`` as numbered entries with ``Name`` and ``Value``)."""
    fields: list[tuple[str, str]] = [("Action", "Publish"), ("Version", API_VERSION)]
    for name, value in params.items():
        if name == "MessageAttributes":
            for n, (key, attribute) in enumerate(value.items(), start=1):
                prefix = f"MessageAttributes.entry.{n}"
                fields.append((f"{prefix}.Name", key))
                for part, text in attribute.items():
                    fields.append((f"{prefix}.Value.{part}", str(text)))
        else:
            fields.append((name, str(value)))
    return "&".join(f"{_encode(k)}={_encode(v)}" for k, v in fields).encode()


def _text(pattern: re.Pattern[bytes], data: bytes) -> str:
    found = pattern.search(data)
    return html.unescape(found.group(1).decode("utf-8", "replace")) if found else ""


class LeanPublisher(JsonCaller):
    """``publish(**params)`` over one kept-alive connection per thread, one attempt."""

    def __init__(
        self,
        endpoint_url: str,
        region: str,
        credentials: Callable[[], Any],
        *,
        connect_timeout: float,
        read_timeout: float,
    ) -> None:
        super().__init__(
            endpoint_url,
            region,
            "sns",
            "",
            credentials,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            max_attempts=1,
        )

    def publish(self, **params: Any) -> dict[str, Any]:
        try:
            status, headers, data = self._signed_post(publish_body(params), None, FORM_CONTENT_TYPE)
        except (OSError, http.client.HTTPException) as exc:
            self._drop_connection()
            raise EndpointConnectionError(endpoint_url=self.endpoint_url, error=exc) from exc
        metadata = {"HTTPStatusCode": status, "HTTPHeaders": headers}
        if status < 300:
            return {"MessageId": _text(_MESSAGE_ID, data), "ResponseMetadata": metadata}
        raise ClientError(
            {
                "Error": {
                    "Code": _text(_CODE, data) or f"HTTP{status}",
                    "Message": _text(_MESSAGE, data),
                },
                "ResponseMetadata": metadata,
            },
            "Publish",
        )
