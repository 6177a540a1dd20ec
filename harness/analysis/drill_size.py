"""How many machines a drill of N push deliveries needs, from whole drills measured here.

``benchmarks/bench_scale.py`` runs the ``celebrity-scale`` drill at growing sizes and writes,
per size, every stack part's CPU seconds, the harness's CPU and peak memory, its history rows
and each phase's wall time (``reports/bench/scale.json``). This module extends those costs to a
drill of any size and divides them by the machines at hand:

* each cost grows along the line through the two largest measured runs (a fixed part and a
  cost per delivery, both read from the measurements); with one run, in proportion. A cost
  whose measured growth is worse than linear (exponent above 1.05) is extended along its power
  law from the largest run instead, which is the larger of the two past it;
* the stack (the reference's workers, the emulators, the provider simulators) must spend its
  CPU within the drain time: its parts' cores are its CPU seconds over the drain, packed on
  machines of ``machine_cores``;
* the harness's side (collection, checkers, report) is one process today: its memory must fit
  one machine, and its collect, judge and report phases run one after the other.

Pure functions over the bench's JSON; ``python -m harness capacity --drill N`` prints it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

# A history of this many rows is judged out of core (harness.checkers.store.OUT_OF_CORE_ROWS;
# not imported: analysis does not depend on the checkers).
OUT_OF_CORE_ROWS = 5_000_000
WORSE_THAN_LINEAR = 1.05
HARNESS_PHASES = ("collect", "judge", "report")


class DrillSizeError(ValueError):
    """The bench file cannot size a drill (no run with deliveries, or a malformed one)."""


@dataclass(frozen=True)
class DrillEstimate:
    deliveries: float
    drain_s: float
    machine_cores: int
    machine_memory_gb: float
    measured_deliveries: list[int]  # the runs the estimate stands on
    stack_cpu_s: float
    stack_cores: float
    stack_machines: int
    part_cores: dict[str, float]  # each stack part's cores over the drain
    harness_cpu_s: float
    harness_peak_memory_gb: float
    harness_fits_one_machine: bool
    harness_phase_seconds: dict[str, float]
    history_rows: float
    history_gb: float
    judged_out_of_core: bool
    machines: int  # stack machines and one for the harness
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def extend(points: Sequence[tuple[float, float]], size: float, exponent: float | None) -> float:
    """The cost at ``size`` from measured (deliveries, cost) points, in growing order of
    deliveries: along the line through the two largest, or in proportion to the one; along the
    power law from the largest when the measured exponent says worse than linear. Never below
    zero, never below the largest measured cost when ``size`` is past it."""
    if not points:
        raise DrillSizeError("no measured run to extend")
    n1, c1 = points[-1]
    if exponent is not None and exponent > WORSE_THAN_LINEAR and n1 > 0:
        return c1 * (size / n1) ** exponent
    if len(points) == 1 or points[-2][0] == n1:
        return c1 * size / n1 if n1 > 0 else c1
    n0, c0 = points[-2]
    slope = max(0.0, (c1 - c0) / (n1 - n0))
    value = c1 + slope * (size - n1)
    return max(value, c1) if size >= n1 else max(0.0, value)


def _runs(bench: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    runs = bench.get("runs")
    if not isinstance(runs, list):
        raise DrillSizeError("the scale bench holds no runs (rerun benchmarks/bench_scale.py)")
    ok = [r for r in runs if isinstance(r, Mapping) and (r.get("deliveries") or 0) > 0]
    if not ok:
        raise DrillSizeError("no run of the scale bench delivered anything: nothing to extend")
    return sorted(ok, key=lambda r: r["deliveries"])


def _exponent(bench: Mapping[str, Any], name: str) -> float | None:
    cost = ((bench.get("growth") or {}).get("costs") or {}).get(name) or {}
    value = cost.get("exponent")
    return float(value) if isinstance(value, int | float) else None


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else 0.0


def estimate_drill(
    bench: Mapping[str, Any],
    deliveries: float,
    drain_s: float = 900.0,
    machine_cores: int = 16,
    machine_memory_gb: float = 64.0,
) -> DrillEstimate:
    """The machines a drill of ``deliveries`` needs to drain within ``drain_s``, on machines of
    ``machine_cores`` cores and ``machine_memory_gb`` GB, from a scale bench's JSON."""
    if not (deliveries > 0 and drain_s > 0 and machine_cores >= 1 and machine_memory_gb > 0):
        raise DrillSizeError(
            "deliveries, the drain time, the machine's cores and memory must all be positive"
        )
    runs = _runs(bench)
    sizes = [float(r["deliveries"]) for r in runs]

    def cost(name: str, value_of: Any) -> float:
        points = list(zip(sizes, [_number(value_of(r)) for r in runs], strict=True))
        return extend(points, deliveries, _exponent(bench, name))

    parts = sorted({p for r in runs for p in (r.get("parts") or {})})
    part_cpu = {
        p: cost(f"part:{p}", lambda r, p=p: ((r.get("parts") or {}).get(p) or {}).get("cpu_s"))
        for p in parts
    }
    stack_cpu = sum(part_cpu.values())
    stack_cores = stack_cpu / drain_s
    rss_mb = cost("harness_peak_rss_mb", lambda r: r.get("harness_peak_rss_mb"))
    rows = cost("history_rows", lambda r: r.get("history_rows"))
    phases = {
        phase: cost(
            f"phase:{phase}", lambda r, phase=phase: (r.get("phase_seconds") or {}).get(phase)
        )
        for phase in HARNESS_PHASES
    }
    memory_gb = rss_mb / 1024
    stack_machines = max(1, math.ceil(stack_cores / machine_cores))
    notes = []
    if memory_gb > machine_memory_gb:
        notes.append(
            f"the harness would need {memory_gb:,.0f} GB, over one machine's "
            f"{machine_memory_gb:g} GB: its history and checkers do not spread over machines "
            "today (past "
            f"{OUT_OF_CORE_ROWS:,} rows the checkers run out of core on DuckDB, but the run "
            "holds its history in memory, as Arrow batches, until it is written)"
        )
    largest = int(sizes[-1])
    if deliveries > 10 * largest:
        notes.append(
            f"extended {deliveries / largest:,.0f} times past the largest measured run "
            f"({largest:,} deliveries): measure a larger size before trusting it"
        )
    return DrillEstimate(
        deliveries=deliveries,
        drain_s=drain_s,
        machine_cores=machine_cores,
        machine_memory_gb=machine_memory_gb,
        measured_deliveries=[int(s) for s in sizes],
        stack_cpu_s=round(stack_cpu, 1),
        stack_cores=round(stack_cores, 2),
        stack_machines=stack_machines,
        part_cores={p: round(c / drain_s, 2) for p, c in part_cpu.items()},
        harness_cpu_s=round(cost("harness_cpu_s", lambda r: r.get("harness_cpu_s")), 1),
        harness_peak_memory_gb=round(memory_gb, 2),
        harness_fits_one_machine=memory_gb <= machine_memory_gb,
        harness_phase_seconds={k: round(v, 1) for k, v in phases.items()},
        history_rows=round(rows),
        history_gb=round(cost("history_bytes", lambda r: r.get("history_bytes")) / 1024**3, 2),
        judged_out_of_core=rows >= OUT_OF_CORE_ROWS,
        machines=stack_machines + 1,
        notes=notes,
    )


def render_markdown(estimate: DrillEstimate) -> str:
    """The estimate as a Markdown section of the capacity report."""
    e = estimate
    measured = ", ".join(f"{n:,}" for n in e.measured_deliveries)
    lines = [
        f"## A drill of {e.deliveries:,.0f} deliveries",
        "",
        f"Extended from whole `celebrity-scale` drills measured at {measured} deliveries "
        "(`benchmarks/bench_scale.py`), to drain within "
        f"{e.drain_s:g} s on machines of {e.machine_cores} cores and {e.machine_memory_gb:g} GB.",
        "",
        "| what | estimate |",
        "|---|---:|",
        f"| stack CPU (workers, emulators, simulators) | {e.stack_cpu_s:,.0f} s |",
        f"| stack cores to drain in time | {e.stack_cores:,.1f} |",
        f"| stack machines | {e.stack_machines} |",
        f"| harness CPU | {e.harness_cpu_s:,.0f} s |",
        f"| harness peak memory | {e.harness_peak_memory_gb:,.1f} GB |",
        f"| history rows | {e.history_rows:,.0f} ({e.history_gb:,.2f} GB Parquet) |",
        f"| judged | {'out of core (DuckDB)' if e.judged_out_of_core else 'in memory'} |",
        *(
            f"| harness {phase} | {seconds:,.0f} s |"
            for phase, seconds in e.harness_phase_seconds.items()
        ),
        f"| machines in all (stack + harness) | {e.machines} |",
        "",
        "| stack part | cores |",
        "|---|---:|",
        *(
            f"| {part} | {cores:,.2f} |"
            for part, cores in sorted(e.part_cores.items(), key=lambda kv: -kv[1])
        ),
    ]
    if e.notes:
        lines += ["", *(f"- {note}" for note in e.notes)]
    return "\n".join(lines) + "\n"
