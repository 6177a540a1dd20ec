"""The harness as a Chaos Toolkit extension: ``chaos run scenarios/smoke.yaml``.

Every shipped scenario is a Chaos Toolkit experiment whose activities call these functions
(``provider: {type: python, module: harness.chaostoolkit, func: ..., arguments: ...}``); their
arguments are the keys of the harness's own step, so ``python -m harness run`` reads the same
file to the same run. How a ``chaos run`` goes:

* the control (:mod:`harness.chaostoolkit.control`, declared under ``controls``) hands the
  experiment over when Chaos Toolkit starts it, and stops whatever is left when it ends;
* the first method step (``load`` or ``locust``) starts ``python -m harness run`` on that same
  experiment in the background: stack, population, load and the whole fault schedule, on the
  offsets the file gives (Chaos Toolkit runs its steps one after another; the harness's faults
  overlap in time, so the schedule stays the harness's);
* each ``fault`` and ``action`` step waits until the run has done it and returns what the run
  recorded (the fault's window, the action's result);
* the steady-state probes (after the method: the files set ``runtime.hypothesis.strategy:
  after-method-only``, since before the method there is nothing to judge) wait for the run's end
  and return each checker's verdict from ``summary.json``: ``{checker, verdict, valid, counts}``,
  which the probe's tolerance (``{type: regex, target: verdict, pattern: ^(pass|off)$}``) judges;
* the rollbacks (``runtime.rollbacks.strategy: always``: also after a failure) report the run's
  own rollbacks, and ``stop`` ends the run if it is still going and returns its summary.

Where the run writes and with which seed: ``HARNESS_OUT`` (default ``reports``), ``HARNESS_SEED``
(default random, recorded), ``HARNESS_NO_REPORT=1`` (junit.xml only), ``HARNESS_TARGET`` (a
target file), or the same names, lower case without the prefix, as the control's arguments.
"""

from __future__ import annotations

from typing import Any

from harness.chaostoolkit.session import SESSION, action_record, fault_window, verdict_output

__all__ = ["action", "fault", "load", "locust", "rollback", "stop", "verdict"]


def load(
    regular_posts: int = 1,
    celebrity_posts: int = 1,
    spread_s: float = 0.0,
    shared_event_ids: bool = False,
    kind: str = "post",
    system_minted_ids: bool = False,
) -> dict[str, Any]:
    """The harness's own load (events of ``kind`` per author): starts the run; returns where it
    runs."""
    return SESSION.current().describe()


def locust(locustfile: str, plan: dict[str, Any] | None = None, workers: int = 0) -> dict[str, Any]:
    """Load from a locustfile and its plan: starts the run; returns where it runs."""
    return SESSION.current().describe()


def fault(
    name: str,
    duration_s: float,
    offset_s: float = 0.0,
    params: dict[str, Any] | None = None,
    provider: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A fault of the schedule (a catalogue name, or ``provider``: a team's function): waits
    until the run has started and stopped it; returns the window the run recorded."""
    run = SESSION.current()
    index = run.fault_index(name, float(offset_s), float(duration_s))
    return run.wait_for(f"a window of fault {name}", lambda h: fault_window(h, name, index))


def action(
    name: str,
    offset_s: float = 0.0,
    params: dict[str, Any] | None = None,
    provider: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A timed action of the method: waits until the run has done it; returns its result."""
    run = SESSION.current()
    index = run.action_index(name, float(offset_s))
    return run.wait_for(f"a record of action {name}", lambda h: action_record(h, name, index))


def verdict(
    name: str, tolerance: Any = None, provider: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A steady-state probe: the verdict the run gave the checker ``name`` (with ``tolerance``,
    its thresholds; or ``provider``, a team's probe), once the run has ended."""
    run = SESSION.run
    if run is None:
        return {
            "checker": name,
            "verdict": "unknown",
            "valid": None,
            "unknown": "no harness run has started: the verdicts exist after the method (run "
            "with --hypothesis-strategy after-method-only, as the shipped files set it)",
        }
    return verdict_output(name, run.finish())


def rollback(
    name: str, params: dict[str, Any] | None = None, provider: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A rollback of the scenario (the run does its rollbacks itself, at its end, before it
    judges): waits for the run's end; returns what the rollback did."""
    run = SESSION.run
    if run is None:
        return {"action": name, "result": "no harness run was started"}
    run.finish()
    frame = run.history()
    found = action_record(frame, f"rollback {name}", 0) if frame is not None else None
    return found or {"action": name, "result": "not done: the run ended before its rollbacks"}


def stop() -> dict[str, Any]:
    """Ends the run if it is still going (an interrupted experiment) and returns its summary:
    the verdict, the run directory and every checker's result."""
    run = SESSION.run
    if run is None:
        return {"verdict": None, "note": "no harness run was started"}
    if run.interrupted or not SESSION.experiment:
        run.stop()
    summary = run.finish()
    return {**summary, "run_dir": str(run.run_dir) if run.run_dir else None}
