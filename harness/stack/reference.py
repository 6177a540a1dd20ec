"""The reference implementation as one target among others: the only harness module that
imports ``reference_impl``. It writes the reference's config for a local stack, provisions its
tables and queues, names its worker processes, and hands back its contract (driver, policy,
queues, audit trail reader, a direct table writer). Everything else in the harness knows the
reference only through that contract, as it knows a team's system through its target file.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.contract.driver import FanoutApiDriver
from harness.contract.system import (
    DEFAULT_JOB_FIELDS,
    DEFAULT_JOB_TEMPLATE,
    AuditSource,
    Queues,
    SystemContract,
    TtlTable,
    job_reader,
)
from harness.model.fcm_mapping import DIGITS_MOD
from harness.model.system import SystemPolicy
from reference_impl.config import CHANNELS, PAGES_QUEUE, Config, ConfigError
from reference_impl.ids import PREFERENCES_CACHE_SECONDS, user_key

# Worker part -> the reference module it runs (and its extra arguments).
WORKERS: dict[str, tuple[str, ...]] = {
    "event-api": ("reference_impl.event_api",),
    "fanout-worker": ("reference_impl.fanout_worker",),
    "push-consumer": ("reference_impl.push_consumer",),
    "email-consumer": ("reference_impl.channel_consumer", "--channel", "email"),
    "in-app-consumer": ("reference_impl.channel_consumer", "--channel", "in_app"),
    "sms-consumer": ("reference_impl.channel_consumer", "--channel", "sms"),
    "stream-invalidator": ("reference_impl.stream_invalidator",),
}
# The workers that buffer audit records and store them on SIGTERM: one killed instead loses
# evidence the audit checkers read (the stream invalidator and the event API buffer none).
AUDITING_WORKERS = (
    "fanout-worker",
    "push-consumer",
    "email-consumer",
    "in-app-consumer",
    "sms-consumer",
)


class ReferenceConfigError(ValueError):
    """The reference's config (a scenario's overrides included) is not valid."""


# How the reference sends pushes in a local stack unless a scenario's `reference:` (or `run
# --push-transport`) says otherwise: through SNS mobile push, as the design has it (seed 004;
# reference_impl/sns_push.py), the stack then starting its SNS endpoint. A stack started with
# named parts and no `sns` among them sends direct (an SNS-less stack has nothing to publish to).
DEFAULT_PUSH_TRANSPORT = "sns"


def publishes_through_sns(overrides: Mapping[str, Any]) -> bool:
    """Whether the reference, with a scenario's overrides, publishes pushes through SNS."""
    return overrides.get("push_transport", DEFAULT_PUSH_TRANSPORT) == "sns"


def config_values(urls: Mapping[str, str | None], extra: Mapping[str, Any]) -> dict[str, Any]:
    """The reference's config for a local stack whose parts answer at ``urls`` (part -> URL,
    None when the stack has no such part); ``extra`` (the stack's own values and a scenario's
    overrides) goes over it."""

    def url(part: str) -> str | None:
        return urls.get(part)

    values: dict[str, Any] = {
        # Through the proxy that gives dynalite its streams, when the stack has it.
        "dynamodb_endpoint": url("dynamodb-proxy") or url("dynamodb"),
        # Through the fault proxy when the stack has one (Event API and fan-out alike).
        "kinesis_endpoint": url("kinesis-proxy") or url("kinesis"),
        "sqs_endpoint": url("sqs"),
        "s3_endpoint": url("aws"),
        # The WORM audit trail lives in moto's S3; without that part it stays in the logs.
        "audit_bucket": "fanout-audit" if url("aws") else None,
        "audit_retention_days": 1,
        "apns_url": url("apns"),
        "fcm_url": url("fcm"),
        "push_transport": DEFAULT_PUSH_TRANSPORT if url("sns") else "direct",
        # Pushes (push_transport: sns) and SMS (Publish with PhoneNumber) go out through it.
        "sns_endpoint": url("sns"),
        "fcm_projects": ["fanout-sender-0", "fanout-sender-1"],
        "ses_url": url("ses"),
        "inapp_url": url("inapp"),
        "celebrity_threshold": 50,
        # Small pages and short walks, so that a run at demo scale already goes through the
        # fan-out of fan-out (walk tasks handing on, page tasks in parallel).
        "follower_page_size": 20,
        "pages_per_walk": 2,
        # Pages of 20 take well under a second; a lost delete of one (the SQS faults reach
        # every queue) then comes back in seconds, not the production default's 120.
        "page_task_visibility_seconds": 15,
        "visibility_timeout_seconds": 5,
        "dedup_lease_seconds": 8,
        # One consumer process per core (Lambda's concurrency): a supervisor forks them into
        # the part's process group, so the consumer-crash fault's kill -9 takes them all.
        # Two pollers each: four in all, as one process of four threads had, so what a kill
        # can take in flight (the scenarios' bounds: pollers x 10 copies) is unchanged.
        "push_consumer_processes": 2,
        "consumer_threads": 2,
    }
    values.update(extra)
    return {k: v for k, v in values.items() if v is not None}


def config_of(values: Mapping[str, Any]) -> Config:
    try:
        return Config.from_mapping(dict(values))
    except ConfigError as exc:
        raise ReferenceConfigError(f"reference config: {exc}") from exc


def write_config(path: Path, values: Mapping[str, Any]) -> None:
    Path(path).write_text(config_of(values).to_json())


def provision(config_path: str) -> None:
    """The reference's tables, stream, queues and audit bucket."""
    from reference_impl.provision import provision as provision_reference

    provision_reference(Config.load(config_path))


def worker_argv(part: str, config_path: str, port: int | None, ready: str) -> list[str] | None:
    """The command of one of the reference's worker parts; None for a part that is not one."""
    module = WORKERS.get(part)
    if module is None:
        return None
    argv = [sys.executable, "-m", module[0], *module[1:], "--config", config_path]
    return argv + (["--port", str(port)] if part == "event-api" else ["--ready-file", ready])


def policy(config: Config, durable: bool) -> SystemPolicy:
    """The reference's stated policies, in the verifier's terms."""
    return SystemPolicy(
        channels_by_kind=dict(config.channels_by_kind),
        rate_limit_per_window=config.rate_limit_per_window,
        rate_limit_window_seconds=float(config.rate_limit_window_seconds),
        daily_limit_per_device_type=config.daily_limit_per_device_type,
        dedup_fallback=config.dedup_fallback,
        durable_dedup_store=durable,
        fcm_projects=tuple(config.fcm_projects),
        fcm_mapping=DIGITS_MOD,  # the consumer routes by recipient_user_id mod K
        preferences_cache_ttl_s=float(PREFERENCES_CACHE_SECONDS),
        # Its alerts: a fixed title, the author and the kind (push_consumer.send, sns_push).
        push_text="New activity\n{author_id} {kind}",
    )


def queues(config: Config) -> Queues:
    names = (*CHANNELS, PAGES_QUEUE)
    return Queues(
        work={c: config.queue_name(c) for c in names},
        dead={c: config.queue_name(c, "-dlq") for c in names},
        poison={c: config.queue_name(c, "-poison") for c in names},
        read_job=job_reader(DEFAULT_JOB_FIELDS),
        job_template=DEFAULT_JOB_TEMPLATE,
    )


def contract(info: Any, durable: bool) -> SystemContract:
    """The reference running in the stack ``info`` (a ``StackInfo``)."""
    from harness.run.audit_trail import collect_audit

    config = Config.load(info.reference_config)
    audit = None
    if config.audit_bucket:
        bucket, keys_table = config.audit_bucket, config.table("audit_keys")

        def read_trail(history: Any) -> int:
            return collect_audit(
                history, info.aws_client("s3"), bucket, info.aws_client("dynamodb"), keys_table
            )

        audit = AuditSource(read_trail, format="sealed-jsonl (reference_impl/audit.py)")
    preferences_table = config.table("preferences")

    def write_preferences(tenant: str, user: str, prefs: dict[str, Any]) -> None:
        """Straight to the preferences table, as a console edit or a backfill would: the Event
        API never hears of it, only the table's change stream can tell the system."""
        info.aws_client("dynamodb").update_item(
            TableName=preferences_table,
            Key={"pk": {"S": user_key(tenant, user)}},
            UpdateExpression="SET prefs = :p, updated_at = :t",
            ExpressionAttributeValues={
                ":p": {"S": json.dumps(prefs)},
                ":t": {"S": datetime.now(UTC).isoformat()},
            },
        )

    sqs, sns = info.parts.get("sqs"), info.parts.get("sns")
    return SystemContract(
        name="reference",
        api_url=info.url("event-api"),
        driver=FanoutApiDriver(),
        policy=policy(config, durable),
        queues=queues(config),
        audit=audit,
        table_writer=write_preferences,
        sqs_log_url=sqs.url if sqs is not None else None,
        ttl_tables=(
            TtlTable("inbox", config.table("inbox"), "expires_at", "sk"),
            TtlTable("inbox", config.table("celebrity_posts"), "expires_at", "sk"),
            TtlTable("dedup_fallback", config.table("dedup_fallback"), "expires_at"),
        ),
        # The reference texts through the stack's SNS endpoint (sns_endpoint in its config).
        sms_ledger_url=sns.url if sns is not None and config.sns_endpoint else None,
        # Straight to the store, not through the fault proxy: read after the faults. The
        # stack's redis-server, unless the reference's config names a store of its own (e.g.
        # a cluster), which the proxy does not stand in front of.
        dedup_store_url=(
            config.redis_url
            if config.redis_url and config.redis_url != info.dedup_url
            else info.redis_url
            if "redis" in info.parts
            else None
        ),
    )
