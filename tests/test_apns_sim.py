"""The APNs simulator as a real server on a real socket, driven by real clients."""

from __future__ import annotations

import asyncio
import http.client
import json
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import h2.errors
import h2.events
import h2.settings
import httpx
import pytest
from aioapns import APNs, NotificationRequest, PushType
from aioapns.connection import APNsProductionClientProtocol
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from sim_process import (
    APNS_TOPIC,
    REPO,
    SIGNING_KEY,
    START_TIMEOUT,
    H2Probe,
    Sim,
    free_port,
    needs_h2_server,
    needs_h2_stream_settings,
    read_line,
    run_sim,
    stop,
)

from emulators.providers.apns import STREAMS_AFTER_TOKEN
from emulators.providers.apns_keys import new_signing_key
from emulators.providers.loadcheck import H2ClientConnection

pytestmark = pytest.mark.integration

MODULE = "emulators.providers.apns"


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    with run_sim(MODULE, tmp_path_factory.mktemp("apns-plain")) as s:
        s.apns_headers()  # the suite's signing key, registered
        yield s


@pytest.fixture(scope="module")
def tls_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    with run_sim(MODULE, tmp_path_factory.mktemp("apns-tls"), tls=True) as s:
        s.apns_headers()
        yield s


# -- helpers ----------------------------------------------------------------------------------
def new_token() -> str:
    return uuid.uuid4().hex + uuid.uuid4().hex  # 64 hex characters


def es256_key() -> str:
    key = ec.generate_private_key(ec.SECP256R1())
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def apns_client(key: str | None = None, topic: str = APNS_TOPIC, **kwargs: object) -> APNs:
    """aioapns with the suite's registered signing key (or ``key``, unknown to Apple)."""
    return APNs(
        key=key or SIGNING_KEY.private_pem,
        key_id=SIGNING_KEY.key_id,
        team_id=SIGNING_KEY.team_id,
        topic=topic,
        **kwargs,
    )  # type: ignore[arg-type]


def aim_at(client: APNs, port: int, *, tls: bool) -> None:
    """Point an aioapns client at 127.0.0.1:port through its protocol class attributes."""
    client.pool.protocol_class = type(
        "SimulatorProtocol",
        (APNsProductionClientProtocol,),
        {"APNS_SERVER": "127.0.0.1", "APNS_PORT": port},
    )
    if not tls:
        client.pool.ssl_context = None  # loop.create_connection(ssl=None): plaintext h2


async def send_one(client: APNs, token: str, tenant: str, notification: str) -> object:
    request = NotificationRequest(
        device_token=token,
        push_type=PushType.ALERT,  # Apple requires it since iOS 13
        message={
            "aps": {"alert": {"title": "hi"}},
            "tenant_id": tenant,
            "notification_id": notification,
        },
    )
    try:
        return await asyncio.wait_for(client.send_notification(request), 20)
    finally:
        client.pool.close()


def payload_of_size(size: int) -> bytes:
    base = {"aps": {"alert": "x"}, "pad": ""}
    overhead = len(json.dumps(base, separators=(",", ":")).encode())
    base["pad"] = "p" * (size - overhead)
    body = json.dumps(base, separators=(",", ":")).encode()
    assert len(body) == size
    return body


def h2c(sim: Sim) -> httpx.Client:
    return httpx.Client(
        http1=False, http2=True, base_url=sim.url, timeout=20, headers=sim.apns_headers()
    )


# -- aioapns (unchanged, from PyPI) -------------------------------------------------------------
def test_aioapns_tls_direct_without_alpn(tls_sim: Sim) -> None:
    token = new_token()
    since = tls_sim.next_seq()

    async def go() -> object:
        client = apns_client(ssl_context=tls_sim.client_ssl())
        aim_at(client, tls_sim.port, tls=True)
        return await send_one(client, token, "tenant-b", "notif-2")

    result = asyncio.run(go())
    assert result.is_successful
    [row] = tls_sim.ledger(since)
    assert (row["token"], row["tenant_id"], row["notification_id"], row["status"]) == (
        token,
        "tenant-b",
        "notif-2",
        200,
    )


def test_aioapns_plaintext_and_error_results(sim: Sim) -> None:
    good, dead = new_token(), new_token()
    assert sim.control("POST", "/_sim/tokens/unregistered", {"tokens": [dead]})[0] == 200
    since = sim.next_seq()

    async def go() -> list[object]:
        client = apns_client()
        aim_at(client, sim.port, tls=False)
        results = []
        for token in (good, dead, "not-a-token"):
            request = NotificationRequest(
                device_token=token,
                message={"aps": {"alert": "x"}, "tenant_id": "t"},
                push_type=PushType.ALERT,
            )
            results.append(await asyncio.wait_for(client.send_notification(request), 20))
        client.pool.close()
        return results

    ok, gone, bad = asyncio.run(go())
    assert ok.is_successful
    assert (gone.status, gone.description) == ("410", "Unregistered")
    assert isinstance(gone.timestamp, int) and gone.timestamp > 1_600_000_000_000
    assert (bad.status, bad.description) == ("400", "BadDeviceToken")
    rows = sim.ledger(since)
    assert [(r["status"], r["reason"]) for r in rows] == [
        (200, None),
        (410, "Unregistered"),
        (400, "BadDeviceToken"),
    ]
    assert all(r["tenant_id"] == "t" for r in rows)


# -- httpx, h2c prior knowledge and TLS ---------------------------------------------------------
def test_h2c_success_echoes_apns_id(sim: Sim) -> None:
    token, apns_id = new_token(), str(uuid.uuid4()).upper()
    with h2c(sim) as client:
        r = client.post(
            f"/3/device/{token}", json={"aps": {}, "x": 1}, headers={"apns-id": apns_id}
        )
        assert r.http_version == "HTTP/2"
        assert r.status_code == 200 and r.content == b""
        assert r.headers["apns-id"] == apns_id
        r = client.post(f"/3/device/{token}", json={"aps": {"alert": "x"}})
        assert r.status_code == 200
        assert uuid.UUID(r.headers["apns-id"])


@needs_h2_server
def test_connect_tunnel_keeps_apples_host_name(tls_sim: Sim) -> None:
    """The port doubles as an HTTPS proxy to itself: CONNECT, then TLS for api.push.apple.com."""
    token = new_token()
    since = tls_sim.next_seq()
    with httpx.Client(
        http2=True,
        verify=tls_sim.client_ssl(),
        proxy=f"http://127.0.0.1:{tls_sim.port}",
        headers=tls_sim.apns_headers(),
    ) as client:
        r = client.post(
            f"https://api.push.apple.com/3/device/{token}",
            json={"aps": {"alert": "x"}, "tenant_id": "t-proxy"},
        )
    assert (r.http_version, r.status_code) == ("HTTP/2", 200)
    [row] = tls_sim.ledger(since)
    assert (row["token"], row["tenant_id"], row["status"]) == (token, "t-proxy", 200)


def test_tls_h2_and_http11_via_alpn(tls_sim: Sim) -> None:
    token = new_token()
    auth = tls_sim.apns_headers()
    with httpx.Client(
        http2=True, verify=tls_sim.client_ssl(), base_url=tls_sim.url, headers=auth
    ) as client:
        r = client.post(f"/3/device/{token}", json={"aps": {"alert": "x"}})
        assert (r.http_version, r.status_code) == ("HTTP/2", 200)
    with httpx.Client(verify=tls_sim.client_ssl(), base_url=tls_sim.url, headers=auth) as client:
        r = client.post("/3/device/abc", json={"aps": {"alert": "x"}})
        assert (r.http_version, r.status_code) == ("HTTP/1.1", 400)
        assert r.json() == {"reason": "BadDeviceToken"}


@pytest.mark.parametrize(
    ("path", "method", "headers", "body", "status", "reason"),
    [
        ("/3/device/abc", "POST", {}, b'{"aps":{}}', 400, "BadDeviceToken"),
        ("/3/device/" + "g" * 64, "POST", {}, b'{"aps":{}}', 400, "BadDeviceToken"),
        ("/3/device/", "POST", {}, b'{"aps":{}}', 400, "MissingDeviceToken"),
        ("/3/device/TOKEN", "GET", {}, b"", 405, "MethodNotAllowed"),
        ("/3/devices/TOKEN", "POST", {}, b'{"aps":{}}', 404, "BadPath"),
        ("/3/device/TOKEN", "POST", {}, b"", 400, "PayloadEmpty"),
        ("/3/device/TOKEN", "POST", {}, b"{not json", 400, "BadPayload"),
        ("/3/device/TOKEN", "POST", {"apns-id": "nope"}, b'{"aps":{}}', 400, "BadMessageId"),
        ("/3/device/TOKEN", "POST", {"apns-priority": "7"}, b'{"aps":{}}', 400, "BadPriority"),
        ("/3/device/TOKEN", "POST", {"apns-push-type": "x"}, b'{"aps":{}}', 400, "InvalidPushType"),
        (
            "/3/device/TOKEN",
            "POST",
            {"authorization": "bearer not-a-jwt"},
            b'{"aps":{}}',
            403,
            "InvalidProviderToken",
        ),
    ],
)
def test_apple_error_reasons(sim: Sim, path, method, headers, body, status, reason) -> None:
    path = path.replace("TOKEN", new_token())
    since = sim.next_seq()
    with h2c(sim) as client:
        r = client.request(method, path, headers=headers, content=body)
    assert r.status_code == status
    assert r.json() == {"reason": reason}
    assert uuid.UUID(r.headers["apns-id"])
    [row] = sim.ledger(since)
    assert (row["status"], row["reason"], row["apns_id"]) == (status, reason, r.headers["apns-id"])


# -- provider tokens and topics, as Apple checks them ---------------------------------------------
def _push(client: httpx.Client, token: str, **headers: str) -> httpx.Response:
    return client.post(f"/3/device/{token}", json={"aps": {"alert": "x"}}, headers=headers)


def test_aioapns_with_a_key_apple_does_not_know_gets_invalid_provider_token(sim: Sim) -> None:
    async def go() -> object:
        client = apns_client(key=es256_key())  # same key id and team, another key
        aim_at(client, sim.port, tls=False)
        return await send_one(client, new_token(), "t", "n")

    result = asyncio.run(go())
    assert (result.status, result.description) == ("403", "InvalidProviderToken")


def test_aioapns_for_a_bundle_of_another_team_gets_topic_disallowed(sim: Sim) -> None:
    async def go() -> object:
        client = apns_client(topic="org.other.app")
        aim_at(client, sim.port, tls=False)
        return await send_one(client, new_token(), "t", "n")

    result = asyncio.run(go())
    assert (result.status, result.description) == ("400", "TopicDisallowed")


@pytest.mark.parametrize(
    ("authorization", "status", "reason"),
    [
        (None, 403, "MissingProviderToken"),
        ("bearer not-a-jwt", 403, "InvalidProviderToken"),
        ("basic abc", 403, "InvalidProviderToken"),
        # issued 61 minutes ago: a client that did not renew its token
        ("issued:-3660", 403, "ExpiredProviderToken"),
        ("issued:-3000", 200, None),
        # another team's claim under this key id
        ("iss:OTHERTEAM0", 403, "InvalidProviderToken"),
        ("kid:UNKNOWNKEY", 403, "InvalidProviderToken"),
        ("alg:HS256", 403, "InvalidProviderToken"),
    ],
)
def test_provider_tokens_apple_refuses(sim: Sim, authorization, status, reason) -> None:
    import jwt

    headers = sim.apns_headers()
    now = int(time.time())
    if authorization is None:
        del headers["authorization"]
    elif authorization.startswith("issued:"):
        issued = now + int(authorization.split(":")[1])
        headers["authorization"] = f"bearer {SIGNING_KEY.provider_token(issued)}"
    elif authorization.startswith(("iss:", "kid:", "alg:")):
        field, value = authorization.split(":")
        claims = {"iss": SIGNING_KEY.team_id, "iat": now}
        head = {"kid": SIGNING_KEY.key_id}
        key, alg = SIGNING_KEY.private_pem, "ES256"
        if field == "iss":
            claims["iss"] = value
        elif field == "kid":
            head["kid"] = value
        else:
            key, alg = "a shared secret of at least thirty-two bytes", value
        headers["authorization"] = f"bearer {jwt.encode(claims, key, algorithm=alg, headers=head)}"
    else:
        headers["authorization"] = authorization
    with httpx.Client(http2=True, http1=False, base_url=sim.url, timeout=20) as client:
        r = client.post(f"/3/device/{new_token()}", json={"aps": {"alert": "x"}}, headers=headers)
    assert r.status_code == status, r.text
    if reason is not None:
        assert r.json() == {"reason": reason}


def test_a_token_renewed_within_20_minutes_on_one_connection_is_refused(sim: Sim) -> None:
    """Apple: no more than one new token per 20 minutes. A client that signs every minute (or
    every push) gets 429 TooManyProviderTokenUpdates; its old token keeps working, and a new
    connection may start with any valid token."""
    headers = sim.apns_headers()
    now = int(time.time())
    first, a_minute_later = (SIGNING_KEY.provider_token(now - 600 + d) for d in (0, 60))
    with h2c(sim) as client:
        r = _push(client, new_token(), authorization=f"bearer {first}")
        assert r.status_code == 200
        r = _push(client, new_token(), authorization=f"bearer {a_minute_later}")
        assert (r.status_code, r.json()) == (429, {"reason": "TooManyProviderTokenUpdates"})
        assert _push(client, new_token(), authorization=f"bearer {first}").status_code == 200
    with httpx.Client(
        http2=True, http1=False, base_url=sim.url, timeout=20, headers=headers
    ) as other:
        auth = f"bearer {a_minute_later}"
        assert _push(other, new_token(), authorization=auth).status_code == 200
    renewed = SIGNING_KEY.provider_token(now - 600 + 20 * 60)
    with h2c(sim) as client:
        assert _push(client, new_token(), authorization=f"bearer {first}").status_code == 200
        assert _push(client, new_token(), authorization=f"bearer {renewed}").status_code == 200


def test_topics_and_the_bundle_a_device_token_belongs_to(sim: Sim) -> None:
    ours, theirs = new_token(), new_token()
    sim.apns_headers("com.example.app.two")  # the team has two bundles
    status, _ = sim.control("PUT", "/_sim/apns/topics", {"tokens": {theirs: "com.example.app.two"}})
    assert status == 200
    with h2c(sim) as client:
        assert _push(client, ours).status_code == 200  # unbound, no default: any team bundle
        r = _push(client, theirs)
        assert (r.status_code, r.json()) == (400, {"reason": "DeviceTokenNotForTopic"})
        assert _push(client, theirs, **{"apns-topic": "com.example.app.two"}).status_code == 200
        r = client.post(
            f"/3/device/{ours}",
            json={"aps": {"alert": "x"}},
            headers={"apns-topic": ""},
        )
        assert (r.status_code, r.json()) == (400, {"reason": "MissingTopic"})


def test_push_type_required_and_priority_10_only_for_what_alerts(sim: Sim) -> None:
    silent = {"aps": {"content-available": 1}}
    with h2c(sim) as client:
        r = client.post(
            f"/3/device/{new_token()}", json={"aps": {}}, headers={"apns-push-type": ""}
        )
        assert (r.status_code, r.json()) == (400, {"reason": "InvalidPushType"})
        for push_type, priority, status in (
            ("background", "10", 400),
            ("background", "5", 200),
            ("alert", "10", 400),  # content-available alone at priority 10
            ("alert", "5", 200),
        ):
            r = client.post(
                f"/3/device/{new_token()}",
                json=silent,
                headers={"apns-push-type": push_type, "apns-priority": priority},
            )
            assert r.status_code == status, (push_type, priority, r.text)
            if status == 400:
                assert r.json() == {"reason": "BadPriority"}


def test_strict_off_for_one_run_and_back_on_at_reset(tmp_path: Path) -> None:
    with run_sim(MODULE, tmp_path) as own:
        with httpx.Client(http2=True, http1=False, base_url=own.url, timeout=20) as bare:
            r = bare.post(f"/3/device/{new_token()}", json={"aps": {}})
            assert (r.status_code, r.json()) == (403, {"reason": "MissingProviderToken"})
            for bad in ({"enabled": "no"}, {}, {"enabled": False, "x": 1}):
                assert bare.put("/_sim/strict", json=bad).status_code == 400
            assert bare.put("/_sim/strict", json={"enabled": False}).json()["strict"] is False
            assert bare.post(f"/3/device/{new_token()}", json={"aps": {}}).status_code == 200
            # the lenient simulator still refuses what is not a JWT at all
            r = bare.post(
                f"/3/device/{new_token()}",
                json={"aps": {}},
                headers={"authorization": "bearer nope"},
            )
            assert r.status_code == 403
            own.reset()
            assert bare.get("/_sim/strict").json()["strict"] is True
            assert bare.post(f"/3/device/{new_token()}", json={"aps": {}}).status_code == 403


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/_sim/apns/keys", {"key_id": "short", "team_id": "FANOUTTEAM", "public_key": "x"}),
        ("/_sim/apns/keys", {"key_id": "ABCDEFGHIJ", "team_id": "FANOUTTEAM", "public_key": "x"}),
        ("/_sim/apns/keys", {"key_id": "ABCDEFGHIJ", "team_id": "FANOUTTEAM"}),
        ("/_sim/apns/keys", {"nope": 1}),
        ("/_sim/apns/topics", {"default": 3}),
        ("/_sim/apns/topics", {"tokens": ["a"]}),
        ("/_sim/apns/topics", {}),
    ],
)
def test_bad_key_and_topic_registrations_are_400(sim: Sim, path, body) -> None:
    status, answer = sim.control("PUT", path, body)
    assert status == 400 and isinstance(answer["error"], str)


def test_keys_survive_a_reset_and_reach_every_process(tmp_path: Path) -> None:
    """A signing key is the team's, not a run's: registered once, it verifies tokens in every
    serving process and after a reset."""
    with run_sim(MODULE, tmp_path, processes=2) as own:
        headers = own.apns_headers()
        own.reset()
        statuses = set()
        for _ in range(6):  # new connections: the kernel spreads them over both processes
            with httpx.Client(
                http2=True, http1=False, base_url=own.url, timeout=20, headers=headers
            ) as client:
                statuses.add(_push(client, new_token()).status_code)
        assert statuses == {200}


def test_a_token_marked_bad_answers_400_bad_device_token(sim: Sim) -> None:
    token = new_token()
    with h2c(sim) as client:
        body = {"tokens": [token], "reason": "BadDeviceToken"}
        assert client.post("/_sim/tokens/unregistered", json=body).status_code == 200
        r = client.post(f"/3/device/{token}", json={"aps": {}, "tenant_id": "t9"})
    assert r.status_code == 400
    assert r.json() == {"reason": "BadDeviceToken"}
    row = sim.ledger(sim.next_seq() - 1)[0]
    assert (row["token"], row["status"], row["reason"]) == (token, 400, "BadDeviceToken")


def test_unregistered_410_with_timestamp(sim: Sim) -> None:
    token = new_token()
    with h2c(sim) as client:
        before = int(time.time() * 1000)
        assert client.post(f"/3/device/{token}", json={"aps": {}}).status_code == 200
        r = client.post("/_sim/tokens/unregistered", json={"tokens": [token]})
        assert r.status_code == 200
        r = client.post(f"/3/device/{token}", json={"aps": {}, "tenant_id": "t9"})
    assert r.status_code == 410
    body = r.json()
    assert body["reason"] == "Unregistered"
    assert isinstance(body["timestamp"], int)
    assert before <= body["timestamp"] <= int(time.time() * 1000)
    row = sim.ledger(sim.next_seq() - 1)[0]
    assert (row["token"], row["status"], row["reason"], row["tenant_id"]) == (
        token,
        410,
        "Unregistered",
        "t9",
    )


def test_payload_size_limit(sim: Sim) -> None:
    token = new_token()
    with h2c(sim) as client:
        assert client.post(f"/3/device/{token}", content=payload_of_size(4096)).status_code == 200
        r = client.post(f"/3/device/{token}", content=payload_of_size(4097))
        assert (r.status_code, r.json()) == (413, {"reason": "PayloadTooLarge"})
        voip = {"apns-push-type": "voip"}
        r = client.post(f"/3/device/{token}", content=payload_of_size(5000), headers=voip)
        assert r.status_code == 200


def test_large_bodies_flow_control(sim: Sim) -> None:
    """A 3 MiB request body (beyond every initial window) and a large ledger response."""
    body = payload_of_size(3 * 1024 * 1024)
    since = sim.next_seq()
    auth = sim.apns_headers()

    async def go() -> None:
        conn = await H2ClientConnection.open("127.0.0.1", sim.port)
        try:
            r = await conn.request("POST", f"/3/device/{new_token()}", auth, body)
            assert (r.status, r.json()) == (413, {"reason": "PayloadTooLarge"})
        finally:
            conn.close()

    asyncio.run(go())
    with h2c(sim) as client:
        for i in range(600):
            client.post(f"/3/device/{new_token()}", json={"aps": {}, "notification_id": f"n{i}"})
        r = client.get(f"/_sim/ledger?since={since}")
    assert r.status_code == 200 and len(r.content) > 100_000
    assert len(r.json()["rows"]) == 601


def test_500_concurrent_streams_on_one_connection(sim: Sim) -> None:
    tokens = [new_token() for _ in range(500)]
    since = sim.next_seq()
    auth = sim.apns_headers()

    async def go() -> list[int]:
        conn = await H2ClientConnection.open("127.0.0.1", sim.port)
        try:

            async def one(i: int, token: str) -> int:
                body = json.dumps({"aps": {}, "notification_id": str(i)}).encode()
                r = await conn.request("POST", f"/3/device/{token}", auth, body)
                return r.status

            return await asyncio.wait_for(
                asyncio.gather(*(one(i, t) for i, t in enumerate(tokens))), 60
            )
        finally:
            conn.close()

    statuses = asyncio.run(go())
    assert statuses == [200] * 500
    rows = sim.ledger(since)
    assert sorted(r["token"] for r in rows) == sorted(tokens)
    assert sorted(int(r["notification_id"]) for r in rows) == list(range(500))


# -- HTTP/2 concurrent streams, as Apple advertises them ------------------------------------------
# Apple ("Establishing a connection to APNs"): with token authentication "APNs allows only one
# stream until you post a request with a valid authentication token".
def _body(n: int = 0) -> bytes:
    return json.dumps({"aps": {"alert": "x"}, "notification_id": f"s{n}"}).encode()


@needs_h2_stream_settings
def test_a_connection_allows_one_stream_until_a_valid_token_then_1000(sim: Sim) -> None:
    """Our own client (emulators/h2_client.py) reads the server's settings: 1 from the first
    SETTINGS frame, 1000 once a push with a valid provider token was answered."""
    auth = sim.apns_headers()

    async def go() -> tuple[int, int, int]:
        conn = await H2ClientConnection.open("127.0.0.1", sim.port)
        try:
            before = conn.conn.remote_settings.max_concurrent_streams
            r = await conn.request("POST", f"/3/device/{new_token()}", auth, _body())
            return before, r.status, conn.conn.remote_settings.max_concurrent_streams
        finally:
            conn.close()

    assert asyncio.run(go()) == (1, 200, STREAMS_AFTER_TOKEN)


def test_the_limit_counts_the_streams_open_not_those_a_connection_ever_had(sim: Sim) -> None:
    """More pushes than the limit on one connection, as many at once as it allows: every one
    answered 200, none refused (a stream stops counting once answered)."""
    auth = sim.apns_headers()
    count = STREAMS_AFTER_TOKEN + 1

    async def go() -> list[int]:
        conn = await H2ClientConnection.open("127.0.0.1", sim.port)
        try:

            async def one(n: int) -> int:
                r = await conn.request("POST", f"/3/device/{new_token()}", auth, _body(n))
                return r.status

            return await asyncio.wait_for(asyncio.gather(*(one(n) for n in range(count))), 60)
        finally:
            conn.close()

    assert asyncio.run(go()) == [200] * count


@needs_h2_stream_settings
@pytest.mark.parametrize("refusal", ["unknown key", "expired", "missing"])
def test_a_connection_whose_tokens_apple_refuses_stays_at_one_stream(
    sim: Sim, refusal: str
) -> None:
    """Refused credentials (403) leave the connection at 1, however many pushes it sends; the
    first push with a valid token raises it."""
    good = sim.apns_headers()
    bad = dict(good)
    if refusal == "unknown key":
        bad["authorization"] = f"bearer {new_signing_key(key_id='NOTAPPLES1').provider_token()}"
    elif refusal == "expired":
        bad["authorization"] = f"bearer {SIGNING_KEY.provider_token(time.time() - 3660)}"
    else:
        del bad["authorization"]
    with H2Probe(sim.port) as probe:
        statuses = [probe.answer(probe.open_stream(f"/3/device/{new_token()}", bad, _body()))]
        statuses.append(probe.answer(probe.open_stream(f"/3/device/{new_token()}", bad, _body())))
        seen_after_refusals = list(probe.max_streams_seen)
        statuses.append(probe.answer(probe.open_stream(f"/3/device/{new_token()}", good, _body())))
    assert statuses == [403, 403, 200]
    assert seen_after_refusals == [1]
    assert probe.max_streams_seen == [1, STREAMS_AFTER_TOKEN]
    assert not probe.terminated()


@needs_h2_stream_settings
def test_a_second_stream_before_the_token_is_refused_alone_and_can_be_sent_again(
    sim: Sim,
) -> None:
    """Two streams at once on a new connection: the second is reset with REFUSED_STREAM (never
    processed: no ledger row), the connection lives on (no GOAWAY), the first is answered, and
    the refused push sent again once the limit is 1000 is answered too."""
    auth = sim.apns_headers()
    first, second = new_token(), new_token()
    since = sim.next_seq()
    with H2Probe(sim.port) as probe:
        # both opened before the server's SETTINGS are read (the client cannot know the limit);
        # the first stays open (its body not yet sent), so the second is over the limit
        sid1 = probe.open_stream(f"/3/device/{first}", auth, end=False)
        sid2 = probe.open_stream(f"/3/device/{second}", auth, _body(2))
        refused = probe.reset(sid2)
        probe.finish(sid1, _body(1))
        status1 = probe.answer(sid1)
        status3 = probe.answer(probe.open_stream(f"/3/device/{second}", auth, _body(3)))
        terminated = probe.terminated()
    assert refused.error_code == h2.errors.ErrorCodes.REFUSED_STREAM
    assert (status1, status3, terminated) == (200, 200, False)
    assert probe.max_streams_seen == [1, STREAMS_AFTER_TOKEN]
    rows = sim.ledger(since)
    assert [(r["token"], r["notification_id"]) for r in rows] == [(first, "s1"), (second, "s3")]


@needs_h2_stream_settings
def test_a_stream_the_client_cancels_frees_its_place(sim: Sim) -> None:
    """At the limit of one, a stream the client resets no longer counts: the next is taken."""
    auth = sim.apns_headers()
    with H2Probe(sim.port) as probe:
        probe.cancel(probe.open_stream(f"/3/device/{new_token()}", auth, end=False))
        status = probe.answer(probe.open_stream(f"/3/device/{new_token()}", auth, _body()))
    assert status == 200
    assert not any(isinstance(e, h2.events.StreamReset) for e in probe.events)


@needs_h2_stream_settings
def test_aioapns_sees_one_stream_then_1000_and_a_key_apple_does_not_know_stays_at_one(
    sim: Sim,
) -> None:
    """aioapns (unchanged) bounds its streams by the server's SETTINGS: it is told 1, then 1000
    after its first push with the registered key; with an unknown key only 1."""
    code = h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS

    async def go(key: str | None) -> tuple[list[int], list[str], int]:
        client = apns_client(key=key)
        aim_at(client, sim.port, tls=False)
        seen: list[int] = []
        base = client.pool.protocol_class

        class Recording(base):  # type: ignore[misc, valid-type]
            def on_remote_settings_changed(self, changed):  # type: ignore[no-untyped-def]
                if code in changed:
                    seen.append(changed[code].new_value)
                super().on_remote_settings_changed(changed)

        client.pool.protocol_class = Recording
        statuses = []
        try:
            for n in range(3):
                request = NotificationRequest(
                    device_token=new_token(),
                    push_type=PushType.ALERT,
                    message={"aps": {"alert": "x"}, "notification_id": f"a{n}"},
                )
                result = await asyncio.wait_for(client.send_notification(request), 20)
                statuses.append(result.status)
            [connection] = client.pool.connections
            return seen, statuses, connection.free_channels.bound
        finally:
            client.pool.close()

    assert asyncio.run(go(None)) == ([1, STREAMS_AFTER_TOKEN], ["200"] * 3, STREAMS_AFTER_TOKEN)
    assert asyncio.run(go(es256_key())) == ([1], ["403"] * 3, 1)


def test_httpx_starts_at_one_stream_and_sends_200_at_once_on_one_connection(sim: Sim) -> None:
    """httpx (h2) on one connection, 200 pushes at once from the start: it waits for the one
    stream it is first allowed, and every push is answered (none refused, none lost)."""
    since = sim.next_seq()

    async def go() -> list[int]:
        limits = httpx.Limits(max_connections=1)
        async with httpx.AsyncClient(
            http1=False,
            http2=True,
            base_url=sim.url,
            limits=limits,
            timeout=30,
            headers=sim.apns_headers(),
        ) as client:
            responses = await asyncio.gather(
                *(client.post(f"/3/device/{new_token()}", content=_body(n)) for n in range(200))
            )
        return [r.status_code for r in responses]

    assert asyncio.run(go()) == [200] * 200
    assert len(sim.ledger(since)) == 200


def test_under_granian_every_connection_allows_1000_streams_from_the_start(
    tmp_path: Path,
) -> None:
    """What granian cannot do (serving.py): the application has no hold on a connection's
    settings, so a new APNs connection advertises 1000 before any token, not Apple's 1."""
    with run_sim(MODULE, tmp_path, server="granian", processes=1) as own:
        with H2Probe(own.port) as probe:
            assert probe.settings() == [STREAMS_AFTER_TOKEN]


# -- control API --------------------------------------------------------------------------------
def test_ledger_and_reset(tmp_path: Path) -> None:
    with run_sim(MODULE, tmp_path) as own:
        token = new_token()
        with h2c(own) as client:
            assert client.get("/_sim/health").json() == {"ok": True, "provider": "apns"}
            for i in range(3):
                client.post(f"/3/device/{token}", json={"aps": {}, "notification_id": f"n{i}"})
            page = client.get("/_sim/ledger?since=1").json()
            assert page["next"] == 3
            assert [r["seq"] for r in page["rows"]] == [1, 2]
            assert set(page["rows"][0]) == {
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
            }
            assert client.get("/_sim/ledger?since=3").json() == {"rows": [], "next": 3}
            client.post("/_sim/tokens/unregistered", json={"tokens": [token]})
            assert client.post(f"/3/device/{token}", json={"aps": {}}).status_code == 410
            assert client.post("/_sim/reset").status_code == 200
            assert client.get("/_sim/ledger").json() == {"rows": [], "next": 0}
            assert client.post(f"/3/device/{token}", json={"aps": {}}).status_code == 200
            assert client.get("/_sim/ledger").json()["rows"][0]["seq"] == 0


def test_every_row_records_the_push_type_priority_expiration_and_alert_as_sent(sim: Sim) -> None:
    """What push_attributes judges: the headers as sent (null when absent) and the alert's text,
    on a 200 and on a refusal alike."""
    token, since = new_token(), sim.next_seq()
    alert = {"aps": {"alert": {"title": "New activity", "body": "u1 like"}}}
    sends = [
        ({"apns-priority": "10", "apns-expiration": "1900000000"}, alert),
        ({"apns-push-type": "background", "apns-priority": "5", "apns-expiration": "0"},
         {"aps": {"content-available": 1}}),
        ({}, {"aps": {"alert": "plain"}}),
        ({"apns-priority": "10"}, {"aps": {"alert": {"loc-key": "NEW_LIKE"}}}),
        ({}, {"aps": {"alert": {}}}),
        ({"apns-priority": "7"}, alert),  # 400 BadPriority: recorded all the same
    ]  # fmt: skip
    with h2c(sim) as client:
        statuses = [
            client.post(f"/3/device/{token}", json=body, headers=extra).status_code
            for extra, body in sends
        ]
    assert statuses == [200, 200, 200, 200, 200, 400]
    rows = sim.ledger(since)
    assert [(r["push_type"], r["priority"], r["expiration"], r["text"]) for r in rows] == [
        ("alert", "10", "1900000000", "New activity\nu1 like"),
        ("background", "5", "0", None),
        ("alert", None, None, "plain"),
        ("alert", "10", None, "NEW_LIKE"),
        ("alert", None, None, ""),
        ("alert", "7", None, "New activity\nu1 like"),
    ]


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/_sim/ledger?since=-1", None),
        ("GET", "/_sim/ledger?since=abc", None),
        ("POST", "/_sim/tokens/unregistered", b"not json"),
        ("POST", "/_sim/tokens/unregistered", b'{"tokens": "abc"}'),
        ("POST", "/_sim/tokens/unregistered", b'{"tokens": [1]}'),
        ("POST", "/_sim/tokens/unregistered", b'{"tokens": ["a"], "reason": "Gone"}'),
    ],
)
def test_bad_control_input(sim: Sim, method, path, body) -> None:
    with h2c(sim) as client:
        r = client.request(method, path, content=body)
    assert r.status_code == 400
    assert isinstance(r.json()["error"], str)


def test_http11_keep_alive(sim: Sim) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=10)
    try:
        for _ in range(3):
            conn.request("GET", "/_sim/health")
            resp = conn.getresponse()
            assert resp.status == 200 and json.loads(resp.read())["provider"] == "apns"
        body = json.dumps({"aps": {"alert": "x"}, "tenant_id": "t1"})
        conn.request("POST", f"/3/device/{new_token()}", body=body, headers=sim.apns_headers())
        resp = conn.getresponse()
        assert resp.status == 200 and resp.getheader("apns-id")
        resp.read()
    finally:
        conn.close()


# -- process behaviour ----------------------------------------------------------------------------
def test_port_in_use_exits_2(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", MODULE, "--port", str(port)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 2
    assert f"port {port} on 127.0.0.1 is already in use" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_cleanly(tmp_path: Path, sig: int) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", MODULE, "--port", str(port), "--tls"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = read_line(proc, START_TIMEOUT)
        assert line.strip() == f"apns simulator listening on https://127.0.0.1:{port}"
        # an open connection must not keep the process alive
        with socket.create_connection(("127.0.0.1", port), timeout=10):
            assert stop(proc, sig) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=15)
    assert proc.stderr is not None
    err = proc.stderr.read()
    proc.stderr.close()
    assert "TLS material in" in err and "Traceback" not in err


# -- the hot path's shortcuts keep Apple's answers --------------------------------------------
@pytest.mark.parametrize("http2", [True, False])
def test_duplicate_apns_headers_over_h2_and_http11(sim: Sim, http2: bool) -> None:
    """Repeated apns-* names are refused whether or not the server added a host header (the
    check is skipped only when no name can repeat)."""
    auth = sim.apns_headers()
    with httpx.Client(
        http1=not http2, http2=http2, base_url=sim.url, timeout=20, headers=auth
    ) as client:
        for headers in (
            [("apns-priority", "10"), ("apns-priority", "5")],
            [("x-a", "1"), ("x-a", "2"), ("apns-topic", "a"), ("apns-topic", "b")],
        ):
            r = client.post(f"/3/device/{new_token()}", json={"aps": {}}, headers=headers)
            assert (r.status_code, r.json()["reason"]) == (400, "DuplicateHeaders")
        r = client.post(
            f"/3/device/{new_token()}",
            json={"aps": {}},
            headers=[("x-a", "1"), ("x-a", "2"), ("apns-topic", APNS_TOPIC)],
        )
        assert r.status_code == 200


def test_apns_ids_are_unique_version_4_uuids() -> None:
    from emulators.providers.apns import ApnsIds

    first, second = ApnsIds(), ApnsIds()
    ids = [first() for _ in range(2000)] + [second() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    for value in ids[::97] + ids[-3:]:
        parsed = uuid.UUID(value)
        assert (str(parsed), parsed.version, parsed.variant) == (value, 4, uuid.RFC_4122)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"aps":{}}', {"aps": {}}),
        (b'\xef\xbb\xbf{"aps":{}}', {"aps": {}}),  # a UTF-8 BOM, as json.loads reads it
        ('{"aps":{"alert":"é"}}'.encode("utf-16"), {"aps": {"alert": "é"}}),
        (b"{not json", None),
        (b"\xff\xfe\x00", None),
        (b"", None),
        (b"  ", None),
    ],
)
def test_parse_json_body(body: bytes, expected: object) -> None:
    from emulators.providers.apns import parse_json_body

    assert parse_json_body(body) == expected


def test_a_dead_token_revived_answers_200_again(sim: Sim) -> None:
    """An app installed again gets its old token back: after ``/_sim/tokens/revived`` the
    token that answered 410 (or 400 BadDeviceToken) is delivered to again."""
    gone, bad = new_token(), new_token()
    with h2c(sim) as client:
        assert client.post("/_sim/tokens/unregistered", json={"tokens": [gone]}).status_code == 200
        body = {"tokens": [bad], "reason": "BadDeviceToken"}
        assert client.post("/_sim/tokens/unregistered", json=body).status_code == 200
        assert client.post(f"/3/device/{gone}", json={"aps": {}}).status_code == 410
        assert client.post(f"/3/device/{bad}", json={"aps": {}}).status_code == 400
        r = client.post("/_sim/tokens/revived", json={"tokens": [gone, bad]})
        assert r.json() == {"ok": True, "revived": 2}
        assert client.post(f"/3/device/{gone}", json={"aps": {}}).status_code == 200
        assert client.post(f"/3/device/{bad}", json={"aps": {}}).status_code == 200
        assert client.get("/_sim/tokens/revived").status_code == 405


def test_the_ledger_reads_ids_where_the_system_says_its_pushes_carry_them(tmp_path: Path) -> None:
    """A system whose payload names its ids under keys of its own states them (PUT
    /_sim/payload-ids, dotted paths); the ledger reads them there, through every serving
    process and across a reset; a bad path is a 400 naming what is wrong."""
    with run_sim(MODULE, tmp_path) as own, h2c(own) as client:
        token = new_token()
        ours = {"aps": {"alert": "x"}, "n": {"o": "acme", "id": "01J0000000000000000000000A"}}
        defaults = {"aps": {}, "tenant_id": "t0", "notification_id": "n0"}
        client.post(f"/3/device/{token}", json=ours)
        client.post(f"/3/device/{token}", json=defaults)
        paths = {"tenant_id": "n.o", "notification_id": "n.id"}
        assert client.put("/_sim/payload-ids", json=paths).json() == paths
        assert client.post("/_sim/reset").status_code == 200
        assert client.get("/_sim/payload-ids").json() == paths  # a contract, not run state
        client.post(f"/3/device/{token}", json=ours)
        client.post(f"/3/device/{token}", json=defaults)
        rows = client.get("/_sim/ledger").json()["rows"]
        ids = [(r["tenant_id"], r["notification_id"]) for r in rows]
        assert ids == [("acme", "01J0000000000000000000000A"), (None, None)]
        for bad in ({"tenant_id": "n..o"}, {"recipient": "x"}, {"tenant_id": 3}, []):
            answer = client.put("/_sim/payload-ids", json=bad)
            assert answer.status_code == 400 and "error" in answer.json()
        assert client.get("/_sim/payload-ids").json() == paths
