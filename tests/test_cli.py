"""The command line as a user meets it: clear errors, non-zero exits, nothing left running."""

from __future__ import annotations

import json
import os
import shutil
import socket
import xml.etree.ElementTree as ET
from pathlib import Path

import pandas as pd
import pytest
from conftest import run_cli

from harness.stack.supervisor import StackInfo, _pid_alive


def test_unknown_scenario_is_a_clear_error():
    result = run_cli("run", "no-such-scenario")
    assert result.returncode == 2
    assert "unknown scenario 'no-such-scenario'" in result.stderr
    assert "smoke" in result.stderr


def test_otel_on_a_scenario_without_a_locust_load_is_a_clear_error(tmp_path):
    result = run_cli("run", "smoke", "--otel", "--out", str(tmp_path))
    assert result.returncode == 2
    assert "scenario smoke has no locust step; --otel needs one" in result.stderr
    assert list(tmp_path.iterdir()) == []  # refused before any run began


def test_serving_on_a_taken_port_is_a_clear_error():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        for part in ("apns", "redis", "fcm", "sns"):
            result = run_cli("serve", part, "--port", str(port))
            assert result.returncode == 2, result
            assert f"port {port} on 127.0.0.1 is already in use" in result.stderr


def test_missing_redis_server_is_a_clear_error(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink(shutil.which("node"), bin_dir / "node")
    result = run_cli("run", "smoke", "--out", str(tmp_path), env={"PATH": str(bin_dir)})
    assert result.returncode == 2
    assert "redis-server is not installed" in result.stderr
    assert "apt-get install redis-server" in result.stderr


@pytest.mark.integration
def test_stack_up_status_down_leaves_nothing_running(tmp_path):
    stack_file = tmp_path / "stack.json"
    env = {"HARNESS_STACK_FILE": str(stack_file)}
    up = run_cli("stack", "up", env=env)
    assert up.returncode == 0, up.stderr
    info = StackInfo.read(stack_file)
    try:
        pids = [p.pid for p in info.parts.values()]
        assert all(_pid_alive(pid) for pid in pids)
        status = run_cli("stack", "status", env=env)
        assert status.returncode == 0
        assert status.stdout.count("running") == len(info.parts)
        again = run_cli("stack", "up", env=env)
        assert again.returncode == 2 and "already up" in again.stderr
        # The runbook's DLQ redrive, against the stack in the stack file.
        sqs = info.aws_client("sqs")
        dlq = sqs.get_queue_url(QueueName="fanout-email-dlq")["QueueUrl"]
        sqs.send_message(QueueUrl=dlq, MessageBody="{}")
        depth = run_cli("dlq", "depth", "--channel", "email", env=env)
        assert "email: 1 message(s)" in depth.stdout, depth.stdout + depth.stderr
        moved = run_cli("dlq", "redrive", "--channel", "email", env=env)
        assert "email: moved 1 message(s) back" in moved.stdout, moved.stdout + moved.stderr
        assert (
            "email: 0 message(s)" in run_cli("dlq", "depth", "--channel", "email", env=env).stdout
        )
    finally:
        down = run_cli("stack", "down", env=env)
    assert down.returncode == 0
    assert not any(_pid_alive(pid) for pid in pids)
    assert not stack_file.exists()


@pytest.mark.integration
@pytest.mark.wholerun
def test_smoke_run_passes_and_writes_its_run_directory(tmp_path):
    result = run_cli("run", "smoke", "--seed", "42", "--out", str(tmp_path), timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "verdict: PASS" in result.stdout
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["seed"] == 42 and summary["scenario"] == "smoke"
    once = summary["checkers"]["effectively_once"]
    assert once["valid"] and once["expected"] > 0
    assert once["delivered"] == once["expected"]
    assert once["duplicated"] == once["lost"] == once["unexpected"] == 0
    history = pd.read_parquet(run_dir / "history.parquet")
    # One post per author (8), then the probes: one more of a regular author and a celebrity
    # per tenant (4), whose devices push_order judges.
    assert (history["kind"] == "inject").sum() == 12
    assert summary["checkers"]["push_order"]["pairs_judged"] > 0
    # The reports a release is gated on: one junit test case per checker, all passing.
    junit = ET.parse(run_dir / "junit.xml").getroot()
    cases = junit.findall(".//testcase")
    assert {c.get("name") for c in cases} == set(summary["checkers"])
    assert not junit.findall(".//failure")
    assert "PASS" in (run_dir / "report.md").read_text()
    assert (run_dir / "report.html").read_text().count("data:image/png;base64,") >= 3
    # Queue depth was sampled during the run, for the report's depth chart.
    assert (history["kind"] == "sample").sum() > 0
    assert (history["kind"] == "provider").sum() >= once["expected"]
    # Every part the run started is gone.
    phases = history[history["kind"] == "phase"]["detail"].tolist()
    pids = json.loads(phases[0])["stack_up"]
    assert set(pids) >= {"redis", "dynamodb", "kinesis", "aws", "apns", "fcm", "push-consumer"}
    assert not any(_pid_alive(pid) for pid in pids.values())


def test_no_live_with_a_stop_condition_is_a_clear_error(tmp_path):
    result = run_cli(
        "run", "smoke", "--no-live", "--stop-on", "duplicates > 0", "--out", str(tmp_path)
    )
    assert result.returncode == 2
    assert "--no-live: stop conditions (duplicates > 0) need the live view" in result.stderr
    assert list(tmp_path.iterdir()) == []  # refused before any run began


@pytest.mark.integration
@pytest.mark.wholerun
def test_a_run_without_its_live_view_is_judged_the_same_and_states_its_own_cpu(tmp_path):
    """``--no-live``: the comparison point of the live view's cost (benchmarks/bench_live_run):
    no metrics served, no online checks, the verdict from the final checkers alone."""
    result = run_cli(
        "run", "smoke", "--seed", "42", "--no-live", "--no-report", "--out", str(tmp_path),
        timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "live      off" in result.stdout and "metrics at" not in result.stdout
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["verdict"] == "pass" and summary["live"] == {"off": True}
    assert not (run_dir / "live.json").exists()
    assert summary["harness_cpu_s"] > 0
    # What each phase and checker cost (issue 25: how a run's cost grows with its size).
    phases = summary["phase_seconds"]
    assert set(phases) == {
        "bring_up", "load_population", "inject", "await", "collect", "judge", "tear_down",
        "report",
    }  # fmt: skip
    assert all(seconds >= 0 for seconds in phases.values()) and phases["bring_up"] > 0
    assert set(summary["checker_seconds"]) == {c for c in summary["checkers"]}
    assert sum(summary["checker_seconds"].values()) <= phases["judge"]
    assert summary["harness_peak_rss_mb"] > 50
    peaks = summary["phase_peak_rss_mb"]  # never falls: a peak so far, taken as each phase ends
    assert set(peaks) == set(phases) and peaks["report"] == summary["harness_peak_rss_mb"]
    # Each checker's own peak: no higher than the judge phase's, each measured on its own.
    own = summary["checker_peak_rss_mb"]
    assert set(own) == set(summary["checkers"])
    assert all(0 < mb <= peaks["judge"] for mb in own.values())
    assert peaks["bring_up"] <= peaks["judge"] <= peaks["report"]


@pytest.mark.parametrize(
    ("module", "extra"),
    [
        ("reference_impl.event_api", []),
        ("reference_impl.fanout_worker", []),
        ("reference_impl.push_consumer", []),
        ("reference_impl.channel_consumer", ["--channel", "email"]),
        ("reference_impl.stream_invalidator", []),
    ],
)
def test_every_reference_process_refuses_a_missing_config_with_exit_2(
    module, extra, tmp_path, capsys
):
    import importlib

    main = importlib.import_module(module).main
    assert main([*extra, "--config", str(tmp_path / "absent.json")]) == 2
    assert "error: config file" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--scale", "nan"], "--scale must be a positive number, not nan"),
        (["--scale", "inf"], "--scale must be a positive number, not inf"),
        (["--scale", "0"], "--scale must be a positive number"),
        (["--timeout", "-5"], "--timeout must be a positive number of seconds, not -5.0"),
        (["--timeout", "0"], "--timeout must be a positive number of seconds, not 0.0"),
        (["--timeout", "nan"], "--timeout must be a positive number of seconds"),
    ],
)
def test_bad_numbers_exit_2_with_one_clear_line(args, message, tmp_path):
    result = run_cli("run", "smoke", "--out", str(tmp_path), *args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip().splitlines() == [f"error: {message}"] or message in result.stderr
    assert "Traceback" not in result.stderr
    assert not any(tmp_path.iterdir())  # nothing started, nothing written


@pytest.mark.parametrize("value", ["lots", "-1", "1.5"])
def test_a_bad_out_of_core_threshold_exits_2_before_the_run(value, tmp_path):
    result = run_cli("run", "smoke", "--out", str(tmp_path), env={"FANOUT_OUT_OF_CORE_ROWS": value})
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"FANOUT_OUT_OF_CORE_ROWS={value!r}: a whole number of rows" in result.stderr
    assert not any(tmp_path.iterdir())


def test_out_naming_a_file_or_an_unwritable_place_exits_2(tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    result = run_cli("run", "smoke", "--out", str(a_file))
    assert result.returncode == 2 and "is a file, not a directory" in result.stderr
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):  # root writes anywhere: use a place no one can write
            locked = Path("/proc/harness-cannot-write-here")
        result = run_cli("run", "smoke", "--out", str(locked / "runs"))
        assert result.returncode == 2 and "cannot write there" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
    finally:
        (tmp_path / "locked").chmod(0o700)


def test_a_negative_count_in_a_scenario_file_is_refused(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(
        "title: bad\n"
        "steady-state-hypothesis: {probes: [{name: effectively_once}]}\n"
        "method: [{type: load, regular_posts: -4}]\n"
    )
    result = run_cli("run", str(path), "--out", str(tmp_path / "o"))
    assert result.returncode == 2
    assert "method[0]: regular_posts must be a whole number >= 0" in result.stderr
    path.write_text(
        "title: bad\nconfiguration: {population: {no_consent_fraction: 1.5}}\n"
        "steady-state-hypothesis: {probes: [{name: effectively_once}]}\n"
        "method: [{type: load}]\n"
    )
    result = run_cli("run", str(path), "--out", str(tmp_path / "o"))
    assert result.returncode == 2
    assert "no_consent_fraction must be between 0 and 1" in result.stderr


def test_a_target_whose_endpoint_is_down_is_named(tmp_path):
    from emulators.ports import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    path = tmp_path / "target.yaml"
    path.write_text(
        f"name: down-system\nevent_api: {dead}\n"
        f"apns_listen: 127.0.0.1:{free_port()}\nfcm_listen: 127.0.0.1:{free_port()}\n"
    )
    result = run_cli("run", "smoke", "--target", str(path), "--out", str(tmp_path / "o"))
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"target down-system: its event_api {dead} does not answer" in result.stderr
    assert "Traceback" not in result.stderr
