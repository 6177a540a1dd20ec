"""The harness's peak memory over a window (a checker's own peak) and over the whole run."""

from __future__ import annotations

import gc

import pytest

from harness.run import peak_memory

MB = 1024 * 1024
pytestmark = pytest.mark.skipif(
    peak_memory._high_water_kib() is None, reason="no VmHWM in /proc/self/status (not Linux)"
)


def _touch(megabytes: int) -> bytes:
    # Written, not calloc'd: every page resident.
    return b"\x01" * (megabytes * MB)


def test_a_window_reads_its_own_peak_not_the_process_s_earlier_one() -> None:
    with peak_memory.measured() as big:
        block = _touch(300)
        del block
    gc.collect()
    with peak_memory.measured() as small:
        block = _touch(20)
        del block
    assert big.peak_mb is not None and small.peak_mb is not None
    # The second window saw 20 MB more than its start, not the 300 MB of the first.
    assert big.peak_mb - small.peak_mb > 200


def test_the_whole_run_s_peak_never_falls_for_the_windows_taken() -> None:
    with peak_memory.measured():
        block = _touch(250)
        peak_inside = peak_memory.peak_mb()
        del block
    gc.collect()
    with peak_memory.measured():
        pass
    assert peak_memory.peak_mb() >= peak_inside


def test_a_window_that_cannot_reset_the_mark_says_unknown(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    monkeypatch.setattr(peak_memory, "_CLEAR_REFS", tmp_path / "absent" / "clear_refs")
    with peak_memory.measured() as window:
        pass
    assert window.peak_mb is None
