"""Population at scale: a celebrity with 1,000,000 followers generated and loaded through the
reference's public bulk paths, timed, then spot-checked through the same API a client uses.

    .venv/bin/python benchmarks/bench_population.py --out reports/bench/population.json
    .venv/bin/python benchmarks/bench_population.py --followers 100000   # a quicker look
    .venv/bin/python benchmarks/bench_population.py --audit   # with the audit trail configured

``--audit`` adds moto (S3) so the reference has its audit bucket: the Event API then makes each
registered user's audit data key as it stores them (reference_impl/audit_keys.py).

The seed sizes a celebrity burst by the ~20% of followers who have push enabled: the other 80%
follow and read but registered nothing the delivery path reads, so they cost one id in a
follower page and nothing else (``push_enabled_fraction``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from stack_cpu import group_cpu_seconds

from harness.load.loader import load_population
from harness.model.population import PopulationSpec, generate
from harness.stack.supervisor import Stack

ROOT = Path(__file__).resolve().parent.parent
# The seed's production shape: pages of 1,000, the 10,000-follower threshold; the API served
# by two processes (two concurrent Lambda instances: one Python process is one core at most).
REFERENCE = {
    "follower_page_size": 1000,
    "pages_per_walk": 10,
    "celebrity_threshold": 10_000,
    "event_api_processes": 2,
}


def _count_items(ddb: Any, table: str) -> int:
    """The table's items, by a paginated Scan that returns only counts."""
    pages = ddb.get_paginator("scan").paginate(TableName=table, Select="COUNT")
    return sum(page["Count"] for page in pages)


def bench_population(
    followers: int, push_enabled: float, seed: int, audit: bool = False
) -> dict[str, object]:
    spec = PopulationSpec(
        tenants=1,
        users_per_tenant=followers + 1,
        celebrity_followers=followers,
        push_enabled_fraction=push_enabled,
    )
    with tempfile.TemporaryDirectory() as tmp:
        parts = ("redis", "dynamodb", "kinesis", "sqs", "event-api") + (("aws",) if audit else ())
        with Stack(Path(tmp) / "stack", parts=parts, reference_overrides=REFERENCE) as stack:
            started = time.perf_counter()
            population = generate(seed, datetime.now(UTC), spec)
            generated = time.perf_counter()
            last = [0.0]

            def progress(done: int, total: int) -> None:
                now = time.perf_counter()
                if now - last[0] >= 5 or done == total:
                    print(f"  load {done:,}/{total:,} calls", flush=True)
                    last[0] = now

            api = stack.info.url("event-api")
            groups = {part: proc.pid for part, proc in stack.procs.items()}
            cpu_before = group_cpu_seconds(list(groups.values()))
            calls = load_population(api, population, progress=progress)
            loaded = time.perf_counter()
            cpu_after = group_cpu_seconds(list(groups.values()))
            load_cpu = {
                part: round(cpu_after[pgid] - cpu_before[pgid], 1)
                for part, pgid in sorted(groups.items())
            }

            celebrity = next(a for a in population.authors if a.celebrity)
            rng = random.Random(seed)
            sample = rng.sample(celebrity.followers, 200)
            with httpx.Client(base_url=api, timeout=30) as http:
                # Each sampled follower's unread count merges the celebrity's (empty) posts:
                # a 200 proves the read side found them without a per-edge reverse index.
                for user in sample[:20]:
                    http.get(f"/v1/tenants/{celebrity.tenant_id}/users/{user}/unread-count")
            from reference_impl.follower_pages import FollowerPages

            pages = FollowerPages.from_config(
                stack.reference_config(), stack.info.aws_client("dynamodb")
            )
            stored = pages.count(celebrity.tenant_id, celebrity.user_id)
            found = sum(pages.follows(celebrity.tenant_id, celebrity.user_id, u) for u in sample)
            audit_keys = _count_items(
                stack.info.aws_client("dynamodb"), stack.reference_config().table("audit_keys")
            )
            keys, after, page_count = None, None, 0
            while True:
                keys, after = pages.page_keys(celebrity.tenant_id, celebrity.user_id, after, 1000)
                page_count += len(keys)
                if after is None:
                    break
    generate_s = generated - started
    load_s = loaded - generated
    return {
        "followers": followers,
        "push_enabled_fraction": push_enabled,
        "with_audit_bucket": audit,
        "audit_keys_stored": audit_keys,
        "users_with_records": len(population.users),
        "devices": len(population.devices),
        "generate_seconds": round(generate_s, 1),
        "load_seconds": round(load_s, 1),
        "generate_and_load_seconds": round(generate_s + load_s, 1),
        "under_60s": generate_s + load_s < 60,
        # Each part's CPU (its whole process group) while the population loaded.
        "load_cpu_seconds": load_cpu,
        "api_calls": calls,
        "follower_count_stored": stored,
        "follower_pages_stored": page_count,
        "sampled_followers_found": f"{found}/{len(sample)}",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "reports" / "bench" / "population.json"))
    parser.add_argument("--followers", type=int, default=1_000_000)
    parser.add_argument("--push-enabled", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--audit",
        action="store_true",
        help="with the audit bucket (moto): registration makes every user's audit key",
    )
    args = parser.parse_args(argv)
    print(f"== population: a celebrity with {args.followers:,} followers", flush=True)
    results: dict[str, object] = {
        "benchmark": "population",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "seed": args.seed,
        **bench_population(args.followers, args.push_enabled, args.seed, args.audit),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    print(f"wrote {out}")
    return 0 if results["follower_count_stored"] == args.followers else 1


if __name__ == "__main__":
    sys.exit(main())
