"""What the load recorded, Jepsen style: every operation is written *before* it is sent (an
``invoke`` row) and again when its answer comes back (``ok``, ``fail`` or ``info``), each row
flushed to an append-only JSON-lines file as it happens.

Streams (one file each in the load's output directory):

* ``injected.jsonl``: events posted. The client mints the event id (a ULID) itself, so an
  event whose answer never came back (the process was stopped, the connection cut) is still
  known by id: it is *indeterminate* (the system may or may not have taken it), and the oracle
  allows its deliveries without requiring them, instead of calling them unexpected.
* ``reads.jsonl``: what readers saw: each inbox page (ids in order, cursor sent and returned),
  each read-all, per-item read and unread count, with the instants sent and answered.

A Locust worker writes its own files (``<stream>-w<pid>.jsonl``) before relaying rows to the
master: rows in flight when a worker stops are never lost, and :func:`merge_worker_files` folds
them into the master's files at the end of a local distributed run.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from harness.model.history import History

STREAMS = ("injected", "reads")
INJECTED_FILE = "injected.jsonl"
READS_FILE = "reads.jsonl"


def stream_file(stream: str, worker: int | None = None) -> str:
    if stream not in STREAMS:
        raise ValueError(f"unknown record stream {stream!r}; streams: {', '.join(STREAMS)}")
    return f"{stream}.jsonl" if worker is None else f"{stream}-w{worker}.jsonl"


class RecordFiles:
    """Append-only JSON-lines files, one per stream, flushed per write: a crash keeps what was
    written."""

    def __init__(self, out: Path, worker: int | None = None) -> None:
        self.out = out
        self.worker = worker
        out.mkdir(parents=True, exist_ok=True)
        self._files: dict[str, IO[str]] = {}

    def write(self, stream: str, rows: Iterable[dict[str, Any]]) -> None:
        handle = self._files.get(stream)
        if handle is None:
            path = self.out / stream_file(stream, self.worker)
            handle = self._files[stream] = open(path, "a", encoding="utf-8")  # noqa: SIM115
        for row in rows:
            handle.write(json.dumps(row) + "\n")
        handle.flush()

    def close(self) -> None:
        for handle in self._files.values():
            handle.close()
        self._files.clear()


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Rows of a JSON-lines file; a line cut short by a crash is skipped, the rest kept."""
    rows: list[dict[str, Any]] = []
    if not path.exists():
        return rows
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict):
                rows.append(row)
    return rows


def _identity(row: dict[str, Any]) -> str:
    return json.dumps(row, sort_keys=True)


def merge_worker_files(out: Path) -> int:
    """Append to each stream's file the rows of the workers' own files it does not hold yet
    (rows relayed to the master are in both); return how many were added."""
    added = 0
    for stream in STREAMS:
        main = out / stream_file(stream)
        seen = {_identity(r) for r in read_rows(main)}
        missing = []
        for path in sorted(out.glob(f"{stream}-w*.jsonl")):
            for row in read_rows(path):
                identity = _identity(row)
                if identity not in seen:
                    seen.add(identity)
                    missing.append(row)
        if missing:
            with open(main, "a", encoding="utf-8") as handle:
                for row in missing:
                    handle.write(json.dumps(row) + "\n")
            added += len(missing)
    return added


@dataclass(frozen=True)
class Injected:
    """The events of ``injected.jsonl``, folded per event id."""

    accepted: list[dict[str, Any]]  # the system said yes: sent ``time``, answered ``end``
    indeterminate: list[dict[str, Any]]  # no answer, or one that does not say
    refused: list[dict[str, Any]]  # a definite no (4xx): never in the system


def fold_injected(rows: Iterable[dict[str, Any]]) -> Injected:
    """Rows without ``op`` (files written before write-ahead rows existed) are accepted events."""
    invoked: dict[str, dict[str, Any]] = {}
    outcome: dict[str, dict[str, Any]] = {}
    order: list[str] = []
    for row in rows:
        nid = str(row.get("client_id") or row.get("notification_id"))
        op = row.get("op", "ok")
        if nid not in invoked and nid not in outcome:
            order.append(nid)
        if op == "invoke":
            invoked[nid] = row
        elif op in ("ok", "fail", "info"):
            # A definite answer wins over an indeterminate one.
            if outcome.get(nid, {}).get("op", "info") == "info":
                outcome[nid] = row
    accepted, indeterminate, refused = [], [], []
    for nid in order:
        start = invoked.get(nid, {})
        done = outcome.get(nid)
        merged = {**start, **(done or {})}
        merged["time"] = start.get("time", merged.get("time"))
        merged.setdefault("end", math.nan)
        op = done.get("op", "ok") if done is not None else "info"
        if op == "ok":
            accepted.append(merged)
        elif op == "fail":
            refused.append(merged)
        else:
            merged["notification_id"] = merged.get("client_id", merged.get("notification_id"))
            indeterminate.append(merged)
    return Injected(accepted, indeterminate, refused)


def append_read(history: History, row: dict[str, Any]) -> None:
    """One observation of a reader (an inbox page, a read-all, a per-item read, an unread
    count) as a ``read`` history row: the operation in ``reason``, the rest in ``detail``."""
    rest = {
        k: v
        for k, v in row.items()
        if k not in ("op", "time", "end", "tenant_id", "user_id", "status", "notification_id")
    }
    history.append(
        "read",
        time=row.get("time"),
        end=row.get("end"),
        tenant_id=row.get("tenant_id"),
        user_id=row.get("user_id"),
        notification_id=row.get("notification_id"),
        status=row.get("status"),
        reason=row.get("op"),
        detail=json.dumps(rest),
    )


class LoadTail:
    """Folds what the load records into the history while it runs: every event as soon as its
    answer is written (``inject`` / ``inject_info``; refused ones are dropped) and every read,
    so a killed run's streamed history already holds them. :meth:`finish` reads what is left
    and takes every event still without an answer as indeterminate."""

    def __init__(self, out: Path, history: History) -> None:
        self.out = out
        self.history = history
        self._offsets = {INJECTED_FILE: 0, READS_FILE: 0}
        self._invoked: dict[str, dict[str, Any]] = {}
        self._answered: set[str] = set()
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.accepted = self.indeterminate = 0

    def start(self, interval_s: float = 1.0) -> None:
        self._thread = threading.Thread(
            target=self._run, args=(interval_s,), name="load-tail", daemon=True
        )
        self._thread.start()

    def _run(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                self.poll()
            except OSError:
                continue

    def _new_rows(self, name: str) -> list[dict[str, Any]]:
        path = self.out / name
        if not path.exists():
            return []
        with open(path, "rb") as handle:
            handle.seek(self._offsets[name])
            data = handle.read()
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next poll
        self._offsets[name] += end
        rows = []
        for line in data[:end].splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict):
                rows.append(row)
        return rows

    def poll(self) -> None:
        with self._lock:
            for row in self._new_rows(INJECTED_FILE):
                self._event(row)
            for row in self._new_rows(READS_FILE):
                identity = _identity(row)
                if identity not in self._seen:
                    self._seen.add(identity)
                    append_read(self.history, row)

    def _event(self, row: dict[str, Any]) -> None:
        key = str(row.get("client_id") or row.get("notification_id"))
        op = row.get("op", "ok")
        if op == "invoke":
            self._invoked.setdefault(key, row)
            return
        if key in self._answered:
            return  # the same answer twice (relayed and merged from a worker's file)
        self._answered.add(key)
        start = self._invoked.pop(key, {})
        merged = {**start, **row, "time": start.get("time", row.get("time"))}
        if op == "ok":
            self._append("inject", merged)
        elif op == "info":
            merged["notification_id"] = merged.get("client_id", merged.get("notification_id"))
            self._append("inject_info", merged)

    def _append(self, kind: str, row: dict[str, Any]) -> None:
        end = row.get("end")
        self.history.append(
            kind,
            time=row["time"],
            end=end if isinstance(end, int | float) else None,
            tenant_id=row["tenant_id"],
            author_id=row["author_id"],
            notification_id=row["notification_id"],
            detail=row.get("kind"),
            object_id=row.get("object_id"),
        )
        if kind == "inject":
            self.accepted += 1
        else:
            self.indeterminate += 1

    def finish(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        self.poll()
        with self._lock:
            for key, row in list(self._invoked.items()):
                if key not in self._answered:
                    self._answered.add(key)
                    self._append("inject_info", {**row, "notification_id": key})
            self._invoked.clear()
