"""Target files: point the harness at a system other than the embedded reference.

A target file (YAML) names the system's Event/Inbox API, the Redis its dedup store really is
and the address the system was configured to reach it at (the harness puts its fault proxy
there, or uses a Toxiproxy you already run), the AWS endpoints, region and queue prefix, and
the addresses the system sends its APNs and FCM traffic to (the harness serves its provider
simulators there). Example, with every key: ``targets/example.yaml``.

Load and faults go only to loopback unless the file says ``allow_remote: true``: a game day
against a shared environment is a decision someone writes down.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from harness.contract.clock import SystemClock
from harness.contract.driver import load_driver, named
from harness.contract.system import (
    DEFAULT_JOB_FIELDS,
    DEFAULT_JOB_TEMPLATE,
    JOB_FIELDS,
    TEMPLATE_VALUES,
    TTL_PURPOSES,
    AuditSource,
    JobTemplate,
    Queues,
    SystemContract,
    TtlTable,
    job_reader,
)
from harness.model.system import SystemPolicy
from harness.run.audit_trail import read_team_trail


class TargetError(ValueError):
    """A target file that cannot be used, with what is wrong in it."""


# Where the simulators read a push's ids unless a target says otherwise (the same defaults as
# emulators/providers/ledger.py, which imports nothing of the harness).
DEFAULT_PAYLOAD_IDS: dict[str, dict[str, str]] = {
    "apns": {"tenant_id": "tenant_id", "notification_id": "notification_id"},
    "fcm": {
        "tenant_id": "message.data.tenant_id",
        "notification_id": "message.data.notification_id",
    },
}


def job_template_of(value: Any) -> JobTemplate:
    """A target's ``job_template``: ``{body, platforms}``, or the body itself."""
    if isinstance(value, dict) and "body" in value and set(value) <= {"body", "platforms"}:
        return JobTemplate(value["body"], dict(value.get("platforms") or {}))
    return JobTemplate(value)


@dataclass(frozen=True)
class Target:
    name: str
    event_api: str
    region: str = "us-east-1"
    sqs_endpoint: str | None = None
    # Its DynamoDB (omit for the region's real one): read only for ttl_tables.
    dynamodb_endpoint: str | None = None
    aws_access_key_id: str | None = None
    aws_secret_access_key: str | None = None
    queue_prefix: str = "fanout"
    # host:port of the Redis behind the system's dedup store, and host:port where the system
    # was told to find it: the harness's fault proxy listens there.
    dedup_redis: str | None = None
    dedup_listen: str | None = None
    # Or: a Toxiproxy already in front of the dedup store (then the two above are not used).
    toxiproxy_url: str | None = None
    dedup_proxy: str = "dedup"
    # Where the system sends provider traffic: the harness serves its simulators there.
    apns_listen: str | None = None
    apns_tls: bool = False
    # The app bundle its pushes name (apns-topic): the harness's APNs simulator binds the run's
    # device tokens to it, as Apple binds a token to the app it was issued for. Omitted: any
    # bundle of the team passes.
    apns_topic: str | None = None
    # Its own APNs signing keys, as registered with Apple: [{file: AuthKey_X.p8 (or a public
    # key PEM), key_id, team_id}]. Omitted: it signs with the environment's key
    # (<env dir>/apns/AuthKey_FANOUTKEY1.p8, key id FANOUTKEY1, team FANOUTTEAM).
    apns_keys: list[dict[str, str]] | None = None
    fcm_listen: str | None = None
    # Optional: host:port where the system was told to find SNS (it publishes its pushes to SNS
    # mobile push): the harness serves its SNS endpoint there, delivering to its APNs and FCM
    # simulators (and the platform applications' events to sqs_endpoint), and reads its
    # publish ledger. The system creates its platform applications and endpoints against it.
    sns_listen: str | None = None
    # Optional: host:port where the system was told to find SQS: the harness serves its SQS
    # endpoint there (the system's queues, the receive log, SQS faults); sqs_endpoint and
    # sqs_control default to it. Long-lived with `harness env up`.
    sqs_listen: str | None = None
    # Toxiproxy-style proxies for any TCP dependency of the system (its data store, its queue,
    # a cache): name -> {listen: host:port the system was told, upstream: host:port of the real
    # dependency}. The faults proxy-down, proxy-latency and proxy-timeout name one (params
    # {proxy: name}); the dedup store's proxy stays dedup_listen / dedup_redis.
    proxies: dict[str, dict[str, str]] | None = None
    # Optional process hooks, as Jepsen gives every database kill/start/pause: per role (the
    # process faults name roles: consumer-crash kills ``push-consumer``), shell commands run on
    # this machine: {kill, start, pause, resume}; kill and start at least.
    processes: dict[str, dict[str, str]] | None = None
    # Or: the URL of the harness's SNS endpoint already running beside the system (`python -m
    # harness serve sns`, long-lived, so the system's platform applications outlive a run): the
    # harness reads its ledger and injects its faults there, and starts none of its own.
    sns_endpoint: str | None = None
    # Optional: host:port where the system's Kinesis consumer was told to find Kinesis (the
    # harness serves its AWS fault proxy there) and the URL of the Kinesis it forwards to.
    # Without them the kinesis-shard-hold fault is not available on this target.
    kinesis_listen: str | None = None
    kinesis_upstream: str | None = None
    allow_remote: bool = False
    # The system's contract (harness/contract/): the driver class for its API and its options
    # (default: the Event API driver), its queues by channel (default: the queue_prefix naming,
    # <prefix>-<channel>, -dlq, -poison), where a parked job names its tenant, notification and
    # recipient, and its stated policies (harness/model/system.py).
    driver: str | None = None
    driver_options: dict[str, Any] | None = None
    queues: dict[str, Any] | None = None
    # Where a job names its tenant, notification and recipient: dotted paths into its JSON
    # body (``job.nid``); default the reference's top-level tenant_id, notification_id,
    # recipient_user_id.
    job_fields: dict[str, str] | None = None
    # A well-formed job of its schema with ${tenant}, ${notification}, ${recipient}, ${author},
    # ${token}, ${platform} placeholders: either the body itself, or {body, platforms} with the
    # platforms in its own words ({apns: ios, fcm: android}). Without it (and with job_fields
    # of its own), inject-malformed-jobs cannot send a job wrong in its id only, and says so.
    job_template: dict[str, Any] | None = None
    # Where its pushes name their tenant and notification: per provider, dotted paths into the
    # APNs payload and into the FCM HTTP v1 request body. Defaults: APNs top-level tenant_id /
    # notification_id, FCM message.data.tenant_id / message.data.notification_id.
    payload_ids: dict[str, dict[str, str]] | None = None
    policy: dict[str, Any] | None = None
    # The control API of the SQS endpoint the system uses, when it is the harness's own
    # (SQS faults, and the receive log per-copy audit accounting reads).
    sqs_control: str | None = None
    # DynamoDB tables whose items' TTL attribute (epoch seconds) the harness reads at the end:
    # a list of {purpose: inbox | dedup_fallback, table, attribute (default expires_at),
    # id_attribute (the item's notification id, optional)}. None: ttl_attributes is off.
    ttl_tables: list[dict[str, Any]] | None = None
    # A wall clock the harness can move (capability ``clock``, harness/contract/clock.py): the
    # file the system's processes read their offset from, every process started under
    # libfaketime with FAKETIME_TIMESTAMP_FILE=<this path>, FAKETIME_CACHE_DURATION=1 and
    # DONT_FAKE_MONOTONIC=1. The harness writes "+<seconds>s" there. None: the clock is fixed,
    # and a scenario that moves it ends "unknown".
    clock_file: str | None = None
    # A team's own Python functions (``package.module:function``, Chaos Toolkit style) for what
    # the harness cannot read on its own: ``audit_trail`` () -> iterable of audit records (the
    # trail's records, read once the run has ended), ``table_writer`` (tenant, user,
    # preferences) -> None (a write to its preferences store bypassing its API),
    # ``erasure_done`` (tenant, user) -> bool (an erasure run as a job has completed).
    hooks: dict[str, str] | None = None

    def contract(self, info: Any) -> SystemContract:
        """What the verifier may know of this system (``info``: the stack's StackInfo)."""
        driver = load_driver(self.driver, self.driver_options)
        policy = SystemPolicy.from_mapping(self.policy or {})
        hooks = {k: named(v, f"hooks.{k}", "package.module:function")
                 for k, v in (self.hooks or {}).items()}  # fmt: skip
        audit = None
        if "audit_trail" in hooks:
            spec = (self.hooks or {})["audit_trail"]

            def read_trail(history: Any) -> int:
                return read_team_trail(history, hooks["audit_trail"](), spec)

            audit = AuditSource(read_trail, format=f"records from {spec}")
        sns = self.sns_endpoint or (f"http://{self.sns_listen}" if self.sns_listen else None)
        return SystemContract(
            name=self.name,
            api_url=self.event_api.rstrip("/"),
            driver=driver,
            policy=policy,
            queues=self._queues() if self.sqs_endpoint else None,
            sqs_log_url=self.sqs_control,
            ttl_tables=tuple(TtlTable(**t) for t in self.ttl_tables or ()),
            # Its keys' TTLs are read only when the target says which keys are its dedup keys.
            dedup_store_url=(
                f"redis://{self.dedup_redis}/0"
                if self.dedup_redis and "dedup_key_pattern" in (self.policy or {})
                else None
            ),
            clock=SystemClock(Path(self.clock_file)) if self.clock_file else None,
            audit=audit,
            table_writer=hooks.get("table_writer"),
            erasure_done=hooks.get("erasure_done"),
            # It texts through the harness's SNS endpoint: SNS's SMS ledger is the carrier's.
            sms_ledger_url=sns,
        )

    def job_template_value(self) -> JobTemplate | None:
        """The stated job template; the reference's when the target states neither a template
        nor job fields of its own (its jobs are then the reference's)."""
        if self.job_template is not None:
            return job_template_of(self.job_template)
        return None if self.job_fields else DEFAULT_JOB_TEMPLATE

    def _queues(self) -> Queues:
        read_job = job_reader({**DEFAULT_JOB_FIELDS, **(self.job_fields or {})})
        template = self.job_template_value()
        if self.queues:
            work = {k: str(v) for k, v in self.queues.get("work", {}).items()}
            dead = {k: str(v) for k, v in self.queues.get("dead", {}).items()}
            poison = {k: str(v) for k, v in self.queues.get("poison", {}).items()}
            return Queues(work, dead, poison, read_job, template)
        channels = ("push", "email", "in_app", "sms", "pages")
        return Queues(
            work={c: f"{self.queue_prefix}-{c}" for c in channels},
            dead={c: f"{self.queue_prefix}-{c}-dlq" for c in channels},
            poison={c: f"{self.queue_prefix}-{c}-poison" for c in channels},
            read_job=read_job,
            job_template=template,
        )

    def payload_paths(self, provider: str) -> dict[str, str]:
        """Where its pushes to ``provider`` name their ids (the simulators read them there)."""
        return {**DEFAULT_PAYLOAD_IDS[provider], **(self.payload_ids or {}).get(provider, {})}


def _host_port(value: str, key: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise TargetError(f"{key}: expected host:port, got {value!r}")
    return host.strip("[]"), int(port)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def port_of(value: str, key: str) -> int:
    return _host_port(value, key)[1]


def parse(data: Any, where: str) -> Target:
    if not isinstance(data, dict):
        raise TargetError(f"{where}: a target file holds a mapping")
    known = {f.name for f in fields(Target)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise TargetError(
            f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    # The provider simulators' ledgers are what the checkers read: without them nothing can
    # be said about deliveries.
    for key in ("name", "event_api", "apns_listen", "fcm_listen"):
        if not data.get(key):
            raise TargetError(f"{where}: {key} is required")
    for i, table in enumerate(data.get("ttl_tables") or []):
        if (
            not isinstance(table, dict)
            or set(table) - {"purpose", "table", "attribute", "id_attribute"}
            or table.get("purpose") not in TTL_PURPOSES
            or not isinstance(table.get("table"), str)
        ):
            raise TargetError(
                f"{where}: ttl_tables[{i}] must be {{purpose: {' | '.join(TTL_PURPOSES)}, "
                "table, attribute, id_attribute}"
            )
    _check_job_schema(data, where)
    _check_payload_ids(data.get("payload_ids"), where)
    _check_proxies(data.get("proxies"), where)
    _check_apns_keys(data.get("apns_keys"), where)
    _check_processes(data.get("processes"), where)
    hooks = data.get("hooks")
    if hooks is not None and (not isinstance(hooks, dict) or set(hooks) - set(HOOKS)):
        raise TargetError(f"{where}: hooks names {', '.join(HOOKS)} (package.module:function)")
    if data.get("sqs_listen"):
        # The harness's own SQS endpoint serves there: the system's SQS and its control API.
        url = f"http://{data['sqs_listen']}"
        data = {"sqs_endpoint": url, "sqs_control": url, **data}
    target = Target(**data)
    try:
        target.contract(None)
    except ValueError as exc:  # a driver that cannot be loaded, a policy key it does not know
        raise TargetError(f"{where}: {exc}") from exc
    if target.queues is not None:
        bad = sorted(set(target.queues) - {"work", "dead", "poison"})
        if bad or not isinstance(target.queues.get("work", {}), dict):
            raise TargetError(
                f"{where}: queues holds work, dead and poison mappings (channel -> name)"
            )
    hosts: list[tuple[str, str]] = [("event_api", urlsplit(target.event_api).hostname or "")]
    if not urlsplit(target.event_api).scheme.startswith("http"):
        raise TargetError(f"{where}: event_api must be an http(s) URL")
    if target.sqs_endpoint:
        hosts.append(("sqs_endpoint", urlsplit(target.sqs_endpoint).hostname or ""))
    if target.dynamodb_endpoint:
        hosts.append(("dynamodb_endpoint", urlsplit(target.dynamodb_endpoint).hostname or ""))
    if target.toxiproxy_url:
        hosts.append(("toxiproxy_url", urlsplit(target.toxiproxy_url).hostname or ""))
    elif bool(target.dedup_redis) != bool(target.dedup_listen):
        raise TargetError(f"{where}: dedup_redis and dedup_listen go together")
    if target.sns_listen and target.sns_endpoint:
        raise TargetError(f"{where}: sns_listen and sns_endpoint exclude each other")
    if target.sns_endpoint:
        if not urlsplit(target.sns_endpoint).scheme.startswith("http"):
            raise TargetError(f"{where}: sns_endpoint must be an http(s) URL")
        hosts.append(("sns_endpoint", urlsplit(target.sns_endpoint).hostname or ""))
    if bool(target.kinesis_listen) != bool(target.kinesis_upstream):
        raise TargetError(f"{where}: kinesis_listen and kinesis_upstream go together")
    if target.kinesis_upstream:
        upstream = urlsplit(target.kinesis_upstream)
        if upstream.scheme not in ("http", "https") or not upstream.hostname:
            raise TargetError(f"{where}: kinesis_upstream must be an http(s) URL")
        hosts.append(("kinesis_upstream", upstream.hostname))
    listens = ("apns_listen", "fcm_listen", "kinesis_listen", "sns_listen", "sqs_listen")
    for key in ("dedup_redis", "dedup_listen", *listens):
        value = getattr(target, key)
        if value:
            hosts.append((key, _host_port(value, key)[0]))
    for name, proxy in (target.proxies or {}).items():
        hosts.append((f"proxies.{name}.upstream", _host_port(proxy["upstream"], "upstream")[0]))
    for key in ("dedup_listen", *listens):
        value = getattr(target, key)
        if value and not _is_loopback(_host_port(value, key)[0]):
            raise TargetError(f"{where}: {key} must be a loopback address the harness can bind")
    if not target.allow_remote:
        remote = [f"{key} ({host})" for key, host in hosts if not _is_loopback(host)]
        if remote:
            raise TargetError(
                f"{where}: {', '.join(remote)} not on loopback; load and faults go to another "
                "machine only with allow_remote: true in the target file"
            )
    return target


def _check_apns_keys(keys: Any, where: str) -> None:
    if keys is None:
        return
    shape = "apns_keys is a list of {file, key_id, team_id}"
    if not isinstance(keys, list):
        raise TargetError(f"{where}: {shape}")
    for i, key in enumerate(keys):
        if not isinstance(key, dict) or set(key) != {"file", "key_id", "team_id"}:
            raise TargetError(f"{where}: apns_keys[{i}]: {shape}")
        if not all(isinstance(v, str) and v for v in key.values()):
            raise TargetError(f"{where}: apns_keys[{i}]: file, key_id and team_id are strings")


def _dotted(value: Any) -> bool:
    return isinstance(value, str) and bool(value) and all(value.split("."))


def _check_job_schema(data: dict[str, Any], where: str) -> None:
    fields_ = data.get("job_fields")
    if fields_ is not None:
        if not isinstance(fields_, dict) or set(fields_) - set(JOB_FIELDS):
            raise TargetError(
                f"{where}: job_fields maps {', '.join(JOB_FIELDS)} to dotted paths in a job's "
                "JSON body (e.g. notification: job.nid)"
            )
        bad = [k for k, v in fields_.items() if not _dotted(v)]
        if bad:
            raise TargetError(
                f"{where}: job_fields {', '.join(bad)}: a dotted path such as job.nid"
            )
    if data.get("job_template") is None:
        return
    template = job_template_of(data["job_template"])
    named = template.placeholders()
    unknown = sorted(named - set(TEMPLATE_VALUES))
    if unknown:
        raise TargetError(
            f"{where}: job_template names ${{{unknown[0]}}}; it may name "
            + ", ".join(f"${{{v}}}" for v in TEMPLATE_VALUES)
        )
    if "notification" not in named:
        raise TargetError(f"{where}: job_template must carry ${{notification}} (the job's id)")
    if not isinstance(template.platforms, dict) or not all(
        isinstance(v, str) for v in template.platforms.values()
    ):
        raise TargetError(f"{where}: job_template platforms maps apns and fcm to its own words")


PROCESS_HOOKS = ("kill", "stop", "start", "pause", "resume")
HOOKS = ("audit_trail", "table_writer", "erasure_done")


def _check_proxies(value: Any, where: str) -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        raise TargetError(f"{where}: proxies maps a name to {{listen, upstream}}")
    for name, proxy in value.items():
        if name == "dedup":
            raise TargetError(f"{where}: proxies: dedup is the dedup store's (dedup_listen)")
        if not isinstance(proxy, dict) or set(proxy) != {"listen", "upstream"}:
            raise TargetError(
                f"{where}: proxies.{name} is {{listen: host:port, upstream: host:port}}"
            )
        for key in ("listen", "upstream"):
            _host_port(str(proxy[key]), f"proxies.{name}.{key}")
        if not _is_loopback(_host_port(str(proxy["listen"]), "listen")[0]):
            raise TargetError(f"{where}: proxies.{name}.listen must be a loopback address")


def _check_processes(value: Any, where: str) -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        raise TargetError(f"{where}: processes maps a role to shell commands {{kill, start, ...}}")
    for role, hooks in value.items():
        if not isinstance(hooks, dict) or set(hooks) - set(PROCESS_HOOKS):
            raise TargetError(
                f"{where}: processes.{role} holds shell commands named {', '.join(PROCESS_HOOKS)}"
            )
        if not {"kill", "start"} <= set(hooks) or not all(
            isinstance(c, str) and c.strip() for c in hooks.values()
        ):
            raise TargetError(f"{where}: processes.{role} needs kill and start commands at least")


def _check_payload_ids(value: Any, where: str) -> None:
    if value is None:
        return
    shape = (
        f"{where}: payload_ids maps apns and/or fcm to {{tenant_id, notification_id}} dotted "
        "paths (APNs: into the payload, e.g. meta.nid; FCM: into the request body, e.g. "
        "message.data.nid)"
    )
    if not isinstance(value, dict) or set(value) - set(DEFAULT_PAYLOAD_IDS):
        raise TargetError(shape)
    for paths in value.values():
        if not isinstance(paths, dict) or set(paths) - {"tenant_id", "notification_id"}:
            raise TargetError(shape)
        if not all(_dotted(p) for p in paths.values()):
            raise TargetError(shape)


def load(path: Path) -> Target:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError as exc:
        raise TargetError(f"no target file {path}") from exc
    except yaml.YAMLError as exc:
        raise TargetError(f"{path} is not valid YAML: {exc}") from exc
    return parse(data, str(path))


def _endpoints(target: Target) -> list[tuple[str, str]]:
    """(key, address) of every endpoint of the system the harness will talk to itself."""
    found = [("event_api", target.event_api)]
    # An SQS the harness serves itself (sqs_listen) is not the system's to answer yet.
    own = ("sqs_endpoint",) if target.sqs_listen else ()
    for key in ("sqs_endpoint", "toxiproxy_url", "kinesis_upstream"):
        if key in own:
            continue
        value = getattr(target, key)
        if value:
            found.append((key, value))
    if target.dedup_redis and not target.toxiproxy_url:
        found.append(("dedup_redis", target.dedup_redis))
    return found


def unreachable(target: Target, timeout_s: float = 3.0) -> str | None:
    """The first endpoint of ``target`` that does not accept a connection, said plainly; None
    when all do. Checked before a run starts anything, so a typo or a system that is down is
    named instead of surfacing as a failed checker."""
    import socket

    for key, address in _endpoints(target):
        if "://" in address:
            parts = urlsplit(address)
            host = parts.hostname or ""
            port = parts.port or (443 if parts.scheme == "https" else 80)
        else:
            host, port = _host_port(address, key)
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                pass
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            return f"its {key} {address} does not answer ({reason.lower()})"
    return None
