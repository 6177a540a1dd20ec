"""The hardened Event API over real sockets: every bad input of issue 12 gets a clear 4xx JSON
answer, idle connections cost no thread, and nothing accepted is lost to a reused event id.

A dedicated Event API (one process, 1 s read timeout) serves the session stack's DynamoDB,
Kinesis and Redis, so that the fan-out worker of that stack delivers what it accepts."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import resource
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from ulid import ULID

from emulators.ports import LOOPBACK, free_port
from harness.stack.supervisor import wait_until
from reference_impl import event_api
from reference_impl.event_registry import REGISTRY_TABLE, EventRegistry, content_sha256
from reference_impl.ids import ID_PATTERN
from reference_impl.inbox import MAX_LIMIT
from reference_impl.ulid_window import ULID_PATTERN

pytestmark = [pytest.mark.integration, pytest.mark.timing]

READ_TIMEOUT = 1.0


@dataclasses.dataclass
class Api:
    url: str
    port: int
    pid: int


@contextlib.contextmanager
def _event_api(stack: Any, tmp: Path, **overrides: Any) -> Iterator[Api]:
    config = dataclasses.replace(stack.reference_config(), **overrides)
    path = tmp / "event-api.json"
    path.write_text(config.to_json())
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "reference_impl.event_api", "--config", str(path)]
        + ["--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://{LOOPBACK}:{port}"
    try:

        def healthy() -> bool:
            try:
                return httpx.get(f"{url}/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(healthy, 30, "the dedicated event api to answer")
        yield Api(url, port, proc.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@pytest.fixture(scope="module")
def api(stack, tmp_path_factory) -> Iterator[Api]:
    tmp = tmp_path_factory.mktemp("hardened-api")
    with _event_api(stack, tmp, event_api_read_timeout_seconds=READ_TIMEOUT) as running:
        yield running


@pytest.fixture()
def http(api) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api.url, timeout=10) as client:
        yield client


def raw_exchange(api: Api, request: bytes, wait: float = 5.0) -> tuple[int, dict, dict, float]:
    """Send bytes, read until the server closes (or ``wait``): (status, headers, JSON body,
    seconds). Raw, because clients refuse to send most of these requests."""
    started = time.monotonic()
    with socket.create_connection((LOOPBACK, api.port), timeout=wait) as sock:
        if request:
            sock.sendall(request)
        data = b""
        with contextlib.suppress(TimeoutError):
            while chunk := sock.recv(65536):
                data += chunk
                if _complete(data):
                    break
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0].startswith("HTTP/1.1 "), data[:200]
    headers = {name.lower(): value for name, value in (line.split(": ", 1) for line in lines[1:])}
    assert headers["content-type"] == "application/json"
    return int(lines[0].split()[1]), headers, json.loads(body), time.monotonic() - started


def _complete(data: bytes) -> bool:
    head, sep, body = data.partition(b"\r\n\r\n")
    match = re.search(rb"content-length: (\d+)", head, re.I)
    return bool(sep and match and len(body) >= int(match.group(1)))


def event(**fields: Any) -> dict[str, Any]:
    return {"tenant_id": "th", "author_id": "a1", "kind": "post", "object_id": "o1", **fields}


# -- framing, limits, timeouts --------------------------------------------------------------


@pytest.mark.parametrize(
    "length", [b"abc", b"-1", b"1, 2", b"99999999999999999999999999999999"], ids=str
)
def test_malformed_content_length_is_a_json_400(api, length):
    status, headers, body, _ = raw_exchange(
        api, b"POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Length: " + length + b"\r\n\r\n"
    )
    assert status == 400 and "malformed HTTP request" in body["error"]
    assert headers["connection"] == "close"


def test_malformed_chunking_is_a_json_400(api):
    status, _, body, _ = raw_exchange(
        api,
        b"POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    )
    assert status == 400 and "malformed" in body["error"]


def test_a_chunked_event_is_read_like_any_other(http):
    chunks = iter(
        [b'{"tenant_id": "th", "author_id": "a1", ', b'"kind": "post", "object_id": "c"}']
    )
    response = http.post("/v1/events", content=chunks, headers={"content-type": "application/json"})
    assert response.request.headers["transfer-encoding"] == "chunked"
    assert response.status_code == 202, response.text


def test_a_body_shorter_than_its_length_times_out_with_408(api):
    status, headers, body, took = raw_exchange(
        api,
        b"POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'Content-Length: 100\r\n\r\n{"a"',
    )
    assert status == 408 and "did not arrive" in body["error"]
    assert headers["connection"] == "close"
    assert READ_TIMEOUT * 0.9 <= took < READ_TIMEOUT + 4


@pytest.mark.parametrize(
    "partial", [b"", b"GET /health HTTP/1.1\r\nHost: x\r\n"], ids=["idle", "half"]
)
def test_headers_that_never_complete_time_out_with_408(api, partial):
    status, _, body, took = raw_exchange(api, partial)
    assert status == 408 and "no complete request headers" in body["error"]
    assert took < READ_TIMEOUT + 4


def test_bodies_over_a_megabyte_are_413_declared_or_chunked(api, http):
    big = b"[" + b"1," * 600_000 + b"1]"
    status, headers, body, _ = raw_exchange(
        api,
        b"POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(big)}\r\n\r\n".encode(),  # the body itself is never sent
    )
    assert status == 413 and headers["connection"] == "close"
    chunked = http.post(
        "/v1/events",
        content=iter([big[i : i + 65536] for i in range(0, len(big), 65536)]),
        headers={"content-type": "application/json"},
    )
    assert chunked.status_code == 413 and "over 1000000 bytes" in chunked.json()["error"]


def test_headers_over_64_kb_are_431(api):
    status, _, body, _ = raw_exchange(
        api, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n"
    )
    assert status == 431 and "headers over" in body["error"]


@pytest.mark.parametrize("content_type", ["text/plain", None, "application/x-www-form-urlencoded"])
def test_a_json_body_sent_as_anything_else_is_415(http, content_type):
    headers = {"content-type": content_type} if content_type else {}
    response = http.post("/v1/events", content=json.dumps(event()).encode(), headers=headers)
    assert response.status_code == 415 and "application/json" in response.json()["error"]


def test_json_with_a_charset_is_json(http):
    response = http.post(
        "/v1/events",
        content=json.dumps(event(object_id="cs")).encode(),
        headers={"content-type": "application/json; charset=utf-8"},
    )
    assert response.status_code == 202


def test_a_2kb_depth_bomb_is_a_400_not_a_dropped_connection(http):
    for bomb in ("[" * 1000 + "]" * 1000, '{"a":' * 1000 + "1" + "}" * 1000):
        response = http.post(
            "/v1/events", content=bomb.encode(), headers={"content-type": "application/json"}
        )
        assert response.status_code == 400 and "nested deeper than 32" in response.json()["error"]


@pytest.mark.parametrize("body", [b"\xff\xfe{}", b"NaN", b'{"a": NaN}', b""], ids=str)
def test_bodies_that_are_not_json_are_400(http, body):
    response = http.post("/v1/events", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400 and "not valid JSON" in response.json()["error"]


@pytest.mark.parametrize("method", ["PATCH", "OPTIONS", "TRACE", "PUT", "DELETE", "PROPFIND"])
def test_an_unknown_method_on_a_known_path_is_405_with_allow(api, method):
    status, headers, body, _ = raw_exchange(
        api, f"{method} /v1/events HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n".encode()
    )
    assert status == 405 and headers["allow"] == "POST"
    assert body["error"] == f"method {method} not allowed on /v1/events"


def test_head_is_405_too_and_a_method_http_does_not_know_is_malformed(api):
    response = httpx.head(f"{api.url}/v1/tenants/t1/users/u1/inbox", timeout=5)
    assert response.status_code == 405 and response.headers["allow"] == "GET"
    status, _, body, _ = raw_exchange(api, b"FOO /v1/events HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 400 and "malformed HTTP request" in body["error"]


def test_an_unknown_path_is_a_json_404(http):
    response = http.get("/v1/nothing/here")
    assert response.status_code == 404 and response.json() == {
        "error": "no route for /v1/nothing/here"
    }


def test_a_thousand_idle_connections_cost_no_thread_and_block_nobody(api):
    """1,000 connections that never send a byte: the server holds them (its file descriptors
    show it) with the same few threads and a bounded amount of memory, answers a normal
    request meanwhile at once, and closes every one of them after the read timeout."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    with httpx.Client(base_url=api.url, timeout=10) as warm:
        for _ in range(20):  # the handler pool's threads exist before the baseline
            assert warm.get("/health").status_code == 200
    threads_before = _proc_status(api.pid, "Threads")
    rss_before = _proc_status(api.pid, "VmRSS")
    fds_before = _open_fds(api.pid)
    idle: list[socket.socket] = []
    try:
        for _ in range(1000):
            idle.append(socket.create_connection((LOOPBACK, api.port), timeout=5))
        wait_until(lambda: _open_fds(api.pid) >= fds_before + 990, 10, "1000 accepted connections")
        threads, rss = _proc_status(api.pid, "Threads"), _proc_status(api.pid, "VmRSS")
        assert threads <= threads_before + 1, (threads_before, threads)
        assert rss - rss_before < 40_000, f"RSS grew {rss - rss_before} kB for 1000 connections"
        started = time.monotonic()
        assert httpx.get(f"{api.url}/health", timeout=5).status_code == 200
        assert time.monotonic() - started < 2
        # Bounded in time too: the read timeout closes every one of them.
        wait_until(lambda: _open_fds(api.pid) < fds_before + 10, READ_TIMEOUT + 15, "closes")
        idle[0].settimeout(5)
        assert b"408 Request Timeout" in idle[0].recv(4096)
    finally:
        for sock in idle:
            sock.close()


def _proc_status(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise KeyError(field)


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_answers_are_not_held_back_by_nagle(api):
    """Headers and body are two writes: without TCP_NODELAY each answer would wait for the
    client's delayed ACK (40 ms)."""
    with httpx.Client(base_url=api.url, timeout=5) as client:
        client.get("/health")
        took = []
        for _ in range(30):
            started = time.perf_counter()
            assert client.get("/health").status_code == 200
            took.append(time.perf_counter() - started)
    assert statistics.median(took) < 0.02, took


# -- ids ------------------------------------------------------------------------------------


@pytest.mark.parametrize("tenant", [".", "..", ".hidden", "a/b", "", "x" * 65, "t#1", "t\n"])
def test_unsafe_tenant_ids_are_refused_in_bodies(http, tenant):
    response = http.post("/v1/events", json=event(tenant_id=tenant))
    assert response.status_code == 400 and "tenant_id must be" in response.json()["error"]


@pytest.mark.parametrize("segment", [".", "..", "%2E%2E", ".hidden", "a%2Fb"])
def test_unsafe_ids_are_refused_in_paths(api, segment):
    # Raw: a client would resolve the dot segments before sending.
    for path in (
        f"/v1/tenants/{segment}/users/u1/inbox",
        f"/v1/tenants/t1/users/{segment}/unread-count",
    ):
        status, _, body, _ = raw_exchange(api, f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert status == 400 and "must be 1-64 characters" in body["error"], path


def test_unsafe_ids_are_refused_in_batch_entries(http):
    users = [{"user_id": "ok-1"}, {"user_id": ".."}]
    response = http.post("/v1/tenants/tb3/users:batch", json={"users": users})
    assert response.status_code == 400 and response.json()["error"].startswith("users[1]: user_id")
    response = http.post("/v1/tenants/tb3/users/a/followers:batch", json={"followers": ["f", "."]})
    assert response.status_code == 400 and "invalid follower id" in response.json()["error"]


def test_domain_style_and_population_ids_still_work(http):
    for tenant, author in (("acme.eu", "u000123"), ("tenant-0", "u.with.dots"), ("t_1", "A-b")):
        response = http.post("/v1/events", json=event(tenant_id=tenant, author_id=author))
        assert response.status_code == 202, response.text


# -- what the OpenAPI document promises, enforced -------------------------------------------


@pytest.mark.parametrize(
    ("query", "reason"),
    [("limit=", "limit"), ("limit=0", "limit"), (f"limit={MAX_LIMIT + 1}", "limit"),
     ("limit=1.5", "limit"), ("cursor=", "cursor"), ("cursor=nope", "cursor")],
)  # fmt: skip
def test_inbox_parameters_outside_the_document_are_400(http, query, reason):
    response = http.get(f"/v1/tenants/t1/users/u1/inbox?{query}")
    assert response.status_code == 400 and reason in response.json()["error"]


@pytest.mark.parametrize(
    ("prefs", "reason"),
    [
        ({"zone": "UTC", "quiet_hours": {}}, "quiet_hours"),
        ({"zone": "UTC", "quiet_hours": {"start": "22:00"}}, "quiet_hours"),
        ({"zone": "localtime"}, "unknown time zone"),
        ({"zone": "UTC", "push_consent": {"granted_at": "yesterday", "version": "1"}}, "granted_at"),
        ({"zone": "UTC", "push_consent": {"granted_at": "2026-02-30T00:00:00Z", "version": 1}}, "granted_at"),
        ({"zone": "UTC", "push_consent": {"granted_at": "2026-01-01T00:00:00Z", "version": " "}}, "version"),
        ({"zone": "UTC", "email": "ada@example.com\n"}, "email"),
        ({"zone": "UTC", "email": "ada\u001e@example.com"}, "email"),
    ],
)  # fmt: skip
def test_preferences_outside_the_document_are_400(http, prefs, reason):
    response = http.put("/v1/tenants/t1/users/u1/preferences", json=prefs)
    assert response.status_code == 400 and reason in response.json()["error"]


def test_a_notification_id_to_mark_read_is_a_canonical_ulid(http):
    nid = str(ULID())
    assert http.post(f"/v1/tenants/t1/users/u1/inbox/{nid}/read").json() == {"read": nid}
    for bad in (nid.lower(), "nope", "8" + nid[1:]):
        response = http.post(f"/v1/tenants/t1/users/u1/inbox/{bad}/read")
        assert response.status_code == 400 and "canonical ULID" in response.json()["error"]


def test_the_document_states_the_rules_the_code_enforces(http):
    spec = yaml.safe_load((Path(event_api.__file__).parent / "openapi.yaml").read_text())
    schemas = spec["components"]["schemas"]
    prefs = schemas["Preferences"]["properties"]
    consent = schemas["Consent"]["properties"]
    assert schemas["Id"]["pattern"] == ID_PATTERN
    assert (
        schemas["Ulid"]["pattern"]
        == ULID_PATTERN
        == schemas["Event"]["properties"]["event_id"]["pattern"]
    )
    assert prefs["email"]["pattern"] == event_api._EMAIL.pattern
    assert schemas["Instant"]["pattern"] == event_api._INSTANT.pattern
    assert consent["version"]["oneOf"][1]["pattern"] == event_api._VERSION.pattern
    assert schemas["Event"]["properties"]["kind"]["enum"] == list(event_api.EVENT_KINDS)
    assert schemas["Platform"]["enum"] == list(event_api.PLATFORMS)
    assert schemas["Token"]["maxLength"] == event_api.MAX_TOKEN_CHARS
    paths = spec["paths"]
    batch = paths["/v1/tenants/{tenant_id}/users:batch"]["post"]["requestBody"]
    assert (
        batch["content"]["application/json"]["schema"]["properties"]["users"]["maxItems"]
        == event_api.MAX_USERS_PER_CALL
    )
    follow = paths["/v1/tenants/{tenant_id}/users/{user_id}/followers:batch"]["post"]["requestBody"]
    assert (
        follow["content"]["application/json"]["schema"]["properties"]["followers"]["maxItems"]
        == event_api.MAX_FOLLOWERS_PER_CALL
    )
    limit = paths["/v1/tenants/{tenant_id}/users/{user_id}/inbox"]["get"]["parameters"][2]
    assert limit["schema"]["maximum"] == MAX_LIMIT
    # As served: the zones this server knows, and the event id window as of now.
    served = http.get("/openapi.json").json()["components"]["schemas"]
    assert set(served["Preferences"]["properties"]["zone"]["enum"]) == event_api.known_zones()
    window = re.compile(served["Event"]["properties"]["event_id"]["pattern"])
    assert window.fullmatch(str(ULID()))
    assert not window.fullmatch("7" + "Z" * 25)
    assert {"400", "408", "409", "413", "415", "503"} <= set(paths["/v1/events"]["post"]["responses"])  # fmt: skip


# -- nothing accepted and then lost ---------------------------------------------------------


def _stream_records(stack: Any, notification_id: str) -> list[dict[str, Any]]:
    kinesis = stack.info.aws_client("kinesis")
    stream = stack.reference_config().stream_name
    found = []
    for shard in kinesis.list_shards(StreamName=stream)["Shards"]:
        iterator = kinesis.get_shard_iterator(
            StreamName=stream, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        for _ in range(1000):
            page = kinesis.get_records(ShardIterator=iterator, Limit=10_000)
            records = [json.loads(r["Data"]) for r in page["Records"]]
            found += [r for r in records if r.get("notification_id") == notification_id]
            iterator = page.get("NextShardIterator")
            if not page["Records"] or not iterator:
                break
    return found


def _inbox(http: httpx.Client, tenant: str, user: str) -> dict[str, dict[str, Any]]:
    items = http.get(f"/v1/tenants/{tenant}/users/{user}/inbox?limit=100").json()["items"]
    return {item["notification_id"]: item for item in items}


def test_a_reused_event_id_with_other_content_is_refused_and_the_first_stays(http, stack):
    tenant = f"reuse{os.getpid()}"
    for author in ("first-author", "second-author"):
        http.post(
            f"/v1/tenants/{tenant}/users/{author}/followers:batch", json={"followers": ["reader"]}
        ).raise_for_status()
    event_id = str(ULID())
    first = {"tenant_id": tenant, "author_id": "first-author", "kind": "post",
             "object_id": "first-post", "event_id": event_id}  # fmt: skip
    second = {**first, "author_id": "second-author", "object_id": "second-post"}

    accepted = http.post("/v1/events", json=first)
    assert accepted.status_code == 202 and accepted.json()["notification_id"] == event_id
    refused = http.post("/v1/events", json=second)
    assert refused.status_code == 409, refused.text
    assert "already taken by another event" in refused.json()["error"]
    assert http.post("/v1/events", json={**first, "kind": "like"}).status_code == 409
    # The same event again is an idempotent retry: accepted, and published again.
    retried = http.post("/v1/events", json=first)
    assert retried.status_code == 202 and retried.json()["notification_id"] == event_id

    wait_until(lambda: event_id in _inbox(http, tenant, "reader"), 30, "the first event's row")
    wait_until(lambda: len(_stream_records(stack, event_id)) == 2, 10, "both publications")
    published = _stream_records(stack, event_id)
    assert {(r["author_id"], r["object_id"]) for r in published} == {("first-author", "first-post")}
    row = _inbox(http, tenant, "reader")[event_id]
    assert (row["author_id"], row["object_id"], row["kind"]) == (
        "first-author",
        "first-post",
        "post",
    )
    # The same id in another tenant is another event (tenant#event_id).
    assert http.post("/v1/events", json={**second, "tenant_id": f"{tenant}b"}).status_code == 202


def test_a_retry_after_a_failed_publish_still_delivers(http, stack):
    """The registry claim succeeded and the publish did not (a 503, a crash): the client's retry
    of the same event must go through and reach the inbox."""
    tenant = f"retry{os.getpid()}"
    http.post(
        f"/v1/tenants/{tenant}/users/author/followers:batch", json={"followers": ["reader"]}
    ).raise_for_status()
    event_id = ULID()
    config = stack.reference_config()
    registry = EventRegistry(stack.info.aws_client("dynamodb"), config.table(REGISTRY_TABLE))
    digest = content_sha256(tenant, "author", "post", "p1")
    assert registry.claim(tenant, str(event_id), digest, event_id.datetime, datetime.now(UTC))
    assert _stream_records(stack, str(event_id)) == []
    body = {"tenant_id": tenant, "author_id": "author", "kind": "post", "object_id": "p1",
            "event_id": str(event_id)}  # fmt: skip
    assert http.post("/v1/events", json=body).status_code == 202
    wait_until(lambda: str(event_id) in _inbox(http, tenant, "reader"), 30, "the retried event")


def _ulid_at(instant: datetime) -> str:
    return str(ULID.from_timestamp(instant.timestamp()))


@pytest.mark.parametrize(
    ("offset", "status", "reason"),
    [
        (timedelta(minutes=4), 202, None),
        (timedelta(days=-29), 202, None),
        (timedelta(minutes=6), 400, "more than 5 minutes in the future"),
        (timedelta(days=-31), 400, "older than the 30-day dedup window"),
    ],
    ids=["4min-ahead", "29d-old", "6min-ahead", "31d-old"],
)
def test_event_ids_outside_the_time_window_are_refused(http, offset, status, reason):
    event_id = _ulid_at(datetime.now(UTC) + offset)
    response = http.post("/v1/events", json=event(object_id="w", event_id=event_id))
    assert response.status_code == status, response.text
    if reason:
        assert reason in response.json()["error"]


def test_the_year_10889_id_from_the_issue_is_refused(http):
    response = http.post("/v1/events", json=event(event_id="7ZZZZZZZZZ" + "0" * 16))
    assert response.status_code == 400 and "future" in response.json()["error"]
    response = http.post("/v1/events", json=event(event_id=str(ULID()).lower()))
    assert response.status_code == 400 and "upper-case" in response.json()["error"]


@pytest.mark.parametrize(
    ("key", "value"),
    [("event_api_read_timeout_seconds", 0), ("event_api_keep_alive_seconds", "long"),
     ("event_api_max_connections", 0), ("event_api_threads", True)],
)  # fmt: skip
def test_bad_gateway_limits_are_a_config_error(tmp_path, key, value):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({key: value}))
    done = subprocess.run(
        [sys.executable, "-m", "reference_impl.event_api", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2 and f"error: {key} must be" in done.stderr


def test_minted_ids_are_group_committed_and_each_waits_for_its_own_write(stack):
    """Concurrent minted claims share BatchWriteItem rounds; every one is stored when its call
    returns; a failed round fails every claim in it (none is reported stored)."""
    from concurrent.futures import ThreadPoolExecutor

    ddb = stack.info.aws_client("dynamodb")
    table = stack.reference_config().table(REGISTRY_TABLE)
    registry = EventRegistry(ddb, table)
    now = datetime.now(UTC)
    ids = [str(ULID()) for _ in range(64)]
    with ThreadPoolExecutor(16) as pool:
        rounds = list(pool.map(lambda i: registry.claim_minted("tg", i, "d" * 64, now), ids))
    assert max(rounds) > 1, rounds  # some claims shared a write
    for event_id in ids:
        item = ddb.get_item(TableName=table, Key={"pk": {"S": f"tg#{event_id}"}})["Item"]
        assert item["content_sha256"]["S"] == "d" * 64
    broken = EventRegistry(ddb, "no-such-table")
    with ThreadPoolExecutor(8) as pool:
        outcomes = list(
            pool.map(lambda i: _outcome(broken.claim_minted, "tg", i, "d", now), ids[:16])
        )
    assert outcomes == ["ResourceNotFoundException"] * 16


def _outcome(call: Any, *args: Any) -> str:
    from botocore.exceptions import ClientError

    try:
        call(*args)
    except ClientError as exc:
        return exc.response["Error"]["Code"]
    return "stored"


def test_a_connection_over_the_cap_is_told_503_and_closed(stack, tmp_path):
    health = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    with _event_api(stack, tmp_path, event_api_max_connections=5) as small:
        held = [socket.create_connection((LOOPBACK, small.port), timeout=5) for _ in range(5)]
        try:
            # Polled: the five are accepted asynchronously.
            wait_until(lambda: raw_exchange(small, health)[0] == 503, 10, "a 503 past five")
            status, headers, body, _ = raw_exchange(small, health)
            assert status == 503 and "over 5 open connections" in body["error"]
            assert headers["connection"] == "close"
        finally:
            for sock in held:
                sock.close()
        # Freed connections make room again.
        wait_until(lambda: raw_exchange(small, health)[0] == 200, 10, "a free slot")
