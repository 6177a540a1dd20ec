"""The proxy's faults: validation, the active set and the log of every window (pure, no I/O).

Faults (``params``):

* ``hold_shard`` ``{"stream": name | null, "shard": "shardId-000000000001" | 1}``: GetRecords on
  that shard (of that stream, or of any stream when ``stream`` is null) answers no records and
  the shard iterator it was given, so the consumer asks again from the same place: the records
  are held, not skipped. An index ``n`` names ``shardId-<n, 12 digits>``, the id Kinesis gives
  the n-th shard of a stream that was never resharded.
* ``latency`` ``{"ms": N, "operations": ["GetRecords", ...] | null}``: the named operations
  (every operation when null or absent) are forwarded that much later.

Each window keeps what it did (``held_answers``: GetRecords answered empty;
``max_held_records``: the most records one of those answers withheld), so a run can show that a
hold really held something.
"""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

FAULTS = ("hold_shard", "latency")
MAX_LATENCY_MS = 60_000
# Kinesis's own limits on names (StreamName pattern, ShardId length).
STREAM_NAME = re.compile(r"^[a-zA-Z0-9_.-]{1,128}$")
SHARD_ID = re.compile(r"^[a-zA-Z0-9_.-]{1,128}$")
OPERATION = re.compile(r"^[A-Za-z][A-Za-z0-9]{0,63}$")
PARAMS = {"hold_shard": ("stream", "shard"), "latency": ("ms", "operations")}


def shard_id_of(index: int) -> str:
    """The id Kinesis gives the ``index``-th shard of a stream: ``shardId-000000000001``."""
    return f"shardId-{index:012d}"


def _shard(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value < 2**31:
            raise ValueError("hold_shard: params.shard as an index must be 0 or more")
        return shard_id_of(value)
    if isinstance(value, str) and SHARD_ID.match(value):
        return value
    raise ValueError(
        'hold_shard: params.shard must be a shard id ("shardId-000000000001") or an index (1)'
    )


def validate(fault: str, params: Any) -> dict[str, Any]:
    """Normalised params for ``fault``; ValueError naming what is wrong."""
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}: one of {', '.join(FAULTS)}")
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise ValueError(f"{fault}: params must be a JSON object")
    unknown = sorted(set(params) - set(PARAMS[fault]))
    if unknown:
        raise ValueError(
            f"{fault}: unknown param(s) {', '.join(unknown)}; known: {', '.join(PARAMS[fault])}"
        )
    if fault == "hold_shard":
        if "shard" not in params:
            raise ValueError("hold_shard: params.shard is required (a shard id or an index)")
        stream = params.get("stream")
        if stream is not None and not (isinstance(stream, str) and STREAM_NAME.match(stream)):
            raise ValueError("hold_shard: params.stream must be a stream name or null (any stream)")
        return {"stream": stream, "shard": _shard(params["shard"])}
    ms = params.get("ms")
    if isinstance(ms, bool) or not isinstance(ms, int | float) or not 0 <= ms <= MAX_LATENCY_MS:
        raise ValueError(
            f"latency: params.ms must be a number of milliseconds (0..{MAX_LATENCY_MS})"
        )
    operations = params.get("operations")
    if operations is not None:
        if (
            not isinstance(operations, list)
            or not operations
            or not all(isinstance(op, str) and OPERATION.match(op) for op in operations)
        ):
            raise ValueError(
                "latency: params.operations must be a non-empty list of operation names "
                '(["GetRecords", "PutRecord"]) or null (every operation)'
            )
        operations = sorted(set(operations))
    return {"ms": ms, "operations": operations}


@dataclass(frozen=True)
class ShardRef:
    """A shard of a stream, as the proxy learned it from GetShardIterator."""

    stream: str
    shard: str


@dataclass
class ActiveFault:
    id: str
    fault: str
    params: dict[str, Any]
    started_at: float
    stopped_at: float | None = None
    held_answers: int = 0
    max_held_records: int = 0

    def holds(self, ref: ShardRef) -> bool:
        stream = self.params["stream"]
        return ref.shard == self.params["shard"] and (stream is None or stream == ref.stream)

    def delays(self, operation: str) -> bool:
        operations = self.params["operations"]
        return operations is None or operation in operations

    def window(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "fault": self.fault,
            "params": dict(self.params),
            "started_at": self.started_at,
            "stopped_at": self.stopped_at,
        }
        if self.fault == "hold_shard":
            out["held_answers"] = self.held_answers
            out["max_held_records"] = self.max_held_records
        return out


@dataclass
class FaultState:
    """The active faults and every window ever started (single-threaded: the event loop)."""

    clock: Callable[[], float] = time.time
    _ids: itertools.count = field(default_factory=lambda: itertools.count(1))
    _active: list[ActiveFault] = field(default_factory=list)
    _log: list[ActiveFault] = field(default_factory=list)

    def start(self, fault: str, params: Any = None) -> ActiveFault:
        active = ActiveFault(
            id=f"f{next(self._ids)}",
            fault=fault,
            params=validate(fault, params),
            started_at=self.clock(),
        )
        self._active.append(active)
        self._log.append(active)
        return active

    def stop(self, fault_id: str) -> ActiveFault | None:
        """The window stopped now, or None when no active fault has that id."""
        for active in self._active:
            if active.id == fault_id:
                active.stopped_at = self.clock()
                self._active.remove(active)
                return active
        return None

    def stop_all(self) -> list[ActiveFault]:
        stopped, self._active = self._active, []
        now = self.clock()
        for active in stopped:
            active.stopped_at = now
        return stopped

    def get(self, fault_id: str) -> ActiveFault | None:
        return next((f for f in self._log if f.id == fault_id), None)

    def active(self) -> list[ActiveFault]:
        return list(self._active)

    def log(self) -> list[dict[str, Any]]:
        return [f.window() for f in self._log]

    # -- decisions ------------------------------------------------------------------------------
    def holding(self, ref: ShardRef | None) -> list[ActiveFault]:
        """The active hold faults that hold this shard (none for an unknown iterator)."""
        if ref is None:
            return []
        return [f for f in self._active if f.fault == "hold_shard" and f.holds(ref)]

    def latency_for(self, operation: str) -> float:
        """Seconds to wait before forwarding this operation."""
        return (
            sum(
                f.params["ms"] for f in self._active if f.fault == "latency" and f.delays(operation)
            )
            / 1000.0
        )
