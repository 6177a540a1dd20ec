"""One pipelined round trip per Redis node per phase of an SQS batch, on a single node and on a
local three-master cluster: the consumers' Redis traffic, counted by the servers themselves
(``INFO stats`` ``total_reads_processed``: one read event per pipeline a node receives)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from helpers import TenantClient, apns_token, fcm_token
from redis.backoff import NoBackoff
from redis.retry import Retry
from ulid import ULID

from emulators.ports import LOOPBACK, free_port
from harness.stack.redis_cluster import RedisCluster
from harness.stack.supervisor import Stack, wait_until
from reference_impl.channel_consumer import EmailConsumer
from reference_impl.config import Config
from reference_impl.dead_tokens import DeadTokens
from reference_impl.dedup import (
    DedupStore,
    FallbackDedup,
    claim_from_replies,
    claim_from_set_get,
    set_nx_get_supported,
)
from reference_impl.dedup_key import dedup_key
from reference_impl.event_source import SqsPoller
from reference_impl.ids import device_id
from reference_impl.job_consumer import JobState, rounds
from reference_impl.providers import ProviderGate
from reference_impl.push_consumer import PushConsumer
from reference_impl.rate_limit import WindowDecision, window_decision
from reference_impl.redis_store import Command, LuaScript, pipelined, script_command

CONSENT = {"granted_at": "2026-01-01T00:00:00+00:00", "version": "1"}
BATCH = 10
# Push: cached preferences read, cache fill of the misses, sliding windows, daily caps, dedup
# claims, 'sent' marks. Email: the preferences, the claims and the marks.
PUSH_PHASES = 6
EMAIL_PHASES = 4


# -- pure ------------------------------------------------------------------------------------------


def _batch_reads(consumer, jobs, ports) -> tuple[dict, dict[int, int]]:
    """One batch of ``jobs``, and the reads each server counted while it ran."""
    counter = ReadCounter(ports)
    try:
        result = consumer({"Records": [_record(j) for j in jobs]}, None)
        return result, counter.delta()
    finally:
        counter.close()


def _dead_redis() -> redis.Redis:
    """A store that refuses connections, failing each call at once: redis-py's default retries
    would spend ~4.6 s on every refused call, which the fail-closed logic under test ignores."""
    return redis.Redis(
        host=LOOPBACK, port=free_port(), socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0)
    )


def test_rounds_put_each_repeat_of_a_key_in_a_later_round():
    assert rounds([]) == []
    assert rounds(["a", "b", "c"]) == [[0, 1, 2]]
    assert rounds(["a", "b", "a", "c", "a", "b"]) == [[0, 1, 3], [2, 5], [4]]


def test_a_claim_is_read_from_the_set_and_the_get_of_one_pipeline():
    error = redis.ConnectionError("down")
    assert claim_from_replies(True, b"pending:me") == "won"
    assert claim_from_replies(True, error) == "won"  # the SET alone decided
    assert claim_from_replies(None, b"sent") == "already_sent"
    assert claim_from_replies(None, b"pending:other") == "in_flight"
    assert claim_from_replies(None, None) is None  # the lease expired in between: claim again
    assert claim_from_replies(error, None) is error
    assert claim_from_replies(None, error) is error


def test_the_window_script_reply_becomes_a_decision():
    assert window_decision([1, b"", 0, 0]) == WindowDecision(True)
    assert window_decision([1, b"", 0, 1]) == WindowDecision(True, repeat=True)
    assert window_decision([0, b"1777636800000", 1, 0]) == WindowDecision(
        False, 1_777_636_800_000, opened=True
    )


def test_a_script_command_names_its_sha_and_the_key_that_routes_it():
    script = LuaScript("return 1")
    assert script.sha == hashlib.sha1(b"return 1").hexdigest()
    command = script_command(script, ["{u}:a", "{u}:b"], [5, "x"])
    assert command.args == ("EVALSHA", script.sha, 2, "{u}:a", "{u}:b", 5, "x")
    assert command.route_key == "{u}:a"
    assert script_command(script, [], []).route_key is None


def test_a_job_state_keeps_the_longest_wait_and_the_first_error():
    state = JobState({})
    assert state.open and state.retry_in is None
    state.later(3)
    state.later(1)
    assert state.retry_in == 3
    first, second = ValueError("first"), ValueError("second")
    state.fail(first)
    state.fail(second)
    assert state.error is first and not state.open


# -- servers of their own: nothing else adds to their read counters -----------------------------


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with Stack(tmp_path_factory.mktemp("rt-redis"), parts=["redis"], with_workers=False) as s:
        yield s.info.redis_url


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    with RedisCluster(tmp_path_factory.mktemp("rt-cluster")) as running:
        yield running


class ReadCounter:
    """``total_reads_processed`` of every master, over connections opened before the first
    sample (a connection's handshake is reads too)."""

    def __init__(self, ports: list[int]) -> None:
        self.nodes = {port: redis.Redis(host=LOOPBACK, port=port) for port in ports}
        self.before = self.sample()

    def sample(self) -> dict[int, int]:
        return {
            port: int(client.info("stats")["total_reads_processed"])
            for port, client in self.nodes.items()
        }

    def delta(self) -> dict[int, int]:
        after = self.sample()
        # Each sample's INFO is a read of its own: the second one is not the consumer's.
        return {port: after[port] - self.before[port] - 1 for port in self.nodes}

    def close(self) -> None:
        for client in self.nodes.values():
            client.close()


@pytest.fixture(params=["single-node", "cluster"])
def topology(request, node, cluster) -> Iterator[tuple[Any, list[int]]]:
    if request.param == "cluster":
        client: Any = redis.RedisCluster.from_url(cluster.url)
        ports = [n.port for n in client.get_primaries()]
        assert len(ports) == 3
    else:
        client = redis.Redis.from_url(node)
        ports = [client.connection_pool.connection_kwargs["port"]]
    yield client, ports
    client.close()


def _warm(consumer: Any, jobs: list[dict[str, Any]]) -> None:
    """What a consumer pays once per node, not per batch: the connection's handshake, and a
    fresh node's NOSCRIPT for each script (it is loaded on every node)."""
    assert consumer({"Records": [_record(j) for j in jobs]}, None) == {"batchItemFailures": []}
    client = consumer.redis
    if isinstance(client, redis.RedisCluster):
        client.ping(target_nodes=redis.RedisCluster.PRIMARIES)
    else:
        client.ping()


def _config(stack: Stack, **overrides: Any) -> Config:
    values = json.loads(stack.reference_config().to_json())
    return Config.from_mapping({**values, "audit_bucket": None, **overrides})


def _record(job: dict[str, Any]) -> dict[str, Any]:
    return {
        "messageId": uuid.uuid4().hex,
        "receiptHandle": "not-a-real-handle",
        "body": json.dumps(job),
        "attributes": {"ApproximateReceiveCount": "1"},
        "messageAttributes": {"tenant_id": {"stringValue": job["tenant_id"], "dataType": "String"}},
    }


def _job(tenant: str, user: str, channel: str) -> dict[str, Any]:
    return {
        "tenant_id": tenant, "notification_id": str(ULID()), "recipient_user_id": user,
        "author_id": "author", "kind": "mention", "object_id": "o1", "channel": channel,
    }  # fmt: skip


def _push_users(t: TenantClient, prefix: str, n: int) -> list[str]:
    users = [f"{prefix}{i}" for i in range(n)]
    for i, user in enumerate(users):
        devices = [("apns", apns_token(i, t.tenant + prefix)), ("fcm", fcm_token(i, t.tenant))]
        t.user(user, devices=devices)
    return users


@pytest.mark.integration
def test_a_push_batch_takes_one_round_trip_per_node_per_phase(stack, topology):
    client, ports = topology
    # Every phase runs: both limits on, far above what one batch spends.
    config = _config(stack, rate_limit_per_window=100, daily_limit_per_device_type=100)
    consumer = PushConsumer(config, redis_client=client)
    t = TenantClient(stack)
    try:
        _warm(consumer, [_job(t.tenant, u, "push") for u in _push_users(t, "w", 2)])
        # Users never seen: their preferences miss the cache and are filled.
        jobs = [_job(t.tenant, u, "push") for u in _push_users(t, "u", BATCH)]
        result, reads = _batch_reads(consumer, jobs, ports)
    finally:
        consumer.apns.close()
        consumer.fcm.close()
    assert result == {"batchItemFailures": []}
    sent = [r for r in t.ledger() if r["notification_id"] in {j["notification_id"] for j in jobs}]
    assert len(sent) == 2 * BATCH and {r["status"] for r in sent} == {200}
    # Per job, the same batch took 2 reads for the preferences, 1 window, 2 daily caps, 2 claims
    # and 2 marks: 91 reads on one node.
    assert all(n <= PUSH_PHASES for n in reads.values()), reads
    assert sum(reads.values()) <= PUSH_PHASES * len(ports), reads


@pytest.mark.integration
def test_an_email_batch_takes_one_round_trip_per_node_per_phase(stack, topology):
    client, ports = topology
    consumer = EmailConsumer(_config(stack), redis_client=client)
    t = TenantClient(stack)

    def users(prefix: str, n: int) -> list[str]:
        names = [f"{prefix}{i}" for i in range(n)]
        for user in names:
            body = {
                "zone": "UTC", "quiet_hours": None, "push_consent": CONSENT,
                "email": f"{user}-{t.tenant}@x.example", "email_consent": CONSENT,
            }  # fmt: skip
            t.api.put(
                f"/v1/tenants/{t.tenant}/users/{user}/preferences", json=body
            ).raise_for_status()
        return names

    _warm(consumer, [_job(t.tenant, u, "email") for u in users("w", 2)])
    jobs = [_job(t.tenant, u, "email") for u in users("u", BATCH)]
    result, reads = _batch_reads(consumer, jobs, ports)
    assert result == {"batchItemFailures": []}
    assert all(n <= EMAIL_PHASES for n in reads.values()), reads
    assert sum(reads.values()) <= EMAIL_PHASES * len(ports), reads


# -- the batch primitives on both topologies ----------------------------------------------------


def _keys(n: int) -> list[str]:
    return [dedup_key("tb", str(ULID()), f"u{i}#d") for i in range(n)]


@pytest.mark.integration
def test_pipelined_answers_per_command_and_loads_a_missing_script(topology):
    client, _ = topology
    client.script_flush()  # every primary: as after a failover to a fresh node
    script = LuaScript("return redis.call('INCR', KEYS[1])")
    key = f"pl:{uuid.uuid4().hex}"
    commands = [
        Command("set", (key, 5)),
        script_command(script, [key], []),
        script_command(script, [key], []),
        Command("execute_command", ("LPUSH", key, "x")),  # the wrong type: this command alone
    ]
    replies = pipelined(client, commands)
    assert replies[:3] == [True, 6, 7] and isinstance(replies[3], redis.ResponseError)
    assert pipelined(client, [script_command(script, [key], []), Command("get", (key,))]) == [
        8,
        b"8",
    ]
    dead = _dead_redis()
    assert all(isinstance(r, redis.ConnectionError) for r in pipelined(dead, commands))


def test_a_set_nx_get_reply_is_a_claim():
    error = redis.ConnectionError("down")
    assert claim_from_set_get(None) == "won"
    assert claim_from_set_get(b"sent") == "already_sent"
    assert claim_from_set_get(b"pending:other") == "in_flight"
    assert claim_from_set_get(error) is error
    assert set_nx_get_supported("7.0.15") and set_nx_get_supported("8.2.1")
    assert not set_nx_get_supported("6.2.14") and not set_nx_get_supported("")


@pytest.mark.integration
@pytest.mark.parametrize("one_command", [True, False], ids=["set-nx-get", "set-nx-then-get"])
def test_dedup_claims_and_settles_a_batch_of_keys(topology, one_command):
    client, _ = topology
    store = DedupStore(client, lease_seconds=30)
    if not one_command:
        store.set_nx_get = False  # a Redis before 7.0
    keys = _keys(30)
    assert store.claim_many(keys, "a") == ["won"] * 30
    assert store.claim_many(keys, "b") == ["in_flight"] * 30
    sent, released, foreign = keys[:10], keys[10:20], keys[20:]
    assert store.settle_many(sent, released, "a") == {}
    assert store.settle_many([], foreign, "b") == {}  # not b's leases: they stay
    assert store.claim_many(keys, "c") == ["already_sent"] * 10 + ["won"] * 10 + ["in_flight"] * 10
    assert all(5 <= client.ttl(k) <= 30 for k in foreign)
    assert store.claim_many([], "c") == [] and store.settle_many([], [], "c") == {}
    assert store.set_nx_get is one_command  # the local servers are Redis 7
    client.delete(*keys)


def _ddb_put(stack: Stack, key: str, state: str, lease_until: float | None = None) -> None:
    item = {"pk": {"S": key}, "state": {"S": state}, "owner": {"S": "x"}}
    if lease_until is not None:
        item["lease_until"] = {"N": f"{lease_until:.3f}"}
    stack.info.aws_client("dynamodb").put_item(TableName="fanout-dedup_fallback", Item=item)


def _fallback(primary: DedupStore, stack: Stack) -> FallbackDedup:
    return FallbackDedup(
        primary, stack.info.aws_client("dynamodb"), "fanout-dedup_fallback", clock=time.time
    )


@pytest.mark.integration
def test_won_claims_are_checked_against_the_fallback_table_in_one_pipeline(stack, topology):
    client, _ = topology
    store = _fallback(DedupStore(client, lease_seconds=30), stack)
    sent_there, leased_there, free = _keys(3)
    _ddb_put(stack, sent_there, "sent")
    _ddb_put(stack, leased_there, "pending", lease_until=time.time() + 60)
    assert store.claim_many([sent_there, leased_there, free], "a") == [
        "already_sent",
        "in_flight",
        "won",
    ]
    # What the fallback decided during the outage stands in Redis too.
    assert client.get(sent_there) == b"sent" and client.get(leased_there) is None
    assert client.get(free) == b"pending:a"


@pytest.mark.integration
def test_a_failed_batch_is_one_error_and_the_third_falls_back_to_dynamodb(stack):
    dead = _dead_redis()
    store = _fallback(DedupStore(dead, lease_seconds=30), stack)
    keys = _keys(5)
    for _ in range(2):  # five keys, one error each time: fail closed, no fallback yet
        claims = store.claim_many(keys, "a")
        assert all(isinstance(c, redis.ConnectionError) for c in claims) and not store.in_fallback
    assert store.claim_many(keys, "a") == ["won"] * 5
    assert store.in_fallback
    assert store.claim_many(keys, "b") == ["in_flight"] * 5  # the fallback's leases
    assert store.settle_many(keys[:2], keys[2:3], "a") == {}
    assert store.claim_many(keys, "b") == ["already_sent"] * 2 + ["won"] + ["in_flight"] * 2


# -- the consumer: a batch's deliveries depend on each other as if one job came after another -----


def _audits(caplog: pytest.LogCaptureFixture, nids: set[str]) -> list[tuple[str, str]]:
    out = []
    for record in caplog.records:
        message = record.getMessage()
        if message.startswith('{"audit"'):
            line = json.loads(message)
            if line["notification_id"] in nids:
                out.append((line["audit"], line["notification_id"]))
    return out


@pytest.fixture
def push(stack) -> Iterator[PushConsumer]:
    consumer = PushConsumer(_config(stack), redis_client=redis.Redis.from_url(stack.info.redis_url))
    yield consumer
    consumer.apns.close()
    consumer.fcm.close()


@pytest.mark.integration
def test_copies_of_one_job_in_a_batch_are_sent_once(stack, push, caplog):
    caplog.set_level(logging.INFO, logger="reference_impl.push_consumer")
    t = TenantClient(stack)
    [user] = _push_users(t, "c", 1)
    job = _job(t.tenant, user, "push")
    records = [_record(job) for _ in range(3)]
    assert push({"Records": records}, None) == {"batchItemFailures": []}
    rows = t.rows_for(job["notification_id"])
    assert sorted(r["status"] for r in rows) == [200, 200]  # its two devices, once each
    outcomes = [a for a, _ in _audits(caplog, {job["notification_id"]})]
    assert sorted(outcomes) == ["deduped"] * 4 + ["sent"] * 2


@pytest.mark.integration
def test_a_token_that_answered_dead_is_not_tried_again_in_the_batch(stack, push, caplog):
    caplog.set_level(logging.INFO, logger="reference_impl.push_consumer")
    t = TenantClient(stack)
    token = apns_token(1, t.tenant)
    t.user("dead", devices=[("apns", token)])
    t.apns.unregister([token])
    jobs = [_job(t.tenant, "dead", "push") for _ in range(2)]
    assert push({"Records": [_record(j) for j in jobs]}, None) == {"batchItemFailures": []}
    assert [r["status"] for r in t.ledger()] == [410]
    assert _audits(caplog, {j["notification_id"] for j in jobs}) == [
        ("dead_token", jobs[0]["notification_id"]),
        ("dead_token", jobs[1]["notification_id"]),
    ]
    reasons = [r.getMessage() for r in caplog.records if '"dead_token"' in r.getMessage()]
    assert ['"Unregistered"' in m for m in reasons] == [True, False]
    assert all('"deactivated"' in m for m in reasons[1:])


@pytest.mark.integration
def test_a_retry_after_pauses_the_rest_of_the_batch(stack, push):
    t = TenantClient(stack)
    tokens = [apns_token(i, t.tenant) for i in range(3)]
    for i, token in enumerate(tokens):
        t.user(f"p{i}", devices=[("apns", token)])
    fault = t.apns.http.post(
        "/_sim/faults",
        json={"fault": "status", "params": {"status": 429, "retry_after": 5, "tokens": tokens[:1]}},
    )
    fault.raise_for_status()
    jobs = [_job(t.tenant, f"p{i}", "push") for i in range(3)]
    try:
        result = push({"Records": [_record(j) for j in jobs]}, None)
    finally:
        t.apns.http.delete(f"/_sim/faults/{fault.json()['id']}").raise_for_status()
    assert len(result["batchItemFailures"]) == 3
    # Claimed with the first, the others were not tried once it answered 429: their leases are
    # back, and they wait out the pause.
    assert [(r["token"], r["status"]) for r in t.ledger()] == [(tokens[0], 429)]
    keys = [
        dedup_key(t.tenant, j["notification_id"], f"p{i}#{device_id(tokens[i])}")
        for i, j in enumerate(jobs)
    ]
    assert push.redis.exists(*keys) == 0
    assert 4 < push.gate.paused_for("apns") <= 5


class _SlotWatch(ProviderGate):
    """A gate that says when a send has asked for its slot (past the first pause check)."""

    def __init__(self) -> None:
        super().__init__(max_in_flight=1)
        self.asked = threading.Event()

    def slot(self, scope: str) -> Any:
        self.asked.set()
        return super().slot(scope)


@pytest.mark.integration
def test_a_pause_that_arrives_while_a_send_waits_for_its_slot_holds_that_send(stack):
    """One slot, held; a send waits for it; another poller's 429 pauses the scope meanwhile:
    once the slot frees, the waiting send must not go out before the pause ends."""
    gate = _SlotWatch()
    consumer = PushConsumer(
        _config(stack), redis_client=redis.Redis.from_url(stack.info.redis_url), gate=gate
    )
    t = TenantClient(stack)
    token = apns_token(9, t.tenant)
    t.user("waits", devices=[("apns", token)])
    state = consumer.new_state(_job(t.tenant, "waits", "push"))
    try:
        consumer.load_preferences([state.job])
        consumer.plan([state])
        [delivery] = state.deliveries
        sender = threading.Thread(target=consumer.send_all, args=([state],), daemon=True)
        with gate.slot(delivery.scope):  # the first send, in flight
            gate.asked.clear()
            sender.start()
            assert gate.asked.wait(10), "the second send never asked for its slot"
            gate.pause(delivery.scope, 30)  # another poller's Retry-After: 30
        sender.join(10)
        assert not sender.is_alive()
    finally:
        consumer.apns.close()
        consumer.fcm.close()
    assert gate.paused_for(delivery.scope) > 0  # the pause is still on: nothing may have gone
    assert [r for r in t.ledger() if r["token"] == token] == []
    assert 29 < (state.retry_in or 0) <= 30  # the job waits the pause out


@pytest.mark.integration
@pytest.mark.parametrize("window", [0, 100])
def test_a_redis_outage_fails_the_batch_closed(stack, window, caplog):
    caplog.set_level(logging.INFO, logger="reference_impl.push_consumer")
    dead = _dead_redis()
    consumer = PushConsumer(_config(stack, rate_limit_per_window=window), redis_client=dead)
    t = TenantClient(stack)
    jobs = [_job(t.tenant, u, "push") for u in _push_users(t, "o", 3)]
    try:
        result = consumer({"Records": [_record(j) for j in jobs]}, None)
    finally:
        consumer.apns.close()
        consumer.fcm.close()
    assert len(result["batchItemFailures"]) == 3
    assert t.ledger() == []  # no send without a dedup decision
    nids = {j["notification_id"] for j in jobs}
    assert sorted(_audits(caplog, nids)) == sorted(("dedup_unavailable", n) for n in nids)


@pytest.mark.integration
def test_with_the_fallback_the_third_failed_batch_is_decided_in_dynamodb(stack, caplog):
    caplog.set_level(logging.INFO, logger="reference_impl.push_consumer")
    dead = _dead_redis()
    consumer = PushConsumer(_config(stack, dedup_fallback=True), redis_client=dead)
    t = TenantClient(stack)
    jobs = [_job(t.tenant, u, "push") for u in _push_users(t, "f", 3)]
    records = [_record(j) for j in jobs]
    try:
        for _ in range(2):
            assert len(consumer({"Records": records}, None)["batchItemFailures"]) == 3
            assert t.ledger() == []
        assert consumer({"Records": records}, None) == {"batchItemFailures": []}
        assert len(t.ledger()) == 6
        # The fallback table holds the 'sent' marks: the same batch again sends nothing.
        assert consumer({"Records": records}, None) == {"batchItemFailures": []}
        assert len(t.ledger()) == 6
    finally:
        consumer.apns.close()
        consumer.fcm.close()
    outcomes = [a for a, _ in _audits(caplog, {j["notification_id"] for j in jobs})]
    assert outcomes.count("dedup_unavailable") == 6
    assert outcomes.count("sent") == 6 and outcomes.count("deduped") == 6


@pytest.mark.integration
def test_sends_of_a_batch_whose_store_died_are_marked_when_it_returns(stack, tmp_path, caplog):
    """Marks wait for the end of a batch: a store that dies mid-batch leaves all of its sends
    unmarked. The consumer writes them before its next claims, so the redelivered jobs find
    'sent' and are not sent a second time. The sends are audited 'sent' all the same: they
    happened."""
    caplog.set_level(logging.INFO, logger="reference_impl.push_consumer")
    with Stack(tmp_path, parts=["redis"], with_workers=False, durable_redis=True) as store:
        client = redis.Redis.from_url(store.info.redis_url, socket_connect_timeout=0.5)
        consumer = PushConsumer(_config(stack), redis_client=client)
        t = TenantClient(stack)
        tokens = [apns_token(i, t.tenant) for i in range(3)]
        for i, token in enumerate(tokens):
            t.user(f"m{i}", devices=[("apns", token)])
        jobs = [_job(t.tenant, f"m{i}", "push") for i in range(3)]
        records = [_record(j) for j in jobs]
        keys = [
            dedup_key(t.tenant, j["notification_id"], f"m{i}#{device_id(tokens[i])}")
            for i, j in enumerate(jobs)
        ]
        slow = t.apns.http.post(
            "/_sim/faults", json={"fault": "latency", "params": {"ms": 1000, "tokens": tokens}}
        )
        slow.raise_for_status()
        first: dict[str, Any] = {}
        batch = threading.Thread(target=lambda: first.update(consumer({"Records": records}, None)))
        try:
            batch.start()
            wait_until(lambda: len(t.ledger()) >= 1, 10, "the batch's first send")
            store.stop_part("redis")  # the claims are in, the marks are not
            batch.join(30)
            t.apns.http.delete(f"/_sim/faults/{slow.json()['id']}").raise_for_status()
            assert len(first["batchItemFailures"]) == 3 and len(t.ledger()) == 3
            store.start_part("redis")
            # The late marks go in before the redelivered jobs' claims: they find 'sent'.
            assert consumer({"Records": records}, None) == {"batchItemFailures": []}
            assert [client.get(k) for k in keys] == [b"sent"] * 3
        finally:
            consumer.apns.close()
            consumer.fcm.close()
            client.close()
        assert len(t.ledger()) == 3
    outcomes = [a for a, _ in _audits(caplog, {j["notification_id"] for j in jobs})]
    assert outcomes.count("sent") == 3 and outcomes.count("deduped") == 3


def _sent_then_store_lost_past_the_lease(
    store: Stack, t: TenantClient, consumer: PushConsumer, job: dict[str, Any], token: str
) -> None:
    """``consumer`` sends ``job`` (slowed at APNs so that the store can go first), the store
    dies before the batch's 'sent' mark, stays gone past the 1 s lease (durable AOF: the lease
    comes back with it, and runs out on the clock), and comes back."""
    slow = t.apns.http.post(
        "/_sim/faults", json={"fault": "latency", "params": {"ms": 1000, "tokens": [token]}}
    )
    slow.raise_for_status()
    batch = threading.Thread(target=lambda: consumer({"Records": [_record(job)]}, None))
    batch.start()
    wait_until(lambda: len(t.ledger()) >= 1, 10, "the send")
    store.stop_part("redis")
    gone_at = time.monotonic()
    batch.join(30)
    t.apns.http.delete(f"/_sim/faults/{slow.json()['id']}").raise_for_status()
    wait_until(lambda: time.monotonic() > gone_at + 1.5, 5, "the lease to run out")
    store.start_part("redis")


def test_a_mark_refused_for_longer_than_the_lease_is_still_written_before_the_next_claim(
    stack, tmp_path
):
    """The store is gone for longer than the lease: the lease runs out, but the send happened,
    and a later copy of the job (a DLQ redrive) must find the key 'sent', not absent."""
    with Stack(tmp_path, parts=["redis"], with_workers=False, durable_redis=True) as store:
        client = redis.Redis.from_url(store.info.redis_url, socket_connect_timeout=0.5)
        config = dataclasses.replace(_config(stack), dedup_lease_seconds=1)
        consumer = PushConsumer(config, redis_client=client)
        t = TenantClient(stack)
        token = apns_token(0, t.tenant)
        t.user("late0", devices=[("apns", token)])
        job = _job(t.tenant, "late0", "push")
        key = dedup_key(t.tenant, job["notification_id"], f"late0#{device_id(token)}")
        try:
            _sent_then_store_lost_past_the_lease(store, t, consumer, job, token)
            assert consumer({"Records": [_record(job)]}, None) == {"batchItemFailures": []}
            assert client.get(key) == b"sent"
        finally:
            consumer.apns.close()
            consumer.fcm.close()
            client.close()
        assert len(t.ledger()) == 1


def test_an_idle_poller_writes_the_marks_its_dead_store_refused_before_another_takes_the_job(
    stack, tmp_path
):
    """The job's next copy goes to another consumer (another poller, another process) after
    the lease ran out: the first one's refused 'sent' mark must be in by then, written by its
    poller between batches (an empty receive), not at that consumer's next batch."""
    with Stack(tmp_path, parts=["redis"], with_workers=False, durable_redis=True) as store:
        client = redis.Redis.from_url(store.info.redis_url, socket_connect_timeout=0.5)
        config = dataclasses.replace(_config(stack), dedup_lease_seconds=1)
        consumer = PushConsumer(config, redis_client=client)
        other = PushConsumer(config, redis_client=client)
        t = TenantClient(stack)
        token = apns_token(0, t.tenant)
        t.user("idle0", devices=[("apns", token)])
        job = _job(t.tenant, "idle0", "push")
        key = dedup_key(t.tenant, job["notification_id"], f"idle0#{device_id(token)}")
        sqs = stack.info.aws_client("sqs")
        empty = sqs.create_queue(QueueName=f"idle-{uuid.uuid4().hex[:8]}")["QueueUrl"]
        poller = SqsPoller(sqs, empty, "arn:aws:sqs:us-east-1:000000000000:idle", consumer, "t")
        try:
            _sent_then_store_lost_past_the_lease(store, t, consumer, job, token)
            assert poller.poll_once() == 0  # an empty receive: the idle consumer's marks go in
            assert client.get(key) == b"sent"
            assert other({"Records": [_record(job)]}, None) == {"batchItemFailures": []}
        finally:
            for c in (consumer, other):
                c.apns.close()
                c.fcm.close()
            client.close()
        assert len(t.ledger()) == 1


class CallLog:
    """A client whose every method call is named in ``calls`` on its way to the real one."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return attr(*args, **kwargs)

        return call


@pytest.mark.integration
def test_a_push_batch_reads_its_users_records_in_one_dynamodb_call(stack, node):
    """Cache misses included: the preferences come from the same BatchGetItem as the devices
    (and the audit keys), never from a GetItem per recipient."""
    config = _config(stack, audit_bucket="fanout-audit")
    consumer = PushConsumer(config, redis_client=redis.Redis.from_url(node))
    log = CallLog(consumer.ddb)
    consumer.ddb = log
    assert consumer.audit_keys is not None
    consumer.audit_keys.ddb = log
    t = TenantClient(stack)
    try:
        jobs = [_job(t.tenant, u, "push") for u in _push_users(t, "r", BATCH)]
        cold = consumer({"Records": [_record(j) for j in jobs]}, None)
        cold_calls, log.calls = log.calls, []
        again = [_job(t.tenant, j["recipient_user_id"], "push") for j in jobs]
        warm = consumer({"Records": [_record(j) for j in again]}, None)
    finally:
        consumer.apns.close()
        consumer.fcm.close()
        if consumer.audit_sink is not None:
            consumer.audit_sink.close()
    assert cold == warm == {"batchItemFailures": []}
    # The first notification creates no audit key: the Event API made them at registration.
    assert cold_calls == ["batch_get_item"]
    assert log.calls == ["batch_get_item"]  # cached preferences: the devices and keys only
    sent = [r for r in t.ledger() if r["status"] == 200]
    assert len(sent) == 2 * 2 * BATCH


@pytest.mark.integration
@pytest.mark.parametrize("shared", [True, False], ids=["shared", "each-its-own"])
def test_a_token_dead_for_one_poller_is_not_tried_by_another_that_read_it_before(
    stack, node, shared
):
    """Poller B read the user's record (device active), then poller A's send got the dead
    answer: B's send that follows is one the token must never get, unless B could not know."""
    config = _config(stack)
    registry = DeadTokens()
    first = PushConsumer(config, redis_client=redis.Redis.from_url(node), dead_tokens=registry)
    second = PushConsumer(
        config,
        redis_client=redis.Redis.from_url(node),
        dead_tokens=registry if shared else DeadTokens(),
    )
    t = TenantClient(stack)
    token = apns_token(7, t.tenant)
    t.user("gone", devices=[("apns", token)])
    t.apns.unregister([token])
    try:
        later = second.new_state(_job(t.tenant, "gone", "push"))
        second.load_preferences([later.job])
        second.plan([later])  # the record read: the device is still active
        assert [d.recipient for d in later.deliveries] == [f"gone#{device_id(token)}"]
        assert first({"Records": [_record(_job(t.tenant, "gone", "push"))]}, None) == {
            "batchItemFailures": []
        }
        second.send_all([later])
    finally:
        for consumer in (first, second):
            consumer.apns.close()
            consumer.fcm.close()
    tried = [r for r in t.ledger() if r["token"] == token]
    assert [r["status"] for r in tried] == ([410] if shared else [410, 410])


@pytest.mark.integration
def test_a_device_registered_again_after_its_dead_answer_is_tried_at_once(stack, node):
    """The app installed again: the token answers again and the device registers again (a new
    registered_at) seconds after the dead answer. The pollers' shared memory of dead answers
    (a minute) holds for the old registration only: the next notification is sent."""
    config = _config(stack)
    registry = DeadTokens()
    first = PushConsumer(config, redis_client=redis.Redis.from_url(node), dead_tokens=registry)
    second = PushConsumer(config, redis_client=redis.Redis.from_url(node), dead_tokens=registry)
    t = TenantClient(stack)
    token = apns_token(8, t.tenant)
    t.user("back", devices=[("apns", token)])
    t.apns.unregister([token])
    try:
        assert first({"Records": [_record(_job(t.tenant, "back", "push"))]}, None) == {
            "batchItemFailures": []
        }
        t.apns.revive([token])
        t.user("back", devices=[("apns", token)])
        assert second({"Records": [_record(_job(t.tenant, "back", "push"))]}, None) == {
            "batchItemFailures": []
        }
    finally:
        for consumer in (first, second):
            consumer.apns.close()
            consumer.fcm.close()
    tried = [r for r in t.ledger() if r["token"] == token]
    assert [r["status"] for r in tried] == [410, 200]


@pytest.mark.integration
def test_publish_notes_a_dead_store_refused_are_written_when_it_answers_again(stack, push):
    """A publish SNS accepted while the store was down must still be findable by its
    delivery-failure event once the store is back (a game-day run lost a dead token's audit
    record this way): the refused notes are kept and written with the next round."""
    from reference_impl import push_consumer as module
    from reference_impl.push_consumer import SENT_MEMORY_SECONDS, sent_key

    live = push.redis
    message_id = uuid.uuid4().hex
    body = json.dumps({"job": {}, "device": {}})
    note = Command("set", (sent_key(message_id), body), (("ex", SENT_MEMORY_SECONDS),))
    try:
        push.redis = _dead_redis()
        push._sent_notes.append(note)
        push.remember_sent()
        assert live.get(sent_key(message_id)) is None
        assert len(module._REFUSED_NOTES) == 1
        push.redis = live
        push.remember_sent()  # the next round, with nothing of its own to note
        assert live.get(sent_key(message_id)) is not None
        assert module._REFUSED_NOTES == []
    finally:
        push.redis = live
        module._REFUSED_NOTES.clear()
