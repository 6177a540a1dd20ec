"""The run history: one append-only table, Jepsen style, written as Parquet.

Every injected operation, every provider request and (later) every fault window is a row. Wall
time (``time``, epoch seconds) orders rows across processes on this machine; ``mono`` is the
harness's monotonic clock where the harness itself observed the row.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pandas as pd

COLUMNS = {
    "seq": "int64",
    "kind": "string",  # inject | provider | fault | action | dlq | phase | sample | alarm |
    # audit | receive
    "time": "float64",
    "mono": "float64",
    "tenant_id": "string",
    "author_id": "string",
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
}


class History:
    def __init__(self) -> None:
        self._rows: list[dict[str, Any]] = []
        self._lock = threading.Lock()

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
            )

    def __len__(self) -> int:
        return len(self._rows)

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
    return pd.read_parquet(path).astype(COLUMNS)
