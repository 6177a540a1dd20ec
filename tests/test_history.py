"""The run history's store: rows appended as dicts, sealed into Arrow batches, read back in
order by a live reader's cursor, as one frame, and from the files it writes."""

from __future__ import annotations

import math

import pandas as pd

from harness.model import history as history_mod
from harness.model.history import History, read, read_partial


def _filled(n: int, seal_rows: int, monkeypatch) -> History:
    monkeypatch.setattr(history_mod, "SEAL_ROWS", seal_rows)
    history = History()
    for i in range(n):
        history.append("inject", tenant_id=f"t{i % 3}", notification_id=f"n{i}", status=i)
    return history


def test_rows_come_back_in_order_across_sealed_batches_and_pending_rows(monkeypatch):
    history = _filled(25, seal_rows=10, monkeypatch=monkeypatch)
    assert len(history) == 25
    for cursor in (0, 3, 10, 19, 20, 24, 25):
        rows = history.rows_since(cursor)
        assert [r["notification_id"] for r in rows] == [f"n{i}" for i in range(cursor, 25)]
        assert [r["seq"] for r in rows] == list(range(cursor, 25))
    # A sealed row carries every column; one it never set is None.
    (sealed,) = history.rows_since(0)[:1]
    assert sealed["token"] is None and sealed["kind"] == "inject"


def test_the_frame_is_every_row_with_arrow_strings_and_each_caller_gets_its_own(monkeypatch):
    history = _filled(25, seal_rows=10, monkeypatch=monkeypatch)
    first = history.frame()
    assert list(first["seq"]) == list(range(25)) and list(first["status"]) == list(range(25))
    assert first["tenant_id"].dtype == pd.StringDtype("pyarrow")
    assert first["delivered"].dtype == "boolean" and first["status"].dtype == "Int64"
    first["tenant_id"] = "changed"  # a caller's change stays its own
    assert set(history.frame()["tenant_id"]) == {"t0", "t1", "t2"}
    history.append("provider", token="x", mono=math.nan)
    assert len(history.frame()) == 26 and history.frame()["token"].iloc[-1] == "x"


def test_the_written_and_the_streamed_history_read_back_as_the_frame(monkeypatch, tmp_path):
    history = _filled(0, seal_rows=10, monkeypatch=monkeypatch)
    history.stream_to(tmp_path / "history.arrows", interval_s=60)
    for i in range(25):
        history.append("inject", tenant_id="t", notification_id=f"n{i}")
    assert history.flush() == 25 and history.flush() == 0
    history.close_stream()
    history.write(tmp_path / "history.parquet")
    expected = history.frame()
    pd.testing.assert_frame_equal(read(tmp_path / "history.parquet"), expected)
    pd.testing.assert_frame_equal(read_partial(tmp_path / "history.arrows"), expected)


def test_a_frame_without_some_kinds_leaves_them_out_and_goes_stale_with_a_new_row(monkeypatch):
    history = _filled(12, seal_rows=5, monkeypatch=monkeypatch)
    history.append("audit", detail="{}")
    history.append("receive", detail="{}")
    slim = history.frame(without=("audit", "receive"))
    assert list(slim["kind"].unique()) == ["inject"] and len(slim) == 12
    assert len(history.frame()) == 14  # the whole frame is kept apart
    history.append("fault", detail="{}")
    assert list(history.frame(without=("audit", "receive"))["kind"])[-1] == "fault"


def test_a_streamed_history_keeps_only_its_latest_rows_in_memory_and_reads_the_rest_back(
    monkeypatch, tmp_path
):
    monkeypatch.setattr(history_mod, "SEAL_ROWS", 10)
    monkeypatch.setattr(history_mod, "KEEP_ROWS_IN_MEMORY", 15)
    history = History()
    stream = tmp_path / "history.arrows"
    history.stream_to(stream, interval_s=60)
    for i in range(57):
        history.append("inject", tenant_id="t", notification_id=f"n{i}")
        if i % 10 == 9:
            history.flush()
    history.flush()
    in_memory = [b for b in history._batches if b is not None]
    assert sum(b.num_rows for b in in_memory) <= 15 + 10  # older batches only on disk
    assert history._batches[0] is None
    history.close_stream()
    history.write(tmp_path / "history.parquet")
    stream.unlink()  # as the run does: its summaries still read the rows afterwards
    ids = [f"n{i}" for i in range(57)]
    assert list(history.frame()["notification_id"]) == ids
    assert list(read(tmp_path / "history.parquet")["notification_id"]) == ids
    for cursor in (0, 5, 33, 50, 57):  # a reader behind the rows kept, and one within them
        assert [r["notification_id"] for r in history.rows_since(cursor)] == ids[cursor:]
    assert list(history.frame(without=("inject",))["seq"]) == []
