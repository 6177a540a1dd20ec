"""Answers the proxy makes itself, in the AWS JSON protocol's shape (no I/O)."""

from __future__ import annotations

import json
import uuid
import zlib
from typing import Any

from emulators.http_server import Response

KINESIS_CONTENT_TYPE = "application/x-amz-json-1.1"
DYNAMODB_CONTENT_TYPE = "application/x-amz-json-1.0"
# DynamoDB's error types carry this namespace; SDKs report the part after '#'.
DYNAMODB_ERROR_NAMESPACE = "com.amazonaws.dynamodb.v20120810#"


def _with_checksum(response: Response) -> Response:
    """DynamoDB signs its answers with ``x-amz-crc32`` and botocore checks it where present."""
    response.headers["x-amz-crc32"] = str(zlib.crc32(response.body))
    return response


def aws_json(
    status: int, body: bytes, content_type: str = DYNAMODB_CONTENT_TYPE, checksum: bool = True
) -> Response:
    headers = {"content-type": content_type, "x-amzn-requestid": uuid.uuid4().hex.upper()}
    response = Response(status, headers, body)
    return _with_checksum(response) if checksum else response


def aws_error(
    status: int,
    kind: str,
    message: str,
    content_type: str = KINESIS_CONTENT_TYPE,
    namespace: str = "",
) -> Response:
    """An error SDKs report by name (``__type``), with the message they show."""
    body = json.dumps({"__type": f"{namespace}{kind}", "message": message}).encode()
    return aws_json(status, body, content_type, checksum=content_type == DYNAMODB_CONTENT_TYPE)


def rewritten(answer: Response, value: Any) -> Response:
    """Upstream's answer with another JSON body: its headers kept (request id, type), the body
    uncompressed, its length recomputed by the server, its checksum recomputed if it had one."""
    body = json.dumps(value, separators=(",", ":")).encode()
    headers = {
        k: v for k, v in answer.headers.items() if k not in ("content-encoding", "content-length")
    }
    headers.setdefault("content-type", KINESIS_CONTENT_TYPE)
    response = Response(answer.status, headers, body)
    return _with_checksum(response) if "x-amz-crc32" in headers else response
