"""Creates the reference implementation's tables, streams, queues and audit bucket (idempotent).

This is the local equivalent of the CloudFormation stack a team deploys: the harness calls it
once the AWS endpoints are up, and a team on real AWS runs it against an empty account.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from botocore.exceptions import ClientError

from reference_impl.aws import client
from reference_impl.config import PAGES_QUEUE, WORK_QUEUES, Config, ConfigError
from reference_impl.sns_push import provision_sns

# name -> has a sort key
TABLES: dict[str, bool] = {
    "inbox": True,
    "followers": True,  # pk tenant#author, sk the page's first id: follower pages
    "accounts": False,
    "preferences": False,  # one record per user: preferences and devices (user_record)
    "celebrity_posts": True,
    "checkpoints": False,
    "dedup_fallback": False,
    "following": True,  # pk tenant#user, sk author: below-threshold follows, for erasure
    "read_state": False,  # the read watermark (seed 003)
    "reads": True,  # per-item reads above the watermark
    "audit_keys": False,  # pk tenant#user: the user's audit data key (audit_keys.py)
    "event_registry": False,  # pk tenant#event_id: the content each accepted id stands for
}
# Tables with a DynamoDB stream, and its view: the stream invalidator reads only the keys.
STREAMS: dict[str, str] = {"preferences": "KEYS_ONLY"}
# Tables whose items carry a TTL attribute (seed 000: inbox rows 90 days, dedup keys 30 days;
# celebrity pointer rows live as the inbox rows they stand for, registry ids as the dedup
# window). DynamoDB deletes nothing unless TTL is enabled on the table, on that attribute.
TTL_ATTRIBUTE = "expires_at"
TTL_TABLES = ("inbox", "celebrity_posts", "dedup_fallback", "event_registry")
# The endpoint has no TTL API (dynalite when reached without the AWS proxy).
NO_TTL_API = ("UnknownOperationException",)


def ttl_tables(defects: tuple[str, ...]) -> tuple[str, ...]:
    """The tables whose TTL provisioning enables (the defect leaves the inbox's off)."""
    if "inbox_ttl_not_enabled" in defects:
        return tuple(t for t in TTL_TABLES if t != "inbox")
    return TTL_TABLES


def _create_table(ddb: Any, name: str, with_sort_key: bool, stream_view: str | None) -> bool:
    """Create the table (with its stream, if it has one); False when it already existed."""
    keys = [{"AttributeName": "pk", "KeyType": "HASH"}]
    attrs = [{"AttributeName": "pk", "AttributeType": "S"}]
    if with_sort_key:
        keys.append({"AttributeName": "sk", "KeyType": "RANGE"})
        attrs.append({"AttributeName": "sk", "AttributeType": "S"})
    extra: dict[str, Any] = {}
    if stream_view is not None:
        extra["StreamSpecification"] = {"StreamEnabled": True, "StreamViewType": stream_view}
    try:
        ddb.create_table(
            TableName=name,
            KeySchema=keys,
            AttributeDefinitions=attrs,
            BillingMode="PAY_PER_REQUEST",
            **extra,
        )
    except ClientError as exc:
        if exc.response["Error"]["Code"] != "ResourceInUseException":
            raise
        return False
    return True


def ensure_stream(ddb: Any, name: str, view: str) -> None:
    """An existing table without an enabled stream gets one (any view carries the keys, so a
    stream already enabled with another view is left as it is)."""
    table = ddb.describe_table(TableName=name)["Table"]
    if table.get("StreamSpecification", {}).get("StreamEnabled"):
        return
    try:
        ddb.update_table(
            TableName=name, StreamSpecification={"StreamEnabled": True, "StreamViewType": view}
        )
    except ClientError as exc:
        raise ConfigError(
            f"table {name} has no stream and the endpoint refused to enable one ({exc}); "
            "dynalite has no streams: reach it through `python -m emulators.aws_proxy "
            "--dynamodb-streams`"
        ) from exc


def ensure_ttl(ddb: Any, name: str, attribute: str) -> bool:
    """TTL enabled on ``attribute`` (already so: nothing to do). False when the endpoint has no
    TTL API, said on stderr: the table's items then never expire. ConfigError when TTL is on
    another attribute (changing it is a decision for whoever set it, not for provisioning)."""
    try:
        described = ddb.describe_time_to_live(TableName=name)["TimeToLiveDescription"]
    except ClientError as exc:
        if exc.response["Error"]["Code"] not in NO_TTL_API:
            raise
        described = {}
    status, current = described.get("TimeToLiveStatus"), described.get("AttributeName")
    if status in ("ENABLED", "ENABLING"):
        if current == attribute:
            return True
        raise ConfigError(
            f"table {name} has TTL on {current!r}, not {attribute!r}: its items would never "
            "expire; disable that TTL first (UpdateTimeToLive) and provision again"
        )
    try:
        ddb.update_time_to_live(
            TableName=name, TimeToLiveSpecification={"Enabled": True, "AttributeName": attribute}
        )
    except ClientError as exc:
        if exc.response["Error"]["Code"] not in NO_TTL_API:
            raise ConfigError(f"table {name}: TTL on {attribute} not enabled ({exc})") from exc
        print(
            f"warning: table {name}: the DynamoDB endpoint has no UpdateTimeToLive, so its "
            "items never expire (dynalite: reach it through `python -m emulators.aws_proxy "
            "--dynamodb-streams`)",
            file=sys.stderr,
        )
        return False
    return True


def _wait_active(describe: Any, status_of: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while status_of(describe()) != "ACTIVE":
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not become ACTIVE within {timeout:.0f}s")
        time.sleep(0.05)


def ensure_audit_bucket(s3: Any, bucket: str, retention_days: int, region: str) -> None:
    """The audit bucket: Object Lock on (which also turns versioning on, for good), a default
    retention in COMPLIANCE mode, no public access. In COMPLIANCE mode nobody, the account root
    included, can delete an object version or shorten its retention before it expires."""
    kwargs: dict[str, Any] = {"Bucket": bucket, "ObjectLockEnabledForBucket": True}
    if region != "us-east-1":
        kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}
    try:
        s3.create_bucket(**kwargs)
    except ClientError as exc:
        if exc.response["Error"]["Code"] != "BucketAlreadyOwnedByYou":
            raise
    try:
        current = s3.get_object_lock_configuration(Bucket=bucket)["ObjectLockConfiguration"]
    except ClientError as exc:
        if exc.response["Error"]["Code"] != "ObjectLockConfigurationNotFoundError":
            raise
        current = {}
    retention = current.get("Rule", {}).get("DefaultRetention", {})
    if (retention.get("Mode"), retention.get("Days")) != ("COMPLIANCE", retention_days):
        # A bucket made without Object Lock fails here, loudly, rather than take audit records
        # it cannot protect. (Left alone when already right: moto refuses any change to the
        # configuration of a bucket that holds objects, AWS does not.)
        s3.put_object_lock_configuration(
            Bucket=bucket,
            ObjectLockConfiguration={
                "ObjectLockEnabled": "Enabled",
                "Rule": {"DefaultRetention": {"Mode": "COMPLIANCE", "Days": retention_days}},
            },
        )
    s3.put_public_access_block(
        Bucket=bucket,
        PublicAccessBlockConfiguration={
            "BlockPublicAcls": True,
            "IgnorePublicAcls": True,
            "BlockPublicPolicy": True,
            "RestrictPublicBuckets": True,
        },
    )


def provision(config: Config) -> dict[str, str]:
    """Create everything; return the queue URLs by queue name."""
    ddb = client(config, "dynamodb")
    for name, with_sort_key in TABLES.items():
        view = STREAMS.get(name)
        if not _create_table(ddb, config.table(name), with_sort_key, view) and view is not None:
            ensure_stream(ddb, config.table(name), view)
    for name in TABLES:
        table = config.table(name)
        _wait_active(
            lambda t=table: ddb.describe_table(TableName=t),
            lambda d: d["Table"]["TableStatus"],
            f"table {table}",
        )
    for name in ttl_tables(config.defects):
        ensure_ttl(ddb, config.table(name), TTL_ATTRIBUTE)

    kinesis = client(config, "kinesis")
    try:
        kinesis.create_stream(StreamName=config.stream_name, ShardCount=config.stream_shards)
    except ClientError as exc:
        if exc.response["Error"]["Code"] != "ResourceInUseException":
            raise
    _wait_active(
        lambda: kinesis.describe_stream(StreamName=config.stream_name),
        lambda d: d["StreamDescription"]["StreamStatus"],
        f"stream {config.stream_name}",
    )

    sqs = client(config, "sqs")
    urls: dict[str, str] = {}
    for channel in WORK_QUEUES:
        dlq_name = config.queue_name(channel, "-dlq")
        poison_name = config.queue_name(channel, "-poison")
        for name in (dlq_name, poison_name):
            urls[name] = sqs.create_queue(QueueName=name)["QueueUrl"]
        dlq_arn = sqs.get_queue_attributes(QueueUrl=urls[dlq_name], AttributeNames=["QueueArn"])[
            "Attributes"
        ]["QueueArn"]
        main = config.queue_name(channel)
        urls[main] = sqs.create_queue(
            QueueName=main,
            Attributes={
                "VisibilityTimeout": str(
                    config.page_task_visibility_seconds
                    if channel == PAGES_QUEUE
                    else config.visibility_timeout_seconds
                ),
                "RedrivePolicy": json.dumps(
                    {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": config.max_receive_count}
                ),
            },
        )["QueueUrl"]
    if config.push_transport == "sns":
        provision_sns(config, sqs)
    if config.audit_bucket:
        ensure_audit_bucket(
            client(config, "s3"), config.audit_bucket, config.audit_retention_days, config.region
        )
    return urls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="create the reference implementation's resources")
    parser.add_argument("--config", help="config JSON (default: $FANOUT_CONFIG)")
    args = parser.parse_args(argv)
    try:
        urls = provision(Config.load(args.config))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(urls, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
