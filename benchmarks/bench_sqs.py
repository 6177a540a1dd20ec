"""Benchmark: our SQS endpoint at depth 0 and 100,000, beside moto's server in the same run.

Run: ``.venv/bin/python benchmarks/bench_sqs.py --out reports/bench/sqs.json``

Both endpoints run as subprocesses; one boto3 client (retries off) drives them from this
process. Measured, with batches of 10:

* p50 latency of SendMessageBatch, ReceiveMessage (MaxNumberOfMessages=10) and
  DeleteMessageBatch, in cycles of send/receive/delete that keep the depth constant, on an empty
  queue and on a queue filled to ``--depth`` (the fill rate is reported too), the cycles on the
  two queues interleaved so that both see the same machine load; the ratio of the two per
  operation (the endpoint's promise: at most 1.5);
* messages per second sent, received and deleted at that depth (one phase of each);
* the same for a FIFO queue pair (``--fifo-groups``, 1,000 message groups by default; each
  message with its own deduplication id);
* moto's same figures at ``--moto-depth``: moto costs O(depth) per call, so its fill stops after
  ``--moto-fill-budget`` seconds and it is measured at the depth reached (said in the JSON).

Every loop is bounded in count and in time.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import os
import platform
import statistics
import sys
import time
import zlib
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import boto3
import botocore
from botocore.config import Config

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from emulators.sqs.processes import start_moto, start_ours  # noqa: E402

BATCH = 10
OPS = ("SendMessageBatch", "ReceiveMessage", "DeleteMessageBatch")
MAX_RATIO = 1.5


def client(url: str) -> Any:
    return boto3.client(
        "sqs",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="bench",
        aws_secret_access_key="bench",
        config=Config(retries={"total_max_attempts": 1}, read_timeout=300, connect_timeout=10),
    )


FIFO_GROUPS = 0  # > 0: the queues are FIFO queues, messages spread over this many groups
_SENT = itertools.count()


def entries(prefix: str) -> list[dict[str, str]]:
    out = [
        {"Id": str(i), "MessageBody": f'{{"job": "{prefix}-{i}", "pad": "{"x" * 200}"}}'}
        for i in range(BATCH)
    ]
    if FIFO_GROUPS:
        for i, entry in enumerate(out):
            key = f"{prefix}-{i}-{next(_SENT)}"  # unique: no send is deduplicated away
            entry["MessageGroupId"] = f"g{zlib.crc32(key.encode()) % FIFO_GROUPS}"
            entry["MessageDeduplicationId"] = key
    return out


def depth(sqs: Any, url: str) -> int:
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
    return int(attrs["Attributes"]["ApproximateNumberOfMessages"])


def fill(sqs: Any, url: str, target: int, budget_s: float) -> dict[str, Any]:
    """Send batches until ``target`` messages are queued or ``budget_s`` has passed."""
    sent = 0
    started = time.perf_counter()
    deadline = started + budget_s
    while sent < target and time.perf_counter() < deadline:
        result = sqs.send_message_batch(QueueUrl=url, Entries=entries(f"fill{sent}"))
        sent += len(result.get("Successful", []))
    seconds = time.perf_counter() - started
    return {
        "target": target,
        "messages": sent,
        "seconds": round(seconds, 3),
        "messages_per_s": round(sent / seconds, 1) if seconds > 0 else None,
        "reached_target": sent >= target,
    }


def timed(call: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    result = call()
    return (time.perf_counter() - started) * 1000.0, result


def one_cycle(sqs: Any, url: str, samples: dict[str, list[float]], tag: str) -> None:
    """Send 10, receive 10, delete them (the depth stays where it is); time each call."""
    batch = entries(tag)
    ms, _ = timed(partial(sqs.send_message_batch, QueueUrl=url, Entries=batch))
    samples["SendMessageBatch"].append(ms)
    ms, got = timed(
        partial(sqs.receive_message, QueueUrl=url, MaxNumberOfMessages=BATCH, VisibilityTimeout=600)
    )
    samples["ReceiveMessage"].append(ms)
    handles = [m["ReceiptHandle"] for m in got.get("Messages", [])]
    if handles:
        delete = [{"Id": str(j), "ReceiptHandle": h} for j, h in enumerate(handles)]
        ms, _ = timed(partial(sqs.delete_message_batch, QueueUrl=url, Entries=delete))
        samples["DeleteMessageBatch"].append(ms)


def summary(samples: dict[str, list[float]]) -> dict[str, Any]:
    return {
        "p50_ms": {op: round(statistics.median(v), 3) for op, v in samples.items() if v},
        "samples": {op: len(v) for op, v in samples.items()},
    }


def cycles(sqs: Any, urls: list[str], count: int, budget_s: float) -> list[dict[str, Any]]:
    """Cycles on each queue in turn (interleaved, so that both see the same machine load)."""
    samples = [{op: [] for op in OPS} for _ in urls]
    deadline = time.perf_counter() + budget_s
    for i in range(count):
        if i >= 3 and time.perf_counter() > deadline:
            break
        for url, kept in zip(urls, samples, strict=True):
            one_cycle(sqs, url, kept, f"c{i}")
    return [summary(kept) for kept in samples]


def throughput(sqs: Any, url: str, batches: int, budget_s: float) -> dict[str, Any]:
    """Messages per second in a send phase, a receive phase and a delete phase."""
    out: dict[str, Any] = {}
    started = time.perf_counter()
    sent = 0
    for i in range(batches):
        if i >= 2 and time.perf_counter() - started > budget_s:
            break
        sent += len(sqs.send_message_batch(QueueUrl=url, Entries=entries(f"t{i}"))["Successful"])
    out["sent_per_s"] = round(sent / (time.perf_counter() - started), 1)
    handles: list[str] = []
    started = time.perf_counter()
    for i in range(batches):
        if i >= 2 and time.perf_counter() - started > budget_s:
            break
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=BATCH, VisibilityTimeout=600)
        handles += [m["ReceiptHandle"] for m in got.get("Messages", [])]
    out["received_per_s"] = round(len(handles) / (time.perf_counter() - started), 1)
    deleted = 0
    started = time.perf_counter()
    for i in range(0, len(handles), BATCH):
        if i >= 2 * BATCH and time.perf_counter() - started > budget_s:
            break
        chunk = handles[i : i + BATCH]
        result = sqs.delete_message_batch(
            QueueUrl=url,
            Entries=[{"Id": str(j), "ReceiptHandle": h} for j, h in enumerate(chunk)],
        )
        deleted += len(result.get("Successful", []))
    out["deleted_per_s"] = round(deleted / (time.perf_counter() - started), 1)
    out["messages"] = {"sent": sent, "received": len(handles), "deleted": deleted}
    return out


def bench_backend(
    kind: str,
    target_depth: int,
    samples: int,
    fill_budget_s: float,
    measure_budget_s: float,
    throughput_batches: int,
) -> dict[str, Any]:
    start = start_ours if kind == "ours" else start_moto
    suffix = ".fifo" if FIFO_GROUPS else ""
    # High-throughput mode: a normal FIFO queue is throttled at 300 calls per second per action.
    attributes = (
        {
            "FifoQueue": "true",
            "DeduplicationScope": "messageGroup",
            "FifoThroughputLimit": "perMessageGroupId",
        }
        if FIFO_GROUPS
        else {}
    )
    with start() as endpoint:
        sqs = client(endpoint.url)
        result: dict[str, Any] = {"endpoint": kind}
        if FIFO_GROUPS:
            result["fifo_groups"] = FIFO_GROUPS
        empty = sqs.create_queue(QueueName="bench-empty" + suffix, Attributes=attributes)[
            "QueueUrl"
        ]
        cycles(sqs, [empty], 50, measure_budget_s)  # warm up connections and code paths
        deep = sqs.create_queue(QueueName="bench-deep" + suffix, Attributes=attributes)["QueueUrl"]
        filled = fill(sqs, deep, target_depth, fill_budget_s)
        reached = depth(sqs, deep)
        at_zero, at_depth = cycles(sqs, [empty, deep], samples, measure_budget_s)
        result["fill"] = filled
        result["depth_measured"] = reached
        if not filled["reached_target"]:
            result["note"] = (
                f"filling to {target_depth} did not finish within {fill_budget_s:.0f} s; "
                f"measured at the depth reached, {reached}"
            )
        result["p50_ms"] = {"depth_0": at_zero["p50_ms"], f"depth_{reached}": at_depth["p50_ms"]}
        result["samples"] = {"depth_0": at_zero["samples"], f"depth_{reached}": at_depth["samples"]}
        result["ratio_deep_over_empty"] = {
            op: round(at_depth["p50_ms"][op] / at_zero["p50_ms"][op], 3)
            for op in OPS
            if op in at_depth["p50_ms"] and op in at_zero["p50_ms"]
        }
        result["throughput"] = {
            "depth": reached,
            "client_threads": 1,
            **throughput(sqs, deep, throughput_batches, measure_budget_s),
        }
        return result


def table(report: dict[str, Any]) -> str:
    lines = []
    for kind in ("ours", "ours_fifo", "moto"):
        data = report.get(kind)
        if not data:
            continue
        keys = list(data["p50_ms"])
        lines.append(f"{kind}: fill {data['fill']['messages']} msgs at "
                     f"{data['fill']['messages_per_s']} msg/s")  # fmt: skip
        lines.append(f"  {'p50 ms':<22}" + "".join(f"{k:>16}" for k in keys) + f"{'ratio':>10}")
        for op in OPS:
            row = "".join(f"{data['p50_ms'][k].get(op, float('nan')):>16.2f}" for k in keys)
            lines.append(f"  {op:<22}{row}{data['ratio_deep_over_empty'].get(op, 0):>10.2f}")
        t = data["throughput"]
        lines.append(
            f"  msgs/s at depth {t['depth']}: sent {t['sent_per_s']}, received "
            f"{t['received_per_s']}, deleted {t['deleted_per_s']}"
        )
        if "note" in data:
            lines.append(f"  note: {data['note']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="reports/bench/sqs.json")
    parser.add_argument("--depth", type=int, default=100_000)
    parser.add_argument("--samples", type=int, default=300, help="cycles per depth")
    parser.add_argument("--throughput-batches", type=int, default=300)
    parser.add_argument("--moto-depth", type=int, default=10_000)
    parser.add_argument("--moto-samples", type=int, default=15)
    parser.add_argument("--moto-fill-budget", type=float, default=1500.0, help="seconds")
    parser.add_argument("--moto-measure-budget", type=float, default=60.0, help="seconds")
    parser.add_argument("--skip-moto", action="store_true")
    parser.add_argument(
        "--fifo-groups", type=int, default=1000, help="FIFO queue run: groups (0: no FIFO run)"
    )
    args = parser.parse_args(argv)

    report: dict[str, Any] = {
        "benchmark": "sqs endpoint",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "boto3": boto3.__version__,
        "botocore": botocore.__version__,
        "batch_size": BATCH,
        "client": "one boto3 client in one thread, retries off, loopback",
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }
    report["ours"] = bench_backend(
        "ours", args.depth, args.samples, 600.0, 120.0, args.throughput_batches
    )
    ratios = report["ours"]["ratio_deep_over_empty"]
    report["ours"]["max_ratio"] = MAX_RATIO
    report["ours"]["ratio_ok"] = bool(ratios) and all(r <= MAX_RATIO for r in ratios.values())
    ok = report["ours"]["ratio_ok"]
    if args.fifo_groups > 0:
        global FIFO_GROUPS
        FIFO_GROUPS = args.fifo_groups
        try:
            fifo = bench_backend(
                "ours", args.depth, args.samples, 600.0, 120.0, args.throughput_batches
            )
        finally:
            FIFO_GROUPS = 0
        fifo_ratios = fifo["ratio_deep_over_empty"]
        fifo["max_ratio"] = MAX_RATIO
        fifo["ratio_ok"] = bool(fifo_ratios) and all(r <= MAX_RATIO for r in fifo_ratios.values())
        report["ours_fifo"] = fifo
        ok = ok and fifo["ratio_ok"]
    if not args.skip_moto:
        import moto

        report["moto_version"] = moto.__version__
        report["moto"] = bench_backend(
            "moto",
            args.moto_depth,
            args.moto_samples,
            args.moto_fill_budget,
            args.moto_measure_budget,
            args.moto_samples,
        )
    report["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(table(report))
    print(f"wrote {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
