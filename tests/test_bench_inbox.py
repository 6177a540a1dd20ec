"""The inbox benchmark's quick version, end to end: its own stack, its verdicts, its JSON shape."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# The full benchmark runs in `make bench`; this quick version is for `make test-all`.
pytestmark = [pytest.mark.integration, pytest.mark.wholerun, pytest.mark.slow]


def test_quick_inbox_benchmark_proves_flat_read_all_and_one_write_per_celebrity_post(tmp_path):
    out = tmp_path / "inbox.json"
    # A subprocess, as `make bench` runs it: the benchmark starts and stops a stack of its own.
    done = subprocess.run(
        [sys.executable, "benchmarks/bench_inbox.py", "--quick", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "[inbox]" in done.stdout  # progress lines

    assert report["mode"] == "quick"
    assert report["read_all_flat"] is True
    assert report["one_write_per_celebrity_post"] is True
    assert report["checks_ok"] is True

    read_all = report["read_all"]
    counts = read_all["unread_counts"]
    assert list(counts) == ["1", "10", "100", "1000"]
    for n, row in counts.items():
        assert row["samples"] >= 10
        assert 0 < row["p50_ms"] <= row["p99_ms"]
        assert row["rows_stored"] == int(n)
        assert row["unread_count_before"] == {"unread": int(n), "capped": False}
        assert row["unread_count_after"]["unread"] == 0
    assert read_all["ratio_p50"]["of"] == "1000/1"
    assert read_all["ratio_p50"]["value"] <= read_all["max_ratio"] == 1.5

    fanout = report["writes_per_celebrity_post"]
    threshold = fanout["celebrity_threshold"]
    cases = {c["followers"]: c for c in fanout["cases"]}
    assert any(n < threshold for n in cases) and any(n > threshold for n in cases)
    for n, case in cases.items():
        assert case["ok"] is True
        assert case["push_jobs"] == n
        if n >= threshold:
            assert case["tier_audited"] in ("celebrity", None)  # None: no log line
            assert (case["inbox_rows"], case["celebrity_rows"]) == (0, 1)
            assert fanout["writes_per_event"][str(n)] == 1
        else:
            assert case["tier_audited"] in ("write", None)
            assert (case["inbox_rows"], case["celebrity_rows"]) == (n, 0)

    pages = report["inbox_read"]["followed_celebrities"]
    assert list(pages) == ["0", "5", "50"]
    for k, row in pages.items():
        assert row["pages_correct"] is True
        for name in ("page1", "page2"):
            assert 0 < row[name]["p50_ms"] <= row[name]["p99_ms"]
        assert ("celebrity" in row["sources_seen"]) == (k != "0")
