"""A real Prometheus (Debian's ``prometheus``, which ``make setup`` installs) scrapes a run's
live metrics every second; its HTTP query API then returns the run's own figures: events
injected and deliveries seen as the history recorded them, and the dedup outage's fault window
as 1 only while the window was open."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import httpx
import pandas as pd
import pytest
from conftest import run_cli

from emulators.ports import free_port
from harness.stack.supervisor import wait_until

SCRAPE_S = 1.0


@pytest.fixture
def prometheus(tmp_path: Path):
    """A Prometheus server scraping 127.0.0.1:<port> every second; yields (port, api url)."""
    binary = shutil.which("prometheus")
    assert binary, "prometheus is not installed: run make setup (it installs Debian's package)"
    port, web = free_port(), free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        f"global: {{scrape_interval: {SCRAPE_S:g}s, scrape_timeout: {SCRAPE_S:g}s}}\n"
        "scrape_configs:\n"
        "  - job_name: fanout-drill\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{port}']}}]\n"
    )
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{web}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    api = f"http://127.0.0.1:{web}"

    def ready() -> bool:
        try:
            return httpx.get(f"{api}/-/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(ready, 60, "Prometheus ready")
        yield port, api
    finally:
        proc.terminate()
        proc.wait(30)


def _query(api: str, expr: str, **params) -> list[dict]:
    kind = "query_range" if "start" in params else "query"
    answer = httpx.get(f"{api}/api/v1/{kind}", params={"query": expr, **params}, timeout=10)
    body = answer.json()
    assert body["status"] == "success", body
    return body["data"]["result"]


@pytest.mark.integration
@pytest.mark.wholerun
def test_a_real_prometheus_scrapes_a_run_and_answers_its_figures(prometheus, tmp_path: Path):
    port, api = prometheus
    result = run_cli(
        "run", "memorydb-outage", "--seed", "7", "--out", str(tmp_path / "out"), "--no-report",
        "--metrics-port", str(port), timeout=400,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    (run_dir,) = [p for p in (tmp_path / "out").iterdir() if p.is_dir()]
    assert json.loads((run_dir / "live.json").read_text())["metrics_url"].endswith(
        f":{port}/metrics"
    )
    history = pd.read_parquet(run_dir / "history.parquet")

    injected = int((history["kind"] == "inject").sum())
    scraped = _query(api, 'max_over_time(fanout_events_injected_total{outcome="accepted"}[15m])')
    assert injected > 0 and [float(r["value"][1]) for r in scraped] == [injected]

    provider = history[history["kind"] == "provider"]
    delivered = provider[provider["delivered"].fillna(provider["status"] == 200).astype(bool)]
    by_provider = delivered.drop_duplicates(["tenant_id", "notification_id", "token"])
    expected = by_provider.groupby("provider").size().to_dict()
    scraped = _query(api, "max_over_time(fanout_deliveries_total[15m])")
    assert {r["metric"]["provider"]: int(float(r["value"][1])) for r in scraped} == expected

    faults = [
        (json.loads(d), t)
        for d, t in history.loc[history["kind"] == "fault", ["detail", "time"]].itertuples(
            index=False
        )
    ]
    (start,) = [t for d, t in faults if d["fault"] == "dedup-outage" and d["phase"] == "start"]
    (stop,) = [t for d, t in faults if d["fault"] == "dedup-outage" and d["phase"] == "stop"]
    series = _query(
        api,
        'fanout_fault_active{fault="dedup-outage"}',
        start=start - 20,
        end=stop + 20,
        step=f"{SCRAPE_S:g}s",
    )
    (values,) = [r["values"] for r in series]
    active = [float(t) for t, v in values if float(v) == 1]
    quiet = [float(t) for t, v in values if float(v) == 0]
    assert active, "the window never showed as active"
    # A sample says what the last scrape saw: 1 from the first scrape after the start until
    # the first scrape after the stop (the live view reads the history every half second).
    slack = 2 * SCRAPE_S + 0.5
    assert all(start <= t <= stop + slack for t in active), (start, stop, active)
    assert any(t > stop + slack for t in quiet), "never seen back at 0 after the window"
