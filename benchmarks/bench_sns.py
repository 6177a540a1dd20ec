"""Benchmark: publishes per second through the SNS endpoint, really delivered to APNs and FCM.

Run: ``.venv/bin/python benchmarks/bench_sns.py --out reports/bench/sns.json [--quick]``

The APNs (h2c) and FCM simulators and the SNS endpoint run as subprocesses on loopback; the
endpoints are created with boto3. Two publishers, one after the other:

* ``boto3``: ``--threads`` threads, one boto3 ``sns`` client each (retries off), publishing to
  APNs and FCM endpoints in turn: what an SDK publisher sees (p50/p99 latency, rate);
* ``h2``: form-encoded Publish requests over two HTTP/2 connections to the endpoint,
  ``--streams`` at a time, from this process: the endpoint's own capacity, with its CPU time per
  publish (from /proc) and so its publishes per core-second.

Each phase checks the simulators' ledgers: every publish answered with a MessageId must be one
more 200 in a provider's ledger. Every loop is bounded in count and time.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import boto3
import httpx
from botocore.config import Config
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from emulators.h2_client import H2Pool  # noqa: E402
from emulators.ports import free_port  # noqa: E402
from emulators.providers.fcm import write_service_account_file  # noqa: E402
from emulators.sns.processes import SnsProcess, start_sns  # noqa: E402

START_TIMEOUT = 30.0


def start_simulator(module: str) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", module, "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "listening" not in line:
        proc.kill()
        raise RuntimeError(f"{module} did not start: {line!r}")
    return proc, f"http://127.0.0.1:{port}"


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ledger_200s(url: str) -> int:
    rows = httpx.get(f"{url}/_sim/ledger", timeout=30).json()["rows"]
    return sum(1 for r in rows if r["status"] == 200)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def sns_client(url: str) -> Any:
    return boto3.client(
        "sns",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="bench",
        aws_secret_access_key="bench",
        config=Config(retries={"total_max_attempts": 1}, max_pool_connections=64),
    )


def make_endpoints(url: str, fcm_url: str, per_platform: int) -> list[str]:
    sns = sns_client(url)
    key = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    apns_app = sns.create_platform_application(
        Name="bench-ios",
        Platform="APNS",
        Attributes={
            "PlatformCredential": key.decode(),
            "PlatformPrincipal": "BENCHKEY01",
            "ApplePlatformTeamID": "BENCHTEAM1",
            "ApplePlatformBundleID": "com.example.bench",
        },
    )["PlatformApplicationArn"]
    account = Path(tempfile.mkdtemp()) / "sa.json"
    write_service_account_file(account, f"{fcm_url}/token", "bench-sender")
    fcm_app = sns.create_platform_application(
        Name="bench-android", Platform="GCM", Attributes={"PlatformCredential": account.read_text()}
    )["PlatformApplicationArn"]
    arns = []
    for i in range(per_platform):
        arns.append(
            sns.create_platform_endpoint(PlatformApplicationArn=apns_app, Token=f"{i:064x}")[
                "EndpointArn"
            ]
        )
        arns.append(
            sns.create_platform_endpoint(PlatformApplicationArn=fcm_app, Token=f"bench:{i}")[
                "EndpointArn"
            ]
        )
    return arns


def message(i: int) -> str:
    return json.dumps(
        {
            "default": f"n{i}",
            "APNS": json.dumps({"aps": {"alert": f"n{i}"}, "notification_id": str(i)}),
            "GCM": json.dumps({"fcmV1Message": {"message": {"data": {"notification_id": str(i)}}}}),
        }
    )


def bench_boto3(url: str, arns: list[str], total: int, threads: int, budget: float) -> dict:
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    counter = iter(range(total))
    deadline = time.perf_counter() + budget

    def worker() -> None:
        client = sns_client(url)
        while time.perf_counter() < deadline:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            started = time.perf_counter()
            try:
                client.publish(
                    TargetArn=arns[i % len(arns)], MessageStructure="json", Message=message(i)
                )
            except Exception as exc:  # noqa: BLE001 - every failure is counted and reported
                with lock:
                    errors.append(type(exc).__name__)
                continue
            with lock:
                latencies.append(time.perf_counter() - started)

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    started = time.perf_counter()
    for t in pool:
        t.start()
    for t in pool:
        t.join(budget + 30)
    elapsed = time.perf_counter() - started
    return {
        "publishes": len(latencies),
        "errors": len(errors),
        "seconds": round(elapsed, 3),
        "publishes_per_second": round(len(latencies) / elapsed, 1),
        "p50_ms": round(percentile(latencies, 0.5) * 1000, 2),
        "p99_ms": round(percentile(latencies, 0.99) * 1000, 2),
        "threads": threads,
    }


async def bench_h2(url: str, arns: list[str], total: int, streams: int, budget: float) -> dict:
    pool = H2Pool(url, connections=2)
    latencies: list[float] = []
    errors = 0
    bodies = [
        urlencode(
            {
                "Action": "Publish",
                "Version": "2010-03-31",
                "TargetArn": arns[i % len(arns)],
                "MessageStructure": "json",
                "Message": message(i),
            }
        ).encode()
        for i in range(total)
    ]
    headers = {"content-type": "application/x-www-form-urlencoded; charset=utf-8"}
    next_index = 0
    deadline = time.perf_counter() + budget

    async def worker() -> None:
        nonlocal next_index, errors
        while next_index < total and time.perf_counter() < deadline:
            i = next_index
            next_index += 1
            started = time.perf_counter()
            answer = await pool.request("POST", "/", headers, bodies[i], timeout=30)
            if answer.status != 200 or b"<MessageId>" not in answer.body:
                errors += 1
                if errors == 1:
                    print(f"first h2 error: {answer.status} {answer.body[:300]!r}", flush=True)
                continue
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(streams)))
    elapsed = time.perf_counter() - started
    pool.close()
    return {
        "publishes": len(latencies),
        "errors": errors,
        "seconds": round(elapsed, 3),
        "publishes_per_second": round(len(latencies) / elapsed, 1),
        "p50_ms": round(percentile(latencies, 0.5) * 1000, 2),
        "p99_ms": round(percentile(latencies, 0.99) * 1000, 2),
        "streams": streams,
    }


def measured(name: str, sns: SnsProcess, sims: dict[str, str], run: Any) -> dict[str, Any]:
    delivered_before = sum(ledger_200s(u) for u in sims.values())
    cpu_before = cpu_seconds(sns.proc.pid)
    result = run()
    sns_cpu = cpu_seconds(sns.proc.pid) - cpu_before
    delivered = sum(ledger_200s(u) for u in sims.values()) - delivered_before
    result["delivered_by_providers"] = delivered
    result["every_publish_delivered"] = delivered == result["publishes"]
    result["sns_cpu_seconds"] = round(sns_cpu, 3)
    if result["publishes"]:
        per = sns_cpu / result["publishes"]
        result["sns_cpu_us_per_publish"] = round(per * 1e6, 1)
        result["sns_publishes_per_core_second"] = round(1 / per, 1) if per > 0 else None
    print(
        f"{name:>6}: {result['publishes']} publishes in {result['seconds']}s = "
        f"{result['publishes_per_second']}/s, p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms;"
        f" SNS CPU {result.get('sns_cpu_us_per_publish')} us/publish; delivered {delivered}",
        flush=True,
    )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="reports/bench/sns.json")
    parser.add_argument("--publishes", type=int, default=6000, help="per publisher")
    parser.add_argument("--endpoints", type=int, default=100, help="per platform")
    parser.add_argument("--threads", type=int, default=8, help="boto3 publisher threads")
    parser.add_argument("--streams", type=int, default=64, help="concurrent h2 publishes")
    parser.add_argument("--budget", type=float, default=120.0, help="seconds per publisher")
    parser.add_argument("--quick", action="store_true", help="1,000 publishes per publisher")
    args = parser.parse_args(argv)
    if args.quick:
        args.publishes = 1000
    sims: dict[str, str] = {}
    procs: list[subprocess.Popen[str]] = []
    sns: SnsProcess | None = None
    try:
        for module, name in (
            ("emulators.providers.apns", "apns"),
            ("emulators.providers.fcm", "fcm"),
        ):
            proc, url = start_simulator(module)
            procs.append(proc)
            sims[name] = url
        sns = start_sns(apns_url=sims["apns"], fcm_url=sims["fcm"])
        arns = make_endpoints(sns.url, sims["fcm"], args.endpoints)
        report: dict[str, Any] = {
            "benchmark": "sns endpoint",
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "boto3_version": boto3.__version__,
            "endpoints": len(arns),
            "message": "MessageStructure=json with APNS and GCM (fcmV1Message) payloads; "
            "APNs and FCM endpoints in turn",
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        }
        report["h2"] = measured(
            "h2",
            sns,
            sims,
            lambda: asyncio.run(bench_h2(sns.url, arns, args.publishes, args.streams, args.budget)),
        )
        report["boto3"] = measured(
            "boto3",
            sns,
            sims,
            lambda: bench_boto3(sns.url, arns, args.publishes, args.threads, args.budget),
        )
        health = httpx.get(f"{sns.url}/_sns/health").json()
        report["connections_opened"] = health["connections_opened"]
        report["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    finally:
        if sns is not None:
            sns.stop()
        for proc in procs:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")
    ok = all(
        report[p]["errors"] == 0 and report[p]["every_publish_delivered"] for p in ("h2", "boto3")
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
