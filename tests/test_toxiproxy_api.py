"""Toxiproxy 2.x API conformance of ``python -m chaos.toxiproxy``: routes, status codes, JSON
shapes and error messages (ported from Toxiproxy's ``api_test.go``), driven with raw HTTP
(httpx), with the PyPI client ``toxiproxy-python`` unchanged, and with our typed client."""

from __future__ import annotations

import select
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from toxiproxy import Toxiproxy
from toxiproxy.api import APIConsumer
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists

from chaos.toxiproxy.api import VERSION
from chaos.toxiproxy.client import AlreadyExists, BadRequest, ToxiproxyClient
from chaos.toxiproxy.client import NotFound as ClientNotFound
from emulators.ports import LOOPBACK, free_port
from harness.stack.supervisor import stop_process, wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
UPSTREAM = "localhost:20001"  # never dialled: no client connects in these tests


def spawn_toxiproxy(*extra: str, port: int = 0) -> tuple[subprocess.Popen[str], int]:
    """``python -m chaos.toxiproxy`` on a free port; (process, API port) once it is ready."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "chaos.toxiproxy", "--host", LOOPBACK, "--port", str(port), *extra],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 20)
    line = proc.stdout.readline() if ready else ""
    if not line.startswith("toxiproxy listening on http://"):
        stop_process(proc)  # type: ignore[arg-type]
        raise RuntimeError(f"toxiproxy did not start: {line!r}")
    return proc, int(line.strip().rsplit(":", 1)[1])


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    proc, port = spawn_toxiproxy("--seed", "1")
    Toxiproxy().update_api_consumer(LOOPBACK, port)
    try:
        yield f"http://{LOOPBACK}:{port}"
    finally:
        stop_process(proc)  # type: ignore[arg-type]


@pytest.fixture
def http(server: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server, timeout=10) as client:
        yield client
        for name in client.get("/proxies").json():
            client.delete(f"/proxies/{name}")


def listening(listen: str) -> bool:
    host, port = listen.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
    except OSError:
        return False
    return True


def create(http: httpx.Client, name: str = "mysql_master", **fields: object) -> httpx.Response:
    body = {"name": name, "listen": f"localhost:{free_port()}", "upstream": UPSTREAM, **fields}
    return http.post("/proxies", json=body)


# -- server -----------------------------------------------------------------------------------------


def test_version(http: httpx.Client) -> None:
    response = http.get("/version")
    assert response.status_code == 200
    assert response.content == f'{{"version": "{VERSION}"}}\n'.encode()
    assert response.headers["content-type"].startswith("application/json")
    assert response.headers["x-toxiproxy-request-id"]


def test_browser_user_agent_gets_403(http: httpx.Client) -> None:
    browser = {"user-agent": "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36"}
    assert http.get("/proxies", headers=browser).status_code == 403
    assert http.get("/proxies", headers={"user-agent": "Wget/2.1"}).status_code == 200


def test_unknown_route_and_method(http: httpx.Client) -> None:
    assert http.get("/nope").status_code == 404
    assert http.get("/proxies/").status_code == 404
    assert http.put("/proxies").status_code == 405
    assert http.delete("/version").status_code == 405


# -- proxies ----------------------------------------------------------------------------------------


def test_index_with_no_proxies(http: httpx.Client) -> None:
    response = http.get("/proxies")
    assert response.status_code == 200
    assert response.json() == {}


def test_create_shows_real_listen_address(http: httpx.Client) -> None:
    port = free_port()
    response = http.post(
        "/proxies",
        json={"name": "mysql_master", "listen": f"localhost:{port}", "upstream": UPSTREAM},
    )
    assert response.status_code == 201
    assert response.json() == {
        "name": "mysql_master",
        "listen": f"127.0.0.1:{port}",
        "upstream": UPSTREAM,
        "enabled": True,
        "toxics": [],
    }
    assert http.get("/proxies/mysql_master").json() == response.json()
    assert http.get("/proxies").json() == {"mysql_master": response.json()}
    assert listening(f"127.0.0.1:{port}")


def test_create_on_port_zero_picks_a_port(http: httpx.Client) -> None:
    proxy = http.post("/proxies", json={"name": "p", "listen": "localhost:0", "upstream": UPSTREAM})
    listen = proxy.json()["listen"]
    assert listen.startswith("127.0.0.1:") and int(listen.rsplit(":", 1)[1]) > 0
    assert listening(listen)


def test_create_disabled_then_enable_and_disable(http: httpx.Client) -> None:
    port = free_port()
    created = create(http, listen=f"localhost:{port}", enabled=False).json()
    assert created["listen"] == f"localhost:{port}" and created["enabled"] is False
    assert not listening(f"127.0.0.1:{port}")

    enabled = http.patch("/proxies/mysql_master", json={"enabled": True})
    assert enabled.status_code == 200
    assert enabled.json()["enabled"] is True and enabled.json()["listen"] == f"127.0.0.1:{port}"
    assert listening(f"127.0.0.1:{port}")

    disabled = http.post("/proxies/mysql_master", json={"enabled": False})  # deprecated POST
    assert disabled.status_code == 200 and disabled.json()["enabled"] is False
    assert not listening(f"127.0.0.1:{port}")


def test_update_changes_listen_and_upstream(http: httpx.Client) -> None:
    create(http)
    port = free_port()
    updated = http.patch(
        "/proxies/mysql_master", json={"listen": f"127.0.0.1:{port}", "upstream": "localhost:9"}
    )
    assert updated.status_code == 200
    assert updated.json()["listen"] == f"127.0.0.1:{port}"
    assert updated.json()["upstream"] == "localhost:9"
    assert updated.json()["enabled"] is True
    assert listening(f"127.0.0.1:{port}")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "missing required field: name"),
        ({"name": ""}, "missing required field: name"),
        ({"name": "test"}, "missing required field: upstream"),
        ({"name": 5, "upstream": UPSTREAM}, None),
        ([1, 2], None),
    ],
)
def test_create_bad_input_is_400(http: httpx.Client, body: object, message: str | None) -> None:
    response = http.post("/proxies", json=body)
    assert response.status_code == 400
    error = response.json()
    assert error["status"] == 400
    if message is None:
        assert error["error"].startswith("bad request body: ")
    else:
        assert error == {"error": message, "status": 400}


def test_create_with_unparsable_or_empty_body_is_400(http: httpx.Client) -> None:
    bad = http.post("/proxies", content=b"{not json")
    assert bad.status_code == 400 and bad.json()["error"].startswith("bad request body: ")
    empty = http.post("/proxies", content=b"")
    assert empty.json() == {"error": "bad request body: EOF", "status": 400}


def test_create_name_conflict_is_409(http: httpx.Client) -> None:
    assert create(http).status_code == 201
    again = create(http)
    assert again.status_code == 409
    assert again.json() == {"error": "proxy already exists", "status": 409}
    assert http.delete("/proxies/mysql_master").status_code == 204
    assert create(http).status_code == 201


def test_create_port_conflict_is_500(http: httpx.Client) -> None:
    port = free_port()
    assert create(http, listen=f"localhost:{port}").status_code == 201
    conflict = create(http, "test", listen=f"localhost:{port}")
    assert conflict.status_code == 500
    assert conflict.json() == {
        "error": f"listen tcp 127.0.0.1:{port}: bind: address already in use",
        "status": 500,
    }
    assert "test" not in http.get("/proxies").json()


def test_delete_proxy_closes_listener_then_404(http: httpx.Client) -> None:
    listen = create(http).json()["listen"]
    assert listening(listen)
    response = http.delete("/proxies/mysql_master")
    assert response.status_code == 204 and response.content == b""
    assert not listening(listen)
    assert http.get("/proxies").json() == {}
    again = http.delete("/proxies/mysql_master")
    assert again.status_code == 404
    assert again.json() == {"error": "proxy not found", "status": 404}


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/proxies/nope"),
        ("PATCH", "/proxies/nope"),
        ("POST", "/proxies/nope"),
        ("DELETE", "/proxies/nope"),
        ("GET", "/proxies/nope/toxics"),
        ("POST", "/proxies/nope/toxics"),
        ("GET", "/proxies/nope/toxics/latency_downstream"),
        ("DELETE", "/proxies/nope/toxics/latency_downstream"),
    ],
)
def test_missing_proxy_is_404(http: httpx.Client, method: str, path: str) -> None:
    response = http.request(method, path, json={"enabled": True})
    assert response.status_code == 404
    assert response.json() == {"error": "proxy not found", "status": 404}


# -- toxics -----------------------------------------------------------------------------------------


def test_add_toxic_shape_and_defaults(http: httpx.Client) -> None:
    create(http)
    response = http.post("/proxies/mysql_master/toxics", json={"type": "latency"})
    assert response.status_code == 200
    assert response.json() == {
        "attributes": {"latency": 0, "jitter": 0},
        "name": "latency_downstream",
        "type": "latency",
        "stream": "downstream",
        "toxicity": 1,
    }
    proxy = http.get("/proxies/mysql_master").json()
    assert proxy["toxics"] == [response.json()]


def test_add_toxic_with_attributes_and_toxicity(http: httpx.Client) -> None:
    create(http)
    body = {
        "name": "foobar",
        "type": "latency",
        "stream": "upstream",
        "toxicity": 0.2,
        "attributes": {"latency": 100, "jitter": 10},
    }
    toxic = http.post("/proxies/mysql_master/toxics", json=body).json()
    assert toxic == {**body, "attributes": {"latency": 100, "jitter": 10}}
    assert http.get("/proxies/mysql_master/toxics/foobar").json() == toxic


def test_every_toxic_type_and_its_attributes(http: httpx.Client) -> None:
    create(http)
    expected = {
        "noop": {},
        "latency": {"latency": 0, "jitter": 0},
        "bandwidth": {"rate": 0},
        "slow_close": {"delay": 0},
        "timeout": {"timeout": 0},
        "reset_peer": {"timeout": 0},
        "slicer": {"average_size": 0, "size_variation": 0, "delay": 0},
        "limit_data": {"bytes": 0},
    }
    for toxic_type, attributes in expected.items():
        toxic = http.post("/proxies/mysql_master/toxics", json={"type": toxic_type}).json()
        assert toxic["attributes"] == attributes, toxic_type


def test_toxic_list_upstream_first(http: httpx.Client) -> None:
    create(http)
    for name, stream in (("d1", "downstream"), ("u1", "upstream"), ("d2", "downstream")):
        body = {"name": name, "type": "noop", "stream": stream}
        assert http.post("/proxies/mysql_master/toxics", json=body).status_code == 200
    names = [t["name"] for t in http.get("/proxies/mysql_master/toxics").json()]
    assert names == ["u1", "d1", "d2"]


def test_conflicting_toxic_names_are_409_across_streams(http: httpx.Client) -> None:
    create(http)
    first = {"name": "foobar", "type": "latency", "stream": "upstream"}
    assert http.post("/proxies/mysql_master/toxics", json=first).status_code == 200
    for body in (
        {"name": "foobar", "type": "slow_close", "stream": "upstream"},
        {"name": "foobar", "type": "latency", "stream": "downstream"},
    ):
        response = http.post("/proxies/mysql_master/toxics", json=body)
        assert response.status_code == 409
        assert response.json() == {"error": "toxic already exists", "status": 409}
    # default names include the stream, so the same type on both streams does not conflict
    for stream in ("upstream", "downstream"):
        body = {"type": "latency", "stream": stream}
        assert http.post("/proxies/mysql_master/toxics", json=body).status_code == 200
    names = {t["name"] for t in http.get("/proxies/mysql_master/toxics").json()}
    assert names == {"foobar", "latency_upstream", "latency_downstream"}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            {"type": "latency", "stream": "walrustream"},
            "stream was invalid, can be either upstream or downstream",
        ),
        (
            {"type": "latency", "stream": ""},
            "stream was invalid, can be either upstream or downstream",
        ),
        ({"type": "unicorn"}, "invalid toxic type"),
        ({}, "invalid toxic type"),
        ({"type": "latency", "attributes": {"latency": "100"}}, None),
        ({"type": "latency", "attributes": {"latency": 1.5}}, None),
        ({"type": "latency", "attributes": {"latency": -1}}, None),
        ({"type": "latency", "attributes": [1]}, None),
        ({"type": "latency", "toxicity": "high"}, None),
    ],
)
def test_bad_toxic_is_400(http: httpx.Client, body: dict[str, object], message: str | None) -> None:
    create(http)
    response = http.post("/proxies/mysql_master/toxics", json=body)
    assert response.status_code == 400
    if message is None:
        assert response.json()["error"].startswith("bad request body: ")
    else:
        assert response.json() == {"error": message, "status": 400}
    assert http.get("/proxies/mysql_master/toxics").json() == []


def test_update_toxic_merges_attributes_and_keeps_toxicity(http: httpx.Client) -> None:
    create(http)
    body = {"type": "latency", "attributes": {"latency": 100, "jitter": 10}}
    http.post("/proxies/mysql_master/toxics", json=body)
    path = "/proxies/mysql_master/toxics/latency_downstream"

    updated = http.patch(path, json={"toxicity": 0.5, "attributes": {"latency": 1000}})
    assert updated.status_code == 200
    assert updated.json()["toxicity"] == 0.5
    assert updated.json()["attributes"] == {"latency": 1000, "jitter": 10}

    again = http.post(path, json={"attributes": {"latency": 500}})  # deprecated POST
    assert again.json()["toxicity"] == 0.5
    assert again.json()["attributes"] == {"latency": 500, "jitter": 10}
    assert http.get(path).json() == again.json()

    bad = http.patch(path, json={"attributes": {"jitter": "x"}})
    assert bad.status_code == 400
    assert http.get(path).json() == again.json()


def test_remove_toxic_then_404(http: httpx.Client) -> None:
    create(http)
    http.post("/proxies/mysql_master/toxics", json={"type": "latency"})
    path = "/proxies/mysql_master/toxics/latency_downstream"
    removed = http.delete(path)
    assert removed.status_code == 204 and removed.content == b""
    assert http.get("/proxies/mysql_master/toxics").json() == []
    for method in ("GET", "PATCH", "POST", "DELETE"):
        response = http.request(method, path, json={"attributes": {}})
        assert response.status_code == 404, method
        assert response.json() == {"error": "toxic not found", "status": 404}


def test_reset_enables_proxies_and_removes_toxics(http: httpx.Client) -> None:
    listen = create(http).json()["listen"]
    http.post(
        "/proxies/mysql_master/toxics", json={"type": "latency", "attributes": {"latency": 9}}
    )
    http.patch("/proxies/mysql_master", json={"enabled": False})
    assert not listening(listen)

    response = http.post("/reset")
    assert response.status_code == 204 and response.content == b""
    proxy = http.get("/proxies/mysql_master").json()
    assert proxy["enabled"] is True and proxy["toxics"] == [] and proxy["listen"] == listen
    assert listening(listen)


# -- populate ---------------------------------------------------------------------------------------


def test_populate_creates_proxies(http: httpx.Client) -> None:
    one, two = free_port(), free_port()
    body = [
        {"name": "one", "listen": f"localhost:{one}", "upstream": "localhost:7171"},
        {
            "name": "two",
            "listen": f"localhost:{two}",
            "upstream": "localhost:7474",
            "enabled": False,
        },
    ]
    response = http.post("/populate", json=body)
    assert response.status_code == 201
    proxies = response.json()["proxies"]
    assert [p["name"] for p in proxies] == ["one", "two"]
    assert proxies[0]["listen"] == f"127.0.0.1:{one}" and proxies[0]["enabled"] is True
    assert proxies[1]["enabled"] is False
    assert listening(f"127.0.0.1:{one}") and not listening(f"127.0.0.1:{two}")


def test_populate_keeps_unchanged_proxy_and_replaces_changed_one(http: httpx.Client) -> None:
    one, two, three = free_port(), free_port(), free_port()
    create(http, "one", listen=f"localhost:{one}", upstream="localhost:7171")
    create(http, "two", listen=f"localhost:{two}", upstream="localhost:7474")
    http.post("/proxies/one/toxics", json={"type": "latency"})
    http.post("/proxies/two/toxics", json={"type": "latency"})

    response = http.post(
        "/populate",
        json=[
            {"name": "one", "listen": f"127.0.0.1:{one}", "upstream": "localhost:7171"},
            {"name": "two", "listen": f"127.0.0.1:{three}", "upstream": "localhost:7676"},
        ],
    )
    assert response.status_code == 201
    listens = [p["listen"] for p in response.json()["proxies"]]
    assert listens == [f"127.0.0.1:{one}", f"127.0.0.1:{three}"]
    assert [t["type"] for t in http.get("/proxies/one/toxics").json()] == ["latency"]
    assert http.get("/proxies/two/toxics").json() == []
    assert not listening(f"127.0.0.1:{two}") and listening(f"127.0.0.1:{three}")


def test_populate_validates_before_creating(http: httpx.Client) -> None:
    body = [
        {"name": "one", "listen": f"localhost:{free_port()}", "upstream": "localhost:7171"},
        {"name": "", "listen": ""},
    ]
    response = http.post("/populate", json=body)
    assert response.status_code == 400
    assert response.json() == {"error": "missing required field: name at proxy 2", "status": 400}
    assert http.get("/proxies").json() == {}
    not_a_list = http.post("/populate", json={"name": "one"})
    assert not_a_list.status_code == 400


def test_populate_stops_at_a_bad_address(http: httpx.Client) -> None:
    body = [
        {"name": "one", "listen": f"localhost:{free_port()}", "upstream": "localhost:7171"},
        {"name": "two", "listen": "local373", "upstream": "localhost:7474"},
        {"name": "three", "listen": f"localhost:{free_port()}", "upstream": "localhost:7676"},
    ]
    response = http.post("/populate", json=body)
    assert response.status_code == 500
    error = response.json()
    assert error["status"] == 500 and "missing port in address" in error["error"]
    assert [p["name"] for p in error["proxies"]] == ["one"]
    assert set(http.get("/proxies").json()) == {"one"}


# -- toxiproxy-python, unchanged --------------------------------------------------------------------


def test_toxiproxy_python_client(http: httpx.Client) -> None:
    toxiproxy = Toxiproxy()
    assert toxiproxy.running()
    assert toxiproxy.version() == f'{{"version": "{VERSION}"}}\n'.encode()

    proxy = toxiproxy.create(upstream=UPSTREAM, name="py")
    assert proxy.enabled is True and proxy.listen.startswith("127.0.0.1:")
    assert set(toxiproxy.proxies()) == {"py"}
    assert toxiproxy.get_proxy("py").listen == proxy.listen
    assert toxiproxy.get_proxy("missing") is None

    proxy.add_toxic(type="latency", attributes={"latency": 100, "jitter": 10})
    proxy.add_toxic(name="cut", type="timeout", stream="upstream", toxicity=0.5)
    toxics = proxy.toxics()
    assert set(toxics) == {"latency_downstream", "cut"}
    assert toxics["latency_downstream"].attributes == {"latency": 100, "jitter": 10}
    assert (toxics["cut"].stream, toxics["cut"].toxicity) == ("upstream", 0.5)
    assert proxy.get_toxic("cut").type == "timeout"
    assert proxy.destroy_toxic("cut") is True
    assert set(proxy.toxics()) == {"latency_downstream"}

    with proxy.down():
        assert toxiproxy.get_proxy("py").enabled is False
        assert not listening(proxy.listen)
    assert toxiproxy.get_proxy("py").enabled is True
    assert listening(proxy.listen)

    assert toxiproxy.reset() is True
    assert proxy.toxics() == {}
    assert proxy.destroy() is True
    assert toxiproxy.proxies() == {}


def test_toxiproxy_python_error_paths(http: httpx.Client) -> None:
    toxiproxy = Toxiproxy()
    proxy = toxiproxy.create(upstream=UPSTREAM, name="py")
    with pytest.raises(ProxyExists):  # the client checks the list itself first ...
        toxiproxy.create(upstream=UPSTREAM, name="py")
    with pytest.raises(ProxyExists):  # ... and maps the server's 409 too
        APIConsumer.post("/proxies", json={"name": "py", "upstream": UPSTREAM})
    with pytest.raises(NotFound):
        APIConsumer.get("/proxies/missing")
    with pytest.raises(NotFound):
        proxy.destroy_toxic("missing")
    with pytest.raises(InvalidToxic):
        proxy.add_toxic(type="latency", stream="walrustream")
    with pytest.raises(InvalidToxic):
        proxy.add_toxic(type="unicorn")
    proxy.add_toxic(type="latency")
    with pytest.raises(ProxyExists):  # 409 "toxic already exists" maps to the same exception
        proxy.add_toxic(type="latency")
    proxy.destroy()
    with pytest.raises(NotFound):
        proxy.destroy()


def test_toxiproxy_python_populate(http: httpx.Client) -> None:
    port = free_port()
    wanted = [{"name": "pop", "upstream": UPSTREAM, "listen": f"127.0.0.1:{port}"}]
    created = Toxiproxy().populate(wanted)
    assert [p.name for p in created] == ["pop"]
    assert Toxiproxy().populate(wanted) == []  # unchanged: nothing recreated
    assert listening(f"127.0.0.1:{port}")


# -- our typed client -------------------------------------------------------------------------------


def test_typed_client(server: str, http: httpx.Client) -> None:
    with ToxiproxyClient(server) as client:
        assert client.version() == VERSION
        proxy = client.create_proxy("typed", UPSTREAM)
        assert proxy.enabled and proxy.port > 0 and proxy.host == "127.0.0.1"
        with pytest.raises(AlreadyExists):
            client.create_proxy("typed", UPSTREAM)
        with pytest.raises(ClientNotFound):
            client.proxy("missing")

        toxic = client.add_toxic("typed", "latency", {"latency": 50}, stream="upstream")
        assert (toxic.name, toxic.stream, toxic.toxicity) == ("latency_upstream", "upstream", 1.0)
        updated = client.update_toxic("typed", "latency_upstream", {"jitter": 5}, toxicity=0.25)
        assert updated.attributes == {"latency": 50, "jitter": 5} and updated.toxicity == 0.25
        assert client.toxic("typed", "latency_upstream") == updated
        with pytest.raises(BadRequest):
            client.add_toxic("typed", "latency", stream="sideways")

        with client.outage("typed") as down:
            assert down.enabled is False and not listening(proxy.listen)
        assert client.proxy("typed").enabled and listening(proxy.listen)

        with client.toxic_applied("typed", "slicer", {"average_size": 10}) as sliced:
            assert sliced.name in {t.name for t in client.toxics("typed")}
        assert [t.name for t in client.toxics("typed")] == ["latency_upstream"]

        client.reset()
        assert client.proxy("typed").toxics == ()
        populated = client.populate([{"name": "other", "upstream": UPSTREAM}])
        assert [p.name for p in populated] == ["other"]
        assert set(client.proxies()) == {"typed", "other"}
        client.delete_proxy("other")
        with pytest.raises(ClientNotFound):
            client.delete_proxy("other")


# -- the process ------------------------------------------------------------------------------------


def test_taken_port_exits_2() -> None:
    with socket.create_server((LOOPBACK, 0)) as taken:
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "chaos.toxiproxy", "--host", LOOPBACK, "--port", str(port)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert result.returncode == 2
    assert f"port {port} on {LOOPBACK} is already in use" in result.stderr


def test_config_populates_and_sigterm_closes_every_proxy(tmp_path: Path) -> None:
    upstream = socket.create_server((LOOPBACK, 0))
    listen = f"127.0.0.1:{free_port()}"
    config = tmp_path / "toxiproxy.json"
    config.write_text(
        f'[{{"name": "cfg", "listen": "{listen}", '
        f'"upstream": "127.0.0.1:{upstream.getsockname()[1]}"}}]'
    )
    proc, port = spawn_toxiproxy("--config", str(config))
    try:
        assert httpx.get(f"http://{LOOPBACK}:{port}/proxies/cfg").json()["listen"] == listen
        client = socket.create_connection(("127.0.0.1", int(listen.rsplit(":", 1)[1])), timeout=5)
        server_side, _ = upstream.accept()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert client.recv(1) == b""  # the proxied connection was closed on the way out
        server_side.settimeout(5)
        assert server_side.recv(1) == b""
        wait_until(lambda: not listening(listen), 5, "the proxy listener to close")
        client.close()
        server_side.close()
    finally:
        stop_process(proc)  # type: ignore[arg-type]
        upstream.close()


def test_metrics_count_each_proxy_s_bytes_by_direction_with_toxiproxy_s_names(
    http: httpx.Client,
) -> None:
    """GET /metrics serves Toxiproxy 2.12's proxy metrics: bytes received from the source and
    sent to the destination, per direction, labelled direction/listener/proxy/upstream."""
    import socketserver
    import threading

    from prometheus_client.parser import text_string_to_metric_families

    class Echo(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            while data := self.request.recv(1024):
                self.request.sendall(data)

    upstream = socketserver.ThreadingTCPServer((LOOPBACK, 0), Echo)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    try:
        target = f"{LOOPBACK}:{upstream.server_address[1]}"
        listen = http.post(
            "/proxies", json={"name": "echo", "listen": f"{LOOPBACK}:0", "upstream": target}
        ).json()["listen"]
        host, port = listen.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as client:
            client.sendall(b"hello")
            assert client.recv(5) == b"hello"

        def samples() -> dict[tuple[str, str], float]:
            text = http.get("/metrics").text
            return {
                (s.name, s.labels["direction"]): s.value
                for family in text_string_to_metric_families(text)
                for s in family.samples
                if s.labels.get("proxy") == "echo"
                and s.labels.get("listener") == listen
                and s.labels.get("upstream") == target
            }

        want = {
            (f"toxiproxy_proxy_{kind}_bytes_total", direction): 5.0
            for kind in ("received", "sent")
            for direction in ("upstream", "downstream")
        }
        wait_until(lambda: samples() == want, 10, "5 bytes each way counted")
    finally:
        upstream.shutdown()
        upstream.server_close()
