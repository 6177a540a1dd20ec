"""The fault catalogue (the nemesis's vocabulary): named faults with parameters, start and stop.

One module per fault in this package, each registering itself with :func:`fault` (as
Toxiproxy's toxics do): adding a fault is one new module, no edit here.

Every fault acts on the outside of the system under test only: the fault proxy in front of the
dedup store, the AWS fault proxy in front of Kinesis, the provider simulators, the SQS and SNS
endpoints, and the worker processes. Each start and
stop is recorded in the run history as a ``fault`` row, so checkers can see the window.

The proxy is driven through ``toxiproxy-python`` (the PyPI client), so the same faults work
against a real Toxiproxy in a team's staging environment.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

DEDUP_PROXY = "dedup"
# What a fault's window record names as taken away (``unavailable``) when the dependency is the
# dedup store: the checkers read it from the history (fail_closed's outage windows), by this
# property of the fault, never by the fault's name.
DEDUP_STORE = "dedup"
# The preferences table's change stream as the cache invalidator reads it: a fault that stops its
# delivery (the invalidator stopped) records this, and preference_changes then bounds a change
# written straight to the table by the cache's TTL alone (only the stream could have told the
# system), while a change made through the API must still take effect within the bound.
PREFERENCES_STREAM = "preferences_stream"
# ``FaultSpec.takes_away`` of a fault acting on the proxy its ``params.proxy`` names: the
# dependency is whatever that proxy stands for (the dedup store when it is the target's).
NAMED_PROXY = "<params.proxy>"


class History(Protocol):
    """Where fault windows are recorded: anything with the history's ``append`` (the harness's
    run history; chaos itself depends on no harness module)."""

    def append(self, kind: str, **fields: Any) -> None: ...


class FaultError(ValueError):
    """A fault name or its parameters are not valid."""


class ProcessControl(Protocol):
    """What process faults need: kill a part (a role: ``push-consumer``, ``redis`` ...), stop it
    gracefully, start it again, pause and resume it; the harness's own stack does it with
    signals, a team's system through the shell hooks its target file names."""

    def offers(self, part: str, action: str) -> bool:
        """Whether ``action`` (kill, stop, start, pause, resume) can be done to ``part``."""
        ...

    def kill_part(self, part: str) -> None: ...

    def stop_part(self, part: str) -> Any: ...

    def start_part(self, part: str) -> Any: ...

    def pause_part(self, part: str) -> None: ...

    def resume_part(self, part: str) -> None: ...


@dataclass
class ChaosTargets:
    """Where the faults act. Any may be None when a target does not offer it."""

    toxiproxy_url: str | None = None
    apns_url: str | None = None
    apns_ca_file: str | None = None
    fcm_url: str | None = None
    # The SES and in-app (API Gateway Management API) simulators, when the system sends there.
    ses_url: str | None = None
    inapp_url: str | None = None
    sqs_url: str | None = None
    # The SNS endpoint's control API, when the system publishes through the harness's SNS.
    sns_url: str | None = None
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
    # The dependency the window takes away (``FaultSpec.takes_away`` resolved at start).
    unavailable: str | None = None

    def start(self, targets: ChaosTargets, history: History | None) -> None:
        if self.active:
            return
        if self.begin is not None:
            begin = self.begin
        else:
            missing = unavailable(self.name, targets)
            if missing:
                raise FaultError(missing)
            begin = CATALOGUE[self.name].start
            self.unavailable = taken_away(CATALOGUE[self.name], targets, self.params)
        self._undo = begin(targets, self.params)
        self.active = True
        if history is not None:
            history.append("fault", detail=self._detail("start"))

    def stop(self, targets: ChaosTargets, history: History | None) -> None:
        """Undoes the fault. Its window is recorded as closing when the undo began, the
        earliest the dependency may be back (as it opens when the start returned, the latest it
        may have gone): the checkers judge only the span that was surely out. Recorded when
        the undo returned, a loaded machine's undo put a send decided with the store back
        10 ms inside the window."""
        if not self.active:
            return
        undoing = time.time()
        try:
            if self._undo is not None:
                self._undo()
        finally:
            self.active = False
            if history is not None:
                history.append("fault", time=undoing, detail=self._detail("stop"))

    def _detail(self, phase: str) -> str:
        detail = {"window": self.window_id, "fault": self.name, "phase": phase}
        detail["params"] = self.params
        # Recorded on every window of a catalogue fault: null when it takes nothing away.
        if self.begin is None:
            detail["unavailable"] = self.unavailable
            # A process fault names the part it stopped: while it is down, and until its jobs'
            # visibility runs out after it, the system cannot act (quiet_hours' releases).
            part = CATALOGUE[self.name].part if self.name in CATALOGUE else None
            if part is not None:
                detail["stopped_part"] = part
        if self.origin is not None:
            detail["origin"] = self.origin
        return json.dumps(detail, default=str)


# -- the registry -----------------------------------------------------------------------------

Start = Callable[[ChaosTargets, dict[str, Any]], Callable[[], None] | None]


@dataclass(frozen=True)
class FaultSpec:
    description: str
    start: Start
    required: tuple[str, ...] = ()
    # The ChaosTargets field the fault acts through; None on a target is "not available".
    needs: str | None = None
    needs_what: str = ""
    # A process fault: the part (role) it acts on and what it does to it (kill and start, or
    # pause and resume); a system whose processes do not offer them cannot take the fault.
    part: str | None = None
    actions: tuple[str, ...] = ()
    # The dependency the fault makes unavailable for its window: no answer comes (connections
    # refused, black-holed until a client's own timeout, the process killed). ``DEDUP_STORE``
    # for the dedup store, ``NAMED_PROXY`` for the proxy its params name; None when it only
    # degrades (latency, errors from a simulator) or acts on something else.
    takes_away: str | None = None


CATALOGUE: dict[str, FaultSpec] = {}


def fault(
    name: str,
    description: str,
    *,
    needs: str | None = None,
    needs_what: str = "",
    required: tuple[str, ...] = (),
    part: str | None = None,
    actions: tuple[str, ...] = (),
    takes_away: str | None = None,
) -> Callable[[Start], Start]:
    """Register ``start(targets, params) -> undo`` as the fault ``name`` (a decorator)."""

    def register(start: Start) -> Start:
        if name in CATALOGUE and CATALOGUE[name].start is not start:
            raise ValueError(f"two faults named {name!r}")
        CATALOGUE[name] = FaultSpec(
            description, start, required, needs, needs_what, part, actions, takes_away
        )
        return start

    return register


def taken_away(spec: FaultSpec, targets: ChaosTargets, params: dict[str, Any]) -> str | None:
    """The dependency a fault's window takes away on these targets: ``spec.takes_away``, with
    a named proxy read as the dedup store when it is the target's dedup proxy."""
    if spec.takes_away != NAMED_PROXY:
        return spec.takes_away
    proxy = params.get("proxy")
    if not isinstance(proxy, str) or not proxy:
        return None
    return DEDUP_STORE if proxy == targets.dedup_proxy else proxy


def unavailable(name: str, targets: ChaosTargets) -> str | None:
    """Why the fault cannot act on these targets (what they lack), or None."""
    spec = CATALOGUE[name]
    if spec.needs is not None and getattr(targets, spec.needs) is None:
        return f"{name} is not available on this target: it has no {spec.needs_what or spec.needs}"
    processes = targets.processes
    if spec.part is not None and processes is not None:
        missing = [a for a in spec.actions if not processes.offers(spec.part, a)]
        if missing:
            return (
                f"{name} is not available on this target: it has no {' and '.join(missing)} "
                f"hook for {spec.part} (processes: {{{spec.part}: {{{', '.join(missing)}: "
                "<shell command>}} in the target file)"
            )
    return None


def make_fault(name: str, params: dict[str, Any] | None = None) -> Fault:
    if name not in CATALOGUE:
        raise FaultError(f"unknown fault {name!r}; known: {', '.join(sorted(CATALOGUE))}")
    params = dict(params or {})
    missing = [p for p in CATALOGUE[name].required if p not in params]
    if missing:
        raise FaultError(f"fault {name!r} needs parameter(s): {', '.join(missing)}")
    return Fault(name, params)


def _load() -> None:
    import importlib
    import pkgutil

    for module in pkgutil.iter_modules(__path__):
        if module.name != "adapters":
            importlib.import_module(f"{__name__}.{module.name}")


_load()
