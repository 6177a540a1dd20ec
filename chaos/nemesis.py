"""The nemesis: runs a fault schedule (offsets and durations) beside the load, and always rolls
back: every fault it started is stopped, also when the run fails or is interrupted."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from chaos.faults import ChaosTargets, Fault, History


@dataclass(frozen=True)
class ScheduledFault:
    fault: Fault
    offset_s: float
    duration_s: float


@dataclass(frozen=True)
class ScheduledAction:
    """A timed step of the method (a DLQ redrive, an erasure, preference changes), run once at
    its offset, in a thread of its own: an action that retries until a fault ends must not hold
    up the fault's own stop."""

    name: str
    offset_s: float
    run: Callable[[], object]


class Nemesis:
    def __init__(
        self,
        schedule: list[ScheduledFault],
        targets: ChaosTargets,
        history: History | None,
        log: Callable[[str], None] = print,
        actions: list[ScheduledAction] | None = None,
    ) -> None:
        self.schedule = sorted(schedule, key=lambda s: s.offset_s)
        self.actions = sorted(actions or [], key=lambda a: a.offset_s)
        self.targets = targets
        self.history = history
        self.log = log
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._action_threads: list[threading.Thread] = []

    @property
    def end_offset(self) -> float:
        ends = [s.offset_s + s.duration_s for s in self.schedule]
        ends += [a.offset_s for a in self.actions]
        return max(ends, default=0.0)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="nemesis", daemon=True)
        self._thread.start()

    @property
    def stopping(self) -> threading.Event:
        """Set when the schedule is rolled back: long actions stop retrying."""
        return self._stop

    def wait(self, timeout: float) -> bool:
        """Wait for the schedule and its actions to finish; True when they did."""
        if self._thread is None:
            return True
        deadline = time.monotonic() + timeout
        self._thread.join(timeout)
        for thread in list(self._action_threads):
            thread.join(max(0.0, deadline - time.monotonic()))
        return not self._thread.is_alive() and not any(t.is_alive() for t in self._action_threads)

    def _run_action(self, action: ScheduledAction) -> None:
        try:
            result = action.run()
            if self.history is not None:
                self.history.append("action", detail=f"{action.name}: {result}")
            self.log(f"action {action.name}: {result}")
        except Exception as exc:
            message = f"action {action.name} failed: {type(exc).__name__}: {exc}"
            self.errors.append(message)
            self.log(message)

    def _run(self) -> None:
        t0 = time.monotonic()
        events: list[tuple[float, int, str, ScheduledFault | ScheduledAction]] = []
        for item in self.schedule:
            events.append((item.offset_s, 1, "start", item))
            events.append((item.offset_s + item.duration_s, 0, "stop", item))
        for action in self.actions:
            events.append((action.offset_s, 2, "action", action))
        # At one instant: stops first, then starts, then actions.
        events.sort(key=lambda e: (e[0], e[1]))
        for at, _, verb, item in events:
            if self._stop.wait(max(0.0, t0 + at - time.monotonic())):
                return
            if isinstance(item, ScheduledAction):
                thread = threading.Thread(
                    target=self._run_action, args=(item,), name=f"action-{item.name}", daemon=True
                )
                self._action_threads.append(thread)
                thread.start()
                continue
            name = item.fault.name
            try:
                with self._lock:
                    if verb == "start" and self._stop.is_set():
                        return  # rolled back while this step waited for the lock
                    if verb == "start":
                        item.fault.start(self.targets, self.history)
                    else:
                        item.fault.stop(self.targets, self.history)
                self.log(f"{verb} {name} {item.fault.params or ''}".rstrip())
            except Exception as exc:
                message = f"{verb} of {name} failed: {type(exc).__name__}: {exc}"
                self.errors.append(message)
                self.log(message)

    def rollback(self, hurry: bool = False) -> list[str]:
        """Stop the schedule and undo every active fault; return what was rolled back.
        ``hurry`` (an interrupted run): wait for running steps a second at most."""
        self._stop.set()
        wait = 1.0 if hurry else 30.0
        if self._thread is not None:
            self._thread.join(wait)
        for thread in self._action_threads:
            thread.join(wait)
        undone = []
        with self._lock:
            for item in self.schedule:
                if item.fault.active:
                    try:
                        item.fault.stop(self.targets, self.history)
                        undone.append(item.fault.name)
                    except Exception as exc:
                        self.errors.append(f"rollback of {item.fault.name} failed: {exc}")
        return undone
