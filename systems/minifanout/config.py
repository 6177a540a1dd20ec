"""The command line and the configuration it yields; every bad value is refused with a sentence
(exit 2) before anything starts."""

from __future__ import annotations

import argparse
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

#: The deliberate bugs, each what it breaks. Off by default; ``--bugs a,b`` switches them on.
BUGS: dict[str, str] = {
    "no_dedup": "the consumer sends without claiming the job in the dedup store: every SQS "
    "redelivery is sent again",
    "fail_open": "a dedup-store error sends anyway instead of leaving the job on the queue",
    "ack_before_send": "the job is deleted from the queue before it is sent: a provider error "
    "loses it",
    "quiet_hours_utc": "quiet hours are compared with the UTC clock, not the user's zone",
    "consent_default_allow": "a user without a consent record gets pushes",
    "keep_dead_tokens": "a token the provider calls dead (410 / UNREGISTERED) stays active",
    "no_id_check": "a job whose notification id is no ULID is sent, not set aside as poison",
    "dedup_short_ttl": "a 'sent' claim lives an hour, not 30 days: a provider retry after that "
    "is sent again",
}

#: How a person's FCM sender project is chosen among ``--fcm-projects`` (sticky either way).
FCM_MAPPINGS = ("digits-mod", "crc32")

ROLES = ("both", "api", "consumer")
DEFAULT_QUEUE = "mini-deliveries"
DEAD_SUFFIX = "-dead"


@dataclass(frozen=True)
class Config:
    redis_url: str
    dedup_redis_url: str
    sqs_endpoint: str | None
    region: str
    queue: str
    apns_url: str
    apns_ca_file: Path | None
    apns_topic: str
    # (the .p8 file, key id, team id): every push carries an ES256 provider token
    apns_key: tuple[Path, str, str] | None
    fcm_credentials: Path | None
    fcm_url: str
    fcm_projects: tuple[str, ...]
    host: str
    port: int
    bugs: frozenset[str]
    role: str = "both"
    workers: int = 4
    visibility_timeout_s: int = 20
    # A claim's lease must outlast the longest send (the provider timeout), so that only one
    # copy of a job is ever in flight at a provider; a consumer killed mid-send frees it when
    # the lease ends.
    provider_timeout_s: float = 10.0
    lease_s: float = 15.0
    max_receives: int = 3
    # Where malformed jobs go (a poison queue); None: the dead-letter queue takes them too.
    poison_queue: str | None = None
    fcm_mapping: str = "digits-mod"

    @property
    def dead_queue(self) -> str:
        return self.queue + DEAD_SUFFIX

    def bug(self, name: str) -> bool:
        return name in self.bugs


class BadConfig(ValueError):
    """A command line that cannot be used, with what is wrong in it."""


def _url(value: str, option: str, schemes: tuple[str, ...]) -> str:
    parts = urlsplit(value)
    if parts.scheme not in schemes or not parts.hostname:
        raise BadConfig(f"{option}: expected a {'/'.join(schemes)} URL, got {value!r}")
    try:
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError as exc:
        raise BadConfig(f"{option}: {exc} in {value!r}") from exc
    return value.rstrip("/")


def parse_bugs(value: str) -> frozenset[str]:
    names = frozenset(n.strip() for n in value.split(",") if n.strip())
    unknown = sorted(names - set(BUGS))
    if unknown:
        raise BadConfig(f"--bugs: unknown {', '.join(unknown)}; known: {', '.join(sorted(BUGS))}")
    return names


def _loopback(host: str) -> str:
    try:
        if host == "localhost" or ipaddress.ip_address(host).is_loopback:
            return host
    except ValueError:
        pass
    raise BadConfig(f"--host: the API listens on loopback only, not {host!r}")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m systems.minifanout",
        description="minifanout: a small push fan-out system (API and one consumer).",
    )
    p.add_argument("--redis", required=True, help="redis:// URL of the data store")
    p.add_argument("--dedup-redis", help="redis:// URL of the dedup store (default: --redis)")
    p.add_argument("--sqs-endpoint", help="SQS endpoint URL (default: the region's AWS SQS)")
    p.add_argument("--region", default="us-east-1")
    p.add_argument("--queue", default=DEFAULT_QUEUE, help=f"push queue (its DLQ: +{DEAD_SUFFIX})")
    p.add_argument("--apns-url", required=True, help="APNs base URL (http:// is h2c)")
    p.add_argument("--apns-ca-file", type=Path, help="CA bundle that signed the APNs server")
    p.add_argument("--apns-topic", default="com.example.minifanout")
    p.add_argument(
        "--apns-key",
        type=Path,
        help="the team's APNs signing key (.p8); with --apns-key-id and --apns-team-id",
    )
    p.add_argument("--apns-key-id", help="the signing key's id (10 characters)")
    p.add_argument("--apns-team-id", help="the team's id (10 characters)")
    p.add_argument("--fcm-url", required=True, help="FCM HTTP v1 base URL")
    p.add_argument(
        "--fcm-credentials",
        type=Path,
        help="a Google service-account file: OAuth2 tokens from its token_uri",
    )
    p.add_argument(
        "--fcm-projects",
        default="minifanout",
        help="comma-separated FCM sender projects; a person always uses the same one",
    )
    p.add_argument(
        "--fcm-mapping",
        choices=FCM_MAPPINGS,
        default="digits-mod",
        help="a person's project: the digits of their id mod K, or crc32(id) mod K",
    )
    p.add_argument("--poison-queue", help="queue for malformed jobs (default: the dead queue)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, help="the API's port (required unless --role consumer)")
    p.add_argument("--bugs", default="", help=f"comma-separated: {', '.join(BUGS)}")
    p.add_argument("--role", choices=ROLES, default="both", help="what this process runs")
    p.add_argument("--workers", type=int, default=4, help="concurrent receive loops")
    p.add_argument("--visibility-timeout", type=int, default=20, help="seconds")
    return p


def config_from_args(args: argparse.Namespace) -> Config:
    redis_schemes = ("redis", "rediss", "unix")
    redis_url = _url(args.redis, "--redis", redis_schemes)
    dedup = _url(args.dedup_redis, "--dedup-redis", redis_schemes) if args.dedup_redis else None
    sqs = (
        _url(args.sqs_endpoint, "--sqs-endpoint", ("http", "https")) if args.sqs_endpoint else None
    )
    if args.role != "consumer" and args.port is None:
        raise BadConfig("--port is required unless --role consumer")
    if args.port is not None and not 1 <= args.port <= 65535:
        raise BadConfig(f"--port: {args.port} is not a TCP port")
    if args.apns_ca_file is not None and not args.apns_ca_file.is_file():
        raise BadConfig(f"--apns-ca-file: {args.apns_ca_file} is not a readable file")
    apns_key = (args.apns_key, args.apns_key_id, args.apns_team_id)
    if any(apns_key) and not all(apns_key):
        raise BadConfig("--apns-key, --apns-key-id and --apns-team-id go together")
    if args.apns_key is not None and not args.apns_key.is_file():
        raise BadConfig(f"--apns-key: {args.apns_key} is not a readable file")
    if args.fcm_credentials is not None and not args.fcm_credentials.is_file():
        raise BadConfig(f"--fcm-credentials: {args.fcm_credentials} is not a readable file")
    if not 1 <= args.workers <= 64:
        raise BadConfig("--workers: between 1 and 64")
    if not 5 <= args.visibility_timeout <= 43200:
        raise BadConfig("--visibility-timeout: between 5 and 43200 seconds")
    if not args.queue or len(args.queue) + len(DEAD_SUFFIX) > 80:
        raise BadConfig("--queue: 1 to 75 characters")
    projects = tuple(p.strip() for p in args.fcm_projects.split(",") if p.strip())
    if not projects:
        raise BadConfig("--fcm-projects: at least one project")
    if args.poison_queue is not None and not 1 <= len(args.poison_queue) <= 80:
        raise BadConfig("--poison-queue: 1 to 80 characters")
    return Config(
        redis_url=redis_url,
        dedup_redis_url=dedup or redis_url,
        sqs_endpoint=sqs,
        region=args.region,
        queue=args.queue,
        apns_url=_url(args.apns_url, "--apns-url", ("http", "https")),
        apns_ca_file=args.apns_ca_file,
        apns_topic=args.apns_topic,
        apns_key=(args.apns_key, args.apns_key_id, args.apns_team_id) if args.apns_key else None,
        fcm_url=_url(args.fcm_url, "--fcm-url", ("http", "https")),
        fcm_credentials=args.fcm_credentials,
        fcm_projects=projects,
        fcm_mapping=args.fcm_mapping,
        poison_queue=args.poison_queue,
        host=_loopback(args.host),
        port=args.port or 0,
        bugs=parse_bugs(args.bugs),
        role=args.role,
        workers=args.workers,
        visibility_timeout_s=args.visibility_timeout,
    )
