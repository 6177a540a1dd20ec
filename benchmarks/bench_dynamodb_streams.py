"""Benchmark: what DynamoDB Streams on dynalite (the AWS proxy's --dynamodb-streams) costs.

Run: ``.venv/bin/python benchmarks/bench_dynamodb_streams.py --out reports/bench/dynamodb_streams.json``

dynalite and the proxy run as subprocesses; boto3 drives them from this process. Measured:

* p50 and p95 latency of DynamoDB calls direct to dynalite and through the proxy, the calls
  interleaved so both paths see the same machine load: reads and writes on a table without a
  stream (the proxy only forwards them) and writes on a table with a KEYS_ONLY stream (the
  proxy reads the item before, and for an UpdateItem after, the write); the added p50 per call;
* memory: the proxy's resident set before and after 20,000 KEYS_ONLY records, per record;
* on the embedded stack (redis, dynalite behind the proxy, the stream-invalidator part): the
  time from an UpdateItem on the preferences table to the cache entry's deletion, p50/p95/max
  (the stream invalidator polls every 0.25 s; the writes come at random phases of that cycle).

Every loop is bounded in count and in time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import httpx
import redis
from botocore.config import Config as BotoConfig

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench_aws_proxy import answers, process  # noqa: E402

from emulators.ports import LOOPBACK, free_port  # noqa: E402
from harness.stack.supervisor import NODE_EMULATOR, Stack, wait_until  # noqa: E402
from reference_impl.config import Config  # noqa: E402
from reference_impl.ids import preferences_cache_key, user_key  # noqa: E402

PRELOAD = 1000


def client(url: str) -> Any:
    return boto3.client(
        "dynamodb",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="bench",
        aws_secret_access_key="bench",
        config=BotoConfig(retries={"total_max_attempts": 1}, max_pool_connections=32),
    )


def make_table(ddb: Any, name: str, stream: bool) -> None:
    extra = {"StreamSpecification": {"StreamEnabled": True, "StreamViewType": "KEYS_ONLY"}}
    ddb.create_table(
        TableName=name,
        KeySchema=[
            {"AttributeName": "pk", "KeyType": "HASH"},
            {"AttributeName": "sk", "KeyType": "RANGE"},
        ],
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
        ],
        BillingMode="PAY_PER_REQUEST",
        **(extra if stream else {}),
    )
    for start in range(0, PRELOAD, 25):
        ddb.batch_write_item(
            RequestItems={
                name: [
                    {"PutRequest": {"Item": item(n)}}
                    for n in range(start, min(PRELOAD, start + 25))
                ]
            }
        )


def item(n: int, value: str = "v") -> dict[str, Any]:
    return {"pk": {"S": f"u{n % 50}"}, "sk": {"S": f"{n:06d}"}, "v": {"S": value * 20}}


def calls(table: str, n: int) -> dict[str, Callable[[Any], Any]]:
    key = {"pk": {"S": f"u{n % 50}"}, "sk": {"S": f"{n % PRELOAD:06d}"}}
    return {
        "GetItem": lambda c: c.get_item(TableName=table, Key=key, ConsistentRead=True),
        "Query": lambda c: c.query(
            TableName=table,
            KeyConditionExpression="pk = :p",
            ExpressionAttributeValues={":p": {"S": f"u{n % 50}"}},
            Limit=20,
        ),
        "PutItem": lambda c: c.put_item(TableName=table, Item=item(n % PRELOAD, f"p{n}")),
        "UpdateItem": lambda c: c.update_item(
            TableName=table,
            Key=key,
            UpdateExpression="SET v = :v",
            ExpressionAttributeValues={":v": {"S": f"u{n}"}},
        ),
        "BatchWriteItem(25)": lambda c: c.batch_write_item(
            RequestItems={
                table: [
                    {"PutRequest": {"Item": item((n * 25 + i) % PRELOAD, f"b{n}")}}
                    for i in range(25)
                ]
            }
        ),
    }


def latency(direct: Any, proxied: Any, samples: int, budget_s: float) -> dict[str, Any]:
    wanted = {
        "plain": ("GetItem", "Query", "PutItem", "UpdateItem"),
        "streamed": ("PutItem", "UpdateItem", "BatchWriteItem(25)"),
    }
    times: dict[str, dict[str, list[float]]] = {
        f"{op} ({table})": {"direct": [], "proxy": []}
        for table, ops in wanted.items()
        for op in ops
    }
    deadline = time.perf_counter() + budget_s
    for n in range(samples):
        if n >= 10 and time.perf_counter() > deadline:
            break
        for table, ops in wanted.items():
            made = calls(table, n)
            for op in ops:
                for name, c in (("direct", direct), ("proxy", proxied)):
                    began = time.perf_counter()
                    made[op](c)
                    times[f"{op} ({table})"][name].append((time.perf_counter() - began) * 1000)
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


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def memory(proxied: Any, proxy_url: str, pid: int, records: int) -> dict[str, Any]:
    table = "memory"
    proxied.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
        StreamSpecification={"StreamEnabled": True, "StreamViewType": "KEYS_ONLY"},
    )
    before = rss_bytes(pid)
    kept_before = httpx.get(f"{proxy_url}/_proxy/health").json()["dynamodb_streams"]
    for start in range(0, records, 25):
        proxied.batch_write_item(
            RequestItems={
                table: [
                    {"PutRequest": {"Item": {"pk": {"S": f"tenant-0#user-{n:08d}"}}}}
                    for n in range(start, min(records, start + 25))
                ]
            }
        )
    after = rss_bytes(pid)
    kept = httpx.get(f"{proxy_url}/_proxy/health").json()["dynamodb_streams"]
    added = kept["records"] - kept_before["records"]
    return {
        "records": added,
        "rss_bytes_per_record": round((after - before) / max(1, added)),
        "record_text_bytes_per_record": round(
            (kept["record_bytes"] - kept_before["record_bytes"]) / max(1, added)
        ),
    }


def invalidation_lag(samples: int) -> dict[str, Any]:
    """On the stack: UpdateItem on the preferences table -> the cache entry is gone."""
    parts = ["redis", "dynamodb", "dynamodb-proxy", "kinesis", "sqs", "stream-invalidator"]
    with tempfile.TemporaryDirectory(prefix="bench-ddb-streams-") as workdir:
        began = time.perf_counter()
        with Stack(Path(workdir), parts=parts) as stack:
            up_s = time.perf_counter() - began
            config = Config.load(stack.info.reference_config)
            ddb = stack.info.aws_client("dynamodb")
            cache = redis.Redis.from_url(stack.info.redis_url)
            lags = []
            # Writes at random phases of the poller's 0.25 s cycle: back to back, each write
            # would come just after the pass that saw the previous one, a whole cycle early.
            phases = random.Random(7)
            for n in range(samples):
                time.sleep(phases.uniform(0, config.stream_poll_interval_seconds))
                user = f"bench-{uuid.uuid4().hex[:8]}"
                key = preferences_cache_key("t", user)
                cache.set(key, "{}", ex=300)
                written = time.perf_counter()
                ddb.update_item(
                    TableName=config.table("preferences"),
                    Key={"pk": {"S": user_key("t", user)}},
                    UpdateExpression="SET prefs = :p",
                    ExpressionAttributeValues={":p": {"S": json.dumps({"n": n})}},
                )
                wait_until(lambda k=key: cache.get(k) is None, 10, "the invalidation", 0.002)
                lags.append((time.perf_counter() - written) * 1000)
    lags.sort()
    return {
        "samples": len(lags),
        "p50_ms": round(statistics.median(lags), 1),
        "p95_ms": round(lags[int(len(lags) * 0.95) - 1], 1),
        "max_ms": round(lags[-1], 1),
        "partial_stack_up_s": round(up_s, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, default=ROOT / "reports" / "bench" / "dynamodb_streams.json"
    )
    parser.add_argument("--samples", type=int, default=300, help="latency samples per call")
    parser.add_argument("--memory-records", type=int, default=20_000)
    parser.add_argument("--lag-samples", type=int, default=50)
    args = parser.parse_args(argv)
    node = shutil.which("node")
    if node is None:
        print("node is not installed: run `make setup`", file=sys.stderr)
        return 2
    dynalite_port, proxy_port = free_port(), free_port()
    dynalite_url = f"http://{LOOPBACK}:{dynalite_port}"
    proxy_url = f"http://{LOOPBACK}:{proxy_port}"
    direct, proxied = client(dynalite_url), client(proxy_url)
    dynalite_argv = [node, str(NODE_EMULATOR), "dynalite", "--port", str(dynalite_port)]
    proxy_argv = [sys.executable, "-m", "emulators.aws_proxy", "--upstream", dynalite_url,
                  "--port", str(proxy_port), "--dynamodb-streams"]  # fmt: skip
    with (
        process(dynalite_argv, lambda: answers(direct.list_tables), "dynalite"),
        process(proxy_argv, lambda: answers(proxied.list_tables), "the aws proxy") as proxy_pid,
    ):
        make_table(proxied, "plain", stream=False)
        make_table(proxied, "streamed", stream=True)
        lat = latency(direct, proxied, args.samples, 240)
        mem = memory(proxied, proxy_url, proxy_pid, args.memory_records)
    lag = invalidation_lag(args.lag_samples)
    result = {
        "benchmark": "DynamoDB Streams for dynalite: the AWS proxy's --dynamodb-streams",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "latency": lat,
        "memory_keys_only": mem,
        "write_to_cache_invalidation": lag,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
