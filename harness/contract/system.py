"""Everything the verifier may know about a system: its contract.

The reference implementation is one target among others (``harness/stack/reference.py`` builds
its contract); a team's system states its own in a target file (``harness/stack/target.py``).
Every part but the driver and the policy is optional: a capability a system lacks switches off
the checkers and faults that need it, with a line saying so.

* ``driver``: how to reach its public API (:mod:`harness.contract.driver`);
* ``policy``: the values its promises are judged against (channels per kind, rate limits, FCM
  projects, a fallback dedup store, whether its dedup store is durable);
* ``queues``: its work queues and dead-letter queues, if it exposes them, and how to read a
  parked job (which notification, which recipient) for the DLQ accounting;
* ``audit``: a reader of its audit trail, if it has one, in the trail's own format;
* ``table_writer``: a direct write of a user's preferences to its store, bypassing its API, if
  the target offers one (the change stream must then do the invalidating);
* ``ttl_tables``: DynamoDB tables whose items' TTL attribute the harness reads at the end of a
  run (:mod:`harness.run.ttl_items`), with what each is for;
* ``dedup_store_url``: the Redis its dedup store is, read-only, if the target says: the
  harness reads its keys' remaining TTLs at the end of a run (:mod:`harness.run.dedup_keys`);
* ``clock``: the offset file its processes read their wall clock from (libfaketime), if it
  can be moved (capability ``clock``, :mod:`harness.contract.clock`): a scenario that crosses
  a midnight needs it;
* where its provider traffic goes (the harness's simulators) and its dedup store's fault proxy
  are the stack's business (``StackInfo``), not the system's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.contract.clock import SystemClock
from harness.contract.driver import Driver, Event, Unsupported
from harness.model.system import SystemPolicy

# A parked job's (tenant, notification id, recipient user), each None when the body does not say.
JobIdentity = tuple[str | None, str | None, str | None]
# Where a job names them (dotted paths into its JSON body), by the verifier's names.
JOB_FIELDS = ("tenant", "notification", "recipient")
# What a job template may name: ${tenant}, ${notification}, ...
TEMPLATE_VALUES = ("tenant", "notification", "recipient", "author", "token", "platform")
_PLACEHOLDER = re.compile(r"\$\{([a-z_]+)\}")


def value_at(document: Any, path: str) -> Any:
    """The value at a dotted ``path`` of a JSON document (``job.nid``); None when absent."""
    value = document
    for key in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def job_reader(fields: Mapping[str, str]) -> Callable[[str], JobIdentity]:
    """Reads a job body's (tenant, notification, recipient) at the dotted paths ``fields``
    names (keys :data:`JOB_FIELDS`)."""
    paths = [fields[k] for k in JOB_FIELDS]

    def read_job(body: str) -> JobIdentity:
        try:
            job = json.loads(body)
        except (json.JSONDecodeError, TypeError):
            return (None, None, None)
        if not isinstance(job, dict):
            return (None, None, None)
        found = [value_at(job, p) for p in paths]
        return tuple(None if v is None or isinstance(v, (dict, list)) else str(v) for v in found)  # type: ignore[return-value]

    return read_job


@dataclass(frozen=True)
class JobTemplate:
    """A well-formed job in the system's own schema, with placeholders (``${tenant}``,
    ``${notification}``, ``${recipient}``, ``${author}``, ``${token}``, ``${platform}``): what
    the harness fills to put a job on a work queue itself (``inject-malformed-jobs`` gives one
    a notification id that is no ULID, and nothing else wrong). ``platforms`` names the
    platforms in the system's own words (``{apns: ios, fcm: android}``)."""

    body: Any
    platforms: Mapping[str, str] = field(default_factory=dict)

    def placeholders(self) -> set[str]:
        return set(_PLACEHOLDER.findall(json.dumps(self.body)))

    def build(self, **values: str) -> str:
        """The job's body, every placeholder filled (a platform in the system's words)."""
        if "platform" in values:
            values["platform"] = self.platforms.get(values["platform"], values["platform"])

        def fill(node: Any) -> Any:
            if isinstance(node, str):
                return _PLACEHOLDER.sub(lambda m: str(values.get(m.group(1), m.group(0))), node)
            if isinstance(node, dict):
                return {k: fill(v) for k, v in node.items()}
            if isinstance(node, list):
                return [fill(v) for v in node]
            return node

        return json.dumps(fill(self.body))


# The job schema of the design's reference (and of a target that states none): the defaults.
DEFAULT_JOB_FIELDS: Mapping[str, str] = {
    "tenant": "tenant_id",
    "notification": "notification_id",
    "recipient": "recipient_user_id",
}
DEFAULT_JOB_TEMPLATE = JobTemplate(
    {
        "tenant_id": "${tenant}",
        "notification_id": "${notification}",
        "recipient_user_id": "${recipient}",
        "author_id": "${author}",
        "kind": "post",
    }
)


@dataclass(frozen=True)
class Queues:
    """A system's SQS queues by channel (``push``, ``email``, ...; ``pages`` for a fan-out's
    own work queue when it has one)."""

    work: Mapping[str, str]
    dead: Mapping[str, str] = field(default_factory=dict)
    poison: Mapping[str, str] = field(default_factory=dict)
    read_job: Callable[[str], JobIdentity] = lambda body: (None, None, None)
    # A well-formed job of the system's schema, None when the contract states none (the
    # harness then cannot put a job on its queues that is wrong in one way only).
    job_template: JobTemplate | None = None

    @property
    def delivery_channels(self) -> tuple[str, ...]:
        return tuple(c for c in self.work if c != "pages")


TTL_PURPOSES = ("inbox", "dedup_fallback")


@dataclass(frozen=True)
class TtlTable:
    """A DynamoDB table whose items carry a TTL attribute (epoch seconds) that the design
    bounds: ``inbox`` rows (and celebrity pointers) live 90 days (seed 000), the fallback dedup
    store's items the dedup window (30 days)."""

    purpose: str
    table: str
    attribute: str = "expires_at"
    # The attribute holding the item's notification id: its expiry is then judged against
    # that notification's own acceptance; None, against the run's span.
    id_attribute: str | None = None


@dataclass(frozen=True)
class AuditSource:
    """Reads a system's audit trail into the history (kind ``audit`` rows) once its workers
    have stopped; returns the records read."""

    read: Callable[[Any], int]
    format: str = ""


# Capabilities a checker or fault may need (``harness.checkers.registry.checker(needs=...)``).
READ_SIDE = ("inbox", "unread", "read_all", "mark_read")


@dataclass
class SystemContract:
    name: str
    api_url: str
    driver: Driver
    policy: SystemPolicy = field(default_factory=SystemPolicy)
    queues: Queues | None = None
    audit: AuditSource | None = None
    table_writer: Callable[[str, str, dict[str, Any]], None] | None = None
    # The SQS endpoint's own log of what it handed out (the harness's SQS endpoint only).
    sqs_log_url: str | None = None
    # The SNS endpoint the system sends SMS through, when it is the harness's own: its SMS
    # ledger is what the SMS part of channel_delivery reads (capability ``sms_ledger``).
    sms_ledger_url: str | None = None
    dedup_store_url: str | None = None
    # Tables whose TTL attribute the harness reads at the end of a run (public DynamoDB Scan).
    ttl_tables: tuple[TtlTable, ...] = ()
    # A wall clock the harness can move (libfaketime's offset file), if the system has one.
    clock: SystemClock | None = None
    # An erasure that runs as a job: whether the user's erasure has completed (the harness
    # counts it acknowledged then, not when the API answered). None: the API's answer is it.
    erasure_done: Callable[[str, str], bool] | None = None
    extra: set[str] = field(default_factory=set)

    def operations(self) -> set[str]:
        """The driver's operations the system offers (a driver raises Unsupported for the
        others when asked to build their call)."""
        probes: dict[str, Callable[[], Any]] = {
            "post_event": lambda: self.driver.post_event(Event("t", "a", "post", "o", "e")),
            "set_preferences": lambda: self.driver.set_preferences("t", "u", {}),
            "register_device": lambda: self.driver.register_device("t", "u", "tok", "apns"),
            "follow": lambda: self.driver.follow("t", "a", ["u"]),
            "load_users": lambda: self.driver.load_users("t", []),
            "inbox": lambda: self.driver.inbox_page("t", "u", 1, None),
            "unread": lambda: self.driver.unread_count("t", "u"),
            "read_all": lambda: self.driver.read_all("t", "u"),
            "mark_read": lambda: self.driver.mark_read("t", "u", "n"),
            "erase_user": lambda: self.driver.erase_user("t", "u"),
        }
        offered = set()
        for name, probe in probes.items():
            try:
                probe()
            except Unsupported:
                continue
            offered.add(name)
        return offered

    def capabilities(self) -> frozenset[str]:
        caps = self.operations() | set(self.extra)
        if self.queues is not None:
            caps.add("queues")
            if any(c in self.queues.poison for c in self.queues.delivery_channels):
                caps.add("poison_queue")
        if self.audit is not None:
            caps.add("audit_trail")
        if self.table_writer is not None:
            caps.add("table_writes")
        if self.sqs_log_url:
            caps.add("sqs_log")
        if self.sms_ledger_url:
            caps.add("sms_ledger")
        if self.ttl_tables:
            caps.add("ttl_tables")
        if self.dedup_store_url and self.policy.dedup_key_pattern:
            caps.add("dedup_store")
        if self.clock is not None:
            caps.add("clock")
        return frozenset(caps)
