"""The FCM HTTP v1 simulator as a real server on a real socket, driven by real clients."""

from __future__ import annotations

import asyncio
import base64
import datetime
import functools
import json
import socket
import ssl
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import google.auth.transport.requests
import h2.errors
import httpx
import pytest
import requests
from google.oauth2 import service_account
from pyfcm import FCMNotification
from pyfcm.errors import FCMNotRegisteredError, InvalidDataError
from sim_process import REPO, H2Probe, Sim, read_line, run_sim, stop, wait_healthy

from emulators.http_server import Request, server_port, start_server
from emulators.ports import free_port
from emulators.providers.fcm import (
    JWT_BEARER_GRANT,
    MAX_CONCURRENT_STREAMS,
    FcmSimulator,
    issue_access_token,
    project_number,
    write_service_account_file,
)
from emulators.providers.ledger import ProviderState
from emulators.providers.shared import SharedDir

pytestmark = pytest.mark.integration

PROVIDER = "fcm"
MODULE = "emulators.providers.fcm"
FCM_ERROR = "type.googleapis.com/google.firebase.fcm.v1.FcmError"


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    with run_sim(MODULE, tmp_path_factory.mktemp("fcm-plain")) as s:
        yield s


@pytest.fixture(scope="module")
def tls_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    with run_sim(MODULE, tmp_path_factory.mktemp("fcm-tls"), tls=True) as s:
        yield s


# -- helpers ----------------------------------------------------------------------------------
def new_token() -> str:
    return f"fcm-{uuid.uuid4().hex}:APA91b{uuid.uuid4().hex}"


def pyfcm_client(sim: Sim, tmp_path: Path, project: str = "proj-a") -> FCMNotification:
    """pyfcm, unchanged: service-account file with token_uri at the simulator, endpoint base set."""
    sa = write_service_account_file(tmp_path / f"{project}.json", f"{sim.url}/token", project)
    fcm = FCMNotification(service_account_file=str(sa))
    fcm.FCM_END_POINT_BASE = f"{sim.url}/v1/projects"  # instance attribute over the class default
    return fcm


def access_token(url: str, verify: ssl.SSLContext | bool = True) -> str:
    """An access token from the simulator's ``POST /token``, by the JWT-bearer grant google-auth
    makes (the simulator does not check the assertion's signature)."""
    header = base64.urlsafe_b64encode(b'{"alg":"RS256","typ":"JWT"}').rstrip(b"=").decode()
    form = {"grant_type": JWT_BEARER_GRANT, "assertion": f"{header}.e30.c2ln"}
    r = httpx.post(f"{url}/token", data=form, verify=verify, timeout=10)
    r.raise_for_status()
    return r.json()["access_token"]


def bearer(sim: Sim) -> dict[str, str]:
    """The Authorization header of a send to ``sim`` (a fresh token of its own)."""
    return sim.fcm_headers()


def send_url(sim: Sim, project: str = "proj-a") -> str:
    return f"{sim.url}/v1/projects/{project}/messages:send"


def assert_google_error(r: httpx.Response, code: int, status: str, error_code: str | None) -> None:
    assert r.status_code == code
    error = r.json()["error"]
    assert error["code"] == code and error["status"] == status
    assert isinstance(error["message"], str) and error["message"]
    fcm_details = [d for d in error.get("details", []) if d["@type"] == FCM_ERROR]
    if error_code is None:
        assert not fcm_details
    else:
        assert fcm_details == [{"@type": FCM_ERROR, "errorCode": error_code}]


# -- pyfcm + google-auth (unchanged, from PyPI) -------------------------------------------------
def test_pyfcm_send_records_ledger_row(sim: Sim, tmp_path: Path) -> None:
    fcm = pyfcm_client(sim, tmp_path)
    token = new_token()
    since = sim.next_seq()
    result = fcm.notify(
        fcm_token=token,
        notification_title="Hello",
        notification_body="World",
        data_payload={"tenant_id": "tenant-a", "notification_id": "notif-1", "kind": "like"},
    )
    assert result["name"].startswith("projects/proj-a/messages/")
    [row] = sim.ledger(since)
    assert {k: row[k] for k in ("provider", "token", "project", "status", "reason")} == {
        "provider": "fcm",
        "token": token,
        "project": "proj-a",
        "status": 200,
        "reason": None,
    }
    assert (row["tenant_id"], row["notification_id"], row["apns_id"]) == (
        "tenant-a",
        "notif-1",
        None,
    )
    assert (row["priority"], row["expiration"], row["text"]) == (None, None, "Hello\nWorld")


def test_pyfcm_unregistered_and_invalid(sim: Sim, tmp_path: Path) -> None:
    fcm = pyfcm_client(sim, tmp_path, "proj-b")
    dead = new_token()
    assert sim.control("POST", "/_sim/tokens/unregistered", {"tokens": [dead]})[0] == 200
    since = sim.next_seq()
    with pytest.raises(FCMNotRegisteredError):
        fcm.notify(fcm_token=dead, data_payload={"tenant_id": "t1", "notification_id": "n1"})
    with pytest.raises(InvalidDataError, match="Recipient of the message is not set"):
        fcm.notify(notification_title="no target")
    rows = sim.ledger(since)
    assert [(r["status"], r["reason"], r["project"]) for r in rows] == [
        (404, "UNREGISTERED", "proj-b"),
        (400, "INVALID_ARGUMENT", "proj-b"),
    ]
    assert (rows[0]["token"], rows[0]["tenant_id"], rows[0]["notification_id"]) == (
        dead,
        "t1",
        "n1",
    )


def test_google_auth_token_endpoint(sim: Sim, tmp_path: Path) -> None:
    sa = write_service_account_file(tmp_path / "sa.json", f"{sim.url}/token", "proj-c")
    info = json.loads(sa.read_text())
    assert info["type"] == "service_account" and info["project_id"] == "proj-c"
    assert info["private_key"].startswith("-----BEGIN PRIVATE KEY-----")
    creds = service_account.Credentials.from_service_account_file(
        str(sa), scopes=["https://www.googleapis.com/auth/firebase.messaging"]
    )
    creds.refresh(google.auth.transport.requests.Request())
    assert creds.token and creds.valid
    # google-auth keeps expiry as naive UTC
    lifetime = creds.expiry.replace(tzinfo=datetime.UTC).timestamp() - time.time()
    assert 3000 < lifetime <= 3600
    r = requests.post(
        f"{sim.url}/v1/projects/proj-c/messages:send",
        json={"message": {"token": new_token()}},
        headers={"Authorization": f"Bearer {creds.token}"},
        timeout=10,
    )
    assert r.status_code == 200


@pytest.mark.parametrize(
    ("form", "error"),
    [
        ({"grant_type": "client_credentials", "assertion": "a.b.c"}, "unsupported_grant_type"),
        (
            {"grant_type": "urn:ietf:params:oauth:grant-type:jwt-bearer", "assertion": "x"},
            "invalid_grant",
        ),
    ],
)
def test_token_endpoint_rejects_bad_grants(sim: Sim, form, error) -> None:
    r = httpx.post(f"{sim.url}/token", data=form, timeout=10)
    assert r.status_code == 400 and r.json()["error"] == error


# -- the HTTP v1 API directly (httpx, HTTP/2 and HTTP/1.1) --------------------------------------
def test_h2c_send_and_error_shapes(sim: Sim) -> None:
    token, dead = new_token(), new_token()
    with httpx.Client(http1=False, http2=True, headers=bearer(sim), timeout=20) as client:
        r = client.post(send_url(sim), json={"message": {"token": token, "data": {"a": "b"}}})
        assert r.http_version == "HTTP/2" and r.status_code == 200
        assert r.json()["name"].startswith("projects/proj-a/messages/0:")
        client.post(f"{sim.url}/_sim/tokens/unregistered", json={"tokens": [dead]})
        r = client.post(send_url(sim), json={"message": {"token": dead}})
    assert_google_error(r, 404, "NOT_FOUND", "UNREGISTERED")
    assert r.json() == {
        "error": {
            "code": 404,
            "message": "Requested entity was not found.",
            "status": "NOT_FOUND",
            "details": [{"@type": FCM_ERROR, "errorCode": "UNREGISTERED"}],
        }
    }


def test_every_row_records_the_priority_ttl_and_notification_as_sent(sim: Sim) -> None:
    """What push_attributes judges: Android's priority and ttl as written (else the APNs headers
    FCM forwards to an iOS device), and the notification's text; null when absent; on a 200
    and on a refusal alike."""
    token, since = new_token(), sim.next_seq()
    shown = {"title": "New activity", "body": "u1 like"}
    messages = [
        {"notification": shown, "android": {"priority": "HIGH", "ttl": "86400s"}},
        {"data": {"a": "b"}, "android": {"priority": "normal", "ttl": "0s"}},
        {"android": {"notification": {"body_loc_key": "NEW_LIKE"}}},
        {"notification": {}, "apns": {"headers": {"apns-push-type": "alert",
                                                  "apns-priority": "5", "apns-expiration": "0"}}},
        {"notification": shown, "android": {"priority": "high"}, "data": {"n": 1}},  # a 400
    ]  # fmt: skip
    with httpx.Client(http1=False, http2=True, headers=bearer(sim), timeout=20) as client:
        statuses = [
            client.post(send_url(sim), json={"message": {"token": token, **m}}).status_code
            for m in messages
        ]
    assert statuses == [200, 200, 200, 200, 400]
    rows = sim.ledger(since)
    assert [(r["push_type"], r["priority"], r["expiration"], r["text"]) for r in rows] == [
        (None, "HIGH", "86400s", "New activity\nu1 like"),
        (None, "normal", "0s", None),
        (None, None, None, "NEW_LIKE"),
        ("alert", "5", "0", ""),
        (None, "high", None, "New activity\nu1 like"),
    ]


@pytest.mark.parametrize(
    ("body", "error_code"),
    [
        (b'{"message": {"token": ""}}', "INVALID_ARGUMENT"),
        (b'{"message": {}}', "INVALID_ARGUMENT"),
        (b'{"message": {"notification": {"title": "x"}}}', "INVALID_ARGUMENT"),
        (b'{"message": {"token": "a", "topic": "b"}}', "INVALID_ARGUMENT"),
        (b'{"message": {"token": "bad token with spaces"}}', "INVALID_ARGUMENT"),
        (b"{not json", None),
        (b'{"message": {"token": "abc", "bogus": 1}}', None),
        (b'{"message": {"token": "abc", "data": {"n": 12}}}', None),
        (b"", None),
    ],
)
def test_invalid_argument(sim: Sim, body, error_code) -> None:
    since = sim.next_seq()
    with httpx.Client(http1=False, http2=True, headers=bearer(sim), timeout=20) as client:
        r = client.post(send_url(sim), content=body, headers={"content-type": "application/json"})
    assert_google_error(r, 400, "INVALID_ARGUMENT", error_code)
    [row] = sim.ledger(since)
    assert (row["status"], row["reason"], row["project"]) == (400, "INVALID_ARGUMENT", "proj-a")


def test_non_string_data_value_names_the_field(sim: Sim) -> None:
    r = httpx.post(
        send_url(sim), json={"message": {"token": "abc", "data": {"n": 12}}}, headers=bearer(sim)
    )
    details = r.json()["error"]["details"]
    assert details[0]["@type"] == "type.googleapis.com/google.rpc.BadRequest"
    assert details[0]["fieldViolations"][0]["field"] == "message.data[0].value"


def test_topic_and_validate_only(sim: Sim) -> None:
    since = sim.next_seq()
    with httpx.Client(headers=bearer(sim), timeout=20) as client:
        r = client.post(send_url(sim), json={"message": {"topic": "news"}})
        assert r.status_code == 200
        r = client.post(send_url(sim), json={"message": {"token": "abc"}, "validate_only": True})
        assert r.json() == {"name": "projects/proj-a/messages/fake_message_id"}
        r = client.post(
            send_url(sim), json={"message": {"token": "abc"}}, headers={"authorization": "Basic x"}
        )
        assert_google_error(r, 401, "UNAUTHENTICATED", None)
        r = client.get(send_url(sim))
        assert r.status_code == 405
    rows = sim.ledger(since)
    assert [(r["token"], r["status"], r["reason"]) for r in rows] == [
        ("/topics/news", 200, None),
        ("abc", 200, "VALIDATE_ONLY"),
        ("abc", 401, "UNAUTHENTICATED"),
        ("", 405, "METHOD_NOT_ALLOWED"),
    ]


def test_tls_h2(tls_sim: Sim, tmp_path: Path) -> None:
    token = new_token()
    since = tls_sim.next_seq()
    with httpx.Client(
        http2=True, verify=tls_sim.client_ssl(), headers=bearer(tls_sim), timeout=20
    ) as client:
        r = client.post(
            send_url(tls_sim, "proj-tls"),
            json={"message": {"token": token, "data": {"tenant_id": "t", "notification_id": "n"}}},
        )
        assert (r.http_version, r.status_code) == ("HTTP/2", 200)
        assert client.get(f"{tls_sim.url}/_sim/health").json() == {"ok": True, "provider": "fcm"}
    [row] = tls_sim.ledger(since)
    assert (row["token"], row["project"], row["tenant_id"], row["notification_id"]) == (
        token,
        "proj-tls",
        "t",
        "n",
    )


def test_pyfcm_over_tls(tls_sim: Sim, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # requests (pyfcm and google-auth both use it) trusts the simulator's CA via its env var
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tls_sim.ca))
    fcm = pyfcm_client(tls_sim, tmp_path, "proj-tls2")
    assert fcm.notify(fcm_token=new_token(), data_payload={"x": "y"})["name"].startswith(
        "projects/proj-tls2/messages/"
    )


# -- control API and process behaviour -------------------------------------------------------------
def test_ledger_reset_and_bad_control_input(tmp_path: Path) -> None:
    with run_sim(MODULE, tmp_path) as own:
        token = new_token()
        auth = bearer(own)
        with httpx.Client(
            http1=False, http2=True, base_url=own.url, headers=auth, timeout=20
        ) as client:
            for _ in range(2):
                client.post("/v1/projects/p/messages:send", json={"message": {"token": token}})
            assert client.get("/_sim/ledger?since=1").json()["next"] == 2
            assert (
                client.post("/_sim/tokens/unregistered", json={"tokens": [token]}).status_code
                == 200
            )
            r = client.post("/v1/projects/p/messages:send", json={"message": {"token": token}})
            assert r.status_code == 404
            assert client.post("/_sim/reset").json() == {"ok": True}
            assert client.get("/_sim/ledger").json() == {"rows": [], "next": 0}
            r = client.post("/v1/projects/p/messages:send", json={"message": {"token": token}})
            assert r.status_code == 200
            for bad in (b"[]", b'{"tokens": [""]}', b"x"):
                r = client.post("/_sim/tokens/unregistered", content=bad)
                assert r.status_code == 400 and "error" in r.json()
            assert client.get("/_sim/ledger?since=x").status_code == 400


def test_port_in_use_exits_2() -> None:
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


# -- the hot path's shortcuts keep Google's answers -------------------------------------------
@pytest.mark.parametrize(
    ("body", "text"),
    [
        ({"message": {"token": "t"}, "extra": 1}, 'Unknown name "extra": Cannot find field.'),
        ({"message": {"token": "t", "bogus": 1}}, "Unknown name \"bogus\" at 'message'"),
    ],
)
def test_unknown_field_named_in_the_error(body: dict, text: str) -> None:
    from emulators.providers.fcm import _Reject, _validate

    with pytest.raises(_Reject) as caught:
        _validate(body)
    assert caught.value.response.status == 400
    assert text in json.loads(caught.value.response.body)["error"]["message"]


def test_sent_answer_is_the_json_google_writes() -> None:
    from emulators.providers.fcm import _sent

    response = _sent('odd"project\u00e9')
    assert response.headers == {"content-type": "application/json"}
    name = json.loads(response.body)["name"]
    assert name.startswith('projects/odd"project\u00e9/messages/0:')
    assert response.body == json.dumps({"name": name}, separators=(",", ":")).encode()


def test_a_dead_token_revived_answers_again(sim: Sim, tmp_path: Path) -> None:
    """An app installed again: the token that answered UNREGISTERED is valid again once the
    harness revives it (SimulatorControl.revive, over HTTP), as pyfcm sees; bad bodies get a
    400 and revive nothing."""
    from harness.run.provider_control import SimulatorControl

    fcm = pyfcm_client(sim, tmp_path)
    token = new_token()
    control = SimulatorControl(sim.url)
    try:
        control.unregister([token])
        with pytest.raises(FCMNotRegisteredError):
            fcm.notify(fcm_token=token, notification_title="t")
        for bad in (b"[]", b'{"tokens": [""]}', b'{"tokens": "x"}', b"x"):
            r = control.http.post("/_sim/tokens/revived", content=bad)
            assert r.status_code == 400 and "error" in r.json()
        with pytest.raises(FCMNotRegisteredError):
            fcm.notify(fcm_token=token, notification_title="t")
        assert control.revive([token, new_token()]) == 1  # only the dead one counts
        assert "name" in fcm.notify(fcm_token=token, notification_title="t")
    finally:
        control.close()


def test_the_ledger_reads_ids_where_the_system_says_its_pushes_carry_them(tmp_path: Path) -> None:
    with run_sim(MODULE, tmp_path) as own:
        auth = bearer(own)
        with httpx.Client(
            http1=False, http2=True, base_url=own.url, headers=auth, timeout=20
        ) as client:
            send = "/v1/projects/p/messages:send"
            message = {"token": new_token(), "data": {"o": "acme", "nid": "n1"}}
            client.post(send, json={"message": message})
            assert client.get("/_sim/payload-ids").json() == {
                "tenant_id": "message.data.tenant_id",
                "notification_id": "message.data.notification_id",
            }
            paths = {"tenant_id": "message.data.o", "notification_id": "message.data.nid"}
            assert client.put("/_sim/payload-ids", json=paths).status_code == 200
            client.post(send, json={"message": message})
            rows = client.get("/_sim/ledger").json()["rows"]
    assert [(r["tenant_id"], r["notification_id"]) for r in rows] == [(None, None), ("acme", "n1")]


# -- strict like Google: credentials, limits, the switch ---------------------------------------------
class LocalFcm:
    """The simulator in this process on a real socket, with a clock the test moves (``now``):
    state in memory, or in a shared directory as the serving processes keep it."""

    def __init__(self, state_dir: Path | None) -> None:
        self.now = time.time()
        self.shared = SharedDir.create(state_dir) if state_dir is not None else None
        self.state = ProviderState(PROVIDER, shared=self.shared)
        self.sim = FcmSimulator(self.state, clock=lambda: self.now)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(
            start_server(self.sim.handle, "127.0.0.1", 0), self.loop
        ).result(10)
        self.port = server_port(self.server)
        self.url = f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.server.close)  # the loop's own thread, not this one
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.state.close()
        if self.shared is not None:
            self.shared.close()

    def client(self, token: str | None = None) -> httpx.Client:
        headers = {"authorization": f"Bearer {token}"} if token else None
        return httpx.Client(http1=False, http2=True, base_url=self.url, headers=headers, timeout=20)

    def ledger(self, since: int = 0) -> list[dict]:
        return httpx.get(f"{self.url}/_sim/ledger?since={since}", timeout=10).json()["rows"]

    def handle(self, token: str, body: dict) -> int:
        """A send straight to the handler (no socket): for the thousands a test needs first."""
        request = Request(
            "POST",
            "/v1/projects/p/messages:send",
            headers={"authorization": f"Bearer {token}"},
            body=json.dumps(body).encode(),
        )
        future = asyncio.run_coroutine_threadsafe(self.sim.handle(request), self.loop)
        return future.result(10).status


@pytest.fixture(params=["memory", "shared"])
def local(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LocalFcm]:
    server = LocalFcm(tmp_path / "state" if request.param == "shared" else None)
    try:
        yield server
    finally:
        server.close()


def error_info(reason: str) -> dict:
    return {
        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
        "reason": reason,
        "domain": "googleapis.com",
        "metadata": {
            "method": "google.firebase.fcm.v1.FcmService.SendMessage",
            "service": "fcm.googleapis.com",
        },
    }


def google_401(message: str, reason: str) -> dict:
    return {
        "error": {
            "code": 401,
            "message": message,
            "status": "UNAUTHENTICATED",
            "details": [error_info(reason)],
        }
    }


MISSING = (
    "Request is missing required authentication credential. Expected OAuth 2 access token, "
    "login cookie or other valid authentication credential. See "
    "https://developers.google.com/identity/sign-in/web/devconsole-project."
)
INVALID = (
    "Request had invalid authentication credentials. Expected OAuth 2 access token, login "
    "cookie or other valid authentication credential. See "
    "https://developers.google.com/identity/sign-in/web/devconsole-project."
)


def test_no_token_a_foreign_one_or_an_expired_one_gets_googles_401(local: LocalFcm) -> None:
    token = access_token(local.url)
    assert token.startswith("ya29.sim-")
    forged = token[:-1] + ("0" if token[-1] != "0" else "1")  # the same token, signed wrongly
    foreign = issue_access_token(b"another simulator's secret.....!", int(local.now) + 3600)
    body = {"message": {"token": new_token()}}
    since = len(local.ledger())
    with local.client() as client:

        def send(auth: str | None) -> httpx.Response:
            headers = {"authorization": auth} if auth is not None else {}
            return client.post("/v1/projects/p/messages:send", json=body, headers=headers)

        assert send(f"Bearer {token}").status_code == 200
        answers = {
            "none": send(None),
            "garbled": send("Bearer not-an-access-token"),
            "google's": send("Bearer ya29.a0AfB_byDgoogleissuedthis"),
            "forged": send(f"Bearer {forged}"),
            "foreign": send(f"Bearer {foreign}"),
        }
        local.now += 3599  # still valid one second before it ends
        assert send(f"Bearer {token}").status_code == 200
        local.now += 1
        answers["expired"] = send(f"Bearer {token}")
    assert {k: r.status_code for k, r in answers.items()} == dict.fromkeys(answers, 401)
    assert answers["none"].json() == google_401(MISSING, "CREDENTIALS_MISSING")
    assert answers["garbled"].json() == google_401(INVALID, "ACCESS_TOKEN_TYPE_UNSUPPORTED")
    for name in ("google's", "forged", "foreign", "expired"):
        assert answers[name].json() == google_401(INVALID, "ACCESS_TOKEN_EXPIRED"), name
    rows = local.ledger(since)
    assert [(r["status"], r["reason"], r["delivered"]) for r in rows] == [
        (200, None, True),
        *[(401, "UNAUTHENTICATED", False)] * 5,
        (200, None, True),
        (401, "UNAUTHENTICATED", False),
    ]


def test_google_auth_fetches_a_new_token_when_the_old_one_expired(
    local: LocalFcm, tmp_path: Path
) -> None:
    """google-auth's AuthorizedSession (firebase-admin's transport) with the service-account
    file: the simulator's 401 for an expired token makes it fetch a new one and send again."""
    sa = write_service_account_file(tmp_path / "sa.json", f"{local.url}/token", "proj-s")
    creds = service_account.Credentials.from_service_account_file(
        str(sa), scopes=["https://www.googleapis.com/auth/firebase.messaging"]
    )
    session = google.auth.transport.requests.AuthorizedSession(creds)
    url = f"{local.url}/v1/projects/proj-s/messages:send"
    body = {"message": {"token": new_token()}}
    assert session.post(url, json=body, timeout=10).status_code == 200
    first = creds.token
    local.now += 3601  # expired for the simulator; google-auth's own clock has not moved
    assert session.post(url, json=body, timeout=10).status_code == 200
    assert creds.token != first and local.sim.tokens_issued == 2
    rows = local.ledger()
    assert [(r["status"], r["reason"]) for r in rows] == [
        (200, None),
        (401, "UNAUTHENTICATED"),
        (200, None),
    ]


DEVICE_429 = {
    "code": 429,
    "message": "Device message rate exceeded.",
    "status": "RESOURCE_EXHAUSTED",
}


def device_429(limit: str) -> dict:
    return {
        "error": {
            **DEVICE_429,
            "details": [
                {"@type": FCM_ERROR, "errorCode": "QUOTA_EXCEEDED"},
                {
                    "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                    "violations": [
                        {
                            "subject": "device",
                            "description": f"Device message rate exceeded: more than {limit} "
                            "to one registration token.",
                        }
                    ],
                },
            ],
        }
    }


def test_the_241st_message_to_a_device_within_a_minute_is_refused(local: LocalFcm) -> None:
    token, device, other = access_token(local.url), new_token(), new_token()
    body = {"message": {"token": device, "data": {"tenant_id": "t"}}}
    with local.client(token) as client:
        send = functools.partial(client.post, "/v1/projects/p/messages:send")
        codes = [send(json=body).status_code for _ in range(240)]
        assert codes == [200] * 240
        refused = send(json=body)
        assert refused.status_code == 429
        assert refused.json() == device_429("240 messages per minute")
        assert "retry-after" not in refused.headers  # Google sends none
        assert send(json={"message": {"token": other}}).status_code == 200
        local.now += 59.9  # the device's minute started with its first message
        assert send(json=body).status_code == 429
        local.now += 0.1
        assert send(json=body).status_code == 200
    rows = local.ledger(238)
    assert [(r["token"], r["status"], r["reason"], r["delivered"]) for r in rows] == [
        (device, 200, None, True),
        (device, 200, None, True),
        (device, 429, "QUOTA_EXCEEDED", False),
        (other, 200, None, True),
        (device, 429, "QUOTA_EXCEEDED", False),
        (device, 200, None, True),
    ]


def test_the_5001st_message_to_a_device_within_an_hour_is_refused(local: LocalFcm) -> None:
    token, device = access_token(local.url), new_token()
    body = {"message": {"token": device}}
    start = local.now
    statuses = []
    for minute in range(21):  # 240 a minute (the most a minute allows), 4,999 in all
        local.now = start + 60 * minute
        statuses += [local.handle(token, body) for _ in range(min(240, 4999 - 240 * minute))]
    assert statuses == [200] * 4999
    local.now = start + 3000
    with local.client(access_token(local.url)) as client:  # the first token ends at +3600
        send = functools.partial(client.post, "/v1/projects/p/messages:send", json=body)
        assert send().status_code == 200  # the 5,000th
        refused = send()
        assert refused.json() == device_429("5000 messages per hour")
        local.now = start + 3599.9
        assert send().status_code == 429
        local.now = start + 3600  # the device's hour started with its first message
        assert send().status_code == 200
    rows = local.ledger(4999)
    assert [(r["status"], r["reason"]) for r in rows] == [
        (200, None),
        (429, "QUOTA_EXCEEDED"),
        (429, "QUOTA_EXCEEDED"),
        (200, None),
    ]


def test_collapsible_messages_come_in_a_burst_of_20_then_one_every_3_minutes(
    local: LocalFcm,
) -> None:
    """Google delays a collapsible message over the burst (it does not refuse it): answered
    200, its ledger row says COLLAPSIBLE_THROTTLED. Every platform's collapse key counts."""
    token, device, other = access_token(local.url), new_token(), new_token()
    android = {"android": {"collapse_key": "sync"}}
    apple = {"apns": {"headers": {"apns-collapse-id": "score"}}}
    web = {"webpush": {"headers": {"Topic": "news"}}}
    with local.client(token) as client:

        def send(extra: dict, to: str = device) -> int:
            body = {"message": {"token": to, **extra}}
            return client.post("/v1/projects/p/messages:send", json=body).status_code

        burst = [send(kind) for kind in [android, apple, web] * 6 + [android, apple]]
        assert burst == [200] * 20
        assert send(web) == 200  # the 21st: throttled, not refused
        assert send({}) == 200  # not collapsible: not throttled
        assert send(android, other) == 200  # another device has its own burst
        local.now += 179.9
        assert send(apple) == 200  # still throttled
        local.now += 0.1  # one more after 3 minutes
        assert send(android) == 200
        assert send(android) == 200  # and only one
    reasons = [(r["token"], r["reason"], r["delivered"]) for r in local.ledger()]
    assert reasons == [(device, None, True)] * 20 + [
        (device, "COLLAPSIBLE_THROTTLED", True),
        (device, None, True),
        (other, None, True),
        (device, "COLLAPSIBLE_THROTTLED", True),
        (device, None, True),
        (device, "COLLAPSIBLE_THROTTLED", True),
    ]


def project_429(project: str, limit: int) -> dict:
    number = project_number(project)
    return {
        "error": {
            "code": 429,
            "message": "Quota exceeded for quota metric 'Send requests' and limit 'Send requests "
            "per minute' of service 'fcm.googleapis.com' for consumer "
            f"'project_number:{number}'.",
            "status": "RESOURCE_EXHAUSTED",
            "details": [
                {
                    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "reason": "RATE_LIMIT_EXCEEDED",
                    "domain": "googleapis.com",
                    "metadata": {
                        "quota_limit_value": str(limit),
                        "consumer": f"projects/{number}",
                        "quota_metric": "fcm.googleapis.com/send_requests",
                        "quota_unit": "1/min/{project}",
                        "service": "fcm.googleapis.com",
                        "quota_location": "global",
                        "quota_limit": "SendsPerMinutePerProject",
                    },
                },
                {
                    "@type": "type.googleapis.com/google.rpc.Help",
                    "links": [
                        {
                            "description": "Request a higher quota limit.",
                            "url": "https://cloud.google.com/docs/quotas/help/request_increase",
                        }
                    ],
                },
            ],
        }
    }


def test_the_project_quota_scales_and_refuses_as_google_does(local: LocalFcm) -> None:
    token = access_token(local.url)
    with local.client(token) as client:
        assert client.get("/_sim/project-quota").json() == {"per_minute": 600_000}
        assert client.put("/_sim/project-quota", json={"per_minute": 3}).json() == {"per_minute": 3}
        assert client.get("/_sim/project-quota").json() == {"per_minute": 3}

        def send(project: str = "pq", message: object = None, **kw: object) -> httpx.Response:
            body = {"message": message or {"token": new_token()}}
            return client.post(f"/v1/projects/{project}/messages:send", json=body, **kw)

        assert send().status_code == 200
        assert send(message={"token": ""}).status_code == 400  # a client error counts too
        assert send(headers={"authorization": ""}).status_code == 401  # no project to charge
        assert send().status_code == 200
        refused = send()
        assert refused.status_code == 429 and "retry-after" not in refused.headers
        assert refused.json() == project_429("pq", 3)
        assert send(message={"token": ""}).status_code == 429  # before the body is read
        assert send("other").status_code == 200  # its own quota
        local.now += 59.9
        assert send().status_code == 429
        local.now += 0.1  # the project's minute started with its first message
        assert send().status_code == 200
        rows = local.ledger()
        assert client.post("/_sim/reset").status_code == 200
        assert client.get("/_sim/project-quota").json() == {"per_minute": 600_000}
        for bad in (b"[]", b"x", b"", b'{"per_minute": -1}', b'{"per_minute": "3"}',
                    b'{"per_minute": true}', b'{"per_minute": 3, "x": 1}'):  # fmt: skip
            r = client.put("/_sim/project-quota", content=bad)
            assert r.status_code == 400 and "per_minute" in r.json()["error"], bad
        assert client.post("/_sim/project-quota", json={"per_minute": 3}).status_code == 405
    assert [(r["project"], r["status"], r["reason"]) for r in rows] == [
        ("pq", 200, None),
        ("pq", 400, "INVALID_ARGUMENT"),
        ("pq", 401, "UNAUTHENTICATED"),
        ("pq", 200, None),
        ("pq", 429, "RESOURCE_EXHAUSTED"),  # Google sends no FcmError here: the status
        ("pq", 429, "RESOURCE_EXHAUSTED"),
        ("other", 200, None),
        ("pq", 429, "RESOURCE_EXHAUSTED"),
        ("pq", 200, None),
    ]


def test_strict_off_lets_a_tokenless_send_through_until_a_reset(sim: Sim) -> None:
    body = {"message": {"token": new_token()}}
    try:
        with httpx.Client(http1=False, http2=True, base_url=sim.url, timeout=20) as client:
            send = functools.partial(client.post, "/v1/projects/p-off/messages:send", json=body)
            assert client.get("/_sim/strict").json() == {"enabled": True}
            assert send().status_code == 401
            r = client.put("/_sim/strict", json={"enabled": False})
            assert (r.status_code, r.json()) == (200, {"enabled": False})
            assert client.get("/_sim/strict").json() == {"enabled": False}
            assert send().status_code == 200
            assert send(headers={"authorization": "Bearer whatever"}).status_code == 200
            assert send(headers={"authorization": "Basic x"}).status_code == 401  # as ever
            client.put("/_sim/project-quota", json={"per_minute": 1})
            assert [send().status_code for _ in range(3)] == [200] * 3  # no quota either
            assert client.post("/_sim/reset").json() == {"ok": True}
            assert client.get("/_sim/strict").json() == {"enabled": True}
            assert send().status_code == 401
            for bad in (b"[]", b"x", b"", b'{"enabled": "no"}', b'{"enabled": 0}',
                        b'{"enabled": false, "x": 1}', b"{}"):  # fmt: skip
                r = client.put("/_sim/strict", content=bad)
                assert r.status_code == 400 and "enabled" in r.json()["error"], bad
            assert client.get("/_sim/strict").json() == {"enabled": True}
            assert client.delete("/_sim/strict").status_code == 405
    finally:
        sim.reset()


@contextmanager
def start_fcm(tmp_path: Path, *args: str) -> Iterator[Sim]:
    """The simulator's command line with options of its own (run_sim passes none)."""
    port = free_port()
    cmd = [sys.executable, "-m", MODULE, "--port", str(port), "--server", "h2", *args]
    with open(tmp_path / "fcm.stderr", "w") as stderr:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=stderr, text=True)
        try:
            line = read_line(proc, 30)
            assert line.strip() == f"fcm simulator listening on http://127.0.0.1:{port}", line
            sim = Sim(proc, port, f"http://127.0.0.1:{port}", None)
            wait_healthy(sim, 30)
            yield sim
        finally:
            stop(proc)


def test_the_command_line_starts_every_process_lenient_with_its_quota(tmp_path: Path) -> None:
    """--lenient and --project-quota-per-minute reach both serving processes, and what one
    process is told (strict on, a reset) holds in the other from the next request on."""
    args = ["--processes", "2", "--lenient", "--project-quota-per-minute", "2"]
    with start_fcm(tmp_path, *args, "--state-dir", str(tmp_path / "state")) as sim:
        token = access_token(sim.url)

        def fresh(auth: bool = False) -> httpx.Client:  # a new connection: either process
            headers = {"authorization": f"Bearer {token}"} if auth else None
            return httpx.Client(
                http1=False, http2=True, base_url=sim.url, headers=headers, timeout=20
            )

        def send(project: str, auth: bool = False) -> int:
            with fresh(auth) as client:
                body = {"message": {"token": new_token()}}
                r = client.post(f"/v1/projects/{project}/messages:send", json=body)
                return r.status_code

        for _ in range(4):
            with fresh() as client:
                assert client.get("/_sim/strict").json() == {"enabled": False}
                assert client.get("/_sim/project-quota").json() == {"per_minute": 2}
        assert [send("a") for _ in range(4)] == [200] * 4  # lenient: no token, no quota
        with fresh() as client:
            assert client.put("/_sim/strict", json={"enabled": True}).status_code == 200
        assert [send("b") for _ in range(4)] == [401] * 4
        assert [send("c", auth=True) for _ in range(4)] == [200, 200, 429, 429]
        with fresh() as client:
            assert client.post("/_sim/reset").status_code == 200
        assert [send("d") for _ in range(4)] == [200] * 4  # lenient again, as it started


def test_tokens_and_device_limits_hold_across_processes(tmp_path: Path) -> None:
    """A token one process issued is good in the other; one device's 241st message in a
    minute is refused whichever process counts it."""
    with run_sim(MODULE, tmp_path, processes=2, server="h2") as own:
        auth = bearer(own)
        device = new_token()
        clients = [
            httpx.Client(http1=False, http2=True, base_url=own.url, headers=auth, timeout=20)
            for _ in range(8)
        ]
        try:
            codes = [
                clients[n % 8]
                .post("/v1/projects/p/messages:send", json={"message": {"token": device}})
                .status_code
                for n in range(242)
            ]
        finally:
            for client in clients:
                client.close()
    assert codes == [200] * 240 + [429] * 2


@pytest.mark.parametrize("server", ["h2", "granian"])
def test_a_connection_allows_100_concurrent_streams(tmp_path: Path, server: str) -> None:
    """As fcm.googleapis.com advertises, from the connection's first SETTINGS frame on, on
    either server; a stream over the 100 is refused alone (REFUSED_STREAM, no GOAWAY), and
    the streams within it are answered."""
    with run_sim(MODULE, tmp_path, server=server, processes=1) as own:
        auth = own.fcm_headers()
        with H2Probe(own.port) as probe:
            # all opened before the server's SETTINGS are read, their bodies held back: the
            # 101st is over the limit however fast the server is
            sids = [
                probe.open_stream("/v1/projects/p/messages:send", auth, end=False)
                for _ in range(MAX_CONCURRENT_STREAMS + 1)
            ]
            refused = probe.reset(sids[-1])
            for sid in sids[:-1]:
                probe.finish(sid, json.dumps({"message": {"token": new_token()}}).encode())
            statuses = [probe.answer(sid) for sid in sids[:-1]]
            assert (probe.max_streams_seen, probe.terminated()) == ([100], False)
    assert refused.error_code == h2.errors.ErrorCodes.REFUSED_STREAM
    assert statuses == [200] * MAX_CONCURRENT_STREAMS
