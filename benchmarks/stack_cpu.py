"""Where a stack's CPU goes: each part's CPU seconds sampled over a run (a part is its whole
process group: the forked workers of a part count with it), and py-spy profiles of the Python
parts summarised by package. Used by ``bench_locust.py``.

A part's CPU is the sum over the live processes of its group (user + system) plus what its
reaped children spent (``cutime`` + ``cstime``): a forked worker counts while it runs and after
it has been waited for, never twice.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def group_cpu_seconds(pgids: Sequence[int]) -> dict[int, float]:
    """CPU seconds of each process group in ``pgids`` (one pass over /proc)."""
    return {pgid: cpu for pgid, (cpu, _) in group_usage(pgids).items()}


_PAGE = os.sysconf("SC_PAGE_SIZE")


def group_usage(pgids: Sequence[int]) -> dict[int, tuple[float, int]]:
    """(CPU seconds, resident bytes) of each process group in ``pgids`` (one pass over /proc):
    its live processes' user and system time plus what their reaped children spent, and their
    resident memory summed."""
    wanted = set(pgids)
    totals = {pgid: (0.0, 0) for pgid in pgids}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is None:
            continue
        pgrp = int(fields[2])
        if pgrp in wanted:
            cpu, rss = totals[pgrp]
            # stat fields after the name: utime..cstime are 11-14, rss (pages) is 21
            totals[pgrp] = (
                cpu + sum(int(f) for f in fields[11:15]) / _TICKS,
                rss + int(fields[21]) * _PAGE,
            )
    return totals


@dataclass
class CpuTimeline:
    """Samples every ``interval`` s: (epoch time, {part: CPU seconds so far}) for the parts
    ``parts()`` names (part -> process group id); ``self`` is this process (the harness)."""

    parts: Callable[[], Mapping[str, int]]
    interval: float = 1.0
    samples: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def sample(self) -> None:
        parts = dict(self.parts())
        cpu = group_cpu_seconds(list(parts.values()))
        values = {part: cpu[pgid] for part, pgid in parts.items()}
        usage = os.times()
        values["harness"] = usage.user + usage.system
        self.samples.append((time.time(), values))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="cpu-timeline", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sample()
            except Exception:  # a part that went away between listing and reading: next time
                continue

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)


def cpu_between(
    samples: Sequence[tuple[float, Mapping[str, float]]], start: float, end: float
) -> dict[str, float]:
    """CPU seconds each part spent between the last sample at or before ``start`` and the first
    at or after ``end`` (the window widened to whole samples). A part that was not sampled at
    both ends (stopped, restarted) counts from its first to its last sample inside."""
    if not samples:
        return {}
    before = [s for s in samples if s[0] <= start] or [samples[0]]
    after = [s for s in samples if s[0] >= end] or [samples[-1]]
    first, last = before[-1], after[0]
    inside = [s for s in samples if first[0] <= s[0] <= last[0]]
    out: dict[str, float] = {}
    for part in {p for _, values in inside for p in values}:
        seen = [values[part] for _, values in inside if part in values]
        out[part] = max(0.0, seen[-1] - seen[0])
    return out


def timeline_rows(
    samples: Sequence[tuple[float, Mapping[str, float]]],
    deliveries: Sequence[float],
    start: float,
    bucket_s: float = 10.0,
) -> list[dict[str, object]]:
    """Per ``bucket_s`` from ``start``: deliveries/s and each part's cores (CPU s per s)."""
    rows: list[dict[str, object]] = []
    if not samples:
        return rows
    end = max([*deliveries, start]) if deliveries else start
    counts = Counter(int((t - start) // bucket_s) for t in deliveries if t >= start)
    n = 0
    while start + n * bucket_s <= end and n < 10_000:
        lo, hi = start + n * bucket_s, start + (n + 1) * bucket_s
        cpu = cpu_between(samples, lo, hi)
        rows.append(
            {
                "t_s": round(n * bucket_s),
                "deliveries_per_s": round(counts.get(n, 0) / bucket_s, 1),
                "cores": {p: round(v / bucket_s, 2) for p, v in sorted(cpu.items()) if v > 0},
            }
        )
        n += 1
    return rows


# -- py-spy --------------------------------------------------------------------------------

# Packages a profile is broken down by: a sample counts for each package one of its frames is
# in (inclusive time), so the shares of nested packages (httpx over h2) may add up past 100%.
PACKAGES = (
    "botocore",
    "boto3",
    "urllib3",
    "httpx",
    "httpcore",
    "h2",
    "hpack",
    "redis",
    "cryptography",
    "json",
    "logging",
    "ssl",
    "http",
    "socket",
    "asyncio",
    "aiohttp",
    "uuid",
    "reference_impl",
    "emulators",
    "chaos",
    "moto",
    "werkzeug",
    "uvicorn",
)
_FRAME = re.compile(r"\(([^()]*?):\d+\)$")


def _package_of(path: str) -> str | None:
    """The top package of a frame's file: py-spy names files relative to their ``sys.path``
    entry (``botocore/auth.py``, ``http/client.py``), or in full where none applies."""
    parts = path.replace("\\", "/").split("/")
    if "site-packages" in parts:
        parts = parts[parts.index("site-packages") + 1 :]
    elif path.startswith("/"):
        return None
    return parts[0].removesuffix(".py") if parts and parts[0] else None


def summarise_collapsed(lines: Sequence[str], top: int = 25) -> dict[str, object]:
    """A py-spy ``raw`` (collapsed stacks) profile: samples, the share of samples in each
    package of :data:`PACKAGES` (inclusive), and the functions with the most self samples."""
    total = 0
    in_package: Counter[str] = Counter()
    self_time: Counter[str] = Counter()
    for line in lines:
        stack, _, count_text = line.rstrip("\n").rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = stack.split(";")[1:]  # the first is the thread
        packages = set()
        for frame in frames:
            match = _FRAME.search(frame)
            if match:
                package = _package_of(match.group(1))
                if package:
                    packages.add(package)
        for package in packages & set(PACKAGES):
            in_package[package] += count
        if frames:
            self_time[frames[-1]] += count
    return {
        "samples": total,
        "share_by_package": {p: round(n / total, 3) for p, n in in_package.most_common() if total},
        "top_self": [
            {"frame": f, "share": round(n / total, 3)} for f, n in self_time.most_common(top)
        ]
        if total
        else [],
    }


def py_spy() -> str:
    """The py-spy beside this interpreter (the venv's), else the one on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy") or "py-spy"


class Profiles:
    """py-spy recording each of the named processes (and their subprocesses) until
    :meth:`stop`. Sampling pauses the process for each sample (py-spy's default): without the
    pause, samples land on stale frames and idle threads count as busy."""

    def __init__(self, out: Path, rate: int = 50) -> None:
        self.out = out
        self.rate = rate
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, pids: Mapping[str, int], alone: Sequence[str] = ()) -> None:
        """``alone``: the parts recorded without their subprocesses."""
        self.out.mkdir(parents=True, exist_ok=True)
        for part, pid in pids.items():
            path = self.out / f"{part}.txt"
            children = [] if part in alone else ["--subprocesses"]
            argv = [py_spy(), "record", "--pid", str(pid), *children, "--rate", str(self.rate)]
            self.procs[part] = subprocess.Popen(
                [*argv, "--format", "raw", "--output", str(path)],
                stdout=subprocess.DEVNULL,
                stderr=open(self.out / f"{part}.log", "wb"),  # noqa: SIM115 - closed with proc
            )

    def stop(self) -> dict[str, object]:
        """Stop every recorder (SIGINT: py-spy writes its file) and summarise each profile."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        summary: dict[str, object] = {}
        for part, proc in self.procs.items():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
            path = self.out / f"{part}.txt"
            if path.exists():
                summary[part] = summarise_collapsed(path.read_text().splitlines())
        self.procs.clear()
        return summary
