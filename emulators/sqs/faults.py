"""Fault injection for the SQS endpoint: the server-side state and the chaos layer's client.

Faults (``params``):

* ``duplicate_delivery`` ``{"p": 0.1}``: a received message is handed out and also stays
  visible, so it is delivered again; the receipt handle of the first copy no longer deletes it
  (as with a real duplicate, only the latest receipt counts).
* ``visibility_expiry`` ``{"p": 1.0}`` (p defaults to 1): when the fault starts, each in-flight message becomes
  visible now with probability p; while it is active, each message received becomes visible
  again at once with probability p (its receipt handle stays valid).
* ``lost_delete`` ``{"p": 0.5}``: DeleteMessage(Batch) answers success but the message stays
  and comes back when its visibility timeout ends.
* ``errors`` ``{"p": 0.2, "kind": "throttling" | "internal"}``: the call fails before it has
  any effect: ``RequestThrottled`` (HTTP 400, SQS's throttling error, which botocore retries)
  or ``InternalError`` (HTTP 500).
* ``latency`` ``{"ms": 50}``: every call is answered that much later.
* ``batch_entry_errors`` ``{"p": 0.2}``: each entry of a SendMessageBatch fails on its own with
  probability p (HTTP 200, the entry under ``Failed`` with ``InternalError``, nothing enqueued
  for it), as SQS answers a batch it took only in part. A sender that reads only the HTTP
  status loses those messages.

A fault applies to the queues named in ``queues`` (``None``: every queue and every call). Each
fault draws from its own ``random.Random(seed)``; the seed is chosen when not given and always
recorded, so a run can be repeated. Every start and stop is kept in the fault log.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx

FAULTS = (
    "duplicate_delivery",
    "visibility_expiry",
    "lost_delete",
    "errors",
    "latency",
    "batch_entry_errors",
)
ERROR_KINDS = ("throttling", "internal")


def _probability(params: dict[str, Any], fault: str) -> float:
    p = params.get("p")
    if isinstance(p, bool) or not isinstance(p, int | float) or not 0.0 <= float(p) <= 1.0:
        raise ValueError(f"{fault}: params.p must be a number between 0 and 1")
    return float(p)


def validate(fault: str, params: dict[str, Any] | None) -> dict[str, Any]:
    """Normalised params for ``fault``; ValueError when the fault or its params are wrong."""
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}: one of {', '.join(FAULTS)}")
    params = dict(params or {})
    if fault == "latency":
        ms = params.get("ms")
        if isinstance(ms, bool) or not isinstance(ms, int | float) or not 0 <= ms <= 60_000:
            raise ValueError("latency: params.ms must be a number of milliseconds (0..60000)")
        return {"ms": ms}
    if fault == "visibility_expiry":
        params.setdefault("p", 1.0)
    p = _probability(params, fault)
    if fault == "errors":
        kind = params.get("kind", "throttling")
        if kind not in ERROR_KINDS:
            raise ValueError(f"errors: params.kind must be one of {', '.join(ERROR_KINDS)}")
        return {"p": p, "kind": kind}
    return {"p": p}


@dataclass
class ActiveFault:
    id: str
    fault: str
    params: dict[str, Any]
    queues: frozenset[str] | None
    seed: int
    started_at: float
    stopped_at: float | None = None
    rng: random.Random = field(default_factory=random.Random, repr=False)

    def applies(self, queue: str | None) -> bool:
        return self.queues is None or (queue is not None and queue in self.queues)

    def window(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "fault": self.fault,
            "params": dict(self.params),
            "queues": None if self.queues is None else sorted(self.queues),
            "seed": self.seed,
            "started_at": self.started_at,
            "stopped_at": self.stopped_at,
        }


class FaultState:
    """The active faults and the log of every fault window; also the model's fault hooks.

    Single-threaded (the endpoint's event loop). The hooks cost one dict lookup when no fault
    of that kind is active.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._ids = itertools.count(1)
        self._active: dict[str, list[ActiveFault]] = {name: [] for name in FAULTS}
        self._log: list[ActiveFault] = []

    # -- control ------------------------------------------------------------------------------
    def start(
        self,
        fault: str,
        params: dict[str, Any] | None = None,
        queues: Iterable[str] | None = None,
        seed: int | None = None,
    ) -> ActiveFault:
        clean = validate(fault, params)
        if queues is not None:
            if isinstance(queues, str):
                raise ValueError("queues must be a list of queue names or null")
            queues = frozenset(str(q) for q in queues)
        if seed is None:
            seed = random.SystemRandom().randrange(2**32)
        elif isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError("seed must be an integer")
        active = ActiveFault(
            id=f"f{next(self._ids)}",
            fault=fault,
            params=clean,
            queues=queues,
            seed=seed,
            started_at=self.clock(),
            rng=random.Random(seed),
        )
        self._active[fault].append(active)
        self._log.append(active)
        return active

    def stop(self, fault_id: str) -> ActiveFault | None:
        for name, faults in self._active.items():
            for active in faults:
                if active.id == fault_id:
                    active.stopped_at = self.clock()
                    self._active[name] = [f for f in faults if f is not active]
                    return active
        return None

    def stop_all(self) -> list[ActiveFault]:
        stopped = [f for faults in self._active.values() for f in faults]
        now = self.clock()
        for active in stopped:
            active.stopped_at = now
        self._active = {name: [] for name in FAULTS}
        return stopped

    def get(self, fault_id: str) -> ActiveFault | None:
        return next((f for f in self._log if f.id == fault_id), None)

    def active(self) -> list[ActiveFault]:
        return [f for faults in self._active.values() for f in faults]

    def log(self) -> list[dict[str, Any]]:
        return [f.window() for f in self._log]

    # -- hooks --------------------------------------------------------------------------------
    def _draw(self, fault: str, queue: str | None) -> bool:
        hit = False
        for active in self._active[fault]:
            if active.applies(queue) and active.rng.random() < active.params["p"]:
                hit = True
        return hit

    def duplicate(self, queue: str) -> bool:
        return bool(self._active["duplicate_delivery"]) and self._draw("duplicate_delivery", queue)

    def expire_on_receive(self, queue: str) -> bool:
        return bool(self._active["visibility_expiry"]) and self._draw("visibility_expiry", queue)

    def lose_delete(self, queue: str) -> bool:
        return bool(self._active["lost_delete"]) and self._draw("lost_delete", queue)

    def fail_entry(self, queue: str) -> bool:
        return bool(self._active["batch_entry_errors"]) and self._draw("batch_entry_errors", queue)

    def error_for(self, queue: str | None) -> str | None:
        """``"throttling"`` / ``"internal"`` when this call must fail, else None."""
        if not self._active["errors"]:
            return None
        kind = None
        for active in self._active["errors"]:
            if active.applies(queue) and active.rng.random() < active.params["p"]:
                kind = kind or active.params["kind"]
        return kind

    def latency_for(self, queue: str | None) -> float:
        """Seconds to add to this call."""
        if not self._active["latency"]:
            return 0.0
        return sum(f.params["ms"] for f in self._active["latency"] if f.applies(queue)) / 1000.0


# ---------------------------------------------------------------------------------------------
# Client for the chaos layer
# ---------------------------------------------------------------------------------------------
@dataclass
class FaultWindow:
    """One fault's window as the endpoint recorded it (times are epoch seconds)."""

    id: str
    fault: str
    params: dict[str, Any]
    queues: list[str] | None
    seed: int
    started_at: float
    stopped_at: float | None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FaultWindow:
        return cls(
            id=data["id"],
            fault=data["fault"],
            params=dict(data.get("params") or {}),
            queues=data.get("queues"),
            seed=int(data["seed"]),
            started_at=float(data["started_at"]),
            stopped_at=None if data.get("stopped_at") is None else float(data["stopped_at"]),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "fault": self.fault,
            "params": dict(self.params),
            "queues": self.queues,
            "seed": self.seed,
            "started_at": self.started_at,
            "stopped_at": self.stopped_at,
        }


class SqsFaultControlError(RuntimeError):
    pass


class SqsFaultControl:
    """Start and stop faults on an SQS endpoint over its control API (``/_sqs/...``).

    Every window started or stopped through this client is also kept in ``windows`` (by id),
    so a chaos schedule can copy them into the run history.
    """

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.http = httpx.Client(base_url=self.url, timeout=timeout)
        self.windows: dict[str, FaultWindow] = {}

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        response = self.http.request(method, path, json=body)
        if response.status_code >= 400:
            raise SqsFaultControlError(
                f"{method} {path}: HTTP {response.status_code}: {response.text}"
            )
        return response.json()

    def _keep(self, data: dict[str, Any]) -> FaultWindow:
        window = FaultWindow.from_dict(data)
        self.windows[window.id] = window
        return window

    def health(self) -> dict[str, Any]:
        return self._call("GET", "/_sqs/health")

    def start(
        self,
        fault: str,
        params: dict[str, Any] | None = None,
        queues: list[str] | None = None,
        seed: int | None = None,
        duration: float | None = None,
    ) -> FaultWindow:
        """Start a fault; with ``duration`` (seconds) the endpoint stops it by itself."""
        body: dict[str, Any] = {"fault": fault, "params": params or {}, "queues": queues}
        if seed is not None:
            body["seed"] = seed
        if duration is not None:
            body["duration"] = duration
        return self._keep(self._call("POST", "/_sqs/faults", body)["window"])

    def stop(self, fault_id: str) -> FaultWindow:
        return self._keep(self._call("DELETE", f"/_sqs/faults/{fault_id}")["window"])

    def stop_all(self) -> list[FaultWindow]:
        return [self._keep(w) for w in self._call("DELETE", "/_sqs/faults")["stopped"]]

    def log(self) -> list[FaultWindow]:
        """Every window the endpoint has recorded (started by anyone), oldest first."""
        return [self._keep(w) for w in self._call("GET", "/_sqs/faults/log")["windows"]]

    def reset(self) -> None:
        """Drop every queue (and stop every active fault)."""
        self._call("POST", "/_sqs/reset")

    @contextmanager
    def inject(
        self,
        fault: str,
        params: dict[str, Any] | None = None,
        queues: list[str] | None = None,
        seed: int | None = None,
    ) -> Iterator[FaultWindow]:
        """``with control.inject("lost_delete", {"p": 0.5}): ...``: stopped on exit."""
        window = self.start(fault, params, queues, seed)
        try:
            yield window
        finally:
            self.stop(window.id)

    # shorthands ---------------------------------------------------------------------------
    def duplicate_delivery(self, p: float, **kw: Any) -> FaultWindow:
        return self.start("duplicate_delivery", {"p": p}, **kw)

    def visibility_expiry(self, p: float = 1.0, **kw: Any) -> FaultWindow:
        return self.start("visibility_expiry", {"p": p}, **kw)

    def lost_delete(self, p: float, **kw: Any) -> FaultWindow:
        return self.start("lost_delete", {"p": p}, **kw)

    def errors(self, p: float, kind: str = "throttling", **kw: Any) -> FaultWindow:
        return self.start("errors", {"p": p, "kind": kind}, **kw)

    def latency(self, ms: float, **kw: Any) -> FaultWindow:
        return self.start("latency", {"ms": ms}, **kw)

    def batch_entry_errors(self, p: float, **kw: Any) -> FaultWindow:
        return self.start("batch_entry_errors", {"p": p}, **kw)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> SqsFaultControl:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
