"""Fake run directories with known content, for the report, compare and duplicates tests.

The synthetic run below is small enough to count by hand; the tests check the reports against
these hand counts, not against the code that produced them.

Timeline (seconds after T0), one tenant, author ``a`` followed by u1..u4, one device each:

* +0.0 inject n1, +1.0 inject n2
* +2.0 .. +4.0 fault window ``apns-accepted-then-error``
* n1: tok1 +1.0, tok2 +1.5, tok3 +2.5 (500, but the device got it), tok3 again +6.0 (200):
  a duplicate after its window closed, collapsed (same collapse id); tok4 +3.0 while u4 is
  still in quiet hours (their window ends at +5.0)
* n2: tok3 +2.2, tok1 +3.0 and +3.5 (no collapse id: a visible duplicate inside the window),
  tok4 +6.0 (after the quiet window), tok2 never (lost)

Hand counts: 8 expected pairs, 7 delivered pairs, 2 duplicates (1 visible, 1 collapsed),
1 lost, 5 exactly once; duplicates per million = 2 / 7 x 1e6 = 285714.3. Latency (deferred
tok4 left out): 1.0, 1.5, 2.5 (n1) and 2.0, 1.2 (n2): p50 = 1.5.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from harness.checkers import effectively_once, quiet_hours
from harness.model.history import History
from harness.model.oracle import expected_deliveries
from harness.model.population import Author, Device, Population, PopulationSpec, User

T0 = 1_800_000_000.0
TENANT = "tenant-0"
TOKENS = {f"u{i}": f"{i}" * 64 for i in range(1, 5)}
FAULT = "apns-accepted-then-error"


def population(quiet_zone: str = "Asia/Kathmandu") -> Population:
    consent = {"granted_at": "2026-01-01T00:00:00+00:00", "version": "2026-01"}
    users = [
        User(TENANT, "a", "UTC", None, consent, "none", None),
        User(TENANT, "u1", "Europe/London", None, consent, "none", None),
        User(TENANT, "u2", "Asia/Kolkata", None, consent, "none", None),
        User(TENANT, "u3", "UTC", None, consent, "none", None),
        User(
            TENANT,
            "u4",
            quiet_zone,
            {"start": "00:00:00", "end": "00:00:05"},
            consent,
            "ends_during_run",
            T0 + 5.0,
        ),
    ]
    devices = [Device(TENANT, u, "apns", token, False) for u, token in TOKENS.items()]
    authors = [Author(TENANT, "a", False, ("u1", "u2", "u3", "u4"))]
    return Population(7, T0, PopulationSpec(), users, devices, authors)


def fault(history: History, t: float, phase: str, name: str = FAULT, window: str = "w1") -> None:
    detail = {"window": window, "fault": name, "phase": phase, "params": {}}
    history.append("fault", time=T0 + t, detail=json.dumps(detail))


def deliver(
    history: History,
    t: float,
    notification: str,
    user: str,
    status: int = 200,
    delivered: bool | None = None,
    collapse: str | None = "same",
    **extra: Any,
) -> None:
    history.append(
        "provider",
        time=T0 + t,
        mono=float("nan"),
        tenant_id=TENANT,
        notification_id=notification,
        token=TOKENS[user],
        provider="apns",
        status=status,
        delivered=(status == 200) if delivered is None else delivered,
        collapse_id=notification if collapse == "same" else collapse,
        **extra,
    )


def synthetic_history() -> History:
    h = History()
    h.append("phase", time=T0 - 1.0, detail="population_loaded")
    h.append("inject", time=T0, tenant_id=TENANT, author_id="a", notification_id="n1")
    h.append("inject", time=T0 + 1.0, tenant_id=TENANT, author_id="a", notification_id="n2")
    deliver(h, 1.0, "n1", "u1")
    deliver(h, 1.5, "n1", "u2")
    fault(h, 2.0, "start")
    deliver(h, 2.2, "n2", "u3")
    deliver(h, 2.5, "n1", "u3", status=500, delivered=True)
    deliver(h, 3.0, "n1", "u4")
    deliver(h, 3.0, "n2", "u1", collapse=None)
    deliver(h, 3.5, "n2", "u1", collapse=None)
    fault(h, 4.0, "stop")
    deliver(h, 6.0, "n1", "u3")
    deliver(h, 6.0, "n2", "u4")
    return h


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    return str(value)


def summary_for(history: History, pop: Population, scenario: str) -> dict[str, Any]:
    """Run the real checkers, as the runner does, so the summary is what a run would write."""
    frame = history.frame()
    expectation = expected_deliveries(pop, frame[frame["kind"] == "inject"])
    verdicts = [
        effectively_once.check(expectation, frame),
        quiet_hours.check(pop, expectation, frame, release_bound_seconds=30.0),
    ]
    return {
        "run_id": f"fake-{scenario}",
        "scenario": scenario,
        "seed": 7,
        "verdict": "pass" if all(v.valid for v in verdicts) else "fail",
        "checkers": {v.name: v.to_dict() for v in verdicts},
        "history_rows": len(history),
        "error": None,
    }


def write_run(
    run_dir: Path,
    history: History,
    summary: dict[str, Any] | None = None,
    pop: Population | None = None,
    scenario: str = "synthetic",
) -> Path:
    """A run directory as the runner writes it: history.parquet, summary.json and (when
    given) population.json."""
    run_dir.mkdir(parents=True, exist_ok=True)
    history.write(run_dir / "history.parquet")
    if pop is not None:
        pop.save(run_dir / "population.json")
    if summary is None:
        summary = summary_for(history, pop or population(), scenario)
    (run_dir / "summary.json").write_text(json.dumps(summary, default=_json_default))
    return run_dir


def synthetic_run(run_dir: Path, scenario: str = "synthetic") -> Path:
    return write_run(run_dir, synthetic_history(), pop=population(), scenario=scenario)
