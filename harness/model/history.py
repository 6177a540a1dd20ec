"""The run history: one append-only table, Jepsen style, written as Parquet.

Every injected operation, every provider request and every fault window is a row. Wall time
(``time``, epoch seconds) orders rows across processes on this machine; ``mono`` is the
harness's monotonic clock where the harness itself observed the row.

While a run goes, the history also streams to disk (``history.arrows``: Arrow IPC batches,
appended and flushed at least every second, :meth:`History.stream_to`), so that a run killed
with -9 leaves every row up to its last second readable (:func:`read_partial`); the finished
run writes ``history.parquet``.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import IO, Any

import pandas as pd
import pyarrow as pa

COLUMNS = {
    "seq": "int64",
    # inject | inject_info | provider | fault | action | dlq | phase | sample | alarm | audit |
    # receive | read | change | channel | dedup_sample | queue_policy | live (a promise seen
    # broken while the run went, or the stop condition that ended it: harness.live)
    "kind": "string",
    "time": "float64",
    # When the operation completed (its answer came back): inject, read and change rows.
    "end": "float64",
    "mono": "float64",
    "tenant_id": "string",
    # The user an operation acted for: a reader, a changed or erased user.
    "user_id": "string",
    "author_id": "string",
    # Inject rows: the event's object (what it is about), as the harness posted it.
    "object_id": "string",
    "notification_id": "string",
    "token": "string",
    "provider": "string",
    "project": "string",
    "status": "Int64",
    "reason": "string",
    "delivered": "boolean",  # provider rows: the device got it (a 200, or accepted then 5xx)
    "collapse_id": "string",
    "retry_after": "float64",
    "detail": "string",
    # Provider rows: what the push asked of the provider and showed, as the simulator's ledger
    # recorded it (emulators/providers/ledger.py): APNs apns-push-type / apns-priority /
    # apns-expiration, FCM android.priority / android.ttl (else the APNs headers it forwards),
    # and the alert's text; null when absent (``text`` null: no alert at all).
    "push_type": "string",
    "priority": "string",
    "expiration": "string",
    "text": "string",
}


# The email and in-app simulators' provider names and the SNS endpoint's SMS ledger's, and the
# channel each delivers (history rows of those ledgers carry the provider name).
CHANNEL_OF_PROVIDER = {"ses": "email", "inapp": "in_app", "sms": "sms"}

_ARROW_TYPES = {
    "int64": pa.int64(),
    "Int64": pa.int64(),
    "float64": pa.float64(),
    "string": pa.string(),
    "boolean": pa.bool_(),
}
SCHEMA = pa.schema([(name, _ARROW_TYPES[dtype]) for name, dtype in COLUMNS.items()])
STREAM_FILE = "history.arrows"


class History:
    def __init__(self) -> None:
        self._rows: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._stream: IO[bytes] | None = None
        self._writer: pa.ipc.RecordBatchStreamWriter | None = None
        self._streamed = 0
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None

    # -- streaming to disk ----------------------------------------------------------------------

    def stream_to(self, path: Path, interval_s: float = 1.0) -> None:
        """Append every row to ``path`` as the run goes: what is there now at once, then new
        rows at least every ``interval_s`` (and at :meth:`close_stream`)."""
        self._stream = open(path, "wb")  # noqa: SIM115 - closed by close_stream
        self._writer = pa.ipc.new_stream(self._stream, SCHEMA)
        self.flush()
        self._flusher = threading.Thread(
            target=self._flush_forever, args=(interval_s,), name="history-flush", daemon=True
        )
        self._flusher.start()

    def flush(self) -> int:
        """Write the rows not streamed yet; return how many."""
        with self._lock:
            rows = self._rows[self._streamed :]
            self._streamed = len(self._rows)
            if self._writer is None or not rows:
                return 0
            self._writer.write_batch(pa.RecordBatch.from_pylist(rows, schema=SCHEMA))
            assert self._stream is not None
            self._stream.flush()
        return len(rows)

    def _flush_forever(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                self.flush()
            except (OSError, ValueError, pa.ArrowException):  # a full disk must not end the run
                continue

    def close_stream(self) -> None:
        self._stop.set()
        if self._flusher is not None:
            self._flusher.join(5)
        if self._writer is not None:
            self.flush()
            with self._lock:
                self._writer.close()
                self._writer = None
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def append(self, kind: str, **fields: Any) -> None:
        unknown = set(fields) - set(COLUMNS)
        if unknown:
            raise ValueError(f"unknown history field(s): {', '.join(sorted(unknown))}")
        with self._lock:
            row = {"seq": len(self._rows), "kind": kind, "mono": time.monotonic(), **fields}
            row.setdefault("time", time.time())
            self._rows.append(row)

    def extend_provider(self, rows: list[dict[str, Any]]) -> None:
        """Ledger rows from a provider simulator (their receive time, not ours)."""
        for row in rows:
            self.append(
                "provider",
                time=row["received_at"],
                end=row.get("answered_at"),
                mono=float("nan"),
                tenant_id=row.get("tenant_id"),
                notification_id=row.get("notification_id"),
                token=row.get("token"),
                provider=row.get("provider"),
                project=row.get("project"),
                status=row.get("status"),
                reason=row.get("reason"),
                delivered=row.get("delivered", row.get("status") == 200),
                collapse_id=row.get("collapse_id"),
                retry_after=row.get("retry_after"),
                push_type=row.get("push_type"),
                priority=row.get("priority"),
                expiration=row.get("expiration"),
                text=row.get("text"),
            )

    def __len__(self) -> int:
        return len(self._rows)

    def rows_since(self, position: int) -> list[dict[str, Any]]:
        """The rows appended from ``position`` on (a live reader's cursor), in order."""
        with self._lock:
            return self._rows[position:]

    def frame(self) -> pd.DataFrame:
        with self._lock:
            rows = list(self._rows)
        return to_frame(rows)

    def write(self, path: Path) -> None:
        self.frame().to_parquet(path, index=False)


def to_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    return frame.astype(COLUMNS)


def read(path: Path) -> pd.DataFrame:
    """A history file; columns added since it was written are there, empty."""
    frame = pd.read_parquet(path)
    for column in COLUMNS:
        if column not in frame:
            frame[column] = pd.Series([None] * len(frame), dtype=COLUMNS[column], index=frame.index)
    return frame[list(COLUMNS)].astype(COLUMNS)


def read_partial(path: Path) -> pd.DataFrame:
    """The rows of a streamed history, up to the last whole batch (a run killed mid-write
    leaves a torn last batch, which is dropped)."""
    batches = []
    with open(path, "rb") as source:
        try:
            reader = pa.ipc.open_stream(source)
            for batch in reader:
                batches.append(batch)
        except (pa.ArrowInvalid, OSError, EOFError):
            pass
    table = pa.Table.from_batches(batches, schema=SCHEMA)
    frame = table.to_pandas()
    return frame.astype(COLUMNS)
