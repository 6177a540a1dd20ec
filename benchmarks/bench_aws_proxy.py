"""Benchmark: what the AWS fault proxy (emulators/aws_proxy) costs in front of kinesalite.

Run: ``.venv/bin/python benchmarks/bench_aws_proxy.py --out reports/bench/aws_proxy.json``

kinesalite and the proxy run as subprocesses, no fault active; boto3 drives them from this
process. Measured:

* p50 and p95 latency of PutRecord and GetRecords (Limit 100 on a shard of a few hundred
  records), direct and through the proxy, the calls interleaved so both paths see the same
  machine load; the added p50 per operation;
* PutRecord per second from ``--threads`` threads, direct and through the proxy, and the
  proxy process's CPU per forwarded request over that phase (from /proc);
* the upstream client choice: CPU per request of an aiohttp and an httpx AsyncClient, 20
  requests in flight, straight to kinesalite (the proxy uses aiohttp).

Every loop is bounded in count and in time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import boto3
import httpx
from botocore.config import Config

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from emulators.ports import LOOPBACK, free_port  # noqa: E402
from harness.stack.supervisor import NODE_EMULATOR, stop_process, wait_until  # noqa: E402

STREAM = "bench"


def client(url: str) -> Any:
    return boto3.client(
        "kinesis",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="bench",
        aws_secret_access_key="bench",
        config=Config(retries={"total_max_attempts": 1}, max_pool_connections=32),
    )


@contextmanager
def process(argv: list[str], ready: Callable[[], bool], what: str) -> Iterator[int]:
    proc = subprocess.Popen(
        argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        wait_until(lambda: proc.poll() is not None or ready(), 30, what)
        if proc.poll() is not None:
            raise RuntimeError(f"{what}: exited with code {proc.returncode}")
        yield proc.pid
    finally:
        stop_process(proc)


def answers(call: Callable[[], Any]) -> bool:
    try:
        call()
        return True
    except Exception:
        return False


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def latency(direct: Any, proxied: Any, samples: int, budget_s: float) -> dict[str, Any]:
    iterators = {
        name: c.get_shard_iterator(
            StreamName=STREAM, ShardId="shardId-000000000000", ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        for name, c in (("direct", direct), ("proxy", proxied))
    }
    times: dict[str, dict[str, list[float]]] = {
        op: {"direct": [], "proxy": []} for op in ("PutRecord", "GetRecords")
    }
    deadline = time.perf_counter() + budget_s
    for i in range(samples):
        if i >= 10 and time.perf_counter() > deadline:
            break
        for name, c in (("direct", direct), ("proxy", proxied)):
            began = time.perf_counter()
            c.put_record(StreamName=STREAM, Data=b"x" * 200, PartitionKey=f"k{i}")
            times["PutRecord"][name].append((time.perf_counter() - began) * 1000)
            began = time.perf_counter()
            c.get_records(ShardIterator=iterators[name], Limit=100)
            times["GetRecords"][name].append((time.perf_counter() - began) * 1000)
    out: dict[str, Any] = {}
    for op, paths in times.items():
        row: dict[str, Any] = {}
        for name, values in paths.items():
            values.sort()
            row[f"{name}_p50_ms"] = round(statistics.median(values), 3)
            row[f"{name}_p95_ms"] = round(values[int(len(values) * 0.95) - 1], 3)
        row["added_p50_ms"] = round(row["proxy_p50_ms"] - row["direct_p50_ms"], 3)
        row["samples"] = len(paths["direct"])
        out[op] = row
    return out


def put_rate(c: Any, threads: int, seconds: float) -> dict[str, Any]:
    counts = [0] * threads
    stop = threading.Event()

    def work(n: int) -> None:
        for i in range(1_000_000):  # bounded; the stop event ends it first
            if stop.is_set():
                return
            c.put_record(StreamName=STREAM, Data=b"x" * 200, PartitionKey=f"t{n}-{i}")
            counts[n] += 1

    workers = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
    began = time.perf_counter()
    for w in workers:
        w.start()
    time.sleep(seconds)  # a fixed measuring window, not a wait for a condition
    stop.set()
    for w in workers:
        w.join(30)
    elapsed = time.perf_counter() - began
    return {"records": sum(counts), "per_s": round(sum(counts) / elapsed, 1)}


async def _client_cpu(kind: str, url: str, requests: int) -> float:
    headers = {
        "content-type": "application/x-amz-json-1.1",
        "x-amz-target": "Kinesis_20131202.ListStreams",
    }
    if kind == "aiohttp":
        async with aiohttp.ClientSession(auto_decompress=False) as session:

            async def one() -> None:
                async with session.post(url, data=b"{}", headers=headers) as r:
                    await r.read()

            await one()
            began = time.process_time()
            for _ in range(requests // 20):
                await asyncio.gather(*[one() for _ in range(20)])
            return (time.process_time() - began) / requests
    async with httpx.AsyncClient() as session:

        async def one_httpx() -> None:
            (await session.post(url, content=b"{}", headers=headers)).read()

        await one_httpx()
        began = time.process_time()
        for _ in range(requests // 20):
            await asyncio.gather(*[one_httpx() for _ in range(20)])
        return (time.process_time() - began) / requests


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "bench" / "aws_proxy.json")
    parser.add_argument("--samples", type=int, default=1000, help="latency samples per path")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=5.0, help="each throughput phase")
    parser.add_argument("--client-requests", type=int, default=2000)
    args = parser.parse_args(argv)
    node = shutil.which("node")
    if node is None:
        print("node is not installed: run `make setup`", file=sys.stderr)
        return 2
    kinesalite_port, proxy_port = free_port(), free_port()
    kinesalite_url = f"http://{LOOPBACK}:{kinesalite_port}"
    proxy_url = f"http://{LOOPBACK}:{proxy_port}"
    direct, proxied = client(kinesalite_url), client(proxy_url)
    kinesalite_argv = [node, str(NODE_EMULATOR), "kinesalite", "--port", str(kinesalite_port)]
    proxy_argv = [sys.executable, "-m", "emulators.aws_proxy", "--upstream", kinesalite_url,
                  "--port", str(proxy_port)]  # fmt: skip
    with (
        process(kinesalite_argv, lambda: answers(direct.list_streams), "kinesalite"),
        process(proxy_argv, lambda: answers(proxied.list_streams), "the aws proxy") as proxy_pid,
    ):
        direct.create_stream(StreamName=STREAM, ShardCount=1)
        wait_until(
            lambda: (
                direct.describe_stream(StreamName=STREAM)["StreamDescription"]["StreamStatus"]
                == "ACTIVE"
            ),
            30,
            "the stream",
        )
        lat = latency(direct, proxied, args.samples, 120)
        rate_direct = put_rate(direct, args.threads, args.seconds)
        before = cpu_seconds(proxy_pid)
        rate_proxy = put_rate(proxied, args.threads, args.seconds)
        proxy_cpu = cpu_seconds(proxy_pid) - before
        clients = {
            kind: round(
                asyncio.run(_client_cpu(kind, kinesalite_url + "/", args.client_requests)) * 1e6
            )
            for kind in ("aiohttp", "httpx")
        }
    result = {
        "benchmark": "AWS fault proxy (emulators/aws_proxy) vs direct kinesalite, no faults",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "latency": lat,
        "put_record_per_s": {
            "threads": args.threads,
            "direct": rate_direct,
            "proxy": rate_proxy,
            "proxy_cpu_us_per_request": round(proxy_cpu / max(1, rate_proxy["records"]) * 1e6),
        },
        "upstream_client_cpu_us_per_request": clients,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
