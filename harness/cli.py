"""``python -m harness``: stack, serve, run, dlq, capacity, report, compare, duplicates.

Exit codes: 0 success / every checker passed; 1 a checker failed, could not decide, or the run
errored; 2 bad input or an unusable machine (unknown scenario, taken port, missing
redis-server); 3 the run was interrupted (SIGINT, SIGTERM) before its verdict.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from emulators.ports import PortInUse, require_free
from emulators.providers.serving import SERVERS as SIM_SERVERS
from emulators.providers.serving import positive_processes
from harness.analysis import capacity
from harness.model import scenarios
from harness.stack.reaper import reap_orphans
from harness.stack.supervisor import (
    PARTS,
    WORKER_PARTS,
    Stack,
    StackError,
    StackInfo,
    stack_file_path,
    status_from_file,
    stop_from_file,
)

if TYPE_CHECKING:
    from harness.stack.target import Target

EXIT_FAIL = 1
EXIT_USAGE = 2


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_USAGE


def cmd_stack(args: argparse.Namespace) -> int:
    path = Path(args.stack_file) if args.stack_file else stack_file_path()
    if args.action == "up":
        if path.exists():
            alive = [p for p, s in status_from_file(path).items() if s.startswith("running")]
            if alive:
                return _error(f"a stack is already up ({path}); run `python -m harness stack down`")
            path.unlink()
        workdir = path.parent / "stack"
        try:
            stack = Stack(
                workdir,
                durable_redis=args.durable_redis,
                stack_file=path,
                sim_processes=args.sim_processes,
                sim_server=args.sim_server,
            )
            info = stack.up()
        except StackError as exc:
            return _error(str(exc))
        # The parts run in their own sessions and outlive this command.
        stack.procs.clear()
        print(f"stack up; stack file {path}")
        for name, part in info.parts.items():
            print(f"  {name:<14} pid {part.pid:<7} {part.url or ''}")
        return 0
    if args.action == "down":
        # What a run killed with -9 left (its watchdog normally reaps it at once).
        orphans = reap_orphans()
        if orphans:
            print(f"stopped what a killed run left: {', '.join(orphans)}")
    if not path.exists():
        if args.action == "down":
            print(f"no stack file at {path}: no detached stack to stop")
            return 0
        print(f"no stack file at {path}: no stack is up")
        return EXIT_FAIL
    if args.action == "down":
        stopped = stop_from_file(path)
        print(f"stopped: {', '.join(stopped) or 'nothing was running'}")
        return 0
    status = status_from_file(path)
    for name, state in status.items():
        print(f"  {name:<14} {state}")
    return 0 if all(s.startswith("running") for s in status.values()) else EXIT_FAIL


def _load_target(path: str) -> Target:
    """The target file, or SystemExit(2) with what is wrong in it."""
    from harness.stack.target import TargetError, load

    try:
        return load(Path(path))
    except TargetError as exc:
        raise SystemExit(_error(str(exc))) from exc


def cmd_env(args: argparse.Namespace) -> int:
    """A team's long-lived environment: up, down, status."""
    from harness.stack import environment

    target = _load_target(args.target)
    if args.action == "up":
        try:
            info = environment.up(target)
        except StackError as exc:
            return _error(str(exc))
        print(f"environment of {target.name} up; {environment.env_file(target)}")
        for line in environment.describe(info, target):
            print(line)
        print("runs with --target use it until `python -m harness env down --target FILE`")
        return 0
    if args.action == "down":
        stopped = environment.down(target)
        print(f"stopped: {', '.join(stopped) or 'nothing was running'}")
        return 0
    states = environment.status(target)
    if not states:
        print(f"the environment of {target.name} is not up")
        return EXIT_FAIL
    for name, state in states.items():
        print(f"  {name:<14} {state}")
    print(f"APNs CA: {environment.ca_file(target)}")
    return 0 if all(s.startswith("running") for s in states.values()) else EXIT_FAIL


def cmd_doctor(args: argparse.Namespace) -> int:
    """Probe a target file's contract before any load; exit 1 when something is off."""
    from harness.run.doctor import run_doctor

    target = _load_target(args.target)
    marks = {"ok": "ok     ", "problem": "PROBLEM", "note": "note   "}
    findings = run_doctor(target, lambda f: print(f"  {marks[f.status]} {f.check:<17} {f.line}"))
    problems = [f for f in findings if f.status == "problem"]
    print(f"{target.name}: {len(problems) or 'no'} problem(s)")
    return EXIT_FAIL if problems else 0


def cmd_serve(args: argparse.Namespace) -> int:
    """Run one part in the foreground (exec: signals go straight to the server)."""
    try:
        require_free(args.port)
    except PortInUse as exc:
        return _error(str(exc))
    workdir = Path(tempfile.mkdtemp(prefix=f"harness-{args.part}-"))
    try:
        stack = Stack(
            workdir, apns_tls=args.tls, sim_processes=args.sim_processes, sim_server=args.sim_server
        )
    except StackError as exc:
        return _error(str(exc))
    stack.kinesis_upstream = args.upstream
    stack.dynamodb_upstream = args.upstream
    if args.part in WORKER_PARTS:
        config = args.config or os.environ.get("FANOUT_CONFIG")
        if not config and stack_file_path().exists():
            config = StackInfo.read(stack_file_path()).reference_config
        if not config:
            return _error(f"{args.part} needs --config FILE (or FANOUT_CONFIG, or a stack up)")
        stack.info.reference_config = str(Path(config).resolve())
    if args.part == "sns" and stack_file_path().exists():
        # Next to a running stack: deliver to its simulators and SQS.
        running = StackInfo.read(stack_file_path())
        stack.info.parts, stack.info.tls_ca = running.parts, running.tls_ca
    try:
        argv = stack.part_argv(args.part, args.port)
    except StackError as exc:
        return _error(str(exc))
    if args.part == "redis":
        print(f"redis (dedup store) on redis://127.0.0.1:{args.port}/0", flush=True)
    os.execvpe(argv[0], argv, {**os.environ, "PYTHONUNBUFFERED": "1"})
    return 0  # not reached


def cmd_run(args: argparse.Namespace) -> int:
    from harness.run.runner import run, verdict_table

    try:
        scenario = scenarios.get(args.scenario)
    except scenarios.ScenarioError as exc:
        return _error(str(exc))
    target = None
    if args.target:
        from harness.stack.target import TargetError, load

        try:
            target = load(Path(args.target))
        except TargetError as exc:
            return _error(str(exc))
    try:
        from harness.stack.supervisor import require_node_emulators, require_redis_server

        if target is None:  # a target brings its own Redis and AWS
            require_redis_server()
            require_node_emulators()
    except StackError as exc:
        return _error(str(exc))
    try:
        from harness.checkers.store import out_of_core_rows

        out_of_core_rows()  # a bad FANOUT_OUT_OF_CORE_ROWS, said now rather than after the run
    except ValueError as exc:
        return _error(str(exc))
    if args.scale is not None:
        if not math.isfinite(args.scale) or args.scale <= 0:
            return _error(f"--scale must be a positive number, not {args.scale!r}")
        try:
            scenario = scenarios.scaled(scenario, args.scale)
        except scenarios.ScenarioError as exc:
            return _error(str(exc))
    if args.push_transport is not None:
        if args.target:
            return _error("--push-transport sets the reference's config: not with --target")
        from dataclasses import replace

        scenario = replace(
            scenario, reference={**scenario.reference, "push_transport": args.push_transport}
        )
    if args.timeout is not None:
        if not math.isfinite(args.timeout) or args.timeout <= 0:
            return _error(f"--timeout must be a positive number of seconds, not {args.timeout!r}")
        from dataclasses import replace

        scenario = replace(scenario, timeout_seconds=args.timeout)
    if args.stop_on:
        from dataclasses import replace

        from harness.live.stop import StopConditionError, parse_stop_condition

        try:
            extra = tuple(parse_stop_condition(text) for text in args.stop_on)
        except StopConditionError as exc:
            return _error(f"--stop-on: {exc}")
        scenario = replace(scenario, stop_conditions=scenario.stop_conditions + extra)
    if args.no_live and scenario.stop_conditions:
        stated = ", ".join(str(c) for c in scenario.stop_conditions)
        return _error(f"--no-live: stop conditions ({stated}) need the live view")
    if not 0 <= args.metrics_port <= 65535:
        return _error(
            f"--metrics-port must be a port number (0: a free one), not {args.metrics_port}"
        )
    problem = _unwritable(Path(args.out))
    if problem:
        return _error(f"--out {args.out}: {problem}")
    if target is not None:
        from harness.stack.target import unreachable

        dead = unreachable(target)
        if dead:
            return _error(f"target {target.name}: {dead}")
    if args.otel:
        from dataclasses import replace

        from harness.load.loadgen import otel_missing

        if scenario.locust is None:
            return _error(f"scenario {scenario.name} has no locust step; --otel needs one")
        missing = otel_missing()
        if missing:
            return _error(f"--otel: {missing}")
        scenario = replace(scenario, locust=replace(scenario.locust, otel=True))
    if args.locust_workers is not None:
        if args.locust_workers < 0:
            return _error("--locust-workers must be 0 or more")
        if scenario.locust is None:
            return _error(
                f"scenario {scenario.name} has no locust step; --locust-workers needs one"
            )
    result = run(
        scenario,
        seed=args.seed,
        out=Path(args.out),
        locust_workers=args.locust_workers,
        target=target,
        reports=not args.no_report,
        metrics_port=args.metrics_port,
        live_view=not args.no_live,
    )
    print(verdict_table(result.summary))
    print(f"run directory: {result.run_dir}")
    report = result.run_dir / "report.html"
    if report.exists():
        print(f"report: {report}")
    return result.exit_code


def _unwritable(out: Path) -> str | None:
    """Why runs cannot be written under ``out``, or None."""
    if out.exists() and not out.is_dir():
        return "is a file, not a directory"
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".write-test-"):
            pass
    except OSError as exc:
        return f"cannot write there ({exc.strerror or exc})"
    return None


def cmd_dlq(args: argparse.Namespace) -> int:
    """Redrive (or count) the dead-letter queues of the stack in the stack file."""
    from harness.run.dlq import queue_urls, redrive
    from harness.stack import reference

    path = Path(args.stack_file) if args.stack_file else stack_file_path()
    try:
        info = StackInfo.read(path)
    except StackError as exc:
        return _error(str(exc))
    queues = reference.contract(info, durable=False).queues
    assert queues is not None
    sqs = info.aws_client("sqs")
    channels = [args.channel] if args.channel else [c for c in queues.work if c in queues.dead]
    for channel in channels:
        source, dlq = queue_urls(sqs, queues, channel)
        if args.action == "redrive":
            print(f"{channel}: moved {redrive(sqs, dlq, source)} message(s) back to {source}")
        else:
            attrs = sqs.get_queue_attributes(
                QueueUrl=dlq, AttributeNames=["ApproximateNumberOfMessages"]
            )["Attributes"]
            print(f"{channel}: {attrs['ApproximateNumberOfMessages']} message(s) in {dlq}")
    return 0


def _sim_arguments(parser: argparse.ArgumentParser) -> None:
    """The APNs and FCM simulators' processes and server (default: HARNESS_SIM_PROCESSES and
    HARNESS_SIM_SERVER, else 1 process of the h2 server)."""
    parser.add_argument(
        "--sim-processes",
        type=positive_processes,
        default=None,
        help="apns, fcm: processes serving each simulator's port",
    )
    parser.add_argument(
        "--sim-server",
        choices=SIM_SERVERS,
        default=None,
        help="apns, fcm: h2 (every fault) or granian (throughput; no goaway fault)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m harness",
        description="Load and chaos verification harness for push-notification fan-out",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    stack = sub.add_parser("stack", help="start, stop or inspect the embedded local stack")
    stack.add_argument("action", choices=["up", "down", "status"])
    stack.add_argument("--stack-file", help="default: .stack/stack.json or $HARNESS_STACK_FILE")
    stack.add_argument(
        "--durable-redis", action="store_true", help="AOF appendfsync always (MemoryDB-like)"
    )
    _sim_arguments(stack)
    stack.set_defaults(func=cmd_stack)

    env = sub.add_parser(
        "env",
        help="a long-lived environment for a team's system: the simulators, endpoints and "
        "proxies its target file places, up across runs",
    )
    env.add_argument("action", choices=["up", "down", "status"])
    env.add_argument("--target", required=True, help="the system's target file (YAML)")
    env.set_defaults(func=cmd_env)
    doctor = sub.add_parser(
        "doctor",
        help="probe a target file before any load: endpoints, queues, driver operations, a "
        "test push's ids and FCM project, its dedup key",
    )
    doctor.add_argument("--target", required=True, help="the system's target file (YAML)")
    doctor.set_defaults(func=cmd_doctor)
    serve = sub.add_parser("serve", help="run one part of the stack in the foreground")
    serve.add_argument("part", choices=PARTS)
    serve.add_argument("--port", type=int, required=False, default=0)
    serve.add_argument("--tls", action="store_true", help="apns: TLS with a generated certificate")
    serve.add_argument("--config", help="reference workers: config JSON")
    _sim_arguments(serve)
    serve.add_argument(
        "--upstream",
        help="kinesis-proxy, dynamodb-proxy: the Kinesis or DynamoDB endpoint URL to forward to",
    )
    serve.set_defaults(func=cmd_serve)

    dlq = sub.add_parser("dlq", help="count or redrive the dead-letter queues of a stack")
    dlq.add_argument("action", choices=["redrive", "depth"])
    dlq.add_argument("--channel", choices=["push", "email", "in_app", "sms", "pages"])
    dlq.add_argument("--stack-file", help="default: .stack/stack.json or $HARNESS_STACK_FILE")
    dlq.set_defaults(func=cmd_dlq)

    run = sub.add_parser("run", help="run a scenario and check its invariants")
    run.add_argument(
        "scenario", help=f"a file, or one of: {', '.join(scenarios.known())} (in scenarios/)"
    )
    run.add_argument("--seed", type=int, help="repeat a run exactly (default: random, recorded)")
    run.add_argument("--out", default="reports", help="parent of the run directory")
    run.add_argument("--timeout", type=float, help="seconds to wait for deliveries")
    run.add_argument(
        "--scale",
        type=float,
        help="grow every count together (users, followers, authors, Locust users) by this factor",
    )
    run.add_argument(
        "--locust-workers",
        type=int,
        help="run the locust step with Locust's master and N local worker processes",
    )
    run.add_argument(
        "--otel",
        action="store_true",
        help="Locust's own OpenTelemetry metrics, traces and logs (locust --otel), exported "
        "where the standard OTEL_* variables say (default OTLP over HTTP to localhost:4318)",
    )
    run.add_argument(
        "--no-live",
        action="store_true",
        help="no live view: no metrics, no online checks, no stop conditions (the comparison "
        "point of their cost; the verdict comes from the final checkers either way)",
    )
    run.add_argument(
        "--target",
        help="a target file (YAML): run against that system instead of the embedded reference",
    )
    run.add_argument(
        "--push-transport",
        choices=["sns", "direct"],
        help="how the reference sends pushes (its push_transport; default: the scenario's, else "
        "the stack's default)",
    )
    run.add_argument(
        "--stop-on",
        action="append",
        metavar="CONDITION",
        help="end the drill when a live count passes a threshold, e.g. 'duplicates > 0' "
        "(repeatable; added to the scenario's configuration.stop_conditions); verdict aborted, "
        "exit code 4",
    )
    run.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="serve the live Prometheus metrics on 127.0.0.1:PORT (default: a free port, printed "
        "and written to the run directory's live.json)",
    )
    run.add_argument(
        "--no-report",
        action="store_true",
        help="write junit.xml only: no charts, report.html or report.md (CI loops)",
    )
    run.set_defaults(func=cmd_run)
    capacity.add_parser(sub)
    # Imported here: `serve` and `stack` need neither pandas nor matplotlib.
    from harness import report
    from harness.analysis import compare, duplicates
    from harness.live import watch

    compare.add_parser(sub)
    duplicates.add_parser(sub)
    watch.add_parser(sub)
    report.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve" and args.part not in WORKER_PARTS[1:]:
        if not args.port:
            return _error(f"serve {args.part} needs --port N")
    return args.func(args)
