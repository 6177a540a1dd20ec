"""Fault injection for the provider simulators, on command (``/_sim/faults``) and recorded.

Control API (both simulators, on their own port, HTTP/1.1 and h2):

* ``POST /_sim/faults`` ``{"fault": NAME, "params": {...}, "seed": int?}`` -> 200
  ``{id, fault, params, seed, started_at}`` (params with their defaults filled in); 400
  ``{"error": ...}`` naming the bad name or parameter.
* ``GET /_sim/faults`` -> ``{"active": [window, ...]}``; ``GET /_sim/faults/log`` ->
  ``{"windows": [...]}``, every fault started since the last reset, ``stopped_at`` null while
  it is active.
* ``DELETE /_sim/faults/<id>`` -> 200 with its window ``{id, fault, params, seed, started_at,
  stopped_at}`` (404 for an unknown id; an already stopped one answers its window again);
  ``DELETE /_sim/faults`` stops all -> ``{"stopped": [window, ...]}``.
* ``POST /_sim/reset`` also stops every fault and clears the log.

A window is ``{id, fault, params, seed, started_at, stopped_at}`` (epoch seconds).

Faults apply to provider requests that pass the simulator's own validation (a malformed request
still gets its 4xx). Several may be active at once; each decides with its own
``random.Random(seed)`` (default seed: the fault's ordinal since the last reset), and every
active fault draws for every request it is scoped to, so one fault's decisions do not depend on
the others: a run repeats. Of the faults that fire on a request, the earliest started decides
the answer; latencies add up.

Several processes (``--processes N``): every process applies every fault (the control call is
journalled, :mod:`emulators.providers.shared`) with the same id, window and seed, and each
process draws that seed's stream for the requests it gets. A run repeats per process: the same
requests reaching the same process in the same order get the same answers (one connection's
requests always reach one process), but which process a new connection lands on is the
kernel's choice, so across processes only the proportion repeats. Two processes draw the same
stream, so their k-th requests are decided alike. The ``unregister`` fault's draw depends on
(seed, token) only and the ``quota`` fault counts across all processes: both are exact.

Faults (``tokens``: optional list scoping status / accepted_then_error / latency to those
device tokens; ``p`` defaults to 1):

* ``status`` ``{p, status, retry_after?}``: the answer is that error (APNs 429
  TooManyRequests / 500 InternalServerError / 503 ServiceUnavailable; FCM 503 UNAVAILABLE / 500
  INTERNAL), with ``retry-after`` when given. Not delivered.
* ``accepted_then_error`` ``{p, status?, retry_after?}`` (status 500 or 503, default 500): the
  device gets the notification (delivered), the answer is the error.
* ``latency`` ``{ms, jitter_ms?}``: answered after ms + uniform(0, jitter_ms) milliseconds (an
  asyncio sleep for that stream only).
* ``unregister`` ``{tokens}`` or ``{p}``: those tokens (or each token seen while active, with
  probability p, decided once per token by a draw seeded with (seed, token), so the same in
  every process and in any order) answer 410 Unregistered / 404 UNREGISTERED from then on, also
  after the fault stops (until reset).
* ``goaway`` ``{after_streams}`` (HTTP/2 only): on each connection, once that many provider
  streams were handled, GOAWAY (NO_ERROR, last_stream_id = the highest stream handed to the
  handler); newer streams are not processed; the connection closes when the rest are answered.
  Our own HTTP/2 server only (``--server h2``): granian gives the application no hold on a
  connection, so under ``--server granian`` starting it answers 400.
* ``quota`` (FCM) ``{per_minute, window_seconds?}``: per project, fixed windows of
  ``window_seconds`` (default 60) from the fault's start; beyond ``per_minute`` requests in a
  window, 429 RESOURCE_EXHAUSTED / QUOTA_EXCEEDED with ``retry-after`` = whole seconds until the
  window ends (at least 1). Not delivered.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from emulators.http_server import Request, Response, json_response

APNS_FAULTS = ("status", "accepted_then_error", "latency", "unregister", "goaway")
FCM_FAULTS = ("quota", "status", "accepted_then_error", "latency", "unregister", "goaway")
# The channel simulators (SES, the API Gateway Management API) take the per-request faults; a
# dead address / a gone connection is their own state (control API), not a fault.
SES_FAULTS = ("status", "accepted_then_error", "latency")
INAPP_FAULTS = ("status", "latency")
FAULTS_BY_PROVIDER = {
    "apns": APNS_FAULTS,
    "fcm": FCM_FAULTS,
    "ses": SES_FAULTS,
    "inapp": INAPP_FAULTS,
}
STATUS_CHOICES = {
    "apns": (429, 500, 503),
    "fcm": (503, 500),
    "ses": (429, 500, 503),
    "inapp": (429, 500),
}
ACCEPTED_STATUS_CHOICES = (500, 503)
DEFAULT_QUOTA_WINDOW = 60.0


class FaultInputError(ValueError):
    """A fault request the simulator refuses (answered 400 with this message)."""


# -- parameter checks ---------------------------------------------------------------------------
def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _probability(params: dict[str, Any]) -> float:
    p = params.get("p", 1.0)
    if not _is_number(p) or not 0 <= p <= 1:
        raise FaultInputError(f"params.p must be a number from 0 to 1, got {p!r}")
    return float(p)


def _int_param(params: dict[str, Any], name: str, *, minimum: int, default: Any = ...) -> int:
    if name not in params:
        if default is ...:
            raise FaultInputError(f"params.{name} is required")
        return default
    value = params[name]
    if not _is_int(value) or value < minimum:
        raise FaultInputError(f"params.{name} must be an integer >= {minimum}, got {value!r}")
    return value


def _tokens(params: dict[str, Any], *, required: bool = False) -> list[str] | None:
    if "tokens" not in params:
        if required:
            raise FaultInputError("params.tokens is required")
        return None
    tokens = params["tokens"]
    if not isinstance(tokens, list) or not all(isinstance(t, str) and t for t in tokens):
        raise FaultInputError("params.tokens must be a list of non-empty strings")
    return tokens


def _check_keys(params: dict[str, Any], allowed: tuple[str, ...], fault: str) -> None:
    for key in params:
        if key not in allowed:
            raise FaultInputError(
                f"unknown parameter params.{key} for fault {fault!r}; allowed: {', '.join(allowed)}"
            )


# -- the per-request outcome ------------------------------------------------------------------
class Outcome:
    """What the active faults decided for one request."""

    __slots__ = ("error", "retry_after", "delay", "delay_fault", "goaway")

    def __init__(self) -> None:
        #: the fault whose error answers this request (status / accepted_then_error / quota)
        self.error: Fault | None = None
        self.retry_after: int | None = None
        self.delay = 0.0
        self.delay_fault: Fault | None = None
        #: the connection to send GOAWAY on once this request is answered
        self.goaway: Any = None

    def response(self, response: Response) -> Response:
        """``response``, wrapped so the handler applies the delay / GOAWAY when there are any."""
        if self.delay > 0 or self.goaway is not None:
            return FaultResponse(
                response.status, response.headers, response.body, self.delay, self.goaway
            )
        return response


@dataclass
class FaultResponse(Response):
    """A response still to be delayed and/or followed by a GOAWAY: ``await apply()``."""

    delay: float = 0.0
    goaway: Any = None

    async def apply(self) -> Response:
        if self.delay > 0:
            await asyncio.sleep(self.delay)
        if self.goaway is not None and not getattr(self.goaway, "goaway_sent", True):
            # queued behind this stream's response; streams above it are no longer processed
            self.goaway.goaway(drain=True)
        return self


async def finish(response: Response) -> Response:
    """Apply a :class:`FaultResponse`'s delay and GOAWAY; other responses pass through."""
    if isinstance(response, FaultResponse):
        return await response.apply()
    return response


# -- faults ---------------------------------------------------------------------------------------
class Fault:
    """One started fault: its window and its own seeded random stream."""

    name = ""
    #: the device got the notification although the answer is an error
    delivered = False

    def __init__(
        self,
        fault_id: str,
        params: dict[str, Any],
        seed: int,
        clock: Callable[[], float],
    ) -> None:
        self.id = fault_id
        self.params = params
        self.seed = seed
        self.rng = random.Random(seed)
        self.clock = clock
        self.started_at = time.time()
        self.stopped_at: float | None = None
        self.status = 0
        self.retry_after: int | None = None
        scope = params.get("tokens")
        self.scope: frozenset[str] | None = frozenset(scope) if scope is not None else None

    def window(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "fault": self.name,
            "params": self.params,
            "seed": self.seed,
            "started_at": self.started_at,
            "stopped_at": self.stopped_at,
        }

    def on_start(self, fault_set: FaultSet) -> None:
        """Called once when started."""

    def apply(self, out: Outcome, token: str, project: str | None, request: Request) -> None:
        raise NotImplementedError


class StatusFault(Fault):
    name = "status"

    @classmethod
    def check(cls, provider: str, params: dict[str, Any]) -> dict[str, Any]:
        _check_keys(params, ("p", "status", "retry_after", "tokens"), cls.name)
        choices = STATUS_CHOICES[provider] if cls is StatusFault else ACCEPTED_STATUS_CHOICES
        if "status" not in params and cls is StatusFault:
            raise FaultInputError(f"params.status is required: one of {list(choices)}")
        status = params.get("status", 500)
        if status not in choices or not _is_int(status):
            raise FaultInputError(
                f"params.status must be one of {list(choices)} for {provider} fault "
                f"{cls.name!r}, got {status!r}"
            )
        out: dict[str, Any] = {"p": _probability(params), "status": status}
        if "retry_after" in params:
            out["retry_after"] = _int_param(params, "retry_after", minimum=0)
        tokens = _tokens(params)
        if tokens is not None:
            out["tokens"] = tokens
        return out

    def on_start(self, fault_set: FaultSet) -> None:
        self.p = self.params["p"]
        self.status = self.params["status"]
        self.retry_after = self.params.get("retry_after")

    def apply(self, out: Outcome, token: str, project: str | None, request: Request) -> None:
        if self.scope is not None and token not in self.scope:
            return
        if self.rng.random() < self.p and out.error is None:
            out.error = self
            out.retry_after = self.retry_after


class AcceptedThenErrorFault(StatusFault):
    name = "accepted_then_error"
    delivered = True


class LatencyFault(Fault):
    name = "latency"

    @classmethod
    def check(cls, provider: str, params: dict[str, Any]) -> dict[str, Any]:
        _check_keys(params, ("ms", "jitter_ms", "tokens"), cls.name)
        out: dict[str, Any] = {
            "ms": _int_param(params, "ms", minimum=0),
            "jitter_ms": _int_param(params, "jitter_ms", minimum=0, default=0),
        }
        tokens = _tokens(params)
        if tokens is not None:
            out["tokens"] = tokens
        return out

    def on_start(self, fault_set: FaultSet) -> None:
        self.seconds = self.params["ms"] / 1000
        self.jitter = self.params["jitter_ms"] / 1000

    def apply(self, out: Outcome, token: str, project: str | None, request: Request) -> None:
        if self.scope is not None and token not in self.scope:
            return
        delay = self.seconds + (self.rng.uniform(0, self.jitter) if self.jitter else 0.0)
        out.delay += delay
        if out.delay_fault is None:
            out.delay_fault = self


class UnregisterFault(Fault):
    name = "unregister"

    @classmethod
    def check(cls, provider: str, params: dict[str, Any]) -> dict[str, Any]:
        _check_keys(params, ("tokens", "p"), cls.name)
        if ("tokens" in params) == ("p" in params):
            raise FaultInputError("params needs exactly one of tokens (a list) or p (0..1)")
        if "tokens" in params:
            return {"tokens": _tokens(params, required=True)}
        return {"p": _probability(params)}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.scope = None  # tokens here are the victims, not a scope
        self.decided: set[str] = set()
        self.mark: Callable[..., None] | None = None

    def on_start(self, fault_set: FaultSet) -> None:
        self.mark = fault_set.on_unregister
        self.p = self.params.get("p")
        if "tokens" in self.params and self.mark is not None:
            # every process applies the start itself: marked here, stamped with the start
            self.mark(
                self.params["tokens"], self.id, at_ms=int(self.started_at * 1000), publish=False
            )

    def apply(self, out: Outcome, token: str, project: str | None, request: Request) -> None:
        if self.p is None or token in self.decided:
            return
        self.decided.add(token)
        if token_draw(self.seed, token) < self.p and self.mark is not None:
            self.mark([token], self.id)


def token_draw(seed: int, token: str) -> float:
    """The unregister fault's draw for one token: a function of (seed, token) alone, so that
    every process of a simulator decides a token the same way, in any order."""
    return random.Random(f"{seed}:{token}").random()


class GoawayFault(Fault):
    name = "goaway"

    @classmethod
    def check(cls, provider: str, params: dict[str, Any]) -> dict[str, Any]:
        _check_keys(params, ("after_streams",), cls.name)
        return {"after_streams": _int_param(params, "after_streams", minimum=1)}

    def on_start(self, fault_set: FaultSet) -> None:
        self.after = self.params["after_streams"]
        # connection -> provider streams handled on it while the fault was active
        self.counts: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()

    def apply(self, out: Outcome, token: str, project: str | None, request: Request) -> None:
        conn = request.connection
        if request.http_version != "2" or not hasattr(conn, "goaway") or conn.goaway_sent:
            return
        count = self.counts.get(conn, 0) + 1
        self.counts[conn] = count
        if count >= self.after:
            out.goaway = conn


class QuotaFault(Fault):
    name = "quota"

    @classmethod
    def check(cls, provider: str, params: dict[str, Any]) -> dict[str, Any]:
        _check_keys(params, ("per_minute", "window_seconds"), cls.name)
        window = params.get("window_seconds", DEFAULT_QUOTA_WINDOW)
        if not _is_number(window) or window <= 0:
            raise FaultInputError(f"params.window_seconds must be a number > 0, got {window!r}")
        return {
            "per_minute": _int_param(params, "per_minute", minimum=0),
            "window_seconds": window,
        }

    def on_start(self, fault_set: FaultSet) -> None:
        self.status = 429
        self.limit = self.params["per_minute"]
        self.window_seconds = float(self.params["window_seconds"])
        # windows run from the fault's start, on this process's clock
        self.t0 = self.clock() - max(0.0, time.time() - self.started_at)
        self.count = fault_set.count_in_window

    def apply(self, out: Outcome, token: str, project: str | None, request: Request) -> None:
        now = self.clock()
        index = int((now - self.t0) // self.window_seconds)
        count = self.count(f"{self.id}\0{project}", index)
        if count > self.limit and out.error is None:
            out.error = self
            window_end = self.t0 + (index + 1) * self.window_seconds
            out.retry_after = max(1, math.ceil(window_end - now))


FAULT_CLASSES: dict[str, type[Any]] = {
    cls.name: cls
    for cls in (
        StatusFault,
        AcceptedThenErrorFault,
        LatencyFault,
        UnregisterFault,
        GoawayFault,
        QuotaFault,
    )
}


Publish = Callable[[dict[str, Any]], dict[str, Any]]
Counter = Callable[[str, int], int]


class FaultSet:
    """The faults of one simulator: the active ones (read on the hot path) and the log.

    ``active`` is a tuple replaced on every change, so the hot path only reads it: empty (and
    falsy) when no fault is active. ``clock`` is the monotonic clock of quota windows.

    Every change is an event (``fault_start``, ``fault_stop``, ``fault_stop_all``) that goes
    through ``publish``: by default applied here at once; a simulator of several processes
    (:class:`~emulators.providers.ledger.ProviderState` with a shared directory) journals it
    and every process applies it, so that fault ids, seeds and windows are the same in all.
    ``count_in_window(key, window)`` counts a quota's requests (shared by those processes).
    """

    def __init__(
        self,
        provider: str,
        on_unregister: Callable[..., None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        *,
        publish: Publish | None = None,
        count_in_window: Counter | None = None,
        unsupported: dict[str, str] | None = None,
    ) -> None:
        self.provider = provider
        #: fault name -> why this server cannot inject it (answered 400)
        self.unsupported = unsupported or {}
        self.names = FAULTS_BY_PROVIDER[provider]
        self.on_unregister = on_unregister
        self.clock = clock
        self.publish = publish if publish is not None else self._publish_here
        self.count_in_window = count_in_window if count_in_window is not None else self._count_here
        self.active: tuple[Fault, ...] = ()
        self._log: list[Fault] = []
        self._started_total = 0  # never reset: fault ids stay unique across resets
        self._counts: dict[str, list[int]] = {}
        self._lock = threading.RLock()

    def _publish_here(self, event: dict[str, Any]) -> dict[str, Any]:
        event = self.finalize(event)
        self.apply(event)
        return event

    def _count_here(self, key: str, window: int) -> int:
        entry = self._counts.get(key)
        if entry is None or entry[0] != window:
            entry = [window, 0]
            self._counts[key] = entry
        entry[1] += 1
        return entry[1]

    def start(self, name: Any, params: Any = None, seed: Any = None) -> Fault:
        """Start a fault; raises :class:`FaultInputError` for a bad name, params or seed."""
        if not isinstance(name, str) or name not in self.names:
            raise FaultInputError(
                f"unknown fault {name!r} for {self.provider}; known: {', '.join(self.names)}"
            )
        if name in self.unsupported:
            raise FaultInputError(f"fault {name!r} is not available here: {self.unsupported[name]}")
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise FaultInputError("params must be a JSON object")
        if seed is not None and not _is_int(seed):
            raise FaultInputError(f"seed must be an integer, got {seed!r}")
        checked = FAULT_CLASSES[name].check(self.provider, params)
        event = self.publish(
            {
                "op": "fault_start",
                "fault": name,
                "params": checked,
                "seed": seed,
                "started_at": time.time(),
            }
        )
        fault = self.find(event["id"])
        assert fault is not None
        return fault

    def find(self, fault_id: str) -> Fault | None:
        with self._lock:
            for fault in self._log:
                if fault.id == fault_id:
                    return fault
        return None

    def stop(self, fault_id: str) -> Fault | None:
        """Stop one fault; returns it (None when the id is unknown; a stopped one as it is)."""
        fault = self.find(fault_id)
        if fault is None or fault.stopped_at is not None:
            return fault
        self.publish({"op": "fault_stop", "id": fault_id, "at": time.time()})
        return self.find(fault_id)

    def stop_all(self) -> list[Fault]:
        event = self.publish({"op": "fault_stop_all", "at": time.time()})
        with self._lock:
            return [f for f in self._log if f.id in event.get("ids", ())]

    def log(self) -> list[dict[str, Any]]:
        with self._lock:
            return [f.window() for f in self._log]

    def reset(self, at: float | None = None) -> None:
        """Stop every fault and forget the log (applied here: part of a simulator reset)."""
        with self._lock:
            now = time.time() if at is None else at
            for fault in self.active:
                fault.stopped_at = now
            self.active = ()
            self._log.clear()
            self._counts.clear()

    # -- events ---------------------------------------------------------------------------------
    def finalize(self, event: dict[str, Any]) -> dict[str, Any]:
        """Fill in what the publisher decides for everyone: a started fault's id and default
        seed (its ordinal since the last reset), the ids a stop-all stops."""
        with self._lock:
            if event["op"] == "fault_start" and "id" not in event:
                seed = event["seed"]
                event = {
                    **event,
                    "id": f"{event['fault']}-{self._started_total + 1}",
                    "seed": len(self._log) + 1 if seed is None else seed,
                }
            elif event["op"] == "fault_stop_all" and "ids" not in event:
                event = {**event, "ids": [f.id for f in self.active]}
        return event

    def apply(self, event: dict[str, Any]) -> None:
        """Apply one finalized fault event."""
        op = event["op"]
        with self._lock:
            if op == "fault_start":
                cls = FAULT_CLASSES[event["fault"]]
                fault = cls(event["id"], event["params"], event["seed"], self.clock)
                fault.started_at = event["started_at"]
                fault.on_start(self)
                self._started_total += 1
                self._log.append(fault)
                self.active = (*self.active, fault)
            elif op == "fault_stop":
                for fault in self.active:
                    if fault.id == event["id"]:
                        fault.stopped_at = event["at"]
                self.active = tuple(f for f in self.active if f.id != event["id"])
            elif op == "fault_stop_all":
                ids = set(event["ids"])
                for fault in self.active:
                    if fault.id in ids:
                        fault.stopped_at = event["at"]
                self.active = tuple(f for f in self.active if f.id not in ids)
            else:
                raise ValueError(f"not a fault event: {op!r}")

    def evaluate(self, token: str, project: str | None, request: Request) -> Outcome:
        """What the active faults do to one (valid) provider request."""
        out = Outcome()
        for fault in self.active:
            fault.apply(out, token, project, request)
        return out


# -- control API ----------------------------------------------------------------------------------
def _bad(message: str) -> Response:
    return json_response(400, {"error": message})


def handle_fault_control(request: Request, faults: FaultSet) -> Response:
    """``/_sim/faults...`` (the caller checked the prefix)."""
    method = request.method
    path = request.path.rstrip("/")
    if path == "/_sim/faults":
        if method == "POST":
            try:
                body = json.loads(request.body) if request.body.strip() else None
            except ValueError:
                return _bad('body must be JSON: {"fault": NAME, "params": {...}, "seed": int}')
            if not isinstance(body, dict):
                return _bad('body must be a JSON object: {"fault": NAME, "params": {...}}')
            unknown = sorted(set(body) - {"fault", "params", "seed"})
            if unknown:
                return _bad(f"unknown field(s) {unknown}; expected fault, params, seed")
            try:
                fault = faults.start(body.get("fault"), body.get("params"), body.get("seed"))
            except FaultInputError as exc:
                return _bad(str(exc))
            window = fault.window()
            del window["stopped_at"]
            return json_response(200, window)
        if method == "GET":
            return json_response(200, {"active": [f.window() for f in faults.active]})
        if method == "DELETE":
            return json_response(200, {"stopped": [f.window() for f in faults.stop_all()]})
        return json_response(405, {"error": f"method {method} not allowed on {path}"})
    if path == "/_sim/faults/log":
        if method == "GET":
            return json_response(200, {"windows": faults.log()})
        return json_response(405, {"error": f"method {method} not allowed on {path}"})
    fault_id = path[len("/_sim/faults/") :]
    if not path.startswith("/_sim/faults/") or "/" in fault_id:
        return json_response(404, {"error": f"unknown control path {request.path}"})
    if method != "DELETE":
        return json_response(405, {"error": f"method {method} not allowed on {path}"})
    stopped = faults.stop(fault_id)
    if stopped is None:
        return json_response(404, {"error": f"no fault with id {fault_id!r}"})
    return json_response(200, stopped.window())
