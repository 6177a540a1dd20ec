"""The fault catalogue (the nemesis's vocabulary): named faults with parameters, start and stop.

Every fault acts on the outside of the system under test only: the fault proxy in front of the
dedup store, the AWS fault proxy in front of Kinesis, the provider simulators, the SQS endpoint,
and the worker processes. Each start and
stop is recorded in the run history as a ``fault`` row, so checkers can see the window.

The proxy is driven through ``toxiproxy-python`` (the PyPI client), so the same faults work
against a real Toxiproxy in a team's staging environment.
"""

from __future__ import annotations

import json
import ssl
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from harness.model.history import History

DEDUP_PROXY = "dedup"


class FaultError(ValueError):
    """A fault name or its parameters are not valid."""


class ProcessControl(Protocol):
    """What process faults need from the stack: kill a part, start it again."""

    def kill_part(self, part: str) -> None: ...

    def start_part(self, part: str) -> Any: ...


@dataclass
class ChaosTargets:
    """Where the faults act. Any may be None when a target does not offer it."""

    toxiproxy_url: str | None = None
    apns_url: str | None = None
    apns_ca_file: str | None = None
    fcm_url: str | None = None
    sqs_url: str | None = None
    # The AWS fault proxy (emulators/aws_proxy) the system's Kinesis consumer reads through.
    kinesis_proxy_url: str | None = None
    processes: ProcessControl | None = None
    dedup_proxy: str = DEDUP_PROXY


@dataclass
class Fault:
    """One fault instance: ``start`` then ``stop`` (idempotent), recorded as a window."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)
    window_id: str = field(default_factory=lambda: uuid.uuid4().hex[:10])
    active: bool = False
    _undo: Callable[[], None] | None = None
    # A fault outside the catalogue (a scenario naming its own Python function): started as the
    # catalogue's are, ``begin(targets, params)`` returning what undoes it (or None); ``origin``
    # names the function in the history's window rows.
    begin: Callable[[ChaosTargets, dict[str, Any]], Callable[[], None] | None] | None = None
    origin: str | None = None

    def start(self, targets: ChaosTargets, history: History | None) -> None:
        if self.active:
            return
        begin = self.begin if self.begin is not None else CATALOGUE[self.name].start
        self._undo = begin(targets, self.params)
        self.active = True
        if history is not None:
            history.append("fault", detail=self._detail("start"))

    def stop(self, targets: ChaosTargets, history: History | None) -> None:
        if not self.active:
            return
        try:
            if self._undo is not None:
                self._undo()
        finally:
            self.active = False
            if history is not None:
                history.append("fault", detail=self._detail("stop"))

    def _detail(self, phase: str) -> str:
        detail = {"window": self.window_id, "fault": self.name, "phase": phase}
        detail["params"] = self.params
        if self.origin is not None:
            detail["origin"] = self.origin
        return json.dumps(detail, default=str)


# -- adapters ---------------------------------------------------------------------------------


def _toxiproxy(targets: ChaosTargets) -> Any:
    if not targets.toxiproxy_url:
        raise FaultError("this target has no fault proxy (toxiproxy_url)")
    from toxiproxy import Toxiproxy

    url = httpx.URL(targets.toxiproxy_url)
    server = Toxiproxy()
    server.update_api_consumer(url.host, url.port)
    proxy = server.get_proxy(targets.dedup_proxy)
    if proxy is None:
        raise FaultError(f"the fault proxy has no proxy named {targets.dedup_proxy!r}")
    return proxy


def _http(url: str | None, what: str, ca_file: str | None = None) -> httpx.Client:
    if not url:
        raise FaultError(f"this target has no {what}")
    verify: Any = ssl.create_default_context(cafile=ca_file) if ca_file else True
    return httpx.Client(base_url=url, verify=verify, timeout=10)


def _simulator_fault(provider: str, fault: str) -> Callable[..., Callable[[], None]]:
    def start(targets: ChaosTargets, params: dict[str, Any]) -> Callable[[], None]:
        url, ca = (
            (targets.apns_url, targets.apns_ca_file)
            if provider == "apns"
            else (targets.fcm_url, None)
        )
        client = _http(url, f"{provider} simulator", ca)
        body = {"fault": fault, "params": params}
        response = client.post("/_sim/faults", json=body)
        if response.status_code != 200:
            raise FaultError(f"{provider} simulator refused {body}: {response.text}")
        fault_id = response.json()["id"]

        def undo() -> None:
            client.delete(f"/_sim/faults/{fault_id}")
            client.close()

        return undo

    return start


def _sqs_fault(fault: str) -> Callable[..., Callable[[], None]]:
    def start(targets: ChaosTargets, params: dict[str, Any]) -> Callable[[], None]:
        client = _http(targets.sqs_url, "SQS endpoint with fault injection")
        fault_params = {k: v for k, v in params.items() if k != "queues"}
        body = {"fault": fault, "params": fault_params, "queues": params.get("queues")}
        response = client.post("/_sqs/faults", json=body)
        if response.status_code != 200:
            raise FaultError(f"SQS endpoint refused {body}: {response.text}")
        fault_id = response.json()["id"]

        def undo() -> None:
            client.delete(f"/_sqs/faults/{fault_id}")
            client.close()

        return undo

    return start


def _kinesis_shard_hold(targets: ChaosTargets, params: dict[str, Any]) -> Callable[[], None]:
    """The consumer of one shard gets no records (and its own iterator back) until the stop,
    then every held record in order: what a slow or stuck shard looks like from the fan-out."""
    unknown = sorted(set(params) - {"shard", "stream"})
    if unknown:
        raise FaultError(f"kinesis-shard-hold: unknown parameter(s) {', '.join(unknown)}")
    client = _http(targets.kinesis_proxy_url, "Kinesis fault proxy (kinesis_listen)")
    body = {
        "fault": "hold_shard",
        "params": {"shard": params.get("shard", 0), "stream": params.get("stream")},
    }
    response = client.post("/_proxy/faults", json=body)
    if response.status_code != 200:
        client.close()
        raise FaultError(f"Kinesis fault proxy refused {body}: {response.text}")
    fault_id = response.json()["id"]

    def undo() -> None:
        client.delete(f"/_proxy/faults/{fault_id}").raise_for_status()
        client.close()

    return undo


def _dedup_outage(targets: ChaosTargets, params: dict[str, Any]) -> Callable[[], None]:
    proxy = _toxiproxy(targets)
    proxy.disable()  # listener closed, open connections dropped: connection refused
    return proxy.enable


def _dedup_toxic(toxic_type: str, attributes: Callable[[dict[str, Any]], dict[str, Any]]) -> Any:
    def start(targets: ChaosTargets, params: dict[str, Any]) -> Callable[[], None]:
        proxy = _toxiproxy(targets)
        name = f"chaos_{toxic_type}_{uuid.uuid4().hex[:6]}"
        proxy.add_toxic(
            name=name,
            type=toxic_type,
            stream=params.get("stream", "downstream"),
            toxicity=float(params.get("toxicity", 1.0)),
            attributes=attributes(params),
        )
        return lambda: proxy.destroy_toxic(name)

    return start


def _process_crash(part: str) -> Callable[..., Callable[[], None]]:
    def start(targets: ChaosTargets, params: dict[str, Any]) -> Callable[[], None]:
        if targets.processes is None:
            raise FaultError("this target's processes are not ours to kill")
        targets.processes.kill_part(part)  # kill -9: no cleanup, as a crash
        return lambda: targets.processes.start_part(part)  # type: ignore[union-attr]

    return start


@dataclass(frozen=True)
class FaultSpec:
    description: str
    start: Callable[[ChaosTargets, dict[str, Any]], Callable[[], None]]
    required: tuple[str, ...] = ()


CATALOGUE: dict[str, FaultSpec] = {
    "dedup-outage": FaultSpec(
        "dedup store unreachable: the fault proxy is disabled (connection refused)", _dedup_outage
    ),
    "dedup-blackhole": FaultSpec(
        "dedup store black hole: data stops flowing, connections hang (timeout toxic 0)",
        _dedup_toxic("timeout", lambda p: {"timeout": int(p.get("timeout_ms", 0))}),
    ),
    "dedup-slow": FaultSpec(
        "dedup store slow: latency toxic",
        _dedup_toxic(
            "latency",
            lambda p: {
                "latency": int(p.get("latency_ms", 100)),
                "jitter": int(p.get("jitter_ms", 0)),
            },
        ),
    ),
    "dedup-crash": FaultSpec(
        "kill -9 redis-server at start, restart it at stop (state survives only with AOF)",
        _process_crash("redis"),
    ),
    "consumer-crash": FaultSpec(
        "kill -9 the push consumer at start, restart it at stop", _process_crash("push-consumer")
    ),
    "apns-status": FaultSpec(
        "APNs answers a status (429/500/503) to a fraction p",
        _simulator_fault("apns", "status"),
        ("p", "status"),
    ),
    "apns-accepted-then-error": FaultSpec(
        "APNs delivers, then answers 5xx (a naive retry duplicates)",
        _simulator_fault("apns", "accepted_then_error"),
        ("p",),
    ),
    "apns-latency": FaultSpec("APNs answers late", _simulator_fault("apns", "latency"), ("ms",)),
    "apns-unregister": FaultSpec(
        "APNs tokens turn Unregistered", _simulator_fault("apns", "unregister")
    ),
    "apns-goaway": FaultSpec(
        "APNs sends GOAWAY after N streams per connection",
        _simulator_fault("apns", "goaway"),
        ("after_streams",),
    ),
    "fcm-quota": FaultSpec(
        "FCM per-project quota: 429 QUOTA_EXCEEDED with Retry-After",
        _simulator_fault("fcm", "quota"),
        ("per_minute",),
    ),
    "fcm-status": FaultSpec(
        "FCM answers 503 UNAVAILABLE / 500 INTERNAL to a fraction p",
        _simulator_fault("fcm", "status"),
        ("p", "status"),
    ),
    "fcm-accepted-then-error": FaultSpec(
        "FCM delivers, then answers 5xx", _simulator_fault("fcm", "accepted_then_error"), ("p",)
    ),
    "sqs-duplicate-delivery": FaultSpec(
        "SQS hands a message out twice with probability p",
        _sqs_fault("duplicate_delivery"),
        ("p",),
    ),
    "sqs-visibility-expiry": FaultSpec(
        "SQS in-flight messages become visible again early", _sqs_fault("visibility_expiry")
    ),
    "sqs-lost-delete": FaultSpec(
        "SQS answers DeleteMessage 200 but the message returns", _sqs_fault("lost_delete"), ("p",)
    ),
    "sqs-errors": FaultSpec("SQS throttles or fails calls", _sqs_fault("errors"), ("p",)),
    "sqs-latency": FaultSpec("SQS answers late", _sqs_fault("latency"), ("ms",)),
    "kinesis-shard-hold": FaultSpec(
        "one Kinesis shard's records are held from its consumer (params: shard index, default 0;"
        " optional stream), then all delivered in order at the stop",
        _kinesis_shard_hold,
    ),
}


def make_fault(name: str, params: dict[str, Any] | None = None) -> Fault:
    if name not in CATALOGUE:
        raise FaultError(f"unknown fault {name!r}; known: {', '.join(sorted(CATALOGUE))}")
    params = dict(params or {})
    missing = [p for p in CATALOGUE[name].required if p not in params]
    if missing:
        raise FaultError(f"fault {name!r} needs parameter(s): {', '.join(missing)}")
    return Fault(name, params)
