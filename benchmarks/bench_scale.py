"""A whole drill at the scale the design is about: the ``celebrity-scale`` scenario (a celebrity
burst with a dedup outage and SQS redelivery mid-burst, a DLQ redrive after, every checker the
burst touches) run at several sizes, each as a user runs it (``python -m harness run
celebrity-scale --scale N``), and how each cost grows with the size.

    .venv/bin/python benchmarks/bench_scale.py --out reports/bench/scale.json
    .venv/bin/python benchmarks/bench_scale.py --sizes 1,10 --out /tmp/scale.json   # a quick look

A unit of ``--scale`` is about a thousand push deliveries: the default sizes 10, 100 and 1,000
are 10,000, 100,000 and 1,000,000. Per size: the wall time of each run phase (the summary's
``phase_seconds``: bring up, load population, inject, await, collect, judge, tear down,
report) and of each checker, the harness process's CPU seconds and peak RSS, each stack part's
CPU seconds and peak RSS (its whole process group, sampled every second from outside: the
parts the run registered with the reaper), history rows and bytes, the report's size, and the
deliveries per second end to end (deliveries over inject + await). Then, per cost, the exponent
of its growth (the least-squares slope of log cost over log deliveries: 1 is linear) and which
phase grows worst.

Each run is its own process, so each size's peak RSS is its own. The machine is shared: the
figures are one run's each; compare the sizes of one session, not sessions.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from stack_cpu import group_usage

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = "celebrity-scale"
OWNED_DIR = ROOT / ".stack" / "owned"
MB = 1024 * 1024
# A defect so rare that only a large run meets it: one delivery in 100,000 sent twice.
RARE_DEFECT = "sent_twice_one_in_100k"
# A cost below this at the largest size is noise, not a growth to rank (seconds, MB).
RANKED_FLOOR = 1.0


def growth(sizes: Sequence[float], costs: Sequence[float]) -> float | None:
    """The exponent ``k`` of ``cost ~ size**k``: the least-squares slope of log cost over log
    size, over the points where both are positive; None with fewer than two such points."""
    points = [
        (math.log(s), math.log(c)) for s, c in zip(sizes, costs, strict=True) if s > 0 and c > 0
    ]
    if len(points) < 2:
        return None
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    if spread == 0:
        return None
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / spread


def growth_class(exponent: float | None) -> str:
    """In words: how a cost with this exponent grows (n log n from 10^4 to 10^6 reads as an
    exponent of about 1.09: ln 10^6 / ln 10^4 = 1.5 over a factor of 100)."""
    if exponent is None:
        return "unknown"
    if exponent < 0.3:
        return "constant"
    if exponent < 0.85:
        return "sublinear"
    if exponent < 1.05:
        return "linear"
    if exponent < 1.25:
        return "n log n"
    return "worse than n log n"


def fit(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per cost (each phase, each checker, the harness's CPU and memory, the stack's CPU and each
    part's, the history's rows and bytes, the report's bytes, the whole wall time): its exponent and its class over the
    runs' deliveries; and the phase that grows worst among those that cost at least
    ``RANKED_FLOOR`` seconds at the largest size."""
    ok = [r for r in runs if r.get("deliveries")]
    sizes = [float(r["deliveries"]) for r in ok]
    series: dict[str, list[float]] = {}

    def add(name: str, value: Any) -> None:
        series.setdefault(name, [])
        series[name].append(float(value) if isinstance(value, int | float) else 0.0)

    for r in ok:
        for phase in sorted({p for run in ok for p in run["phase_seconds"]}):
            add(f"phase:{phase}", r["phase_seconds"].get(phase, 0.0))
        for checker in sorted({c for run in ok for c in run["checker_seconds"]}):
            add(f"checker:{checker}", r["checker_seconds"].get(checker, 0.0))
        add("wall_s", r["wall_s"])
        add("harness_cpu_s", r["harness_cpu_s"])
        add("harness_peak_rss_mb", r["harness_peak_rss_mb"])
        add("stack_cpu_s", sum(p["cpu_s"] for p in r["parts"].values()))
        for part in sorted({p for run in ok for p in run["parts"]}):
            add(f"part:{part}", (r["parts"].get(part) or {}).get("cpu_s", 0.0))
        add("history_rows", r.get("history_rows"))
        add("history_bytes", r["history_bytes"])
        add("report_bytes", r["report_bytes"])
    out: dict[str, Any] = {}
    for name, costs in series.items():
        exponent = growth(sizes, costs)
        out[name] = {
            "exponent": None if exponent is None else round(exponent, 3),
            "grows": growth_class(exponent),
            "at_largest": costs[-1] if costs else None,
        }
    ranked = [
        (v["exponent"], name)
        for name, v in out.items()
        if name.startswith("phase:") and v["exponent"] is not None
        and (v["at_largest"] or 0) >= RANKED_FLOOR
    ]  # fmt: skip
    return {"costs": out, "worst_phase": max(ranked)[1].split(":", 1)[1] if ranked else None}


class PartSampler:
    """Every second, each stack part's CPU seconds and resident memory: the process groups the
    run (the process ``owner``) registered with the reaper, read from outside."""

    def __init__(self, owner: int, interval: float = 1.0) -> None:
        self.owner = owner
        self.interval = interval
        self.cpu: dict[int, float] = {}
        self.peak_rss: dict[int, int] = {}
        self.names: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="part-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _groups(self) -> dict[int, str]:
        groups: dict[int, str] = {}
        for path in OWNED_DIR.glob(f"{self.owner}-*.json"):
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                continue  # being replaced: next time
            groups.update({int(g["pid"]): str(g["name"]) for g in record.get("groups", [])})
        return groups

    def sample(self) -> None:
        groups = self._groups()
        self.names.update(groups)
        for pgid, (cpu, rss) in group_usage(list(groups)).items():
            if rss:  # a group with no live process left keeps its last reading
                self.cpu[pgid] = max(self.cpu.get(pgid, 0.0), cpu)
                self.peak_rss[pgid] = max(self.peak_rss.get(pgid, 0), rss)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def parts(self) -> dict[str, dict[str, float]]:
        """Per part name (a part restarted counts once, its groups summed): CPU seconds and the
        peak resident MB of its largest group."""
        out: dict[str, dict[str, float]] = {}
        for pgid, name in self.names.items():
            part = out.setdefault(name, {"cpu_s": 0.0, "peak_rss_mb": 0.0})
            part["cpu_s"] = round(part["cpu_s"] + self.cpu.get(pgid, 0.0), 2)
            rss_mb = round(self.peak_rss.get(pgid, 0) / MB, 1)
            part["peak_rss_mb"] = max(part["peak_rss_mb"], rss_mb)
        return out


def _bytes(paths: Sequence[Path]) -> int:
    return sum(p.stat().st_size for p in paths if p.is_file())


def planted(out: Path, defect: str) -> Path:
    """The scenario with ``defect`` planted in the reference (a file in ``out``, named as the
    scenario so that its run directory is found the same way)."""
    data = yaml.safe_load((ROOT / "scenarios" / f"{SCENARIO}.yaml").read_text())
    configuration = data.setdefault("configuration", {})
    configuration.setdefault("reference", {})["defects"] = [defect]
    path = out / "planted" / f"{SCENARIO}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    return path


def run_size(scale: float, seed: int, out: Path, defect: str | None = None) -> dict[str, Any]:
    """One run of the scenario at ``scale`` (with ``defect`` planted in the reference), as a
    user runs it, and its figures."""
    out.mkdir(parents=True, exist_ok=True)
    scenario = SCENARIO if defect is None else str(planted(out, defect))
    argv = [
        sys.executable, "-m", "harness", "run", scenario, "--scale", str(scale),
        "--seed", str(seed), "--out", str(out),
    ]  # fmt: skip
    started = time.monotonic()
    log = out / f"run-{scale:g}.log"
    with log.open("w") as stream:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=stream, stderr=subprocess.STDOUT)
        sampler = PartSampler(proc.pid)
        sampler.start()
        try:
            # The scenario's own timeout grows with the scale (3 s a unit); the margin covers
            # the population, the collection, the checkers and the report.
            code = proc.wait(timeout=1800 + 10 * scale)
        except subprocess.TimeoutExpired:
            proc.terminate()
            code = proc.wait(60)
        finally:
            sampler.stop()
    wall = time.monotonic() - started
    dirs = sorted(p for p in out.iterdir() if p.is_dir() and SCENARIO in p.name)
    if not dirs:
        return {"scale": scale, "exit_code": code, "error": f"no run directory (see {log})"}
    run_dir = dirs[-1]
    summary = json.loads((run_dir / "summary.json").read_text())
    once = summary["checkers"].get("effectively_once", {})
    deliveries = int(once.get("delivered") or 0)
    phases = summary.get("phase_seconds", {})
    busy = phases.get("inject", 0.0) + phases.get("await", 0.0)
    report = [run_dir / "report.html", run_dir / "report.md", *(run_dir / "charts").glob("*")]
    return {
        "scale": scale,
        "defect": defect,
        "exit_code": code,
        "verdict": summary["verdict"],
        "checkers": {k: v.get("valid") for k, v in summary["checkers"].items()},
        "deliveries": deliveries,
        "expected": once.get("expected"),
        "duplicates_per_million": once.get("duplicates_per_million"),
        "deliveries_per_s": round(deliveries / busy, 1) if busy else None,
        "wall_s": round(wall, 1),
        "phase_seconds": phases,
        "checker_seconds": summary.get("checker_seconds", {}),
        "harness_cpu_s": summary.get("harness_cpu_s"),
        "harness_peak_rss_mb": summary.get("harness_peak_rss_mb"),
        "phase_peak_rss_mb": summary.get("phase_peak_rss_mb", {}),
        "checker_peak_rss_mb": summary.get("checker_peak_rss_mb", {}),
        "parts": sampler.parts(),
        "effectively_once": {k: v for k, v in once.items() if not isinstance(v, dict | list)},
        "history_rows": summary.get("history_rows"),
        "history_bytes": _bytes([run_dir / "history.parquet"]),
        "report_bytes": _bytes(report),
        "error": summary.get("error"),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "bench" / "scale.json")
    parser.add_argument(
        "--sizes", default="10,100,1000", help="--scale values, comma separated (a unit: ~1,000)"
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--keep", type=Path, help="keep the run directories here")
    parser.add_argument(
        "--defect",
        default=RARE_DEFECT,
        help=f"at the largest size, a second run with this defect planted, which must be caught "
        f"(default {RARE_DEFECT}: does the verdict drown in scale?); 'none' for no such run",
    )
    args = parser.parse_args(argv)
    try:
        sizes = [float(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--sizes must be numbers separated by commas, not {args.sizes!r}")
    if not sizes or any(not math.isfinite(s) or s <= 0 for s in sizes):
        parser.error(f"--sizes must be positive numbers, not {args.sizes!r}")
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        where = args.keep or Path(tmp)
        for scale in sorted(sizes):
            print(f"== celebrity-scale --scale {scale:g}", flush=True)
            figures = run_size(scale, args.seed, where / f"scale-{scale:g}")
            runs.append(figures)
            print(json.dumps({k: figures.get(k) for k in (
                "scale", "verdict", "deliveries", "deliveries_per_s", "wall_s",
                "harness_cpu_s", "harness_peak_rss_mb")}), flush=True)  # fmt: skip
        planted_run = None
        if args.defect != "none":
            largest = max(sizes)
            print(f"== celebrity-scale --scale {largest:g}, {args.defect} planted", flush=True)
            planted_run = run_size(
                largest, args.seed, where / f"scale-{largest:g}-{args.defect}", args.defect
            )
            print(json.dumps(caught(planted_run)), flush=True)
    result = {
        "scenario": SCENARIO,
        "seed": args.seed,
        "cpus": os.cpu_count(),
        "runs": runs,
        "growth": fit(runs),
        "planted": None if planted_run is None else {**planted_run, **caught(planted_run)},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result["growth"], indent=2))
    clean = all(r.get("verdict") == "pass" for r in runs)
    return 0 if clean and (planted_run is None or result["planted"]["caught"]) else 1


def caught(run: Mapping[str, Any]) -> dict[str, Any]:
    """Whether a planted run was caught: failed, with effectively_once among the failures."""
    checkers = run.get("checkers") or {}
    return {
        "defect": run.get("defect"),
        "scale": run.get("scale"),
        "caught": run.get("verdict") == "fail" and checkers.get("effectively_once") is False,
        "failed": sorted(k for k, v in checkers.items() if v is False),
        "effectively_once": run.get("effectively_once"),
    }


if __name__ == "__main__":
    sys.exit(main())
