"""boto3 clients built from config: the one place that knows where AWS is."""

from __future__ import annotations

from typing import Any

import boto3
from botocore.config import Config as BotoConfig

from reference_impl.config import Config

_BOTO = BotoConfig(retries={"max_attempts": 3, "mode": "standard"}, max_pool_connections=32)


def client(config: Config, service: str, boto_config: BotoConfig | None = None) -> Any:
    """``boto_config`` replaces the default (retries, pool size) for this client."""
    endpoint = {
        "dynamodb": config.dynamodb_endpoint,
        # The Streams API is served where the table is (moto serves both on one port).
        "dynamodbstreams": config.dynamodb_endpoint,
        "kinesis": config.kinesis_endpoint,
        "sqs": config.sqs_endpoint,
        "s3": config.s3_endpoint,
        "sesv2": config.ses_url,
        "apigatewaymanagementapi": config.inapp_url,
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
    return boto3.session.Session().client(service, **kwargs)


def queue_url(sqs: Any, name: str) -> str:
    return sqs.get_queue_url(QueueName=name)["QueueUrl"]


def batch_write(ddb: Any, table: str, requests: list[dict[str, Any]]) -> None:
    """BatchWriteItem with the unprocessed items retried until none are left."""
    pending = {table: requests}
    for _ in range(20):
        result = ddb.batch_write_item(RequestItems=pending)
        pending = result.get("UnprocessedItems") or {}
        if not pending:
            return
    raise RuntimeError(f"BatchWriteItem on {table} left items unprocessed after 20 tries")
