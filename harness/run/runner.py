"""Running a scenario: stack up, population in, events in, wait, collect, check, report."""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import resource
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import httpx
import numpy as np
import pandas as pd
import redis
from botocore.exceptions import BotoCoreError, ClientError
from ulid import ULID

from chaos.faults import DEDUP_PROXY, ChaosTargets
from chaos.faults import unavailable as fault_unavailable
from chaos.nemesis import Nemesis, ScheduledAction, ScheduledFault
from emulators.providers.fcm_limits import DEVICE_PER_HOUR, DEVICE_PER_MINUTE
from emulators.providers.fcm_limits import MINUTE as FCM_QUOTA_WINDOW_S
from harness.checkers.consent import refused_devices
from harness.checkers.delivery_latency import DEFAULT_RECOVERY_S
from harness.checkers.evidence import Evidence, evidence_from
from harness.checkers.quiet_hours import quiet_all_run
from harness.checkers.store import judged_on_disk, out_of_core_rows
from harness.checkers.verdict import STATUS_WORDS, SWITCHED_OFF, Verdict, result_status
from harness.contract.clock import (
    CACHE_SECONDS,
    midnight_at,
    offset_to_midnight,
    phase_detail,
)
from harness.contract.clock import summary as clock_summary
from harness.contract.driver import Driver
from harness.contract.system import Queues, SystemContract
from harness.live.metrics import LiveMetrics
from harness.live.online import OnlineChecks
from harness.live.view import LiveView, Stop
from harness.load.loader import load_population, post_event
from harness.load.loadgen import ROOT
from harness.load.record import (
    LoadTail,
    fold_injected,
    read_rows,
)
from harness.model import history as history_mod
from harness.model.delivery_key import delivery_key
from harness.model.history import CHECKER_ONLY_KINDS, STREAM_FILE, History
from harness.model.oracle import expected_channel_deliveries, required_push_recipients
from harness.model.population import Population, bad_device_tokens, generate, of_another_run
from harness.model.provider_limits import KIND as LIMITS_KIND
from harness.model.provider_limits import ProviderLimits
from harness.model.provider_limits import summary as limits_summary
from harness.model.scenarios import Scenario
from harness.run.actions import USER_CHANGING_ACTIONS, ActionContext, malformed_id_in
from harness.run.actions import unavailable as action_unavailable
from harness.run.alarms import DLQ_DEPTH_THRESHOLD, ThresholdAlarm
from harness.run.channel_ledgers import ChannelLedgers, opt_out_numbers, register_online_users
from harness.run.dedup_keys import existing_keys, record_sample, run_pattern, sample_ttls
from harness.run.dlq import redrive_recorded
from harness.run.peak_memory import measured, peak_mb
from harness.run.provider_control import SimulatorControl
from harness.run.python_steps import action_of, fault_of, judge
from harness.run.sns_ledger import SnsObserver
from harness.run.sqs_receives import collect_receives, log_position
from harness.run.ttl_items import describe_ttl, record_scan, scan_expiries
from harness.stack import environment, reference
from harness.stack.hooks import ShellProcesses
from harness.stack.reaper import reap_orphans
from harness.stack.supervisor import (
    STOP_GRACE_SECONDS,
    WORKER_PARTS,
    Stack,
    StackInfo,
    stop_process,
)
from harness.stack.target import Target

Clock = Callable[[], datetime]
# Exit code of a run stopped before its verdict (SIGINT, SIGTERM): neither a pass nor a fail.
EXIT_INCOMPLETE = 3
# A stop condition ended the drill (harness.live.stop): the load stopped, the faults rolled back.
EXIT_ABORTED = 4
ABORTED = "aborted"
# How long past the last quiet window the wait still expects a delayed (deferred) job back.
DEFERRAL_GRACE_S = 10.0
# The phase row (and summary key) saying what earlier runs left that this run ignored.
LEFTOVERS = "leftovers_ignored"


class Progress:
    """Progress with the elapsed time: long runs must say what they are doing.

    On a terminal the repeating status lines (the wait's deliveries seen, Locust's users and
    events injected) rewrite one line in place; anywhere else (CI logs, pipes) every line is
    kept as plain text.
    """

    LIVE_PHASES = ("wait", "locust")

    def __init__(self, out: Callable[[str], None] | None = None, stream: Any = None) -> None:
        self.stream = stream if stream is not None else sys.stdout
        self.out = out or (lambda line: print(line, file=self.stream, flush=True))
        self.live = out is None and bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = time.monotonic()
        self._status_shown = False

    def __call__(self, phase: str, message: str) -> None:
        line = f"[{time.monotonic() - self.start:6.1f}s] {phase:<9} {message}"
        if self.live and phase in self.LIVE_PHASES:
            self.stream.write("\r\033[K" + line[:200])
            self.stream.flush()
            self._status_shown = True
            return
        if self._status_shown:
            self.stream.write("\r\033[K")
            self._status_shown = False
        self.out(line)


@dataclass
class RunResult:
    run_dir: Path
    summary: dict[str, Any]

    @property
    def exit_code(self) -> int:
        codes = {"pass": 0, "incomplete": EXIT_INCOMPLETE, ABORTED: EXIT_ABORTED}
        return codes.get(self.summary["verdict"], 1)


def overall_verdict(verdicts: list[Verdict], error: str | None) -> str:
    """pass: every checker that applies passed; fail: one failed or the run errored; unknown:
    none failed but one could not decide (it crashed), or every checker was switched off (the
    system offers none of what they need). Switched-off checkers count neither way."""
    if error is not None or not verdicts or any(v.valid is False for v in verdicts):
        return "fail"
    applying = [v for v in verdicts if v.applies]
    if not applying:
        return "unknown"
    return "unknown" if any(v.valid is None for v in applying) else "pass"


def _json_default(value: Any) -> Any:
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return str(value)


def tenant_prefix(run_id: str, target: Target | None) -> str:
    """The population's tenant prefix: plain on the embedded reference (a new stack each run);
    on a team's long-lived system one of the run's own (a hash of the run id), so that the
    same seed's user ids never meet what an earlier run left behind."""
    if target is None:
        return "tenant"
    return f"tenant-{hashlib.sha256(run_id.encode()).hexdigest()[:6]}"


def new_run_id(scenario: str, seed: int, now: datetime) -> str:
    return f"{now:%Y%m%dT%H%M%SZ}-{scenario}-s{seed}"


def verdict_table(summary: dict[str, Any]) -> str:
    lines = [f"run {summary['run_id']}  scenario {summary['scenario']}  seed {summary['seed']}"]
    for name, result in summary["checkers"].items():
        status = STATUS_WORDS[result_status(result)]
        counts = ", ".join(
            f"{k}={v}"
            for k, v in result.items()
            if k != "valid" and isinstance(v, int) and not isinstance(v, bool)
        )
        lines.append(f"  {status:<7} {name:<18} {counts}")
        why = result.get(SWITCHED_OFF) or (result.get("unknown") if result["valid"] is None else "")
        if why:
            lines.append(f"          {why}")
    if summary.get("error"):
        lines.append(f"  ERROR {summary['error']}")
    stopped = summary.get("stopped")
    if stopped:
        first = ", ".join(f"{k}={v}" for k, v in stopped["first_evidence"].items())
        lines.append(f"  STOPPED by {stopped['condition']} (first evidence: {first})")
    left = {k: v for k, v in (summary.get(LEFTOVERS) or {}).items() if v}
    if left:
        lines.append(
            "  earlier runs' leftovers, ignored: " + ", ".join(f"{k}={v}" for k, v in left.items())
        )
    lines.append(f"verdict: {summary['verdict'].upper()}")
    return "\n".join(lines)


class Collector:
    """Pulls provider ledgers into the history as the run goes: every second from the stack's
    start (a killed run's streamed history holds them), and whenever the wait asks."""

    def __init__(
        self,
        history: History,
        controls: list[SimulatorControl],
        other_run: Callable[[str], bool] | None = None,
        sns: SnsObserver | None = None,
    ) -> None:
        self.history = history
        self.controls = controls
        # The SNS endpoint's publish and endpoint logs, when the system publishes through it.
        self.sns = sns
        # Rows of an earlier run's tenants (a long-lived system still delivering its backlog)
        # are counted and left out: they are no part of this run's oracle.
        self.other_run = other_run
        self.other_run_rows = 0
        self.delivered: set[tuple[str, str, str]] = set()
        # The same keys in the order they were first seen: a waiter counts what is new since
        # its last look instead of intersecting the whole set again (O(n) every 0.2 s made the
        # harness's own CPU grow through a long burst, on the cores the stack runs on).
        self.arrivals: list[tuple[str, str, str]] = []
        self.rows = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll(self) -> int:
        added = 0
        with self._lock:  # one reader of each ledger's cursor at a time
            for control in self.controls:
                rows = control.new_rows()
                if self.other_run is not None:
                    ours = [r for r in rows if not self.other_run(str(r.get("tenant_id")))]
                    self.other_run_rows += len(rows) - len(ours)
                    rows = ours
                self.history.extend_provider(rows)
                for row in rows:
                    if row.get("delivered", row["status"] == 200):
                        key = delivery_key(row["tenant_id"], row["notification_id"], row["token"])
                        if key not in self.delivered:
                            self.delivered.add(key)
                            self.arrivals.append(key)
                added += len(rows)
            self.rows += added
            if self.sns is not None:
                self.sns.poll(self.history)
        return added

    def start(self, interval_s: float = 1.0) -> None:
        self._thread = threading.Thread(target=self._run, args=(interval_s,), daemon=True)
        self._thread.start()

    def _run(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                self.poll()
            except Exception:  # a missed poll is taken by the next one
                continue

    def stop(self, timeout: float = 10.0) -> None:
        """Ends the polling, waiting up to ``timeout`` for a poll under way (an interrupted
        run waits less: its history is kept as it is)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)


class PushQueueProbe:
    """Messages visible or in flight in the push queue (delayed ones are deferrals) and in the
    fan-out's page-task queue when the system has one (a page task still to run means pushes
    still to come), read with one client and one URL lookup per queue for the whole wait."""

    def __init__(self, info: StackInfo, queues: Queues | None = None) -> None:
        queues = queues if queues is not None else _reference_queues(info)
        self.sqs = info.aws_client("sqs") if queues is not None else None
        self.urls = []
        for channel in ("push", "pages"):
            name = queues.work.get(channel) if queues is not None else None
            if name is None or self.sqs is None:
                continue
            try:
                self.urls.append(self.sqs.get_queue_url(QueueName=name)["QueueUrl"])
            except self.sqs.exceptions.QueueDoesNotExist:
                if channel == "push":
                    raise

    def busy(self) -> tuple[int, int]:
        """(jobs still queued, visible or in flight; jobs delayed): both 0 for a system whose
        queues the harness cannot see (the ledgers' quiet then decides alone)."""
        total = delayed = 0
        assert self.sqs is not None or not self.urls
        for url in self.urls:
            attrs = self.sqs.get_queue_attributes(
                QueueUrl=url,
                AttributeNames=[
                    "ApproximateNumberOfMessages",
                    "ApproximateNumberOfMessagesNotVisible",
                    "ApproximateNumberOfMessagesDelayed",
                ],
            )["Attributes"]
            total += int(attrs["ApproximateNumberOfMessages"]) + int(
                attrs["ApproximateNumberOfMessagesNotVisible"]
            )
            delayed += int(attrs.get("ApproximateNumberOfMessagesDelayed", 0))
        return total, delayed


class QueueSampler:
    """Samples the push queue and its dead-letter queues once a second into the history (kind
    ``sample``), so the report can draw queue depth against the fault windows."""

    ATTRIBUTES = [
        "ApproximateNumberOfMessages",
        "ApproximateNumberOfMessagesNotVisible",
        "ApproximateNumberOfMessagesDelayed",
    ]

    def __init__(
        self,
        info: StackInfo,
        history: History,
        interval_s: float = 1.0,
        queues: Queues | None = None,
    ) -> None:
        self.history = history
        self.interval_s = interval_s
        self.alarm = ThresholdAlarm("dlq-depth", DLQ_DEPTH_THRESHOLD)
        queues = queues if queues is not None else _reference_queues(info)
        self.sqs = info.aws_client("sqs")
        names = [] if queues is None else [
            n for n in (queues.work.get("push"), queues.dead.get("push"), queues.poison.get("push"))
            if n
        ]  # fmt: skip
        self.dead = set() if queues is None else {queues.dead.get("push")}
        self.queues = {n: self.sqs.get_queue_url(QueueName=n)["QueueUrl"] for n in names}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="queue-sampler", daemon=True)

    def sample(self) -> None:
        for name, url in self.queues.items():
            attrs = self.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=self.ATTRIBUTES)
            values = [int(attrs["Attributes"].get(a, 0)) for a in self.ATTRIBUTES]
            if name in self.dead:
                state = self.alarm.observe(name, sum(values))
                if state is not None:
                    self.history.append(
                        "alarm",
                        reason=state,
                        detail=json.dumps(
                            {
                                "alarm": self.alarm.name,
                                "queue": name,
                                "depth": sum(values),
                                "threshold": self.alarm.threshold,
                            }
                        ),  # fmt: skip
                    )
            self.history.append(
                "sample",
                detail=json.dumps(
                    {
                        "queue": name,
                        "depth": sum(values),
                        "visible": values[0],
                        "in_flight": values[1],
                        "delayed": values[2],
                    }
                ),  # fmt: skip
            )

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sample()
            except Exception:  # a missed sample must not end the run; the next one may work
                continue

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=timeout)


def wait_for_outcome(
    collector: Collector,
    expected: set[tuple[str, str, str]],
    info: StackInfo,
    deadline: float,
    progress: Progress,
    release_by: float = 0.0,
    quiet_seconds: float = 2.0,
    settle_seconds: float = 5.0,
    queues: Queues | None = None,
    digest_window_s: float = 0.0,
) -> str:
    """Wait for the outcome, on conditions only. Returns:

    * ``complete``: every expected delivery seen, the push queue idle, the ledgers quiet;
    * ``settled``: not all seen, but nothing more can come: every quiet-hours window the
      oracle knows of has ended (``release_by``, epoch), the queue holds nothing visible or in
      flight, and the ledgers and the queue have been still for ``settle_seconds``, or for a
      whole ``digest_window_s`` and a second when the system states a rate-limit window: a
      held notification leaves no trace until its window closes and its digest goes out (a
      lost job never returns);
    * ``timeout``: the deadline passed first.
    """
    last_report = 0.0
    last_change = time.monotonic()
    queue = PushQueueProbe(info, queues)
    done = counted = 0
    settle_for = max(settle_seconds, digest_window_s + 1.0 if digest_window_s > 0 else 0.0)
    while time.monotonic() < deadline:
        if collector.poll():
            last_change = time.monotonic()
        arrived = collector.arrivals[counted:]
        counted += len(arrived)
        done += sum(1 for key in arrived if key in expected)
        now = time.monotonic()
        if now - last_report >= 5:
            progress("wait", f"{done}/{len(expected)} expected deliveries seen")
            last_report = now
        still = now - last_change
        if still >= quiet_seconds:
            busy, delayed = queue.busy()
            # A job deferred as a delayed copy (a system that re-enqueues for quiet hours) may
            # come back just after its window ends, by the system's own reading of it: wait a
            # little past the last window while any is delayed. Longer-delayed ones are
            # deferrals for windows lasting past the run, and are not waited for.
            grace = DEFERRAL_GRACE_S if delayed else 0.0
            if busy > 0:
                # A job still to run may open a window: stillness counts from when none is.
                last_change = max(last_change, now - quiet_seconds)
            elif done == len(expected):
                collector.poll()
                return "complete"
            elif time.time() >= release_by + grace and still >= settle_for:
                collector.poll()
                return "settled"
        time.sleep(0.2)
    return "timeout"


def _sns_url(stack: Stack, info: StackInfo) -> str | None:
    """The SNS endpoint the system publishes to, when it is one the harness can read: the
    stack's own part (the reference on SNS, a target's sns_listen) or a target's sns_endpoint."""
    if "sns" in info.parts:
        return info.parts["sns"].url
    return stack.target.sns_endpoint if stack.target is not None else None


def _chaos_targets(stack: Stack, info: StackInfo) -> ChaosTargets:
    parts = info.parts
    target = stack.target
    toxiproxy = parts["toxiproxy"].url if "toxiproxy" in parts else None
    return ChaosTargets(
        toxiproxy_url=toxiproxy or info.endpoints.get("toxiproxy"),
        apns_url=info.url("apns"),
        apns_ca_file=info.tls_ca,
        fcm_url=info.url("fcm"),
        # The channel simulators, when the stack runs them (a target's own are not ours).
        ses_url=parts["ses"].url if "ses" in parts else None,
        inapp_url=parts["inapp"].url if "inapp" in parts else None,
        # The SQS endpoint's control API: the stack's own, or a target's when it uses ours.
        sqs_url=parts["sqs"].url if "sqs" in parts else (target.sqs_control if target else None),
        # The SNS endpoint the system publishes to (the stack's, or served at a target's).
        sns_url=_sns_url(stack, info),
        kinesis_proxy_url=parts["kinesis-proxy"].url if "kinesis-proxy" in parts else None,
        # A target's processes only through the hooks its target file names.
        processes=(
            stack
            if target is None
            else ShellProcesses(target.processes)
            if target.processes
            else None
        ),
        dedup_proxy=target.dedup_proxy if target is not None else DEDUP_PROXY,
    )


def _bind(
    action: Callable[[ActionContext, dict[str, Any]], str],
    context: ActionContext,
    params: dict[str, Any],
) -> Callable[[], str]:
    return lambda: action(context, params)


def _driver_args(target: Target | None) -> list[str]:
    """The load generator's arguments naming the system's driver (a target's own, if any)."""
    if target is None or not target.driver:
        return []
    return ["--driver", target.driver, "--driver-options", json.dumps(target.driver_options or {})]


class ScenarioDoesNotFit(Exception):
    """The scenario schedules a fault or action the system under test does not offer."""


DOES_NOT_FIT = "does not fit the system: "


def _require_fit(scenario: Scenario, contract: SystemContract, targets: ChaosTargets) -> None:
    """Raise :class:`ScenarioDoesNotFit` naming every fault and action the system lacks, before
    the population is loaded (a verdict on a run whose faults could not act would be a lie)."""
    # A team's own function (a provider) says for itself what it can do.
    builtin = [f for f in scenario.faults if f.provider is None]
    lacks = [why for f in builtin if (why := fault_unavailable(f.name, targets))]
    capabilities = contract.capabilities()
    for a in scenario.actions:
        if a.provider is not None:
            continue
        why = action_unavailable(a.name, a.params, capabilities)
        if why:
            lacks.append(why)
    if scenario.clock is not None and contract.clock is None:
        lacks.append(
            "configuration.clock moves the system's clock across a midnight, and it declares "
            "no clock the harness can move (contract capability clock: a target's clock_file; "
            "the reference needs libfaketime: pip install libfaketime, or apt-get install "
            "libfaketime)"
        )
    if lacks:
        raise ScenarioDoesNotFit(
            f"scenario {scenario.name} cannot run on {contract.name}: "
            + "; ".join(dict.fromkeys(lacks))
        )


def _mark_what_came_before(state: RunState) -> None:
    """Where this run's evidence begins in what a long-lived system and environment keep: the
    SQS receive log's position, the dedup keys already there."""
    contract = state.contract
    assert contract is not None
    state.began_at = time.time()
    if contract.sqs_log_url:
        state.receive_log_from = log_position(contract.sqs_log_url)
    pattern = contract.policy.dedup_key_pattern
    if contract.dedup_store_url and pattern:
        state.dedup_pattern = run_pattern(pattern, tenant_prefix(state.run_dir.name, state.target))
        if state.dedup_pattern == pattern:  # the keys do not carry the run's tenants
            try:
                state.earlier_dedup_keys = existing_keys(contract.dedup_store_url, pattern)
            except redis.RedisError as exc:
                state.progress("stack", f"the dedup store's keys could not be read: {exc}")
                state.earlier_dedup_keys = None
        if state.earlier_dedup_keys:
            state.progress(
                "stack",
                f"{len(state.earlier_dedup_keys)} dedup key(s) of earlier runs: not judged",
            )


def _lacking(scenario: Scenario, capabilities: frozenset[str]) -> str:
    """What the scenario's checkers need that the system does not offer, said plainly."""
    from harness.checkers import registry

    missing = {
        p.name: sorted(registry.get(p.name).needs - capabilities)
        for p in scenario.probes
        if p.provider is None  # a team's own probe states no needs
    }
    return "; ".join(f"{name} needs {', '.join(m)}" for name, m in missing.items() if m)


def _reference_queues(info: StackInfo) -> Queues | None:
    """The embedded reference's queues (callers that know no contract)."""
    from harness.stack.reference import contract

    return contract(info, durable=False).queues


def _redrive_all(info: StackInfo, queues: Queues, history: History, prefix: str) -> str:
    def mine(tenant: str) -> bool:
        return not of_another_run(tenant, prefix)

    moved = redrive_recorded(info.aws_client("sqs"), queues, history, mine)
    return f"moved {sum(moved.values())} message(s) back ({moved})"


def _revive(info: StackInfo, platform: str, tokens: list[str]) -> None:
    """Dead tokens answer again at the platform's simulator (an app installed again)."""
    control = SimulatorControl(info.url(platform), info.tls_ca if platform == "apns" else None)
    try:
        control.revive(tokens)
    finally:
        control.close()


def _raw_sender(info: StackInfo, queues: Queues) -> Callable[[str, str, dict[str, Any]], None]:
    """Sends a raw message to a channel's work queue through the public SQS API."""
    sqs = info.aws_client("sqs")
    urls: dict[str, str] = {}

    def send(channel: str, body: str, attributes: dict[str, Any]) -> None:
        if channel not in urls:
            urls[channel] = sqs.get_queue_url(QueueName=queues.work[channel])["QueueUrl"]
        sqs.send_message(QueueUrl=urls[channel], MessageBody=body, MessageAttributes=attributes)

    return send


def _existing_poison_queues(info: StackInfo, queues: Queues) -> tuple[str, ...]:
    """The delivery channels whose poison queue the contract names and SQS knows."""
    sqs = info.aws_client("sqs")
    found = []
    for channel in queues.delivery_channels:
        name = queues.poison.get(channel)
        if not name:
            continue
        try:
            sqs.get_queue_url(QueueName=name)
        except sqs.exceptions.QueueDoesNotExist:
            continue
        found.append(channel)
    return tuple(found)


def _record_dlqs(info: StackInfo, history: History, queues: Queues, prefix: str) -> tuple[int, int]:
    """The dead-letter queues' contents, as the operator would see them at the end of the run:
    (messages of this run recorded, messages of earlier runs left out). A message is an
    earlier run's when it names another run's tenant, or carries a malformed-job id this run
    did not inject (a long-lived system's DLQ keeps what every run parked)."""
    sqs = info.aws_client("sqs")
    frame = history.frame(without=CHECKER_ONLY_KINDS)
    ours = set(frame.loc[frame["kind"] == "malformed", "notification_id"].astype(str))
    recorded = earlier = 0
    for channel in queues.delivery_channels:
        for name in (queues.dead.get(channel), queues.poison.get(channel)):
            if not name:
                continue
            try:
                url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
            except sqs.exceptions.QueueDoesNotExist:
                continue
            held: list[str] = []
            for _ in range(10_000):  # bounded: a DLQ holds at most the runs' jobs
                messages = sqs.receive_message(
                    QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0, VisibilityTimeout=300
                ).get("Messages", [])
                if not messages:
                    break
                held += [m["ReceiptHandle"] for m in messages]
                for m in messages:
                    tenant, notification, recipient = queues.read_job(m["Body"])
                    marker = malformed_id_in(m["Body"])
                    if (marker is not None and marker not in ours) or (
                        tenant is not None and of_another_run(str(tenant), prefix)
                    ):
                        earlier += 1
                        continue
                    history.append(
                        "dlq",
                        tenant_id=tenant,
                        notification_id=notification,
                        detail=json.dumps(
                            {
                                "queue": name,
                                "kind": "poison" if name == queues.poison.get(channel) else "dead",
                                "recipient_user_id": recipient,
                                # A job the harness put there malformed (inject-malformed-jobs).
                                "malformed_id": marker,
                            }
                        ),
                    )
                    recorded += 1
            _show_again(sqs, url, held)
    return recorded, earlier


def _show_again(sqs: Any, url: str, receipts: list[str]) -> None:
    """Read, not taken: the messages are visible again at once, to the operator and the next
    run, as they were before the harness looked (hidden only while it read them all once)."""
    for start in range(0, len(receipts), 10):
        entries = [
            {"Id": str(i), "ReceiptHandle": r, "VisibilityTimeout": 0}
            for i, r in enumerate(receipts[start : start + 10])
        ]
        with contextlib.suppress(BotoCoreError, ClientError):
            sqs.change_message_visibility_batch(QueueUrl=url, Entries=entries)


def _record_redrive_policies(info: StackInfo, history: History, queues: Queues) -> int:
    """Each delivery queue's redrive policy as SQS states it (GetQueueAttributes), one
    ``queue_policy`` row each: where its failed jobs go, after how many receives."""
    sqs = info.aws_client("sqs")
    recorded = 0
    for channel in queues.delivery_channels:
        name = queues.work[channel]
        try:
            url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
            attributes = sqs.get_queue_attributes(
                QueueUrl=url, AttributeNames=["RedrivePolicy"]
            ).get("Attributes", {})
        except sqs.exceptions.QueueDoesNotExist:
            continue
        policy = json.loads(attributes.get("RedrivePolicy") or "null")
        history.append(
            "queue_policy",
            detail=json.dumps(
                {
                    "queue": name,
                    "dead": queues.dead.get(channel),
                    "dead_letter_target": (policy or {}).get("deadLetterTargetArn"),
                    "max_receive_count": (policy or {}).get("maxReceiveCount"),
                }
            ),
        )
        recorded += 1
    return recorded


def _inject(
    scenario: Scenario,
    population: Population,
    history: History,
    api_url: str,
    seed: int,
    driver: Driver | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Post the scenario's events, spread evenly over ``load.spread_s`` (a paced, bounded loop);
    ``stop``: set, no more posts (a stop condition fired)."""
    stop = stop or threading.Event()
    rng = random.Random(seed)
    posts = []
    for author in population.authors:
        count = scenario.celebrity_posts if author.celebrity else scenario.regular_posts
        posts += [(author, n) for n in range(count)]
    gap = scenario.load.spread_s / max(1, len(posts) - 1) if len(posts) > 1 else 0.0
    shared_ids: dict[tuple[str, int], str] = {}
    t0 = time.monotonic()
    with httpx.Client(base_url=api_url, timeout=10) as http:
        for i, (author, n) in enumerate(posts):
            delay = t0 + i * gap - time.monotonic()
            if stop.wait(max(0.0, delay)):
                return
            event_id = None
            if scenario.load.shared_event_ids:
                event_id = shared_ids.setdefault((author.user_id, n), str(ULID()))
            post_event(
                http,
                history,
                author.tenant_id,
                author.user_id,
                scenario.load.kind,
                f"{scenario.load.kind}-{author.user_id}-{n}-{rng.randrange(10**6)}",
                event_id,
                driver,
                system_minted=scenario.load.system_minted_ids and event_id is None,
            )


def _inject_with_locust(
    scenario: Scenario,
    run_dir: Path,
    api_url: str,
    seed: int,
    workers: int | None,
    history: History,
    on_start: Callable[[], None],
    progress: Progress,
    stack: Stack | None = None,
    driver_args: Sequence[str] = (),
    start_at: float | None = None,
) -> None:
    """Run the scenario's locustfile through ``harness.load.loadgen`` (Locust's library API, in its
    own process: Locust monkey-patches with gevent), start the faults when the load starts, and
    record what the users injected as they go. The load generator runs in a session of its own
    (its Locust workers in its process group), adopted by the stack: stopped with it, reaped if
    the harness is killed."""
    from harness.model.shapes import LoadPlan

    assert scenario.locust is not None
    shape = Path(scenario.locust.locustfile).stem
    plan = LoadPlan.from_mapping({**scenario.locust.plan, "shape": shape})
    out = run_dir / "locust"
    out.mkdir(exist_ok=True)
    workers = scenario.locust.workers if workers is None else workers
    argv = [
        sys.executable, "-m", "harness.load.loadgen",
        "--locustfile", scenario.locust.locustfile,
        "--host", api_url,
        "--population", str(run_dir / "population.json"),
        "--plan", json.dumps(scenario.locust.plan),
        "--out", str(out),
        "--workers", str(workers),
        "--seed", str(seed),
        "--timeout", str(plan.duration_s + 60),
        "--stop-file", str(out / LOAD_STOP_FILE),
        *(["--otel"] if scenario.locust.otel else []),
        *driver_args,
        *(["--start-at", repr(start_at)] if start_at is not None else []),
    ]  # fmt: skip
    started = False
    tail = LoadTail(out, history)
    tail.start()
    with open(out / "loadgen.log", "w") as log:
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
            start_new_session=True,
        )
        if stack is not None:
            stack.adopt("loadgen", proc)
        # Its process group (Locust's workers included), for whoever checks nothing outlived us.
        history.append("phase", detail=json.dumps({"loadgen": proc.pid}))
        try:
            assert proc.stdout is not None
            # Bounded: loadgen stops itself at plan end + 60 s, and quits its workers.
            for line in proc.stdout:
                log.write(line)
                if line.startswith("locust: "):
                    if not started and line.startswith("locust: started"):
                        started = True
                        on_start()
                    progress("locust", line.removeprefix("locust: ").rstrip())
            proc.wait(timeout=30)
        except BaseException:
            # Interrupted, or the wait timed out: with a stack, the load generator is stopped
            # with every other part, at once; alone, here.
            tail.finish()
            if stack is None and proc.poll() is None:
                stop_process(proc)
            raise
        if proc.poll() is None:
            stop_process(proc)
        if stack is not None:
            stack.release(proc)
    if not started:
        on_start()  # faults and rollbacks still run, so the run says what happened
    tail.finish()
    if proc.returncode != 0:
        raised = _load_exceptions(out / "locust_summary.json")
        raise RuntimeError(
            f"the Locust load exited with code {proc.returncode}"
            + (f" (its users raised: {raised})" if raised else "")
            + f"; log {out / 'loadgen.log'}"
        )


def _load_exceptions(path: Path) -> str:
    try:
        exceptions = json.loads(path.read_text()).get("exceptions") or []
    except (OSError, ValueError):
        return ""
    return "; ".join(f"{e['msg']} ({e['count']}x)" for e in exceptions)


def read_injected(path: Path) -> list[dict[str, Any]]:
    """The accepted events of an injected.jsonl (folded per event: sent ``time``, answered
    ``end``); a line cut short by a crash is skipped, the rest kept."""
    return fold_injected(read_rows(path)).accepted


def _wait_for_channels(
    channels: ChannelLedgers, expected: pd.DataFrame, deadline: float, progress: Progress
) -> None:
    """Email, in-app and SMS deliveries of the run, on a condition: all seen, or quiet for 5 s
    (a lost one never comes), or the run's deadline."""
    seen, last_change, last_report = -1, time.monotonic(), 0.0
    while time.monotonic() < deadline:
        channels.poll()
        now_seen = channels.seen(expected)
        if now_seen != seen:
            seen, last_change = now_seen, time.monotonic()
        if seen == len(expected) or time.monotonic() - last_change >= 5:
            break
        if time.monotonic() - last_report >= 5:
            progress("wait", f"{seen}/{len(expected)} email, in-app and SMS deliveries seen")
            last_report = time.monotonic()
        time.sleep(0.2)
    progress("collect", f"{seen}/{len(expected)} email, in-app and SMS deliveries seen")


@dataclass
class RunState:
    """What a run's phases hand on to each other (each phase fills in its part)."""

    scenario: Scenario
    seed: int
    run_dir: Path
    progress: Progress
    clock: Clock
    stack: Stack
    target: Target | None
    locust_workers: int | None
    history: History
    errors: list[str] = field(default_factory=list)
    info: StackInfo | None = None
    contract: SystemContract | None = None
    targets: ChaosTargets | None = None
    population: Population | None = None
    collector: Collector | None = None
    sampler: QueueSampler | None = None
    nemesis: Nemesis | None = None
    actions: ActionContext | None = None
    channels: ChannelLedgers | None = None
    channel_urls: dict[str, str] = field(default_factory=dict)
    deadline: float = 0.0
    injected: pd.DataFrame | None = None
    outcome: str = ""
    # When the run began (monotonic, and epoch): before any dedup key of it was set.
    began: float = field(default_factory=time.monotonic)
    began_at: float = field(default_factory=time.time)
    # What a long-lived system kept from earlier runs, never judged as this run's: where the
    # SQS endpoint's receive log stood, and the dedup keys that existed (None: too many to
    # tell apart), under the pattern this run reads (its tenants' own where the system's keys
    # carry them).
    receive_log_from: int = 0
    dedup_pattern: str | None = None
    earlier_dedup_keys: frozenset[bytes] | None = frozenset()
    # How far the system's clock runs ahead of real time (seconds), and the real instant
    # (epoch) at which it shows the scenario's midnight (configuration.clock), if it does.
    clock_offset_s: int = 0
    boundary: float | None = None
    # The live view (metrics, online checks, stop conditions), and the event that stops the
    # load when a stop condition fires.
    live: LiveView | None = None
    load_stop: threading.Event = field(default_factory=threading.Event)
    # Wall seconds of each phase, and of each checker while judging (the summary's
    # ``phase_seconds`` and ``checker_seconds``: how a run's cost grows with its size).
    phase_seconds: dict[str, float] = field(default_factory=dict)
    checker_seconds: dict[str, float] = field(default_factory=dict)
    # The harness's peak resident memory when each phase ended (MB): which phase grows it;
    # and while each checker judged (its own peak, None where it cannot be told apart).
    phase_peak_rss_mb: dict[str, float] = field(default_factory=dict)
    checker_peak_rss_mb: dict[str, float | None] = field(default_factory=dict)


def _timed(state: RunState, phase: str, step: Callable[[RunState], Any]) -> Any:
    """``step(state)``, its wall time added to ``phase`` (also when it raises)."""
    started = time.monotonic()
    try:
        return step(state)
    finally:
        spent = time.monotonic() - started
        state.phase_seconds[phase] = round(state.phase_seconds.get(phase, 0.0) + spent, 3)
        state.phase_peak_rss_mb[phase] = peak_mb()


def execute(
    scenario: Scenario,
    seed: int,
    run_dir: Path,
    progress: Progress,
    clock: Clock,
    stack_factory: Callable[[Path], Stack] | None = None,
    locust_workers: int | None = None,
    target: Target | None = None,
    history: History | None = None,
    live: LiveView | None = None,
    timings: dict[str, dict[str, float]] | None = None,
) -> tuple[History, Population | None, list[Verdict], str | None]:
    """The run's phases in order: bring up, load the population, inject (faults on their
    schedule), await the outcome, collect, judge; the stack always comes down. ``timings``
    gets each phase's wall seconds (``phases``) and each checker's (``checkers``)."""
    # A team's long-lived environment, when it is up, serves the run (`harness env up`).
    attach = environment.running(target) if target is not None else None
    if attach is not None:
        progress("stack", f"using the long-lived environment of {target.name} (harness env)")  # type: ignore[union-attr]
    stack = (
        stack_factory
        or (
            lambda d: Stack(
                d,
                durable_redis=scenario.durable_redis,
                reference_overrides=scenario.reference,
                target=target,
                movable_clock=scenario.clock is not None,
                attach=attach,
            )
        )
    )(run_dir / "stack")
    state = RunState(
        scenario, seed, run_dir, progress, clock, stack, target, locust_workers,
        history if history is not None else History(),
    )  # fmt: skip
    errors = state.errors
    interrupted = False
    if live is not None:
        state.live = live
        live.on_stop = lambda stop: _abort(state, stop)
    if timings is not None:
        timings["phases"] = state.phase_seconds
        timings["checkers"] = state.checker_seconds
        timings["peak_rss_mb"] = state.phase_peak_rss_mb
        timings["checker_peak_rss_mb"] = state.checker_peak_rss_mb  # type: ignore[assignment]
    try:
        _timed(state, "bring_up", _bring_up)
        _arm_live(state)
        _state_provider_limits(state)
        _timed(state, "bring_up", _move_clock)
        _timed(state, "load_population", _load_population)
        if live is not None:
            live.lever_armed.set()
        _timed(state, "inject", _inject_load)
        _timed(state, "await", _await_outcome)
        if live is not None:
            live.lever_armed.clear()
        _timed(state, "collect", _collect)
        verdicts = _timed(state, "judge", _judge)
        return state.history, state.population, verdicts, "; ".join(errors) or None
    except RunInterrupted as exc:
        interrupted = True
        errors.append(str(exc))
    except ScenarioDoesNotFit as exc:
        progress("stack", str(exc))
        errors.append(f"{DOES_NOT_FIT}{exc}")
    except BaseException as exc:  # the run still leaves its history and says what failed
        errors.append(f"{type(exc).__name__}: {exc}")
        (run_dir / "error.txt").write_text(traceback.format_exc())
    finally:
        _timed(state, "tear_down", lambda s: _tear_down(s, interrupted))
    return state.history, state.population, [], "; ".join(errors)


def _bring_up(state: RunState) -> None:
    """The stack (or a target's proxies and simulators), its contract, and whether the
    scenario fits it."""
    scenario, progress, target, stack = state.scenario, state.progress, state.target, state.stack
    if target is None:
        progress(
            "stack",
            "starting redis, fault proxies, dynalite, kinesalite, SQS, simulators, workers",
        )
    elif stack.attached is not None:
        progress("stack", f"target {target.name}: its environment's parts, reset for this run")
    else:
        progress("stack", f"target {target.name}: starting the fault proxies and simulators")
        if scenario.reference or scenario.durable_redis:
            progress("stack", "the scenario's reference settings do not apply to a target")
    info = state.info = stack.up()
    contract = state.contract = stack.contract(durable=scenario.durable_redis or target is not None)
    lacking = _lacking(scenario, contract.capabilities())
    if lacking:
        progress("stack", f"{contract.name} lacks {lacking}: those checkers are switched off")
    state.targets = _chaos_targets(stack, info)
    _require_fit(scenario, contract, state.targets)
    if target is not None:
        environment.tell_payload_ids(info, target)
    _mark_what_came_before(state)
    pids = {name: part.pid for name, part in info.parts.items()}
    state.history.append("phase", detail=json.dumps({"stack_up": pids}))
    progress(
        "stack", f"ready ({len(info.parts)} parts, logs in {state.run_dir / 'stack' / 'logs'})"
    )


def _arm_live(state: RunState) -> None:
    """The online checks judge by the system's stated policy and the scenario's tolerances."""
    if state.live is None or state.contract is None:
        return
    checks = state.live.checks
    checks.fallback = state.contract.policy.dedup_fallback
    for probe in state.scenario.probes:
        if probe.name == "fail_closed" and isinstance(probe.tolerance, dict):
            checks.grace_s = float(probe.tolerance.get("grace_s", checks.grace_s))
        if probe.name == "backpressure" and isinstance(probe.tolerance, dict):
            checks.slack_s = float(probe.tolerance.get("slack_s", checks.slack_s))
        if probe.name == "dead_tokens" and isinstance(probe.tolerance, dict):
            checks.transit_s = float(probe.tolerance.get("transit_s", checks.transit_s))


def _arm_live_population(state: RunState) -> None:
    """The live quiet-hours, consent and latency checks, on a run that changes no user and judges those
    promises: the final checkers leave a changed user to ``preference_changes``, and a change
    (a built-in action's, or any a Python action may make) can come after a delivery."""
    if state.live is None or state.population is None:
        return
    scenario = state.scenario
    steps = (*scenario.actions, *scenario.rollbacks)
    if any(a.provider is not None or a.name in USER_CHANGING_ACTIONS for a in steps):
        return
    judged = {probe.name for probe in scenario.probes}
    population = state.population
    state.live.checks.watch_population(
        frozenset(quiet_all_run(population)) if "quiet_hours" in judged else frozenset(),
        frozenset(refused_devices(population)) if "consent" in judged else frozenset(),
    )
    policy = state.contract.policy if state.contract is not None else None
    limited = policy is None or policy.rate_limit_per_window or policy.daily_limit_per_device_type
    if "delivery_latency" in judged and not limited:
        # A stated rate limit makes some required pushes optional once its budget shows spent
        # (harness.checkers.limited): the final would not judge them; live cannot tell yet.
        assert policy is not None
        tolerance = next(
            (p.tolerance for p in scenario.probes if p.name == "delivery_latency"), None
        )
        tolerance = tolerance if isinstance(tolerance, dict) else {}
        bound = tolerance.get("bound_s")
        state.live.checks.watch_latency(
            required_push_recipients(population),
            {(a.tenant_id, a.user_id): frozenset(a.followers) for a in population.authors},
            bound_s=float(policy.delivery_bound_s if bound is None else bound),
            recovery_s=float(tolerance.get("recovery_s", DEFAULT_RECOVERY_S)),
        )


def _abort(state: RunState, stop: Stop) -> None:
    """A stop condition fired (from the live view's thread): stop the load, roll every fault
    back; the run then drains what was accepted, judges it and ends ``aborted``."""
    state.load_stop.set()
    locust_dir = state.run_dir / "locust"
    if locust_dir.is_dir():
        (locust_dir / LOAD_STOP_FILE).write_text(json.dumps(stop.to_dict()))
    state.progress("stop", f"{stop.condition}: stopping the load and rolling back the faults")
    if state.nemesis is not None:
        undone = state.nemesis.rollback(hurry=True)
        if undone:
            state.progress("rollback", f"undid {', '.join(undone)}")


def _state_provider_limits(state: RunState) -> None:
    """The FCM project quota the scenario asks for set on the simulator, and the limits in
    force read back from it and recorded (a ``provider_limits`` row): the quota is always on,
    and the checkers judge the rate against what this run had."""
    assert state.info is not None
    if "fcm" not in state.info.parts:
        return
    fcm = SimulatorControl(state.info.url("fcm"))
    try:
        wanted = state.scenario.fcm_project_quota
        quota = fcm.project_quota(wanted)
        strict = fcm.strict()
    finally:
        fcm.close()
    limits = ProviderLimits(
        "fcm",
        project_quota=quota if strict else None,
        device_per_minute=DEVICE_PER_MINUTE if strict else None,
        device_per_hour=DEVICE_PER_HOUR if strict else None,
        window_s=FCM_QUOTA_WINDOW_S,
        enforced=strict,
        set_by="scenario" if wanted is not None else "provider",
    )
    state.history.append(LIMITS_KIND, detail=limits.to_detail())
    state.progress(
        "stack",
        f"FCM project quota {quota:,}/min per project"
        + (" (set by the scenario)" if wanted is not None else "")
        + ("" if strict else ": not enforced (the simulator runs lenient)"),
    )


def _move_clock(state: RunState) -> None:
    """With ``configuration.clock``: the system's clock moved forward so that it shows the
    scenario's midnight ``at_s`` into the load, allowing ``lead_s`` for the population's load
    (the load waits for the rest: :func:`_await_boundary`); recorded in the history."""
    step, contract = state.scenario.clock, state.contract
    if step is None:
        return
    assert contract is not None and contract.clock is not None
    aim = state.clock().timestamp() + step.lead_s + step.at_s
    offset = offset_to_midnight(aim, step.midnight)
    contract.clock.set_offset(offset)
    state.clock_offset_s, state.boundary = offset, midnight_at(offset, aim, step.midnight)
    state.history.append("phase", detail=phase_detail(offset, step.midnight, state.boundary))
    shown = datetime.fromtimestamp(state.boundary + offset, ZoneInfo(step.midnight))
    state.progress(
        "clock",
        f"the system's clock moved {offset} s ahead: it shows {shown.isoformat()} "
        f"(midnight in {step.midnight}) {step.at_s:g} s into the load",
    )
    # libfaketime re-reads the offset file every CACHE_SECONDS: every process has it after.
    time.sleep(CACHE_SECONDS + 1.0)


def _await_boundary(state: RunState) -> None:
    """Start the built-in injector's load ``at_s`` before the system's clock shows the
    scenario's midnight (the population's load took less than ``lead_s``)."""
    step = state.scenario.clock
    start_at = _load_start_at(state, "waiting")
    if step is not None and start_at is not None:
        wait = start_at - state.clock().timestamp()
        if wait > 0:
            time.sleep(min(wait, step.lead_s))


def _load_start_at(state: RunState, waiter: str = "Locust waits for it") -> float | None:
    """When the load must start (``at_s`` before the system's clock shows the scenario's
    midnight), said with how long is left, or how late it is; None without a clock step. A
    Locust load waits for it itself: started at once, its own start-up no longer moves the load
    against the boundary."""
    step = state.scenario.clock
    if step is None or state.boundary is None:
        return None
    start_at = state.boundary - step.at_s
    wait = start_at - state.clock().timestamp()
    if wait < 0:
        state.progress(
            "clock", f"the load starts {-wait:.1f} s late: the midnight falls earlier in it"
        )
    else:
        state.progress("clock", f"the load starts in {wait:.1f} s ({waiter})")
    return start_at


def _load_population(state: RunState) -> None:
    """The oracle's population, generated, told to the simulators (dead tokens) and loaded
    through the system's driver; the provider ledgers collected from here on."""
    assert state.info is not None and state.contract is not None
    info, progress, history = state.info, state.progress, state.history
    prefix = tenant_prefix(state.run_dir.name, state.target)
    population = state.population = generate(
        state.seed, state.clock(), state.scenario.population, prefix,
        clock_offset_s=state.clock_offset_s,
    )  # fmt: skip
    if state.target is not None:
        progress("load", f"tenants {prefix}-0.. (this run's own, apart from earlier runs')")
    population.save(state.run_dir / "population.json")
    apns = SimulatorControl(info.url("apns"), info.tls_ca)
    fcm = SimulatorControl(info.url("fcm"))
    dead_apns = [d.token for d in population.devices if d.dead and d.platform == "apns"]
    bad = bad_device_tokens(dead_apns, state.scenario.population.bad_device_token_fraction)
    apns.unregister([t for t in dead_apns if t not in bad])
    apns.unregister(sorted(bad), reason="BadDeviceToken")
    fcm.unregister([d.token for d in population.devices if d.dead and d.platform == "fcm"])
    sns_url = _sns_url(state.stack, info)
    sns = SnsObserver(sns_url) if sns_url else None
    if sns is not None and state.target is not None:
        skipped = sns.skip_to_end()  # an SNS endpoint that outlives runs: earlier runs' rows
        if skipped:
            progress("load", f"{skipped} SNS log row(s) of earlier runs skipped")
    state.collector = Collector(
        history, [apns, fcm], lambda tenant: of_another_run(tenant, prefix), sns=sns
    )
    state.collector.start()
    calls = load_population(state.contract.api_url, population, driver=state.contract.driver)
    if "inapp" in info.parts:
        register_online_users(info.url("inapp"), population)
    if state.contract.sms_ledger_url:
        # Before any event: these numbers replied STOP before the run.
        opt_out_numbers(state.contract.sms_ledger_url, population)
    history.append("phase", detail="population_loaded")
    _arm_live_population(state)
    progress(
        "load",
        f"{len(population.users)} users, {len(population.devices)} devices, "
        f"{len(population.authors)} authors ({calls} API calls)",
    )


def _inject_load(state: RunState) -> None:
    """The load (Locust or the built-in injector) with the nemesis's faults and actions on
    their schedule; returns when the schedule is done or the run's deadline passed."""
    assert state.info is not None and state.contract is not None
    assert state.population is not None and state.targets is not None
    scenario, info, contract, progress = state.scenario, state.info, state.contract, state.progress
    queues = contract.queues
    this_run = tenant_prefix(state.run_dir.name, state.target)
    if queues is not None:
        state.sampler = QueueSampler(info, state.history, queues=queues)
        state.sampler.start()
    actions = state.actions = ActionContext(
        api_url=contract.api_url,
        population=state.population,
        history=state.history,
        seed=state.seed,
        table_writer=contract.table_writer,
        driver=contract.driver,
        redrive=(
            (lambda: _redrive_all(info, queues, state.history, this_run))
            if queues is not None
            else None
        ),
        bound_s=scenario.preference_bound_s,
        send_raw=_raw_sender(info, queues) if queues is not None else None,
        poison_channels=_existing_poison_queues(info, queues) if queues is not None else (),
        job_template=queues.job_template if queues is not None else None,
        erasure_done=contract.erasure_done,
        clock_offset_s=state.clock_offset_s,
        revive=lambda platform, tokens: _revive(info, platform, tokens),
    )
    nemesis = state.nemesis = Nemesis(
        [ScheduledFault(fault_of(f), f.offset_s, f.duration_s) for f in scenario.faults],
        state.targets,
        state.history,
        log=lambda line: progress("nemesis", line),
        actions=[
            ScheduledAction(a.name, a.offset_s, _bind(action_of(a), actions, a.params))
            for a in scenario.actions
        ],
    )
    actions.stop = nemesis.stopping
    if scenario.locust is not None:
        _inject_with_locust(
            scenario, state.run_dir, contract.api_url, state.seed, state.locust_workers,
            state.history, nemesis.start, progress, state.stack, _driver_args(state.target),
            _load_start_at(state),
        )  # fmt: skip
    else:
        _await_boundary(state)
        nemesis.start()
        _inject(
            scenario, state.population, state.history, contract.api_url, state.seed,
            contract.driver, state.load_stop,
        )  # fmt: skip
    state.channel_urls = {p: info.url(p) for p in ("ses", "inapp") if p in info.parts}
    state.channels = ChannelLedgers.for_stack(
        state.history, state.channel_urls, contract.sms_ledger_url
    )
    state.deadline = time.monotonic() + scenario.timeout_seconds
    # The schedule's actions (erasures, changes, probes posted again) belong to the load.
    nemesis.wait(max(0.0, state.deadline - time.monotonic()))


def _await_outcome(state: RunState) -> None:
    """Wait until every delivery the oracle expects has arrived (or the deadline), undo the
    faults, play the rollbacks, and wait for the email and in-app channels."""
    assert state.info is not None and state.contract is not None
    assert state.population is not None and state.collector is not None
    assert state.nemesis is not None and state.actions is not None
    assert state.channels is not None
    scenario, info, progress, history = state.scenario, state.info, state.progress, state.history
    policy, queues = state.contract.policy, state.contract.queues
    injected = state.injected = history.frame(without=CHECKER_ONLY_KINDS).query("kind == 'inject'")
    expectation = evidence_from(
        state.population,
        history.frame(without=CHECKER_ONLY_KINDS),
        policy,
        scenario.preference_bound_s,
    ).expectation
    expected = set(
        expectation.deliveries[["tenant_id", "notification_id", "token"]].itertuples(
            index=False, name=None
        )
    )
    progress("inject", f"{len(injected)} events accepted, {len(expected)} deliveries expected")
    if state.live is not None:
        state.live.metrics.expected.set(len(expected))
    last_window_end = expectation.deliveries["quiet_until"].max()
    release_by = (0.0 if pd.isna(last_window_end) else float(last_window_end)) + 1.0
    # With a rate-limit window stated, the held notifications' digests go out when it closes.
    digest_window_s = policy.rate_limit_window_seconds if policy.rate_limit_per_window > 0 else 0
    state.outcome = wait_for_outcome(
        state.collector, expected, info, state.deadline, progress, release_by, queues=queues,
        digest_window_s=digest_window_s,
    )  # fmt: skip
    undone = state.nemesis.rollback()
    if undone:
        progress("rollback", f"undid {', '.join(undone)}")
    for rollback in scenario.rollbacks:
        result = action_of(rollback)(state.actions, rollback.params)
        history.append("action", detail=f"rollback {rollback.name}: {result}")
        progress("rollback", f"{rollback.name}: {result}")
        if rollback.name == "redrive-dlq" and not result.startswith("moved 0 "):
            state.outcome = wait_for_outcome(
                state.collector, expected, info, state.deadline, progress, release_by,
                queues=queues, digest_window_s=digest_window_s,
            )  # fmt: skip
    channel_expected = expected_channel_deliveries(
        state.population, injected, policy.channels_by_kind
    )
    if (state.channel_urls or state.contract.sms_ledger_url) and len(channel_expected):
        _wait_for_channels(state.channels, channel_expected, state.deadline, progress)


def _collect(state: RunState) -> None:
    """Everything observed into the history: the last provider rows, dead-letter queues, the
    channels' ledgers, the system's audit trail and the SQS endpoint's receive log; a stack
    part that died is the harness's error, said so."""
    assert state.info is not None and state.contract is not None
    assert state.collector is not None and state.channels is not None
    info, contract, progress, history = state.info, state.contract, state.progress, state.history
    collector, queues = state.collector, contract.queues
    if state.sampler is not None:
        state.sampler.stop()
    history.append("phase", detail=state.outcome)
    timed_out = state.outcome == "timeout"
    progress(
        "collect",
        f"{collector.rows} provider requests recorded ({state.outcome}"
        + (f" after {state.scenario.timeout_seconds:.0f}s)" if timed_out else ")"),
    )
    collector.poll()
    if collector.other_run_rows:
        progress(
            "collect",
            f"{collector.other_run_rows} request(s) to earlier runs' tenants left out "
            "(the system's backlog from those runs)",
        )
    for part, why in state.stack.dead_parts().items():
        # A part of the local stack that died is the harness's failure, not the system's:
        # say so instead of letting a checker blame the system under test.
        state.errors.append(f"stack part {part} died during the run: {why}")
        progress("stack", f"{part} died during the run")
    prefix = tenant_prefix(state.run_dir.name, state.target)
    parked, earlier_parked = (
        _record_dlqs(info, history, queues, prefix) if queues is not None else (0, 0)
    )
    if queues is not None:
        _record_redrive_policies(info, history, queues)
    if parked:
        progress("collect", f"{parked} message(s) left in dead-letter queues")
    if earlier_parked:
        progress("collect", f"{earlier_parked} dead-letter message(s) of earlier runs left out")
    if state.target is None:
        # The workers store their buffered audit records on SIGTERM: stop them first.
        for part in state.stack.stop_parts(["fanout-worker", *WORKER_PARTS[2:]]):
            progress("stack", f"{part} did not stop in time: killed (its threads: its log)")
            if part not in reference.AUDITING_WORKERS:
                continue  # it buffers nothing a checker reads: the kill lost no evidence
            # The harness's failure, not the system's: say so rather than let the audit
            # checkers blame the system for records the kill destroyed.
            state.errors.append(
                f"stack part {part} did not stop within {STOP_GRACE_SECONDS:.0f} s of SIGTERM "
                "and was killed: the audit records it buffered are lost"
            )
    state.channels.poll()
    state.channels.close()
    pattern = state.dedup_pattern
    if contract.dedup_store_url and pattern:
        earlier = state.earlier_dedup_keys
        if earlier is None:
            progress("collect", "dedup key TTLs not read: this run's keys cannot be told apart")
        else:
            try:
                sample = sample_ttls(contract.dedup_store_url, pattern, exclude=earlier)
            except redis.RedisError as exc:
                progress("collect", f"the dedup store's keys could not be read: {exc}")
            else:
                record_sample(history, sample, pattern, time.monotonic() - state.began)
                progress("collect", f"{sample.keys} dedup key TTL(s) read")
    # A Scan per table: only for a scenario that judges it (a capacity run's inbox is large).
    judged = {p.name for p in state.scenario.probes}
    for table in contract.ttl_tables if "ttl_attributes" in judged else ():
        ddb = info.aws_client("dynamodb")
        status = describe_ttl(ddb, table)  # is TTL on, on that attribute? (never raises)
        try:
            scan = scan_expiries(ddb, table)
        except (BotoCoreError, ClientError) as exc:
            progress("collect", f"table {table.table}: TTL attributes not read ({exc})")
            continue
        record_scan(history, table, scan, status)
        progress("collect", f"{scan.items} {table.purpose} item TTL(s) read from {table.table}")
    if contract.audit is not None:
        audited = contract.audit.read(history)
        progress("collect", f"{audited} audit record(s) read from the system's trail")
    if contract.sqs_log_url and queues is not None:
        # The SQS endpoint's own log of every copy the consumers were given.
        work = {queues.work[c] for c in queues.delivery_channels}
        collect_receives(
            contract.sqs_log_url, history, work, since=state.receive_log_from,
            not_before=state.began_at,
        )  # fmt: skip
    # What earlier runs left in a long-lived system, ignored (never judged), said in the summary.
    leftovers = {
        "provider_requests": collector.other_run_rows,
        "dlq_messages": earlier_parked,
        "dedup_keys": len(state.earlier_dedup_keys or ()),
        "receive_log_rows": state.receive_log_from,
    }
    history.append("phase", detail=json.dumps({LEFTOVERS: leftovers}))


def _judge(state: RunState) -> list[Verdict]:
    """Every probe of the scenario over the evidence (oracle and observations)."""
    assert state.population is not None and state.contract is not None
    assert state.nemesis is not None
    state.errors += state.nemesis.errors
    # A large history is checked out of core (DuckDB within a memory cap), written to disk
    # from its Arrow batches: the evidence's own frame then leaves out the rows only checkers
    # read, which are most of it.
    large = len(state.history) >= out_of_core_rows()
    evidence = evidence_from(
        state.population,
        state.history.frame(without=CHECKER_ONLY_KINDS if large else ()),
        state.contract.policy,
        state.scenario.preference_bound_s,
    )
    capabilities = state.contract.capabilities()
    state.progress(
        "judge",
        f"{len(state.scenario.probes)} checker(s) over {len(state.history)} history rows"
        + (" on disk" if large else ""),
    )
    on_disk: contextlib.AbstractContextManager[Evidence] = contextlib.nullcontext(evidence)
    if large:
        store_dir = state.run_dir / "checker-store"
        store_dir.mkdir(parents=True, exist_ok=True)
        state.history.write(store_dir / "history.parquet")
        on_disk = judged_on_disk(evidence, store_dir / "history.parquet", store_dir)
    with on_disk as evidence:
        verdicts = []
        for probe in state.scenario.probes:
            started = time.monotonic()
            with measured() as memory:
                verdicts.append(judge(probe, evidence, capabilities))
            spent = time.monotonic() - started
            before = state.checker_peak_rss_mb.get(probe.name)
            state.checker_peak_rss_mb[probe.name] = (
                memory.peak_mb if before is None or memory.peak_mb is None
                else max(before, memory.peak_mb)
            )  # fmt: skip
            state.checker_seconds[probe.name] = round(
                state.checker_seconds.get(probe.name, 0.0) + spent, 3
            )
    # Only a promise that turns on the day (a daily cap judged by rate_limit) needs the load
    # to cross the midnight; a run that moves the clock for anything else does not.
    daily = state.contract.policy.daily_limit_per_device_type > 0 and any(
        p.name == "rate_limit" for p in state.scenario.probes
    )
    boundary = boundary_crossed(state.history.frame(without=CHECKER_ONLY_KINDS)) if daily else None
    return verdicts + ([boundary] if boundary is not None else [])


def boundary_crossed(history: pd.DataFrame) -> Verdict | None:
    """For a run that moved the system's clock to a midnight to judge a daily cap: unknown
    when the midnight fell outside the load (every event on one side of it), so that no daily
    cap passes on a day boundary nothing crossed (a loaded run started its storm after it and passed a daily
    cap counted by the wrong day). None when the clock was not moved or the load crossed it."""
    clock = clock_summary(history)
    if clock is None:
        return None
    counts = {k: int(clock[k]) for k in ("injected_before", "injected_after")}  # type: ignore[call-overload]
    if counts["injected_before"] and counts["injected_after"]:
        return None
    why = (
        f"the system's midnight ({clock['system_shows']}) fell outside the load: nothing crossed it"
    )
    return Verdict("day_boundary", None, counts, {"unknown": why})


def _tear_down(state: RunState, interrupted: bool) -> None:
    """Collectors stopped, faults undone, the stack down: also after a failure or a signal
    (faster then)."""
    with deferred_signals():
        # An interrupted run ends within seconds: a poll under way on a loaded machine is
        # not waited for long (its rows are what an interrupted history may lack anyway).
        wait_s = 1.0 if interrupted else 10.0
        if state.collector is not None:
            state.collector.stop(wait_s)
        if state.sampler is not None:
            state.sampler.stop(wait_s)
        if state.nemesis is not None:
            undone = state.nemesis.rollback(hurry=interrupted)
            if interrupted and undone:
                state.progress("rollback", f"undid {', '.join(undone)}")
        state.progress("stack", "stopping")
        state.stack.down(hurry=interrupted)


def run(
    scenario: Scenario,
    seed: int | None = None,
    out: Path = Path("reports"),
    clock: Clock = lambda: datetime.now(UTC),
    progress: Progress | None = None,
    stack_factory: Callable[[Path], Stack] | None = None,
    locust_workers: int | None = None,
    target: Target | None = None,
    reports: bool = True,
    metrics_port: int = 0,
    live_view: bool = True,
) -> RunResult:
    """``reports``: False writes junit.xml only (no charts, no html/md): for CI loops.
    ``metrics_port``: where the live metrics are served on 127.0.0.1 (0: a free port, printed
    and written to ``live.json``). ``live_view`` False: no metrics, no online checks, no stop
    condition (the comparison point of their cost; a scenario that states stop conditions
    needs them: ValueError).

    The scenario's stop conditions are watched live: when one fires, the load stops, every
    fault is rolled back, what was accepted drains and is judged, and the verdict is
    ``aborted`` (exit code 4), naming the condition and its first evidence.

    From its first second a run leaves a record that a crash cannot take: ``summary.json`` says
    ``incomplete`` until the run has a verdict, and the history streams to ``history.arrows``.
    SIGINT and SIGTERM stop the run at once (faults undone, every process stopped within
    seconds) with verdict ``incomplete``; ``report`` reads what a killed run left."""
    if not live_view and scenario.stop_conditions:
        raise ValueError(
            f"scenario {scenario.name} states stop conditions: they need the live view"
        )
    seed = seed if seed is not None else random.SystemRandom().randrange(2**31)
    progress = progress or Progress()
    run_id = new_run_id(scenario.name, seed, clock())
    started = time.monotonic()
    run_dir = Path(out).resolve() / run_id
    run_dir.mkdir(parents=True, exist_ok=False)
    progress("run", f"{run_id} (seed {seed}; repeat with --seed {seed})")
    summary: dict[str, Any] = {
        "run_id": run_id,
        "scenario": scenario.name,
        "seed": seed,
        "target": target.name if target is not None else "reference",
        "tenant_prefix": tenant_prefix(run_id, target),
        "verdict": "incomplete",
        "checkers": {},
        "history_rows": 0,
        "preference_bound_s": scenario.preference_bound_s,
        "error": "stopped before its end (killed?); history.arrows holds what it recorded",
    }
    _write_summary(run_dir, summary)
    reap_orphans()  # what an earlier run killed with -9 may have left
    history = History()
    history.stream_to(run_dir / STREAM_FILE)
    cpu_at_start = _own_cpu_s()
    live = None
    if live_view:
        live = LiveView(
            history,
            run_dir,
            LiveMetrics(run_id, scenario.name, seed),
            OnlineChecks(),
            scenario.stop_conditions,
            say=lambda line: progress("live", line),
            port=metrics_port,
        )
        progress("live", f"metrics at {live.start()}")
    else:
        progress("live", "off: no metrics, no online checks, no stop conditions")
    timings: dict[str, dict[str, float]] = {}
    try:
        with interruptible(lever=live.pull_lever if live is not None else None):
            _history, _population, verdicts, error = execute(
                scenario, seed, run_dir, progress, clock, stack_factory, locust_workers, target,
                history, live, timings,
            )  # fmt: skip
    finally:
        if live is not None:
            live.finish()
    # The harness process's own CPU (its threads: collector, live view, checkers; not the
    # stack's processes): what the live view's cost is measured against (bench_live_run).
    summary["harness_cpu_s"] = round(_own_cpu_s() - cpu_at_start, 3)
    summary["phase_seconds"] = dict(timings.get("phases", {}))
    summary["checker_seconds"] = dict(timings.get("checkers", {}))
    summary["phase_peak_rss_mb"] = dict(timings.get("peak_rss_mb", {}))
    summary["checker_peak_rss_mb"] = dict(timings.get("checker_peak_rss_mb", {}))
    history.close_stream()
    history.write(run_dir / "history.parquet")
    (run_dir / STREAM_FILE).unlink(missing_ok=True)
    interrupted = error is not None and error.startswith(INTERRUPTED)
    moved = clock_summary(history.frame(without=CHECKER_ONLY_KINDS))
    if moved is not None:
        summary["clock"] = moved
    limits = limits_summary(history.frame(without=CHECKER_ONLY_KINDS))
    if limits is not None:
        summary["provider_limits"] = limits
    leftovers = _leftovers(history)
    if leftovers is not None:
        summary[LEFTOVERS] = leftovers
    stopped = live.stopped if live is not None else None
    if live is not None:
        summary["live"] = {
            "metrics_url": live.url,
            "stop_conditions": [str(c) for c in scenario.stop_conditions],
            "violations": dict(live.checks.counts),
            "first_seen": {k: {"at": v.time, **v.evidence} for k, v in live.checks.first.items()},
        }
    else:
        summary["live"] = {"off": True}
    if stopped is not None:
        summary["stopped"] = stopped.to_dict()
    summary.update(
        verdict="incomplete"
        if interrupted
        else "unknown"
        if error is not None and error.startswith(DOES_NOT_FIT)
        else ABORTED
        if stopped is not None
        else overall_verdict(verdicts, error),
        checkers={v.name: v.to_dict() for v in verdicts},
        history_rows=len(history),
        error=error,
    )
    _write_summary(run_dir, summary)
    if interrupted:
        progress("run", f"{error}: verdict incomplete, the history and logs are kept")
    report_started = time.monotonic()
    try:
        from harness.report import junit_xml, write_reports

        if reports and not interrupted:
            progress("report", str(write_reports(run_dir)["html"]))
        else:
            (run_dir / "junit.xml").write_text(junit_xml(summary, time.monotonic() - started))
    except Exception as exc:  # a broken report must not hide the verdict
        progress("report", f"could not write the reports: {exc}")
    summary["phase_seconds"]["report"] = round(time.monotonic() - report_started, 3)
    # The harness process's peak resident memory, the report included.
    summary["harness_peak_rss_mb"] = summary["phase_peak_rss_mb"]["report"] = peak_mb()
    _write_summary(run_dir, summary)
    return RunResult(run_dir, json.loads(json.dumps(summary, default=_json_default)))


def _own_cpu_s() -> float:
    """User and system CPU seconds of this process, every thread of it."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _leftovers(history: History) -> dict[str, int] | None:
    frame = history.frame(without=CHECKER_ONLY_KINDS)
    for detail in frame.loc[frame["kind"] == "phase", "detail"].dropna():
        text = str(detail)
        if text.startswith("{") and LEFTOVERS in text:
            return dict(json.loads(text)[LEFTOVERS])
    return None


INTERRUPTED = "interrupted by "
# The file whose appearance stops the Locust load (harness.load.loadgen --stop-file).
LOAD_STOP_FILE = "stop"


class RunInterrupted(BaseException):
    """SIGINT or SIGTERM during a run (a BaseException, as KeyboardInterrupt is: no handler
    meant for errors may swallow it)."""


@contextlib.contextmanager
def interruptible(lever: Callable[[], bool] | None = None) -> Iterator[None]:
    """SIGINT and SIGTERM raise :class:`RunInterrupted` in the main thread, once. ``lever``: the
    first SIGINT pulls it instead when it accepts (the safety lever: the drill stops its load,
    rolls its faults back, drains and is judged, ``aborted``); the next one interrupts."""
    fired = threading.Event()
    pulled = threading.Event()

    def interrupt(signum: int, frame: Any) -> None:
        if fired.is_set():
            return  # the run is already stopping
        if signum == signal.SIGINT and lever is not None and not pulled.is_set():
            pulled.set()
            if lever():
                return
        fired.set()
        raise RunInterrupted(f"{INTERRUPTED}{signal.Signals(signum).name}")

    previous = {s: signal.signal(s, interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Cleanup that a second Ctrl-C must not cut short: SIGINT and SIGTERM are ignored inside
    (the run is stopping already). Only in the main thread, where handlers can be set."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    tmp = run_dir / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2, default=_json_default))
    tmp.replace(run_dir / "summary.json")


def load_run(run_dir: Path) -> tuple[dict[str, Any], Any]:
    summary = json.loads((run_dir / "summary.json").read_text())
    return summary, history_mod.read(run_dir / "history.parquet")


if __name__ == "__main__":  # pragma: no cover - use python -m harness run
    sys.exit("use: python -m harness run <scenario>")
