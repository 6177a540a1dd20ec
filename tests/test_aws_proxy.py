"""The AWS JSON-protocol fault proxy (emulators/aws_proxy): pure logic, then the real proxy
process between boto3 and kinesalite (and between boto3 and a recording upstream, to see
exactly what it forwards)."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import threading
import time
import uuid
import zlib
from collections.abc import Iterator
from typing import Any

import boto3
import httpx
import pytest
from botocore.config import Config as BotoConfig
from helpers import answers_200, start_process

from emulators.aws_proxy.faults import FaultState, ShardRef, shard_id_of, validate
from emulators.aws_proxy.kinesis import IteratorMap, held_answer, operation_of, stream_name
from emulators.http_server import Request, Response, json_response, server_port, start_server
from emulators.ports import free_port
from harness.stack.supervisor import NODE_EMULATOR, ROOT, stop_process, wait_until

SHARD0, SHARD1 = shard_id_of(0), shard_id_of(1)


# -- pure ---------------------------------------------------------------------------------------


def test_params_are_normalised_and_mistakes_named():
    assert validate("hold_shard", {"shard": 1}) == {"stream": None, "shard": "shardId-000000000001"}
    assert validate("hold_shard", {"shard": "shardId-000000000003", "stream": "s"}) == {
        "stream": "s",
        "shard": "shardId-000000000003",
    }
    assert validate("latency", {"ms": 5, "operations": ["PutRecord", "GetRecords"]}) == {
        "ms": 5,
        "operations": ["GetRecords", "PutRecord"],
    }
    for fault, params, message in [
        ("nope", {}, "unknown fault 'nope'"),
        ("hold_shard", {}, "params.shard is required"),
        ("hold_shard", {"shard": -1}, "index must be 0 or more"),
        ("hold_shard", {"shard": True}, "params.shard must be"),
        ("hold_shard", {"shard": "a/b"}, "params.shard must be"),
        ("hold_shard", {"shard": 0, "stream": 3}, "params.stream must be"),
        ("hold_shard", {"shard": 0, "shards": 1}, "unknown param(s) shards"),
        ("hold_shard", [0], "params must be a JSON object"),
        ("latency", {"ms": "5"}, "params.ms must be"),
        ("latency", {"ms": 60_001}, "params.ms must be"),
        ("latency", {"ms": 1, "operations": []}, "params.operations must be"),
        ("latency", {"ms": 1, "operations": "GetRecords"}, "params.operations must be"),
    ]:
        with pytest.raises(ValueError) as caught:
            validate(fault, params)
        assert message in str(caught.value)


def test_a_hold_names_a_shard_of_one_stream_or_of_any():
    state = FaultState(clock=lambda: 100.0)
    any_stream = state.start("hold_shard", {"shard": 1})
    one_stream = state.start("hold_shard", {"shard": 0, "stream": "posts"})
    assert state.holding(ShardRef("other", SHARD1)) == [any_stream]
    assert state.holding(ShardRef("posts", SHARD0)) == [one_stream]
    assert state.holding(ShardRef("other", SHARD0)) == []
    assert state.holding(None) == []
    state.stop(any_stream.id)
    assert state.holding(ShardRef("other", SHARD1)) == []
    assert [w["stopped_at"] for w in state.log()] == [100.0, None]


def test_latency_adds_up_over_the_faults_that_name_the_operation():
    state = FaultState()
    state.start("latency", {"ms": 100, "operations": ["GetRecords"]})
    state.start("latency", {"ms": 20})
    assert state.latency_for("GetRecords") == pytest.approx(0.12)
    assert state.latency_for("PutRecord") == pytest.approx(0.02)


def test_iterator_map_is_bounded_and_keeps_the_recently_used():
    refs = IteratorMap(capacity=2)
    refs.learn("a", ShardRef("s", SHARD0))
    refs.learn("b", ShardRef("s", SHARD1))
    assert refs.get("a") == ShardRef("s", SHARD0)  # now the most recently used
    refs.learn("c", ShardRef("s", SHARD1))
    assert len(refs) == 2 and refs.get("b") is None and refs.get("a") is not None
    refs.learn(None, ShardRef("s", SHARD0))  # a closed shard's last answer: nothing to learn
    assert len(refs) == 2


def test_the_holding_answer_keeps_the_iterator_and_upstreams_lag():
    upstream = {
        "Records": [{"SequenceNumber": "1"}, {"SequenceNumber": "2"}],
        "NextShardIterator": "next",
        "MillisBehindLatest": 1500,
        "ChildShards": [{"ShardId": "x"}],
    }
    answer, withheld = held_answer(upstream, "same")
    assert answer == {"Records": [], "NextShardIterator": "same", "MillisBehindLatest": 1500}
    assert withheld == 2


def test_operation_and_stream_are_read_from_the_request():
    assert operation_of({"x-amz-target": "Kinesis_20131202.GetRecords"}) == "GetRecords"
    assert operation_of({}) is None
    assert stream_name({"StreamName": "s"}) == "s"
    assert stream_name({"StreamARN": "arn:aws:kinesis:us-east-1:1:stream/posts"}) == "posts"
    assert stream_name({}) is None


# -- processes ----------------------------------------------------------------------------------


def _kinesis(url: str, retries: int = 2) -> Any:
    return boto3.client(
        "kinesis",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=BotoConfig(retries={"max_attempts": retries, "mode": "standard"}),
    )


def start_proxy(upstream: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [
        sys.executable,
        "-m",
        "emulators.aws_proxy",
        "--upstream",
        upstream,
        "--port",
        str(port),
    ]
    proc = start_process(
        argv, lambda: answers_200(f"{url}/_proxy/health"), "the aws proxy to answer"
    )
    return proc, url


@pytest.fixture(scope="module")
def kinesalite() -> Iterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    client = _kinesis(url)

    def ready() -> bool:
        try:
            client.list_streams()
            return True
        except Exception:
            return False

    argv = [shutil.which("node") or "node", str(NODE_EMULATOR), "kinesalite", "--port", str(port)]
    proc = start_process(argv, ready, "kinesalite to answer")
    try:
        yield url
    finally:
        stop_process(proc)


@pytest.fixture(scope="module")
def proxy(kinesalite) -> Iterator[str]:
    proc, url = start_proxy(kinesalite)
    try:
        yield url
    finally:
        stop_process(proc)


@pytest.fixture
def control(proxy) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=proxy, timeout=10) as client:
        yield client
        client.delete("/_proxy/faults")


def _stream(client: Any, shards: int = 2) -> str:
    name = f"s-{uuid.uuid4().hex[:8]}"
    client.create_stream(StreamName=name, ShardCount=shards)
    wait_until(
        lambda: (
            client.describe_stream(StreamName=name)["StreamDescription"]["StreamStatus"] == "ACTIVE"
        ),
        20,
        f"stream {name} to become active",
    )
    return name


def _put(client: Any, stream: str, count: int, prefix: str) -> dict[str, list[tuple[str, bytes]]]:
    """Put ``count`` records with fixed keys (so both shards get some); what each shard got."""
    by_shard: dict[str, list[tuple[str, bytes]]] = {SHARD0: [], SHARD1: []}
    for n in range(count):
        data = f"{prefix}-{n}".encode()
        answer = client.put_record(StreamName=stream, Data=data, PartitionKey=f"key-{n}")
        by_shard[answer["ShardId"]].append((answer["SequenceNumber"], data))
    assert by_shard[SHARD0] and by_shard[SHARD1], "fixed keys must reach both shards"
    return by_shard


class ShardReader:
    """A consumer of one shard, as the fan-out worker's poller reads it: GetShardIterator once,
    then GetRecords in a loop, following NextShardIterator, everything it got in order."""

    def __init__(self, client: Any, stream: str, shard: str) -> None:
        self.client = client
        self.iterator = client.get_shard_iterator(
            StreamName=stream, ShardId=shard, ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        self.got: list[tuple[str, bytes]] = []
        self.polls = 0
        self.same_iterator_answers = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for _ in range(20_000):  # bounded: a test lasts seconds
            if self._stop.wait(0.02):
                return
            answer = self.client.get_records(ShardIterator=self.iterator, Limit=3)
            if answer["NextShardIterator"] == self.iterator:
                self.same_iterator_answers += 1
            self.got += [(r["SequenceNumber"], r["Data"]) for r in answer["Records"]]
            self.iterator = answer["NextShardIterator"]
            self.polls += 1

    def polls_past(self, n: int) -> bool:
        return self.polls >= n

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def _window(control: httpx.Client, fault_id: str) -> dict[str, Any]:
    (window,) = [
        w for w in control.get("/_proxy/faults/log").json()["windows"] if w["id"] == fault_id
    ]
    return window


@pytest.mark.integration
def test_a_held_shard_gets_nothing_while_the_other_flows_then_everything_in_order(proxy, control):
    client = _kinesis(proxy)
    stream = _stream(client)
    started = control.post("/_proxy/faults", json={"fault": "hold_shard", "params": {"shard": 1}})
    assert started.status_code == 200, started.text
    fault_id = started.json()["id"]
    readers = {shard: ShardReader(client, stream, shard) for shard in (SHARD0, SHARD1)}
    try:
        put = _put(client, stream, 30, "a")
        wait_until(lambda: readers[SHARD0].got == put[SHARD0], 20, "shard 0's records to flow")
        # Shard 1 is polled all along (answers with its own iterator), and the proxy has seen
        # upstream offer every one of its records and withheld them.
        held = len(put[SHARD1])
        wait_until(
            lambda: (
                _window(control, fault_id)["max_held_records"] == min(held, 3)
                and readers[SHARD1].same_iterator_answers >= 3
            ),
            20,
            "the proxy to hold shard 1's records",
        )
        assert readers[SHARD1].got == []
        # More records while held: they queue behind the first ones.
        more = _put(client, stream, 10, "b")
        stopped = control.delete(f"/_proxy/faults/{fault_id}")
        assert stopped.status_code == 200 and stopped.json()["window"]["stopped_at"] is not None
        expected = put[SHARD1] + more[SHARD1]
        wait_until(
            lambda: len(readers[SHARD1].got) >= len(expected), 20, "the held records to arrive"
        )
        polls = readers[SHARD1].polls
        wait_until(lambda: readers[SHARD1].polls_past(polls + 3), 20, "three more polls")
        # Every held record, in order, none lost, none twice.
        assert readers[SHARD1].got == expected
        assert readers[SHARD0].got == put[SHARD0] + more[SHARD0]
    finally:
        for reader in readers.values():
            reader.stop()


@pytest.mark.integration
def test_a_hold_on_another_stream_or_shard_holds_nothing_here(proxy, control, kinesalite):
    client = _kinesis(proxy)
    stream = _stream(client)
    for params in ({"stream": "some-other-stream", "shard": 0}, {"shard": "shardId-000000000009"}):
        response = control.post("/_proxy/faults", json={"fault": "hold_shard", "params": params})
        assert response.status_code == 200, response.text
    put = _put(client, stream, 10, "c")
    for shard in (SHARD0, SHARD1):
        reader = ShardReader(client, stream, shard)
        try:
            wait_until(lambda r=reader, s=shard: r.got == put[s], 20, f"{shard}'s records")
        finally:
            reader.stop()
    # An iterator the proxy never saw handed out (taken straight from upstream) is never held.
    control.post("/_proxy/faults", json={"fault": "hold_shard", "params": {"shard": 1}})
    direct = _kinesis(kinesalite).get_shard_iterator(
        StreamName=stream, ShardId=SHARD1, ShardIteratorType="TRIM_HORIZON"
    )["ShardIterator"]
    unknown = control.get("/_proxy/health").json()["counts"]["unknown_iterators"]
    answer = client.get_records(ShardIterator=direct)
    assert [r["SequenceNumber"] for r in answer["Records"]] == [s for s, _ in put[SHARD1]]
    assert control.get("/_proxy/health").json()["counts"]["unknown_iterators"] == unknown + 1


@pytest.mark.integration
def test_a_fault_with_a_duration_stops_by_itself(proxy, control):
    client = _kinesis(proxy)
    stream = _stream(client)
    reader = ShardReader(client, stream, SHARD1)
    try:
        started = control.post(
            "/_proxy/faults",
            json={"fault": "hold_shard", "params": {"shard": 1, "stream": stream}, "duration": 1},
        ).json()
        put = _put(client, stream, 10, "d")
        wait_until(lambda: reader.got == put[SHARD1], 20, "the records after the window")
        window = _window(control, started["id"])
        assert window["stopped_at"] is not None
        assert 0.9 <= window["stopped_at"] - window["started_at"] < 10
    finally:
        reader.stop()


@pytest.mark.integration
def test_latency_delays_only_the_named_operations(proxy, control):
    client = _kinesis(proxy)
    stream = _stream(client, shards=1)
    iterator = client.get_shard_iterator(
        StreamName=stream, ShardId=SHARD0, ShardIteratorType="TRIM_HORIZON"
    )["ShardIterator"]
    body = {"fault": "latency", "params": {"ms": 800, "operations": ["GetRecords"]}}
    assert control.post("/_proxy/faults", json=body).status_code == 200
    began = time.monotonic()
    client.get_records(ShardIterator=iterator)
    assert time.monotonic() - began >= 0.8
    began = time.monotonic()
    client.list_streams()
    assert time.monotonic() - began < 0.8


@pytest.mark.integration
@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "body must be JSON"),
        (b"[1]", "body must be a JSON object"),
        (b'{"fault": "drop_shard"}', "unknown fault 'drop_shard'"),
        (b'{"fault": "hold_shard", "params": {}}', "params.shard is required"),
        (b'{"fault": "hold_shard", "params": {"shard": "x/y"}}', "params.shard must be"),
        (b'{"fault": "hold_shard", "params": {"shard": 0}, "duration": 0}', "duration must be"),
        (b'{"fault": "hold_shard", "params": {"shard": 0}, "queues": []}', "unknown key(s) queues"),
        (b'{"fault": "latency", "params": {"ms": -1}}', "params.ms must be"),
    ],
)
def test_bad_control_input_is_a_400_that_changes_nothing(control, body, message):
    kept = control.post("/_proxy/faults", json={"fault": "hold_shard", "params": {"shard": 5}})
    response = control.post("/_proxy/faults", content=body)
    assert response.status_code == 400
    assert message in response.json()["error"]
    active = control.get("/_proxy/health").json()["active_faults"]
    assert [f["id"] for f in active] == [kept.json()["id"]]


@pytest.mark.integration
def test_unknown_faults_and_routes_are_404s(control):
    assert control.delete("/_proxy/faults/f999999").status_code == 404
    response = control.get("/_proxy/nope")
    assert response.status_code == 404 and "routes" in response.json()["error"]


@pytest.mark.integration
def test_the_fault_log_keeps_every_window_with_epoch_times(control):
    before = time.time()
    first = control.post("/_proxy/faults", json={"fault": "hold_shard", "params": {"shard": 0}})
    second = control.post("/_proxy/faults", json={"fault": "latency", "params": {"ms": 1}})
    first_id, second_id = first.json()["id"], second.json()["id"]
    control.delete(f"/_proxy/faults/{first_id}")
    # Stopping a stopped fault is not an error: it answers the window as it was.
    again = control.delete(f"/_proxy/faults/{first_id}")
    assert again.status_code == 200 and again.json()["window"]["id"] == first_id
    stopped = control.delete("/_proxy/faults").json()["stopped"]
    assert [w["id"] for w in stopped] == [second_id]
    after = time.time()
    log = {w["id"]: w for w in control.get("/_proxy/faults/log").json()["windows"]}
    assert log[first_id]["params"] == {"stream": None, "shard": SHARD0}
    assert log[second_id]["params"] == {"ms": 1, "operations": None}
    for fault_id in (first_id, second_id):
        window = log[fault_id]
        assert before <= window["started_at"] <= window["stopped_at"] <= after
    assert control.get("/_proxy/health").json()["active_faults"] == []


# -- what exactly is forwarded: a recording upstream ----------------------------------------------

ANSWER_RECORDS = [
    {"Data": "eA==", "PartitionKey": "k", "SequenceNumber": "7", "ApproximateArrivalTimestamp": 1.0}
]


class RecordingUpstream:
    """A real HTTP server in a thread that keeps every request and answers Kinesis-shaped JSON
    (GetRecords with a lag of 12,345 ms, so the proxy's copy of it can be seen)."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(
            start_server(self.handle, "127.0.0.1", 0), self.loop
        ).result(10)
        self.url = f"http://127.0.0.1:{server_port(self.server)}"

    async def handle(self, request: Request) -> Response:
        self.requests.append(request)
        op = request.headers.get("x-amz-target", "").rsplit(".", 1)[-1]
        body = json.loads(request.body or b"{}")
        if op == "GetShardIterator":
            answer: dict[str, Any] = {"ShardIterator": f"it-{body['ShardId']}"}
        elif op == "GetRecords":
            answer = {
                "Records": ANSWER_RECORDS,
                "NextShardIterator": body["ShardIterator"] + "+",
                "MillisBehindLatest": 12345,
            }
        else:
            answer = {"ShardId": SHARD0, "SequenceNumber": "7"}
        response = json_response(200, answer, {"content-type": "application/x-amz-json-1.1"})
        response.headers["x-amzn-requestid"] = "req-1"
        response.headers["x-amz-crc32"] = str(zlib.crc32(response.body))
        return response

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def recorded() -> Iterator[tuple[RecordingUpstream, str]]:
    upstream = RecordingUpstream()
    try:
        proc, url = start_proxy(upstream.url)
        try:
            yield upstream, url
        finally:
            stop_process(proc)
    finally:
        upstream.close()


@pytest.mark.integration
def test_requests_go_upstream_unchanged_signature_included(recorded):
    upstream, url = recorded
    client = _kinesis(url, retries=1)
    sent: list[Any] = []
    client.meta.events.register("before-send.kinesis.*", lambda request, **_: sent.append(request))
    client.put_record(StreamName="s", Data=b"payload", PartitionKey="tenant#author")
    (request,) = sent
    (seen,) = [
        r for r in upstream.requests if r.headers.get("x-amz-target", "").endswith("PutRecord")
    ]
    assert seen.body == request.body
    assert seen.method == "POST" and seen.path == "/"
    hop_by_hop = {"content-length", "connection", "transfer-encoding"}
    client_sent = {
        k.lower(): (v.decode() if isinstance(v, bytes) else v) for k, v in request.headers.items()
    }
    for name, value in client_sent.items():
        if name not in hop_by_hop:
            assert seen.headers.get(name) == value, name
    assert seen.headers["authorization"].startswith("AWS4-HMAC-SHA256")
    assert seen.headers["host"] == url.removeprefix("http://")
    # Nothing added on the way (aiohttp's own User-Agent, Accept, ...): besides what botocore
    # signed, only what urllib3 adds as it sends (Host, and Accept-Encoding: identity where
    # aiohttp would have asked for gzip).
    assert set(seen.headers) - hop_by_hop <= set(client_sent) | {"host", "accept-encoding"}
    assert seen.headers["accept-encoding"] == "identity"


@pytest.mark.integration
def test_a_held_answer_carries_upstreams_lag_the_same_iterator_and_a_right_checksum(recorded):
    upstream, url = recorded
    client = _kinesis(url, retries=1)
    iterator = client.get_shard_iterator(
        StreamName="s", ShardId=SHARD1, ShardIteratorType="TRIM_HORIZON"
    )["ShardIterator"]
    free = client.get_records(ShardIterator=iterator)
    assert free["NextShardIterator"] == "it-shardId-000000000001+"
    assert len(free["Records"]) == 1
    with httpx.Client(base_url=url) as control:
        control.post("/_proxy/faults", json={"fault": "hold_shard", "params": {"shard": 1}})
        # The next iterator was learned from the free answer: still shard 1, so it is held.
        raw = control.post(
            "/",
            content=json.dumps({"ShardIterator": free["NextShardIterator"]}),
            headers={
                "x-amz-target": "Kinesis_20131202.GetRecords",
                "content-type": "application/x-amz-json-1.1",
            },
        )
    assert raw.status_code == 200
    assert raw.json() == {
        "Records": [],
        "NextShardIterator": free["NextShardIterator"],
        "MillisBehindLatest": 12345,
    }
    assert raw.headers["x-amz-crc32"] == str(zlib.crc32(raw.content))
    assert raw.headers["x-amzn-requestid"] == "req-1"
    # Upstream was asked all the same (its lag is what the held answer reports).
    assert (
        sum(r.headers.get("x-amz-target", "").endswith("GetRecords") for r in upstream.requests)
        == 2
    )


@pytest.mark.integration
def test_an_upstream_that_is_down_is_a_502_in_awss_error_shape():
    proc, url = start_proxy(f"http://127.0.0.1:{free_port()}")
    try:
        response = httpx.post(
            url, content=b"{}", headers={"x-amz-target": "Kinesis_20131202.ListStreams"}
        )
        assert response.status_code == 502
        assert response.json()["__type"] == "ProxyUpstreamUnavailable"
        health = httpx.get(f"{url}/_proxy/health").json()
        assert health["counts"]["upstream_errors"] == 1
    finally:
        stop_process(proc)


def test_the_cli_refuses_a_bad_upstream_and_a_taken_port():
    bad = subprocess.run(
        [sys.executable, "-m", "emulators.aws_proxy", "--upstream", "kinesalite:4567"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "upstream must be an http(s) URL" in bad.stderr
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "emulators.aws_proxy", "--upstream", "http://127.0.0.1:1",
             "--port", str(port)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )  # fmt: skip
    assert result.returncode == 2 and "already in use" in result.stderr
