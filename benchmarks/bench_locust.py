"""Locust load benchmark: injected events/s per Locust core, end-to-end push deliveries/s during
a celebrity burst of 100,000+ deliveries, and the provider simulators' capacity measured in the
same run, so the report can say which part limited the burst.

    .venv/bin/python benchmarks/bench_locust.py --out reports/bench/locust.json
    .venv/bin/python benchmarks/bench_locust.py --deliveries 10000   # a quicker look
    .venv/bin/python benchmarks/bench_locust.py --deliveries 20000 --burst-only --baseline none \
        --profile /tmp/profiles                                      # py-spy, every Python part

The burst reports CPU-ms per delivery for the push consumer and for the whole stack (every part,
emulators included, each with its process group), counted from the first event to the last
delivery, and a 10 s timeline of deliveries/s and each part's cores. ``--baseline COMMIT``
(default: the reference before its CPU work) first runs the same burst on that commit's code,
exported with ``git archive``, in the same session: the JSON's ``before``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
from bench_foundation import bench_apns_simulator
from stack_cpu import CpuTimeline, Profiles, cpu_between, group_cpu_seconds, timeline_rows

from harness.load.loader import load_population
from harness.model.population import PopulationSpec, generate
from harness.model.scenarios import LocustLoad, Probe, Scenario
from harness.run.runner import Progress, read_injected, run
from harness.stack import supervisor
from harness.stack.supervisor import Stack

ROOT = Path(__file__).resolve().parent.parent
# The reference before this benchmark's CPU work (today's main when it began): --baseline's
# default, so `make bench` measures the before and the after in one session.
BASELINE = "642fd3d"
# The burst's consumer fleet (Lambda's concurrency): 2 worker processes of 4 pollers, twice the
# stack's default pollers (which the consumer-crash scenario's bounds are counted in). The
# baseline runs with its own defaults: one process of 4 threads, all one core let it use.
BURST_FLEET = {"push_consumer_processes": 2, "consumer_threads": 4}
# --baseline runs this script on an older checkout's harness: what it lacks, its own defaults.
STOP_GRACE_SECONDS = getattr(supervisor, "STOP_GRACE_SECONDS", 5.0)
# The Python parts py-spy records with --profile.
PROFILED_PARTS = (
    "push-consumer", "fanout-worker", "event-api", "sqs", "dynamodb-proxy", "kinesis-proxy",
    "apns", "fcm", "toxiproxy", "aws",
)  # fmt: skip


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _proc_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


class MeteredStack(Stack):
    """A stack whose parts' CPU is sampled every second (each part with its whole process
    group: a part that forks workers counts them) and read once more just before each part
    stops; ``profile_dir``: py-spy records the Python parts from the moment they are up."""

    profile_dir: Path | None = None

    def up(self) -> Any:
        self.cpu_seconds: dict[str, float] = {}
        self.profile_summary: dict[str, object] = {}
        self.profiles: Profiles | None = None
        self.timeline = CpuTimeline(self._groups)
        info = super().up()
        self.timeline.sample()
        self.timeline.start()
        if self.profile_dir is not None:
            self.profiles = Profiles(self.profile_dir)
            pids = {p: proc.pid for p, proc in self.procs.items() if p in PROFILED_PARTS}
            # The verifier too: it shares the machine's cores with the stack.
            self.profiles.start({**pids, "harness": os.getpid()}, alone=["harness"])
        return info

    def _groups(self) -> dict[str, int]:
        return {part: proc.pid for part, proc in list(self.procs.items())}

    def _meter(self, parts: list[str]) -> None:
        groups = {p: self.procs[p].pid for p in parts if p in self.procs}
        cpu = group_cpu_seconds(list(groups.values()))
        for part, pgid in groups.items():
            self.cpu_seconds.setdefault(part, cpu[pgid])

    def stop_parts(self, parts, grace: float = STOP_GRACE_SECONDS) -> list[str]:  # noqa: ANN001
        # Stack's signature and answer: the runner reads which parts had to be killed.
        self._stop_profiles()
        self._meter(list(parts))
        return super().stop_parts(parts, grace) or []  # an older Stack answers None

    def down(self, hurry: bool = False) -> None:
        self._stop_profiles()
        if hasattr(self, "timeline"):
            self.timeline.stop()
            self._meter(list(self.procs))
        super().down(hurry=hurry)

    def _stop_profiles(self) -> None:
        if self.profiles is not None and self.profiles.procs:
            self.profile_summary = self.profiles.stop()


class WarmKeysStack(MeteredStack):
    """A metered stack whose audit keys already exist for every user of ``users`` when the run
    starts: the steady state of a system whose users were notified before (the first
    notification to a user creates their key, a conditional put; see reference_impl/audit_keys)."""

    users: list[tuple[str, str]] = []

    def up(self) -> Any:
        info = super().up()
        from reference_impl.audit_keys import AuditKeys
        from reference_impl.aws import client

        config = self.reference_config()
        keys = AuditKeys(client(config, "dynamodb"), config.table("audit_keys"))
        keys.create_many(self.users)
        return info


def bench_injection(seconds: float, users: int, workers: int) -> dict[str, float]:
    """Authors only, as fast as the Event API answers: events per CPU-second of Locust."""
    with tempfile.TemporaryDirectory() as tmp, Stack(Path(tmp) / "stack") as stack:
        population = generate(3, datetime.now(UTC), PopulationSpec(users_per_tenant=200))
        population.save(Path(tmp) / "population.json")
        api = stack.info.url("event-api")
        load_population(api, population)
        api_pid = stack.info.parts["event-api"].pid
        api_cpu_before = _proc_cpu_seconds(api_pid)
        plan = {
            "duration_s": seconds,
            "background_users": users,
            "author_rate": 1000.0,
            "weights": {"Author": 1},
        }
        cpu_before = _children_cpu_seconds()
        started = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "harness.load.loadgen",
                "--locustfile",
                "steady_state",
                "--host",
                api,
                "--population",
                str(Path(tmp) / "population.json"),
                "--plan",
                json.dumps(plan),
                "--out",
                str(Path(tmp) / "out"),
                "--workers",
                str(workers),
            ],  # fmt: skip
            cwd=ROOT,
            check=True,
            timeout=seconds + 180,
        )
        wall = time.perf_counter() - started
        locust_cpu = _children_cpu_seconds() - cpu_before
        api_cpu = _proc_cpu_seconds(api_pid) - api_cpu_before
        summary = json.loads((Path(tmp) / "out" / "locust_summary.json").read_text())
        injected = len(read_injected(Path(tmp) / "out" / "injected.jsonl"))
    load_seconds = float(seconds)
    return {
        "locust_workers": workers,
        "locust_users": users,
        "injected_events": injected,
        "injected_events_per_s": round(injected / load_seconds, 1),
        "locust_cpu_seconds": round(locust_cpu, 2),
        "injected_events_per_locust_cpu_second": round(injected / locust_cpu, 1),
        "event_api_cpu_seconds": round(api_cpu, 2),
        "event_api_cpu_share_of_load": round(api_cpu / load_seconds, 2),
        "locust_failures": summary["failures"],
        "wall_seconds_incl_startup": round(wall, 1),
    }


def bench_burst(
    deliveries: int,
    seed: int,
    warm_keys: bool = False,
    profile_dir: Path | None = None,
    reference: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One celebrity post per tenant to enough followers for ``deliveries`` push deliveries.
    ``warm_keys``: every user's audit key made before the run (not by the burst's fan-out);
    ``profile_dir``: py-spy profiles of the Python parts go there; ``reference``: config
    overrides for the reference."""
    tenants = 2
    devices_per_user = 1.3  # PopulationSpec.second_device_fraction 0.3
    followers = int(deliveries / (tenants * devices_per_user)) + 1
    spec = PopulationSpec(
        tenants=tenants,
        users_per_tenant=followers + 20,
        celebrity_followers=followers,
        regular_authors=1,
        regular_followers=5,
        no_consent_fraction=0.0,
        dead_token_fraction=0.0,
        no_device_fraction=0.0,
        quiet_whole_run_fraction=0.0,
        quiet_ends_fraction=0.0,
    )
    scenario = Scenario(
        name="bench-burst",
        description="a celebrity burst, no faults, no quiet hours",
        population=spec,
        locust=LocustLoad(
            "celebrity_burst",
            {
                "duration_s": 8,
                "background_users": 1,
                "celebrities": tenants,
                "burst_at_s": 1,
                "burst_window_s": 2,
                "weights": {"InboxReader": 1},
            },
        ),  # fmt: skip
        probes=(Probe("effectively_once"),),
        # The seed's page size: the stack's default of 20 would walk ~2,000 pages per burst.
        reference={"follower_page_size": 1000, "pages_per_walk": 10, **(reference or {})},
        timeout_seconds=3600,
    )
    stacks: list[MeteredStack] = []

    def metered(workdir: Path) -> MeteredStack:
        kind = WarmKeysStack if warm_keys else MeteredStack
        stack = kind(workdir, reference_overrides=scenario.reference)
        stack.profile_dir = profile_dir
        stacks.append(stack)
        return stack

    if warm_keys:  # the run generates the same users from the same seed and spec
        population = generate(seed, datetime.now(UTC), spec)
        WarmKeysStack.users = [(u.tenant_id, u.user_id) for u in population.users]

    with tempfile.TemporaryDirectory() as out:
        result = run(
            scenario,
            seed=seed,
            out=Path(out),
            progress=Progress(lambda s: print(s, flush=True)),
            stack_factory=metered,
        )
        history = pd.read_parquet(result.run_dir / "history.parquet")
        phases = history[history["kind"] == "phase"]
    if "effectively_once" not in result.summary.get("checkers", {}):
        raise RuntimeError(f"the burst run failed: {result.summary.get('error')}")
    once = result.summary["checkers"]["effectively_once"]
    injected = history[history["kind"] == "inject"]["time"]
    provider = history[history["kind"] == "provider"]
    delivered = provider[provider["delivered"].fillna(False).astype(bool)]["time"]
    first, last = float(injected.min()), float(delivered.max())
    span = last - first
    loaded = phases["time"].iloc[1] - phases["time"].iloc[0]
    per_second = delivered.astype(int).value_counts()
    stack = stacks[0]
    samples = stack.timeline.samples
    window = cpu_between(samples, first, last)
    parts = {p: v for p, v in window.items() if p != "harness"}
    count = int(once["delivered"]) or 1
    consumer = parts.get("push-consumer", 0.0)
    whole = sum(parts.values())
    return {
        "burst_expected_deliveries": once["expected"],
        "burst_delivered": once["delivered"],
        "burst_duplicated": once["duplicated"],
        "burst_lost": once["lost"],
        "burst_population_users": tenants * spec.users_per_tenant,
        "burst_population_load_seconds": round(float(loaded), 1),
        "burst_seconds_first_event_to_last_delivery": round(span, 1),
        "burst_deliveries_per_s": round(once["delivered"] / span, 1) if span > 0 else 0.0,
        "burst_peak_deliveries_in_one_second": int(per_second.max()) if len(per_second) else 0,
        "burst_verdict": result.summary["verdict"],
        "burst_audit_keys_made_before": warm_keys,
        # From the first event to the last delivery: the CPU the burst cost, per part (each
        # part's whole process group), per delivery.
        "burst_cpu_ms_per_delivery": {
            "push-consumer": round(1000 * consumer / count, 3),
            "whole stack": round(1000 * whole / count, 3),
            "harness (the verifier, not the stack)": round(
                1000 * window.get("harness", 0.0) / count, 3
            ),
        },
        "burst_window_cpu_seconds": {p: round(v, 1) for p, v in sorted(parts.items())},
        "burst_window_cores_busy": round(whole / span, 2) if span > 0 else 0.0,
        # The whole run's CPU (start, population load, burst), per part of the system.
        "burst_cpu_seconds": {
            part: round(seconds, 1) for part, seconds in sorted(stack.cpu_seconds.items())
        },
        # Deliveries/s and each part's cores in 10 s steps: where a falling rate goes.
        "burst_timeline": timeline_rows(samples, list(delivered), first),
        **({"burst_profiles": stack.profile_summary} if profile_dir is not None else {}),
    }


def bench_tree(tree: Path, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """The burst of this script run on another checkout's code (``tree``: its harness,
    reference and emulators, e.g. a baseline commit exported by :func:`export_commit`), in a
    child process: the before of a before/after measured with the same tool and load."""
    argv = [
        # The baseline's own fleet: its config may not know this one's keys.
        sys.executable, str(Path(__file__).resolve()), "--burst-only", "--baseline", "none",
        "--reference", "{}",
        "--deliveries", str(args.deliveries), "--seed", str(args.seed), "--out", str(out),
    ]  # fmt: skip
    if args.warm_audit_keys:
        argv.append("--warm-audit-keys")
    env = {
        **os.environ,
        "PYTHONPATH": str(tree),
        "FANOUT_NODE_MODULES": str(ROOT / "node_modules"),
    }
    subprocess.run(argv, cwd=tree, env=env, check=True, timeout=4 * 3600)
    return json.loads(out.read_text())


def export_commit(commit: str, into: Path) -> Path:
    """``commit``'s tracked files in ``into`` (git archive), its node_modules this checkout's."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit], capture_output=True, check=True
    ).stdout
    into.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    (into / "node_modules").unlink(missing_ok=True)
    (into / "node_modules").symlink_to(ROOT / "node_modules")
    return into


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "reports" / "bench" / "locust.json"))
    parser.add_argument("--deliveries", type=int, default=100_000)
    parser.add_argument("--inject-seconds", type=float, default=20)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--burst-only",
        action="store_true",
        help="only the celebrity burst and the simulators' capacity (no injection runs)",
    )
    parser.add_argument(
        "--baseline",
        default=BASELINE,
        help="a git commit whose burst is measured first, in the same session ('none': skip)",
    )
    parser.add_argument("--profile", help="py-spy profiles of the Python parts into this folder")
    parser.add_argument(
        "--reference",
        default=json.dumps(BURST_FLEET),
        help="config overrides for the burst's reference (JSON; default: %(default)s)",
    )
    parser.add_argument(
        "--warm-audit-keys",
        action="store_true",
        help="make every user's audit key before the burst (a population notified before)",
    )
    args = parser.parse_args(argv)
    try:
        overrides = json.loads(args.reference)
    except json.JSONDecodeError as exc:
        parser.error(f"--reference is not JSON: {exc}")
    if not isinstance(overrides, dict):
        parser.error("--reference must be a JSON object of config keys")
    results: dict[str, object] = {
        "benchmark": "locust",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "seed": args.seed,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.baseline != "none":
        print(f"== celebrity burst on the baseline {args.baseline}", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            tree = export_commit(args.baseline, Path(tmp) / "tree")
            before = bench_tree(tree, args, Path(tmp) / "before.json")
        results["before"] = {"commit": args.baseline, **before}
    print(f"== celebrity burst, {args.deliveries:,} deliveries", flush=True)
    profile = Path(args.profile) if args.profile else None
    if overrides:
        results["burst_reference_overrides"] = overrides
    results.update(
        bench_burst(args.deliveries, args.seed, args.warm_audit_keys, profile, overrides)
    )
    print("== provider simulators", flush=True)
    results.update(bench_apns_simulator(20_000))
    if args.burst_only:
        out.write_text(json.dumps(results, indent=2))
        print(json.dumps(results, indent=2))
        return 0
    for workers in (0, 2):
        print(f"== injection, {workers} Locust worker(s)", flush=True)
        results[f"injection_workers_{workers}"] = bench_injection(args.inject_seconds, 20, workers)
    limits = {
        "apns simulator (h2 client)": results["apns_simulator_h2_req_per_s"],
        "consumer http client (per thread)": results["httpx_h2c_sequential_req_per_s"],
        "end-to-end burst": results["burst_deliveries_per_s"],
    }
    results["limits_per_s"] = limits
    results["limited_by"] = (
        "the provider simulators"
        if results["burst_deliveries_per_s"] >= 0.8 * results["apns_simulator_h2_req_per_s"]
        else "the system under test (the simulators had headroom)"
    )
    out.write_text(json.dumps(results, indent=2))
    for name, value in limits.items():
        print(f"{name:<36} {value:>10,.0f} /s")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
