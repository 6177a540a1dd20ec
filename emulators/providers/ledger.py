"""The provider request ledger (ground truth of delivery) and the shared simulator state.

Also holds the control API that both simulators serve on their port (``/_sim/...``; the fault
routes ``/_sim/faults...`` are in :mod:`emulators.providers.faults`).

Ledger rows: ``seq, provider, received_at, answered_at`` (when the answer left, after any
latency fault's delay), ``tenant_id, notification_id, token, project, status, reason, apns_id``
and ``delivered`` (the device got it: a 200, or an accepted_then_error fault's
5xx; not a validate_only dry run), ``fault`` (id of the fault that shaped the answer, else null),
``retry_after`` (the Retry-After sent, else null), ``collapse_id`` (APNs ``apns-collapse-id``;
FCM ``android.collapse_key`` or ``apns.headers["apns-collapse-id"]``; else null).

What the push asked of the provider and what it showed, as sent (strings; null when absent, so
a provider's default applies), on every row, errors included:

* ``push_type``: APNs ``apns-push-type``; FCM the ``apns-push-type`` of ``message.apns.headers``
  (what FCM forwards to an iOS device; Android has no push type).
* ``priority``: APNs ``apns-priority`` (``"10"``, ``"5"``, ``"1"``; absent is 10 for Apple);
  FCM ``message.android.priority`` as written (``"HIGH"``, ``"normal"``, ...), else the
  ``apns-priority`` of ``message.apns.headers`` (a number: told apart by its form).
* ``expiration``: APNs ``apns-expiration`` (UNIX epoch seconds; ``"0"``: deliver once, never
  stored); FCM ``message.android.ttl`` (a duration, ``"3600s"``), else the ``apns-expiration``
  of ``message.apns.headers``. Raw, not normalised: an epoch and a duration are told apart by
  their form, and the reader relates an epoch to ``received_at``.
* ``text``: the alert a person sees: APNs ``aps.alert`` (a string, or the alert dictionary's
  ``title`` and ``body`` joined by a newline, else its ``title-loc-key`` / ``loc-key``); FCM
  ``message.notification``'s title and body, else ``message.android.notification``'s (title,
  body, else their ``_loc_key``). ``""``: an alert or notification with nothing in it; null: a
  push without one (a background / data message). At most :data:`TEXT_LIMIT` characters.

Two ledgers: :class:`Ledger` in memory (a state made in-process, the SES and in-app simulators)
and :class:`FileLedger`, what the APNs and FCM simulators' command lines use: Arrow files in a
state directory shared by their serving processes (:mod:`emulators.providers.serving`), read
in place by the run and merged for ``GET /_sim/ledger``; ``GET /_sim/ledger/source`` says where.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from emulators.http_server import Request, Response, json_response
from emulators.providers.faults import FaultSet, handle_fault_control
from emulators.providers.ledger_files import (
    DEFAULT_FLUSH_INTERVAL,
    FORMAT,
    ROW_COLUMNS,
    ArrowLedgerWriter,
    LedgerCache,
    LedgerReader,
)
from emulators.providers.shared import SharedDir

log = logging.getLogger(__name__)
#: how long a ledger read waits for the other processes to write what they buffered
BARRIER_TIMEOUT = 2.0
# How an APNs token that died may be answered: 410 Unregistered (the default: the app was
# removed) or 400 BadDeviceToken (a token APNs does not accept, e.g. of the other environment).
APNS_DEAD_REASONS = ("Unregistered", "BadDeviceToken")

# Where a push names its tenant and notification (dotted paths into the JSON the provider
# receives: the APNs payload, the FCM HTTP v1 request body): the defaults, and what a system
# states instead (``PUT /_sim/payload-ids``). The ledger's tenant_id / notification_id are read
# there; a push that names them elsewhere is recorded without them.
ID_FIELDS = ("tenant_id", "notification_id")
DEFAULT_PAYLOAD_IDS: dict[str, dict[str, str]] = {
    "apns": {"tenant_id": "tenant_id", "notification_id": "notification_id"},
    "fcm": {
        "tenant_id": "message.data.tenant_id",
        "notification_id": "message.data.notification_id",
    },
}


def value_at(document: Any, path: tuple[str, ...]) -> str | None:
    """The value at ``path`` in a JSON document, as a string; None when it is absent."""
    value = document
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
        if value is None:
            return None
    if isinstance(value, (dict, list)):
        return None
    return value if value.__class__ is str else str(value)


def parse_payload_ids(body: Any) -> dict[str, str]:
    """A ``PUT /_sim/payload-ids`` body, each field a dotted path; ValueError saying what is
    wrong."""
    if not isinstance(body, dict) or set(body) - set(ID_FIELDS):
        raise ValueError(f"body must be an object with {' and/or '.join(ID_FIELDS)}")
    for field, path in body.items():
        if not isinstance(path, str) or not path or any(not p for p in path.split(".")):
            raise ValueError(f"{field} must be a dotted path such as 'meta.id', got {path!r}")
    return dict(body)


ROW_KEYS = (
    "seq",
    "provider",
    "received_at",
    "answered_at",
    "tenant_id",
    "notification_id",
    "token",
    "project",
    "status",
    "reason",
    "apns_id",
    "delivered",
    "fault",
    "retry_after",
    "collapse_id",
    "push_type",
    "priority",
    "expiration",
    "text",
)
#: the longest ``text`` a ledger row keeps (a 4 KB alert in every row of a 300k-row ledger
#: would be a gigabyte; what is judged is whether there is one)
TEXT_LIMIT = 256


class Ledger:
    """Thread-safe, append-only (until :meth:`reset`) list of provider requests.

    ``seq`` counts from 0 and equals the row's index; :meth:`reset` starts again at 0.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: list[dict[str, Any]] = []

    def append(
        self,
        *,
        provider: str,
        token: str,
        status: int,
        tenant_id: str | None = None,
        notification_id: str | None = None,
        project: str | None = None,
        reason: str | None = None,
        apns_id: str | None = None,
        received_at: float | None = None,
        answered_at: float | None = None,
        delivered: bool | None = None,
        fault: str | None = None,
        retry_after: float | None = None,
        collapse_id: str | None = None,
        push_type: str | None = None,
        priority: str | None = None,
        expiration: str | None = None,
        text: str | None = None,
    ) -> dict[str, Any]:
        """Record one request; returns a copy of the stored row (with its ``seq``).

        ``delivered`` defaults to ``status == 200``.
        """
        now = time.time()
        with self._lock:
            row = {
                "seq": len(self._rows),
                "provider": provider,
                "received_at": now if received_at is None else received_at,
                "answered_at": now if answered_at is None else answered_at,
                "tenant_id": tenant_id,
                "notification_id": notification_id,
                "token": token,
                "project": project,
                "status": status,
                "reason": reason,
                "apns_id": apns_id,
                "delivered": status == 200 if delivered is None else delivered,
                "fault": fault,
                "retry_after": retry_after,
                "collapse_id": collapse_id,
                "push_type": push_type,
                "priority": priority,
                "expiration": expiration,
                "text": text,
            }
            self._rows.append(row)
            return dict(row)

    def append_row(self, row: tuple[Any, ...]) -> None:
        """:meth:`append` with every column but ``seq`` given in ``ROW_COLUMNS`` order (the
        simulators' hot path: no keyword arguments to match)."""
        with self._lock:
            self._rows.append({"seq": len(self._rows), **dict(zip(ROW_COLUMNS, row, strict=True))})

    def rows(self, since: int = 0) -> list[dict[str, Any]]:
        """Copies of the rows with ``seq >= since``."""
        return self.snapshot(since)[0]

    def snapshot(self, since: int = 0) -> tuple[list[dict[str, Any]], int]:
        """Rows with ``seq >= since`` and the ``seq`` the next row will get, read atomically."""
        if since < 0:
            raise ValueError("since must be >= 0")
        with self._lock:
            return [dict(r) for r in self._rows[since:]], len(self._rows)

    def reset(self) -> None:
        with self._lock:
            self._rows.clear()

    def reset_to(self, epoch: int) -> None:
        self.reset()

    def __len__(self) -> int:
        with self._lock:
            return len(self._rows)


class FileLedger:
    """The ledger of a simulator that runs as several processes (or streams its ledger): each
    process appends to its own Arrow file (:mod:`emulators.providers.ledger_files`), readers
    merge them. Same ``append`` as :class:`Ledger`; reads go through :meth:`snapshot_async`,
    which first waits (bounded) until every process has written the rows it buffered."""

    def __init__(self, shared: SharedDir, name: str, *, flush_interval: float) -> None:
        self.shared = shared
        if shared.slot is None:
            shared.claim_slot()
        self.writer = ArrowLedgerWriter(shared, name, flush_interval=flush_interval)
        self.cache = LedgerCache(LedgerReader(shared.path, shared))
        self._buffer_append = self.writer.append
        #: one row, every column but ``seq`` in ``ROW_COLUMNS`` order (the hot path)
        self.append_row = self.writer.append

    def append(
        self,
        *,
        provider: str,
        token: str,
        status: int,
        tenant_id: str | None = None,
        notification_id: str | None = None,
        project: str | None = None,
        reason: str | None = None,
        apns_id: str | None = None,
        received_at: float | None = None,
        answered_at: float | None = None,
        delivered: bool | None = None,
        fault: str | None = None,
        retry_after: float | None = None,
        collapse_id: str | None = None,
        push_type: str | None = None,
        priority: str | None = None,
        expiration: str | None = None,
        text: str | None = None,
    ) -> None:
        now = time.time()
        self._buffer_append(
            (
                provider,
                now if received_at is None else received_at,
                now if answered_at is None else answered_at,
                tenant_id,
                notification_id,
                token,
                project,
                status,
                reason,
                apns_id,
                status == 200 if delivered is None else delivered,
                fault,
                None if retry_after is None else int(retry_after),
                collapse_id,
                push_type,
                priority,
                expiration,
                text,
            )
        )

    async def snapshot_async(
        self, since: int = 0, timeout: float = BARRIER_TIMEOUT
    ) -> tuple[list[dict[str, Any]], int]:
        if since < 0:
            raise ValueError("since must be >= 0")
        self.writer.flush()
        deadline = time.monotonic() + timeout
        while not self.shared.wait_flushed(timeout=0):
            if time.monotonic() > deadline:
                log.warning("ledger read: a process did not flush within %.1f s", timeout)
                break
            await asyncio.sleep(0.002)  # the other processes flush on their own timers
        return self.cache.snapshot(since)

    def snapshot(self, since: int = 0) -> tuple[list[dict[str, Any]], int]:
        """Blocking form of :meth:`snapshot_async` (not on a serving event loop)."""
        if since < 0:
            raise ValueError("since must be >= 0")
        self.writer.flush()
        self.shared.wait_flushed(timeout=BARRIER_TIMEOUT)
        return self.cache.snapshot(since)

    def rows(self, since: int = 0) -> list[dict[str, Any]]:
        return self.snapshot(since)[0]

    def reset_to(self, epoch: int) -> None:
        """A reset: the shared directory has a new epoch; rows buffered before it are void."""
        self.writer.start_epoch(epoch)

    def close(self) -> None:
        self.writer.close()


class ProviderState:
    """Everything a simulator remembers: the ledger, the unregistered tokens, the faults.

    ``clock`` is the monotonic clock of the faults' quota windows (injectable for tests).

    With ``shared`` (a :class:`~emulators.providers.shared.SharedDir`), this is one of several
    processes serving one simulator: the ledger goes to this process's Arrow file, and every
    change of state (reset, unregistered tokens, faults) is an event in the shared journal that
    every process applies (:meth:`sync`, called before each request) in the same order.
    """

    def __init__(
        self,
        provider: str,
        clock: Callable[[], float] = time.monotonic,
        *,
        shared: SharedDir | None = None,
        process_name: str = "p0",
        flush_interval: float = DEFAULT_FLUSH_INTERVAL,
        unsupported_faults: dict[str, str] | None = None,
    ) -> None:
        self.provider = provider
        self.shared = shared
        self.ledger: Ledger | FileLedger = (
            Ledger()
            if shared is None
            else FileLedger(shared, process_name, flush_interval=flush_interval)
        )
        self._lock = threading.Lock()
        self._unregistered: dict[str, int] = {}
        # token -> id of the unregister fault that marked it (absent: marked via the control API)
        self._unregistered_by: dict[str, str] = {}
        # token -> how the provider says it is dead, when not its default (APNs: BadDeviceToken)
        self._unregistered_reason: dict[str, str] = {}
        self._journal_at = 0
        self.payload_ids: dict[str, tuple[str, ...]] = {
            field: tuple(path.split("."))
            for field, path in DEFAULT_PAYLOAD_IDS.get(provider, {}).items()
        }
        # A simulator's own kinds of state change (APNs signing keys, ...): op -> how to apply
        # it, journalled across processes like the rest; and what a reset restores.
        self._extension_ops: dict[str, Callable[[dict[str, Any]], None]] = {}
        self._on_reset: list[Callable[[], None]] = []
        self.faults = FaultSet(
            provider,
            self._unregister_from_fault,
            clock,
            publish=self.publish,
            count_in_window=shared.count_in_window if shared is not None else None,
            unsupported=unsupported_faults,
        )
        if shared is not None:
            self.sync()

    def extend(
        self,
        ops: dict[str, Callable[[dict[str, Any]], None]],
        on_reset: Callable[[], None] | None = None,
    ) -> None:
        """Teach this state a simulator's own events (``publish({"op": name, ...})`` then
        reaches ``ops[name]`` in every process) and what a reset restores. Events journalled
        before the extension are applied again now."""
        self._extension_ops.update(ops)
        if on_reset is not None:
            self._on_reset.append(on_reset)
        if self.shared is not None:
            events, _ = self.shared.read_events(0, self._journal_at)
            for event in events:
                if event["op"] in ops:
                    ops[event["op"]](event)
                elif event["op"] == "reset" and on_reset is not None:
                    on_reset()

    # -- events ---------------------------------------------------------------------------------
    def sync(self) -> None:
        """Apply the control events other processes journalled (one read when there are none)."""
        shared = self.shared
        if shared is not None and shared.journal_length() != self._journal_at:
            self._replay()

    def _replay(self) -> None:
        assert self.shared is not None
        events, self._journal_at = self.shared.read_events(self._journal_at)
        for event in events:
            self._apply(event)

    def publish(self, event: dict[str, Any]) -> dict[str, Any]:
        """Make a change of state: here alone, or journalled for every process."""
        if self.shared is None:
            event = self.faults.finalize(event)
            self._apply(event)
            return event
        with self.shared.locked():
            self._replay()  # finalize against the latest state
            event = self.faults.finalize(event)
            if event["op"] == "reset":
                event = {**event, "epoch": self.shared.new_epoch()}
            self.shared.append_event(event)
            self._replay()
        return event

    def _apply(self, event: dict[str, Any]) -> None:
        op = event["op"]
        if op == "reset":
            self.faults.reset(event["at"])
            with self._lock:
                self._unregistered.clear()
                self._unregistered_by.clear()
                self._unregistered_reason.clear()
            self.ledger.reset_to(event.get("epoch", 0))
            for restore in self._on_reset:
                restore()
        elif op in self._extension_ops:
            self._extension_ops[op](event)
        elif op == "unregister":
            self._mark(event["tokens"], event["at_ms"], event.get("fault"), event.get("reason"))
        elif op == "revive":
            self._revive(event["tokens"])
        elif op == "payload_ids":
            self.payload_ids.update({f: tuple(p.split(".")) for f, p in event["paths"].items()})
        else:
            self.faults.apply(event)

    # -- commands -------------------------------------------------------------------------------
    def mark_unregistered(
        self,
        tokens: list[str],
        at_ms: int | None = None,
        fault: str | None = None,
        reason: str | None = None,
    ) -> int:
        """Tokens that now answer 410 Unregistered / 404 UNREGISTERED (APNs, ``reason``
        BadDeviceToken: 400 BadDeviceToken); returns how many."""
        stamp = int(time.time() * 1000) if at_ms is None else at_ms
        event: dict[str, Any] = {"op": "unregister", "tokens": list(tokens), "at_ms": stamp}
        if fault is not None:
            event["fault"] = fault
        if reason is not None:
            event["reason"] = reason
        self.publish(event)
        return len(tokens)

    def _mark(
        self, tokens: list[str], stamp: int, fault: str | None, reason: str | None = None
    ) -> None:
        with self._lock:
            for token in tokens:
                if token not in self._unregistered:
                    self._unregistered[token] = stamp
                    if fault is not None:
                        self._unregistered_by[token] = fault
                    if reason is not None:
                        self._unregistered_reason[token] = reason

    def revive(self, tokens: list[str]) -> int:
        """Tokens that answer again as valid (an app installed again got its token back, as
        APNs and FCM may hand out the same string); returns how many were dead."""
        dead = sum(1 for t in tokens if t in self._unregistered)
        self.publish({"op": "revive", "tokens": list(tokens)})
        return dead

    def _revive(self, tokens: list[str]) -> None:
        with self._lock:
            for token in tokens:
                self._unregistered.pop(token, None)
                self._unregistered_by.pop(token, None)
                self._unregistered_reason.pop(token, None)

    def _unregister_from_fault(
        self, tokens: list[str], fault: str, at_ms: int | None = None, publish: bool = True
    ) -> None:
        if publish:
            self.mark_unregistered(tokens, at_ms, fault=fault)
        else:
            self._mark(tokens, int(time.time() * 1000) if at_ms is None else at_ms, fault)

    def unregistered_at(self, token: str) -> int | None:
        """Epoch milliseconds at which ``token`` was marked unregistered, or None."""
        return self._unregistered.get(token)  # one dict read: atomic, no lock needed

    def unregistered_reason(self, token: str) -> str | None:
        """How a dead token's death is answered, when not the provider's default."""
        return self._unregistered_reason.get(token)  # one dict read: atomic, no lock needed

    def unregistered_by(self, token: str) -> str | None:
        """The id of the unregister fault that marked ``token`` (None: not by a fault)."""
        with self._lock:
            return self._unregistered_by.get(token)

    def reset(self) -> None:
        self.publish({"op": "reset", "at": time.time()})

    def set_payload_ids(self, paths: dict[str, str]) -> None:
        """Where pushes name their tenant and notification from now on (kept through resets:
        it is the system's contract, not a run's state)."""
        self.publish({"op": "payload_ids", "paths": dict(paths)})

    def payload_id(self, document: Any, field: str) -> str | None:
        """``field`` (tenant_id or notification_id) as the push names it."""
        path = self.payload_ids.get(field)
        return value_at(document, path) if path else None

    async def ledger_snapshot(self, since: int) -> tuple[list[dict[str, Any]], int]:
        """The ledger from ``since`` (merged over every process) and the next ``seq``."""
        ledger = self.ledger
        if isinstance(ledger, FileLedger):
            return await ledger.snapshot_async(since)
        return ledger.snapshot(since)

    def ledger_source(self) -> dict[str, Any] | None:
        """Where a reader on this machine finds the ledger files (None: memory only)."""
        if self.shared is None:
            return None
        return {"format": FORMAT, "dir": str(self.shared.path.resolve())}

    def close(self) -> None:
        if isinstance(self.ledger, FileLedger):
            self.ledger.close()


def _bad(message: str) -> Response:
    return json_response(400, {"error": message})


def _tokens_body(request: Request) -> dict[str, Any] | Response:
    """A token control call's JSON body, its ``tokens`` a list of non-empty strings; else the
    400 to answer."""
    try:
        payload = request.json()
    except ValueError:
        return _bad('body must be JSON: {"tokens": [...]}')
    tokens = payload.get("tokens") if isinstance(payload, dict) else None
    if not isinstance(tokens, list) or not all(isinstance(t, str) and t for t in tokens):
        return _bad('body must be {"tokens": [non-empty strings]}')
    return payload


def handle_control(request: Request, state: ProviderState) -> Response | None:
    """Answer ``/_sim/...`` control calls; None when the path is not a control path."""
    path = request.path
    if not path.startswith("/_sim/"):
        return None
    route = (request.method, path.rstrip("/"))
    if path.startswith("/_sim/faults"):
        return handle_fault_control(request, state.faults)
    if route == ("GET", "/_sim/health"):
        return json_response(200, {"ok": True, "provider": state.provider})
    if route == ("GET", "/_sim/ledger"):
        raw = request.query.get("since", "0")
        try:
            since = int(raw)
            rows, total = state.ledger.snapshot(since)
        except ValueError:
            return _bad(f"since must be an integer >= 0, got {raw!r}")
        return json_response(200, {"rows": rows, "next": total})
    if route == ("GET", "/_sim/ledger/source"):
        source = state.ledger_source()
        if source is None:
            return json_response(404, {"error": "this simulator keeps its ledger in memory"})
        return json_response(200, source)
    if route == ("POST", "/_sim/reset"):
        state.reset()
        return json_response(200, {"ok": True})
    if route == ("GET", "/_sim/payload-ids"):
        return json_response(200, {f: ".".join(p) for f, p in state.payload_ids.items()})
    if route == ("PUT", "/_sim/payload-ids"):
        try:
            paths = parse_payload_ids(request.json())
        except ValueError as exc:
            return _bad(str(exc))
        state.set_payload_ids(paths)
        return json_response(200, {f: ".".join(p) for f, p in state.payload_ids.items()})
    if route == ("POST", "/_sim/tokens/unregistered"):
        payload = _tokens_body(request)
        if not isinstance(payload, dict):
            return payload
        tokens = payload["tokens"]
        reason = payload.get("reason")
        if reason is not None and (
            state.faults.provider != "apns" or reason not in APNS_DEAD_REASONS
        ):
            return _bad(
                f"reason, when given, is one of {list(APNS_DEAD_REASONS)} (APNs only), "
                f"got {reason!r}"
            )
        count = state.mark_unregistered(tokens, reason=reason)
        return json_response(200, {"ok": True, "count": count})
    if route == ("POST", "/_sim/tokens/revived"):
        payload = _tokens_body(request)
        if not isinstance(payload, dict):
            return payload
        return json_response(200, {"ok": True, "revived": state.revive(payload["tokens"])})
    known = {
        "/_sim/health",
        "/_sim/ledger",
        "/_sim/ledger/source",
        "/_sim/reset",
        "/_sim/payload-ids",
        "/_sim/tokens/unregistered",
        "/_sim/tokens/revived",
    }
    if path.rstrip("/") in known:
        return json_response(405, {"error": f"method {request.method} not allowed on {path}"})
    return json_response(404, {"error": f"unknown control path {path}"})


async def control(request: Request, state: ProviderState) -> Response | None:
    """:func:`handle_control` for a serving process: first applies what other processes
    journalled, and reads the ledger once every process has written its buffered rows."""
    path = request.path
    if not path.startswith("/_sim/"):
        return None
    state.sync()
    if (request.method, path.rstrip("/")) == ("GET", "/_sim/ledger") and isinstance(
        state.ledger, FileLedger
    ):
        raw = request.query.get("since", "0")
        try:
            since = int(raw)
            rows, total = await state.ledger_snapshot(since)
        except ValueError:
            return _bad(f"since must be an integer >= 0, got {raw!r}")
        return json_response(200, {"rows": rows, "next": total})
    return handle_control(request, state)
