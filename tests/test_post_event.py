"""post_event against a real HTTP server: an answer that says "retry" (429, 503) is sent
again with the same event id a bounded number of times, each unanswered attempt recorded as
``inject_info``; any other error is not retried. (minifanout answers 503 "a store is
unavailable, retry" when its queue refuses a batch entry: the run used to end in a LoadError.)"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from harness.load import loader
from harness.load.loader import LoadError, post_event
from harness.model.history import History


class _Server:
    """Answers POST /v1/events with the statuses given, in order, then 202."""

    def __init__(self, statuses: list[int]) -> None:
        self.statuses = list(statuses)
        self.bodies: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.bodies.append(body)
                status = server.statuses.pop(0) if server.statuses else 202
                answer = {"notification_id": body["event_id"]} if status == 202 else {"error": "x"}
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def serve(monkeypatch: pytest.MonkeyPatch) -> Iterator:
    monkeypatch.setattr(loader, "RETRY_BACKOFF_S", 0.01)
    servers: list[_Server] = []

    def start(statuses: list[int]) -> _Server:
        servers.append(_Server(statuses))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def _post(server: _Server, history: History) -> str:
    with httpx.Client(base_url=server.url, timeout=5) as http:
        return post_event(http, history, "t", "a", "post", "o1")


def test_a_503_is_sent_again_with_the_same_id_until_accepted(serve) -> None:
    server = serve([503, 429])
    history = History()
    nid = _post(server, history)
    assert [b["event_id"] for b in server.bodies] == [nid] * 3
    frame = history.frame()
    assert list(frame["kind"]) == ["inject_info", "inject"]  # a 429 was surely not taken
    assert set(frame["notification_id"]) == {nid}


def test_retries_are_bounded_and_other_errors_are_not_retried(serve) -> None:
    server = serve([503] * 10)
    with pytest.raises(LoadError, match="503"):
        _post(server, History())
    assert len(server.bodies) == loader.RETRIES + 1
    server = serve([500])
    history = History()
    with pytest.raises(LoadError, match="500"):
        _post(server, history)
    assert len(server.bodies) == 1 and list(history.frame()["kind"]) == ["inject_info"]
