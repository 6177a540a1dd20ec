"""A lean client for the few AWS calls on the delivery path, beside boto3 for everything else.

Why by hand: botocore is generic. Each call walks its event hooks, the service model's shapes
(to serialise and to parse), builds an AWSRequest, signs it through a chain of objects and goes
through urllib3's pool: about 0.75 ms of CPU per call on this machine, where the work itself (a
JSON body, a SigV4 signature, one HTTP exchange on a kept-alive connection) takes a fraction of
that. A py-spy profile of the push consumer put 45% of its CPU inside botocore; the fan-out
worker's 75%. The hot calls here (SQS ReceiveMessage, DeleteMessageBatch, SendMessageBatch,
ChangeMessageVisibility, SendMessage; DynamoDB BatchGetItem, GetItem, PutItem) all speak the
AWS JSON 1.0 protocol, whose request is the operation's parameters as JSON and whose answer is
its result as JSON, so they need none of that machinery.

:class:`LeanClient` wraps a boto3 client: the named operations go through :class:`JsonCaller`,
every other attribute (other operations, ``meta``, ``exceptions``) is the boto3 client's. What
it keeps of botocore's behaviour:

* the same endpoint, region, signing name and credentials as the boto3 client (its resolved
  ``endpoint_url``, and the session's credentials, refreshed when they are temporary), signed
  with SigV4 exactly as botocore signs (checked against ``botocore.auth.SigV4Auth`` in the
  tests), so it works against real AWS;
* the same answers: the result dicts boto3 returns (DynamoDB binary values as ``bytes``), and
  errors as ``botocore.exceptions.ClientError`` with the service's error code, connection
  failures as ``botocore.exceptions.EndpointConnectionError`` (a ``BotoCoreError``);
* the same retries as the clients' standard mode: connection errors, 5xx answers and throttling
  codes are tried again, up to ``max_attempts`` attempts, with jittered exponential backoff.

What it drops: client-side parameter validation (the service validates; the boto3 clients here
run with ``parameter_validation=False`` already) and SQS's client-side MD5 check of received
bodies (the transport is TCP; a body changed in flight fails the job's own parsing).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.client
import json
import random
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlsplit

from botocore.exceptions import ClientError, EndpointConnectionError

# Codes the standard retry mode treats as throttling or transient (botocore/retries/standard.py).
RETRYABLE_CODES = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottledException",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "TransactionInProgressException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "LimitExceededException",
        "RequestThrottled",
        "SlowDown",
        "PriorRequestNotComplete",
        "EC2ThrottledException",
        "RequestTimeout",
        "RequestTimeoutException",
        "InternalError",
        "ServiceUnavailable",
    }
)
MAX_BACKOFF_SECONDS = 20.0
JSON_CONTENT_TYPE = "application/x-amz-json-1.0"

# Operations the delivery path calls often enough for their CPU to matter.
HOT_OPERATIONS = {
    "sqs": (
        "ReceiveMessage",
        "DeleteMessageBatch",
        "SendMessageBatch",
        "SendMessage",
        "ChangeMessageVisibility",
    ),
    "dynamodb": ("BatchGetItem", "GetItem", "PutItem"),
}


def python_name(operation: str) -> str:
    """``BatchGetItem`` -> ``batch_get_item``: boto3's method name of an operation."""
    out = []
    for i, ch in enumerate(operation):
        if ch.isupper() and i and not operation[i - 1].isupper():
            out.append("_")
        out.append(ch.lower())
    return "".join(out)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def sigv4_headers(
    *,
    host: str,
    path: str,
    body: bytes,
    target: str | None,
    content_type: str,
    region: str,
    service: str,
    access_key: str,
    secret_key: str,
    token: str | None,
    amz_date: str,
    signing_key: bytes | None = None,
) -> dict[str, str]:
    """The headers of a signed JSON-protocol POST (SigV4, signing content-type, host,
    x-amz-date, x-amz-security-token when there is one, and x-amz-target; ``target`` None: a
    query-protocol POST, which has none). ``signing_key``: the day's derived key, when the
    caller keeps it (:func:`signing_key`)."""
    headers = {
        "content-type": content_type,
        "host": host,
        "x-amz-date": amz_date,
    }
    if target is not None:
        headers["x-amz-target"] = target
    if token:
        headers["x-amz-security-token"] = token
    names = sorted(headers)
    canonical_headers = "".join(f"{name}:{headers[name]}\n" for name in names)
    signed = ";".join(names)
    canonical = f"POST\n{path}\n\n{canonical_headers}\n{signed}\n{_sha256(body)}"
    scope = f"{amz_date[:8]}/{region}/{service}/aws4_request"
    to_sign = f"AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{_sha256(canonical.encode())}"
    key = signing_key or derive_signing_key(secret_key, amz_date[:8], region, service)
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, "
        f"SignedHeaders={signed}, Signature={signature}"
    )
    return headers


def derive_signing_key(secret_key: str, day: str, region: str, service: str) -> bytes:
    key = _hmac(f"AWS4{secret_key}".encode(), day)
    return _hmac(_hmac(_hmac(key, region), service), "aws4_request")


def _encode_default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):  # a blob (DynamoDB "B"): base64 on the wire
        return base64.b64encode(value).decode()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def decode_dynamodb_binary(value: Any) -> Any:
    """An answer's DynamoDB attribute values with ``B`` / ``BS`` as ``bytes``, as botocore
    parses them (the wire has base64), in place; other values pass through."""
    if isinstance(value, dict):
        for key, inner in value.items():
            if key == "B" and isinstance(inner, str):
                value[key] = base64.b64decode(inner)
            elif key == "BS" and isinstance(inner, list):
                value[key] = [base64.b64decode(v) for v in inner]
            else:
                decode_dynamodb_binary(inner)
    elif isinstance(value, list):
        for inner in value:
            decode_dynamodb_binary(inner)
    return value


def error_code(body: dict[str, Any], headers: dict[str, str]) -> str:
    """A JSON-protocol error's code: ``__type`` (after its ``#``) or the x-amzn-ErrorType
    header (before its ``:``)."""
    raw = body.get("__type") or headers.get("x-amzn-errortype") or "Unknown"
    return str(raw).rsplit("#", 1)[-1].split(":", 1)[0]


class JsonCaller:
    """Signed AWS JSON 1.0 calls to one endpoint, one kept-alive connection per thread."""

    def __init__(
        self,
        endpoint_url: str,
        region: str,
        service: str,
        target_prefix: str,
        credentials: Callable[[], Any],
        *,
        connect_timeout: float = 60.0,
        read_timeout: float = 60.0,
        max_attempts: int = 3,
        decode: Callable[[Any], Any] | None = None,
    ) -> None:
        """``credentials``: returns an object with ``access_key``, ``secret_key``, ``token``
        (botocore's frozen credentials); ``decode``: applied to every answer in place."""
        parts = urlsplit(endpoint_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) endpoint: {endpoint_url!r}")
        self.endpoint_url = endpoint_url
        self.tls = parts.scheme == "https"
        self.hostname = parts.hostname
        self.port = parts.port or (443 if self.tls else 80)
        default = self.port == (443 if self.tls else 80)
        self.host = self.hostname if default else f"{self.hostname}:{self.port}"
        self.path = parts.path or "/"
        self.region = region
        self.service = service
        self.target_prefix = target_prefix
        self.credentials = credentials
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.max_attempts = max(1, max_attempts)
        self.decode = decode
        self._local = threading.local()
        self._keys: dict[tuple[str, str], bytes] = {}

    def _connection(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            kind = http.client.HTTPSConnection if self.tls else http.client.HTTPConnection
            conn = kind(self.hostname, self.port, timeout=self.connect_timeout)
            self._local.conn = conn
        return conn

    def _drop_connection(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
        self._local.conn = None

    def _signing_key(self, secret: str, day: str) -> bytes:
        key = self._keys.get((secret, day))
        if key is None:
            key = derive_signing_key(secret, day, self.region, self.service)
            self._keys = {(secret, day): key}  # one day's key at a time
        return key

    def _signed_post(
        self, body: bytes, target: str | None, content_type: str
    ) -> tuple[int, dict[str, str], bytes]:
        """One signed POST on this thread's kept-alive connection: status, lower-cased headers,
        body. ``target``: the JSON protocol's x-amz-target, None for the query protocol."""
        creds = self.credentials()
        amz_date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        headers = sigv4_headers(
            host=self.host,
            path=self.path,
            body=body,
            target=target,
            content_type=content_type,
            region=self.region,
            service=self.service,
            access_key=creds.access_key,
            secret_key=creds.secret_key,
            token=creds.token,
            amz_date=amz_date,
            signing_key=self._signing_key(creds.secret_key, amz_date[:8]),
        )
        conn = self._connection()
        conn.timeout = self.read_timeout
        if conn.sock is not None:
            conn.sock.settimeout(self.read_timeout)
        conn.request("POST", self.path, body=body, headers=headers)
        response = conn.getresponse()
        data = response.read()
        answer_headers = {k.lower(): v for k, v in response.getheaders()}
        if response.will_close:
            self._drop_connection()
        return response.status, answer_headers, data

    def call(self, operation: str, params: dict[str, Any]) -> dict[str, Any]:
        """The operation's result, as boto3 returns it; raises ClientError for the service's
        errors and EndpointConnectionError when no answer came, after the retries."""
        body = json.dumps(params, separators=(",", ":"), default=_encode_default).encode()
        for attempt in range(1, self.max_attempts + 1):
            try:
                status, headers, data = self._signed_post(
                    body, f"{self.target_prefix}.{operation}", JSON_CONTENT_TYPE
                )
            except (OSError, http.client.HTTPException) as exc:
                self._drop_connection()
                if attempt == self.max_attempts:
                    raise EndpointConnectionError(
                        endpoint_url=self.endpoint_url, error=exc
                    ) from exc
                self._backoff(attempt)
                continue
            try:
                answer = json.loads(data) if data else {}
            except ValueError:
                answer = {"__type": "InvalidResponse", "message": data[:200].decode("replace")}
            if status < 300:
                answer = answer if isinstance(answer, dict) else {}
                if self.decode is not None:
                    self.decode(answer)
                answer["ResponseMetadata"] = {"HTTPStatusCode": status}
                return answer
            answer = answer if isinstance(answer, dict) else {}
            code = error_code(answer, headers)
            retryable = status >= 500 or code in RETRYABLE_CODES
            if retryable and attempt < self.max_attempts:
                self._backoff(attempt)
                continue
            message = answer.get("message") or answer.get("Message") or ""
            raise ClientError(
                {
                    "Error": {"Code": code, "Message": str(message)},
                    "ResponseMetadata": {"HTTPStatusCode": status},
                },
                operation,
            )
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    @staticmethod
    def _backoff(attempt: int) -> None:
        # Standard mode's delay: a random fraction of 2^attempt seconds, capped.
        time.sleep(min(MAX_BACKOFF_SECONDS, random.random() * 2**attempt))


class LeanClient:
    """A boto3 client whose ``operations`` go through a :class:`JsonCaller`; every other
    attribute is the boto3 client's."""

    def __init__(self, boto_client: Any, caller: JsonCaller, operations: Iterable[str]) -> None:
        self._boto = boto_client
        self._caller = caller
        for operation in operations:
            setattr(self, python_name(operation), self._method(operation))

    def _method(self, operation: str) -> Callable[..., dict[str, Any]]:
        caller = self._caller

        def call(**params: Any) -> dict[str, Any]:
            return caller.call(operation, params)

        call.__name__ = python_name(operation)
        return call

    def __getattr__(self, name: str) -> Any:
        return getattr(self._boto, name)


def lean(boto_client: Any, service: str, credentials: Callable[[], Any]) -> Any:
    """``boto_client`` with its hot operations (:data:`HOT_OPERATIONS`) made lean; a client of
    another service, or of a protocol other than JSON 1.0, is returned as it is."""
    model = boto_client.meta.service_model
    operations = HOT_OPERATIONS.get(service)
    if not operations or model.protocol != "json" or model.metadata.get("jsonVersion") != "1.0":
        return boto_client
    config = boto_client.meta.config
    # botocore's retries.max_attempts counts the retries; the first attempt comes on top.
    retries = (config.retries or {}).get("max_attempts")
    caller = JsonCaller(
        boto_client.meta.endpoint_url,
        boto_client.meta.region_name,
        model.signing_name,
        model.metadata["targetPrefix"],
        credentials,
        connect_timeout=float(config.connect_timeout),
        read_timeout=float(config.read_timeout),
        max_attempts=int(retries) + 1 if retries is not None else 3,
        decode=decode_dynamodb_binary if service == "dynamodb" else None,
    )
    return LeanClient(boto_client, caller, operations)
