"""Several worker processes behind one part: what a Lambda function's concurrency gives a queue
consumer (each concurrent instance its own interpreter), for the local pollers.

One Python process runs its consumer threads on one core at most (the GIL). :func:`serve_forked`
forks ``count`` worker processes from a small supervisor that runs no threads of its own (a fork
from a multi-threaded process can copy a lock another thread held); each worker builds its own
clients, connections and audit writer after the fork. The workers share the supervisor's process
group, so whoever stops or kills the part (``kill -9`` of its group: a crash) stops them all;
the supervisor forwards SIGTERM/SIGINT, waits for every worker (a stopping worker stores its
buffered audit records first), and only then exits. A worker that dies on its own is started
again, as Lambda replaces a failed instance; one that dies within ``min_uptime_s`` of its start
(a bad config, a missing queue) stops the part instead of looping. The ready file is written once
every worker has written its own.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from reference_impl.event_source import write_whole

log = logging.getLogger("reference_impl.worker_processes")
STOP_GRACE_SECONDS = 20.0
MIN_UPTIME_SECONDS = 5.0


def _exit_code(status: int) -> int:
    return os.waitstatus_to_exitcode(status)


def serve_forked(
    count: int,
    run_worker: Callable[[str | None], int],
    ready_file: str | None,
    name: str,
    min_uptime_s: float = MIN_UPTIME_SECONDS,
) -> int:
    """``run_worker(ready_file)`` in ``count`` forked processes (in this one when ``count`` is
    1), until SIGTERM or SIGINT; the exit code is 0 when every worker stopped cleanly."""
    if count <= 1:
        return run_worker(ready_file)
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s {name} %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    stopping = False
    workers: dict[int, tuple[int, float]] = {}  # pid -> (worker index, started at)

    def worker_ready_file(index: int) -> str | None:
        return f"{ready_file}.{index}" if ready_file else None

    def spawn(index: int) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the worker: its own handlers, clients and threads from here on
            code = 1
            try:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                code = run_worker(worker_ready_file(index))
            except BaseException:
                log.exception("%s worker %d failed", name, index)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        workers[pid] = (index, time.monotonic())

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True
        for pid in list(workers):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for index in range(count):
        spawn(index)
    print(f"{name} running as {count} worker processes", flush=True)
    ready_paths = [Path(f"{ready_file}.{index}") for index in range(count)] if ready_file else []
    code = 0
    stop_deadline: float | None = None
    while workers:
        threads = _ready_threads(ready_paths)
        if threads is not None:
            _write_ready(str(ready_file), ready_paths, name, threads)
            ready_paths = []
        if stopping and stop_deadline is None:
            stop_deadline = time.monotonic() + STOP_GRACE_SECONDS
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            if stop_deadline is not None and time.monotonic() > stop_deadline:
                for late in list(workers):
                    log.error("%s worker pid %d did not stop in time: killed", name, late)
                    os.kill(late, signal.SIGKILL)
                stop_deadline = time.monotonic() + STOP_GRACE_SECONDS
            # Waiting on the workers, woken early by a signal's handler.
            time.sleep(0.2)
            continue
        if pid not in workers:
            continue
        index, started = workers.pop(pid)
        exit_code = _exit_code(status)
        if stopping:
            code = code or (exit_code if exit_code > 0 else 0)
            continue
        log.error("%s worker %d (pid %d) exited with %d", name, index, pid, exit_code)
        if time.monotonic() - started < min_uptime_s:
            log.error("%s worker %d died at start: stopping the part", name, index)
            code = exit_code if exit_code > 0 else 1
            stop()
            continue
        spawn(index)  # as Lambda replaces a failed instance
    return code


def _ready_threads(paths: list[Path]) -> int | None:
    """The workers' threads summed once every worker's ready file (``<ready_file>.<index>``) is
    whole, else None: a file seen between its creation and its write is not ready yet."""
    if not paths:
        return None
    threads = 0
    for path in paths:
        try:
            threads += int(json.loads(path.read_text()).get("threads", 0))
        except (OSError, ValueError):
            return None
    return threads


def _write_ready(ready_file: str, paths: list[Path], name: str, threads: int) -> None:
    """The part's ready file, once every worker wrote its own."""
    for path in paths:
        path.unlink(missing_ok=True)
    write_whole(ready_file, json.dumps({"name": name, "processes": len(paths), "threads": threads}))
