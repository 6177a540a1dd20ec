"""The live view over a history written by hand: its metrics served over HTTP in Prometheus's
text format (read back with prometheus_client's own parser), a violation recorded as a ``live``
row once, and a stop condition calling for the drill's end with its first evidence."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.live.metrics import METRIC_NAMES, LiveMetrics
from harness.live.online import OnlineChecks
from harness.live.stop import parse_stop_condition
from harness.live.view import LIVE_FILE, SAFETY_LEVER, LiveView, Stop
from harness.model.history import History
from harness.run.runner import RunInterrupted, interruptible
from harness.stack.supervisor import wait_until


def _samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(url, timeout=5).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _send(history: History, at: float, nid: str, token: str = "t1", status: int = 200) -> None:
    history.extend_provider(
        [
            {
                "received_at": at,
                "tenant_id": "acme",
                "notification_id": nid,
                "token": token,
                "provider": "fcm",
                "status": status,
            }
        ]
    )


def _fault(history: History, phase: str, at: float) -> None:
    detail = {"window": "w1", "fault": "dedup-outage", "phase": phase, "unavailable": "dedup"}
    history.append("fault", time=at, detail=json.dumps(detail))


def test_the_metrics_are_served_as_the_history_grows(tmp_path: Path):
    history = History()
    view = LiveView(history, tmp_path, LiveMetrics("r1", "smoke", 7), OnlineChecks(), say=print)
    url = view.start()
    try:
        assert json.loads((tmp_path / LIVE_FILE).read_text())["metrics_url"] == url
        history.append("inject", time=100.0, tenant_id="acme", notification_id="n1")
        history.append("inject_info", time=100.5, tenant_id="acme")
        _send(history, 101.5, "n1")
        _send(history, 101.6, "n1", token="t2", status=429)
        _fault(history, "start", 102.0)
        history.append("sample", detail=json.dumps({"queue": "push", "depth": 42}))
        view.step()
        samples = _samples(url)
        assert samples[("fanout_events_injected_total", (("outcome", "accepted"),))] == 1
        assert samples[("fanout_events_injected_total", (("outcome", "unknown"),))] == 1
        assert samples[("fanout_deliveries_total", (("provider", "fcm"),))] == 1
        requests = "fanout_provider_requests_total"
        assert samples[(requests, (("provider", "fcm"), ("status", "429")))] == 1
        assert samples[("fanout_fault_active", (("fault", "dedup-outage"),))] == 1
        assert samples[("fanout_queue_depth", (("queue", "push"),))] == 42
        assert samples[("fanout_delivery_latency_seconds_count", ())] == 1
        assert samples[("fanout_delivery_latency_seconds_sum", ())] == 1.5
        _fault(history, "stop", 110.0)
        view.step()
        assert _samples(url)[("fanout_fault_active", (("fault", "dedup-outage"),))] == 0
        served = {name for name, _ in _samples(url)}
        for name in METRIC_NAMES:  # every documented metric is served (the Grafana board's)
            if name == "fanout_stop_condition_fired":
                continue  # labelled by a condition: no sample until one fires
            assert any(s == name or s.startswith(name + "_") for s in served), name
    finally:
        view.finish()
    try:
        httpx.get(url, timeout=2)
        raise AssertionError("the metrics server outlived the run")
    except httpx.HTTPError:
        pass


def test_a_violation_is_recorded_once_and_a_stop_condition_ends_the_drill(tmp_path: Path):
    history = History()
    stops: list[Stop] = []
    view = LiveView(
        history,
        tmp_path,
        LiveMetrics(),
        OnlineChecks(),
        [parse_stop_condition("duplicates > 1")],
        on_stop=stops.append,
        say=print,
    )
    url = view.start()
    try:
        _send(history, 10.0, "n1")
        _send(history, 11.0, "n1")
        view.step()
        assert stops == []  # one duplicate: not past the threshold
        live = history.frame().query("kind == 'live'")
        assert list(live["reason"]) == ["duplicates", "visible_duplicates"]
        _send(history, 12.0, "n1")
        view.step()
        view.step()
        assert len(stops) == 1
        assert stops[0].condition == "duplicates > 1"
        assert stops[0].at == 11.0 and stops[0].evidence["notification_id"] == "n1"
        samples = _samples(url)
        assert samples[("fanout_live_violations_total", (("check", "duplicates"),))] == 2
        assert samples[("fanout_stop_condition_fired", (("condition", "duplicates > 1"),))] == 1
        live = history.frame().query("kind == 'live'")
        assert list(live["reason"]).count("duplicates") == 1  # the first only, then the stop
        assert list(live["reason"])[-1] == "stop"
    finally:
        view.finish()


def test_the_grafana_dashboard_queries_only_metrics_the_harness_serves():
    """dashboards/fanout-drill.json: valid JSON, and every metric its panels and annotations
    query is one the live view serves (a histogram's by its _bucket/_sum/_count series)."""
    import re

    board = json.loads(
        (Path(__file__).parent.parent / "dashboards" / "fanout-drill.json").read_text()
    )
    exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
    exprs += [a["expr"] for a in board["annotations"]["list"]]
    assert len(exprs) >= 8
    served = set(METRIC_NAMES)
    served |= {f"{n}_{s}" for n in METRIC_NAMES for s in ("bucket", "sum", "count")}
    named = {m for e in exprs for m in re.findall(r"\bfanout_[a-z_]+", e)}
    assert named and named <= served, named - served
    titles = {p["title"] for p in board["panels"]}
    assert {"Throughput", "Queue depth", "Live violations", "Fault windows"} <= titles


def test_watch_shows_a_running_run_s_figures_and_ends_with_its_verdict(tmp_path: Path):
    """``harness watch RUN_DIR`` over a live view serving a hand-written history: a frame with
    the figures, then, once the run has a verdict, the verdict."""
    import io

    from harness.live.watch import watch

    history = History()
    view = LiveView(history, tmp_path, LiveMetrics("r1", "smoke", 7), OnlineChecks(), say=print)
    view.start()
    try:
        history.append("inject", time=100.0, tenant_id="acme", notification_id="n1")
        _send(history, 101.0, "n1")
        _send(history, 102.0, "n1")
        _fault(history, "start", 101.5)
        view.step()
        out = io.StringIO()
        assert watch(tmp_path, out=out, once=True) == 0
        text = out.getvalue()
        assert "run r1  scenario smoke  seed 7" in text
        assert "accepted=1" in text and "seen=1" in text
        assert "fcm        200=2" in text
        assert "faults     dedup-outage" in text
        assert "duplicates=1" in text
        (tmp_path / "summary.json").write_text(json.dumps({"verdict": "fail"}))
        out = io.StringIO()
        assert watch(tmp_path, out=out, sleep=lambda s: None, max_frames=5) == 0
        assert out.getvalue().strip() == "run ended: verdict FAIL"
    finally:
        view.finish()


def test_watch_a_directory_without_a_live_view_is_bad_input(tmp_path: Path):
    from conftest import run_cli

    result = run_cli("watch", str(tmp_path))
    assert result.returncode == 2
    assert "has no live.json" in result.stderr


def test_the_report_says_what_was_seen_live_and_why_the_drill_was_aborted():
    from harness.report.document import verdict_sentence, verdict_word

    at = 1795878868.0  # 2026-11-28 15:14:28 UTC
    summary = {
        "verdict": "aborted",
        "checkers": {"effectively_once": {"valid": False}, "quiet_hours": {"valid": True}},
        "live": {
            "violations": {"duplicates": 3, "visible_duplicates": 0},
            "first_seen": {"duplicates": {"at": at, "notification_id": "n1"}},
        },
        "stopped": {
            "condition": "duplicates > 0",
            "at": at,
            "first_evidence": {"notification_id": "n1", "token": "t1"},
        },
    }
    assert verdict_word(summary) == "ABORTED"
    said = verdict_sentence(summary)
    assert said.startswith("1 of 2 checkers failed: effectively_once.")
    assert "ABORTED by its stop condition duplicates > 0 at 15:14:28.000 UTC" in said
    assert "notification_id n1, token t1" in said
    assert "Seen broken live: duplicates first at 15:14:28.000 UTC (3 in all)." in said
    quiet = {"verdict": "pass", "checkers": {"quiet_hours": {"valid": True}}, "live": {}}
    assert verdict_sentence(quiet) == "All 1 checkers passed."


def test_the_safety_lever_ends_an_armed_drill_once_as_a_stop_condition_does(tmp_path: Path):
    history, stops = History(), []
    view = LiveView(history, tmp_path, LiveMetrics("r1", "smoke", 7), OnlineChecks(), say=print)
    view.on_stop = stops.append
    assert view.pull_lever() is False  # not armed: before the load, Ctrl-C just quits
    view.lever_armed.set()
    assert view.pull_lever() is True
    wait_until(lambda: stops, 5.0, "the lever's stop")
    assert view.pull_lever() is False  # already stopping: a second Ctrl-C quits
    assert [s.condition for s in stops] == [SAFETY_LEVER] and view.stopped == stops[0]
    rows = history.frame()
    assert json.loads(rows.loc[rows["reason"] == "stop", "detail"].iloc[0])["condition"] == (
        SAFETY_LEVER
    )


def test_the_first_ctrl_c_pulls_the_lever_the_second_interrupts_and_sigterm_at_once():
    pulls: list[int] = []
    with pytest.raises(RunInterrupted, match="SIGINT"):
        with interruptible(lever=lambda: pulls.append(1) is None):
            os.kill(os.getpid(), signal.SIGINT)
            wait_until(lambda: pulls, 5.0, "the lever pulled")
            os.kill(os.getpid(), signal.SIGINT)
            wait_until(lambda: False, 5.0, "the second Ctrl-C to interrupt")
    assert pulls == [1]
    with pytest.raises(RunInterrupted, match="SIGTERM"):
        with interruptible(lever=lambda: pulls.append(2) is None):
            os.kill(os.getpid(), signal.SIGTERM)
            wait_until(lambda: False, 5.0, "SIGTERM to interrupt")
    with pytest.raises(RunInterrupted, match="SIGINT"):
        with interruptible(lever=lambda: False):  # not armed: the first Ctrl-C quits
            os.kill(os.getpid(), signal.SIGINT)
            wait_until(lambda: False, 5.0, "the refused lever's Ctrl-C to interrupt")
    assert pulls == [1]
