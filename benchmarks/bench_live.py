"""Live drill cost: the harness's CPU per delivery for the live view (metrics and online checks
reading the history as it is written), beside the history's own append of the same rows.

    .venv/bin/python benchmarks/bench_live.py --out reports/bench/live.json

A synthetic game day's rows (``--deliveries``, default 200,000: injections, provider requests
with 1% duplicates, 1% 429s and a few dead answers, fault windows, queue samples) are appended
to a History (the comparison point: what every run pays anyway) and fed, in batches of the size
the live view reads every half second at ``--rate`` deliveries a second, through LiveMetrics and
OnlineChecks. The JSON holds the CPU microseconds per delivery of each, their ratio, the
fraction of one core the live view takes at ``--rate`` (game-day's delivery rate on this
machine by default) and whether that is under the issue's 5% of the run's own cost.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from harness.live.metrics import LiveMetrics  # noqa: E402
from harness.live.online import OnlineChecks  # noqa: E402
from harness.model.history import History  # noqa: E402


def rows(deliveries: int, seed: int) -> list[tuple[str, dict[str, Any]]]:
    """(kind, fields) of a synthetic run, in the order a run appends them."""
    rng = random.Random(seed)
    out: list[tuple[str, dict[str, Any]]] = []
    t = 1_800_000_000.0
    nid = None
    for i in range(deliveries):
        if i % 50 == 0:
            nid = f"01N{i:023d}"
            out.append(("inject", {"time": t, "tenant_id": "tenant-0", "notification_id": nid}))
        if i % 20_000 == 10_000:
            detail = {"window": f"w{i}", "fault": "dedup-outage", "phase": "start",
                      "unavailable": "dedup"}  # fmt: skip
            out.append(("fault", {"time": t, "detail": json.dumps(detail)}))
        if i % 20_000 == 12_000:
            detail = {"window": f"w{i - 2000}", "fault": "dedup-outage", "phase": "stop"}
            out.append(("fault", {"time": t, "detail": json.dumps(detail)}))
        if i % 1000 == 0:
            sample = {"queue": "push", "depth": rng.randrange(500)}
            out.append(("sample", {"time": t, "detail": json.dumps(sample)}))
        t += 0.001
        status = 429 if rng.random() < 0.01 else 410 if rng.random() < 0.001 else 200
        row = {"received_at": t, "answered_at": t + 0.01, "tenant_id": "tenant-0",
               "notification_id": nid, "token": f"tok{i % 5000}", "provider": "apns",
               "status": status, "delivered": status == 200}  # fmt: skip
        out.append(("provider", row))
        if rng.random() < 0.01:
            out.append(("provider", {**row, "received_at": t + 0.5}))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--deliveries", type=int, default=200_000)
    parser.add_argument("--rate", type=float, default=2000.0, help="deliveries a second")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    if args.deliveries < 1000 or args.rate <= 0:
        print("error: --deliveries must be at least 1000 and --rate positive", file=sys.stderr)
        return 2
    synthetic = rows(args.deliveries, args.seed)

    history = History()
    started = time.process_time()
    for kind, fields in synthetic:
        if kind == "provider":
            history.extend_provider([fields])
        else:
            history.append(kind, **fields)
    append_cpu = time.process_time() - started

    metrics, checks = LiveMetrics("bench", "bench", args.seed), OnlineChecks()
    written = history.rows_since(0)
    batch = max(1, int(args.rate / 2))  # what the view reads every half second
    started = time.process_time()
    for start in range(0, len(written), batch):
        chunk = written[start : start + batch]
        metrics.feed(chunk)
        for violation in checks.feed(chunk, now=float(chunk[-1]["time"])):
            metrics.violation(violation)
    checks.finish()
    live_cpu = time.process_time() - started

    per = 1e6 / args.deliveries
    live_us, append_us = live_cpu * per, append_cpu * per
    core_fraction = live_us * 1e-6 * args.rate
    result = {
        "benchmark": "live",
        "deliveries": args.deliveries,
        "rows": len(written),
        "rate_per_s": args.rate,
        "history_append_cpu_us_per_delivery": round(append_us, 2),
        "live_view_cpu_us_per_delivery": round(live_us, 2),
        "live_over_append": round(live_us / append_us, 3) if append_us else None,
        "live_core_fraction_at_rate": round(core_fraction, 4),
        "under_5_percent_of_a_core": core_fraction < 0.05,
        "live_violations": dict(checks.counts),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
