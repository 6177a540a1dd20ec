"""The TTL attributes of a system's DynamoDB items at the end of a run.

Seed 000: inbox rows live 90 days ("inbox items TTL at 90 days"), and the fallback dedup store
(a DynamoDB conditional put while the primary store is out) bounds its items by the same 30-day
window as the primary's keys. DynamoDB deletes an item only when its TTL attribute is a number
of epoch *seconds*; an item without it, or with milliseconds (a date thousands of years away),
lives forever. A run lasts minutes, so only the attributes show it: the runner reads them
(read-only, a paginated Scan projecting the TTL and id attributes through the public API) once
the system has settled, and records one ``ttl_sample`` row per table: how many items carry each
expiry, by notification where the contract names the id attribute. ``ttl_attributes`` judges it.

The attributes are half of it: DynamoDB deletes nothing unless TTL is enabled on the table, on
that attribute. The runner asks (DescribeTimeToLive, public API) and records the answer in the
same row: ``ttl_status`` (ENABLED, DISABLED, ENABLING, DISABLING; null when not read),
``ttl_attribute``, ``ttl_unsupported`` (the endpoint has no DescribeTimeToLive) and
``ttl_error``.

Bounded: at most ``cap`` items per table.
"""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from harness.contract.system import TtlTable
from harness.model.history import History

DEFAULT_CAP = 500_000
PAGE = 1000
# Error codes of an endpoint without the TTL API (dynalite answers UnknownOperationException).
NO_TTL_API = ("UnknownOperationException", "NotImplemented", "NotImplementedError")


@dataclass(frozen=True)
class TtlStatus:
    """A table's TTL as DescribeTimeToLive answers it; ``status`` None when not read."""

    status: str | None
    attribute: str | None = None
    unsupported: bool = False
    error: str | None = None


def describe_ttl(ddb: Any, table: TtlTable) -> TtlStatus:
    """The table's TTL status, never raising for an AWS answer: an endpoint without the API is
    ``unsupported``, any other error is kept as text."""
    try:
        described = ddb.describe_time_to_live(TableName=table.table)["TimeToLiveDescription"]
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        return TtlStatus(None, unsupported=code in NO_TTL_API, error=f"{code}: {exc}")
    except BotoCoreError as exc:
        return TtlStatus(None, error=str(exc))
    return TtlStatus(described.get("TimeToLiveStatus"), described.get("AttributeName"))


@dataclass
class TtlScan:
    """Expiry (epoch seconds) -> items, by notification id ("" when the table names none);
    ``missing``: items without the attribute or not a number; ``complete``: all were read."""

    expiries: dict[str, Counter[int]] = field(default_factory=lambda: defaultdict(Counter))
    missing: int = 0
    items: int = 0
    complete: bool = True


def expiry_of(item: dict[str, Any], attribute: str) -> int | None:
    """An item's TTL as DynamoDB reads it (an N attribute), or None: DynamoDB's TTL ignores an
    attribute of any other type, so such an item never expires."""
    value = item.get(attribute)
    if not isinstance(value, dict) or "N" not in value:
        return None
    try:
        return int(float(value["N"]))
    except ValueError:
        return None


def scan_expiries(ddb: Any, table: TtlTable, cap: int = DEFAULT_CAP) -> TtlScan:
    """Every item's TTL attribute of ``table`` (up to ``cap`` items)."""
    scan = TtlScan()
    names = {"#t": table.attribute}
    projection = "#t"
    if table.id_attribute:
        names["#i"] = table.id_attribute
        projection += ", #i"
    request: dict[str, Any] = {
        "TableName": table.table,
        "ProjectionExpression": projection,
        "ExpressionAttributeNames": names,
        "Limit": PAGE,
    }
    for _ in range(cap // PAGE + 2):  # bounded: cap items, a page at a time
        page = ddb.scan(**request)
        for item in page.get("Items", []):
            scan.items += 1
            expiry = expiry_of(item, table.attribute)
            if expiry is None:
                scan.missing += 1
                continue
            ident = item.get(table.id_attribute or "", {}).get("S", "")
            scan.expiries[ident][expiry] += 1
        last = page.get("LastEvaluatedKey")
        if not last:
            return scan
        if scan.items >= cap:
            break
        request["ExclusiveStartKey"] = last
    scan.complete = False
    return scan


def record_scan(
    history: History, table: TtlTable, scan: TtlScan, status: TtlStatus | None = None
) -> None:
    """One ``ttl_sample`` row for the table (``status`` None: the TTL status was not asked)."""
    status = status or TtlStatus(None, error="not asked")
    history.append(
        "ttl_sample",
        time=time.time(),
        detail=json.dumps(
            {
                "purpose": table.purpose,
                "table": table.table,
                "attribute": table.attribute,
                "by_id": bool(table.id_attribute),
                "items": scan.items,
                "missing": scan.missing,
                "complete": scan.complete,
                "ttl_status": status.status,
                "ttl_attribute": status.attribute,
                "ttl_unsupported": status.unsupported,
                "ttl_error": status.error,
                "expiries": {
                    ident: {str(k): v for k, v in sorted(c.items())}
                    for ident, c in sorted(scan.expiries.items())
                },
            }
        ),
    )
