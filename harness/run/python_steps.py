"""A scenario's steps and probes as the runner calls them, whether built in or a team's own
Python function (a ``provider``, :mod:`harness.model.python_provider`).

The protocols, one per kind of activity:

* fault: ``func(targets: ChaosTargets, **arguments)`` starts the fault and returns a callable
  that undoes it (or None); the nemesis calls it at the step's offset, calls the undo at the end
  of its duration (and on any rollback), and records the window in the history as a ``fault``
  row named after the step, exactly as for a catalogue fault;
* action: ``func(context: ActionContext, **arguments)``, run at its offset (or at the end, as a
  rollback); what it returns is recorded in the history beside its name;
* probe: ``func(evidence: Evidence, **arguments)`` (and ``tolerance=`` when it declares that
  parameter) returns a ``Verdict``, or a value (bool, number, string, mapping) that the probe's
  ``tolerance`` judges as Chaos Toolkit would (none given: the value must be true). A probe that
  raises reports unknown, as a crashing checker does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from chaos.faults import Fault, make_fault
from harness.checkers import run_probe
from harness.checkers.evidence import Evidence
from harness.checkers.registry import unknown_verdict, with_whole_history
from harness.checkers.verdict import Verdict
from harness.model.scenarios import ActionStep, FaultStep, Probe
from harness.model.tolerance import ToleranceError, within_tolerance
from harness.run.actions import ACTIONS, ActionContext

Action = Callable[[ActionContext, dict[str, Any]], str]


def fault_of(step: FaultStep) -> Fault:
    if step.provider is None:
        return make_fault(step.name, step.params)
    provider = step.provider
    return Fault(
        step.name,
        dict(step.params),
        begin=lambda targets, _params: provider.call(targets),
        origin=provider.label,
    )


def action_of(step: ActionStep) -> Action:
    if step.provider is None:
        return ACTIONS[step.name]
    provider = step.provider
    return lambda context, _params: str(provider.call(context))


def judge(probe: Probe, evidence: Evidence, capabilities: frozenset[str] | None) -> Verdict:
    """The probe's verdict; unknown, never pass, when a team's function raises."""
    if probe.provider is None:
        return run_probe(probe.name, probe.tolerance, evidence, capabilities)
    try:
        output = probe.provider.call(with_whole_history(evidence), tolerance=probe.tolerance)
    except Exception as exc:  # a crashing probe must never read as a pass
        return unknown_verdict(
            probe.name,
            f"{probe.provider.label} raised {type(exc).__name__}: {exc}",
            provider=probe.provider.label,
        )
    if isinstance(output, Verdict) or probe.provider.declares("tolerance"):
        if not isinstance(output, Verdict):
            return unknown_verdict(
                probe.name,
                f"{probe.provider.label} takes the tolerance, so it must return a Verdict, not "
                f"{type(output).__name__}",
                provider=probe.provider.label,
            )
        # numpy's booleans are not ``True``/``False``: the run's verdict tests identity.
        valid = None if output.valid is None else bool(output.valid)
        details = {**output.details, "provider": probe.provider.label}
        return replace(output, name=probe.name, valid=valid, details=details)
    tolerance = True if probe.tolerance is None else probe.tolerance
    try:
        valid = bool(within_tolerance(tolerance, output))
    except ToleranceError as exc:
        return unknown_verdict(probe.name, str(exc), provider=probe.provider.label)
    details = {"provider": probe.provider.label, "value": output, "tolerance": tolerance}
    return Verdict(probe.name, valid, {}, details)
