"""API Gateway Management API simulator (the WebSocket API's ``@connections``), as boto3's
``apigatewaymanagementapi`` client calls it.

Run: ``python -m emulators.providers.inapp --port N [--host 127.0.0.1]``; point the client at it
with ``endpoint_url`` (a stage path, ``http://host:port/prod``, is accepted and ignored).

* ``POST /@connections/{id}`` (``post_to_connection``): 200 with an empty body when the
  connection is registered (one ledger row, ``token`` = the connection id, delivered), 410
  ``GoneException`` otherwise (a row, not delivered), 413 ``PayloadTooLargeException`` above
  128 KiB.
* ``GET /@connections/{id}`` (``get_connection``): ``{connectedAt, identity, lastActiveAt}``
  (the wire names) or 410; ``DELETE /@connections/{id}`` (``delete_connection``): 204 and the connection is gone,
  or 410. Neither is a ledger row (no message).
* Errors are ``{"message": ...}`` with the code in ``x-amzn-ErrorType``.
* Ledger ``tenant_id`` / ``notification_id``: the fields of that name in the posted data when
  it is a JSON object.

Control API (:mod:`emulators.providers.ledger`): ``/_sim/health``, ``/_sim/ledger``,
``/_sim/reset`` (also drops every connection), ``/_sim/faults`` (``status`` 429
LimitExceededException / 500 InternalServerErrorException, ``latency``), and
``/_sim/connections``: ``POST {"connections": [...]}`` registers (the users are online),
``DELETE`` with the same body disconnects those (without a body: all), ``GET`` lists them.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
import time
from datetime import UTC, datetime
from urllib.parse import unquote

from emulators.http_server import Request, Response, json_response, serve_forever
from emulators.providers.faults import finish
from emulators.providers.ledger import ProviderState, handle_control

PROVIDER = "inapp"
MAX_PAYLOAD = 128 * 1024
CONNECTIONS_PATH = "/_sim/connections"
# An optional stage prefix, then @connections/<id> (the id is URL-encoded by the SDK).
_CONNECTION_RE = re.compile(r"^(?:/[^/@][^/]*)*/@connections/([^/]+)$")
FAULT_ERRORS = {
    429: ("LimitExceededException", "Rate exceeded"),
    500: ("InternalServerErrorException", "Internal server error"),
}


def aws_error(status: int, code: str, message: str, retry_after: int | None = None) -> Response:
    headers = {"x-amzn-errortype": code}
    if retry_after is not None:
        headers["retry-after"] = str(retry_after)
    return json_response(status, {"message": message}, headers)


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat().replace("+00:00", "Z")


def _ids(data: bytes) -> tuple[str | None, str | None]:
    try:
        payload = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None, None
    if not isinstance(payload, dict):
        return None, None

    def text(key: str) -> str | None:
        value = payload.get(key)
        return value if isinstance(value, str) else None

    return text("tenant_id"), text("notification_id")


class InAppSimulator:
    """The request handler: the ledger and faults in ``state``, the live connections here."""

    def __init__(self, state: ProviderState | None = None) -> None:
        self.state = state if state is not None else ProviderState(PROVIDER)
        self._lock = threading.Lock()
        self._connections: dict[str, float] = {}  # id -> connected at (epoch)

    # -- connections ------------------------------------------------------------------------

    def connect(self, ids: list[str]) -> int:
        now = time.time()
        with self._lock:
            for connection in ids:
                self._connections.setdefault(connection, now)
        return len(ids)

    def disconnect(self, ids: list[str] | None) -> int:
        with self._lock:
            if ids is None:
                gone = len(self._connections)
                self._connections.clear()
                return gone
            return sum(self._connections.pop(c, None) is not None for c in ids)

    def connected_at(self, connection: str) -> float | None:
        with self._lock:
            return self._connections.get(connection)

    # -- requests ---------------------------------------------------------------------------

    async def handle(self, request: Request) -> Response:
        path = request.path.rstrip("/")
        if path == CONNECTIONS_PATH:
            return self.control_connections(request)
        if (request.method, path) == ("POST", "/_sim/reset"):
            self.disconnect(None)
        control = handle_control(request, self.state)
        if control is not None:
            return control
        match = _CONNECTION_RE.match(request.path)
        if match is None:
            return aws_error(404, "NotFoundException", f"No route for {request.path}")
        connection = unquote(match.group(1))
        if request.method == "POST":
            return await finish(self.post(request, connection))
        if request.method == "GET":
            return self.get(connection)
        if request.method == "DELETE":
            if self.disconnect([connection]):
                return Response(204)
            return aws_error(410, "GoneException", f"Connection {connection} is gone")
        return aws_error(405, "MethodNotAllowedException", f"{request.method} not allowed")

    def control_connections(self, request: Request) -> Response:
        if request.method == "GET":
            with self._lock:
                listed = sorted(self._connections)
            return json_response(200, {"connections": listed})
        if request.method not in ("POST", "DELETE"):
            return json_response(405, {"error": f"method {request.method} not allowed"})
        if request.method == "DELETE" and not request.body.strip():
            return json_response(200, {"ok": True, "count": self.disconnect(None)})
        try:
            payload = request.json()
        except ValueError:
            payload = None
        ids = payload.get("connections") if isinstance(payload, dict) else None
        if not isinstance(ids, list) or not all(isinstance(c, str) and c for c in ids):
            return json_response(
                400, {"error": 'body must be {"connections": [non-empty strings]}'}
            )
        count = self.connect(ids) if request.method == "POST" else self.disconnect(ids)
        return json_response(200, {"ok": True, "count": count})

    def get(self, connection: str) -> Response:
        since = self.connected_at(connection)
        if since is None:
            return aws_error(410, "GoneException", f"Connection {connection} is gone")
        return json_response(
            200,
            {
                "connectedAt": _iso(since),
                "identity": {"sourceIp": "127.0.0.1", "userAgent": "harness-inapp-simulator"},
                "lastActiveAt": _iso(time.time()),
            },
        )

    def post(self, request: Request, connection: str) -> Response:
        tenant_id, notification_id = _ids(request.body)

        def record(
            status: int,
            reason: str | None,
            delivered: bool,
            fault: str | None,
            retry_after: int | None = None,
        ) -> None:
            self.state.ledger.append(
                provider=PROVIDER,
                token=connection,
                status=status,
                tenant_id=tenant_id,
                notification_id=notification_id,
                reason=reason,
                received_at=request.received_at,
                delivered=delivered,
                fault=fault,
                retry_after=retry_after,
            )

        if len(request.body) > MAX_PAYLOAD:
            record(413, "PayloadTooLargeException", False, None)
            return aws_error(413, "PayloadTooLargeException", "Message too long")
        outcome = (
            self.state.faults.evaluate(connection, None, request)
            if self.state.faults.active
            else None
        )
        if outcome is not None and outcome.error is not None:
            code, message = FAULT_ERRORS.get(outcome.error.status, FAULT_ERRORS[500])
            record(outcome.error.status, code, False, outcome.error.id, outcome.retry_after)
            return outcome.response(
                aws_error(outcome.error.status, code, message, outcome.retry_after)
            )
        delay = outcome.delay_fault.id if outcome and outcome.delay_fault else None
        if self.connected_at(connection) is None:
            record(410, "GoneException", False, delay)
            response = aws_error(410, "GoneException", f"Connection {connection} is gone")
        else:
            record(200, None, True, delay)
            response = Response(200)
        return outcome.response(response) if outcome else response


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m emulators.providers.inapp",
        description="API Gateway Management API (@connections) simulator",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    return serve_forever(PROVIDER, InAppSimulator().handle, args.host, args.port)


if __name__ == "__main__":
    sys.exit(main())
