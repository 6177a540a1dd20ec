"""Fault-proxy benchmark: what ``python -m chaos.toxiproxy`` costs a Redis client when no toxic
is set, measured against direct Redis in one run (same machine, same moment).

* latency: p50/p99 of sequential redis-py ``PING`` and ``SET k 1 NX EX 2592000``, direct and
  through the proxy, in interleaved blocks (so drift hits both alike); the added p50 is the
  proxy's cost (target: under 1 ms);
* throughput: ops/s direct and proxied with a few concurrent clients, without and with
  pipelining, by ``redis-benchmark`` (a C client, so the client is not the limit); without it,
  redis-py threads.

    .venv/bin/python benchmarks/bench_proxy.py --out reports/bench/proxy.json
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import platform
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis

from chaos.toxiproxy.client import ToxiproxyClient
from emulators.ports import LOOPBACK, free_port
from harness.stack.supervisor import require_redis_server, stop_process, wait_until

ROOT = Path(__file__).resolve().parent.parent
TARGET_ADDED_P50_MS = 1.0
SET_NX_EX = ("SET", "dedup:__rand_int__", "1", "NX", "EX", "2592000")


@contextmanager
def redis_server() -> Iterator[int]:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="bench-proxy-redis-") as workdir:
        proc = subprocess.Popen(
            [
                require_redis_server(),
                "--port", str(port),
                "--bind", LOOPBACK,
                "--save", "",
                "--appendonly", "no",
                "--dir", workdir,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        try:
            probe = redis.Redis(host=LOOPBACK, port=port, socket_timeout=1)

            def up() -> bool:
                try:
                    return bool(probe.ping())
                except redis.RedisError:
                    return False

            wait_until(up, 20, "redis-server to answer PING")
            yield port
        finally:
            stop_process(proc)


@contextmanager
def toxiproxy_server() -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "chaos.toxiproxy", "--host", LOOPBACK, "--port", "0"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 20)
        line = proc.stdout.readline() if ready else ""
        if not line.startswith("toxiproxy listening on "):
            raise RuntimeError(f"toxiproxy did not start: {line!r}")
        yield line.strip().rsplit(" ", 1)[1]
    finally:
        stop_process(proc)  # type: ignore[arg-type]


# -- latency ----------------------------------------------------------------------------------------


def _quantiles(samples_ns: list[int]) -> dict[str, float]:
    ordered = sorted(samples_ns)

    def q(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))] / 1e6

    return {
        "p50_ms": round(q(0.50), 4),
        "p99_ms": round(q(0.99), 4),
        "mean_ms": round(statistics.fmean(ordered) / 1e6, 4),
        "samples": len(ordered),
    }


def measure_latency(
    direct: redis.Redis, proxied: redis.Redis, ops: int, block: int, deadline: float
) -> dict[str, Any]:
    """Sequential round trips, direct and proxied blocks alternating."""
    commands: dict[str, Callable[[redis.Redis, int], object]] = {
        "ping": lambda client, _: client.ping(),
        "set_nx_ex": lambda client, i: client.set(f"dedup:lat:{i}", "1", nx=True, ex=2592000),
    }
    out: dict[str, Any] = {}
    for name, command in commands.items():
        samples: dict[str, list[int]] = {"direct": [], "proxied": []}
        for client in (direct, proxied):  # warm up both paths
            for i in range(200):
                command(client, -i - 1)
        counter = 0
        while len(samples["proxied"]) < ops and time.monotonic() < deadline:
            for label, client in (("direct", direct), ("proxied", proxied)):
                for _ in range(block):
                    counter += 1
                    started = time.perf_counter_ns()
                    command(client, counter)
                    samples[label].append(time.perf_counter_ns() - started)
        direct_q, proxied_q = _quantiles(samples["direct"]), _quantiles(samples["proxied"])
        out[name] = {
            "direct": direct_q,
            "proxied": proxied_q,
            "added_p50_ms": round(proxied_q["p50_ms"] - direct_q["p50_ms"], 4),
            "added_p99_ms": round(proxied_q["p99_ms"] - direct_q["p99_ms"], 4),
        }
    return out


# -- throughput -------------------------------------------------------------------------------------


def redis_benchmark(
    port: int, clients: int, pipeline: int, requests: int, command: tuple[str, ...]
) -> float:
    argv = [
        "redis-benchmark",
        "-h", LOOPBACK,
        "-p", str(port),
        "-c", str(clients),
        "-n", str(requests),
        "-P", str(pipeline),
        "-r", "1000000",
        "--csv",
    ]  # fmt: skip
    argv += ["-t", "ping"] if command == ("PING",) else list(command)
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True)
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    row = next(r for r in rows if r["test"] != "PING_INLINE")  # PING_MBULK, or the custom one
    return float(row["rps"])


def python_throughput(
    port: int, clients: int, pipeline: int, requests: int, command: tuple[str, ...]
) -> float:
    """Fallback without redis-benchmark: redis-py threads (the client is then the limit)."""
    per_client = requests // clients

    def work(worker: int) -> None:
        client = redis.Redis(host=LOOPBACK, port=port)
        done = 0
        while done < per_client:
            pipe = client.pipeline(transaction=False)
            for i in range(pipeline):
                args = [a.replace("__rand_int__", f"{worker}:{done + i}") for a in command]
                pipe.execute_command(*args)
            pipe.execute()
            done += pipeline

    threads = [threading.Thread(target=work, args=(w,)) for w in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return per_client * clients / (time.perf_counter() - started)


def measure_throughput(
    direct_port: int, proxied_port: int, requests: int, deadline: float
) -> tuple[str, list[dict[str, Any]]]:
    tool = "redis-benchmark" if shutil.which("redis-benchmark") else "redis-py threads"
    run = redis_benchmark if tool == "redis-benchmark" else python_throughput
    rows = []
    for command in (("PING",), SET_NX_EX):
        for clients, pipeline in ((4, 1), (4, 16), (50, 1), (50, 16)):
            if time.monotonic() > deadline:
                break
            count = requests * (4 if pipeline > 1 else 1)
            direct = run(direct_port, clients, pipeline, count, command)
            proxied = run(proxied_port, clients, pipeline, count, command)
            rows.append(
                {
                    "command": "PING" if command == ("PING",) else "SET k 1 NX EX 2592000",
                    "clients": clients,
                    "pipeline": pipeline,
                    "requests": count,
                    "direct_ops_s": round(direct),
                    "proxied_ops_s": round(proxied),
                    "proxied_over_direct": round(proxied / direct, 3),
                }
            )
    return tool, rows


# -- report -----------------------------------------------------------------------------------------


def print_table(result: dict[str, Any]) -> None:
    print(f"\nfault proxy vs direct redis ({result['cpu_count']} CPUs, {result['date']})")
    print(f"{'latency':<12}{'direct p50':>12}{'proxy p50':>11}{'added p50':>11}"
          f"{'direct p99':>12}{'proxy p99':>11}")  # fmt: skip
    for name, row in result["latency"].items():
        print(
            f"{name:<12}{row['direct']['p50_ms']:>10.3f}ms{row['proxied']['p50_ms']:>9.3f}ms"
            f"{row['added_p50_ms']:>9.3f}ms{row['direct']['p99_ms']:>10.3f}ms"
            f"{row['proxied']['p99_ms']:>9.3f}ms"
        )
    print(f"\nthroughput ({result['throughput_tool']})")
    print(f"{'command':<24}{'clients':>8}{'pipe':>6}{'direct ops/s':>14}{'proxied ops/s':>15}"
          f"{'ratio':>7}")  # fmt: skip
    for row in result["throughput"]:
        print(
            f"{row['command']:<24}{row['clients']:>8}{row['pipeline']:>6}"
            f"{row['direct_ops_s']:>14,}{row['proxied_ops_s']:>15,}"
            f"{row['proxied_over_direct']:>7.2f}"
        )
    verdict = "met" if result["target_met"] else "NOT met"
    print(f"\nadded p50 target < {TARGET_ADDED_P50_MS} ms: {verdict}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "bench" / "proxy.json")
    parser.add_argument("--ops", type=int, default=5000, help="latency samples per path")
    parser.add_argument("--requests", type=int, default=50000, help="throughput requests/run")
    parser.add_argument("--max-seconds", type=float, default=120, help="stop adding runs after")
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.max_seconds

    with redis_server() as redis_port, toxiproxy_server() as api:
        with ToxiproxyClient(api) as toxiproxy:
            proxy = toxiproxy.create_proxy("redis", f"{LOOPBACK}:{redis_port}")
            direct = redis.Redis(host=LOOPBACK, port=redis_port)
            proxied = redis.Redis(host=proxy.host, port=proxy.port)
            version = direct.info("server")["redis_version"]
            latency = measure_latency(direct, proxied, args.ops, 250, deadline)
            direct.close()
            proxied.close()
            tool, throughput = measure_throughput(redis_port, proxy.port, args.requests, deadline)
            assert toxiproxy.proxy("redis").toxics == ()  # measured with no toxic at all

    added = max(row["added_p50_ms"] for row in latency.values())
    result = {
        "benchmark": "fault proxy (chaos.toxiproxy) vs direct redis-server, no toxics",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "redis_version": version,
        "latency": latency,
        "throughput_tool": tool,
        "throughput": throughput,
        "target_added_p50_ms": TARGET_ADDED_P50_MS,
        "added_p50_ms": added,
        "target_met": added < TARGET_ADDED_P50_MS,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print_table(result)
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
