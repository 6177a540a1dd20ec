"""The checker registry, after Jepsen's ``checker.clj``: every checker is a value behind one
protocol (a name, its tolerance defaults, and ``probe(evidence, tolerance) -> Verdict``), and a
checker that crashes reports *unknown*, never pass.

Each module in :mod:`harness.checkers` registers itself with :func:`checker`; adding a checker
is one new module (plus its tests). Scenario files name checkers by ``name``; the tolerance
defaults live here once, and the report and the scenario parser read them from the registry.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from harness.checkers.evidence import Evidence
from harness.checkers.verdict import Verdict, switched_off

Probe = Callable[[Evidence, Mapping[str, Any]], Verdict]
# Modules of this package that are helpers, not checkers.
_NOT_CHECKERS = frozenset(
    {
        "audit_personal",
        "duplicate_causes",
        "evidence",
        "keys",
        "registry",
        "store",
        "verdict",
        "windows",
    }
)


@dataclass(frozen=True)
class Checker:
    name: str
    probe: Probe
    tolerances: Mapping[str, Any]
    summary: str
    # What the system must expose for the checker to judge it (e.g. "audit_trail"); a target
    # without one of these gets a "switched off: not available on this target" verdict.
    needs: frozenset[str] = frozenset()
    # With the history on disk (``Evidence.store``): True, the probe queries the store itself;
    # else the history kinds it reads, handed to it as an ordinary frame (``provider``: only the
    # provider rows to devices of the users the run changed; ``expected``: the expected
    # deliveries when the run changed users); None, the whole history read into memory.
    out_of_core: bool = False
    reads: frozenset[str] | None = None


_REGISTRY: dict[str, Checker] = {}
_loaded = False


def checker(
    name: str,
    *,
    summary: str,
    tolerances: Mapping[str, Any] | None = None,
    needs: tuple[str, ...] = (),
    out_of_core: bool = False,
    reads: tuple[str, ...] | None = None,
) -> Callable[[Probe], Probe]:
    """Register ``probe`` under ``name`` (a decorator on the module's probe adapter)."""

    def register(probe: Probe) -> Probe:
        if name in _REGISTRY and _REGISTRY[name].probe is not probe:
            raise ValueError(f"two checkers named {name!r}")
        _REGISTRY[name] = Checker(
            name,
            probe,
            dict(tolerances or {}),
            summary,
            frozenset(needs),
            out_of_core,
            None if reads is None else frozenset(reads),
        )
        return probe

    return register


def _load() -> None:
    global _loaded
    if _loaded:
        return
    import harness.checkers as package

    for module in pkgutil.iter_modules(package.__path__):
        if module.name not in _NOT_CHECKERS and not module.name.startswith("_"):
            importlib.import_module(f"harness.checkers.{module.name}")
    _loaded = True


def known() -> tuple[str, ...]:
    _load()
    return tuple(sorted(_REGISTRY))


def get(name: str) -> Checker:
    _load()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"no checker named {name!r}; known: {', '.join(known())}") from None


def unknown_tolerances(name: str, tolerance: Mapping[str, Any]) -> list[str]:
    """Tolerance keys the checker does not read (a typo would silently change nothing)."""
    return sorted(set(tolerance) - set(get(name).tolerances))


def tolerance_for(name: str, tolerance: Mapping[str, Any]) -> dict[str, Any]:
    """The checker's defaults with the scenario's values over them."""
    return {**get(name).tolerances, **tolerance}


def unknown_verdict(name: str, why: str, **details: Any) -> Verdict:
    return Verdict(name, None, {}, {"unknown": why, **details})


def run_probe(
    name: str,
    tolerance: Mapping[str, Any],
    evidence: Evidence,
    capabilities: frozenset[str] | None = None,
) -> Verdict:
    """The checker's verdict; *unknown* (``valid`` None) when it crashed; *switched off* when
    the system lacks a capability it needs (``capabilities`` None: the system has them all)."""
    spec = get(name)
    missing = spec.needs - capabilities if capabilities is not None else frozenset()
    if missing:
        return switched_off(
            name, f"not available on this target: it has no {', '.join(sorted(missing))}"
        )
    try:
        if capabilities is not None:
            evidence = dataclasses.replace(evidence, capabilities=capabilities)
        verdict = spec.probe(in_memory_for(spec, evidence), tolerance_for(name, tolerance))
    except Exception as exc:  # a crashing checker must never read as a pass
        return unknown_verdict(
            name,
            f"the checker crashed: {type(exc).__name__}: {exc}",
            traceback=traceback.format_exc(),
        )
    return verdict


def with_whole_history(evidence: Evidence) -> Evidence:
    """The evidence with its whole history (and expectation) in memory: as it is when nothing
    is on disk; else read back from the store. Correct, not cheap: for a checker that says
    nothing of what it reads, and a team's probe function, which may read any row."""
    store = evidence.store
    if store is None:
        return evidence
    import pandas as pd

    from harness.model.history import read

    expectation = evidence.expectation
    if store.expected_path is not None:
        expectation = dataclasses.replace(
            expectation, deliveries=pd.read_parquet(store.expected_path)
        )
    return dataclasses.replace(evidence, history=read(store.history_path), expectation=expectation)


def in_memory_for(spec: Checker, evidence: Evidence) -> Evidence:
    """The evidence a checker gets: as it is, unless the history is on disk and the checker
    does not query the store itself; then its history (and, when on disk, its expectation) is
    what it reads, as frames."""
    store = evidence.store
    if store is None or spec.out_of_core:
        return evidence
    import pandas as pd

    expectation = evidence.expectation
    if spec.reads is None:
        return with_whole_history(evidence)
    users: set[tuple[str, str]] = set()
    if evidence.timeline is not None:
        timeline = evidence.timeline
        users = set(timeline.states) | set(timeline.erasures) | set(timeline.registrations)
    tokens: set[str] = set()
    if "provider" in spec.reads:
        tokens = {d.token for key in users for d in evidence.population.devices_of(*key)}
    history = store.rows(spec.reads - {"provider", "expected"}, provider_tokens=tokens)
    if "expected" in spec.reads and store.expected_path is not None and users:
        # The expected deliveries, whole: the checker picks the changed users' (a frame of
        # only theirs would not be the same input: an empty one reads differently).
        deliveries = pd.read_parquet(store.expected_path)
        expectation = dataclasses.replace(expectation, deliveries=deliveries)
    return dataclasses.replace(evidence, history=history, expectation=expectation)
