"""Toxiproxy 2.x toxics, each a small class acting on one direction's chunk stream.

A toxic never pops a chunk before it has passed it on (or dropped it on purpose): it waits
for the head of its stage's queue, works on it, then forwards it. So a toxic can be stopped at
any ``await`` (removed, updated, connection closed) and every byte it had not passed on is
still at the head of the queue, in order: this is what lets the proxy add, remove and update
toxics on live connections without losing or reordering data (Toxiproxy's ``link.go`` gets the
same guarantee with interrupt channels).

Attributes and units are Toxiproxy's (``toxics/*.go``): latency/jitter in ms, bandwidth rate in
KB/s (1 KB = 1000 bytes), slow_close delay in ms, timeout in ms (0 = never), reset_peer timeout
in ms, slicer average_size/size_variation in bytes and delay in µs, limit_data in bytes.
Randomness (jitter, slicing, toxicity) comes from the stage's injectable ``random.Random``.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

INT64_MAX = (1 << 63) - 1


@dataclass
class Chunk:
    """Bytes read from one socket, with the loop time they became available to a toxic."""

    data: bytes | memoryview
    ts: float


class Stub(Protocol):
    """What a toxic sees of its stage (implemented by :class:`chaos.toxiproxy.proxy.Stage`).

    The queue holds chunks and, last, ``None`` for end of stream.
    """

    rng: random.Random
    #: per-connection state of a stateful toxic (kept across updates), else None
    state: Any

    def now(self) -> float: ...

    async def wait(self, deadline: float | None = None) -> bool:
        """Wait for the queue to be non-empty (True), or until ``deadline`` (False)."""
        ...

    def peek(self) -> Chunk | None:
        """The head of the queue (``None``: end of stream). Only after ``wait()`` is True."""
        ...

    def forward(self) -> None:
        """Pass the head on to the next toxic (or the socket), end of stream included."""
        ...

    def forward_part(self, size: int) -> None:
        """Pass on the first ``size`` bytes of the head chunk; the rest stays at the head."""
        ...

    def drop(self) -> None:
        """Discard the head chunk."""
        ...

    def close(self) -> None:
        """Close this toxic's output: discard what is queued, send end of stream on."""
        ...

    def reset(self) -> None:
        """Reset the whole connection (TCP RST to both peers, SO_LINGER 0)."""
        ...


async def sleep_until(stub: Stub, deadline: float) -> None:
    delay = deadline - stub.now()
    if delay > 0:
        await asyncio.sleep(delay)


class Toxic:
    """Base class: integer attributes, decoded like Go's ``encoding/json`` into ``int64``."""

    type_name: ClassVar[str] = ""
    fields: ClassVar[tuple[str, ...]] = ()
    #: removing the toxic closes the connection instead of releasing its data (timeout)
    close_on_remove: ClassVar[bool] = False
    #: passes everything through unchanged: the stage need not run a task for it
    passthrough: ClassVar[bool] = False

    def __init__(self, **values: int) -> None:
        for name in self.fields:
            setattr(self, name, int(values.get(name, 0)))

    def attributes(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.fields}

    def updated(self, raw: Any) -> Toxic:
        """A copy with the attributes in ``raw`` (a JSON object) applied; ValueError if bad."""
        values = self.attributes()
        if raw is None:
            return type(self)(**values)
        if not isinstance(raw, Mapping):
            raise ValueError(
                f"json: cannot unmarshal {_json_kind(raw)} into Go struct field "
                f"ToxicWrapper.attributes of type toxics.{type(self).__name__}"
            )
        for key, value in raw.items():
            name = self._field_for(str(key))
            if name is None or value is None:
                continue  # unknown keys are ignored, null leaves the value, as in Go
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(
                    f"json: cannot unmarshal {_json_kind(value)} into Go struct field "
                    f".attributes.{name} of type int64"
                )
            if not -INT64_MAX - 1 <= value <= INT64_MAX:
                raise ValueError(f"json: cannot unmarshal number {value} into int64")
            if value < 0:
                raise ValueError(f"attribute {name} must not be negative (got {value})")
            values[name] = value
        return type(self)(**values)

    @classmethod
    def _field_for(cls, key: str) -> str | None:
        if key in cls.fields:
            return key
        folded = key.casefold()  # Go's encoding/json matches field names case-insensitively
        for name in cls.fields:
            if name.casefold() == folded:
                return name
        return None

    def new_state(self) -> Any:
        return None

    async def pipe(self, stub: Stub) -> None:
        raise NotImplementedError


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return f"number {value}"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


class NoopToxic(Toxic):
    type_name = "noop"
    passthrough = True

    async def pipe(self, stub: Stub) -> None:
        while await stub.wait():
            end = stub.peek() is None
            stub.forward()
            if end:
                return


class LatencyToxic(Toxic):
    """Each chunk leaves ``latency ± jitter`` ms after it arrived (not after the previous one,
    so queued chunks are not delayed twice and latency does not limit bandwidth)."""

    type_name = "latency"
    fields = ("latency", "jitter")
    latency: int
    jitter: int

    def delay(self, rng: random.Random) -> float:
        delay = self.latency
        if self.jitter > 0:
            delay += rng.randrange(self.jitter * 2) - self.jitter
        return delay / 1000.0

    async def pipe(self, stub: Stub) -> None:
        while await stub.wait():
            chunk = stub.peek()
            if chunk is None:
                stub.forward()
                return
            due = chunk.ts + self.delay(stub.rng)
            await sleep_until(stub, due)
            chunk.ts = max(due, stub.now())  # a later latency toxic adds its own delay
            stub.forward()


class BandwidthToxic(Toxic):
    """At most ``rate`` KB/s; chunks larger than 100 ms worth leave in 100 ms pieces.

    Deadlines are absolute, so timer overshoot does not accumulate; like Toxiproxy, idle time
    earns no burst credit. ``rate`` 0 stalls the stream (as it does in Toxiproxy).
    """

    type_name = "bandwidth"
    fields = ("rate",)
    rate: int

    async def pipe(self, stub: Stub) -> None:
        debt = 0.0  # seconds of transmission owed; negative: credit for a late timer
        while await stub.wait():
            chunk = stub.peek()
            if chunk is None:
                stub.forward()
                return
            if self.rate <= 0:
                await asyncio.get_running_loop().create_future()  # stall until removed
                return
            bytes_per_s = self.rate * 1000.0
            piece = self.rate * 100  # bytes per 100 ms
            debt += len(chunk.data) / bytes_per_s
            clock = stub.now()
            while len(chunk.data) > piece:
                clock += 0.1
                await sleep_until(stub, clock)
                stub.forward_part(piece)
                debt -= 0.1
                chunk = stub.peek()
                assert chunk is not None
            clock += debt
            await sleep_until(stub, clock)
            debt = min(0.0, clock - stub.now())
            stub.forward()


class SlowCloseToxic(Toxic):
    """Data passes; the end of the stream is held back ``delay`` ms."""

    type_name = "slow_close"
    fields = ("delay",)
    delay: int

    async def pipe(self, stub: Stub) -> None:
        while await stub.wait():
            if stub.peek() is None:
                await asyncio.sleep(self.delay / 1000.0)
                stub.forward()
                return
            stub.forward()


class TimeoutToxic(Toxic):
    """Drops every byte; closes the connection ``timeout`` ms after the toxic started or after
    the last data arrived (0: never). Removing it closes the connection (Toxiproxy's Cleanup).
    """

    type_name = "timeout"
    fields = ("timeout",)
    close_on_remove = True
    timeout: int

    async def pipe(self, stub: Stub) -> None:
        while True:
            deadline = stub.now() + self.timeout / 1000.0 if self.timeout > 0 else None
            if not await stub.wait(deadline):
                stub.close()
                return
            if stub.peek() is None:
                stub.close()
                return
            stub.drop()


class ResetPeerToxic(Toxic):
    """On the first data (or end of stream), wait ``timeout`` ms, then reset the connection:
    SO_LINGER 0 and close, so both peers get a TCP RST ("connection reset by peer")."""

    type_name = "reset_peer"
    fields = ("timeout",)
    timeout: int

    async def pipe(self, stub: Stub) -> None:
        await stub.wait()
        if stub.peek() is not None:
            stub.drop()
        await asyncio.sleep(self.timeout / 1000.0)
        stub.reset()


class SlicerToxic(Toxic):
    """Slices each chunk into pieces of about ``average_size ± size_variation`` bytes, each
    followed by ``delay`` µs."""

    type_name = "slicer"
    fields = ("average_size", "size_variation", "delay")
    average_size: int
    size_variation: int
    delay: int

    def offsets(self, size: int, rng: random.Random) -> list[int]:
        """Slice boundaries of a chunk of ``size`` bytes, as Toxiproxy's ``chunk()``: split in
        about two (± variation) until a piece is within the variation of the average."""
        average = max(1, self.average_size)
        variation = max(0, self.size_variation)
        out = [0]
        stack = [(0, size)]
        while stack:
            start, end = stack.pop()
            if (end - start) - average <= variation:
                out.append(end)
                continue
            mid = start + (end - start) // 2
            if variation > 0:
                mid += rng.randrange(variation * 2) - variation
            mid = min(max(mid, start + 1), end - 1)
            stack.append((mid, end))
            stack.append((start, mid))
        return out

    async def pipe(self, stub: Stub) -> None:
        while await stub.wait():
            chunk = stub.peek()
            if chunk is None:
                stub.forward()
                return
            bounds = self.offsets(len(chunk.data), stub.rng)
            for start, end in zip(bounds, bounds[1:], strict=False):
                stub.forward_part(end - start)
                if self.delay > 0:
                    await asyncio.sleep(self.delay / 1_000_000)


@dataclass
class LimitDataState:
    transmitted: int = 0


class LimitDataToxic(Toxic):
    """Lets ``bytes`` bytes through per connection, then closes it (stateful: the count
    survives updates of the toxic, as in Toxiproxy)."""

    type_name = "limit_data"
    fields = ("bytes",)
    bytes: int

    def new_state(self) -> LimitDataState:
        return LimitDataState()

    async def pipe(self, stub: Stub) -> None:
        state: LimitDataState = stub.state
        while await stub.wait():
            chunk = stub.peek()
            if chunk is None:
                stub.close()
                return
            remaining = max(0, self.bytes - state.transmitted)
            size = len(chunk.data)
            if remaining < size:
                if remaining > 0:
                    stub.forward_part(remaining)
                    state.transmitted += remaining
                stub.close()
                return
            stub.forward()
            state.transmitted += size
            if state.transmitted >= self.bytes:
                stub.close()
                return


TOXICS: dict[str, type[Toxic]] = {
    cls.type_name: cls
    for cls in (
        NoopToxic,
        LatencyToxic,
        BandwidthToxic,
        SlowCloseToxic,
        TimeoutToxic,
        ResetPeerToxic,
        SlicerToxic,
        LimitDataToxic,
    )
}


def new_toxic(type_name: str) -> Toxic | None:
    """A toxic of that type with every attribute 0, or None for an unknown type."""
    cls = TOXICS.get(type_name)
    return cls() if cls is not None else None
