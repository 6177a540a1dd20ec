"""A run's figures as Prometheus metrics, updated from the history's rows as they are written,
served in the text exposition format on a loopback port (``prometheus_client``, its own
registry: nothing of the process's default collectors).

Names follow Prometheus's conventions (``_total`` counters, base units, ``fanout_`` prefix):

==================================================  =============================================
``fanout_run_info{run_id,scenario,seed}``           1 while the run is served
``fanout_events_injected_total{outcome}``           events posted: ``accepted``, or ``unknown``
                                                    (a 5xx or cut connection: maybe taken)
``fanout_deliveries_expected``                      what the oracle expects of the accepted events
``fanout_deliveries_total{provider}``               distinct (notification, device) delivered
``fanout_provider_requests_total{provider,status}`` every request a provider simulator answered
``fanout_queue_depth{queue}``                       visible + in flight + delayed, last sample
``fanout_fault_active{fault}``                      1 while a fault's window is open, else 0
``fanout_delivery_latency_seconds``                 injection to first delivery (histogram)
``fanout_live_violations_total{check}``             promises seen broken live (harness.live.online)
``fanout_stop_condition_fired{condition}``          1 once a stop condition ended the drill
==================================================  =============================================
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from harness.live.online import CHECKS, LiveViolation
from harness.model.delivery_key import delivery_key

# The design's latency promise is seconds (p99 under 5 s in the seeds): buckets around it.
LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 30.0, 60.0)
METRIC_NAMES = (
    "fanout_run_info",
    "fanout_events_injected_total",
    "fanout_deliveries_expected",
    "fanout_deliveries_total",
    "fanout_provider_requests_total",
    "fanout_queue_depth",
    "fanout_fault_active",
    "fanout_delivery_latency_seconds",
    "fanout_live_violations_total",
    "fanout_stop_condition_fired",
)


class LiveMetrics:
    """The metrics of one run, fed the history's rows in order (:meth:`feed`)."""

    def __init__(self, run_id: str = "", scenario: str = "", seed: int | str = "") -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.info = Gauge(
            "fanout_run_info", "The run being served", ["run_id", "scenario", "seed"], registry=r
        )
        self.info.labels(run_id, scenario, str(seed)).set(1)
        self.injected = Counter(
            "fanout_events_injected", "Events posted to the system", ["outcome"], registry=r
        )
        self.expected = Gauge(
            "fanout_deliveries_expected",
            "Deliveries the oracle expects of the accepted events",
            registry=r,
        )
        self.delivered = Counter(
            "fanout_deliveries",
            "Distinct (notification, device) deliveries seen",
            ["provider"],
            registry=r,
        )
        self.requests = Counter(
            "fanout_provider_requests",
            "Requests the provider simulators answered",
            ["provider", "status"],
            registry=r,
        )
        self.queue_depth = Gauge(
            "fanout_queue_depth", "Messages visible, in flight or delayed", ["queue"], registry=r
        )
        self.fault_active = Gauge(
            "fanout_fault_active", "1 while the fault's window is open", ["fault"], registry=r
        )
        self.latency = Histogram(
            "fanout_delivery_latency_seconds",
            "From an event's injection to its first delivery to a device",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.violations = Counter(
            "fanout_live_violations",
            "Promises seen broken while the run goes",
            ["check"],
            registry=r,
        )
        for check in CHECKS:
            self.violations.labels(check)  # exported at 0 from the start: a rate is defined
        self.stopped = Gauge(
            "fanout_stop_condition_fired",
            "1 once the stop condition ended the drill",
            ["condition"],
            registry=r,
        )
        self._seen: set[tuple[str, str, str]] = set()
        self._injected_at: dict[tuple[str, str], float] = {}
        # First deliveries whose injection is not in the history yet (recorded on its answer).
        self._waiting: dict[tuple[str, str], list[float]] = {}
        self._open: dict[str, str] = {}  # fault window -> fault name
        # Each series' child, looked up once (labels() takes a lock and builds a key).
        self._children: dict[tuple[Any, tuple[str, ...]], Any] = {}

    def _child(self, metric: Any, *labels: str) -> Any:
        child = self._children.get((metric, labels))
        if child is None:
            child = self._children[(metric, labels)] = metric.labels(*labels)
        return child

    def feed(self, rows: Iterable[Mapping[str, Any]]) -> None:
        for row in rows:
            kind = row.get("kind")
            if kind == "inject":
                self.injected.labels("accepted").inc()
                self._inject(row)
            elif kind == "inject_info":
                self.injected.labels("unknown").inc()
            elif kind == "provider":
                self._provider(row)
            elif kind == "fault":
                self._fault(row)
            elif kind == "sample":
                self._sample(row)

    def violation(self, violation: LiveViolation) -> None:
        self.violations.labels(violation.check).inc()

    def _inject(self, row: Mapping[str, Any]) -> None:
        key = (str(row.get("tenant_id")), str(row.get("notification_id")))
        at = float(row["time"])
        if key in self._injected_at:
            return
        self._injected_at[key] = at
        for delivered_at in self._waiting.pop(key, []):
            self.latency.observe(max(0.0, delivered_at - at))

    def _provider(self, row: Mapping[str, Any]) -> None:
        provider = str(row.get("provider") or "unknown")
        status = row.get("status")
        self._child(self.requests, provider, "none" if status is None else str(status)).inc()
        delivered = row.get("delivered")
        if not (status == 200 if delivered is None else delivered):
            return
        key = delivery_key(row.get("tenant_id"), row.get("notification_id"), row.get("token"))
        if key in self._seen:
            return
        self._seen.add(key)
        self._child(self.delivered, provider).inc()
        at = float(row["time"])
        injected = self._injected_at.get(key[:2])
        if injected is None:
            self._waiting.setdefault(key[:2], []).append(at)
        else:
            self.latency.observe(max(0.0, at - injected))

    def _fault(self, row: Mapping[str, Any]) -> None:
        detail = _json(row.get("detail"))
        if "window" not in detail or "fault" not in detail:
            return
        window, fault = str(detail["window"]), str(detail["fault"])
        if detail.get("phase") == "start":
            self._open[window] = fault
        else:
            self._open.pop(window, None)
        self.fault_active.labels(fault).set(int(fault in self._open.values()))

    def _sample(self, row: Mapping[str, Any]) -> None:
        detail = _json(row.get("detail"))
        if "queue" in detail and "depth" in detail:
            self.queue_depth.labels(str(detail["queue"])).set(float(detail["depth"]))


def _json(text: Any) -> dict[str, Any]:
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
