"""The harness run behind a Chaos Toolkit experiment: ``python -m harness run`` on the same
experiment, in a process of its own, which the extension's activities start, watch and stop.

Why a process and not a thread: the run is exactly what ``python -m harness run`` does (same
phases, same ``summary.json``, same handling of SIGTERM: faults undone, every part stopped,
verdict ``incomplete``), and Chaos Toolkit's own signal handling stays its own.

What the activities read is the run's history as it streams to disk (``history.arrows``, then
``history.parquet``) and its ``summary.json``: the same files a user reads.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import pandas as pd
import yaml

from harness.checkers.verdict import result_status
from harness.model import history as history_mod
from harness.model.history import STREAM_FILE
from harness.model.scenarios import Scenario, parse

ROOT = Path(__file__).resolve().parents[2]
logger = logging.getLogger("chaostoolkit")
T = TypeVar("T")
# Beyond the scenario's own timeout: the stack's start, Locust's plan, the collection and the
# reports (a smoke run takes ~30 s in all, game-day ~2 min).
MARGIN_S = 600.0
POLL_S = 1.0
STOP_WAIT_S = 60.0
# From the process's start to its run directory (imports, reaping what a killed run left).
STARTUP_S = 120.0


class RunFailed(RuntimeError):
    """The background run cannot give what an activity waits for."""


class Interrupted(RuntimeError):
    """The experiment was interrupted; the run was stopped."""


# Chaos Toolkit's SIGUSR1 exit: "stop the experiment now, play the rollbacks".
LEAVE_NOW = 20


def interrupted_while_waiting(run: BackgroundRun, exc: BaseException) -> None:
    """Stop the run, then let the interruption end the experiment: Chaos Toolkit's python
    provider turns any Exception (its own InterruptExecution from SIGTERM too) into one failed
    activity and goes on with the next, so an Exception becomes its SystemExit(20), which ends
    the experiment as interrupted and still plays the rollbacks."""
    run.interrupt()
    if isinstance(exc, Exception):
        raise SystemExit(LEAVE_NOW) from exc


# -- reading a history (pure) -----------------------------------------------------------------


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat()


def fault_window(history: pd.DataFrame, name: str, index: int) -> dict[str, Any] | None:
    """The ``index``-th window (in start order) of the fault named ``name``, once closed."""
    rows = history[history["kind"] == "fault"]
    starts: list[tuple[str, float, dict[str, Any]]] = []
    stops: dict[str, float] = {}
    for row in rows.itertuples(index=False):
        detail = json.loads(row.detail)
        if detail.get("fault") != name:
            continue
        if detail["phase"] == "start":
            starts.append((detail["window"], float(row.time), detail))
        else:
            stops[detail["window"]] = float(row.time)
    if index >= len(starts) or starts[index][0] not in stops:
        return None
    window, start, detail = starts[index]
    stop = stops[window]
    found = {
        "fault": name,
        "window": window,
        "params": detail.get("params", {}),
        "start": _iso(start),
        "stop": _iso(stop),
        "duration_s": round(stop - start, 3),
    }
    if "origin" in detail:
        found["origin"] = detail["origin"]
    return found


def action_record(history: pd.DataFrame, label: str, index: int) -> dict[str, Any] | None:
    """The ``index``-th record of an action (``label``: its name, or ``rollback <name>``)."""
    rows = history[history["kind"] == "action"]
    found = [r for r in rows.itertuples(index=False) if str(r.detail).startswith(f"{label}: ")]
    if index >= len(found):
        return None
    row = found[index]
    return {"action": label, "at": _iso(float(row.time)), "result": row.detail[len(label) + 2 :]}


def verdict_output(name: str, summary: dict[str, Any]) -> dict[str, Any]:
    """A steady-state probe's output: the checker's name, its verdict (pass, fail, unknown, off:
    what the shipped tolerance judges), valid and its counts, as ``summary.json`` says."""
    result = summary.get("checkers", {}).get(name)
    if result is None:
        why = summary.get("error") or "the run judged no probe of that name"
        return {"checker": name, "verdict": "unknown", "valid": None, "unknown": why}
    return {"checker": name, "verdict": result_status(result), **result}


def _rank(items: list[T], wanted: Callable[[T], bool], same: Callable[[T], bool]) -> int:
    """Position of the first item ``wanted`` among the items ``same`` in start order (the
    nemesis starts faults in offset order, ties in file order)."""
    group = [i for i in items if same(i)]
    for position, item in enumerate(group):
        if wanted(item):
            return position
    raise RunFailed("this step is not in the experiment the run was started with")


# -- the run ----------------------------------------------------------------------------------


class BackgroundRun:
    def __init__(
        self,
        experiment: dict[str, Any],
        out: Path,
        seed: int | None = None,
        reports: bool = True,
        target: str | None = None,
    ) -> None:
        # What Chaos Toolkit loaded, as plain data (it may add keys of its own, e.g. ``dry``).
        self.experiment = json.loads(json.dumps(experiment, default=str))
        self.scenario: Scenario = parse(self.experiment, "chaostoolkit")
        self.out = Path(out).resolve()
        self.seed = seed if seed is not None else random.SystemRandom().randrange(2**31)
        self.reports = reports
        self.target = target
        self.proc: subprocess.Popen[str] | None = None
        self.interrupted = False
        self._workdir = Path(tempfile.mkdtemp(prefix="harness-ctk-"))
        self._before: set[str] = set()
        self._run_dir: Path | None = None
        self._lines: list[str] = []
        self._reader: threading.Thread | None = None
        self._claimed: set[tuple[str, int]] = set()
        self._summary: dict[str, Any] | None = None
        self.deadline = 0.0

    # -- starting ----------------------------------------------------------------------------

    def start(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        self._before = {p.name for p in self.out.iterdir()}
        path = self._workdir / "experiment.yaml"
        path.write_text(yaml.safe_dump(self.experiment, sort_keys=False))
        argv = [
            sys.executable, "-m", "harness", "run", str(path),
            "--seed", str(self.seed), "--out", str(self.out),
        ]  # fmt: skip
        if not self.reports:
            argv.append("--no-report")
        if self.target:
            argv += ["--target", self.target]
        # Chaos Toolkit's working directory and PYTHONPATH: a team's modules and relative paths
        # mean the same to the run; the harness itself is importable wherever it is run from.
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        # Its own session: Chaos Toolkit's signals are Chaos Toolkit's; the run is stopped by
        # ``stop`` (SIGTERM, as ``python -m harness run`` expects), never left behind.
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
            env=env,
        )
        plan = self.scenario.locust.plan if self.scenario.locust is not None else {}
        load_s = float(plan.get("duration_s", 0)) + self.scenario.load.spread_s
        self.deadline = time.monotonic() + self.scenario.timeout_seconds + load_s + MARGIN_S
        self._reader = threading.Thread(target=self._read, name="harness-run-output", daemon=True)
        self._reader.start()
        logger.info(
            f"harness: started {' '.join(argv[1:4])} (seed {self.seed}, pid {self.proc.pid})"
        )

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:  # bounded: ends when the run exits
            self._lines.append(line)
            logger.info(f"harness: {line.rstrip()}")

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def describe(self) -> dict[str, Any]:
        """Where the run goes, once it has made its directory (or ended without one)."""
        try:
            deadline = time.monotonic() + STARTUP_S
            while self.run_dir is None and self.alive and time.monotonic() < deadline:
                time.sleep(POLL_S / 4)
        except BaseException as exc:
            interrupted_while_waiting(self, exc)
            raise
        return {
            "scenario": self.scenario.name,
            "seed": self.seed,
            "pid": self.proc.pid if self.proc is not None else None,
            "run_dir": str(self.run_dir) if self.run_dir is not None else None,
        }

    @property
    def run_dir(self) -> Path | None:
        """The run's directory once the run made it (a new ``*-<scenario>-s<seed>`` under out)."""
        if self._run_dir is None and self.out.exists():
            suffix = f"-{self.scenario.name}-s{self.seed}"
            new = [
                p for p in self.out.iterdir()
                if p.is_dir() and p.name.endswith(suffix) and p.name not in self._before
            ]  # fmt: skip
            if new:
                self._run_dir = new[0]
                shutil.copy(self._workdir / "experiment.yaml", new[0] / "experiment.yaml")
        return self._run_dir

    # -- waiting -----------------------------------------------------------------------------

    def history(self) -> pd.DataFrame | None:
        run_dir = self.run_dir
        if run_dir is None:
            return None
        final, stream = run_dir / "history.parquet", run_dir / STREAM_FILE
        try:
            if final.exists() and not self.alive:
                return history_mod.read(final)
            if stream.exists():
                return history_mod.read_partial(stream)
        except (OSError, ValueError):
            return None  # mid-rename; the next poll reads it
        return None

    def wait_for(self, what: str, found: Callable[[pd.DataFrame], T | None]) -> T:
        """Poll the history until ``found`` returns something, the run ends without it (then
        RunFailed), or the deadline; an interruption stops the run and raises again."""
        try:
            while True:
                ended = not self.alive
                frame = self.history()
                result = found(frame) if frame is not None else None
                if result is not None:
                    return result
                if ended:
                    summary = self.summary()
                    raise RunFailed(
                        f"the run ended without {what} (verdict {summary.get('verdict')}, "
                        f"error {summary.get('error')}); run directory {self.run_dir}"
                    )
                if time.monotonic() > self.deadline:
                    self.stop()
                    raise RunFailed(f"no {what} before the deadline; the run was stopped")
                time.sleep(POLL_S)
        except RunFailed:
            raise
        except BaseException as exc:
            interrupted_while_waiting(self, exc)
            raise

    def finish(self) -> dict[str, Any]:
        """Wait for the run's end (bounded) and return its summary."""
        try:
            while self.alive:
                if time.monotonic() > self.deadline:
                    self.stop()
                    break
                time.sleep(POLL_S)
        except BaseException as exc:
            interrupted_while_waiting(self, exc)
            raise
        return self.summary()

    def summary(self) -> dict[str, Any]:
        if self._summary is not None:
            return self._summary
        run_dir = self.run_dir
        path = run_dir / "summary.json" if run_dir is not None else None
        summary: dict[str, Any] = {"verdict": "incomplete", "checkers": {}}
        if path is not None and path.exists():
            summary = json.loads(path.read_text())
        elif not self.alive:
            tail = "".join(self._lines[-15:])
            summary["error"] = f"the run left no summary; its last output:\n{tail}"
        if not self.alive:
            self._summary = summary
            self._close()
        return summary

    def claim(self, kind: str, index: int) -> int:
        """The first unclaimed occurrence at or after ``index`` (two identical steps)."""
        while (kind, index) in self._claimed:
            index += 1
        self._claimed.add((kind, index))
        return index

    def fault_index(self, name: str, offset_s: float, duration_s: float) -> int:
        faults = sorted(self.scenario.faults, key=lambda f: f.offset_s)
        index = _rank(
            faults,
            lambda f: f.offset_s == offset_s and f.duration_s == duration_s,
            lambda f: f.name == name,
        )
        return self.claim(f"fault {name}", index)

    def action_index(self, name: str, offset_s: float) -> int:
        actions = sorted(self.scenario.actions, key=lambda a: a.offset_s)
        index = _rank(actions, lambda a: a.offset_s == offset_s, lambda a: a.name == name)
        return self.claim(f"action {name}", index)

    # -- stopping ----------------------------------------------------------------------------

    def interrupt(self) -> None:
        """The experiment is being interrupted: stop the run now."""
        self.interrupted = True
        self.stop()

    def stop(self) -> None:
        """SIGTERM (the run undoes its faults and stops its stack within seconds), then, if it
        is still there after a minute, SIGKILL (the next run's reaper takes what it left)."""
        if self.proc is None or self.proc.poll() is not None:
            self._close()
            return
        logger.warning(f"harness: stopping the run (pid {self.proc.pid})")
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        except ProcessLookupError:
            pass
        self._close()

    def _close(self) -> None:
        if self._reader is not None and self.proc is not None and self.proc.poll() is not None:
            self._reader.join(5)
        run_dir = self._run_dir
        if run_dir is not None and self._lines and not (run_dir / "harness.log").exists():
            if self.proc is not None and self.proc.poll() is not None:
                (run_dir / "harness.log").write_text("".join(self._lines))
        if self.proc is not None and self.proc.poll() is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)


# -- the experiment's run (one per Chaos Toolkit process) --------------------------------------

CONTROL_HINT = (
    "declare the harness's control in the experiment: controls: [{name: fanout-harness, "
    "provider: {type: python, module: harness.chaostoolkit.control}}]"
)


class Session:
    """What the control configured, and the run the first method step started."""

    def __init__(self) -> None:
        self.experiment: dict[str, Any] | None = None
        self.options: dict[str, Any] = {}
        self.run: BackgroundRun | None = None
        self._lock = threading.Lock()

    def configure(self, experiment: dict[str, Any], **options: Any) -> None:
        with self._lock:
            self.experiment = experiment
            self.options = options
            self.run = None

    def current(self) -> BackgroundRun:
        """The run, started by the first step that asks."""
        with self._lock:
            if self.run is None:
                if self.experiment is None:
                    raise RunFailed(f"no experiment: {CONTROL_HINT}")
                self.run = BackgroundRun(self.experiment, **self.options)
                self.run.start()
            if self.run.interrupted:
                raise Interrupted("the experiment was interrupted; the run was stopped")
            return self.run

    def cleanup(self) -> None:
        with self._lock:
            if self.run is not None:
                self.run.stop()
                self.run.summary()
            self.experiment, self.run = None, None


SESSION = Session()
