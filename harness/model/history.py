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

import itertools
import threading
import time
import weakref
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import IO, Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

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


# Rows are kept as dicts only until this many wait (or the stream's next flush), then as one
# Arrow record batch: a dict row costs ~1.2 KB, the same row in Arrow ~100 bytes, and the
# history of a million-delivery run has millions of rows.
SEAL_ROWS = 20_000
# Rows only the checkers read (the system's audit trail, SQS's receive log, SNS's endpoint
# events): most of a large history's rows and nearly all its bytes (an audit record's JSON is
# ~600 bytes, two or three a delivery). The oracle, the timeline and the run's summaries never
# read them, so they build on :meth:`History.frame` ``without`` them; with the history judged
# on disk, the checkers read them from there.
CHECKER_ONLY_KINDS = ("audit", "receive", "sns_endpoint")
# A streamed history keeps only its latest rows in memory (a live reader's cursor is never
# that far behind); older batches are read back from the stream file when asked for, so the
# harness's memory does not grow with the run.
KEEP_ROWS_IN_MEMORY = 200_000
_PANDAS_TYPES = {pa.string(): pd.StringDtype("pyarrow"), pa.bool_(): pd.BooleanDtype()}


class History:
    def __init__(self) -> None:
        # Sealed rows, in order: a batch, or None for one only in the stream file.
        self._batches: list[pa.RecordBatch | None] = []
        self._sizes: list[int] = []  # rows of each sealed batch
        self._sealed = 0  # rows in _batches
        self._spilled = 0  # leading batches only in the stream file
        self._reader: IO[bytes] | None = None  # the stream file, open for reading back
        self._read_lock = threading.Lock()
        self._pending: list[dict[str, Any]] = []  # rows after them, not sealed yet
        self._lock = threading.Lock()
        self._stream: IO[bytes] | None = None
        self._writer: pa.ipc.RecordBatchStreamWriter | None = None
        self._streamed = 0  # batches written to the stream
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None
        # The last frame() of every row or ``without`` some kinds, while no row came after.
        self._frames: dict[tuple[str, ...], pd.DataFrame] = {}

    # -- streaming to disk ----------------------------------------------------------------------

    def stream_to(self, path: Path, interval_s: float = 1.0) -> None:
        """Append every row to ``path`` as the run goes: what is there now at once, then new
        rows at least every ``interval_s`` (and at :meth:`close_stream`)."""
        self._stream = open(path, "wb")  # noqa: SIM115 - closed by close_stream
        self._writer = pa.ipc.new_stream(self._stream, SCHEMA)
        # Open for as long as the history lives: the run removes the file once it wrote the
        # Parquet, and its summaries still read rows.
        self._reader = open(path, "rb")  # noqa: SIM115 - closed by the finalizer
        weakref.finalize(self, self._reader.close)
        self.flush()
        self._flusher = threading.Thread(
            target=self._flush_forever, args=(interval_s,), name="history-flush", daemon=True
        )
        self._flusher.start()

    def flush(self) -> int:
        """Write the rows not streamed yet; return how many."""
        with self._lock:
            if self._writer is None:
                return 0
            self._seal()
            batches = self._batches[self._streamed :]
            self._streamed = len(self._batches)
            for batch in batches:
                assert batch is not None  # only streamed batches are spilled
                self._writer.write_batch(batch)
            assert self._stream is not None
            self._stream.flush()
            self._spill()
        return sum(b.num_rows for b in batches if b is not None)

    def _seal(self) -> None:
        """The pending rows become one record batch (the lock held)."""
        if self._pending:
            batch = pa.RecordBatch.from_pylist(self._pending, schema=SCHEMA)
            self._batches.append(batch)
            self._sizes.append(batch.num_rows)
            self._sealed += batch.num_rows
            self._pending = []

    def _spill(self) -> None:
        """Drop from memory the streamed batches before the latest
        :data:`KEEP_ROWS_IN_MEMORY` rows (the lock held)."""
        kept = 0
        for i in range(self._streamed - 1, self._spilled - 1, -1):
            kept += self._sizes[i]
            if kept > KEEP_ROWS_IN_MEMORY:
                for j in range(self._spilled, i + 1):
                    self._batches[j] = None
                self._spilled = i + 1
                return

    def _from_file(self, count: int) -> Iterator[pa.RecordBatch]:
        """The stream file's first ``count`` batches, read one at a time."""
        if not count:
            return
        assert self._reader is not None
        with self._read_lock:
            self._reader.seek(0)
            reader = pa.ipc.open_stream(pa.PythonFile(self._reader, mode="r"))
            for _ in range(count):
                yield reader.read_next_batch()

    def _snapshot(self) -> tuple[int, list[pa.RecordBatch | None]]:
        """(leading batches only on disk, the sealed batches): every row so far sealed."""
        with self._lock:
            self._seal()
            return self._spilled, list(self._batches)

    def _each_batch(self) -> Iterator[pa.RecordBatch]:
        """Every row so far, batch by batch, in order (those only on disk read back)."""
        spilled, batches = self._snapshot()
        yield from self._from_file(spilled)
        for batch in batches[spilled:]:
            assert batch is not None
            yield batch

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
            row = {
                "seq": self._sealed + len(self._pending),
                "kind": kind,
                "mono": time.monotonic(),
                **fields,
            }
            row.setdefault("time", time.time())
            self._pending.append(row)
            self._frames.clear()
            if len(self._pending) >= SEAL_ROWS:
                self._seal()

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
        with self._lock:
            return self._sealed + len(self._pending)

    def rows_since(self, position: int) -> list[dict[str, Any]]:
        """The rows appended from ``position`` on (a live reader's cursor), in order; a sealed
        row comes back with every column (null ones as None)."""
        with self._lock:
            spilled = self._spilled
            batches = list(self._batches)
            sizes = list(self._sizes)
            pending = self._pending[max(0, position - self._sealed) :]
        on_disk = sum(sizes[:spilled])
        behind = position < on_disk  # a reader far behind: read the file (slow, but exact)
        source = itertools.chain(self._from_file(spilled) if behind else (), batches[spilled:])
        rows: list[dict[str, Any]] = []
        first = 0 if behind else on_disk  # the first row of the batch at hand
        for batch in source:
            assert batch is not None
            if first + batch.num_rows > position:
                rows += batch.slice(max(0, position - first)).to_pylist()
            first += batch.num_rows
        return rows + pending

    def table(self, without: Collection[str] = ()) -> pa.Table:
        """Every row so far (less those of the kinds ``without``), as one Arrow table."""
        leave_out = pa.array(sorted(without), pa.string())
        batches = [
            batch.filter(pc.invert(pc.is_in(batch.column("kind"), leave_out))) if without else batch
            for batch in self._each_batch()
        ]
        return pa.Table.from_batches(batches, schema=SCHEMA)

    def frame(self, without: Collection[str] = ()) -> pd.DataFrame:
        """Every row so far (less those of the kinds ``without``). Built once while no row is
        appended (the judging phase asks for it many times): each caller gets its own shallow
        copy, which copy-on-write keeps apart."""
        key = tuple(sorted(without))
        with self._lock:
            cached = self._frames.get(key)
            count = self._sealed + len(self._pending)
        if cached is None:
            cached = to_frame(self.table(key))
            with self._lock:
                if self._sealed + len(self._pending) == count:  # no row came meanwhile
                    self._frames[key] = cached
        return cached.copy(deep=False)

    def write(self, path: Path) -> None:
        """The history as Parquet, batch by batch (never all of it in memory at once)."""
        with pq.ParquetWriter(path, SCHEMA) as writer:
            for batch in self._each_batch():
                writer.write_batch(batch)


def to_frame(rows: list[dict[str, Any]] | pa.Table) -> pd.DataFrame:
    """A history frame of rows (dicts, or an Arrow table of :data:`SCHEMA`): strings backed by
    Arrow, so a frame of millions of rows holds no Python string object."""
    if isinstance(rows, pa.Table):
        frame = rows.to_pandas(types_mapper=_PANDAS_TYPES.get)
    else:
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
    return to_frame(pa.Table.from_batches(batches, schema=SCHEMA))
