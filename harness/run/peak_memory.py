"""The harness process's peak resident memory: over the whole run, and over a window (one
checker), so that a scale run says which checker needs the memory, not only which phase.

``getrusage`` gives only the peak since the process began, which never falls: after the first
checker that peaks, every later one reads the same. Linux keeps the same high-water mark per
process (``VmHWM`` in ``/proc/self/status``) and resets it to the present resident size when
``5`` is written to ``/proc/self/clear_refs`` (proc(5)); a window resets it on entry and reads it
on exit. The mark a reset wipes is folded into :func:`peak_mb` first, so the whole run's peak
never reads lower for the windows taken (the kernel's ``ru_maxrss`` can follow the reset).
Where the file cannot be written (not Linux, a locked-down /proc), a window's peak is None:
unknown, never a number that is not that window's.
"""

from __future__ import annotations

import contextlib
import resource
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")
_RESET_HIGH_WATER = "5"  # proc(5): reset the peak resident set size to the present one

_lock = threading.Lock()
_highest_kib = 0  # the highest mark any reset wiped


def _high_water_kib() -> int | None:
    """VmHWM of this process in KiB; None where /proc does not say it."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _fold(kib: int | None) -> None:
    global _highest_kib
    if kib is not None:
        with _lock:
            _highest_kib = max(_highest_kib, kib)


def peak_mb() -> float:
    """This process's peak resident memory so far, in MB (windows taken or not)."""
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # Linux: KiB
    _fold(_high_water_kib())
    with _lock:
        return round(max(kib, _highest_kib) / 1024, 1)


@dataclass
class Window:
    """The peak resident memory of the process while a :func:`measured` block ran (MB), or
    None when it could not be measured on its own."""

    peak_mb: float | None = None


@contextlib.contextmanager
def measured() -> Iterator[Window]:
    """Measure the process's peak resident memory over the block: ``with measured() as w:``,
    then ``w.peak_mb``. The whole process's, threads included (the collector does not run
    while checkers judge)."""
    window = Window()
    _fold(_high_water_kib())
    try:
        _CLEAR_REFS.write_text(_RESET_HIGH_WATER)
        reset = True
    except OSError:
        reset = False
    try:
        yield window
    finally:
        kib = _high_water_kib()
        _fold(kib)
        if reset and kib is not None:
            window.peak_mb = round(kib / 1024, 1)
