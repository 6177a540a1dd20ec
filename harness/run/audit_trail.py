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
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from typing import Any

from botocore.config import Config as BotoConfig

from harness.model.history import History
from harness.stack.supervisor import StackInfo
from reference_impl.aws import new_client
from reference_impl.config import Config

AUDIT_PREFIX = "audit/"
UNREADABLE = "unreadable"


def audit_s3_client(info: StackInfo, config: Config) -> Any:
    kwargs: dict[str, Any] = {"region_name": info.region, **(info.aws_keys or {})}
    if config.s3_endpoint:
        kwargs["endpoint_url"] = config.s3_endpoint
        kwargs["config"] = BotoConfig(s3={"addressing_style": "path"})
    return new_client("s3", **kwargs)


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


def collect_audit(info: StackInfo, history: History) -> int:
    """Append every audit record of the run's system to ``history``; return how many.

    0 when the system's config names no audit bucket (a target, or the audit left in logs)."""
    config = Config.load(info.reference_config)
    if not config.audit_bucket:
        return 0
    s3 = audit_s3_client(info, config)
    records = 0
    for key, version_id, _etag in audit_versions(s3, config.audit_bucket):
        kwargs = {"Bucket": config.audit_bucket, "Key": key}
        if version_id and version_id != "null":
            kwargs["VersionId"] = version_id
        body = s3.get_object(**kwargs)["Body"].read().decode(errors="replace")
        for line in body.splitlines():
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                record = None
            if not isinstance(record, dict):
                history.append(
                    "audit",
                    reason=UNREADABLE,
                    detail=json.dumps({"object": key, "line": line[:500]}),
                )
                continue
            rest = {
                k: v
                for k, v in record.items()
                if k not in ("outcome", "tenant_id", "notification_id", "token")
            }
            history.append(
                "audit",
                time=_epoch(record.get("at")),
                tenant_id=record.get("tenant_id"),
                notification_id=record.get("notification_id"),
                token=record.get("token"),
                reason=record.get("outcome"),
                detail=json.dumps({**rest, "object": key}, default=str),
            )
            records += 1
    return records
