"""Per-author ordering made observable: the kinesis-proxy stack part, the kinesis-shard-hold
chaos fault, and the reference with and without the ``partition_key_per_event`` defect under it.

Kinesis keeps order per shard only; the design keys records by author so that one author's
posts share a shard. Holding one shard's records (the proxy answers its reader with no records
and the same iterator) is harmless to a system that keeps an author on one shard: its posts wait
together. A system that spreads one author over shards shows a reader the author's later post
while an earlier one is still held.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from ulid import ULID

from chaos.faults import ChaosTargets, FaultError, make_fault
from chaos.nemesis import Nemesis, ScheduledFault
from emulators.ports import free_port
from harness.checkers.windows import fault_windows
from harness.model.history import History
from harness.stack.supervisor import Stack, _pid_alive, wait_until
from reference_impl.config import Config

pytestmark = pytest.mark.integration

HELD_SHARD = 1


def _active_holds(proxy_url: str) -> list[dict[str, Any]]:
    health = httpx.get(f"{proxy_url}/_proxy/health", timeout=5).json()
    return [f for f in health["active_faults"] if f["fault"] == "hold_shard"]


# -- the stack part and the chaos fault -----------------------------------------------------------


@pytest.fixture(scope="module")
def kinesis_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with Stack(
        tmp_path_factory.mktemp("kinesis-proxy"), parts=["kinesis", "kinesis-proxy"]
    ) as stack:
        yield stack


def test_the_stack_puts_the_proxy_between_the_reference_and_kinesalite(kinesis_stack):
    info = kinesis_stack.info
    proxy = info.parts["kinesis-proxy"]
    # Every reference process reads this one config: its Kinesis calls go through the proxy.
    assert Config.load(info.reference_config).kinesis_endpoint == proxy.url
    kinesis = _client(proxy.url)
    kinesis.create_stream(StreamName="through-proxy", ShardCount=1)
    wait_until(
        lambda: (
            kinesis.describe_stream(StreamName="through-proxy")["StreamDescription"]["StreamStatus"]
            == "ACTIVE"
        ),
        20,
        "the stream to become active",
    )
    kinesis.put_record(StreamName="through-proxy", Data=b"x", PartitionKey="k")
    # It reached kinesalite itself (asked directly, not through the proxy).
    direct = info.aws_client("kinesis")
    assert "through-proxy" in direct.list_streams()["StreamNames"]
    assert httpx.get(f"{proxy.url}/_proxy/health").json()["counts"]["forwarded"] >= 3
    log = Path(proxy.log).read_text()
    assert f"aws proxy listening on {proxy.url} -> {info.parts['kinesis'].url}" in log


def test_stopping_the_stack_stops_the_proxy(tmp_path):
    stack = Stack(tmp_path, parts=["kinesis", "kinesis-proxy"])
    with stack:
        pid = stack.info.parts["kinesis-proxy"].pid
        assert _pid_alive(pid)
    wait_until(lambda: not _pid_alive(pid), 10, "the proxy to exit")


def test_the_proxy_part_without_an_upstream_is_a_clear_error(tmp_path):
    from harness.stack.supervisor import StackError

    with pytest.raises(StackError, match="kinesis-proxy needs an upstream"):
        Stack(tmp_path, parts=["kinesis-proxy"]).up()


def test_the_chaos_fault_is_recorded_and_undone_by_rollback(kinesis_stack):
    url = kinesis_stack.info.parts["kinesis-proxy"].url
    history = History()
    nemesis = Nemesis(
        [ScheduledFault(make_fault("kinesis-shard-hold", {"shard": 1}), 0.0, 3600)],
        ChaosTargets(kinesis_proxy_url=url),
        history,
        log=lambda line: None,
    )
    nemesis.start()
    wait_until(lambda: len(_active_holds(url)) == 1, 10, "the hold to start on the proxy")
    assert _active_holds(url)[0]["params"] == {"stream": None, "shard": "shardId-000000000001"}
    assert nemesis.rollback() == ["kinesis-shard-hold"]
    assert _active_holds(url) == []
    (window,) = fault_windows(history.frame())
    assert window.fault == "kinesis-shard-hold" and window.stop >= window.start
    assert not nemesis.errors


def test_the_chaos_fault_names_what_is_missing_or_wrong(kinesis_stack):
    url = kinesis_stack.info.parts["kinesis-proxy"].url
    with pytest.raises(FaultError, match="no Kinesis fault proxy"):
        make_fault("kinesis-shard-hold").start(ChaosTargets(), None)
    with pytest.raises(FaultError, match="unknown parameter"):
        make_fault("kinesis-shard-hold", {"shards": 1}).start(
            ChaosTargets(kinesis_proxy_url=url), None
        )
    with pytest.raises(FaultError, match="index must be 0 or more"):
        make_fault("kinesis-shard-hold", {"shard": -1}).start(
            ChaosTargets(kinesis_proxy_url=url), None
        )
    assert _active_holds(url) == []


def test_a_target_that_names_its_kinesis_consumer_gets_the_proxy_there(kinesis_stack, tmp_path):
    from harness.run.runner import _chaos_targets
    from harness.stack.target import parse

    their_kinesis = kinesis_stack.info.parts["kinesis"].url
    listen = free_port()
    base = {"name": "theirs", "event_api": "http://127.0.0.1:1", "fcm_listen": f"127.0.0.1:{free_port()}",
            "apns_listen": f"127.0.0.1:{free_port()}"}  # fmt: skip
    keyed = parse(
        {**base, "kinesis_listen": f"127.0.0.1:{listen}", "kinesis_upstream": their_kinesis}, "t"
    )
    with Stack(tmp_path / "with", target=keyed) as stack:
        assert stack.info.parts["kinesis-proxy"].port == listen
        health = httpx.get(f"http://127.0.0.1:{listen}/_proxy/health").json()
        assert health["upstream"] == their_kinesis
        targets = _chaos_targets(stack, stack.info)
        assert targets.kinesis_proxy_url == f"http://127.0.0.1:{listen}"
        make_fault("kinesis-shard-hold").start(targets, None)
        assert len(_active_holds(targets.kinesis_proxy_url)) == 1
    with Stack(tmp_path / "without", target=parse(base, "t")) as stack:
        assert "kinesis-proxy" not in stack.info.parts
        with pytest.raises(FaultError, match="no Kinesis fault proxy"):
            make_fault("kinesis-shard-hold").start(_chaos_targets(stack, stack.info), None)


def _client(url: str) -> Any:
    import boto3

    return boto3.client(
        "kinesis",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


# -- the reference under the fault ----------------------------------------------------------------


def shard_of(partition_key: str, shards: list[dict[str, Any]]) -> int:
    """The index of the shard Kinesis puts a key on: MD5 of the key, as a 128-bit integer, in
    the shard's hash key range."""
    point = int.from_bytes(hashlib.md5(partition_key.encode()).digest(), "big")
    for index, shard in enumerate(shards):
        key_range = shard["HashKeyRange"]
        if int(key_range["StartingHashKey"]) <= point <= int(key_range["EndingHashKey"]):
            return index
    raise AssertionError(f"no shard holds the hash of {partition_key!r}")


def ids_on(shards_wanted: list[int], shards: list[dict[str, Any]]) -> list[str]:
    """ULIDs one millisecond apart or more, in time order from now on, the n-th one's own
    hash landing on ``shards_wanted[n]``."""
    ids: list[str] = []
    at_ms = int(time.time() * 1000)
    for _ in range(10_000):  # bounded: half of all ids land on each of two shards
        if len(ids) == len(shards_wanted):
            return ids
        at_ms += 1
        candidate = str(ULID.from_timestamp(at_ms))  # an int: milliseconds
        if shard_of(candidate, shards) == shards_wanted[len(ids)]:
            ids.append(candidate)
    raise AssertionError(f"no ULIDs for shards {shards_wanted} in 10,000 tries")


def name_on(shard: int, tenant: str, prefix: str, shards: list[dict[str, Any]]) -> str:
    """A user id whose ``tenant#user`` key (the design's partition key) lands on ``shard``."""
    for n in range(1000):
        if shard_of(f"{tenant}#{prefix}{n}", shards) == shard:
            return f"{prefix}{n}"
    raise AssertionError(f"no {prefix} id for shard {shard}")


def out_of_order(visible: set[str], accepted_in_order: list[str]) -> list[tuple[str, str]]:
    """(later post seen, earlier post of the same author not seen): per-author disorder."""
    return [
        (later, earlier)
        for i, later in enumerate(accepted_in_order)
        if later in visible
        for earlier in accepted_in_order[:i]
        if earlier not in visible
    ]


@pytest.mark.parametrize("defect", [True, False], ids=["partition_key_per_event", "reference"])
def test_a_held_shard_shows_disorder_only_when_one_author_spans_shards(tmp_path, defect):
    overrides = {"defects": ["partition_key_per_event"]} if defect else {}
    parts = ["redis", "dynamodb", "kinesis", "kinesis-proxy", "sqs", "event-api", "fanout-worker"]
    with Stack(tmp_path, parts=parts, reference_overrides=overrides) as stack:
        info = stack.info
        config = Config.load(info.reference_config)
        shards = info.aws_client("kinesis").list_shards(StreamName=config.stream_name)["Shards"]
        assert len(shards) == 2
        tenant = f"ord-{uuid.uuid4().hex[:8]}"
        # The author's own key lands on the held shard, the witness's on the flowing one; event
        # ids chosen the same way, so that with the defect (key = event id) the author's first
        # post is held and the second is not.
        flowing = 1 - HELD_SHARD
        author = name_on(HELD_SHARD, tenant, "author", shards)
        witness = name_on(flowing, tenant, "witness", shards)
        first, second, witness_post = ids_on([HELD_SHARD, flowing, flowing], shards)
        api = httpx.Client(base_url=info.url("event-api"), timeout=10)
        for followed in (author, witness):
            api.post(
                f"/v1/tenants/{tenant}/users/{followed}/followers:batch",
                json={"followers": ["reader"]},
            ).raise_for_status()

        def post(user: str, event_id: str) -> None:
            response = api.post(
                "/v1/events",
                json={"tenant_id": tenant, "author_id": user, "kind": "post", "object_id": "o",
                      "event_id": event_id},
            )  # fmt: skip
            assert response.status_code == 202, response.text

        def inbox() -> list[str]:
            response = api.get(f"/v1/tenants/{tenant}/users/reader/inbox", params={"limit": 50})
            assert response.status_code == 200, response.text
            return [item["notification_id"] for item in response.json()["items"]]

        history = History()
        targets = ChaosTargets(kinesis_proxy_url=info.parts["kinesis-proxy"].url)
        hold = make_fault("kinesis-shard-hold", {"shard": HELD_SHARD, "stream": config.stream_name})
        hold.start(targets, history)
        try:
            post(author, first)
            post(author, second)
            post(witness, witness_post)
            # The flowing shard has fanned out everything put on it before the witness's post.
            wait_until(lambda: witness_post in inbox(), 30, "the witness's post in the inbox")
            seen = set(inbox())
            disorder = out_of_order(seen, [first, second])
            if defect:
                # The author's later post is visible while the earlier one is not.
                assert disorder == [(second, first)], (seen, first, second)
            else:
                # Both wait together on the held shard: nothing out of order.
                assert disorder == [] and not {first, second} & seen, seen
            (window,) = _active_holds(targets.kinesis_proxy_url or "")
            assert window["max_held_records"] >= 1  # the proxy really withheld records
        finally:
            hold.stop(targets, history)
        # After the stop every held post arrives, and the inbox is newest first.
        wait_until(lambda: first in inbox() and second in inbox(), 30, "the held posts")
        assert inbox() == [witness_post, second, first]
        phases = [
            json.loads(d)["phase"] for d in history.frame().query("kind == 'fault'")["detail"]
        ]
        assert phases == ["start", "stop"]
