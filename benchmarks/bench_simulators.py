"""Provider simulators' throughput: h2load against the APNs and FCM simulators and nghttpd, in
one run, every simulator request checked in the ledger.

    .venv/bin/python benchmarks/bench_simulators.py --out reports/bench/simulators.json
    .venv/bin/python benchmarks/bench_simulators.py --candidates   # each server x 1, 2 processes

Every variant gets the same load: h2load (Debian ``nghttp2-client``), one thread,
``--connections`` HTTP/2 connections in cleartext (h2c, prior knowledge) with up to
``--streams`` concurrent streams each, POSTs of a small APNs (or FCM) success payload over 16
device tokens, a warm-up, a ``POST /_sim/reset``, then ``--requests`` measured. The simulator's
ledger (its Arrow files, read after the flush barrier) must then hold exactly one row per
answered request: a rate whose requests are not all in the ledger is reported as a failure.
CPU per request is the simulator's whole process tree (utime + stime from /proc), which depends
less on what else runs on this shared machine than the rate. nghttpd (``nghttp2-server``)
serving an empty static file to the same load is the comparison point: the ratio says how far
the simulator is from what the machine and h2load can do.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from emulators.ports import LOOPBACK, free_port  # noqa: E402
from emulators.providers.apns_keys import new_signing_key  # noqa: E402
from emulators.providers.ledger_files import LedgerReader  # noqa: E402
from emulators.providers.shared import SharedDir  # noqa: E402

GOAL_APNS_H2C = 50_000
TOKENS = [f"{i:064x}" for i in range(1, 17)]
APNS_BODY = {
    "aps": {"alert": {"title": "New post", "body": "someone you follow posted"}},
    "tenant_id": "t0",
    "notification_id": "n1",
}
FCM_BODY_TEMPLATE = {
    "message": {"token": "", "data": {"tenant_id": "t0", "notification_id": "n1"}},
}
CLK_TCK = os.sysconf("SC_CLK_TCK")
CORES = os.cpu_count() or 1


@dataclass(frozen=True)
class Variant:
    provider: str
    server: str
    processes: int

    @property
    def name(self) -> str:
        return f"{self.provider} {self.server} x{self.processes}"


def default_variants(fast_processes: int) -> list[Variant]:
    return [
        Variant("apns", "h2", 1),
        Variant("apns", "granian", fast_processes),
        Variant("fcm", "h2", 1),
        Variant("fcm", "granian", fast_processes),
    ]


def candidate_variants() -> list[Variant]:
    return [
        Variant(provider, server, n)
        for provider in ("apns", "fcm")
        for server in ("h2", "granian")
        for n in (1, 2)
    ]


# -- process CPU ------------------------------------------------------------------------------
def _children_of() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry))
    return tree


def tree_cpu_seconds(root_pid: int) -> float:
    """utime + stime of ``root_pid`` and every live descendant."""
    tree = _children_of()
    total = 0.0
    todo = [root_pid]
    while todo:
        pid = todo.pop()
        todo += tree.get(pid, [])
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / CLK_TCK
    return total


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# -- h2load ---------------------------------------------------------------------------------------
_FINISHED = re.compile(r"finished in ([\d.]+)(m?s), ([\d.]+) req/s")
_REQUESTS = re.compile(
    r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, "
    r"(\d+) errored, (\d+) timeout"
)


def parse_h2load(output: str) -> dict[str, Any]:
    """The figures of one h2load run (raises ValueError when its summary is missing)."""
    finished = _FINISHED.search(output)
    requests = _REQUESTS.search(output)
    if not finished or not requests:
        raise ValueError(f"no h2load summary in:\n{output[-2000:]}")
    seconds = float(finished.group(1)) / (1000 if finished.group(2) == "ms" else 1)
    total, started, done, succeeded, failed, errored, timeout = map(int, requests.groups())
    return {
        "seconds": seconds,
        "rate": float(finished.group(3)),
        "requests": total,
        "done": done,
        "succeeded": succeeded,
        "failed": failed,
        "errored": errored,
        "timeout": timeout,
    }


def h2load(
    urls: list[str], body: Path, headers: list[str], requests: int, connections: int, streams: int
) -> dict[str, Any]:
    argv = ["h2load", "-n", str(requests), "-c", str(connections), "-m", str(streams), "-t", "1"]
    argv += ["-d", str(body)]
    for header in headers:
        argv += ["-H", header]
    before = children_cpu_seconds()
    proc = subprocess.run(argv + urls, capture_output=True, text=True, timeout=900)
    result = parse_h2load(proc.stdout)
    result["h2load_cpu_s"] = round(children_cpu_seconds() - before, 3)
    return result


# -- servers ---------------------------------------------------------------------------------------
def start_simulator(variant: Variant, port: int, state_dir: Path) -> subprocess.Popen[str]:
    argv = [
        sys.executable, "-m", f"emulators.providers.{variant.provider}",
        "--host", LOOPBACK, "--port", str(port), "--processes", str(variant.processes),
        "--server", variant.server, "--state-dir", str(state_dir),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()  # the simulator's own start timeout bounds this
    if "listening on" not in line:
        stop(proc)
        raise RuntimeError(f"{variant.name} did not start: {line!r}")
    return proc


def stop(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
    if proc.stdout is not None:
        proc.stdout.close()


def load_for(provider: str, base: str, tmp: Path) -> tuple[list[str], Path, list[str]]:
    if provider == "apns":
        body = tmp / "apns.json"
        body.write_text(json.dumps(APNS_BODY))
        urls = [f"{base}/3/device/{t}" for t in TOKENS]
        # Apple's token authentication, as every push is checked: a key registered once, one
        # provider token for the whole load (it survives the reset before the measurement).
        key = new_signing_key(key_id="BENCHKEY01")
        registration = json.dumps(key.registration(["com.example.app"])).encode()
        urllib.request.urlopen(
            urllib.request.Request(f"{base}/_sim/apns/keys", data=registration, method="PUT"),
            timeout=10,
        ).close()
        auth = f"authorization: bearer {key.provider_token()}"
        return urls, body, ["apns-topic: com.example.app", "apns-push-type: alert", auth]
    body = tmp / "fcm.json"
    message = json.loads(json.dumps(FCM_BODY_TEMPLATE))
    message["message"]["token"] = TOKENS[0]
    body.write_text(json.dumps(message))
    urls = [f"{base}/v1/projects/p{i % 2}/messages:send" for i in range(len(TOKENS))]
    return urls, body, ["content-type: application/json"]


def ledger_rows(state_dir: Path) -> tuple[int, int]:
    """(rows, rows with status 200) in the current ledger epoch, after the flush barrier."""
    shared = SharedDir(state_dir)
    try:
        if not shared.wait_flushed(timeout=10):
            raise RuntimeError("a simulator process did not flush its ledger")
        reader = LedgerReader(state_dir, shared)
        table = reader.read_new()
        statuses = table.column("status").to_pylist()
        return table.num_rows, statuses.count(200)
    finally:
        shared.close()


def run_variant(variant: Variant, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    port = free_port()
    state_dir = tmp / f"state-{variant.provider}-{variant.server}-{variant.processes}"
    proc = start_simulator(variant, port, state_dir)
    base = f"http://{LOOPBACK}:{port}"
    try:
        urls, body, headers = load_for(variant.provider, base, tmp)
        h2load(urls, body, headers, args.warmup, args.connections, args.streams)
        urllib.request.urlopen(
            urllib.request.Request(f"{base}/_sim/reset", method="POST"), timeout=10
        ).read()
        requests = args.requests if variant.server == "granian" else args.requests_h2
        cpu_before = tree_cpu_seconds(proc.pid)
        result = h2load(urls, body, headers, requests, args.connections, args.streams)
        cpu = tree_cpu_seconds(proc.pid) - cpu_before
        rows, ok_rows = ledger_rows(state_dir)
    finally:
        stop(proc)
    answered = result["succeeded"]
    h2load_us = result["h2load_cpu_s"] / answered * 1e6 if answered else None
    result.update(
        name=variant.name,
        provider=variant.provider,
        server=variant.server,
        processes=variant.processes,
        simulator_cpu_s=round(cpu, 3),
        cpu_us_per_request=round(cpu / answered * 1e6, 1) if answered else None,
        h2load_cpu_us_per_request=round(h2load_us, 1) if h2load_us else None,
        # what the machine's cores would give if the simulator and h2load had them to
        # themselves: a ceiling derived from CPU per request, not a measured rate
        cpu_bound_rate=round(CORES * 1e6 / (cpu / answered * 1e6 + h2load_us))
        if answered and h2load_us
        else None,
        ledger_rows=rows,
        ledger_ok=rows == answered == ok_rows == requests,
    )
    return result


def run_nghttpd(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """nghttpd answering the APNs paths with an empty static file (one worker thread)."""
    www = tmp / "www" / "3" / "device"
    www.mkdir(parents=True)
    for token in TOKENS:
        (www / token).write_bytes(b"")
    port = free_port()
    proc = subprocess.Popen(
        ["nghttpd", "--no-tls", "-d", str(tmp / "www"), "-a", LOOPBACK, str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        base = f"http://{LOOPBACK}:{port}"
        deadline = time.monotonic() + 10
        while True:  # wait for the port, bounded
            try:
                socket.create_connection((LOOPBACK, port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("nghttpd did not start") from None
                time.sleep(0.05)
        urls, body, headers = load_for("apns", base, tmp)
        h2load(urls, body, headers, args.warmup, args.connections, args.streams)
        cpu_before = tree_cpu_seconds(proc.pid)
        result = h2load(urls, body, headers, args.requests, args.connections, args.streams)
        cpu = tree_cpu_seconds(proc.pid) - cpu_before
    finally:
        stop(proc)
    result.update(
        name="nghttpd (static file)",
        server_cpu_s=round(cpu, 3),
        cpu_us_per_request=round(cpu / result["succeeded"] * 1e6, 2)
        if result["succeeded"]
        else None,
    )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "reports" / "bench" / "simulators.json"))
    parser.add_argument("--requests", type=int, default=200_000, help="granian and nghttpd")
    parser.add_argument("--requests-h2", type=int, default=40_000, help="our h2 server")
    parser.add_argument("--warmup", type=int, default=5_000)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--streams", type=int, default=100)
    parser.add_argument("--fast-processes", type=int, default=2, help="granian workers")
    parser.add_argument("--candidates", action="store_true", help="each server x 1, 2 processes")
    parser.add_argument(
        "--only", default="", help="run the variants whose name contains this (e.g. 'apns granian')"
    )
    args = parser.parse_args(argv)
    for tool, package in (("h2load", "nghttp2-client"), ("nghttpd", "nghttp2-server")):
        if not shutil.which(tool):
            print(f"error: {tool} is not installed (apt-get install {package})", file=sys.stderr)
            return 2
    if min(args.requests, args.requests_h2, args.connections, args.streams) < 1:
        print("error: --requests, --connections and --streams must be >= 1", file=sys.stderr)
        return 2
    variants = candidate_variants() if args.candidates else default_variants(args.fast_processes)
    variants = [v for v in variants if args.only in v.name]
    if not variants:
        print(f"error: no variant's name contains {args.only!r}", file=sys.stderr)
        return 2
    results: dict[str, Any] = {
        "benchmark": "provider simulators",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "load": f"h2load, 1 thread, {args.connections} h2c connections x {args.streams} "
        f"streams, {args.warmup} warm-up requests, then {args.requests} (granian, nghttpd) or "
        f"{args.requests_h2} (h2) measured; {len(TOKENS)} device tokens",
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "runs": [],
    }
    with tempfile.TemporaryDirectory(prefix="bench-sims-") as tmp_name:
        tmp = Path(tmp_name)
        nghttpd = run_nghttpd(args, tmp)
        results["nghttpd"] = nghttpd
        print(f"nghttpd: {nghttpd['rate']:,.0f} req/s, {nghttpd['cpu_us_per_request']} µs/req")
        for variant in variants:
            run = run_variant(variant, args, tmp)
            run["ratio_to_nghttpd"] = round(run["rate"] / nghttpd["rate"], 3)
            results["runs"].append(run)
            print(
                f"{variant.name}: {run['rate']:,.0f} req/s, {run['cpu_us_per_request']} µs CPU/req "
                f"(h2load {run['h2load_cpu_us_per_request']}; cores' ceiling "
                f"{run['cpu_bound_rate'] or 0:,} req/s), "
                f"ledger {run['ledger_rows']} rows ({'ok' if run['ledger_ok'] else 'MISMATCH'}), "
                f"{run['ratio_to_nghttpd']:.3f} of nghttpd",
                flush=True,
            )
    results["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    apns = [r for r in results["runs"] if r["provider"] == "apns" and r["ledger_ok"]]
    best = max(apns, key=lambda r: r["rate"]) if apns else None
    results["apns_h2c_best"] = (
        {"name": best["name"], "rate": best["rate"], "goal": GOAL_APNS_H2C} if best else None
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")
    return 0 if all(r["ledger_ok"] for r in results["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
