"""Configuration of the reference implementation.

Every endpoint comes from config, so the same code runs against the embedded local stack and
against real AWS: leave an endpoint out (or null) and boto3 uses the region's real endpoint.
The config is a JSON file named by ``--config`` or the ``FANOUT_CONFIG`` environment variable.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

CHANNELS = ("push", "email", "in_app", "sms")
PUSH_TRANSPORTS = ("sns", "direct")
# The fan-out of fan-out: a celebrity post's follower pages travel as tasks on this queue.
PAGES_QUEUE = "pages"
# Every queue with a dead-letter and a poison queue beside it.
WORK_QUEUES = (*CHANNELS, PAGES_QUEUE)
# Seed 000: one SQS queue per channel. Which channels an event kind reaches; a kind not named
# here goes to push only, so every scenario that predates the channel split keeps its traffic.
DEFAULT_CHANNELS_BY_KIND: dict[str, tuple[str, ...]] = {
    "post": ("push",),
    "like": ("push",),
    "comment": ("push",),
    "mention": ("push", "email", "in_app", "sms"),
}
# SNS SMS message types (``AWS.SNS.SMS.SMSType``): Transactional is the one for critical,
# time-sensitive messages (higher delivery priority); Promotional is for marketing.
SMS_TYPES = ("Transactional", "Promotional")
# An SNS sender ID: 1-11 letters or digits, at least one letter (AWS's rule).
_SENDER_ID = re.compile(r"^(?=.*[A-Za-z])[A-Za-z0-9]{1,11}$")
# Deliberate defects, off unless named in config: they exist to prove that the harness catches
# what a real system gets wrong (each has a test that runs it and expects a failed verdict).
DEFECTS = (
    "dedup_fail_open",  # a Redis error sends anyway
    "apns_token_per_push",  # a new APNs provider token signed for every push
    "apns_background_push_type",  # alerts sent as apns-push-type background at priority 5
    "apns_expiration_zero",  # apns-expiration 0: deliver once, never kept for an offline device
    "push_text_of_round_head",  # the text made once per send round, of its first job
    "sent_twice_one_in_100k",  # one delivery in 100,000 (by its ids' hash) sent a second time
    "delete_before_send",  # acknowledge the whole batch on receipt
    "skip_dedup",  # no dedup check at all ("send and pray")
    "dedup_window_one_hour",  # 'sent' marks live an hour, not 30 days (EX 3600)
    "channel_dedup_skipped",  # email and in-app send with no dedup claim (push alone guarded)
    "no_collapse_id",  # pushes carry no collapse id
    "collapse_id_per_author",  # collapse id = author: an author's next push replaces the last
    "ignore_retry_after",  # 429s retried on the queue's own schedule, the scope never paused
    "fallback_no_recheck",  # after recovery, Redis alone decides (fallback keys forgotten)
    "quiet_hours_in_utc",  # the classic bug: the window compared with UTC wall-clock time
    "quiet_hours_ignore_dst",  # the zone's standard offset all year: an hour off in summer
    "quiet_hours_end_minute_early",  # the window's last minute counts as outside (07:59 sends)
    "unknown_zone_sent",  # a zone no tz database knows is taken as UTC: quiet hours fail open
    "unreadable_quiet_hours_sent",  # a window that does not parse is taken as no window
    "dedup_key_without_tenant",  # two tenants' same ULID and device suppress each other
    "rate_limit_counts_redeliveries",  # the limits count receives, not notification ids
    "rate_limit_per_tenant",  # one sliding window per (tenant, channel), not per user
    "partition_key_per_event",  # Kinesis key = event id: one author's posts spread over shards
    "inbox_cursor_skips",  # next cursor = the oldest row any source fetched: a merge gap
    "unread_ignores_item_reads",  # the unread count forgets items read one by one
    "fcm_project_random",  # each send picks an FCM project by notification, not by user
    "invalidator_ignores_modify",  # the stream invalidator skips MODIFY records (updates)
    "erasure_rows_first",  # erasure deletes rows before dedup keys: a retry cannot find them
    "deferral_acks_without_requeue",  # quiet hours: the job is acknowledged, never re-enqueued
    "dead_token_kept",  # a 410 / UNREGISTERED never deactivates the device
    "audit_first_copy_only",  # a redelivered copy (receive count > 1) leaves no audit record
    "erasure_keeps_audit_key",  # erasure leaves the user's audit data key: their trail readable
    "sms_ignores_opt_out",  # SMS published without asking SNS whether the number opted out
    "poison_retried",  # a malformed job retried like a transient failure: the retry DLQ, not poison
    "inbox_ttl_in_milliseconds",  # inbox rows' TTL in epoch ms: DynamoDB never expires them
    "fallback_sent_without_ttl",  # the fallback dedup store's 'sent' marks carry no TTL
    "daily_cap_off_by_one",  # the daily cap admits one more per (device, kind, local day)
    "daily_cap_day_in_utc",  # the daily cap's day is the UTC date, not the user's local date
    "audit_until_naive",  # a deferral's audit record names its release without a UTC offset
    "inbox_ttl_not_enabled",  # provisioning never enables TTL on the inbox: its rows never expire
    "consent_ignores_revoked_at",  # a push or email consent record with revoked_at still grants
    "push_switch_ignored",  # a user who turned push off (channels.push false) still gets pushes
    "channel_switch_ignored",  # email, in-app and SMS sent to a user who switched that channel off
    "read_flags_ignore_watermark",  # inbox pages flag items read only one by one, not read-all
    "audit_sent_before_answer",  # a send audited 'sent' whatever the provider answered (a 429)
    "erasure_skips_celebrity_pages",  # erasure forgets follows made past the threshold
    # Red team 3 (docs/PROMISES.md):
    "unread_ignores_celebrity_pointers",  # the unread count reads the user's own rows only
    "ses_5xx_rejected",  # an SES 500/503 acknowledged as a rejection (only throttling retried)
    "send_batch_ignores_failed",  # SendMessageBatch's Failed entries dropped (HTTP 200 = sent)
    "audit_at_event_time",  # audit records stamped with the event's acceptance, not the attempt
    "next_cursor_from_own_rows",  # a next page only when the reader's own rows filled this one
    "event_ids_in_whole_seconds",  # minted ids from int(seconds): python-ulid reads ms, 1970
    "erasure_skips_channel_keys",  # erasure purges the push dedup keys only
    "followed_cache_kept_at_threshold",  # crossing the threshold drops only new followers' cache
    "reregistered_endpoint_stays_disabled",  # a device registered again: Enabled not set true
    "slow_consumer",  # one push job in ten put back, unacknowledged, for 75 s before its send
    "dedup_fail_open_on_timeout",  # a dedup store that times out is taken as "not sent": sends
    "push_reorders_per_author",  # every other post of an author held 20 s: the next overtakes it
    # Two mechanisms behind one promise, each shown alone by a fault that takes the other away:
    "no_write_through",  # the Event API leaves the preferences cache alone: the stream alone
    "dead_token_registry_not_updated",  # a dead answer remembered, the user's record left active
    "fcm_quota_unpaced",  # the FCM quota known, sends not paced to it: bursts the project refuses
    "fcm_quota_per_hour",  # the FCM quota read as per hour: a backlog paced at 1/60 of it
)


class ConfigError(ValueError):
    """A config file is missing, unreadable or holds a bad value."""


def _channels_by_kind(value: Any) -> dict[str, tuple[str, ...]]:
    if not isinstance(value, dict):
        raise ConfigError("channels_by_kind must map event kinds to lists of channels")
    out: dict[str, tuple[str, ...]] = {}
    for kind, channels in value.items():
        if (
            not isinstance(channels, list | tuple)
            or not channels
            or any(c not in CHANNELS for c in channels)
            or len(set(channels)) != len(channels)
        ):
            raise ConfigError(
                f"channels_by_kind[{kind!r}] must be a non-empty list of distinct channels "
                f"from {', '.join(CHANNELS)}"
            )
        out[str(kind)] = tuple(channels)
    return out


@dataclass(frozen=True)
class Config:
    region: str = "us-east-1"
    # None means "the real AWS endpoint for the region".
    dynamodb_endpoint: str | None = None
    kinesis_endpoint: str | None = None
    sqs_endpoint: str | None = None
    s3_endpoint: str | None = None
    aws_access_key_id: str | None = None
    aws_secret_access_key: str | None = None
    # The delivery path's SQS and DynamoDB calls through the lean JSON client
    # (reference_impl/aws_json.py, a fraction of botocore's CPU per call); false: boto3 for all.
    aws_lean_client: bool = True
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_timeout_seconds: float = 1.0
    # MemoryDB cluster mode / Redis Cluster: redis_url names any one node.
    redis_cluster: bool = False
    table_prefix: str = "fanout"
    stream_name: str = "fanout-events"
    stream_shards: int = 2
    queue_prefix: str = "fanout"
    celebrity_threshold: int = 10_000
    # Followers per stored page (one DynamoDB item; 1,000 ids of up to 64 bytes stay far
    # below the 400 KB item limit), and page keys a fan-out walk task lists before it hands
    # the rest of the list on.
    follower_page_size: int = 1000
    pages_per_walk: int = 10
    fanout_page_threads: int = 2
    # A page task is a thousand jobs, not one: it gets a visibility timeout long enough to
    # finish before another worker sees it again (a second copy re-enqueues the whole page).
    page_task_visibility_seconds: int = 120
    # Visibility timeout of the channel queues: how long a failed job waits before retry.
    visibility_timeout_seconds: int = 10
    max_receive_count: int = 3
    # A dedup lease covers one send; it must outlast the provider call, not the whole job.
    dedup_lease_seconds: int = 30
    # Seed: on a sustained dedup-store outage, consent-bearing channels fall back to a
    # DynamoDB conditional put. Off by default: the scenarios compare both.
    dedup_fallback: bool = False
    dedup_fallback_errors: int = 3
    dedup_fallback_hold_seconds: float = 5.0
    apns_url: str = "https://api.push.apple.com"
    apns_ca_file: str | None = None
    apns_topic: str = "com.example.fanout"
    # Token authentication (Apple's .p8 signing key, its key id and the team id): every push
    # carries an ES256 provider token, renewed every 50 minutes. None: no token (a provider
    # that takes certificate authentication only).
    apns_key_file: str | None = None
    apns_key_id: str | None = None
    apns_team_id: str | None = None
    fcm_url: str = "https://fcm.googleapis.com"
    fcm_projects: tuple[str, ...] = ("fanout-sender-0",)
    # A Google service-account file (JSON: client_email, private_key, token_uri): the FCM
    # client gets OAuth2 access tokens by the JWT-bearer grant, as google-auth does. None: no
    # token (a provider that asks for none).
    fcm_credentials_file: str | None = None
    # How pushes leave (seed 004): "sns" publishes to SNS mobile push platform endpoints (one
    # APNs platform application, one FCM application per sender project; SNS owns the token
    # lifecycle and turns an endpoint off on a dead answer), "direct" calls APNs and FCM.
    push_transport: str = "direct"
    # The SNS endpoint (None: the region's real one) and the prefix of the platform
    # applications' names: <prefix>-apns, <prefix>-fcm-<project> (reference_impl/sns_push.py).
    sns_endpoint: str | None = None
    sns_application_prefix: str = "fanout"
    provider_timeout_seconds: float = 5.0
    # SES v2 (email) and the API Gateway Management API of the WebSocket API (in-app). None:
    # SES's regional endpoint; the in-app channel needs its https://<api>.execute-api.../<stage>.
    ses_url: str | None = None
    ses_from_address: str = "notifications@example.com"
    ses_configuration_set: str | None = None
    inapp_url: str | None = None
    # SNS (the SMS channel: Publish with PhoneNumber). None: SNS's regional endpoint.
    sns_endpoint: str | None = None
    sms_sender_id: str | None = "FANOUT"
    sms_type: str = "Transactional"
    channels_by_kind: dict[str, tuple[str, ...]] = field(
        default_factory=lambda: dict(DEFAULT_CHANNELS_BY_KIND)
    )
    # Back-pressure valves per consumer process: in-flight requests per provider scope, an
    # optional send-rate cap, and the longest retry delay set on a failed job.
    provider_max_in_flight: int = 32
    provider_max_rate_per_s: float | None = None
    # The FCM quota of each sender project (messages a minute; Google's default 600,000): the
    # push consumer paces each project's sends to it, all its processes together, so that a
    # backlog is bled out at the rate FCM takes rather than sent in bursts it answers 429 to.
    # None: not known, not paced.
    fcm_quota_per_minute: int | None = None
    retry_backoff_max_seconds: int = 30
    consumer_threads: int = 4
    # Push consumer processes (Lambda's concurrent instances), each with consumer_threads
    # pollers: one Python process is one core at most. More than one: a supervisor forks them
    # (reference_impl/worker_processes.py); the back-pressure gate is per process, a rate cap
    # is shared out among them.
    push_consumer_processes: int = 1
    # Rate limits (seed 000: a sliding window per (user, channel), the excess collapsed into one
    # digest; seed 002: a cap per (user device, notification kind, local day)). 0 = off, the
    # default, so the scenarios that do not ask for limits are never limited.
    rate_limit_per_window: int = 0
    rate_limit_window_seconds: int = 60
    daily_limit_per_device_type: int = 0
    # Audit trail (seed 000, NIST AU-2/AU-9): every outcome as a JSON line, batched to an S3
    # bucket with Object Lock in COMPLIANCE mode. None: the audit goes to the process log only.
    # A real bucket's objects cannot be deleted by anyone until the retention has passed.
    audit_bucket: str | None = None
    audit_flush_records: int = 500
    audit_flush_seconds: float = 5.0
    audit_retention_days: int = 365
    # Store a batch's records before the batch is acknowledged (SQS delete, shard checkpoint):
    # nothing is lost to a kill -9, for one PUT per batch (group-committed across threads).
    # Off: up to audit_flush_seconds of records die with a crashed worker.
    audit_flush_before_ack: bool = False
    defects: tuple[str, ...] = ()
    event_api_host: str = "127.0.0.1"
    event_api_port: int = 8080
    # Processes serving the local API Gateway's port (Lambda's concurrent instances): one
    # Python process is one core at most, whatever its threads.
    event_api_processes: int = 1
    # How often the stream invalidator reads each shard of the preferences table's stream:
    # Lambda's event-source mapping polls a DynamoDB stream's shards 4 times a second.
    stream_poll_interval_seconds: float = 0.25
    # The local API Gateway's limits (reference_impl.api_gateway): how long a request's headers
    # or body may take to arrive, how long an idle keep-alive connection stays open, how many
    # connections a process keeps open, and the threads that run the handler (boto3 blocks).
    event_api_read_timeout_seconds: float = 10.0
    event_api_keep_alive_seconds: float = 60.0
    event_api_max_connections: int = 4096
    event_api_threads: int = 16
    extra: dict[str, Any] = field(default_factory=dict)

    def table(self, name: str) -> str:
        return f"{self.table_prefix}-{name}"

    def queue_name(self, channel: str, suffix: str = "") -> str:
        """``channel`` is one of CHANNELS, or PAGES_QUEUE (the fan-out's own page tasks)."""
        return f"{self.queue_prefix}-{channel}{suffix}"

    def channels_for(self, kind: str) -> tuple[str, ...]:
        return self.channels_by_kind.get(kind, ("push",))

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_mapping(cls, data: dict[str, Any]) -> Config:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown config keys: {', '.join(unknown)}")
        values = dict(data)
        if "fcm_projects" in values:
            projects = values["fcm_projects"]
            if not isinstance(projects, list | tuple) or not projects:
                raise ConfigError("fcm_projects must be a non-empty list of project ids")
            values["fcm_projects"] = tuple(str(p) for p in projects)
        if "defects" in values:
            unknown_defects = sorted(set(values["defects"]) - set(DEFECTS))
            if unknown_defects:
                raise ConfigError(
                    f"unknown defect(s) {', '.join(unknown_defects)}; known: {', '.join(DEFECTS)}"
                )
            values["defects"] = tuple(values["defects"])
        if "channels_by_kind" in values:
            values["channels_by_kind"] = _channels_by_kind(values["channels_by_kind"])
        config = cls(**values)
        if config.celebrity_threshold < 1:
            raise ConfigError("celebrity_threshold must be at least 1")
        if config.max_receive_count < 1:
            raise ConfigError("max_receive_count must be at least 1")
        quota = config.fcm_quota_per_minute
        if quota is not None and (
            isinstance(quota, bool) or not isinstance(quota, int) or quota < 1
        ):
            raise ConfigError("fcm_quota_per_minute must be null or an integer >= 1")
        for name in ("rate_limit_per_window", "daily_limit_per_device_type"):
            value = getattr(config, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"{name} must be an integer >= 0 (0 = off)")
        seconds = config.rate_limit_window_seconds
        if isinstance(seconds, bool) or not isinstance(seconds, int) or seconds < 1:
            raise ConfigError("rate_limit_window_seconds must be an integer >= 1")
        for name in (
            "audit_flush_records",
            "audit_retention_days",
            "follower_page_size",
            "pages_per_walk",
            "fanout_page_threads",
            "page_task_visibility_seconds",
            "event_api_processes",
            "push_consumer_processes",
            "consumer_threads",
            "event_api_max_connections",
            "event_api_threads",
        ):
            value = getattr(config, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be an integer >= 1")
        if config.sms_type not in SMS_TYPES:
            raise ConfigError(f"sms_type must be one of {', '.join(SMS_TYPES)}")
        sender = config.sms_sender_id
        if sender is not None and not (isinstance(sender, str) and _SENDER_ID.fullmatch(sender)):
            raise ConfigError(
                "sms_sender_id must be null or 1-11 letters or digits with at least one letter"
            )
        if config.push_transport not in PUSH_TRANSPORTS:
            raise ConfigError(f"push_transport must be one of {', '.join(PUSH_TRANSPORTS)}")
        for name in ("audit_flush_before_ack", "aws_lean_client"):
            if not isinstance(getattr(config, name), bool):
                raise ConfigError(f"{name} must be true or false")
        for name in ("audit_flush_seconds", "stream_poll_interval_seconds"):
            value = getattr(config, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ConfigError(f"{name} must be a number > 0")
        for name in ("event_api_read_timeout_seconds", "event_api_keep_alive_seconds"):
            value = getattr(config, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not 0 < value <= 3600
            ):
                raise ConfigError(f"{name} must be a number of seconds > 0 and <= 3600")
        return config

    @classmethod
    def load_for_main(cls, path: str | Path | None = None) -> Config | None:
        """A process's config, or None after saying on stderr what is wrong with it (every
        reference process then exits 2: bad input)."""
        try:
            return cls.load(path)
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return None

    @classmethod
    def load(cls, path: str | Path | None = None) -> Config:
        path = path or os.environ.get("FANOUT_CONFIG")
        if not path:
            raise ConfigError("no config: pass --config FILE or set FANOUT_CONFIG")
        try:
            data = json.loads(Path(path).read_text())
        except FileNotFoundError as exc:
            raise ConfigError(f"config file {path} does not exist") from exc
        except json.JSONDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"config file {path} must hold a JSON object")
        return cls.from_mapping(data)
