"""Reads the system's audit trail (JSON-lines objects in its WORM S3 bucket) into the history.

Run at the end of a run, after the workers have stopped: they store what they buffered on
SIGTERM, so the bucket then holds every record they accepted. Every object version is read, not
only the current ones: a version hidden behind a delete marker is still in the trail (that is
what Object Lock guarantees), and a checker should see what an auditor would.

One history row per record, kind ``audit``: ``reason`` is the outcome, ``tenant_id``,
``notification_id``, ``token`` when the record names one in clear (the reference names devices
by ``token_sha256`` only), ``time`` the record's ``at``, ``detail`` the rest of the record as
JSON plus the object key. A line that is not a JSON object becomes a row with reason
``unreadable``: a trail that cannot be read is a finding, not noise.

Sealed personal fields (the audit format's ``sealed`` envelopes, AES-256-GCM under a per-user
data key; see the reference's ``audit.py``) are read as an auditor would, with the privilege of
the key table (``audit_keys``, scanned once): ``detail`` keeps the record as STORED, envelopes
included, and adds ``"decrypted": {...}`` (the fields every envelope that opened holds) and
``"key_destroyed": true`` when an envelope's key no longer exists (its person was erased) or
was withheld at writing; ``"seal_broken": true`` when a key exists but the envelope does not
open with it (altered, or moved from another record). This reader is the verifier's own: it
follows the documented format, not the system's code.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from harness.model.history import History

AUDIT_PREFIX = "audit/"
UNREADABLE = "unreadable"


def _epoch(at: object) -> float:
    try:
        return datetime.fromisoformat(str(at)).timestamp()
    except ValueError:
        return time.time()


def audit_versions(s3: Any, bucket: str) -> list[tuple[str, str | None, str]]:
    """(key, version id, ETag) of every object version under the audit prefix, oldest key
    first; identical retries of one PUT (same key, same ETag) are listed once."""
    seen: set[tuple[str, str]] = set()
    versions = []
    paginator = s3.get_paginator("list_object_versions")
    for page in paginator.paginate(Bucket=bucket, Prefix=AUDIT_PREFIX):
        for version in page.get("Versions", []):
            identity = (version["Key"], version.get("ETag", ""))
            if identity in seen:
                continue
            seen.add(identity)
            versions.append((version["Key"], version.get("VersionId"), version.get("ETag", "")))
    return sorted(versions)


def audit_keys_by_kid(ddb: Any, table: str) -> dict[str, bytes]:
    """Every data key of the key table, by key id; none when the system keeps no such table."""
    keys: dict[str, bytes] = {}
    try:
        for page in ddb.get_paginator("scan").paginate(TableName=table, ConsistentRead=True):
            for item in page.get("Items", []):
                kid, key = item.get("kid", {}).get("S"), item.get("key", {}).get("B")
                if isinstance(kid, str) and key is not None:
                    keys[kid] = bytes(key)
    except ddb.exceptions.ResourceNotFoundException:
        return {}
    return keys


def _unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def envelope_aad(record: dict[str, Any], kid: str) -> bytes:
    """The associated data the format binds an envelope to its record with."""
    fields = [record.get(f) for f in ("tenant_id", "notification_id", "outcome", "at")]
    return json.dumps([*fields, kid], separators=(",", ":"), default=str).encode()


def open_record(record: dict[str, Any], keys: dict[str, bytes]) -> dict[str, Any]:
    """What an auditor reads of a stored record's envelopes: ``decrypted`` (the fields of every
    envelope that opened), ``key_destroyed`` and ``seal_broken`` (module docstring); {} for a
    record without envelopes."""
    envelopes = record.get("sealed")
    if not isinstance(envelopes, list) or not envelopes:
        return {}
    opened: dict[str, Any] = {}
    destroyed = broken = False
    for envelope in envelopes:
        kid = envelope.get("kid") if isinstance(envelope, dict) else None
        key = keys.get(kid) if isinstance(kid, str) else None
        if key is None or envelope.get("withheld"):
            destroyed = True
            continue
        try:
            plain = AESGCM(key).decrypt(
                _unb64url(envelope["iv"]), _unb64url(envelope["ct"]), envelope_aad(record, kid)
            )
            fields = json.loads(plain)
        except (InvalidTag, KeyError, TypeError, ValueError, binascii.Error):
            broken = True
            continue
        if isinstance(fields, dict):
            opened.update(fields)
        else:
            broken = True
    out: dict[str, Any] = {}
    if opened:
        out["decrypted"] = opened
    if destroyed:
        out["key_destroyed"] = True
    if broken:
        out["seal_broken"] = True
    return out


AUDIT_FIELDS = ("outcome", "tenant_id", "notification_id", "token")


def append_record(
    history: History,
    record: Any,
    where: dict[str, Any],
    opened: Callable[[dict[str, Any]], dict[str, Any]] = lambda record: {},
) -> None:
    """One ``audit`` row for one record of the trail's documented format (``outcome``,
    ``tenant_id``, ``notification_id``, ``token`` or ``token_sha256``, ``recipient_user_id``,
    ``at`` ISO 8601, the rest kept in ``detail``); a record that is not a JSON object is an
    ``unreadable`` row. ``where`` says where it was read; ``opened`` adds what its sealed
    envelopes hold."""
    if not isinstance(record, dict):
        history.append(
            "audit", reason=UNREADABLE, detail=json.dumps({**where, "line": str(record)[:500]})
        )
        return
    rest = {k: v for k, v in record.items() if k not in AUDIT_FIELDS}
    history.append(
        "audit",
        time=_epoch(record.get("at")),
        tenant_id=record.get("tenant_id"),
        notification_id=record.get("notification_id"),
        token=record.get("token"),
        reason=record.get("outcome"),
        detail=json.dumps({**rest, **where, **opened(record)}, default=str),
    )


def read_team_trail(history: History, records: Iterable[Any], source: str) -> int:
    """A team's own audit reader's records (``hooks.audit_trail``): dicts of the format above,
    or JSON-lines text; returns how many."""
    count = 0
    for record in records:
        if isinstance(record, (str, bytes)):
            try:
                record = json.loads(record)
            except json.JSONDecodeError:
                pass
        append_record(history, record, {"source": source})
        count += isinstance(record, dict)
    return count


def collect_audit(history: History, s3: Any, bucket: str, ddb: Any, keys_table: str) -> int:
    """Append every audit record in ``bucket`` to ``history``, the sealed fields opened with the
    keys in ``keys_table`` where they still exist; return how many records."""
    keys = audit_keys_by_kid(ddb, keys_table)
    records = 0
    for key, version_id, _etag in audit_versions(s3, bucket):
        kwargs = {"Bucket": bucket, "Key": key}
        if version_id and version_id != "null":
            kwargs["VersionId"] = version_id
        body = s3.get_object(**kwargs)["Body"].read().decode(errors="replace")
        for line in body.splitlines():
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                record = line
            append_record(history, record, {"object": key}, lambda r: open_record(r, keys))
            records += isinstance(record, dict)
    return records
