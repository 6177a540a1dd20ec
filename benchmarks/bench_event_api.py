"""Event API benchmark: accepted events/s of POST /v1/events, measured with wrk from its own
process, against a local DynamoDB (dynalite), Kinesis (kinesalite) and Redis.

    .venv/bin/python benchmarks/bench_event_api.py --out reports/bench/event_api.json
    .venv/bin/python benchmarks/bench_event_api.py --baseline c0e52a9   # before/after, one run
    .venv/bin/python benchmarks/bench_event_api.py --candidates         # uvicorn vs granian

Every variant serves the same config on the same stack and gets the same load: ``--connections``
keep-alive connections from one wrk thread, each request a distinct event (a new object id, one
of 50 authors), a warm-up of ``--warmup`` s, then ``--seconds`` s measured. "Accepted" counts
the 202 answers, and the stream is read back afterwards: each variant posts under its own
tenant, and the records of that tenant in Kinesis must be at least the 202s (a 202 that did not
reach the stream would be a lie the figure must not hide). Each variant's CPU per accepted event
(its own processes, and the DynamoDB, Kinesis and Redis emulators') and its GET /health rate
(the HTTP server and adapter alone) are reported beside it.

``--baseline REF`` exports ``reference_impl/`` of that git commit into a temporary directory and
serves it beside the checkout's, so one run gives the before and the after with the same tool
on the same machine load. ``--candidates`` serves the checkout's ASGI adapter under uvicorn and
under granian (each with its own CLI), the comparison behind the choice of server.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from emulators.ports import LOOPBACK, free_port  # noqa: E402
from harness.stack.supervisor import AWS_KEYS, REGION, Stack, wait_until  # noqa: E402
from reference_impl.aws import new_client  # noqa: E402

# One wrk thread: wrk, the API, dynalite and kinesalite share this machine's cores.
WRK_SCRIPT = r"""
local threads = {}
function setup(thread)
  thread:set("tid", #threads)
  table.insert(threads, thread)
end
function init(args)
  tenant = args[1]
  n = 0
  accepted = 0
  refused = 0
end
function request()
  n = n + 1
  local body = string.format(
    '{"tenant_id":"%s","author_id":"a%d","kind":"like","object_id":"o-%d-%d"}',
    tenant, n % 50, tid, n)
  return wrk.format("POST", "/v1/events", {["Content-Type"] = "application/json"}, body)
end
function response(status, headers, body)
  if status == 202 then accepted = accepted + 1 else refused = refused + 1 end
end
function done(summary, latency, requests)
  local a, r = 0, 0
  for _, t in ipairs(threads) do
    a = a + t:get("accepted")
    r = r + t:get("refused")
  end
  io.write(string.format("RESULT %d %d %d %d %d %d\n", a, r, summary.duration,
    latency:percentile(50), latency:percentile(99), summary.errors.connect
    + summary.errors.read + summary.errors.write + summary.errors.timeout))
end
"""


def _config(stack: Stack, processes: int) -> dict[str, Any]:
    """Only keys every version of the Event API knows (an older Config refuses unknown ones)."""
    full = stack.reference_config()
    return {
        "region": REGION,
        "dynamodb_endpoint": full.dynamodb_endpoint,
        "kinesis_endpoint": full.kinesis_endpoint,
        "sqs_endpoint": full.sqs_endpoint,
        "redis_url": full.redis_url,
        **AWS_KEYS,
        "event_api_host": LOOPBACK,
        "event_api_processes": processes,
    }


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


@contextlib.contextmanager
def _serving(argv: list[str], env: dict[str, str], cwd: Path, log: Path) -> Iterator[int]:
    """Start a server (its own session), wait for /health, stop the whole session after."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        url = f"http://{LOOPBACK}:{_port_of(argv)}"
        wait_until(lambda: _healthy(url) or proc.poll() is not None, 60, f"{argv[:4]} to answer")
        if proc.poll() is not None:
            raise RuntimeError(f"{' '.join(argv)} exited: {log.read_text()[-2000:]}")
        yield proc.pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _port_of(argv: list[str]) -> int:
    return int(argv[argv.index("--port") + 1])


def _session_pids(session: int) -> list[int]:
    """Processes of one session (a server started with start_new_session: all its workers)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[3]) == session:
                    pids.append(int(entry.name))
    return pids


def _cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _wrk(port: int, tenant: str, seconds: float, connections: int, script: Path) -> dict:
    done = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "--timeout", "10s", "--latency"]
        + ["-s", str(script), f"http://{LOOPBACK}:{port}", "--", tenant],
        capture_output=True,
        text=True,
        timeout=seconds + 60,
        check=True,
    )
    match = re.search(r"^RESULT (\d+) (\d+) (\d+) (\d+) (\d+) (\d+)$", done.stdout, re.M)
    if not match:
        raise RuntimeError(f"wrk printed no result: {done.stdout}\n{done.stderr}")
    accepted, refused, micros, p50, p99, errors = (int(g) for g in match.groups())
    return {
        "accepted": accepted,
        "refused": refused,
        "socket_errors": errors,
        "seconds": round(micros / 1e6, 2),
        "accepted_per_s": round(accepted / (micros / 1e6), 1),
        "latency_p50_ms": round(p50 / 1000, 2),
        "latency_p99_ms": round(p99 / 1000, 2),
    }


def _health_rate(port: int, seconds: float, connections: int) -> float:
    """GET /health req/s: the server and adapter alone, no AWS call."""
    done = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", f"http://{LOOPBACK}:{port}/health"],
        capture_output=True,
        text=True,
        timeout=seconds + 60,
        check=True,
    )
    match = re.search(r"Requests/sec:\s+([0-9.]+)", done.stdout)
    if not match:
        raise RuntimeError(f"wrk printed no rate: {done.stdout}\n{done.stderr}")
    return round(float(match.group(1)), 1)


def _stream_count(kinesis: Any, stream: str, tenant: str) -> int:
    """Records of ``tenant`` in the stream (every shard from its start; bounded by the data)."""
    count = 0
    for shard in kinesis.list_shards(StreamName=stream)["Shards"]:
        iterator = kinesis.get_shard_iterator(
            StreamName=stream, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        for _ in range(100_000):  # bounded: each call returns up to 10,000 records
            page = kinesis.get_records(ShardIterator=iterator, Limit=10_000)
            count += sum(json.loads(r["Data"])["tenant_id"] == tenant for r in page["Records"])
            iterator = page.get("NextShardIterator")
            if not page["Records"] or not iterator:
                break
    return count


def _variants(args: argparse.Namespace, tmp: Path) -> list[tuple[str, list[str], Path, Path]]:
    """(name, argv without --port, PYTHONPATH, cwd) of every server to measure."""
    py = sys.executable
    out: list[tuple[str, list[str], Path, Path]] = []
    if args.baseline:
        base = tmp / "baseline"
        base.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", args.baseline, "reference_impl"],
            capture_output=True,
            check=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
        out.append(
            (f"baseline {args.baseline}", [py, "-m", "reference_impl.event_api"], base, base)
        )
    if args.candidates:
        app = "reference_impl.event_api:asgi_app_from_environment"
        out.append(
            (
                "uvicorn (CLI, httptools, uvloop)",
                [py, "-m", "uvicorn", "--factory", app, "--host", LOOPBACK, "--no-access-log"]
                + ["--http", "httptools", "--loop", "uvloop", "--log-level", "warning"],
                ROOT,
                ROOT,
            )
        )
        out.append(
            (
                "granian (CLI, asgi)",
                [
                    str(Path(sys.executable).parent / "granian"),
                    "--interface",
                    "asgi",
                    "--factory",
                    app,
                ]
                + ["--host", LOOPBACK, "--log-level", "warning", "--no-ws"],
                ROOT,
                ROOT,
            )
        )
    if not args.no_current:
        out.append(("this checkout", [py, "-m", "reference_impl.event_api"], ROOT, ROOT))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "reports" / "bench" / "event_api.json"))
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--baseline", help="a git commit whose Event API is measured too")
    parser.add_argument("--candidates", action="store_true", help="uvicorn and granian CLIs")
    parser.add_argument("--no-current", action="store_true", help="skip this checkout's server")
    args = parser.parse_args(argv)
    if not shutil.which("wrk"):
        print("error: wrk is not installed (apt-get install wrk)", file=sys.stderr)
        return 2
    results: dict[str, Any] = {
        "benchmark": "event api",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "load": f"wrk, 1 thread, {args.connections} keep-alive connections, "
        f"{args.warmup:g} s warm-up, {args.seconds:g} s measured, one new event per request",
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "runs": [],
    }
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        script = tmp / "post_events.lua"
        script.write_text(WRK_SCRIPT)
        parts = ["redis", "dynamodb", "kinesis", "sqs"]
        with Stack(tmp / "stack", parts=parts, with_workers=False) as stack:
            kinesis = new_client(
                "kinesis", region_name=REGION, endpoint_url=stack.info.url("kinesis"), **AWS_KEYS
            )
            stream = stack.reference_config().stream_name
            # CPU per accepted event of the API and of the emulators it calls: less sensitive
            # to what else runs on the machine than the rate itself.
            backends = {
                part: _session_pids(stack.info.parts[part].pid)
                for part in ("dynamodb", "kinesis", "redis")
            }
            for n, (name, base_argv, pythonpath, cwd) in enumerate(_variants(args, tmp)):
                for processes in args.processes:
                    config = tmp / f"config-{n}-{processes}.json"
                    config.write_text(json.dumps(_config(stack, processes)))
                    port = free_port()
                    server_argv = list(base_argv)
                    if "reference_impl.event_api" in server_argv:
                        server_argv += ["--config", str(config)]
                    elif "granian" in server_argv[0]:
                        server_argv += ["--workers", str(processes)]
                    else:
                        server_argv += ["--workers", str(processes)] if processes > 1 else []
                    server_argv += ["--port", str(port)]
                    env = {
                        **os.environ,
                        "PYTHONPATH": str(pythonpath),
                        "FANOUT_CONFIG": str(config),
                    }
                    tenant = f"bench{n}p{processes}"
                    print(f"== {name}, {processes} process(es)", flush=True)
                    log = tmp / f"server-{n}-{processes}.log"
                    with _serving(server_argv, env, cwd, log) as session:
                        _wrk(port, f"{tenant}w", args.warmup, args.connections, script)
                        server_pids = _session_pids(session)
                        cpu = {"api": server_pids, **backends}
                        before = {part: _cpu_seconds(pids) for part, pids in cpu.items()}
                        run = _wrk(port, tenant, args.seconds, args.connections, script)
                        for part, pids in cpu.items():
                            used = _cpu_seconds(pids) - before[part]
                            run[f"{part}_cpu_ms_per_accepted"] = round(
                                1000 * used / max(1, run["accepted"]), 3
                            )
                        run["health_req_per_s"] = _health_rate(port, 5, args.connections)
                    run["in_stream"] = _stream_count(kinesis, stream, tenant)
                    run.update({"server": name, "processes": processes})
                    print(json.dumps(run), flush=True)
                    results["runs"].append(run)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")
    lost = [r for r in results["runs"] if r["in_stream"] < r["accepted"]]
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
