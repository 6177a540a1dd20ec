"""The embedded local stack: start every part on loopback, check it is ready, stop it in order.

Every part is a real server in its own process (own session, so a stop takes its children
too). Ports are chosen free at start and written, with pids and URLs, to a stack file that
workers, tests and Locust read. Parts start in dependency order, each with a readiness check and
a timeout, and stop in reverse order; a part that dies while starting is reported with the tail
of its log.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis

from chaos.faults import DEDUP_PROXY
from emulators.ports import LOOPBACK, free_port
from emulators.providers.apns_keys import (
    ENV_KEY_ID,
    load_or_generate_signing_key,
    read_signing_key,
)
from emulators.providers.fcm import write_service_account_file
from emulators.providers.serving import MAX_PROCESSES as MAX_SIM_PROCESSES
from emulators.providers.serving import SERVERS as SIM_SERVERS
from harness.contract.clock import SystemClock, faked_environment, faketime_library
from harness.contract.system import SystemContract
from harness.stack import reference
from harness.stack.aws_clients import aws_client
from harness.stack.reaper import Ownership
from harness.stack.target import Target, port_of

ROOT = Path(__file__).resolve().parents[2]
NODE_EMULATOR = ROOT / "emulators" / "node" / "aws_emulator.js"
DEFAULT_STACK_FILE = ROOT / ".stack" / "stack.json"
AWS_KEYS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
REGION = "us-east-1"
DEFAULT_SIM_PROCESSES = 1
# How long a part told to stop (SIGTERM) may take before it is killed: a worker stores the
# audit records it buffered on the way out, and on a loaded 2-core machine that flush took
# longer than 5 s (a clean-clone run lost half the push consumer's trail to the SIGKILL). The
# wait ends as soon as the part is gone, so a quick part costs nothing; above the reference's
# own 20 s grace for its forked workers, so its escalation is seen before ours.
STOP_GRACE_SECONDS = 30.0

# Start order. Workers come last: they need everything else.
PARTS = (
    "redis",
    "toxiproxy",
    "dynamodb",
    "kinesis",
    # The fault proxy in front of kinesalite: the reference's Kinesis calls all go through it,
    # so chaos can hold one shard's records (per-author ordering made observable).
    "kinesis-proxy",
    # The same proxy in front of dynalite, which has no streams: it gives the reference's
    # tables their DynamoDB Streams (the preferences table's feeds the stream invalidator).
    "dynamodb-proxy",
    "sqs",
    "aws",
    "apns",
    "fcm",
    "ses",
    "inapp",
    "sns",
    "event-api",
    "fanout-worker",
    "push-consumer",
    "email-consumer",
    "in-app-consumer",
    "sms-consumer",
    "stream-invalidator",
)
WORKER_PARTS = (
    "event-api",
    "fanout-worker",
    "push-consumer",
    "email-consumer",
    "in-app-consumer",
    "sms-consumer",
    "stream-invalidator",
)
# Parts that need other parts' URLs (and the APNs CA) at start: a tier of their own.
DEPENDENT_PARTS = ("sns",)
# Parts a stack starts only when asked for by name (none today: the reference sends SMS through
# the SNS endpoint, so a default stack has it).
OPTIONAL_PARTS: tuple[str, ...] = ()
INFRA_PARTS = tuple(p for p in PARTS if p not in WORKER_PARTS and p not in DEPENDENT_PARTS)
# Worker part -> the channel its reference_impl.channel_consumer process drains.
CHANNEL_CONSUMERS = {
    "email-consumer": "email",
    "in-app-consumer": "in_app",
    "sms-consumer": "sms",
}
# Workers that serve nothing: they poll, and say they are ready with a ready file.
POLLER_PARTS = ("fanout-worker", "push-consumer", *CHANNEL_CONSUMERS, "stream-invalidator")
# Where the harness's own clients reach a service: the first of these parts the stack has.
# DynamoDB goes through its proxy, so a write the harness makes (a "console edit") is on the
# table's stream like any other.
CLIENT_PARTS = {
    "dynamodb": ("dynamodb-proxy", "dynamodb"),
    "dynamodbstreams": ("dynamodb-proxy",),
    "kinesis": ("kinesis",),
    "sqs": ("sqs",),
}


# Parts a target places: the target file's key with the host:port the system was told.
_TARGET_LISTEN = {
    "apns": "apns_listen",
    "fcm": "fcm_listen",
    "kinesis-proxy": "kinesis_listen",
    "sns": "sns_listen",
    "sqs": "sqs_listen",
}


class StackError(RuntimeError):
    """A part could not start, or the machine lacks something the stack needs."""


def stack_file_path() -> Path:
    return Path(os.environ.get("HARNESS_STACK_FILE", DEFAULT_STACK_FILE))


def require_redis_server() -> str:
    path = shutil.which("redis-server")
    if not path:
        raise StackError(
            "redis-server is not installed: install the Debian package redis-server "
            "(apt-get install redis-server) or run `make setup`"
        )
    return path


def require_node_emulators() -> str:
    node = shutil.which("node")
    if not node:
        raise StackError(
            "node is not installed: install the Debian package nodejs, or run `make setup`"
        )
    modules = Path(os.environ.get("FANOUT_NODE_MODULES", ROOT / "node_modules"))
    missing = [m for m in ("dynalite", "kinesalite") if not (modules / m).is_dir()]
    if missing:
        raise StackError(
            f"npm packages {', '.join(missing)} are not installed in {modules}: run `make setup`"
        )
    return node


@dataclass
class PartInfo:
    name: str
    pid: int
    port: int | None
    url: str | None
    log: str
    argv: list[str]


@dataclass
class StackInfo:
    workdir: str
    reference_config: str
    parts: dict[str, PartInfo] = field(default_factory=dict)
    tls_ca: str | None = None
    # Where workers reach the dedup store: through the fault proxy when there is one.
    dedup_url: str | None = None
    # Parts the harness did not start (a target's Event API, its AWS endpoints): name -> URL.
    endpoints: dict[str, str] = field(default_factory=dict)
    region: str = REGION
    # None: boto3's own credential chain (a real AWS target).
    aws_keys: dict[str, str] | None = field(default_factory=lambda: dict(AWS_KEYS))
    # The environment's APNs signing key (AuthKey_<id>.p8 and key.json), registered with the
    # APNs simulator as Apple keeps a team's keys.
    apns_key_dir: str | None = None
    # A service-account file whose token_uri is the FCM simulator's OAuth endpoint.
    fcm_credentials: str | None = None

    def url(self, part: str) -> str:
        if part in self.endpoints:
            return self.endpoints[part]
        info = self.parts.get(part)
        if info is None or not info.url:
            raise StackError(f"part {part} has no URL")
        return info.url

    @property
    def redis_url(self) -> str:
        return self.url("redis")

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def read(cls, path: Path) -> StackInfo:
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError as exc:
            raise StackError(f"no stack file at {path}: run `python -m harness stack up`") from exc
        parts = {k: PartInfo(**v) for k, v in data.pop("parts").items()}
        return cls(parts=parts, **data)

    def aws_client(self, service: str) -> Any:
        known = (*self.parts, *self.endpoints)
        endpoint = next((p for p in CLIENT_PARTS.get(service, ("aws",)) if p in known), None)
        url = self.url(endpoint) if endpoint is not None else None
        return aws_client(
            service, region_name=self.region, endpoint_url=url, **(self.aws_keys or {})
        )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A detached part's parent has exited; where nothing reaps orphans (a container's PID 1),
    # a stopped part lingers as a zombie: it holds no port and runs no code.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _post(url: str, ca_file: str | None, body: Any = None, method: str = "POST") -> None:
    """A control call that must succeed (StackError naming it when not)."""
    import ssl

    context = ssl.create_default_context(cafile=ca_file) if ca_file else None
    data = b"" if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10, context=context):
            return
    except OSError as exc:
        raise StackError(f"the environment's part at {url} did not answer: {exc}") from exc


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


def wait_until(
    condition: Callable[[], bool], timeout: float, what: str, interval: float = 0.05
) -> None:
    """Poll a condition until it holds; raise TimeoutError naming what was awaited."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def sim_settings(processes: int | None, server: str | None) -> tuple[int, str]:
    """The APNs and FCM simulators' ``--processes`` and ``--server`` for a stack: the arguments,
    else ``HARNESS_SIM_PROCESSES`` / ``HARNESS_SIM_SERVER``, else 1 process of our h2 server.

    Why that default (``benchmarks/bench_simulators.py``, README): in a stack on this 2-core
    machine the simulators are far from the limit (about 130 µs of CPU per push where the
    reference spends milliseconds), so a second process would only compete with the reference
    for the same cores; and only the h2 server has every fault (goaway) and the CONNECT
    tunnel. A real consumer fleet (a target) wants ``granian`` with one process per core."""
    if processes is None:
        raw = os.environ.get("HARNESS_SIM_PROCESSES", str(DEFAULT_SIM_PROCESSES))
        try:
            processes = int(raw)
        except ValueError:
            raise StackError(f"HARNESS_SIM_PROCESSES must be a whole number, got {raw!r}") from None
    if not 1 <= processes <= MAX_SIM_PROCESSES:
        raise StackError(
            f"simulator processes must be from 1 to {MAX_SIM_PROCESSES}, got {processes}"
        )
    server = server if server is not None else os.environ.get("HARNESS_SIM_SERVER", "h2")
    if server not in SIM_SERVERS:
        raise StackError(
            f"simulator server must be one of {', '.join(SIM_SERVERS)}, got {server!r}"
        )
    return processes, server


def _log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


class Stack:
    """Owns the processes of one local stack. Use as a context manager: exit stops everything."""

    def __init__(
        self,
        workdir: Path,
        *,
        durable_redis: bool = False,
        apns_tls: bool = True,
        reference_overrides: dict[str, Any] | None = None,
        start_timeout: float = 30.0,
        with_workers: bool = True,
        stack_file: Path | None = None,
        parts: Sequence[str] | None = None,
        target: Target | None = None,
        sim_processes: int | None = None,
        sim_server: str | None = None,
        movable_clock: bool = False,
        attach: StackInfo | None = None,
    ) -> None:
        self.workdir = Path(workdir).resolve()
        # A long-lived environment already up for the target (`harness env up`): its parts
        # are used, none is started, and none is stopped with this stack.
        self.attached = attach
        # The reference's own processes (its workers, never the emulators) under libfaketime,
        # reading their clock offset from this file (harness/contract/clock.py); None: their
        # clocks are true (also when libfaketime is not installed: the contract then has no
        # clock, and a scenario that moves it does not fit).
        self.clock_file: Path | None = None
        self.faketime = faketime_library() if movable_clock and target is None else None
        if self.faketime is not None:
            self.clock_file = self.workdir / "faketimerc"
        self.durable_redis = durable_redis
        self.apns_tls = apns_tls
        # The APNs and FCM simulators: processes and HTTP server (sim_settings says why).
        self.sim_processes, self.sim_server = sim_settings(sim_processes, sim_server)
        self.reference_overrides = reference_overrides or {}
        self.start_timeout = start_timeout
        self.with_workers = with_workers
        self.stack_file = stack_file
        self.target = target
        # What the kinesis-proxy part forwards to when the stack has no kinesis part of its
        # own (a target's Kinesis, or `harness serve kinesis-proxy --upstream URL`).
        self.kinesis_upstream = target.kinesis_upstream if target is not None else None
        # The same for dynamodb-proxy (`harness serve dynamodb-proxy --upstream URL`).
        self.dynamodb_upstream: str | None = None
        if target is not None:
            # The system under test runs elsewhere: the harness starts only the fault proxies
            # (if the target has no Toxiproxy of its own) and the provider simulators.
            proxied = bool(target.dedup_listen or target.proxies) and not target.toxiproxy_url
            parts = [p for p, wanted in (
                ("sqs", bool(target.sqs_listen)),
                ("toxiproxy", proxied),
                ("kinesis-proxy", bool(target.kinesis_listen)),
                ("apns", bool(target.apns_listen)),
                ("fcm", bool(target.fcm_listen)),
                ("sns", bool(target.sns_listen)),
            ) if wanted]  # fmt: skip
            self.apns_tls = target.apns_tls
        unknown = sorted(set(parts or ()) - set(PARTS))
        if unknown:
            raise StackError(f"unknown part(s) {', '.join(unknown)}; parts: {', '.join(PARTS)}")
        wanted_optional = (
            {"sns"}
            if parts is None and reference.publishes_through_sns(self.reference_overrides)
            else set()
        )
        self.selected = tuple(
            p
            for p in PARTS
            if (parts is None and (p not in OPTIONAL_PARTS or p in wanted_optional))
            or p in (parts or ())
        )
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        # Process groups the stack did not start but stops with its own (the load generator).
        self.adopted: dict[str, subprocess.Popen[Any]] = {}
        # A detached stack (a stack file) outlives the command that started it; any other is
        # recorded for the reaper, so that nothing it started outlives its owner.
        self.ownership: Ownership | None = None if stack_file is not None else Ownership()
        self.info = StackInfo(
            workdir=str(self.workdir), reference_config=str(self.workdir / "reference.json")
        )

    # -- lifecycle --------------------------------------------------------------------------

    def __enter__(self) -> Stack:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def up(self) -> StackInfo:
        if self.attached is not None:
            return self._attach(self.attached)
        if "redis" in self.selected:
            require_redis_server()
        if {"dynamodb", "kinesis"} & set(self.selected):
            require_node_emulators()
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        try:
            # Parts of one tier do not depend on each other: start them together and wait for
            # all, so a stack is up in the time of its slowest part, not the sum of them.
            self._start_together([p for p in INFRA_PARTS if p in self.selected])
            self._start_together([p for p in DEPENDENT_PARTS if p in self.selected])
            if "apns" in self.selected:
                self.info.apns_key_dir = str(self.workdir / "apns")
                load_or_generate_signing_key(Path(self.info.apns_key_dir), ENV_KEY_ID)
            if "fcm" in self.selected:
                account = self.workdir / "fcm" / "service-account.json"
                if not account.exists():
                    token_uri = f"{self.info.url('fcm')}/token"
                    write_service_account_file(account, token_uri, "fanout-sender")
                self.info.fcm_credentials = str(account)
            if self.target is not None:
                self._describe_target(self.target)
            if "apns" in self.selected:
                self.authorize_apns()
            if self.target is None:
                self.write_reference_config()
                # Only against the stack's own emulators: a missing endpoint in the config
                # means real AWS, which a partial local stack must never touch.
                if {"dynamodb", "kinesis", "sqs"} <= set(self.selected):
                    self.provision()
                if self.with_workers:
                    self._start_together([p for p in WORKER_PARTS if p in self.selected])
        except BaseException:
            self.down()
            raise
        if self.stack_file:
            self.stack_file.parent.mkdir(parents=True, exist_ok=True)
            self.stack_file.write_text(self.info.to_json())
        return self.info

    def _attach(self, running: StackInfo) -> StackInfo:
        """Use a long-lived environment's parts: each simulator and fault proxy starts this
        run clean (ledgers, dead tokens, faults, toxics), as a part started for it would."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.info.parts = dict(running.parts)
        self.info.tls_ca, self.info.dedup_url = running.tls_ca, running.dedup_url
        assert self.target is not None
        self._describe_target(self.target)
        self.info.apns_key_dir = running.apns_key_dir
        self.info.fcm_credentials = running.fcm_credentials
        for part in ("apns", "fcm"):
            if part in self.info.parts:
                ca = self.info.tls_ca if part == "apns" else None
                _post(f"{self.info.url(part)}/_sim/reset", ca)
        if "apns" in self.info.parts:
            self.authorize_apns()
        if "toxiproxy" in self.info.parts:
            _post(f"{self.info.url('toxiproxy')}/reset", None)
        return self.info

    def down(self, hurry: bool = False) -> None:
        """Workers first (they hold connections to the rest), then the infrastructure together;
        ``hurry`` (an interrupted run): everything at once, a shorter grace."""
        workers = [p for p in reversed(list(self.procs)) if p in WORKER_PARTS]
        tiers = (
            [list(reversed(list(self.procs)))]
            if hurry
            else [workers, list(reversed(list(self.procs)))]
        )
        adopted = list(self.adopted.values())
        self.adopted.clear()
        for n, tier in enumerate(tiers):
            stopped = [self.procs.pop(part) for part in tier if part in self.procs]
            if n == 0:
                stopped = adopted + stopped
            # An interrupted run stores nothing more (its history is the harness's own), and
            # its promise is every process gone within seconds: at 2 s the stop alone took
            # 3.2-3.7 s on a quiet machine and past the 5 s bound under whole runs' load; at
            # 1 s, 4.7 s under CI's load (three whole runs on 2 cores).
            stop_processes(stopped, timeout=0.5 if hurry else 5.0)
            self._forget(stopped)
        if self.stack_file and self.stack_file.exists():
            self.stack_file.unlink()
        if self.ownership is not None and not self.procs and not self.adopted:
            self.ownership.close()

    def adopt(self, name: str, proc: subprocess.Popen[Any]) -> None:
        """Stop ``proc``'s process group with the stack's own, and reap it if the owner dies."""
        self.adopted[name] = proc
        if self.ownership is not None:
            self.ownership.add(name, proc.pid)

    def release(self, proc: subprocess.Popen[Any]) -> None:
        """``proc`` has ended on its own."""
        for name, adopted in list(self.adopted.items()):
            if adopted is proc:
                del self.adopted[name]
        self._forget([proc])

    def _forget(self, procs: Sequence[subprocess.Popen[Any]]) -> None:
        if self.ownership is not None:
            for proc in procs:
                self.ownership.remove(proc.pid)

    # -- parts ------------------------------------------------------------------------------

    def _describe_target(self, target: Target) -> None:
        """What the harness needs to know of a target: its URLs and queue names."""
        self.info.endpoints["event-api"] = target.event_api.rstrip("/")
        if target.sqs_endpoint:
            self.info.endpoints["sqs"] = target.sqs_endpoint
        if target.dynamodb_endpoint:  # where ttl_attributes scans its ttl_tables
            self.info.endpoints["dynamodb"] = target.dynamodb_endpoint
        self.info.region = target.region
        keys = {
            "aws_access_key_id": target.aws_access_key_id,
            "aws_secret_access_key": target.aws_secret_access_key,
        }
        self.info.aws_keys = keys if all(keys.values()) else None
        if target.toxiproxy_url:
            self.info.endpoints["toxiproxy"] = target.toxiproxy_url.rstrip("/")

    def reference_values(self) -> dict[str, Any]:
        """The reference's config values for this stack (see harness/stack/reference.py)."""
        parts = self.info.parts
        urls = {name: part.url for name, part in parts.items()}
        own = {
            "region": REGION,
            **AWS_KEYS,
            "redis_url": self.info.dedup_url or urls.get("redis"),
            "apns_ca_file": self.info.tls_ca,
            "event_api_host": LOOPBACK,
        }
        if self.info.fcm_credentials:
            own["fcm_credentials_file"] = self.info.fcm_credentials
        if self.info.apns_key_dir:
            key = read_signing_key(Path(self.info.apns_key_dir))
            own["apns_key_file"] = str(Path(self.info.apns_key_dir) / key.file_name)
            own["apns_key_id"], own["apns_team_id"] = key.key_id, key.team_id
        return reference.config_values(urls, {**own, **self.reference_overrides})

    def reference_config(self) -> Any:
        """The reference's config for this stack (a ``reference_impl.config.Config``), for the
        reference's own tests."""
        return reference.config_of(self.reference_values())

    def write_reference_config(self) -> None:
        try:
            reference.write_config(Path(self.info.reference_config), self.reference_values())
        except reference.ReferenceConfigError as exc:
            raise StackError(str(exc)) from exc

    def provision(self) -> None:
        reference.provision(self.info.reference_config)

    def contract(self, durable: bool) -> SystemContract:
        """What the verifier may know of the system under test."""
        if self.target is not None:
            return self.target.contract(self.info)
        contract = reference.contract(self.info, durable)
        if self.clock_file is not None:
            contract.clock = SystemClock(self.clock_file)
        return contract

    def part_argv(self, part: str, port: int | None) -> list[str]:
        py = sys.executable
        config = self.info.reference_config
        ready = str(self.workdir / f"{part}.ready")
        if part == "redis":
            data = self.workdir / "redis"
            data.mkdir(exist_ok=True)
            persistence = (
                ["--appendonly", "yes", "--appendfsync", "always"]
                if self.durable_redis
                else ["--appendonly", "no"]
            )
            return [
                require_redis_server(),
                "--port", str(port), "--bind", LOOPBACK, "--save", "", "--dir", str(data),
                "--daemonize", "no", "--protected-mode", "yes", *persistence,
            ]  # fmt: skip
        if part in ("dynamodb", "kinesis"):
            kind = "dynalite" if part == "dynamodb" else "kinesalite"
            return [
                require_node_emulators(),
                str(NODE_EMULATOR),
                kind,
                "--host",
                LOOPBACK,
                "--port",
                str(port),
            ]
        if part == "aws":
            return [py, "-m", "moto.server", "-H", LOOPBACK, "-p", str(port)]
        if part in ("kinesis-proxy", "dynamodb-proxy"):
            service = part.removesuffix("-proxy")
            upstream = self.kinesis_upstream if part == "kinesis-proxy" else self.dynamodb_upstream
            if upstream is None and service in self.info.parts:
                upstream = self.info.parts[service].url
            if not upstream:
                raise StackError(
                    f"{part} needs an upstream: the {service} part"
                    + (", a target's kinesis_upstream" if part == "kinesis-proxy" else "")
                    + ", or --upstream URL"
                )
            streams = ["--dynamodb-streams"] if part == "dynamodb-proxy" else []
            return [
                py, "-m", "emulators.aws_proxy", "--upstream", upstream,
                "--host", LOOPBACK, "--port", str(port), *streams,
            ]  # fmt: skip
        if part == "sqs":
            return [py, "-m", "emulators.sqs", "--host", LOOPBACK, "--port", str(port)]
        if part == "sns":
            return self.sns_argv(port)
        if part == "toxiproxy":
            argv = [py, "-m", "chaos.toxiproxy", "--host", LOOPBACK, "--port", str(port)]
            proxies = self.workdir / "proxies.json"
            if proxies.exists():
                argv += ["--config", str(proxies)]
            return argv
        if part in ("apns", "fcm"):
            argv = [
                py, "-m", f"emulators.providers.{part}", "--host", LOOPBACK, "--port", str(port),
                "--processes", str(self.sim_processes), "--server", self.sim_server,
                "--state-dir", str(self.workdir / f"{part}-state"),
            ]  # fmt: skip
            if part == "apns" and self.apns_tls:
                argv += ["--tls", "--cert-dir", str(self.workdir / "tls")]
            return argv
        if part in ("ses", "inapp"):
            return [
                py,
                "-m",
                f"emulators.providers.{part}",
                "--host",
                LOOPBACK,
                "--port",
                str(port),
            ]
        worker = reference.worker_argv(part, config, port, ready)
        if worker is not None:
            return worker
        raise StackError(f"unknown part {part!r}; parts: {', '.join(PARTS)}")

    def sns_argv(self, port: int | None) -> list[str]:
        """The SNS endpoint, delivering to this stack's APNs and FCM simulators and SQS."""
        argv = [sys.executable, "-m", "emulators.sns", "--host", LOOPBACK, "--port", str(port)]
        parts = self.info.parts
        for flag, part in (("--apns-url", "apns"), ("--fcm-url", "fcm"), ("--sqs-url", "sqs")):
            if part in parts and parts[part].url:
                argv += [flag, self._sns_provider_url(part, str(parts[part].url))]
        if "sqs" not in parts and self.target is not None and self.target.sqs_endpoint:
            # A target's own SQS: its platform applications' events go to its queues.
            argv += ["--sqs-url", self.target.sqs_endpoint]
        if "apns" in parts and self.info.tls_ca:
            argv += ["--apns-ca-file", self.info.tls_ca]
        return argv

    def _sns_provider_url(self, part: str, url: str) -> str:
        """Where the SNS endpoint reaches a provider simulator. Our h2 server takes h2c on the
        APNs simulator's TLS port: SNS's relay to APNs is the emulators' own hop, its TLS
        proves nothing about the system under test (whose direct APNs client still meets TLS)
        and took about a seventh of the SNS endpoint's CPU in a 20,000-delivery burst (py-spy).
        granian serves no plaintext on a TLS port, so only a simulator this stack started
        (whose server it knows) is reached so."""
        started_here = part in self.procs and self.sim_server == "h2"
        if part == "apns" and started_here and url.startswith("https://"):
            return "http://" + url.removeprefix("https://")
        return url

    def _url(self, part: str, port: int | None) -> str | None:
        if port is None or part in POLLER_PARTS:
            return None  # a poller serves nothing (it is only handed a free port)
        if part == "redis":
            return f"redis://{LOOPBACK}:{port}/0"
        scheme = "https" if part == "apns" and self.apns_tls else "http"
        return f"{scheme}://{LOOPBACK}:{port}"

    def _ready(self, part: str, info: PartInfo) -> bool:
        if part == "redis":
            try:
                return bool(redis.Redis.from_url(info.url or "", socket_timeout=1).ping())
            except redis.RedisError:
                return False
        if part == "sqs":
            return _http_ok(f"{info.url}/_sqs/health")
        if part == "sns":
            return _http_ok(f"{info.url}/_sns/health")
        if part in ("dynamodb", "kinesis", "aws"):
            service = {"dynamodb": "dynamodb", "kinesis": "kinesis", "aws": "sqs"}[part]
            try:
                client = aws_client(service, region_name=REGION, endpoint_url=info.url, **AWS_KEYS)
                {
                    "dynamodb": lambda: client.list_tables(),
                    "kinesis": lambda: client.list_streams(),
                    "sqs": lambda: client.list_queues(),
                }[service]()
                return True
            except Exception:
                return False
        if part in ("apns", "fcm", "ses", "inapp"):
            control = f"http://{LOOPBACK}:{info.port}/_sim/health"
            if part == "apns" and self.apns_tls:
                return self._tls_ready(info)
            return _http_ok(control)
        if part == "event-api":
            return _http_ok(f"{info.url}/health")
        if part == "toxiproxy":
            return _http_ok(f"{info.url}/proxies")
        if part in ("kinesis-proxy", "dynamodb-proxy"):
            return _http_ok(f"{info.url}/_proxy/health")
        return (self.workdir / f"{part}.ready").exists()

    def _tls_ready(self, info: PartInfo) -> bool:
        import ssl

        ca = self.workdir / "tls" / "ca.pem"
        if not ca.exists():
            return False
        try:
            # Also an SSLError: the simulator may be writing the file right now.
            context = ssl.create_default_context(cafile=str(ca))
            with urllib.request.urlopen(
                f"https://{LOOPBACK}:{info.port}/_sim/health", timeout=1, context=context
            ) as response:
                ok = response.status == 200
        except OSError:
            return False
        if ok:
            self.info.tls_ca = str(ca)
        return ok

    def dead_parts(self) -> dict[str, str]:
        """Parts whose process has exited on its own, with the tail of each one's log."""
        if self.attached is not None:
            return {
                name: f"the environment's {name} (pid {part.pid}) is gone; log {part.log}"
                for name, part in self.attached.parts.items()
                if not _pid_alive(part.pid)
            }
        return {
            part: f"exited with code {proc.returncode}; log {self.info.parts[part].log}:\n"
            + _log_tail(Path(self.info.parts[part].log), 8)
            for part, proc in self.procs.items()
            if proc.poll() is not None
        }

    def stop_part(self, part: str, grace: float = STOP_GRACE_SECONDS) -> list[str]:
        """Stop one part (SIGTERM, then SIGKILL after ``grace``); its port stays reserved for a
        restart. Returns ``[part]`` when it had to be killed, else ``[]``."""
        return self.stop_parts([part], grace)

    def stop_parts(self, parts: Sequence[str], grace: float = STOP_GRACE_SECONDS) -> list[str]:
        """Stop several parts at once: each gets its SIGTERM before any is waited for, so their
        shutdowns (a poller's long poll, an audit flush) overlap. Returns the parts that did
        not stop within ``grace`` and were killed (what they buffered is lost)."""
        named = [(part, self.procs.pop(part)) for part in parts if part in self.procs]
        # The reference's Python workers dump their threads' tracebacks on SIGUSR1 (faulthandler,
        # reference_impl/event_source.py) before a kill; nothing else is asked to.
        workers = [
            proc for part, proc in named if part in reference.WORKERS and part != "event-api"
        ]
        killed = set(stop_processes([proc for _, proc in named], timeout=grace, dump=workers))
        self._forget([proc for _, proc in named])
        for part in parts:
            (self.workdir / f"{part}.ready").unlink(missing_ok=True)
        return [part for part, proc in named if proc in killed]

    def offers(self, part: str, action: str) -> bool:
        """Every part this stack runs can be killed, stopped, started, paused and resumed."""
        return part in self.selected and action in ("kill", "stop", "start", "pause", "resume")

    def pause_part(self, part: str) -> None:
        """SIGSTOP one part's process group: alive, connections open, nothing answered."""
        proc = self.procs.get(part)
        if proc is None:
            raise StackError(f"{part} is not running")
        os.killpg(proc.pid, signal.SIGSTOP)

    def resume_part(self, part: str) -> None:
        proc = self.procs.get(part)
        if proc is not None:
            os.killpg(proc.pid, signal.SIGCONT)

    def kill_part(self, part: str) -> None:
        """kill -9 one part, as a crash would."""
        proc = self.procs.pop(part, None)
        if proc is not None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
            self._forget([proc])
        (self.workdir / f"{part}.ready").unlink(missing_ok=True)

    def start_part(self, part: str) -> PartInfo:
        """(Re)start one part on the port it had, so clients need no new config."""
        if part in self.procs:
            raise StackError(f"{part} is already running")
        previous = self.info.parts.get(part)
        started = self._start(part, previous.port if previous else None)
        if part == "apns":
            self.authorize_apns()
        return started

    def authorize_apns(self) -> None:
        """Tell the APNs simulator what Apple knows of the system's team: its signing keys
        (the environment's, and a target's own), the bundles they may push to, and the bundle
        this run's device tokens belong to."""
        url, ca = self.info.url("apns"), self.info.tls_ca
        if self.target is not None:
            topic = self.target.apns_topic
        else:
            topic = reference.config_of(self.reference_values()).apns_topic
        topics = [topic] if topic else []
        keys = []
        if self.info.apns_key_dir:
            keys.append(read_signing_key(Path(self.info.apns_key_dir)).registration(topics))
        for own in (self.target.apns_keys or []) if self.target is not None else []:
            path = Path(own["file"])
            try:
                pem = path.read_text()
            except OSError as exc:
                raise StackError(f"apns_keys: cannot read {path}: {exc}") from exc
            keys.append({"key_id": own["key_id"], "team_id": own["team_id"],
                         "public_key": pem, "topics": topics})  # fmt: skip
        for body in keys:
            _post(f"{url}/_sim/apns/keys", ca, body, method="PUT")
        _post(f"{url}/_sim/apns/topics", ca, {"default": topic}, method="PUT")

    def _write_proxy_config(self) -> None:
        """The dedup proxy: workers talk to Redis only through it, so chaos can cut it; and a
        target's own proxies, for any other TCP dependency it names."""
        target = self.target
        proxies = []
        if target is None or (target.dedup_listen and target.dedup_redis):
            if target is not None:
                listen_port = port_of(target.dedup_listen or "", "dedup_listen")
                upstream = target.dedup_redis or ""
            else:
                upstream = f"{LOOPBACK}:{self.info.parts['redis'].port}"
                if self.info.dedup_url:
                    listen_port = int(self.info.dedup_url.rsplit(":", 1)[1].split("/")[0])
                else:
                    listen_port = free_port()
            proxies.append(_proxy(DEDUP_PROXY, f"{LOOPBACK}:{listen_port}", upstream))
            self.info.dedup_url = f"redis://{LOOPBACK}:{listen_port}/0"
        for name, proxy in ((target.proxies or {}) if target is not None else {}).items():
            proxies.append(_proxy(name, proxy["listen"], proxy["upstream"]))
        (self.workdir / "proxies.json").write_text(json.dumps(proxies))

    def _start(self, part: str, port: int | None = None) -> PartInfo:
        return self._start_together([part], {part: port})[0]

    def _start_together(
        self, parts: Sequence[str], ports: dict[str, int | None] | None = None
    ) -> list[PartInfo]:
        """Spawn every part, then wait until all are ready (or one dies, or time runs out)."""
        ports = ports or {}
        pending = {part: self._spawn(part, ports.get(part)) for part in parts}
        infos = [pending[part][0] for part in parts]

        def all_ready() -> bool:
            for part, (info, proc) in list(pending.items()):
                if proc.poll() is not None:
                    raise StackError(
                        f"{part} exited with code {proc.returncode} while starting; "
                        f"log {info.log}:\n{_log_tail(Path(info.log))}"
                    )
                if self._ready(part, info):
                    del pending[part]
            return not pending

        try:
            wait_until(all_ready, self.start_timeout, f"{', '.join(parts)} to become ready")
        except TimeoutError as exc:
            late = "\n".join(
                f"{part} not ready; log {info.log}:\n{_log_tail(Path(info.log))}"
                for part, (info, _) in pending.items()
            )
            raise StackError(f"{exc}\n{late}") from exc
        return infos

    def _spawn(self, part: str, port: int | None) -> tuple[PartInfo, subprocess.Popen[bytes]]:
        if part == "toxiproxy":
            self._write_proxy_config()
        if port is None and self.target is not None and part in _TARGET_LISTEN:
            key = _TARGET_LISTEN
            port = port_of(getattr(self.target, key[part]) or "", key[part])
        if port is None and part not in ("fanout-worker", "push-consumer"):
            port = free_port()
        argv = self.part_argv(part, port)
        log_path = self.workdir / "logs" / f"{part}.log"
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "FANOUT_CONFIG": self.info.reference_config}
        env.setdefault("FANOUT_NODE_MODULES", str(ROOT / "node_modules"))
        if self.clock_file is not None and self.faketime is not None and part in reference.WORKERS:
            if not self.clock_file.exists():
                SystemClock(self.clock_file).set_offset(0)
            env = faked_environment(env, self.clock_file, self.faketime)
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=ROOT,
                env=env,
                start_new_session=True,
            )
        self.procs[part] = proc
        if self.ownership is not None:
            self.ownership.add(part, proc.pid)
        info = PartInfo(part, proc.pid, port, self._url(part, port), str(log_path), argv)
        self.info.parts[part] = info
        return info, proc


def _proxy(name: str, listen: str, upstream: str) -> dict[str, Any]:
    return {"name": name, "listen": listen, "upstream": upstream, "enabled": True}


def stop_process(proc: subprocess.Popen[Any] | int, timeout: float = 5.0) -> None:
    """SIGTERM the process group, then SIGKILL it if it has not gone within the timeout."""
    pid = proc if isinstance(proc, int) else proc.pid
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    if isinstance(proc, int):
        try:
            wait_until(lambda: not _pid_alive(pid), timeout, f"pid {pid} to stop")
        except TimeoutError:
            pass
    else:
        try:
            proc.wait(timeout)
            return
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    if not isinstance(proc, int):
        proc.wait(timeout)


def stop_processes(
    procs: Sequence[subprocess.Popen[Any]],
    timeout: float = 5.0,
    dump: Sequence[subprocess.Popen[Any]] = (),
) -> list[subprocess.Popen[Any]]:
    """SIGTERM every process group at once, then wait for them all within one ``timeout``
    (not one each: a stack of slow stoppers would otherwise take their sum), SIGKILL for
    those still there. A late process in ``dump`` gets SIGUSR1 first (the reference's Python
    workers then write every thread's traceback to their log: where it hung). Returns
    those that had to be killed."""
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    late = [proc for proc in procs if proc.poll() is None]
    dumped = [proc for proc in late if proc in dump]
    if dumped:
        for proc in dumped:
            try:
                os.kill(proc.pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        # The dump is written in the signal handler; a moment for it to run before the kill.
        dump_deadline = time.monotonic() + 1.0
        for proc in dumped:
            try:
                proc.wait(max(0.0, dump_deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
    for proc in procs:
        # Also when the leader has gone: its group (forked workers) goes with it.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for proc in procs:
        try:
            proc.wait(5.0)
        except subprocess.TimeoutExpired:  # unkillable (D state): nothing more to do here
            pass
    # A killed group's other members (forked workers, reparented once their leader died) are
    # gone only once reaped: wait for that, so that "stopped" means no process is left.
    try:
        wait_until(lambda: not any(_group_alive(p.pid) for p in procs), 5.0, "groups to end")
    except TimeoutError:
        pass
    return late


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_from_file(path: Path) -> list[str]:
    """Stop a detached stack recorded in a stack file; return the parts stopped."""
    info = StackInfo.read(path)
    alive = {name: p.pid for name, p in reversed(list(info.parts.items())) if _pid_alive(p.pid)}
    workers = [name for name in alive if name in WORKER_PARTS]
    for tier in (workers, [name for name in alive if name not in WORKER_PARTS]):
        for name in tier:
            try:
                os.killpg(alive[name], signal.SIGTERM)
            except ProcessLookupError:
                pass
        for name in tier:
            stop_process(alive[name])
    stopped = list(alive)
    path.unlink(missing_ok=True)
    return stopped


def status_from_file(path: Path) -> dict[str, str]:
    info = StackInfo.read(path)
    return {
        name: ("running" if _pid_alive(part.pid) else "dead") + (f" {part.url}" if part.url else "")
        for name, part in info.parts.items()
    }
