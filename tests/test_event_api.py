"""The Event API over HTTP: what it accepts, and clear 4xx answers for what it refuses."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import redis
from ulid import ULID

from emulators.ports import LOOPBACK, free_port
from harness.stack.supervisor import wait_until
from reference_impl.dedup_key import dedup_key
from reference_impl.ids import device_id, preferences_cache_key
from reference_impl.user_record import devices_of

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def api(stack):
    with httpx.Client(base_url=stack.info.url("event-api"), timeout=10) as client:
        yield client


def test_accepts_an_event_with_a_ulid(api):
    response = api.post(
        "/v1/events", json={"tenant_id": "t1", "author_id": "a1", "kind": "like", "object_id": "o"}
    )
    assert response.status_code == 202
    ULID.from_str(response.json()["notification_id"])


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"author_id": "a", "kind": "post", "object_id": "o"}, "missing field(s): tenant_id"),
        ({"tenant_id": "t", "author_id": "a", "kind": "shout", "object_id": "o"}, "kind must be"),
        (
            {"tenant_id": "t#x", "author_id": "a", "kind": "post", "object_id": "o"},
            "tenant_id must be",
        ),
        ([1, 2], "JSON object"),
    ],
)
def test_bad_events_get_400_with_a_reason(api, body, reason):
    response = api.post("/v1/events", json=body)
    assert response.status_code == 400
    assert reason in response.json()["error"]


def test_invalid_json_is_400(api):
    response = api.post(
        "/v1/events", content=b"{oops", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    assert "not valid JSON" in response.json()["error"]


@pytest.mark.parametrize(
    ("prefs", "reason"),
    [
        ({"zone": "Mars/Olympus"}, "unknown time zone"),
        ({"zone": "UTC", "quiet_hours": {"start": "25:00", "end": "07:00"}}, "quiet_hours"),
        ({"zone": "UTC", "push_consent": {"granted_at": "2026-01-01"}}, "push_consent"),
        ({"zone": "UTC", "channels": {"pigeon": True}}, "channels"),
    ],
)
def test_bad_preferences_get_400(api, prefs, reason):
    response = api.put("/v1/tenants/t1/users/u1/preferences", json=prefs)
    assert response.status_code == 400
    assert reason in response.json()["error"]


def test_devices_need_a_known_platform(api):
    assert (
        api.put("/v1/tenants/t1/users/u1/devices/abc", json={"platform": "bb10"}).status_code == 400
    )
    assert (
        api.put("/v1/tenants/t1/users/u1/devices/abc", json={"platform": "fcm"}).status_code == 200
    )


def test_unknown_route_and_wrong_method(api):
    assert api.get("/v1/nothing").status_code == 404
    assert api.get("/v1/events").status_code == 405


def test_openapi_document_lists_the_routes(api):
    spec = api.get("/openapi.json").json()
    assert spec["openapi"].startswith("3.")
    assert "/v1/events" in spec["paths"]
    assert "/v1/tenants/{tenant_id}/users/{user_id}/preferences" in spec["paths"]
    assert "/v1/tenants/{tenant_id}/users:batch" in spec["paths"]


def test_a_client_event_id_becomes_the_notification_id_in_any_tenant(api):
    event_id = str(ULID())
    for tenant in ("t1", "t2"):
        response = api.post(
            "/v1/events",
            json={
                "tenant_id": tenant,
                "author_id": "a",
                "kind": "post",
                "object_id": "o",
                "event_id": event_id,
            },
        )
        assert response.status_code == 202
        assert response.json()["notification_id"] == event_id
    bad = api.post(
        "/v1/events",
        json={
            "tenant_id": "t1",
            "author_id": "a",
            "kind": "post",
            "object_id": "o",
            "event_id": "nope",
        },
    )
    assert bad.status_code == 400 and "event_id must be a ULID" in bad.json()["error"]


def test_bulk_users_store_preferences_and_devices_in_one_call(api, stack):
    users = [
        {
            "user_id": f"bulk{i}",
            "preferences": {"zone": "Asia/Kolkata", "push_consent": None},
            "devices": [{"token": f"tok-bulk-{i}", "platform": "fcm" if i % 2 else "apns"}],
        }
        for i in range(60)
    ]
    response = api.post("/v1/tenants/tb/users:batch", json={"users": users})
    assert response.status_code == 200, response.text
    assert response.json()["preferences"] == 60 and response.json()["devices"] == 60
    ddb = stack.info.aws_client("dynamodb")
    config = stack.reference_config()
    assert _devices_of(ddb, config, "tb", "bulk7") == ["tok-bulk-7"]
    prefs = ddb.get_item(TableName=config.table("preferences"), Key={"pk": {"S": "tb#bulk59"}})
    assert "Asia/Kolkata" in prefs["Item"]["prefs"]["S"]


def test_preferences_and_devices_share_one_record_and_each_change_keeps_the_other(api, stack):
    base = "/v1/tenants/tr/users/both"
    api.put(f"{base}/devices/tok-one", json={"platform": "apns"}).raise_for_status()
    api.put(f"{base}/preferences", json={"zone": "Europe/Paris"}).raise_for_status()
    api.put(f"{base}/devices/tok-two", json={"platform": "fcm"}).raise_for_status()
    api.put(f"{base}/preferences", json={"zone": "Asia/Tokyo"}).raise_for_status()
    ddb = stack.info.aws_client("dynamodb")
    config = stack.reference_config()
    assert sorted(_devices_of(ddb, config, "tr", "both")) == ["tok-one", "tok-two"]
    item = ddb.get_item(TableName=config.table("preferences"), Key={"pk": {"S": "tr#both"}})
    assert json.loads(item["Item"]["prefs"]["S"])["zone"] == "Asia/Tokyo"
    # A bulk entry replaces the user's whole record.
    users = [{"user_id": "both", "devices": [{"token": "tok-three", "platform": "apns"}]}]
    api.post("/v1/tenants/tr/users:batch", json={"users": users}).raise_for_status()
    assert _devices_of(ddb, config, "tr", "both") == ["tok-three"]
    item = ddb.get_item(TableName=config.table("preferences"), Key={"pk": {"S": "tr#both"}})
    assert "prefs" not in item["Item"]


def test_bulk_users_refuse_the_whole_call_for_one_bad_entry(api, stack):
    users = [
        {"user_id": "fine1", "preferences": {"zone": "UTC"}},
        {"user_id": "fine2", "devices": [{"token": "t", "platform": "pager"}]},
    ]
    response = api.post("/v1/tenants/tb2/users:batch", json={"users": users})
    assert response.status_code == 400
    assert "users[1]: platform must be apns or fcm" in response.json()["error"]
    # Validated before anything is stored: the good entry was not written either.
    ddb = stack.info.aws_client("dynamodb")
    table = stack.reference_config().table("preferences")
    assert "Item" not in ddb.get_item(TableName=table, Key={"pk": {"S": "tb2#fine1"}})
    too_many = api.post("/v1/tenants/tb2/users:batch", json={"users": [{"user_id": "u"}] * 501})
    assert too_many.status_code == 400 and "at most 500" in too_many.json()["error"]


def _devices_of(ddb, config, tenant: str, user: str) -> list[str]:
    item = ddb.get_item(
        TableName=config.table("preferences"), Key={"pk": {"S": f"{tenant}#{user}"}}
    ).get("Item")
    return [d["token"] for d in devices_of(item)]


def test_erasure_purges_everything_the_user_left_behind(api, stack):
    """GDPR erasure after a real delivery: inbox rows, read state, preferences, devices,
    follow edges, cache entries and the dedup keys of the pushes are all gone."""
    tenant, user, author = "tg", "erase-me", "tg-author"
    token = "a" * 64
    prefs = {
        "zone": "UTC",
        "push_consent": {"granted_at": "2026-01-01T00:00:00Z", "version": "v1"},
    }
    api.put(f"/v1/tenants/{tenant}/users/{user}/preferences", json=prefs).raise_for_status()
    api.put(
        f"/v1/tenants/{tenant}/users/{user}/devices/{token}", json={"platform": "apns"}
    ).raise_for_status()
    api.post(
        f"/v1/tenants/{tenant}/users/{author}/followers:batch", json={"followers": [user]}
    ).raise_for_status()
    nid = api.post(
        "/v1/events",
        json={"tenant_id": tenant, "author_id": author, "kind": "post", "object_id": "p1"},
    ).json()["notification_id"]
    config = stack.reference_config()
    key = dedup_key(tenant, nid, f"{user}#{device_id(token)}")
    r = redis.Redis.from_url(stack.info.parts["redis"].url)
    inbox = f"/v1/tenants/{tenant}/users/{user}/inbox"
    wait_until(lambda: r.get(key) == b"sent", 30, "the push to be sent and marked")
    api.post(f"/v1/tenants/{tenant}/users/{user}/inbox/{nid}/read").raise_for_status()
    assert [i["notification_id"] for i in api.get(inbox).json()["items"]] == [nid]

    response = api.delete(f"/v1/tenants/{tenant}/users/{user}")
    assert response.status_code == 200, response.text
    removed = response.json()["removed"]
    assert removed["dedup_keys"] == 1 and removed["devices"] == 1 and removed["inbox_rows"] == 1
    assert removed["follows"] == 1 and removed["reads_rows"] == 1
    assert r.get(key) is None
    assert r.get(preferences_cache_key(tenant, user)) is None
    assert api.get(inbox).json()["items"] == []
    ddb = stack.info.aws_client("dynamodb")
    pk = {"pk": {"S": f"{tenant}#{user}"}}
    assert "Item" not in ddb.get_item(TableName=config.table("preferences"), Key=pk)
    assert _devices_of(ddb, config, tenant, user) == []
    followers = ddb.query(
        TableName=config.table("followers"),
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": f"{tenant}#{author}"}},
    )["Items"]
    assert followers == []
    # Erasing again is harmless: nothing left, nothing reported.
    again = api.delete(f"/v1/tenants/{tenant}/users/{user}").json()["removed"]
    assert again["dedup_keys"] == 0 and again["devices"] == 0


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def test_several_processes_serve_one_port_and_stop_with_the_first(tmp_path):
    """``event_api_processes``: the first process forks the others onto its socket; a SIGTERM
    to it alone (not its group) stops every one of them."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"event_api_processes": 3}))
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "reference_impl.event_api", "--config", str(config)]
        + ["--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        url = f"http://{LOOPBACK}:{port}"

        def healthy() -> bool:
            try:
                return httpx.get(f"{url}/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(healthy, 20, "the event api to answer")
        wait_until(lambda: len(_children(proc.pid)) == 2, 10, "two forked processes")
        children = _children(proc.pid)
        with httpx.Client(base_url=url, timeout=5) as http:
            assert all(http.get("/health").status_code == 200 for _ in range(20))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
        wait_until(
            lambda: not any(Path(f"/proc/{c}").exists() for c in children),
            10,
            "the forked processes to stop",
        )
        assert b"(3 process(es))" in proc.stdout.read()
    finally:
        # The whole session: a child outliving a failed first process goes too.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def test_a_process_count_below_one_is_a_config_error(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"event_api_processes": 0}))
    done = subprocess.run(
        [sys.executable, "-m", "reference_impl.event_api", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2 and "event_api_processes must be an integer >= 1" in done.stderr


def test_follower_calls_take_ten_pages_at_most(api):
    too_many = [f"f{i}" for i in range(10_001)]
    response = api.post("/v1/tenants/tf/users/a/followers:batch", json={"followers": too_many})
    assert response.status_code == 400
    assert "at most 10000 followers per call" in response.json()["error"]
