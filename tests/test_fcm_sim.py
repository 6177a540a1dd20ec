"""The FCM HTTP v1 simulator as a real server on a real socket, driven by real clients."""

from __future__ import annotations

import base64
import datetime
import json
import socket
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import google.auth.transport.requests
import httpx
import pytest
import requests
from google.oauth2 import service_account
from pyfcm import FCMNotification
from pyfcm.errors import FCMNotRegisteredError, InvalidDataError
from sim_process import REPO, Sim, run_sim

from emulators.providers.fcm import JWT_BEARER_GRANT, write_service_account_file

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
    verify = sim.client_ssl() if sim.cert_dir is not None else True
    return {"authorization": f"Bearer {access_token(sim.url, verify)}"}


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
