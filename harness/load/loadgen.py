"""Drive a locustfile through Locust's library API (Environment and runner).

``python -m harness.load.loadgen --locustfile celebrity_burst --host URL ...`` (a shape of
``locustfiles/fanout.py``, or a path to a locustfile of your own) runs
the same locustfile a user runs with plain ``locust -f``, locally or as Locust's master with N
worker processes (Locust's own distributed mode). It runs in its own process because importing
Locust monkey-patches the interpreter with gevent; the harness's runner stays a plain process.

It writes into ``--out``: ``injected.jsonl`` (the oracle's input), Locust's CSV stats and stats
history (``locust_stats.csv``, ``locust_stats_history.csv``, ...), ``locust_report.html`` and
``locust_summary.json``. Exit codes: 0 the plan ran to its end (or ``--stop-file`` appeared); 1 it was cut short (timeout, a
worker that never connected); 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harness.load.record import INJECTED_FILE, merge_worker_files

ROOT = Path(__file__).resolve().parents[2]
LOCUSTFILES = ROOT / "locustfiles"


LOCUSTFILE = LOCUSTFILES / "fanout.py"


def locustfile_for(name: str) -> tuple[Path, str | None]:
    """The locustfile to run and the shape it runs: a shape name (``game_day``) is the one
    locustfile with that shape; a path to a .py file is that file, its shape from its plan."""
    from harness.model.shapes import SHAPES

    path = Path(name)
    if path.suffix == ".py" and path.exists():
        return path.resolve(), None
    shape = name.replace("-", "_")
    if shape in SHAPES:
        return LOCUSTFILE, shape
    raise SystemExit(f"error: no locustfile or shape {name!r}; shapes: {', '.join(SHAPES)}")


def otel_missing() -> str | None:
    """What ``--otel`` lacks on this machine (Locust's instrumentation needs OpenTelemetry's
    SDK and an OTLP exporter), or None."""
    try:
        import opentelemetry.exporter.otlp.proto.http  # noqa: F401
        import opentelemetry.sdk  # noqa: F401
    except ImportError:
        return (
            "OpenTelemetry's SDK and OTLP/HTTP exporter are not installed: "
            "pip install 'fanout-harness[otel]' (or 'locust[otel]')"
        )
    return None


def _otel_environment() -> None:
    """Locust's default OTLP protocol is gRPC; the ``otel`` extra installs the HTTP exporter
    (gRPC's is a native wheel few need), so HTTP unless the user chose."""
    os.environ.setdefault("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")


def _harness_args(args: argparse.Namespace) -> list[str]:
    return [
        "--harness-population", str(args.population),
        "--harness-plan", args.plan,
        "--harness-out", str(args.out),
        "--harness-seed", str(args.seed),
        "--harness-driver", args.driver,
        "--harness-driver-options", args.driver_options,
    ]  # fmt: skip


def _start_workers(args: argparse.Namespace, path: Path, port: int) -> list[subprocess.Popen]:
    """Locust's own worker processes, exactly as on another machine (``locust --worker``)."""
    logs = args.out / "locust-workers.log"
    procs = []
    with open(logs, "ab") as log:
        for _ in range(args.workers):
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "locust",
                        "-f",
                        str(path),
                        "--worker",
                        "--master-host",
                        "127.0.0.1",
                        "--master-port",
                        str(port),
                        "--host",
                        args.host,
                        *(["--otel"] if args.otel else []),
                        *_harness_args(args),
                    ],  # fmt: skip
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    cwd=ROOT,
                )
            )
    return procs


def _stop_workers(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _accepted(out: Path) -> int:
    """Events the system accepted so far (the ``ok`` rows of injected.jsonl)."""
    try:
        with open(out / INJECTED_FILE, "rb") as f:
            return sum(1 for line in f if b'"op": "ok"' in line or b'"op"' not in line)
    except FileNotFoundError:
        return 0


def run(args: argparse.Namespace) -> int:
    import gevent
    from locust import events
    from locust.argument_parser import get_parser
    from locust.env import Environment
    from locust.html import get_html_report
    from locust.stats import PERCENTILES_TO_REPORT, StatsCSVFileWriter, stats_history
    from locust.util.load_locustfile import load_locustfile

    from emulators.ports import free_port

    path, shape = locustfile_for(args.locustfile)
    if shape is not None:
        args.plan = json.dumps({**json.loads(args.plan), "shape": shape})
    args.out.mkdir(parents=True, exist_ok=True)
    if args.otel:
        _otel_environment()  # the workers inherit it
    user_classes, shapes = load_locustfile(str(path))
    if not shapes:
        print(f"error: {path} defines no LoadTestShape", file=sys.stderr)
        return 2
    # Locust's own parser, with the locustfile's --harness-* options, as `locust -f` builds it.
    options = get_parser().parse_args(
        ["-f", str(path), "--headless", "--host", args.host, *_harness_args(args)]
    )
    env = Environment(
        user_classes=list(user_classes.values()),
        shape_class=shapes[0],
        events=events,
        host=args.host,
        parsed_options=options,
    )
    port = free_port()
    runner = (
        env.create_master_runner("127.0.0.1", port) if args.workers else env.create_local_runner()
    )
    from harness.load.users import context

    workers: list[subprocess.Popen] = []
    csv_writer = None
    outcome = "complete"
    load_started_at = None
    started = time.monotonic()
    try:
        if args.workers:
            workers = _start_workers(args, path, port)
        if args.otel:
            from locust.opentelemetry import setup_opentelemetry

            # After the workers' fork: OpenTelemetry's at-fork hooks restart its export
            # threads in a forked child, which under gevent then never reaches its exec.
            setup_opentelemetry(str(path), None)  # what `locust --otel` does in its main
        events.init.fire(environment=env, runner=runner, web_ui=None)
        plan = context().plan
        gevent.spawn(stats_history, runner)
        csv_writer = StatsCSVFileWriter(
            env, PERCENTILES_TO_REPORT, str(args.out / "locust"), full_history=True
        )
        gevent.spawn(csv_writer.stats_writer)
        if args.workers:
            deadline = time.monotonic() + 60
            while runner.worker_count < args.workers:
                if time.monotonic() > deadline or any(w.poll() is not None for w in workers):
                    print(
                        f"error: {runner.worker_count}/{args.workers} Locust workers connected; "
                        f"see {args.out / 'locust-workers.log'}",
                        file=sys.stderr,
                    )
                    return 1
                gevent.sleep(0.1)
        if args.start_at is not None:
            # The plan's offsets count from an instant the harness fixed beforehand (the system
            # clock's midnight is placed at_s into the load): Locust's own start-up, seconds on
            # a loaded machine, must not move the load against it.
            late = time.time() - args.start_at
            if late > 0:
                print(f"locust: ready {late:.1f} s after the load's start instant", flush=True)
            gevent.sleep(max(0.0, -late))
        # The harness starts its fault schedule on this line: offsets count from the load.
        print(
            f"locust: started {path.name} (shape {plan.shape}, {args.workers or 'no'} worker(s))",
            flush=True,
        )
        runner.start_shape()
        load_started_at = time.time()
        deadline = time.monotonic() + args.timeout
        last = 0.0
        # Headless, the runner quits itself when the shape ends (killing its greenlet group).
        while len(runner.greenlet) and runner.state != "stopped":
            now = time.monotonic()
            if now > deadline:
                outcome = "timeout"
                break
            if args.stop_file is not None and args.stop_file.exists():
                outcome = "stopped"  # the harness's stop condition fired
                break
            if now - last >= args.progress_s:
                last = now
                total = runner.stats.total
                print(
                    f"locust: {now - started:5.1f}s users={runner.user_count} "
                    f"requests={total.num_requests} failures={total.num_failures} "
                    f"rps={total.current_rps:.0f} "
                    f"injected={_accepted(args.out)}",
                    flush=True,
                )
            gevent.sleep(0.2)
    finally:
        runner.quit()
        _stop_workers(workers)
        # Rows a worker wrote but could not relay before it stopped.
        merge_worker_files(args.out)
        if csv_writer is not None:
            csv_writer.close_files()
    (args.out / "locust_report.html").write_text(get_html_report(env, show_download_link=False))
    total = runner.stats.total
    summary: dict[str, Any] = {
        "locustfile": str(path),
        "plan": json.loads(plan.to_json()),
        "workers": args.workers,
        "outcome": outcome,
        "load_started_at": load_started_at,
        "elapsed_s": round(time.monotonic() - started, 3),
        "requests": total.num_requests,
        "failures": total.num_failures,
        "injected": _accepted(args.out),
        "by_name": {
            e.name: {
                "requests": e.num_requests,
                "failures": e.num_failures,
                "p50_ms": e.get_response_time_percentile(0.5),
                "p99_ms": e.get_response_time_percentile(0.99),
            }
            for e in runner.stats.entries.values()
        },
    }
    # A user whose task raised did not send the load the plan asked for (Locust logs the
    # exception and goes on): the run's verdict would judge a load that never happened.
    summary["exceptions"] = [
        {"count": e["count"], "msg": e["msg"], "traceback": e["traceback"]}
        for e in runner.exceptions.values()
    ]
    (args.out / "locust_summary.json").write_text(json.dumps(summary, indent=2))
    print(
        f"locust: {outcome}: {summary['injected']} events injected, "
        f"{summary['requests']} requests, {summary['failures']} failures",
        flush=True,
    )
    for e in summary["exceptions"]:
        print(f"locust: error: a user raised {e['msg']} ({e['count']}x)", flush=True)
    if summary["exceptions"]:
        return 1
    return 0 if outcome in ("complete", "stopped") else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m harness.load.loadgen", description=__doc__)
    parser.add_argument("--locustfile", required=True, help="a path, or a shape name")
    parser.add_argument("--host", required=True, help="the Event/Inbox API base URL")
    parser.add_argument("--population", type=Path, required=True)
    parser.add_argument(
        "--plan", default="{}", help="load plan JSON (harness.model.shapes.LoadPlan)"
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=1, help="seeds the users' choices")
    parser.add_argument("--workers", type=int, default=0, help="Locust worker processes")
    parser.add_argument("--driver", default="", help="the system's driver, package.module:Class")
    parser.add_argument("--driver-options", default="{}", help="the driver's options, JSON")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument(
        "--stop-file",
        type=Path,
        help="stop the load (exit 0, outcome 'stopped') when this file appears",
    )
    parser.add_argument("--progress-s", type=float, default=5.0)
    parser.add_argument(
        "--otel",
        action="store_true",
        help="Locust's OpenTelemetry instrumentation (locust --otel) in the master and workers",
    )
    parser.add_argument(
        "--start-at",
        type=float,
        help="start the load at this instant (Unix seconds), not as soon as Locust is ready",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.workers < 0:
        print("error: --workers must not be negative", file=sys.stderr)
        return 2
    if args.otel and (missing := otel_missing()):
        print(f"error: --otel: {missing}", file=sys.stderr)
        return 2
    if not args.population.exists():
        print(f"error: no population file {args.population}", file=sys.stderr)
        return 2
    from harness.model.shapes import SHAPES, LoadPlan, PlanError

    try:
        plan = json.loads(args.plan)
        shape = Path(args.locustfile).stem.replace("-", "_")
        if shape in SHAPES:
            LoadPlan.from_mapping({**plan, "shape": shape})
        else:
            LoadPlan.from_mapping(plan)
    except (PlanError, json.JSONDecodeError) as exc:
        print(f"error: bad load plan: {exc}", file=sys.stderr)
        return 2
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
