"""Each Locust load shape, run for a few seconds against the real local stack, produces the
load its plan describes: user counts over time (Locust's own stats history), event times and
celebrity claims (what the users recorded as injected).
"""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pytest
from conftest import ROOT

from harness.load.loader import load_population
from harness.model.population import PopulationSpec, generate
from harness.model.shapes import LoadPlan, celebrity_post_times
from harness.run.runner import read_injected

pytestmark = [pytest.mark.integration, pytest.mark.wholerun]

SPEC = PopulationSpec(users_per_tenant=40, celebrity_followers=20, regular_followers=5)


@pytest.fixture(scope="module")
def population_file(stack, tmp_path_factory) -> Path:
    population = generate(5, datetime.now(UTC), SPEC)
    path = tmp_path_factory.mktemp("population") / "population.json"
    population.save(path)
    load_population(stack.info.url("event-api"), population)
    return path


def _loadgen(stack, population_file: Path, out: Path, shape: str, plan: dict, *extra: str):
    result = _run_loadgen(stack, population_file, out, shape, plan, *extra)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((out / "locust_summary.json").read_text())
    rows = pd.DataFrame(read_injected(out / "injected.jsonl"))
    if len(rows):
        rows["offset"] = rows["time"] - summary["load_started_at"]
    return summary, rows


def _run_loadgen(
    stack, population_file: Path, out: Path, shape: str, plan: dict, *extra: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.load.loadgen",
            "--locustfile",
            shape,
            "--host",
            stack.info.url("event-api"),
            "--population",
            str(population_file),
            "--plan",
            json.dumps(plan),
            "--out",
            str(out),
            "--progress-s",
            "1",
            *extra,
        ],  # fmt: skip
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )


def _user_counts(out: Path) -> pd.Series:
    history = pd.read_csv(out / "locust_stats_history.csv")
    history = history[history["Name"] == "Aggregated"]
    return history.set_index("Timestamp")["User Count"]


def test_steady_state_holds_its_users_and_paces_its_authors(stack, population_file, tmp_path):
    plan = {"duration_s": 6, "background_users": 6, "author_rate": 1.0}
    summary, rows = _loadgen(stack, population_file, tmp_path, "steady_state", plan)
    assert summary["outcome"] == "complete" and summary["failures"] == 0
    counts = _user_counts(tmp_path)
    assert counts.max() == 6
    # Authors are 4/9 of the background by weight: 2 or 3 users at 1 event/s for ~6 s.
    authors = rows[rows["user_class"] == "Author"]
    assert 6 <= len(authors) <= 3 * 7
    assert (rows["offset"] < plan["duration_s"] + 1).all()
    # Readers and preference savers ran too: the read path carries load during the run.
    names = set(summary["by_name"])
    assert {"POST /v1/events", "GET inbox"} <= names


def test_celebrity_burst_posts_inside_the_burst_window(stack, population_file, tmp_path):
    plan = {
        "duration_s": 7, "background_users": 2, "celebrities": 2,
        "burst_at_s": 2, "burst_window_s": 3,
    }  # fmt: skip
    summary, rows = _loadgen(stack, population_file, tmp_path, "celebrity_burst", plan)
    celebrity = rows[rows["user_class"] == "CelebrityPoster"]
    assert len(celebrity) == 2
    # Each celebrity is a different author (two tenants' celebrities), each posted once.
    assert celebrity[["tenant_id", "author_id"]].drop_duplicates().shape[0] == 2
    expected = sorted(t for user in celebrity_post_times(LoadPlan.from_mapping(plan)) for t in user)
    assert sorted(celebrity["offset"]) == pytest.approx(expected, abs=1.0)
    assert _user_counts(tmp_path).max() == 4


def test_like_storm_injects_its_likes_in_the_window(stack, population_file, tmp_path):
    plan = {"likes": 30, "burst_at_s": 1, "burst_window_s": 3, "duration_s": 5,
            "background_users": 1}  # fmt: skip
    summary, rows = _loadgen(stack, population_file, tmp_path, "like_storm", plan)
    likes = rows[rows["user_class"] == "LikeStorm"]
    assert len(likes) == 30 and (likes["kind"] == "like").all()
    assert likes["offset"].min() >= 1 - 0.5 and likes["offset"].max() <= 4 + 1.0
    # Fairly even: no second of the window holds more than half of the storm.
    assert likes["offset"].round().value_counts().max() <= 15


def test_a_load_with_a_start_instant_waits_for_it_and_counts_its_plan_from_it(
    stack, population_file, tmp_path
):
    """day-boundary places the system's midnight at_s into the load: Locust, started at once,
    waits for the instant the harness fixed, so its own start-up cannot shift the storm."""
    start_at = time.time() + 6.0
    plan = {"likes": 6, "burst_at_s": 1, "burst_window_s": 2, "duration_s": 4,
            "background_users": 1}  # fmt: skip
    summary, rows = _loadgen(
        stack, population_file, tmp_path, "like_storm", plan, "--start-at", str(start_at)
    )
    assert summary["load_started_at"] >= start_at
    likes = rows[rows["user_class"] == "LikeStorm"]
    assert len(likes) == 6 and (likes["time"] >= start_at + 1 - 0.5).all()


def test_game_day_grows_the_readers_after_the_burst(stack, population_file, tmp_path):
    plan = {
        "duration_s": 8, "background_users": 3, "celebrities": 1, "burst_at_s": 1,
        "burst_window_s": 2, "after_burst_factor": 2,
    }  # fmt: skip
    _, rows = _loadgen(stack, population_file, tmp_path, "game_day", plan)
    counts = _user_counts(tmp_path)
    assert counts.max() == 1 + 6
    assert (counts == 1 + 3).any(), counts.tolist()
    assert (rows["user_class"] == "CelebrityPoster").sum() == 1


def test_distributed_workers_claim_distinct_celebrities(stack, population_file, tmp_path):
    plan = {
        "duration_s": 6, "background_users": 2, "celebrities": 2, "burst_at_s": 1,
        "burst_window_s": 2,
    }  # fmt: skip
    summary, rows = _loadgen(
        stack, population_file, tmp_path, "celebrity_burst", plan, "--workers", "2"
    )
    assert summary["workers"] == 2 and summary["outcome"] == "complete"
    celebrity = rows[rows["user_class"] == "CelebrityPoster"]
    # Relayed from the workers to the master's file, one post per claimed celebrity.
    assert len(celebrity) == 2
    assert celebrity[["tenant_id", "author_id"]].drop_duplicates().shape[0] == 2


RAISING_LOCUSTFILE = """
from locust import task

from harness.load import users

users.install()


class CelebrityPoster(users.CelebrityPoster):
    @task
    def post(self) -> None:
        raise AttributeError("planted: 'CelebrityPoster' object has no attribute 'pause_until'")


class Shape(users.PlanShape):
    pass
"""


def test_a_user_that_raises_fails_the_load_instead_of_passing_a_load_that_never_ran(
    stack, population_file, tmp_path
):
    """Locust logs a task's exception and carries on: a celebrity that cannot post would leave
    a burst-free run to pass. The load generator exits 1 naming what the users raised."""
    locustfile = tmp_path / "raising.py"
    locustfile.write_text(RAISING_LOCUSTFILE)
    plan = {
        "shape": "celebrity_burst", "duration_s": 3, "background_users": 1, "celebrities": 1,
        "burst_at_s": 1, "burst_window_s": 1,
    }  # fmt: skip
    result = _run_loadgen(stack, population_file, tmp_path / "out", str(locustfile), plan)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "locust: error: a user raised planted:" in result.stdout, result.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "locust_summary.json").read_text())
    assert summary["exceptions"] and "pause_until" in summary["exceptions"][0]["msg"]


def test_plain_locust_runs_the_same_locustfile(stack, population_file, tmp_path):
    plan = json.dumps(
        {"shape": "steady_state", "duration_s": 4, "background_users": 3, "author_rate": 1.0}
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "locust",
            "-f",
            "locustfiles/fanout.py",
            "--headless",
            "--host",
            stack.info.url("event-api"),
            "--harness-population",
            str(population_file),
            "--harness-plan",
            plan,
            "--harness-out",
            str(tmp_path),
            "--csv",
            str(tmp_path / "plain"),
            "--only-summary",
        ],  # fmt: skip
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    rows = read_injected(tmp_path / "injected.jsonl")
    assert rows and all(r["kind"] in ("post", "like", "comment", "mention") for r in rows)
    assert (tmp_path / "plain_stats.csv").exists()


def test_a_bad_plan_is_a_clear_error(stack, population_file, tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.load.loadgen",
            "--locustfile",
            "steady_state",
            "--host",
            stack.info.url("event-api"),
            "--population",
            str(population_file),
            "--plan",
            '{"duration_s": -1}',
            "--out",
            str(tmp_path),
        ],  # fmt: skip
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "duration_s must be positive" in result.stderr


class _OtlpReceiver(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP collector's receiving end: keeps each export's body by path."""

    received: dict[str, list[bytes]]

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.received.setdefault(self.path, []).append(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_otel_exports_locusts_own_metrics_from_the_master_and_its_workers(
    stack, population_file, tmp_path, monkeypatch
):
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceRequest,
    )

    received: dict[str, list[bytes]] = {}
    handler = type("Receiver", (_OtlpReceiver,), {"received": received})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "1000")
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_PROTOCOL", raising=False)  # HTTP by default
    plan = {"duration_s": 5, "background_users": 2, "celebrities": 1, "burst_at_s": 1,
            "burst_window_s": 2}  # fmt: skip
    try:
        summary, _ = _loadgen(
            stack, population_file, tmp_path, "celebrity_burst", plan, "--workers", "1", "--otel"
        )
    finally:
        server.shutdown()
    assert summary["outcome"] == "complete"
    names = set()
    for body in received.get("/v1/metrics", []):
        request = ExportMetricsServiceRequest.FromString(body)
        names |= {
            metric.name
            for resource in request.resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
        }
    # The users' requests are timed where they run (the worker); users counted by the master.
    assert {"locust.client.duration", "locust.users.count"} <= names, sorted(received)
