"""The reference's HTTP/2 client to the providers (reference_impl/http2.py), through the APNs
and FCM clients, against the real simulator processes: TLS with ALPN and h2c, the answers
classified, GOAWAY (nothing sent twice, nothing lost), a timeout and a refused connection."""

from __future__ import annotations

import time
from pathlib import Path

import hpack
import pytest
from sim_process import Sim, run_sim

from emulators.ports import free_port
from emulators.providers.fcm import write_service_account_file
from harness.model.history import History
from harness.run.provider_control import SimulatorControl
from harness.run.runner import Collector
from reference_impl.config import Config
from reference_impl.http2 import Http2Client, Http2Error, PlainEncoder
from reference_impl.providers import ApnsClient, FcmClient

pytestmark = [pytest.mark.integration, pytest.mark.timing]
TOKEN = "ab" * 32


@pytest.fixture(scope="module")
def apns(tmp_path_factory: pytest.TempPathFactory) -> Sim:
    with run_sim("emulators.providers.apns", tmp_path_factory.mktemp("apns"), tls=True) as sim:
        yield sim


@pytest.fixture(scope="module")
def fcm(tmp_path_factory: pytest.TempPathFactory) -> Sim:
    with run_sim("emulators.providers.fcm", tmp_path_factory.mktemp("fcm")) as sim:
        yield sim


def _apns_client(sim: Sim, timeout: float = 5.0) -> ApnsClient:
    return ApnsClient(
        Config(
            apns_url=sim.url,
            apns_ca_file=str(sim.ca),
            provider_timeout_seconds=timeout,
            **sim.apns_signing(),
        )
    )


def _payload(n: int) -> dict:
    return {"aps": {"alert": {"body": f"hello {n}"}}, "tenant_id": "t0", "notification_id": str(n)}


def _apns_id(n: int) -> str:
    return f"00000000-0000-4000-8000-{n:012d}"


def test_apns_over_tls_sends_headers_and_body_and_reuses_one_connection(apns: Sim):
    apns.reset()
    client = _apns_client(apns)
    try:
        results = [
            client.send(TOKEN, _payload(n), _apns_id(n), collapse_id=f"c{n}") for n in range(5)
        ]
        first = client.http.sock
        assert first is not None
        assert client.send(TOKEN, _payload(5), _apns_id(5)).outcome == "sent"
        assert client.http.sock is first  # the same connection
    finally:
        client.close()
    assert [r.outcome for r in results] == ["sent"] * 5
    rows = apns.ledger()
    assert [r["apns_id"] for r in rows] == [_apns_id(n) for n in range(6)]
    assert [r["collapse_id"] for r in rows] == [f"c{n}" for n in range(5)] + [None]
    assert {r["token"] for r in rows} == {TOKEN}
    assert rows[0]["notification_id"] == "0"


def test_a_429_is_a_retry_with_its_retry_after_and_a_410_a_dead_token(apns: Sim):
    apns.reset()
    client = _apns_client(apns)
    try:
        fault = apns.start_fault("status", {"status": 429, "retry_after": 7})
        throttled = client.send(TOKEN, _payload(1), _apns_id(1))
        apns.stop_fault(fault["id"])
        apns.start_fault("unregister", {"tokens": ["cd" * 32]})
        dead = client.send("cd" * 32, _payload(2), _apns_id(2))
    finally:
        client.close()
    assert (throttled.outcome, throttled.status, throttled.retry_after) == ("retry", 429, 7.0)
    assert throttled.reason == "TooManyRequests"
    assert (dead.outcome, dead.status, dead.reason) == ("dead_token", 410, "Unregistered")


def test_goaway_loses_nothing_and_sends_nothing_twice(apns: Sim):
    """After every 2 streams the simulator says GOAWAY: each answered stream is in the ledger
    once, and the client moves to a new connection for the next."""
    apns.reset()
    apns.start_fault("goaway", {"after_streams": 2})
    client = _apns_client(apns)
    try:
        results = [client.send(TOKEN, _payload(n), _apns_id(n)) for n in range(7)]
    finally:
        client.close()
    assert [r.outcome for r in results] == ["sent"] * 7
    assert [r["apns_id"] for r in apns.ledger()] == [_apns_id(n) for n in range(7)]


def test_an_answer_later_than_the_timeout_is_a_transport_retry(apns: Sim):
    apns.reset()
    apns.start_fault("latency", {"ms": 1500})
    client = _apns_client(apns, timeout=0.3)
    try:
        started = time.monotonic()
        result = client.send(TOKEN, _payload(1), _apns_id(1))
        elapsed = time.monotonic() - started
    finally:
        client.close()
        apns.reset()
    assert (result.outcome, result.status) == ("retry", None)
    assert result.reason == "transport: Http2Error"
    assert elapsed < 1.2


def test_fcm_over_h2c_and_its_error_codes(fcm: Sim, tmp_path: Path):
    fcm.reset()
    account = write_service_account_file(tmp_path / "sa.json", f"{fcm.url}/token", "p-0")
    client = FcmClient(Config(fcm_url=fcm.url, fcm_credentials_file=str(account)))
    message = {"token": TOKEN, "data": {"tenant_id": "t0", "notification_id": "n1"}}
    try:
        sent = client.send("p-0", message)
        fcm.start_fault("unregister", {"tokens": [TOKEN]})
        dead = client.send("p-0", message)
    finally:
        client.close()
    assert (sent.outcome, sent.status) == ("sent", 200)
    assert (dead.outcome, dead.reason) == ("dead_token", "UNREGISTERED")
    rows = fcm.ledger()
    assert [(r["project"], r["status"]) for r in rows] == [("p-0", 200), ("p-0", 404)]


def test_a_refused_connection_raises_and_a_bad_url_is_refused(tmp_path: Path):
    client = Http2Client(f"http://127.0.0.1:{free_port()}", timeout=2)
    with pytest.raises(Http2Error):
        client.post("/x", {}, b"{}")
    with pytest.raises(ValueError):
        Http2Client("ftp://example.com")


def test_the_collector_lists_each_delivered_key_once_in_arrival_order(apns: Sim):
    """What the run's wait counts incrementally: a key delivered twice arrives once."""
    apns.reset()
    client = _apns_client(apns)
    control = SimulatorControl(apns.url, str(apns.ca))
    collector = Collector(History(), [control])
    try:
        for n in (1, 2, 1):  # notification 1 twice
            assert client.send(TOKEN, _payload(n), _apns_id(n)).outcome == "sent"
        assert collector.poll() == 3
        assert client.send(TOKEN, _payload(3), _apns_id(3)).outcome == "sent"
        assert collector.poll() == 1
    finally:
        client.close()
        control.close()
    assert collector.arrivals == [("t0", "1", TOKEN), ("t0", "2", TOKEN), ("t0", "3", TOKEN)]
    assert collector.delivered == set(collector.arrivals)


def test_header_values_go_without_huffman_coding():
    """What the APNs simulator decodes: the literal value, not its Huffman code."""
    token = "ab" * 32
    encoded = PlainEncoder().encode([(":path", f"/3/device/{token}"), ("apns-id", "x-1")])
    assert f"/3/device/{token}".encode() in encoded
    assert hpack.Decoder().decode(encoded) == [(":path", f"/3/device/{token}"), ("apns-id", "x-1")]


def test_an_fcm_token_google_no_longer_takes_is_fetched_again(fcm: Sim, tmp_path: Path):
    """A 401 (a token revoked, or expired early): one new token from the token_uri and the
    send again, as google-auth's AuthorizedSession does; no credentials at all stay a 401."""
    fcm.reset()
    account = write_service_account_file(tmp_path / "sa.json", f"{fcm.url}/token", "p-0")
    client = FcmClient(Config(fcm_url=fcm.url, fcm_credentials_file=str(account)))
    bare = FcmClient(Config(fcm_url=fcm.url))
    message = {"token": TOKEN, "data": {"tenant_id": "t0", "notification_id": "n2"}}
    try:
        assert client.token is not None
        client.token.bearer()
        client.token._token = "ya29.sim-revoked"  # what the client holds, Google forgot
        sent = client.send("p-0", message)
        refused = bare.send("p-0", message)
    finally:
        client.close()
        bare.close()
    assert (sent.outcome, sent.status) == ("sent", 200)
    assert (refused.outcome, refused.status) == ("rejected", 401)
    assert [r["status"] for r in fcm.ledger()] == [401, 200, 401]
