"""The AWS query protocol's encoding, both ways: form fields in (maps, lists, lists of
structures), XML out, and the region a request is for.

Maps arrive as ``Attributes.entry.N.key`` / ``.value`` (``MessageAttributes.entry.N.Name`` /
``.Value.DataType`` / ``.Value.StringValue`` / ``.Value.BinaryValue``), lists as
``name.member.N``, lists of structures as ``name.member.N.Field``; N counts from 1.
"""

from __future__ import annotations

import re
from typing import Any
from xml.sax.saxutils import escape

from emulators.sns.errors import validation_error

MAX_ENTRIES = 1000
_CREDENTIAL_REGION = re.compile(r"Credential=[^/,\s]+/\d{8}/([a-z0-9-]+)/")
_HOST_REGION = re.compile(r"^sns[.-]([a-z]{2}(?:-[a-z]+)+-\d)\.")


def request_region(headers: dict[str, str], default: str) -> str:
    """The region of a request: its SigV4 credential scope, else an AWS-style host (as SNS's own
    regional endpoints are), else ``default`` (unsigned requests, such as a SubscribeURL GET)."""
    match = _CREDENTIAL_REGION.search(headers.get("authorization", ""))
    if match:
        return match.group(1)
    match = _HOST_REGION.match(headers.get("host", ""))
    if match:
        return match.group(1)
    return default


def e(value: object) -> str:
    return escape(str(value))


def map_xml(name: str, mapping: dict[str, str]) -> str:
    entries = "".join(
        f"<entry><key>{e(k)}</key><value>{e(v)}</value></entry>" for k, v in mapping.items()
    )
    return f"<{name}>{entries}</{name}>"


def next_token_xml(name: str, token: str | None) -> str:
    return f"<{name}>{e(token)}</{name}>" if token else ""


def query_map(
    params: dict[str, str], prefix: str, key: str = "key", value: str = "value"
) -> dict[str, str]:
    """``prefix.entry.N.key`` / ``prefix.entry.N.value`` pairs as a dict (N from 1, contiguous)."""
    out: dict[str, str] = {}
    for i in range(1, MAX_ENTRIES + 1):
        name = params.get(f"{prefix}.entry.{i}.{key}")
        if name is None:
            break
        out[name] = params.get(f"{prefix}.entry.{i}.{value}", "")
    return out


def message_attribute_entries(
    params: dict[str, str], prefix: str = "MessageAttributes"
) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for i in range(1, MAX_ENTRIES + 1):
        base = f"{prefix}.entry.{i}"
        name = params.get(f"{base}.Name")
        if name is None:
            break
        entry = {}
        for field in ("DataType", "StringValue", "BinaryValue"):
            value = params.get(f"{base}.Value.{field}")
            if value is not None:
                entry[field] = value
        out[name] = entry
    return out


def query_list(params: dict[str, str], prefix: str) -> list[str]:
    out = []
    for i in range(1, MAX_ENTRIES + 1):
        value = params.get(f"{prefix}.member.{i}")
        if value is None:
            break
        out.append(value)
    return out


def query_members(params: dict[str, str], prefix: str) -> list[dict[str, Any]]:
    """``prefix.member.N.Field`` structures, each as its fields (``Field.x.y`` kept whole)."""
    out: list[dict[str, Any]] = []
    for i in range(1, MAX_ENTRIES + 1):
        head = f"{prefix}.member.{i}."
        fields = {k[len(head) :]: v for k, v in params.items() if k.startswith(head)}
        if not fields:
            break
        out.append(fields)
    return out


def required(params: dict[str, Any], name: str, member: str | None = None) -> str:
    value = params.get(name)
    if value is None:
        raise validation_error(member or name[0].lower() + name[1:])
    return value
