"""The live view of a run: a thread that reads the history's new rows every half second, feeds
the metrics and the online checks, serves the metrics to Prometheus on a loopback port, records
each promise first seen broken as a ``live`` history row, and calls for the drill's end when a
stop condition fires.

The port and URL are printed and written to ``<run dir>/live.json``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import start_http_server

from harness.live.metrics import LiveMetrics
from harness.live.online import LiveViolation, OnlineChecks
from harness.live.stop import StopCondition, first_fired
from harness.model.history import History

LIVE_FILE = "live.json"
# The condition a person's Ctrl-C during the load names (AWS FIS's "stop experiment", Gremlin's
# halt button): the drill ends as a fired stop condition ends it.
SAFETY_LEVER = "safety lever (Ctrl-C)"


@dataclass(frozen=True)
class Stop:
    """Why the drill was ended: the condition, when, and the first evidence that broke it."""

    condition: str
    at: float
    evidence: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"condition": self.condition, "at": self.at, "first_evidence": self.evidence}


class LiveView:
    def __init__(
        self,
        history: History,
        run_dir: Path,
        metrics: LiveMetrics,
        checks: OnlineChecks,
        conditions: Sequence[StopCondition] = (),
        on_stop: Callable[[Stop], None] | None = None,
        say: Callable[[str], None] = print,
        port: int = 0,
        interval_s: float = 0.5,
    ) -> None:
        self.history = history
        self.run_dir = run_dir
        self.metrics = metrics
        self.checks = checks
        self.conditions = tuple(conditions)
        self.on_stop = on_stop
        self.say = say
        self.port = port
        self.interval_s = interval_s
        self.stopped: Stop | None = None
        self.url: str | None = None
        self._cursor = 0
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None
        self._server: Any = None
        # Set while pulling the lever ends a drill well (the load and its faults under way).
        self.lever_armed = threading.Event()

    def start(self) -> str:
        """Serve the metrics and start reading; returns the metrics URL."""
        self._server, _ = start_http_server(
            self.port, addr="127.0.0.1", registry=self.metrics.registry
        )
        self.url = f"http://127.0.0.1:{self._server.server_port}/metrics"
        (self.run_dir / LIVE_FILE).write_text(
            json.dumps(
                {"metrics_url": self.url, "stop_conditions": [str(c) for c in self.conditions]}
            )
        )
        self._thread = threading.Thread(target=self._loop, name="live-view", daemon=True)
        self._thread.start()
        return self.url

    def step(self, final: bool = False) -> list[LiveViolation]:
        """Read the rows written since the last step; return the violations they revealed."""
        with self._lock:
            rows = self.history.rows_since(self._cursor)
            self._cursor += len(rows)
            self.metrics.feed(rows)
            found = self.checks.feed(rows, now=time.time())
            if final:
                found += self.checks.finish()
            for violation in found:
                self.metrics.violation(violation)
                if self.checks.first.get(violation.check) is violation:
                    self._first_seen(violation)
            self._maybe_stop()
            return found

    def finish(self) -> None:
        """The run's last rows read (its pending judgements made), the server closed."""
        self._halt.set()
        if self._thread is not None:
            self._thread.join(5)
        self.step(final=True)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def _loop(self) -> None:
        while not self._halt.wait(self.interval_s):
            try:
                self.step()
            except Exception as exc:  # the live view must never end the run
                self.say(f"live view: {type(exc).__name__}: {exc}")

    def _first_seen(self, violation: LiveViolation) -> None:
        self.history.append(
            "live",
            reason=violation.check,
            notification_id=violation.evidence.get("notification_id"),
            token=violation.evidence.get("token"),
            tenant_id=violation.evidence.get("tenant_id"),
            detail=json.dumps({"seen": violation.time, "evidence": violation.evidence}),
        )
        self.say(f"LIVE: {violation.describe()}")

    def pull_lever(self) -> bool:
        """A person ends the drill (Ctrl-C during the load): in the background, as a fired stop
        condition does. False when the lever is not armed or the drill is already stopping."""
        if not self.lever_armed.is_set() or self.stopped is not None:
            return False

        def pull() -> None:
            with self._lock:
                if self.stopped is None:
                    self._stop(Stop(SAFETY_LEVER, time.time(), {}), "Ctrl-C again to quit at once")

        threading.Thread(target=pull, name="safety-lever", daemon=True).start()
        return True

    def _maybe_stop(self) -> None:
        if self.stopped is not None or not self.conditions:
            return
        condition = first_fired(self.conditions, self.checks.counts)
        if condition is None:
            return
        first = self.checks.first[condition.check]
        stop = Stop(str(condition), first.time, first.evidence)
        self._stop(stop, f"first evidence: {first.describe()}")

    def _stop(self, stop: Stop, note: str) -> None:
        self.stopped = stop
        self.metrics.stopped.labels(stop.condition).set(1)
        self.history.append("live", reason="stop", detail=json.dumps(stop.to_dict()))
        self.say(f"STOP: {stop.condition} ({note})")
        if self.on_stop is not None:
            self.on_stop(stop)
