"""The provider ledger as files: one append-only Arrow IPC stream per serving process.

Why files: a reader (the harness) takes the rows from disk as they are written, so handing over
a ledger of 300k rows costs the simulator nothing, where ``GET /_sim/ledger`` made it build and
send all of them as JSON while it served nothing else. Why Arrow IPC streams: appending a record
batch is one write, any Arrow reader opens the file (``pyarrow.ipc.open_stream``), and a reader
that keeps its byte offset reads only what is new.

Writing (:class:`ArrowLedgerWriter`, one per process): rows are buffered and written as one
record batch at most ``flush_interval`` seconds after the first of them (or at ``max_rows``).
The batch's ``seq`` values are taken from the shared counter under the directory's lock, so
``seq`` is unique and gapless across the processes: in each process it follows arrival order,
and across processes the order in which their batches were written. The next ``seq`` is
published only after the batch is on disk, so every row below it can be read.

Reading (:class:`LedgerReader`): merges the processes' files of the current epoch (a reset
starts a new one) in ``seq`` order, incrementally. :meth:`SharedDir.wait_flushed` first makes
it see every row answered before the call.
"""

from __future__ import annotations

import array
import asyncio
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from emulators.providers.shared import SharedDir

SCHEMA = pa.schema(
    [
        ("seq", pa.int64()),
        ("provider", pa.string()),
        ("received_at", pa.float64()),
        ("answered_at", pa.float64()),
        ("tenant_id", pa.string()),
        ("notification_id", pa.string()),
        ("token", pa.string()),
        ("project", pa.string()),
        ("status", pa.int32()),
        ("reason", pa.string()),
        ("apns_id", pa.string()),
        ("delivered", pa.bool_()),
        ("fault", pa.string()),
        ("retry_after", pa.int64()),
        ("collapse_id", pa.string()),
        # what the push asked of the provider and showed (ledger.py's module doc says where
        # each is read): as sent, null when absent
        ("push_type", pa.string()),
        ("priority", pa.string()),
        ("expiration", pa.string()),
        ("text", pa.string()),
    ]
)
#: the columns of a buffered row (everything but ``seq``), in order
ROW_COLUMNS = tuple(SCHEMA.names[1:])
_TYPES = [SCHEMA.field(name).type for name in ROW_COLUMNS]
DEFAULT_FLUSH_INTERVAL = 0.02
DEFAULT_MAX_ROWS = 8192
FORMAT = "arrow-ipc-stream"


def rows_to_batch(rows: list[tuple[Any, ...]], first_seq: int) -> pa.RecordBatch:
    """Buffered row tuples (``ROW_COLUMNS`` order) as a record batch numbered from
    ``first_seq``."""
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(ROW_COLUMNS)
    # seq from a C array's buffer: pa.array(range(...)) converts int by int, which cost more
    # (1.1 µs a row) than every other column together
    seq = array.array("q", range(first_seq, first_seq + len(rows)))
    arrays = [pa.Array.from_buffers(pa.int64(), len(rows), [None, pa.py_buffer(seq)])]
    arrays += [pa.array(col, typ) for col, typ in zip(columns, _TYPES, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, schema=SCHEMA)


class ArrowLedgerWriter:
    """This process's ledger file: rows buffered, written in batches (see the module doc)."""

    def __init__(
        self,
        shared: SharedDir,
        name: str,
        *,
        flush_interval: float = DEFAULT_FLUSH_INTERVAL,
        max_rows: int = DEFAULT_MAX_ROWS,
    ) -> None:
        self.shared = shared
        self.name = name
        self.flush_interval = flush_interval
        self.max_rows = max_rows
        self.buffer: list[tuple[Any, ...]] = []
        self._generation = 0
        self._timer: asyncio.TimerHandle | None = None
        #: the epoch this process's rows belong to (the last reset it applied)
        self.epoch = 0
        self._file_epoch: int | None = None
        self._sink: pa.NativeFile | None = None
        self._stream: pa.ipc.RecordBatchStreamWriter | None = None
        self.rows_written = 0

    def append(self, row: tuple[Any, ...]) -> None:
        """Buffer one row (``ROW_COLUMNS`` order); it is on disk within ``flush_interval``."""
        buffer = self.buffer
        if not buffer:
            self._generation = self.shared.mark_dirty()
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
            if loop is not None:
                self._timer = loop.call_later(self.flush_interval, self.flush)
            else:
                buffer.append(row)
                self.flush()
                return
        buffer.append(row)
        if len(buffer) >= self.max_rows:
            self.flush()

    def flush(self) -> None:
        """Write the buffered rows as one record batch (no-op when none).

        Rows buffered before a reset that this process has not applied yet (the shared epoch
        moved on) belong to the ledger the reset cleared: they are dropped, as a reset of the
        in-memory ledger drops its rows."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        rows, self.buffer = self.buffer, []
        generation = self._generation
        if rows:
            with self.shared.locked():
                if self.shared.epoch() == self.epoch:
                    if self._file_epoch != self.epoch:
                        self._open(self.epoch)
                    assert self._stream is not None
                    first = self.shared.ledger_next()
                    self._stream.write_batch(rows_to_batch(rows, first))
                    # published after the batch is written: every seq below it is readable
                    self.shared.publish_ledger_next(first + len(rows))
                    self.rows_written += len(rows)
        self.shared.mark_flushed(generation)

    def start_epoch(self, epoch: int) -> None:
        """A reset applied here: drop what is buffered; rows from now on go to ``epoch``."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.buffer = []
        self.epoch = epoch
        self.shared.mark_flushed(self._generation)

    def _open(self, epoch: int) -> None:
        self._close_file()
        directory = self.shared.ledger_dir(epoch)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{self.name}.arrow"
        self._sink = pa.OSFile(str(path), "ab")
        self._stream = pa.ipc.new_stream(self._sink, SCHEMA)
        self._file_epoch = epoch

    def _close_file(self) -> None:
        if self._stream is not None:
            self._stream.close()
        if self._sink is not None:
            self._sink.close()
        self._stream = self._sink = None

    def close(self) -> None:
        self.flush()
        self._close_file()


class _FileCursor:
    __slots__ = ("offset", "schema_read")

    def __init__(self) -> None:
        self.offset = 0
        self.schema_read = False


def _read_complete_batches(path: Path, cursor: _FileCursor) -> list[pa.RecordBatch]:
    """The record batches wholly written since ``cursor``; advances it past them."""
    try:
        with open(path, "rb") as handle:
            handle.seek(cursor.offset)
            data = handle.read()
    except FileNotFoundError:
        return []
    if not data:
        return []
    source = pa.BufferReader(pa.py_buffer(data))
    messages = pa.ipc.MessageReader.open_stream(source)
    batches: list[pa.RecordBatch] = []
    consumed = 0
    while True:
        try:
            message = messages.read_next_message()
        except StopIteration:
            break  # end of stream marker (the writer closed the file)
        except (pa.ArrowInvalid, OSError):
            break  # a message still being written: read it next time
        if message is None:
            break
        if message.type == "schema":
            cursor.schema_read = True
        elif message.type == "record batch":
            batches.append(pa.ipc.read_record_batch(message, SCHEMA))
        consumed = source.tell()
    cursor.offset += consumed
    return batches


class LedgerReader:
    """Reads one simulator's ledger files (its state directory) in ``seq`` order, incrementally.

    :meth:`read_new` returns the rows not returned before; after a reset (a new epoch) it starts
    again from ``seq`` 0.
    """

    def __init__(self, directory: Path | str, shared: SharedDir | None = None) -> None:
        self.shared = shared if shared is not None else SharedDir(directory)
        self._own_shared = shared is None
        self.epoch: int | None = None
        self.next = 0
        self._cursors: dict[str, _FileCursor] = {}
        self._pending: list[pa.RecordBatch] = []

    def _committed(self) -> tuple[int, int]:
        for _ in range(100):  # a reset between the two reads: read both again
            epoch = self.shared.epoch()
            committed = self.shared.ledger_next()
            if self.shared.epoch() == epoch:
                return epoch, committed
        raise RuntimeError("the ledger epoch keeps changing")

    def read_new(self) -> pa.Table:
        """Rows with ``seq`` from :attr:`next` on, as far as they are on disk, in ``seq``
        order; :attr:`next` moves past them."""
        epoch, committed = self._committed()
        if epoch != self.epoch:
            self.epoch = epoch
            self.next = 0
            self._cursors = {}
            self._pending = []
        directory = self.shared.ledger_dir(epoch)
        try:
            names = sorted(e.name for e in os.scandir(directory) if e.name.endswith(".arrow"))
        except FileNotFoundError:
            names = []
        batches = self._pending
        for name in names:
            cursor = self._cursors.setdefault(name, _FileCursor())
            batches += _read_complete_batches(directory / name, cursor)
        if not batches:
            return SCHEMA.empty_table()
        table = pa.Table.from_batches(batches, schema=SCHEMA)
        seq = table.column("seq")
        ready = pc.less(seq, committed)
        out = table.filter(ready).sort_by("seq")
        later = table.filter(pc.invert(ready))
        self._pending = later.to_batches()
        if out.num_rows:
            self.next = int(out.column("seq")[-1].as_py()) + 1
        return out

    def close(self) -> None:
        if self._own_shared:
            self.shared.close()


class LedgerCache:
    """A serving process's view of the whole ledger (for ``GET /_sim/ledger?since=N``)."""

    def __init__(self, reader: LedgerReader) -> None:
        self.reader = reader
        self._tables: list[pa.Table] = []
        self._epoch: int | None = None

    def snapshot(self, since: int) -> tuple[list[dict[str, Any]], int]:
        if since < 0:
            raise ValueError("since must be >= 0")
        new = self.reader.read_new()
        if self.reader.epoch != self._epoch:
            self._epoch = self.reader.epoch
            self._tables = []
        if new.num_rows:
            self._tables.append(new)
        total = self.reader.next
        if since >= total or not self._tables:
            return [], total
        table = pa.concat_tables(self._tables)
        self._tables = [table]
        return table.slice(since).to_pylist(), total
