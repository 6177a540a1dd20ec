"""Fault injection in the APNs and FCM simulators (``/_sim/faults``), on real sockets.

Every test starts from ``POST /_sim/reset``. Probabilities are checked at p=1 and p=0 over
enough requests to be certain, and a seeded p=0.5 must give the same sequence twice.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import h2.config
import h2.connection
import hpack
import httpx
import pytest
from aioapns import APNs, NotificationRequest, PushType
from aioapns.connection import APNsProductionClientProtocol
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from h2.errors import ErrorCodes
from hyperframe.frame import Frame, GoAwayFrame, HeadersFrame
from pyfcm import FCMNotification
from pyfcm.errors import FCMServerError
from sim_process import APNS_TOPIC, SIGNING_KEY, Sim, needs_h2_server, run_sim

from emulators.http_server import Request
from emulators.providers.fcm import JWT_BEARER_GRANT, FcmSimulator, write_service_account_file
from emulators.providers.ledger import ProviderState
from emulators.providers.loadcheck import H2ClientConnection

pytestmark = [pytest.mark.integration, pytest.mark.timing]

FCM_ERROR = "type.googleapis.com/google.firebase.fcm.v1.FcmError"
N = 40  # requests per certainty check (p=1 / p=0)


@pytest.fixture(scope="module")
def apns_proc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    with run_sim("emulators.providers.apns", tmp_path_factory.mktemp("apns-faults")) as s:
        yield s


@pytest.fixture(scope="module")
def fcm_proc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    with run_sim("emulators.providers.fcm", tmp_path_factory.mktemp("fcm-faults")) as s:
        yield s


@pytest.fixture
def apns(apns_proc: Sim) -> Sim:
    apns_proc.reset()
    return apns_proc


@pytest.fixture
def fcm(fcm_proc: Sim) -> Sim:
    fcm_proc.reset()
    return fcm_proc


# -- helpers ----------------------------------------------------------------------------------
def apns_token() -> str:
    return uuid.uuid4().hex + uuid.uuid4().hex


def fcm_token() -> str:
    return f"fcm-{uuid.uuid4().hex}:APA91b{uuid.uuid4().hex}"


def h2c(sim: Sim, headers: dict[str, str] | None = None) -> httpx.Client:
    return httpx.Client(http1=False, http2=True, base_url=sim.url, headers=headers, timeout=20)


# a JWT-bearer grant's assertion as google-auth sends it (the simulator does not check its
# signature), for the in-process simulator below
ASSERTION = base64.urlsafe_b64encode(b'{"alg":"RS256"}').rstrip(b"=").decode() + ".e30.c2ln"
_access_tokens: dict[str, dict[str, str]] = {}


def fcm_auth(sim: Sim) -> dict[str, str]:
    """The Authorization header of a send to the FCM simulator (one token per simulator)."""
    if sim.url not in _access_tokens:
        _access_tokens[sim.url] = sim.fcm_headers()
    return _access_tokens[sim.url]


def fcm_h2c(sim: Sim) -> httpx.Client:
    return h2c(sim, fcm_auth(sim))


def apns_push(client: httpx.Client, token: str, nid: str = "n", **headers: str) -> httpx.Response:
    return client.post(
        f"/3/device/{token}",
        json={"aps": {"alert": "x"}, "tenant_id": "t", "notification_id": nid},
        headers=headers,
    )


def fcm_send(
    client: httpx.Client, token: str, project: str = "proj-a", **message: object
) -> httpx.Response:
    body = {"message": {"token": token, "data": {"tenant_id": "t"}, **message}}
    return client.post(f"/v1/projects/{project}/messages:send", json=body)


def fcm_error_code(r: httpx.Response) -> str:
    [detail] = [d for d in r.json()["error"]["details"] if d["@type"] == FCM_ERROR]
    return detail["errorCode"]


def wait_until(condition, timeout: float = 10.0) -> None:
    """Poll ``condition`` (with back-off) until true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    delay = 0.01
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(delay)  # back-off between polls of a condition, bounded by the deadline
        delay = min(delay * 2, 0.1)


def h2_burst(
    port: int,
    requests: list[tuple[str, bytes]],
    timeout: float = 15.0,
    headers: dict[str, str] | None = None,
) -> list[tuple]:
    """Open a connection, send every request in one write, read frames until the server closes.

    Returns the server's frames in order: ("response", stream_id, status) for each HEADERS,
    ("goaway", last_stream_id, error_code). Parsed at frame level (hyperframe + hpack) so that
    answers the server sends after its GOAWAY are seen too (h2's client refuses them).
    """
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    for path, body in requests:
        sid = conn.get_next_available_stream_id()
        conn.send_headers(
            sid,
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":authority", f"127.0.0.1:{port}"),
                (":path", path),
                ("content-length", str(len(body))),
                *(headers or {}).items(),
            ],
        )
        conn.send_data(sid, body, end_stream=True)
    decoder = hpack.Decoder()
    frames: list[tuple] = []
    buf = b""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(conn.data_to_send())
        while data := sock.recv(65536):  # until the server closes (socket timeout: failure)
            buf += data
            while len(buf) >= 9:
                frame, length = Frame.parse_frame_header(memoryview(buf[:9]))
                if len(buf) < 9 + length:
                    break
                frame.parse_body(memoryview(buf[9 : 9 + length]))
                buf = buf[9 + length :]
                if isinstance(frame, HeadersFrame):
                    headers = dict(decoder.decode(frame.data))
                    frames.append(("response", frame.stream_id, int(headers[":status"])))
                elif isinstance(frame, GoAwayFrame):
                    frames.append(("goaway", frame.last_stream_id, frame.error_code))
    return frames


def apns_request(token: str) -> tuple[str, bytes]:
    return f"/3/device/{token}", json.dumps({"aps": {"alert": "x"}}).encode()


def es256_key() -> str:
    key = ec.generate_private_key(ec.SECP256R1())
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def pyfcm_client(sim: Sim, tmp_path: Path, project: str) -> FCMNotification:
    sa = write_service_account_file(tmp_path / f"{project}.json", f"{sim.url}/token", project)
    fcm = FCMNotification(service_account_file=str(sa))
    fcm.FCM_END_POINT_BASE = f"{sim.url}/v1/projects"
    return fcm


# -- control API --------------------------------------------------------------------------------
@needs_h2_server
def test_fault_log_windows(apns: Sim) -> None:
    before = time.time()
    a = apns.start_fault("latency", {"ms": 0})
    b = apns.start_fault("status", {"p": 0, "status": 503}, seed=5)
    assert set(a) == {"id", "fault", "params", "seed", "started_at"}
    assert (a["fault"], a["params"], a["seed"]) == ("latency", {"ms": 0, "jitter_ms": 0}, 1)
    assert (b["fault"], b["params"], b["seed"]) == ("status", {"p": 0.0, "status": 503}, 5)
    assert before <= a["started_at"] <= b["started_at"] <= time.time()
    status, active = apns.control("GET", "/_sim/faults")
    assert status == 200 and [w["id"] for w in active["active"]] == [a["id"], b["id"]]
    assert all(w["stopped_at"] is None for w in active["active"])
    log = apns.control("GET", "/_sim/faults/log")[1]["windows"]
    assert [(w["id"], w["stopped_at"]) for w in log] == [(a["id"], None), (b["id"], None)]

    window = apns.stop_fault(a["id"])
    assert window["id"] == a["id"] and window["started_at"] <= window["stopped_at"] <= time.time()
    assert [w["id"] for w in apns.control("GET", "/_sim/faults")[1]["active"]] == [b["id"]]
    assert apns.control("DELETE", "/_sim/faults/nope-1")[0] == 404
    assert apns.control("DELETE", f"/_sim/faults/{a['id']}") == (200, window)  # idempotent

    c = apns.start_fault("goaway", {"after_streams": 5})
    status, stopped = apns.control("DELETE", "/_sim/faults")
    assert status == 200 and {w["id"] for w in stopped["stopped"]} == {b["id"], c["id"]}
    assert apns.control("GET", "/_sim/faults")[1] == {"active": []}
    log = apns.control("GET", "/_sim/faults/log")[1]["windows"]
    assert [w["id"] for w in log] == [a["id"], b["id"], c["id"]]
    starts = [w["started_at"] for w in log]
    assert starts == sorted(starts)
    assert all(w["started_at"] <= w["stopped_at"] for w in log)
    assert log[0] == window

    apns.reset()
    assert apns.control("GET", "/_sim/faults/log")[1] == {"windows": []}
    assert apns.control("GET", "/_sim/faults")[1] == {"active": []}


def test_reset_stops_faults(apns: Sim) -> None:
    apns.start_fault("status", {"p": 1, "status": 503})
    with h2c(apns, apns.apns_headers()) as client:
        assert apns_push(client, apns_token()).status_code == 503
        assert client.post("/_sim/reset").status_code == 200
        assert apns_push(client, apns_token()).status_code == 200


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ({"fault": "nope"}, "unknown fault 'nope'"),
        ({"fault": "quota", "params": {"per_minute": 1}}, "unknown fault 'quota' for apns"),
        ({"fault": "status", "params": {"p": 1}}, "params.status is required"),
        ({"fault": "status", "params": {"p": 1, "status": 404}}, "params.status must be one of"),
        ({"fault": "status", "params": {"p": 1.5, "status": 503}}, "params.p"),
        ({"fault": "status", "params": {"p": "1", "status": 503}}, "params.p"),
        ({"fault": "status", "params": {"status": 503, "retry_after": -1}}, "retry_after"),
        ({"fault": "status", "params": {"status": 503, "bogus": 1}}, "params.bogus"),
        ({"fault": "status", "params": {"status": 503, "tokens": "abc"}}, "params.tokens"),
        ({"fault": "accepted_then_error", "params": {"status": 429}}, "params.status"),
        ({"fault": "latency", "params": {}}, "params.ms is required"),
        ({"fault": "latency", "params": {"ms": -5}}, "params.ms"),
        ({"fault": "unregister", "params": {}}, "exactly one of tokens"),
        ({"fault": "unregister", "params": {"tokens": ["a"], "p": 1}}, "exactly one of tokens"),
        pytest.param(
            {"fault": "goaway", "params": {"after_streams": 0}},
            "params.after_streams",
            marks=needs_h2_server,
        ),
        ({"fault": "latency", "params": [1]}, "params must be a JSON object"),
        ({"fault": "latency", "params": {"ms": 1}, "seed": "x"}, "seed must be an integer"),
        ({"fault": "latency", "params": {"ms": 1}, "extra": 1}, "unknown field"),
        ([], "JSON object"),
    ],
)
def test_bad_fault_input_400(apns: Sim, body: object, problem: str) -> None:
    status, answer = apns.control("POST", "/_sim/faults", body)
    assert status == 400
    assert problem in answer["error"]
    assert apns.control("GET", "/_sim/faults/log")[1] == {"windows": []}


def test_bad_fault_input_fcm_and_not_json(fcm: Sim) -> None:
    for body, problem in [
        ({"fault": "goaway2"}, "unknown fault"),
        ({"fault": "status", "params": {"status": 429}}, "params.status must be one of [503, 500]"),
        ({"fault": "quota", "params": {}}, "params.per_minute is required"),
        ({"fault": "quota", "params": {"per_minute": 5, "window_seconds": 0}}, "window_seconds"),
    ]:
        status, answer = fcm.control("POST", "/_sim/faults", body)
        assert status == 400 and problem in answer["error"], answer
    r = httpx.post(f"{fcm.url}/_sim/faults", content=b"{not json")
    assert r.status_code == 400 and "JSON" in r.json()["error"]
    assert httpx.get(f"{fcm.url}/_sim/faults/x/y").status_code == 404
    assert httpx.put(f"{fcm.url}/_sim/faults").status_code == 405


# -- APNs ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("status", "reason", "retry_after"),
    [
        (429, "TooManyRequests", 7),
        (500, "InternalServerError", None),
        (503, "ServiceUnavailable", 3),
    ],
)
def test_apns_status_p1_then_p0(apns: Sim, status: int, reason: str, retry_after) -> None:
    params = {"p": 1, "status": status}
    if retry_after is not None:
        params["retry_after"] = retry_after
    fault = apns.start_fault("status", params)
    with h2c(apns, apns.apns_headers()) as client:
        answers = [apns_push(client, apns_token()) for _ in range(N)]
        assert {(r.status_code, r.json()["reason"]) for r in answers} == {(status, reason)}
        expected = None if retry_after is None else str(retry_after)
        assert {r.headers.get("retry-after") for r in answers} == {expected}
        assert all(uuid.UUID(r.headers["apns-id"]) for r in answers)
        rows = apns.ledger()
        assert len(rows) == N
        assert {(r["status"], r["reason"], r["delivered"], r["fault"]) for r in rows} == {
            (status, reason, False, fault["id"])
        }
        assert {r["retry_after"] for r in rows} == {retry_after}
        apns.stop_fault(fault["id"])
        zero = apns.start_fault("status", {"p": 0, "status": status})
        answers = [apns_push(client, apns_token()) for _ in range(N)]
    assert {r.status_code for r in answers} == {200}
    assert "retry-after" not in answers[0].headers
    rows = apns.ledger(N)
    assert {(r["status"], r["delivered"], r["fault"]) for r in rows} == {(200, True, None)}
    assert zero["params"]["p"] == 0


def run_seeded(sim: Sim, send) -> list[int]:
    sim.reset()
    sim.start_fault("status", {"p": 0.5, "status": 503}, seed=1234)
    return [send() for _ in range(60)]


def test_apns_seeded_half_repeats(apns: Sim) -> None:
    with h2c(apns, apns.apns_headers()) as client:

        def send() -> int:
            return apns_push(client, apns_token()).status_code

        first = run_seeded(apns, send)
        second = run_seeded(apns, send)
    assert first == second
    assert set(first) == {200, 503}
    assert 10 <= first.count(503) <= 50


def test_apns_accepted_then_error_is_delivered(apns: Sim) -> None:
    fault = apns.start_fault("accepted_then_error", {"p": 1, "status": 503})
    token = apns_token()
    with h2c(apns, apns.apns_headers()) as client:
        first = apns_push(client, token, "n-dup")
        retry = apns_push(client, token, "n-dup")  # a naive retry
    for r in (first, retry):
        assert (r.status_code, r.json()) == (503, {"reason": "ServiceUnavailable"})
    rows = apns.ledger()
    assert [(r["notification_id"], r["status"], r["delivered"], r["fault"]) for r in rows] == [
        ("n-dup", 503, True, fault["id"]),
        ("n-dup", 503, True, fault["id"]),  # the device got it twice
    ]
    apns.reset()
    apns.start_fault("accepted_then_error", {"p": 0})
    with h2c(apns, apns.apns_headers()) as client:
        assert {apns_push(client, apns_token()).status_code for _ in range(N)} == {200}


def test_apns_first_started_fault_decides(apns: Sim) -> None:
    latency = apns.start_fault("latency", {"ms": 0})
    first = apns.start_fault("status", {"p": 1, "status": 500})
    apns.start_fault("accepted_then_error", {"p": 1})
    with h2c(apns, apns.apns_headers()) as client:
        r = apns_push(client, apns_token())
    assert r.status_code == 500
    [row] = apns.ledger()
    assert (row["fault"], row["delivered"]) == (first["id"], False)
    apns.stop_fault(first["id"])
    with h2c(apns, apns.apns_headers()) as client:
        assert apns_push(client, apns_token()).status_code == 500
        assert apns.ledger(1)[0]["delivered"] is True
    apns.control("DELETE", "/_sim/faults")
    with h2c(apns, apns.apns_headers()) as client:
        assert apns_push(client, apns_token()).status_code == 200
        again = apns.start_fault("latency", {"ms": 0})
        assert apns_push(client, apns_token()).status_code == 200
    assert [r["fault"] for r in apns.ledger(2)] == [None, again["id"]]
    assert latency["id"] != again["id"]


def test_apns_unregister_tokens_stay_dead(apns: Sim) -> None:
    dead, alive = apns_token(), apns_token()
    fault = apns.start_fault("unregister", {"tokens": [dead]})
    with h2c(apns, apns.apns_headers()) as client:
        r = apns_push(client, dead)
        assert r.status_code == 410 and r.json()["reason"] == "Unregistered"
        assert r.json()["timestamp"] >= int(fault["started_at"] * 1000) - 1
        assert apns_push(client, alive).status_code == 200
        apns.stop_fault(fault["id"])
        assert apns_push(client, dead).status_code == 410  # still dead after the fault
    rows = apns.ledger()
    assert [(r["token"], r["status"], r["fault"], r["delivered"]) for r in rows] == [
        (dead, 410, fault["id"], False),
        (alive, 200, None, True),
        (dead, 410, fault["id"], False),
    ]


def test_apns_unregister_probability(apns: Sim) -> None:
    everyone = apns.start_fault("unregister", {"p": 1})
    tokens = [apns_token() for _ in range(N)]
    with h2c(apns, apns.apns_headers()) as client:
        assert {apns_push(client, t).status_code for t in tokens} == {410}
        apns.stop_fault(everyone["id"])
        assert {apns_push(client, t).status_code for t in tokens} == {410}
        apns.start_fault("unregister", {"p": 0})
        assert {apns_push(client, apns_token()).status_code for _ in range(N)} == {200}
        # p=0.5, seeded: decided once per token, the same way twice
        outcomes = []
        fresh = [apns_token() for _ in range(60)]
        for _ in range(2):
            apns.reset()
            apns.start_fault("unregister", {"p": 0.5}, seed=99)
            first = [apns_push(client, t).status_code for t in fresh]
            again = [apns_push(client, t).status_code for t in fresh]
            assert first == again  # once dead, always dead; once spared, spared
            outcomes.append(first)
    assert outcomes[0] == outcomes[1] and 10 <= outcomes[0].count(410) <= 50


def test_apns_latency_at_least_ms(apns: Sim) -> None:
    fault = apns.start_fault("latency", {"ms": 250, "jitter_ms": 50})
    with h2c(apns, apns.apns_headers()) as client:
        for _ in range(3):
            start = time.perf_counter()
            assert apns_push(client, apns_token()).status_code == 200
            assert time.perf_counter() - start >= 0.25
        # HTTP/1.1 too
        with httpx.Client(base_url=apns.url, timeout=20, headers=apns.apns_headers()) as h1:
            start = time.perf_counter()
            assert apns_push(h1, apns_token()).status_code == 200
            assert time.perf_counter() - start >= 0.25
    rows = apns.ledger()
    assert {(r["status"], r["fault"], r["delivered"]) for r in rows} == {(200, fault["id"], True)}
    # The ledger says when the answer left, not only when the request came in: what tells a
    # request sent after a "dead token" answer from one already in flight.
    assert all(0.25 <= r["answered_at"] - r["received_at"] <= 0.35 for r in rows)


def test_answered_at_is_the_receipt_without_a_delay(apns: Sim) -> None:
    with h2c(apns, apns.apns_headers()) as client:
        assert apns_push(client, apns_token()).status_code == 200
    [row] = apns.ledger()
    assert 0 <= row["answered_at"] - row["received_at"] < 0.1


def test_apns_latency_does_not_block_other_streams(apns: Sim) -> None:
    slow = apns_token()
    fast = [apns_token() for _ in range(20)]
    fault = apns.start_fault("latency", {"ms": 1000, "tokens": [slow]})
    body = json.dumps({"aps": {"alert": "x"}}).encode()
    auth = apns.apns_headers()

    async def go() -> tuple[float, float, bool, list[int], int]:
        conn = await H2ClientConnection.open("127.0.0.1", apns.port)
        try:
            start = time.perf_counter()
            slow_task = asyncio.ensure_future(conn.request("POST", f"/3/device/{slow}", auth, body))
            await asyncio.sleep(0)  # the slow stream goes out first
            answers = await asyncio.wait_for(
                asyncio.gather(*(conn.request("POST", f"/3/device/{t}", auth, body) for t in fast)),
                10,
            )
            fast_elapsed = time.perf_counter() - start
            slow_pending = not slow_task.done()
            slow_answer = await asyncio.wait_for(slow_task, 10)
            return (
                fast_elapsed,
                time.perf_counter() - start,
                slow_pending,
                [a.status for a in answers],
                slow_answer.status,
            )
        finally:
            conn.close()

    fast_elapsed, slow_elapsed, slow_pending, statuses, slow_status = asyncio.run(go())
    assert statuses == [200] * 20 and slow_status == 200
    assert slow_pending, "the 20 fast streams were answered while the slow one waited"
    assert fast_elapsed < 1.0 <= slow_elapsed
    by_token = {r["token"]: r for r in apns.ledger()}
    assert by_token[slow]["fault"] == fault["id"]
    assert {by_token[t]["fault"] for t in fast} == {None}


@needs_h2_server
def test_apns_goaway_after_streams(apns: Sim) -> None:
    apns.start_fault("goaway", {"after_streams": 3})
    tokens = [apns_token() for _ in range(8)]
    frames = h2_burst(apns.port, [apns_request(t) for t in tokens], headers=apns.apns_headers())
    # streams 1, 3, 5 answered, then GOAWAY(NO_ERROR, last_stream_id=5), then the server closes
    assert frames == [
        ("response", 1, 200),
        ("response", 3, 200),
        ("response", 5, 200),
        ("goaway", 5, ErrorCodes.NO_ERROR),
    ]
    assert [r["token"] for r in apns.ledger()] == tokens[:3]  # 7..15 not processed
    # the client reconnects and retries only the streams above last_stream_id
    frames = h2_burst(apns.port, [apns_request(t) for t in tokens[3:]], headers=apns.apns_headers())
    assert frames[-1] == ("goaway", 5, ErrorCodes.NO_ERROR)  # per connection
    assert [f[1] for f in frames if f[0] == "response"] == [1, 3, 5]
    assert [r["token"] for r in apns.ledger(3)] == tokens[3:6]
    apns.control("DELETE", "/_sim/faults")
    with h2c(apns, apns.apns_headers()) as client:
        assert {apns_push(client, t).status_code for t in tokens[6:]} == {200}
    rows = apns.ledger()
    assert sorted(r["token"] for r in rows) == sorted(tokens)  # each exactly once
    assert {(r["status"], r["fault"]) for r in rows} == {(200, None)}


@needs_h2_server
def test_apns_goaway_answers_in_flight_streams_then_closes(apns: Sim) -> None:
    slow, *others = [apns_token() for _ in range(4)]
    apns.start_fault("latency", {"ms": 300, "tokens": [slow]})
    apns.start_fault("goaway", {"after_streams": 2})
    start = time.perf_counter()
    frames = h2_burst(
        apns.port, [apns_request(t) for t in [slow, *others]], headers=apns.apns_headers()
    )
    elapsed = time.perf_counter() - start
    # stream 1 is delayed; stream 3 is the 2nd handled: GOAWAY(last=3) after its answer, stream 1
    # still answered afterwards, 5 and 7 never processed, and only then the connection closes
    assert frames == [
        ("response", 3, 200),
        ("goaway", 3, ErrorCodes.NO_ERROR),
        ("response", 1, 200),
    ]
    assert elapsed >= 0.3
    assert sorted(r["token"] for r in apns.ledger()) == sorted([slow, others[0]])


@needs_h2_server
def test_apns_goaway_leaves_http11_alone(apns: Sim) -> None:
    apns.start_fault("goaway", {"after_streams": 1})
    with httpx.Client(base_url=apns.url, timeout=20, headers=apns.apns_headers()) as h1:
        assert [apns_push(h1, apns_token()).status_code for _ in range(5)] == [200] * 5


def test_apns_collapse_id_and_delivered_keys(apns: Sim) -> None:
    with h2c(apns, apns.apns_headers()) as client:
        apns_push(client, apns_token(), **{"apns-collapse-id": "digest-7"})
        apns_push(client, apns_token())
        client.post("/3/device/abc", json={"aps": {}}, headers={"apns-collapse-id": "c"})
    rows = apns.ledger()
    assert [(r["status"], r["collapse_id"], r["delivered"]) for r in rows] == [
        (200, "digest-7", True),
        (200, None, True),
        (400, "c", False),
    ]
    assert all(r["fault"] is None and r["retry_after"] is None for r in rows)


def test_aioapns_sees_429(apns: Sim) -> None:
    apns.start_fault("status", {"p": 1, "status": 429, "retry_after": 2})

    async def go() -> object:
        client = APNs(
            key=SIGNING_KEY.private_pem,
            key_id=SIGNING_KEY.key_id,
            team_id=SIGNING_KEY.team_id,
            topic=APNS_TOPIC,
        )  # type: ignore[arg-type]
        client.pool.protocol_class = type(
            "SimulatorProtocol",
            (APNsProductionClientProtocol,),
            {"APNS_SERVER": "127.0.0.1", "APNS_PORT": apns.port},
        )
        client.pool.ssl_context = None
        request = NotificationRequest(
            device_token=apns_token(), message={"aps": {"alert": "x"}}, push_type=PushType.ALERT
        )
        try:
            return await asyncio.wait_for(client.send_notification(request), 20)
        finally:
            client.pool.close()

    result = asyncio.run(go())
    assert result.is_successful is False
    assert (result.status, result.description) == ("429", "TooManyRequests")
    [row] = apns.ledger()
    assert (row["status"], row["delivered"], row["retry_after"]) == (429, False, 2)


# -- FCM -------------------------------------------------------------------------------------------
def test_fcm_quota_per_project(fcm: Sim) -> None:
    fault = fcm.start_fault("quota", {"per_minute": 5, "window_seconds": 3})
    assert fault["params"] == {"per_minute": 5, "window_seconds": 3}
    with fcm_h2c(fcm) as client:
        a = [fcm_send(client, fcm_token(), "proj-a") for _ in range(8)]
        b = [fcm_send(client, fcm_token(), "proj-b") for _ in range(5)]
    assert [r.status_code for r in a] == [200] * 5 + [429] * 3
    assert [r.status_code for r in b] == [200] * 5  # its own quota
    for r in a[5:]:
        error = r.json()["error"]
        assert (error["code"], error["status"]) == (429, "RESOURCE_EXHAUSTED")
        assert fcm_error_code(r) == "QUOTA_EXCEEDED"
        assert 1 <= int(r.headers["retry-after"]) <= 3
    rows = fcm.ledger()
    assert [(r["project"], r["status"], r["delivered"]) for r in rows[:8]] == [
        ("proj-a", 200, True)
    ] * 5 + [("proj-a", 429, False)] * 3
    assert [r["reason"] for r in rows[5:8]] == ["QUOTA_EXCEEDED"] * 3
    assert [r["retry_after"] for r in rows[5:8]] == [int(r.headers["retry-after"]) for r in a[5:]]
    assert {r["fault"] for r in rows[5:8]} == {fault["id"]}
    assert {r["fault"] for r in rows[:5] + rows[8:]} == {None}

    # a new window starts within Retry-After seconds
    deadline_s = int(a[-1].headers["retry-after"])
    t_429 = time.monotonic()
    with fcm_h2c(fcm) as client:
        wait_until(lambda: fcm_send(client, fcm_token(), "proj-a").status_code == 200, 10)
    assert time.monotonic() - t_429 <= deadline_s + 1.0


def test_fcm_quota_window_with_injected_clock() -> None:
    now = [1000.0]
    state = ProviderState("fcm", clock=lambda: now[0])
    sim = FcmSimulator(state)
    state.faults.start("quota", {"per_minute": 2})  # default 60-second window from t=1000
    form = urlencode({"grant_type": JWT_BEARER_GRANT, "assertion": ASSERTION}).encode()
    token = json.loads(asyncio.run(sim.handle(Request("POST", "/token", body=form))).body)
    auth = {"authorization": f"Bearer {token['access_token']}"}

    def send(project: str = "p") -> tuple[int, str | None]:
        body = json.dumps({"message": {"token": "tok"}}).encode()
        request = Request("POST", f"/v1/projects/{project}/messages:send", headers=auth, body=body)
        response = asyncio.run(sim.handle(request))
        return response.status, response.headers.get("retry-after")

    assert [send(), send()] == [(200, None), (200, None)]
    now[0] = 1000.2
    assert send() == (429, "60")  # ceil(59.8)
    now[0] = 1059.5
    assert send() == (429, "1")  # ceil(0.5)
    assert send("other") == (200, None)
    now[0] = 1059.99
    assert send() == (429, "1")  # at least 1
    now[0] = 1060.0  # the next window
    assert [send(), send(), send()] == [(200, None), (200, None), (429, "60")]
    now[0] = 1200.0
    assert send() == (200, None)


@pytest.mark.parametrize(("status", "name"), [(503, "UNAVAILABLE"), (500, "INTERNAL")])
def test_fcm_status_p1_then_p0(fcm: Sim, status: int, name: str) -> None:
    fault = fcm.start_fault("status", {"p": 1, "status": status, "retry_after": 4})
    with fcm_h2c(fcm) as client:
        answers = [fcm_send(client, fcm_token()) for _ in range(N)]
        assert {r.status_code for r in answers} == {status}
        assert {r.json()["error"]["status"] for r in answers} == {name}
        assert {fcm_error_code(r) for r in answers} == {name}
        assert {r.headers["retry-after"] for r in answers} == {"4"}
        fcm.stop_fault(fault["id"])
        fcm.start_fault("status", {"p": 0, "status": status})
        assert {fcm_send(client, fcm_token()).status_code for _ in range(N)} == {200}
    rows = fcm.ledger()
    keys = ("status", "reason", "delivered", "fault", "retry_after")
    assert {tuple(r[k] for k in keys) for r in rows[:N]} == {(status, name, False, fault["id"], 4)}
    assert {(r["status"], r["delivered"], r["fault"]) for r in rows[N:]} == {(200, True, None)}


def test_fcm_seeded_half_repeats(fcm: Sim) -> None:
    with fcm_h2c(fcm) as client:

        def send() -> int:
            return fcm_send(client, fcm_token()).status_code

        first = run_seeded(fcm, send)
        second = run_seeded(fcm, send)
    assert first == second
    assert set(first) == {200, 503} and 10 <= first.count(503) <= 50


def test_fcm_accepted_then_error_latency_unregister(fcm: Sim) -> None:
    fault = fcm.start_fault("accepted_then_error", {"p": 1})
    with fcm_h2c(fcm) as client:
        r = fcm_send(client, fcm_token())
        assert r.status_code == 500 and fcm_error_code(r) == "INTERNAL"
        fcm.reset()
        latency = fcm.start_fault("latency", {"ms": 200})
        start = time.perf_counter()
        assert fcm_send(client, fcm_token()).status_code == 200
        assert time.perf_counter() - start >= 0.2
        [delayed] = fcm.ledger()
        assert 0.2 <= delayed["answered_at"] - delayed["received_at"] < 0.3
        fcm.reset()
        dead = fcm.start_fault("unregister", {"p": 1})
        r = fcm_send(client, fcm_token())
        assert r.status_code == 404 and fcm_error_code(r) == "UNREGISTERED"
    [row] = fcm.ledger()
    assert (row["status"], row["reason"], row["fault"]) == (404, "UNREGISTERED", dead["id"])
    assert fault["id"] != latency["id"]


def test_fcm_accepted_then_error_ledger(fcm: Sim) -> None:
    fault = fcm.start_fault("accepted_then_error", {"p": 1, "status": 503})
    with fcm_h2c(fcm) as client:
        for _ in range(2):
            r = fcm_send(client, "tok-1", data={"notification_id": "n1"})
            assert r.status_code == 503 and fcm_error_code(r) == "UNAVAILABLE"
    rows = fcm.ledger()
    assert [(r["notification_id"], r["delivered"], r["fault"]) for r in rows] == [
        ("n1", True, fault["id"])
    ] * 2


def test_fcm_collapse_id(fcm: Sim) -> None:
    with fcm_h2c(fcm) as client:
        fcm_send(client, fcm_token(), android={"collapse_key": "ck-1"})
        fcm_send(client, fcm_token(), apns={"headers": {"apns-collapse-id": "ac-2"}})
        fcm_send(client, fcm_token())
        r = client.post(
            "/v1/projects/p/messages:send",
            json={"message": {"token": "abc"}, "validate_only": True},
        )
        assert r.status_code == 200
    rows = fcm.ledger()
    assert [(r["collapse_id"], r["delivered"]) for r in rows] == [
        ("ck-1", True),
        ("ac-2", True),
        (None, True),
        (None, False),  # validate_only: a dry run, nothing reached a device
    ]


@needs_h2_server
def test_fcm_goaway(fcm: Sim) -> None:
    fcm.start_fault("goaway", {"after_streams": 2})
    body = json.dumps({"message": {"token": "tok"}}).encode()
    frames = h2_burst(fcm.port, [("/v1/projects/p/messages:send", body)] * 5, headers=fcm_auth(fcm))
    assert frames == [("response", 1, 200), ("response", 3, 200), ("goaway", 3, 0)]
    assert len(fcm.ledger()) == 2


def test_pyfcm_honours_quota_retry_after(fcm: Sim, tmp_path: Path) -> None:
    """pyfcm 2.1 sleeps for Retry-After and sends again (it has no error for a 429 with one)."""
    client = pyfcm_client(fcm, tmp_path, "proj-q")
    client.notify(fcm_token=fcm_token(), data_payload={"n": "warm-up"})  # OAuth token fetched
    fault = fcm.start_fault("quota", {"per_minute": 1, "window_seconds": 2})
    client.notify(fcm_token=fcm_token(), data_payload={"n": "1"})
    result = client.notify(fcm_token=fcm_token(), data_payload={"n": "2"})
    assert result["name"].startswith("projects/proj-q/messages/")
    rows = fcm.ledger(1)
    assert [(r["status"], r["reason"], r["fault"]) for r in rows] == [
        (200, None, None),
        (429, "QUOTA_EXCEEDED", fault["id"]),
        (200, None, None),
    ]
    retry_after = rows[1]["retry_after"]
    assert retry_after in (1, 2)
    assert rows[2]["received_at"] - rows[1]["received_at"] >= retry_after - 0.01


def test_pyfcm_server_error_on_500(fcm: Sim, tmp_path: Path) -> None:
    client = pyfcm_client(fcm, tmp_path, "proj-e")
    fcm.start_fault("status", {"p": 1, "status": 500})
    with pytest.raises(FCMServerError, match="500"):
        client.notify(fcm_token=fcm_token(), data_payload={"n": "1"})
    [row] = fcm.ledger()
    assert (row["status"], row["reason"], row["delivered"]) == (500, "INTERNAL", False)
