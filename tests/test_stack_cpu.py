"""The burst benchmark's CPU accounting (benchmarks/stack_cpu.py): per-part CPU over a window,
the timeline, process-group totals of a real forked child, and py-spy profile summaries."""

from __future__ import annotations

import importlib.util
import select
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _module():
    spec = importlib.util.spec_from_file_location("stack_cpu", ROOT / "benchmarks/stack_cpu.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


stack_cpu = _module()


def test_cpu_between_takes_whole_samples_around_the_window():
    samples = [
        (0.0, {"a": 0.0, "b": 1.0}),
        (1.0, {"a": 0.5, "b": 1.0}),
        (2.0, {"a": 1.5, "b": 3.0}),
        (3.0, {"a": 1.6, "b": 3.5}),
    ]
    # [1.2, 1.8] widens to the samples at 1.0 and 2.0
    assert stack_cpu.cpu_between(samples, 1.2, 1.8) == {"a": 1.0, "b": 2.0}
    assert stack_cpu.cpu_between(samples, 0.0, 3.0) == {"a": 1.6, "b": 2.5}
    assert stack_cpu.cpu_between([], 0.0, 1.0) == {}


def test_a_part_that_appears_late_counts_from_its_first_sample():
    samples = [(0.0, {"a": 0.0}), (1.0, {"a": 1.0, "late": 5.0}), (2.0, {"a": 2.0, "late": 5.5})]
    assert stack_cpu.cpu_between(samples, 0.0, 2.0) == {"a": 2.0, "late": 0.5}


def test_timeline_buckets_deliveries_and_cores():
    samples = [(100.0 + t, {"consumer": 0.5 * t}) for t in range(0, 21)]
    deliveries = [100.5] * 30 + [112.0] * 50
    rows = stack_cpu.timeline_rows(samples, deliveries, 100.0, bucket_s=10.0)
    assert [r["deliveries_per_s"] for r in rows] == [3.0, 5.0]
    assert rows[0]["cores"] == {"consumer": 0.5}
    assert rows[1]["t_s"] == 10


def test_group_cpu_counts_a_forked_child_of_the_group_after_it_was_reaped():
    """A child that burned CPU in the group of a new session still counts once it has exited
    and been waited for (its parent's cutime)."""
    burn = (
        "import os,sys,time\n"
        "if os.fork()==0:\n"
        " t=time.process_time()\n"
        " while time.process_time()-t<0.6: pass\n"
        " os._exit(0)\n"
        "os.wait()\n"
        "print('reaped',flush=True)\n"
        "time.sleep(30)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", burn], start_new_session=True, stdout=subprocess.PIPE
    )
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        assert ready and proc.stdout.readline().strip() == b"reaped"
        assert stack_cpu.group_cpu_seconds([proc.pid])[proc.pid] >= 0.5
    finally:
        proc.kill()
        proc.wait(10)


def test_summarise_collapsed_shares_by_package_and_self_time():
    lines = [
        "thread (1);run (reference_impl/job_consumer.py:10);_make_api_call (botocore/client.py:5);"
        "sign (botocore/auth.py:3) 6",
        "thread (1);run (reference_impl/job_consumer.py:10);post (reference_impl/http2.py:9);"
        "send_headers (h2/connection.py:1) 3",
        "thread (1);dumps (json/__init__.py:2) 1",
        "garbage",
    ]
    summary = stack_cpu.summarise_collapsed(lines)
    assert summary["samples"] == 10
    shares = summary["share_by_package"]
    assert shares["reference_impl"] == pytest.approx(0.9)
    assert shares["botocore"] == pytest.approx(0.6)
    assert shares["h2"] == pytest.approx(0.3)
    assert shares["json"] == pytest.approx(0.1)
    assert summary["top_self"][0] == {"frame": "sign (botocore/auth.py:3)", "share": 0.6}
