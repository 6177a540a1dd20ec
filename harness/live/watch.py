"""``python -m harness watch RUN_DIR``: a run's live figures for a person, updated in place.

Reads the run's ``live.json`` for its metrics URL, scrapes it every ``--interval`` seconds
(prometheus_client's own parser) and shows: events injected, deliveries expected and seen,
provider answers by status, queue depths, the faults active now, latency quantiles and the
promises seen broken live. Ends when the run ends (its metrics server goes away, or its
``summary.json`` has a verdict), printing that verdict; ``--once`` prints one frame.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import httpx
from prometheus_client.parser import text_string_to_metric_families

from harness.live.view import LIVE_FILE

Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape(url: str) -> Samples | None:
    """The metrics at ``url`` by sample name, or None when nothing answers there."""
    try:
        text = httpx.get(url, timeout=2).text
    except httpx.HTTPError:
        return None
    samples: Samples = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[sample.name].append((sample.labels, sample.value))
    return samples


def _total(samples: Samples, name: str, **match: str) -> float:
    return sum(
        v
        for labels, v in samples.get(name, [])
        if all(labels.get(k) == w for k, w in match.items())
    )


def _quantile(samples: Samples, q: float) -> float | None:
    """A quantile of the latency histogram (the upper bound of the bucket it falls in)."""
    buckets = sorted(
        (float(labels["le"]), v)
        for labels, v in samples.get("fanout_delivery_latency_seconds_bucket", [])
    )
    if not buckets or buckets[-1][1] == 0:
        return None
    rank = q * buckets[-1][1]
    return next(le for le, count in buckets if count >= rank)


def frame(samples: Samples) -> list[str]:
    """The lines of one screen."""
    by_provider: dict[str, list[str]] = defaultdict(list)
    for labels, v in samples.get("fanout_provider_requests_total", []):
        by_provider[labels.get("provider", "?")].append(f"{labels.get('status')}={v:.0f}")
    active = [lab["fault"] for lab, v in samples.get("fanout_fault_active", []) if v == 1]
    depths = [f"{lab['queue']}={v:.0f}" for lab, v in samples.get("fanout_queue_depth", []) if v]
    violations = [
        f"{lab['check']}={v:.0f}" for lab, v in samples.get("fanout_live_violations_total", []) if v
    ]
    p50, p99 = _quantile(samples, 0.5), _quantile(samples, 0.99)
    run = next(iter(samples.get("fanout_run_info", [])), ({}, 0))[0]
    lines = [
        f"run {run.get('run_id', '?')}  scenario {run.get('scenario', '?')}  seed {run.get('seed', '?')}",
        f"injected   accepted={_total(samples, 'fanout_events_injected_total', outcome='accepted'):.0f}"
        f"  unknown={_total(samples, 'fanout_events_injected_total', outcome='unknown'):.0f}",
        f"deliveries expected={_total(samples, 'fanout_deliveries_expected'):.0f}"
        f"  seen={_total(samples, 'fanout_deliveries_total'):.0f}",
        f"latency    p50<={p50 if p50 is not None else '-'}s  p99<={p99 if p99 is not None else '-'}s",
    ]
    lines += [f"{p:<10} {' '.join(sorted(s))}" for p, s in sorted(by_provider.items())]
    lines.append(f"queues     {' '.join(depths) or '-'}")
    lines.append(f"faults     {' '.join(active) or 'none active'}")
    lines.append(f"LIVE       {' '.join(violations) or 'no promise seen broken'}")
    stopped = [lab["condition"] for lab, v in samples.get("fanout_stop_condition_fired", []) if v]
    if stopped:
        lines.append(f"STOPPED    {', '.join(stopped)}")
    return lines


def watch(
    run_dir: Path,
    out: TextIO = sys.stdout,
    interval_s: float = 1.0,
    once: bool = False,
    sleep: Callable[[float], None] = time.sleep,
    max_frames: int = 100_000,
) -> int:
    """Show the run's figures until it ends; 0, or 2 when ``run_dir`` has no live view."""
    live = run_dir / LIVE_FILE
    if not live.exists():
        print(f"error: {run_dir} has no {LIVE_FILE} (not a run directory, or a run before it)",
              file=sys.stderr)  # fmt: skip
        return 2
    url = json.loads(live.read_text())["metrics_url"]
    tty = bool(getattr(out, "isatty", lambda: False)())
    shown = 0
    for _ in range(max_frames):  # bounded: a frame a second for over a day
        samples = scrape(url)
        verdict = _verdict(run_dir)
        if samples is None or verdict not in (None, "incomplete"):
            break
        lines = frame(samples)
        if tty and shown:
            out.write(f"\033[{shown}F\033[J")  # back over the last frame
        out.write("\n".join(lines) + "\n")
        out.flush()
        shown = len(lines)
        if once:
            return 0
        sleep(interval_s)
    print(f"run ended: verdict {(_verdict(run_dir) or 'not written yet').upper()}", file=out)
    return 0


def _verdict(run_dir: Path) -> str | None:
    try:
        summary: dict[str, Any] = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return summary.get("verdict")


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("watch", help="a running run's live figures, updated in place")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run's directory")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between frames")
    parser.add_argument("--once", action="store_true", help="print one frame and exit")
    parser.set_defaults(func=run_command)


def run_command(args: argparse.Namespace) -> int:
    if not args.interval > 0:
        print(f"error: --interval must be a positive number, not {args.interval}", file=sys.stderr)
        return 2
    return watch(Path(args.run_dir), interval_s=args.interval, once=args.once)
