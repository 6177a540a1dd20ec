"""Fault injection for the SNS endpoint: the server-side state and a client for the chaos layer.

One fault so far, on Publish (push, SMS and topics alike):

* ``throttle`` ``{"p": 0.3}`` and/or ``{"rate": 50}``: a Publish is answered ``Throttling``
  ("Rate exceeded", HTTP 400, what SNS answers a throttled Publish with; the SDKs retry it with
  back-off) with probability ``p``, and, with ``rate``, whenever more than ``rate`` publishes per
  second arrive (a token bucket of ``rate`` per second holding at most ``rate``). Nothing is
  delivered for a throttled publish; its ledger row says ``sns_throttled`` and names the fault.

``targets``: ``null`` for every Publish, else a list of platform application ARNs, topic ARNs
and/or ``"sms"``. A PublishBatch draws once per entry: a throttled entry is a ``Failed`` entry
(``Throttling``, not the sender's fault), the others are published. Each fault draws from its own ``random.Random(seed)`` (the seed is chosen when
not given, and always recorded). Every start and stop is kept in the fault log.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx

FAULTS = ("throttle",)


def validate(fault: str, params: dict[str, Any] | None) -> dict[str, Any]:
    """Normalised params for ``fault``; ValueError when the fault or its params are wrong."""
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}: one of {', '.join(FAULTS)}")
    params = dict(params or {})
    unknown = sorted(set(params) - {"p", "rate"})
    if unknown:
        raise ValueError(f"throttle: unknown params {', '.join(unknown)} (p, rate)")
    p = params.get("p")
    rate = params.get("rate")
    if p is None and rate is None:
        raise ValueError("throttle: give params.p (probability), params.rate (publishes/s) or both")
    if p is not None and (
        isinstance(p, bool) or not isinstance(p, int | float) or not 0.0 <= float(p) <= 1.0
    ):
        raise ValueError("throttle: params.p must be a number between 0 and 1")
    if rate is not None and (
        isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate <= 1e6
    ):
        raise ValueError("throttle: params.rate must be a positive number of publishes per second")
    return {"p": float(p) if p is not None else 0.0, "rate": rate}


@dataclass
class ActiveFault:
    id: str
    fault: str
    params: dict[str, Any]
    targets: frozenset[str] | None
    seed: int
    started_at: float
    stopped_at: float | None = None
    rng: random.Random = field(default_factory=random.Random, repr=False)
    tokens: float = 0.0
    refilled_at: float = 0.0

    def applies(self, target: str) -> bool:
        return self.targets is None or target in self.targets

    def window(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "fault": self.fault,
            "params": dict(self.params),
            "targets": None if self.targets is None else sorted(self.targets),
            "seed": self.seed,
            "started_at": self.started_at,
            "stopped_at": self.stopped_at,
        }


class FaultState:
    """Active faults and the log of every window. Single event loop: no lock."""

    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.clock = clock
        self.monotonic = monotonic
        self._ids = itertools.count(1)
        self._active: list[ActiveFault] = []
        self._log: list[ActiveFault] = []

    def start(
        self,
        fault: str,
        params: dict[str, Any] | None = None,
        targets: Iterable[str] | None = None,
        seed: int | None = None,
    ) -> ActiveFault:
        clean = validate(fault, params)
        scope: frozenset[str] | None = None
        if targets is not None:
            if isinstance(targets, str) or not all(isinstance(t, str) and t for t in targets):
                raise ValueError('targets must be a list of ARNs and/or "sms", or null')
            scope = frozenset(targets)
        if seed is None:
            seed = random.SystemRandom().randrange(2**32)
        elif isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError("seed must be an integer")
        active = ActiveFault(
            id=f"sns-{next(self._ids)}",
            fault=fault,
            params=clean,
            targets=scope,
            seed=seed,
            started_at=self.clock(),
            rng=random.Random(seed),
            tokens=float(clean["rate"] or 0),
            refilled_at=self.monotonic(),
        )
        self._active.append(active)
        self._log.append(active)
        return active

    def stop(self, fault_id: str) -> ActiveFault | None:
        for active in self._active:
            if active.id == fault_id:
                self._active.remove(active)
                active.stopped_at = self.clock()
                return active
        return None

    def stop_all(self) -> list[ActiveFault]:
        stopped = list(self._active)
        for active in stopped:
            self.stop(active.id)
        return stopped

    def get(self, fault_id: str) -> ActiveFault | None:
        return next((f for f in self._log if f.id == fault_id), None)

    def active(self) -> list[ActiveFault]:
        return list(self._active)

    def log(self) -> list[dict[str, Any]]:
        return [f.window() for f in self._log]

    def throttle(self, target: str) -> str | None:
        """The id of the fault that throttles this publish, or None."""
        if not self._active:
            return None
        for active in self._active:
            if active.fault != "throttle" or not active.applies(target):
                continue
            rate = active.params["rate"]
            if rate:
                now = self.monotonic()
                active.tokens = min(float(rate), active.tokens + (now - active.refilled_at) * rate)
                active.refilled_at = now
                if active.tokens < 1.0:
                    return active.id
                active.tokens -= 1.0
            if active.params["p"] and active.rng.random() < active.params["p"]:
                return active.id
        return None


class SnsControlError(RuntimeError):
    pass


class SnsControl:
    """Client of the control API (``/_sns/...``): faults, ledgers, SMS replies, reset."""

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, timeout=timeout)

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        response = self._http.request(method, path, json=body)
        if response.status_code != 200:
            raise SnsControlError(f"{method} {path}: {response.status_code} {response.text}")
        return response.json()

    def health(self) -> dict[str, Any]:
        return self._call("GET", "/_sns/health")

    def throttle(
        self,
        p: float | None = None,
        rate: float | None = None,
        *,
        targets: list[str] | None = None,
        seed: int | None = None,
        duration: float | None = None,
    ) -> dict[str, Any]:
        params = {k: v for k, v in (("p", p), ("rate", rate)) if v is not None}
        body: dict[str, Any] = {"fault": "throttle", "params": params, "targets": targets}
        if seed is not None:
            body["seed"] = seed
        if duration is not None:
            body["duration"] = duration
        return self._call("POST", "/_sns/faults", body)

    def stop(self, fault_id: str) -> dict[str, Any]:
        return self._call("DELETE", f"/_sns/faults/{fault_id}")["window"]

    def stop_all(self) -> list[dict[str, Any]]:
        return self._call("DELETE", "/_sns/faults")["stopped"]

    def fault_log(self) -> list[dict[str, Any]]:
        return self._call("GET", "/_sns/faults/log")["windows"]

    def ledger(self, since: int = 0) -> dict[str, Any]:
        return self._call("GET", f"/_sns/ledger?since={since}")

    def sms(self, since: int = 0) -> dict[str, Any]:
        return self._call("GET", f"/_sns/sms?since={since}")

    def deliveries(self, since: int = 0) -> dict[str, Any]:
        """Topic notifications handed to (or refused by) SQS subscriptions."""
        return self._call("GET", f"/_sns/deliveries?since={since}")

    def endpoint_events(self, since: int = 0) -> dict[str, Any]:
        """Every change to a platform endpoint, by the API (``by: api``) or by SNS itself
        (``by: sns``: a provider said the token is dead)."""
        return self._call("GET", f"/_sns/endpoint-events?since={since}")

    def reply(self, phone_number: str, text: str = "STOP") -> dict[str, Any]:
        """A handset's reply to an SMS (``STOP`` and AWS's other keywords opt the number out)."""
        return self._call("POST", "/_sns/sms/replies", {"phoneNumber": phone_number, "text": text})

    def opt_out(self, phone_numbers: list[str]) -> int:
        """Numbers that replied STOP before now; returns how many were newly opted out."""
        return int(
            self._call("POST", "/_sns/sms/opted-out", {"phoneNumbers": phone_numbers})["optedOut"]
        )

    def reset(self) -> None:
        self._call("POST", "/_sns/reset")

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> SnsControl:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
