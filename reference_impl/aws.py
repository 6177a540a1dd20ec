"""boto3 clients built from config: the one place that knows where AWS is."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import boto3
from botocore.config import Config as BotoConfig
from botocore.credentials import ReadOnlyCredentials

from reference_impl.aws_json import HOT_OPERATIONS, lean
from reference_impl.config import Config

# No client-side parameter validation: the service validates every request anyway, and
# walking each request's shape in Python was a third of the bulk load's CPU.
_BOTO = BotoConfig(
    retries={"max_attempts": 3, "mode": "standard"},
    max_pool_connections=32,
    parameter_validation=False,
)


def client(config: Config, service: str, boto_config: BotoConfig | None = None) -> Any:
    """``boto_config`` replaces the default (retries, pool size) for this client. SQS and
    DynamoDB clients make their delivery-path calls through :mod:`reference_impl.aws_json`
    (``aws_lean_client``, on by default), everything else through boto3."""
    endpoint = {
        "dynamodb": config.dynamodb_endpoint,
        # The Streams API is served where the table is (moto serves both on one port).
        "dynamodbstreams": config.dynamodb_endpoint,
        "kinesis": config.kinesis_endpoint,
        "sqs": config.sqs_endpoint,
        "s3": config.s3_endpoint,
        "sesv2": config.ses_url,
        "apigatewaymanagementapi": config.inapp_url,
        "sns": config.sns_endpoint,
    }.get(service)
    kwargs: dict[str, Any] = {"region_name": config.region, "config": boto_config or _BOTO}
    if endpoint:
        kwargs["endpoint_url"] = endpoint
        if service == "s3":
            # A local endpoint (an IP, a port) has no DNS names for virtual-hosted buckets.
            kwargs["config"] = kwargs["config"].merge(BotoConfig(s3={"addressing_style": "path"}))
    if config.aws_access_key_id:
        kwargs["aws_access_key_id"] = config.aws_access_key_id
        kwargs["aws_secret_access_key"] = config.aws_secret_access_key
    boto = new_client(service, **kwargs)
    if not config.aws_lean_client or service not in HOT_OPERATIONS:
        return boto
    credentials = credentials_of(config)
    if credentials is None:
        return boto  # boto3 says what is missing on the first call
    return lean(boto, service, credentials)


def credentials_of(config: Config) -> Callable[[], Any] | None:
    """What signs a lean call: the config's keys, else the chain the boto3 clients use
    (refreshed when temporary); None when there are none."""
    if config.aws_access_key_id:
        frozen = ReadOnlyCredentials(
            config.aws_access_key_id, config.aws_secret_access_key or "", None
        )
        return lambda: frozen
    credentials = _session().get_credentials()
    return credentials.get_frozen_credentials if credentials is not None else None


def new_client(service: str, **kwargs: Any) -> Any:
    """``boto3.client`` from this process's one Session: a client from a new Session parses
    its service model again, ~0.1 s of CPU each, and a consumer process makes a dozen."""
    with _SESSION_LOCK:  # a Session is not thread-safe; the clients it makes are
        return _session().client(service, **kwargs)


_SESSION_LOCK = threading.Lock()
_SESSIONS: dict[int, boto3.session.Session] = {}


def _session() -> boto3.session.Session:
    """One boto3 Session per process: a forked child makes its own."""
    pid = os.getpid()
    if pid not in _SESSIONS:
        _SESSIONS.clear()
        _SESSIONS[pid] = boto3.session.Session()
    return _SESSIONS[pid]


def queue_url(sqs: Any, name: str) -> str:
    return sqs.get_queue_url(QueueName=name)["QueueUrl"]


# DynamoDB's limits per call.
BATCH_WRITE_MAX = 25
BATCH_GET_MAX = 100


def batch_write(ddb: Any, table: str, requests: Sequence[dict[str, Any]]) -> None:
    """Any number of write requests, BATCH_WRITE_MAX per BatchWriteItem, each call's
    unprocessed items retried until none are left."""
    for start in range(0, len(requests), BATCH_WRITE_MAX):
        pending = {table: list(requests[start : start + BATCH_WRITE_MAX])}
        for _ in range(20):
            result = ddb.batch_write_item(RequestItems=pending)
            pending = result.get("UnprocessedItems") or {}
            if not pending:
                break
        else:
            raise RuntimeError(f"BatchWriteItem on {table} left items unprocessed after 20 tries")


def batch_get(ddb: Any, table: str, keys: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Any number of keys, BATCH_GET_MAX per consistent BatchGetItem, each call's unprocessed
    keys asked again until none are left: the items found, in no particular order."""
    return batch_get_tables(ddb, {table: keys})[table]


def batch_get_tables(
    ddb: Any,
    keys: Mapping[str, Sequence[dict[str, Any]]],
    projections: Mapping[str, str] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """:func:`batch_get` over several tables at once: one BatchGetItem reads up to
    BATCH_GET_MAX keys of any tables, so two small reads of one batch cost one call. The items
    found, by table; ``projections``: the attributes to bring of a table's items (a
    ProjectionExpression, which must name the key to tell the items apart)."""
    found: dict[str, list[dict[str, Any]]] = {table: [] for table in keys}
    flat = [(table, key) for table, table_keys in keys.items() for key in table_keys]
    for start in range(0, len(flat), BATCH_GET_MAX):
        pending: dict[str, Any] = {}
        for table, key in flat[start : start + BATCH_GET_MAX]:
            request = pending.setdefault(table, {"Keys": [], "ConsistentRead": True})
            if projections and table in projections:
                request["ProjectionExpression"] = projections[table]
            request["Keys"].append(key)
        for _ in range(20):
            result = ddb.batch_get_item(RequestItems=pending)
            for table, items in result.get("Responses", {}).items():
                found.setdefault(table, []).extend(items)
            pending = result.get("UnprocessedKeys") or {}
            if not pending:
                break
        else:
            tables = ", ".join(sorted(pending))
            raise RuntimeError(f"BatchGetItem on {tables} left keys unprocessed after 20 tries")
    return found


def send_batch(
    sqs: Any,
    queue: str,
    entries: list[dict[str, Any]],
    on_accepted: Callable[[list[dict[str, Any]]], None] | None = None,
    ignore_failed: bool = False,
) -> None:
    """SendMessageBatch (at most 10 entries) with the failed entries sent again until none are
    left; ``on_accepted`` is told each attempt's accepted entries, once per accepted copy.
    ``ignore_failed``: the defect send_batch_ignores_failed (an HTTP 200 taken for all sent)."""
    for _ in range(10):
        answer = sqs.send_message_batch(QueueUrl=queue, Entries=entries)
        failed = set() if ignore_failed else {f["Id"] for f in answer.get("Failed", [])}
        if on_accepted is not None:
            on_accepted([e for e in entries if e["Id"] not in failed])
        if not failed:
            return
        entries = [e for e in entries if e["Id"] in failed]
    raise RuntimeError(f"SendMessageBatch kept failing for {len(entries)} message(s)")


def to_poison(sqs: Any, queue: str, record: dict[str, Any], reason: str) -> None:
    """A message no retry can fix, parked with the reason as a message attribute."""
    sqs.send_message(
        QueueUrl=queue,
        MessageBody=record.get("body") or "",
        MessageAttributes={"reason": {"DataType": "String", "StringValue": reason[:256]}},
    )
