"""The provider request ledger (ground truth of delivery) and the shared simulator state.

Also holds the control API that both simulators serve on their port (``/_sim/...``; the fault
routes ``/_sim/faults...`` are in :mod:`emulators.providers.faults`).

Ledger rows: ``seq, provider, received_at, answered_at`` (when the answer left, after any
latency fault's delay), ``tenant_id, notification_id, token, project, status, reason, apns_id``
and ``delivered`` (the device got it: a 200, or an accepted_then_error fault's
5xx; not a validate_only dry run), ``fault`` (id of the fault that shaped the answer, else null),
``retry_after`` (the Retry-After sent, else null), ``collapse_id`` (APNs ``apns-collapse-id``;
FCM ``android.collapse_key`` or ``apns.headers["apns-collapse-id"]``; else null).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from emulators.http_server import Request, Response, json_response
from emulators.providers.faults import FaultSet, handle_fault_control

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
)


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
            }
            self._rows.append(row)
            return dict(row)

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

    def __len__(self) -> int:
        with self._lock:
            return len(self._rows)


class ProviderState:
    """Everything a simulator remembers: the ledger, the unregistered tokens, the faults.

    ``clock`` is the monotonic clock of the faults' quota windows (injectable for tests).
    """

    def __init__(self, provider: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.provider = provider
        self.ledger = Ledger()
        self._lock = threading.Lock()
        self._unregistered: dict[str, int] = {}
        # token -> id of the unregister fault that marked it (absent: marked via the control API)
        self._unregistered_by: dict[str, str] = {}
        self.faults = FaultSet(provider, self._unregister_from_fault, clock)

    def mark_unregistered(
        self, tokens: list[str], at_ms: int | None = None, fault: str | None = None
    ) -> int:
        """Tokens that now answer 410 Unregistered / 404 UNREGISTERED; returns how many."""
        stamp = int(time.time() * 1000) if at_ms is None else at_ms
        with self._lock:
            for token in tokens:
                if token not in self._unregistered:
                    self._unregistered[token] = stamp
                    if fault is not None:
                        self._unregistered_by[token] = fault
            return len(tokens)

    def _unregister_from_fault(self, tokens: list[str], fault: str) -> None:
        self.mark_unregistered(tokens, fault=fault)

    def unregistered_at(self, token: str) -> int | None:
        """Epoch milliseconds at which ``token`` was marked unregistered, or None."""
        with self._lock:
            return self._unregistered.get(token)

    def unregistered_by(self, token: str) -> str | None:
        """The id of the unregister fault that marked ``token`` (None: not by a fault)."""
        with self._lock:
            return self._unregistered_by.get(token)

    def reset(self) -> None:
        self.faults.reset()
        with self._lock:
            self._unregistered.clear()
            self._unregistered_by.clear()
        self.ledger.reset()


def _bad(message: str) -> Response:
    return json_response(400, {"error": message})


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
    if route == ("POST", "/_sim/reset"):
        state.reset()
        return json_response(200, {"ok": True})
    if route == ("POST", "/_sim/tokens/unregistered"):
        try:
            payload = request.json()
        except ValueError:
            return _bad('body must be JSON: {"tokens": [...]}')
        tokens = payload.get("tokens") if isinstance(payload, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, str) and t for t in tokens):
            return _bad('body must be {"tokens": [non-empty strings]}')
        return json_response(200, {"ok": True, "count": state.mark_unregistered(tokens)})
    known = {"/_sim/health", "/_sim/ledger", "/_sim/reset", "/_sim/tokens/unregistered"}
    if path.rstrip("/") in known:
        return json_response(405, {"error": f"method {request.method} not allowed on {path}"})
    return json_response(404, {"error": f"unknown control path {path}"})
