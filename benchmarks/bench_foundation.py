"""Foundation benchmark: end-to-end push deliveries/s on the embedded stack, beside the
capacity of the parts that could limit it (APNs simulator, the consumer's HTTP/2 client, Redis
SET NX), all measured in one run so the ratios mean something on a shared, noisy machine.

    .venv/bin/python benchmarks/bench_foundation.py --out reports/bench/foundation.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pandas as pd
import redis

from emulators.ports import LOOPBACK, free_port
from emulators.providers.loadcheck import apns_request, run_load
from harness.model.population import PopulationSpec
from harness.model.scenarios import Scenario
from harness.run.runner import Progress, run
from harness.stack.supervisor import require_redis_server, stop_process, wait_until

ROOT = Path(__file__).resolve().parent.parent


def _start(argv: list[str], ready: Callable[[], bool]) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        wait_until(ready, 20, f"{argv[0]} to be ready", interval=0.05)
    except BaseException:
        stop_process(proc)
        raise
    return proc


def _http_ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def bench_apns_simulator(requests: int) -> dict[str, float]:
    port = free_port()
    proc = _start(
        [sys.executable, "-m", "emulators.providers.apns", "--host", LOOPBACK, "--port", str(port)],
        lambda: _http_ok(f"http://{LOOPBACK}:{port}/_sim/health"),
    )
    try:
        asyncio.run(run_load(LOOPBACK, port, requests=1000))
        h2 = asyncio.run(run_load(LOOPBACK, port, requests=requests))
        # The reference consumer's client: httpx over h2c, one request at a time per thread.
        client = httpx.Client(http1=False, http2=True, timeout=5)
        path, headers, body = apns_request(0)
        count = min(requests, 3000)
        started = time.perf_counter()
        for i in range(count):
            path, headers, body = apns_request(i)
            client.post(f"http://{LOOPBACK}:{port}{path}", content=body, headers=headers)
        httpx_rate = count / (time.perf_counter() - started)
        client.close()
    finally:
        stop_process(proc)
    return {
        "apns_simulator_h2_req_per_s": round(h2.rate, 1),
        "apns_simulator_h2_errors": h2.errors,
        "httpx_h2c_sequential_req_per_s": round(httpx_rate, 1),
    }


def bench_redis(ops: int) -> dict[str, float]:
    port = free_port()
    proc = _start(
        [
            require_redis_server(),
            "--port",
            str(port),
            "--bind",
            LOOPBACK,
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        lambda: _redis_ok(port),
    )
    try:
        r = redis.Redis(host=LOOPBACK, port=port)
        latencies = []
        started = time.perf_counter()
        for i in range(ops):
            t0 = time.perf_counter()
            r.set(f"dedup:{i}", "1", nx=True, ex=2_592_000)
            latencies.append(time.perf_counter() - t0)
        single = ops / (time.perf_counter() - started)
        pipe_started = time.perf_counter()
        for start in range(0, ops, 16):
            pipe = r.pipeline(transaction=False)
            for i in range(start, min(ops, start + 16)):
                pipe.set(f"dedup:p{i}", "1", nx=True, ex=2_592_000)
            pipe.execute()
        pipelined = ops / (time.perf_counter() - pipe_started)
    finally:
        stop_process(proc)
    return {
        "redis_set_nx_ops_per_s_one_client": round(single, 1),
        "redis_set_nx_p50_ms": round(statistics.median(latencies) * 1000, 3),
        "redis_set_nx_ops_per_s_pipeline16": round(pipelined, 1),
    }


def bench_moto_sqs(calls: int) -> dict[str, float]:
    """moto's SQS ReceiveMessage rate at a small depth: the stack's queue until issue 3."""
    import boto3

    port = free_port()
    url = f"http://{LOOPBACK}:{port}"
    proc = _start(
        [sys.executable, "-m", "moto.server", "-H", LOOPBACK, "-p", str(port)],
        lambda: _http_ok(f"{url}/moto-api/"),
    )
    try:
        sqs = boto3.client(
            "sqs", endpoint_url=url, region_name="us-east-1",
            aws_access_key_id="testing", aws_secret_access_key="testing",
        )  # fmt: skip
        queue = sqs.create_queue(QueueName="bench", Attributes={"VisibilityTimeout": "0"})[
            "QueueUrl"
        ]
        for b in range(10):
            entries = [{"Id": str(i), "MessageBody": f"m{b}-{i}"} for i in range(10)]
            sqs.send_message_batch(QueueUrl=queue, Entries=entries)
        started = time.perf_counter()
        for _ in range(calls):
            sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, WaitTimeSeconds=0)
        rate = calls / (time.perf_counter() - started)
    finally:
        stop_process(proc)
    return {
        "moto_sqs_receive10_calls_per_s_depth100": round(rate, 1),
        "moto_sqs_receive_messages_per_s_one_poller": round(rate * 10, 1),
    }


def _redis_ok(port: int) -> bool:
    try:
        return bool(redis.Redis(host=LOOPBACK, port=port, socket_timeout=1).ping())
    except redis.RedisError:
        return False


def bench_end_to_end(scale: float, seed: int) -> dict[str, float]:
    """Deliveries/s from the first accepted event to the last expected delivery."""
    spec = PopulationSpec(
        users_per_tenant=int(400 * scale) + 1,
        celebrity_followers=int(400 * scale),
        regular_followers=20,
        no_consent_fraction=0.0,
        dead_token_fraction=0.0,
        quiet_whole_run_fraction=0.0,
        quiet_ends_fraction=0.0,
    )
    scenario = Scenario(
        name="bench-push", description="no quiet hours", population=spec, timeout_seconds=600
    )
    with tempfile.TemporaryDirectory() as out:
        result = run(
            scenario,
            seed=seed,
            out=Path(out),
            progress=Progress(lambda line: print(line, flush=True)),
        )
        history = pd.read_parquet(result.run_dir / "history.parquet")
    once = result.summary["checkers"]["effectively_once"]
    injected = history[history["kind"] == "inject"]["time"]
    delivered = history[(history["kind"] == "provider") & (history["status"] == 200)]["time"]
    span = float(delivered.max() - injected.min())
    return {
        "e2e_expected_deliveries": once["expected"],
        "e2e_delivered": once["delivered"],
        "e2e_duplicated": once["duplicated"],
        "e2e_seconds_first_event_to_last_delivery": round(span, 2),
        "e2e_deliveries_per_s": round(once["delivered"] / span, 1) if span > 0 else 0.0,
        "e2e_verdict": result.summary["verdict"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "reports" / "bench" / "foundation.json"))
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    results: dict[str, object] = {
        "benchmark": "foundation",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "seed": args.seed,
    }
    results.update(bench_apns_simulator(args.requests))
    results.update(bench_redis(20000))
    results.update(bench_moto_sqs(40))
    results.update(bench_end_to_end(args.scale, args.seed))
    limits = {
        "apns simulator (h2 client)": results["apns_simulator_h2_req_per_s"],
        "consumer http client (per thread)": results["httpx_h2c_sequential_req_per_s"],
        "moto SQS receive, one poller": results["moto_sqs_receive_messages_per_s_one_poller"],
        "end to end": results["e2e_deliveries_per_s"],
    }
    parts = {k: v for k, v in limits.items() if k != "end to end"}
    results["slowest_part"] = min(parts, key=lambda k: parts[k])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    for name, value in limits.items():
        print(f"{name:<36} {value:>10,.0f} /s")
    print(f"written {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
