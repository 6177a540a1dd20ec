"""Unit tests of the SQS model: an injected clock and RNG, no I/O, no sleeps."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from moto.sqs.models import Message as MotoMessage

from emulators.sqs import model as sqs_model
from emulators.sqs.model import (
    SendEntry,
    SqsError,
    SqsModel,
    decode_receipt_handle,
    md5_of_attributes,
    md5_of_body,
)


class FakeClock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Hooks:
    def __init__(self) -> None:
        self.dup = False
        self.expire = False
        self.lose = False
        self.fail = False

    def duplicate(self, queue: str) -> bool:
        return self.dup

    def expire_on_receive(self, queue: str) -> bool:
        return self.expire

    def lose_delete(self, queue: str) -> bool:
        return self.lose

    def fail_entry(self, queue: str) -> bool:
        return self.fail


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def hooks() -> Hooks:
    return Hooks()


@pytest.fixture
def sqs(clock: FakeClock, hooks: Hooks) -> SqsModel:
    return SqsModel(clock=clock, rng=random.Random(7), hooks=hooks)


def send(sqs: SqsModel, queue: str, body: str = "b", **kw: Any) -> str:
    return sqs.send_message(queue, SendEntry("", body, **kw)).id


def counts(sqs: SqsModel, queue: str) -> tuple[int, int, int]:
    attrs = sqs.queue_attributes(queue, ["All"])
    return (
        int(attrs["ApproximateNumberOfMessages"]),
        int(attrs["ApproximateNumberOfMessagesNotVisible"]),
        int(attrs["ApproximateNumberOfMessagesDelayed"]),
    )


# -- MD5 ---------------------------------------------------------------------------------------
S1 = {"attribName1": {"DataType": "String", "StringValue": "attribValue 1"}}
N1 = {
    "customNumberTypeAttrib": {
        "DataType": "Number.float",
        "StringValue": "4563442423554324324264524243.32543234",
    }
}
B1 = {"binaryAttribute": {"DataType": "Binary", "BinaryValue": b"Hello binary world!"}}


@pytest.mark.parametrize(
    "attrs, expected",
    [
        (S1, "19e27d4e946b072f3f58da80d94fd778"),
        (N1, "9fe1b90bbd9965bdf77bac517c7d2495"),
        (B1, "31a92b15d92f8db860eda32aceb656c3"),
        ({**S1, **N1, **B1}, "c932db14a896c663f83c260297d594ff"),
    ],
)
def test_md5_of_attributes_published_vectors(attrs: dict, expected: str) -> None:
    # Vectors published with the npm package aws-md5-of-message-attributes.
    assert md5_of_attributes(attrs) == expected


def test_md5_of_body_and_no_attributes() -> None:
    assert md5_of_body("hi") == "49f68a5c8493ec2c0bf489821c21fc3b"
    assert md5_of_attributes({}) is None


attr_names = st.from_regex(r"[A-Za-z0-9_-]{1,12}", fullmatch=True)
attr_values = st.one_of(
    st.builds(
        lambda t, v: {"DataType": t, "StringValue": v},
        st.sampled_from(["String", "Number", "String.custom"]),
        st.text(min_size=1, max_size=20).filter(lambda s: "\x00" not in s),
    ),
    st.builds(lambda v: {"DataType": "Binary", "BinaryValue": v}, st.binary(min_size=1)),
)


@given(st.dictionaries(attr_names, attr_values, min_size=1, max_size=10))
def test_md5_of_attributes_agrees_with_moto(attrs: dict) -> None:
    moto = MotoMessage("id", "body")
    moto.message_attributes = attrs
    assert md5_of_attributes(attrs) == moto.attribute_md5


# -- send / receive / delete -------------------------------------------------------------------
def test_send_receive_delete(sqs: SqsModel) -> None:
    sqs.create_queue("q")
    mid = send(sqs, "q", "hello")
    assert counts(sqs, "q") == (1, 0, 0)
    [got] = sqs.receive_message("q", 10)
    assert got.message.id == mid and got.message.receive_count == 1
    assert counts(sqs, "q") == (0, 1, 0)
    sqs.delete_message("q", got.receipt_handle)
    assert counts(sqs, "q") == (0, 0, 0)
    assert sqs.receive_message("q", 10) == []


def test_visibility_timeout_redelivers_with_rising_receive_count(
    sqs: SqsModel, clock: FakeClock
) -> None:
    sqs.create_queue("q", {"VisibilityTimeout": "5"})
    send(sqs, "q")
    first = sqs.receive_message("q")[0]
    first_ts = first.message.first_received_at
    clock.advance(4.9)
    assert sqs.receive_message("q") == []
    assert sqs.queue("q").next_due() == pytest.approx(clock.now + 0.1)
    clock.advance(0.1)
    second = sqs.receive_message("q")[0]
    assert second.message.receive_count == 2
    assert second.message.first_received_at == first_ts
    assert second.receipt_handle != first.receipt_handle
    # The old receipt handle is stale: deleting with it succeeds without effect.
    sqs.delete_message("q", first.receipt_handle)
    assert counts(sqs, "q") == (0, 1, 0)
    sqs.delete_message("q", second.receipt_handle)
    assert counts(sqs, "q") == (0, 0, 0)


def test_receive_visibility_override_and_change_visibility(sqs: SqsModel, clock: FakeClock) -> None:
    sqs.create_queue("q")
    send(sqs, "q")
    got = sqs.receive_message("q", visibility_timeout=100)[0]
    sqs.change_message_visibility("q", got.receipt_handle, 2)
    clock.advance(2)
    again = sqs.receive_message("q")[0]
    assert again.message.receive_count == 2
    sqs.change_message_visibility("q", again.receipt_handle, 0)
    assert counts(sqs, "q") == (1, 0, 0)
    with pytest.raises(SqsError) as err:
        sqs.change_message_visibility("q", again.receipt_handle, 5)
    assert err.value.shape == "MessageNotInflight"
    third = sqs.receive_message("q")[0]
    with pytest.raises(SqsError) as err:
        sqs.change_message_visibility("q", again.receipt_handle, 5)  # stale handle
    assert err.value.code == "InvalidParameterValue"
    sqs.delete_message("q", third.receipt_handle)
    with pytest.raises(SqsError) as err:
        sqs.change_message_visibility("q", third.receipt_handle, 5)  # deleted message
    assert err.value.code == "InvalidParameterValue"


def test_delay_seconds(sqs: SqsModel, clock: FakeClock) -> None:
    sqs.create_queue("q", {"DelaySeconds": "10"})
    send(sqs, "q", "queue-delay")
    send(sqs, "q", "no-delay", delay_seconds=0)
    send(sqs, "q", "short", delay_seconds=3)
    assert counts(sqs, "q") == (1, 0, 2)
    assert [r.message.body for r in sqs.receive_message("q", 10)] == ["no-delay"]
    clock.advance(3)
    assert [r.message.body for r in sqs.receive_message("q", 10)] == ["short"]
    clock.advance(7)
    assert [r.message.body for r in sqs.receive_message("q", 10)] == ["queue-delay"]


def test_retention_expires_messages(sqs: SqsModel, clock: FakeClock) -> None:
    sqs.create_queue("q", {"MessageRetentionPeriod": "60"})
    send(sqs, "q")
    sqs.receive_message("q")  # in flight when it expires
    send(sqs, "q")
    clock.advance(60)
    assert counts(sqs, "q") == (0, 0, 0)
    assert len(sqs.queue("q").messages) == 0


def test_receive_returns_at_most_max_and_each_message_once(sqs: SqsModel) -> None:
    sqs.create_queue("q")
    ids = {send(sqs, "q", str(i)) for i in range(25)}
    seen: list[str] = []
    for _ in range(3):
        seen += [r.message.id for r in sqs.receive_message("q", 10)]
    assert len(seen) == 25 and set(seen) == ids


def test_batches(sqs: SqsModel) -> None:
    sqs.create_queue("q", {"MaximumMessageSize": "1024"})
    ok, failed = sqs.send_message_batch(
        "q", [SendEntry("a", "x"), SendEntry("b", "y" * 1025), SendEntry("c", "z")]
    )
    assert [i for i, _ in ok] == ["a", "c"]
    assert [(i, e.code) for i, e in failed] == [("b", "InvalidParameterValue")]
    got = sqs.receive_message("q", 10)
    ok_ids, failed = sqs.delete_message_batch(
        "q",
        [{"Id": "1", "ReceiptHandle": got[0].receipt_handle}, {"Id": "2", "ReceiptHandle": "junk"}],
    )
    assert ok_ids == ["1"] and failed[0][1].shape == "ReceiptHandleIsInvalid"
    for entries, shape in [
        ([], "EmptyBatchRequest"),
        ([SendEntry(str(i), "x") for i in range(11)], "TooManyEntriesInBatchRequest"),
        ([SendEntry("a", "x"), SendEntry("a", "y")], "BatchEntryIdsNotDistinct"),
        ([SendEntry("a b", "x")], "InvalidBatchEntryId"),
    ]:
        with pytest.raises(SqsError) as err:
            sqs.send_message_batch("q", entries)
        assert err.value.shape == shape


def test_batch_request_too_long(sqs: SqsModel) -> None:
    sqs.create_queue("q")
    entries = [SendEntry(str(i), "x" * 200_000) for i in range(6)]
    with pytest.raises(SqsError) as err:
        sqs.send_message_batch("q", entries)
    assert err.value.shape == "BatchRequestTooLong"


def test_message_validation(sqs: SqsModel) -> None:
    sqs.create_queue("q")
    cases = [
        (SendEntry("", ""), "MissingParameter"),
        (SendEntry("", "a\x00b"), "InvalidMessageContents"),
        (SendEntry("", "x", attributes={"AWS.x": {"DataType": "String", "StringValue": "v"}}),
         "InvalidParameterValue"),
        (SendEntry("", "x", attributes={"a": {"DataType": "Blob", "StringValue": "v"}}),
         "InvalidParameterValue"),
        (SendEntry("", "x", attributes={"a": {"DataType": "String"}}), "InvalidParameterValue"),
        (SendEntry("", "x", delay_seconds=901), "InvalidParameterValue"),
    ]  # fmt: skip
    for entry, code in cases:
        with pytest.raises(SqsError) as err:
            sqs.send_message("q", entry)
        assert err.value.code == code, entry


def test_receive_parameter_ranges(sqs: SqsModel) -> None:
    sqs.create_queue("q")
    for kwargs in ({"max_messages": 11}, {"wait_seconds": 21}, {"visibility_timeout": 43201}):
        with pytest.raises(SqsError) as err:
            sqs.receive_message("q", **kwargs)
        assert err.value.code == "InvalidParameterValue"


def test_in_flight_limit(sqs: SqsModel, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqs_model, "MAX_INFLIGHT", 3)
    sqs.create_queue("q")
    for _ in range(5):
        send(sqs, "q")
    assert len(sqs.receive_message("q", 3)) == 3
    with pytest.raises(SqsError) as err:
        sqs.receive_message("q")
    assert err.value.shape == "OverLimit" and err.value.status == 403


# -- queues ------------------------------------------------------------------------------------
def test_queue_errors(sqs: SqsModel, clock: FakeClock) -> None:
    with pytest.raises(SqsError) as err:
        sqs.queue("nope")
    assert err.value.code == "AWS.SimpleQueueService.NonExistentQueue"
    sqs.create_queue("q", {"VisibilityTimeout": "5"})
    assert sqs.create_queue("q", {"VisibilityTimeout": "5"}).name == "q"
    with pytest.raises(SqsError) as err:
        sqs.create_queue("q", {"VisibilityTimeout": "6"})
    assert (err.value.shape, err.value.code) == ("QueueNameExists", "QueueAlreadyExists")
    for attrs, shape in [
        ({"Bogus": "1"}, "InvalidAttributeName"),
        ({"VisibilityTimeout": "43201"}, "InvalidAttributeValue"),
        ({"MaximumMessageSize": "100"}, "InvalidAttributeValue"),
        ({"ApproximateNumberOfMessages": "1"}, "InvalidAttributeName"),
    ]:
        with pytest.raises(SqsError) as err:
            sqs.set_queue_attributes("q", attrs)
        assert err.value.shape == shape
    with pytest.raises(SqsError) as err:
        sqs.queue_attributes("q", ["Bogus"])
    assert err.value.shape == "InvalidAttributeName"
    with pytest.raises(SqsError):
        sqs.create_queue("bad name")
    sqs.delete_queue("q")
    with pytest.raises(SqsError) as err:
        sqs.create_queue("q")
    assert err.value.shape == "QueueDeletedRecently"
    clock.advance(60)
    sqs.create_queue("q")


def test_purge_once_per_minute(sqs: SqsModel, clock: FakeClock) -> None:
    sqs.create_queue("q")
    send(sqs, "q")
    sqs.purge_queue("q")
    assert counts(sqs, "q") == (0, 0, 0)
    with pytest.raises(SqsError) as err:
        sqs.purge_queue("q")
    assert err.value.shape == "PurgeQueueInProgress" and err.value.status == 403
    clock.advance(60)
    sqs.purge_queue("q")


def test_list_queues_pages(sqs: SqsModel) -> None:
    for name in ("a1", "a2", "a3", "b1"):
        sqs.create_queue(name)
    assert sqs.list_queues("a")[0] == ["a1", "a2", "a3"]
    page, token = sqs.list_queues("a", 2)
    assert page == ["a1", "a2"] and token
    assert sqs.list_queues("a", 2, token) == (["a3"], None)


# -- dead-letter queues and redrive ------------------------------------------------------------
def redrive(dlq: str, count: int) -> str:
    return json.dumps(
        {
            "deadLetterTargetArn": f"arn:aws:sqs:us-east-1:000000000000:{dlq}",
            "maxReceiveCount": count,
        }
    )


def test_dead_letter_after_max_receive_count_and_redrive(sqs: SqsModel) -> None:
    sqs.create_queue("dlq")
    sqs.create_queue("src", {"RedrivePolicy": redrive("dlq", 2)})
    mid = send(sqs, "src")
    for expected in (1, 2):
        [got] = sqs.receive_message("src", visibility_timeout=0)
        assert got.message.receive_count == expected
    assert sqs.receive_message("src") == []  # third receive: moved to the DLQ instead
    [dead] = sqs.receive_message("dlq", visibility_timeout=0)
    assert dead.message.id == mid
    assert dead.message.system_attribute_values(["DeadLetterQueueSourceArn"]) == {
        "DeadLetterQueueSourceArn": "arn:aws:sqs:us-east-1:000000000000:src"
    }
    assert sqs.dead_letter_source_queues("dlq") == ["src"]

    arn = "arn:aws:sqs:us-east-1:000000000000:dlq"
    sqs.start_message_move_task(arn)
    assert sqs.step_move_tasks() is False
    [task] = sqs.list_message_move_tasks(arn)
    assert task["Status"] == "COMPLETED" and task["ApproximateNumberOfMessagesMoved"] == 1
    [back] = sqs.receive_message("src")
    assert back.message.id == mid and back.message.receive_count == 1


def test_move_task_rate_and_errors(sqs: SqsModel, clock: FakeClock) -> None:
    sqs.create_queue("dlq")
    sqs.create_queue("src", {"RedrivePolicy": redrive("dlq", 1)})
    sqs.create_queue("other")
    for _ in range(10):
        send(sqs, "src")
    for _ in range(2):
        while sqs.receive_message("src", 10, visibility_timeout=0):
            pass
    assert counts(sqs, "dlq") == (10, 0, 0)
    arn = "arn:aws:sqs:us-east-1:000000000000:"
    with pytest.raises(SqsError) as err:
        sqs.start_message_move_task(arn + "missing")
    assert err.value.shape == "ResourceNotFoundException"
    with pytest.raises(SqsError) as err:
        sqs.start_message_move_task(arn + "other")
    assert err.value.code == "InvalidParameterValue"
    handle = sqs.start_message_move_task(arn + "dlq", arn + "other", rate=2)
    with pytest.raises(SqsError) as err:
        sqs.start_message_move_task(arn + "dlq")
    assert err.value.shape == "UnsupportedOperation"
    assert sqs.step_move_tasks() is True
    clock.advance(2)
    sqs.step_move_tasks()
    assert counts(sqs, "other")[0] == 5
    assert sqs.cancel_message_move_task(handle) == 5
    assert sqs.list_message_move_tasks(arn + "dlq")[0]["Status"] == "CANCELLED"


def test_redrive_policy_validation(sqs: SqsModel) -> None:
    sqs.create_queue("dlq", {"RedriveAllowPolicy": json.dumps({"redrivePermission": "denyAll"})})
    for policy in ("not json", redrive("missing", 2), redrive("dlq", 0), redrive("dlq", 3)):
        with pytest.raises(SqsError) as err:
            sqs.create_queue("src", {"RedrivePolicy": policy})
        assert err.value.code == "InvalidParameterValue", policy


# -- fault hooks -------------------------------------------------------------------------------
def test_duplicate_hook_hands_out_twice_and_ghost_handle_does_not_delete(
    sqs: SqsModel, hooks: Hooks
) -> None:
    sqs.create_queue("q")
    mid = send(sqs, "q")
    hooks.dup = True
    [first] = sqs.receive_message("q", 10)
    hooks.dup = False
    sqs.delete_message("q", first.receipt_handle)  # the ghost copy's handle
    [second] = sqs.receive_message("q", 10)
    assert first.message.id == second.message.id == mid
    assert second.message.receive_count == 2
    sqs.delete_message("q", second.receipt_handle)
    assert counts(sqs, "q") == (0, 0, 0)


def test_expire_and_lost_delete_hooks(sqs: SqsModel, hooks: Hooks, clock: FakeClock) -> None:
    sqs.create_queue("q", {"VisibilityTimeout": "30"})
    send(sqs, "q")
    hooks.expire = True
    [first] = sqs.receive_message("q")
    hooks.expire = False
    [second] = sqs.receive_message("q")
    assert second.message.receive_count == 2
    hooks.lose = True
    sqs.delete_message("q", second.receipt_handle)
    hooks.lose = False
    assert counts(sqs, "q") == (0, 1, 0)
    clock.advance(30)
    [third] = sqs.receive_message("q")
    assert third.message.receive_count == 3


def test_force_visibility_expiry(sqs: SqsModel) -> None:
    sqs.create_queue("q")
    for _ in range(20):
        send(sqs, "q")
    sqs.receive_message("q", 10)
    sqs.receive_message("q", 10)
    assert sqs.force_visibility_expiry(["q"], 1.0, random.Random(1)) == 20
    assert counts(sqs, "q") == (20, 0, 0)
    sqs.receive_message("q", 10)
    sqs.receive_message("q", 10)
    chosen = sqs.force_visibility_expiry(None, 0.5, random.Random(1))
    assert 0 < chosen < 20 and counts(sqs, "q") == (chosen, 20 - chosen, 0)


def test_receipt_handles_are_opaque_but_checked(sqs: SqsModel) -> None:
    sqs.create_queue("q")
    sqs.create_queue("r")
    send(sqs, "q")
    [got] = sqs.receive_message("q")
    assert decode_receipt_handle(got.receipt_handle)[0] == "q"
    for bad in ("garbage", "", "AAAA"):
        with pytest.raises(SqsError):
            sqs.delete_message("q", bad)
    with pytest.raises(SqsError) as err:
        sqs.delete_message("r", got.receipt_handle)  # another queue's handle
    assert err.value.shape == "ReceiptHandleIsInvalid"


# -- cost does not grow with depth -------------------------------------------------------------
def test_stale_heap_entries_are_compacted(sqs: SqsModel) -> None:
    sqs.create_queue("q")
    queue = sqs.queue("q")
    for _ in range(500):
        sqs.send_message_batch("q", [SendEntry(str(i), "x") for i in range(10)])
        got = sqs.receive_message("q", 10)
        sqs.delete_message_batch(
            "q", [{"Id": str(i), "ReceiptHandle": r.receipt_handle} for i, r in enumerate(got)]
        )
    assert queue.inflight_count == 0
    assert len(queue.inflight_heap) <= 1024 + 10


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("send"), st.integers(1, 10), st.integers(0, 30)),
        st.tuples(st.just("receive"), st.integers(1, 10), st.integers(0, 30)),
        st.tuples(st.just("delete"), st.integers(0, 10), st.just(0)),
        st.tuples(st.just("visibility"), st.integers(0, 10), st.integers(0, 30)),
        st.tuples(st.just("tick"), st.integers(0, 40), st.just(0)),
    ),
    min_size=1,
    max_size=15,
)
SHALLOW = 200  # more than a sequence can ever receive (15 receives of at most 10)
DEEP = 100_000


def _fill(sqs: SqsModel, name: str, depth: int) -> None:
    sqs.create_queue(name, {"MessageRetentionPeriod": "1209600"})
    for start in range(0, depth, 10):
        sqs.send_message_batch(
            name, [SendEntry(str(i), "m") for i in range(min(10, depth - start))]
        )


def _run(sqs: SqsModel, clock: FakeClock, name: str, ops: list[tuple[str, int, int]]) -> list[int]:
    """Run the sequence; return the structure operations each call performed."""
    queue = sqs.queues[name]
    held: list[str] = []
    per_call: list[int] = []
    for op, n, t in ops:
        before = queue.ops
        if op == "send":
            sqs.send_message_batch(
                name, [SendEntry(str(i), "s", delay_seconds=t) for i in range(n)]
            )
        elif op == "receive":
            held += [r.receipt_handle for r in sqs.receive_message(name, n, visibility_timeout=t)]
        elif op == "delete" and held:
            batch, held = held[:n], held[n:]
            if batch:
                sqs.delete_message_batch(
                    name, [{"Id": str(i), "ReceiptHandle": h} for i, h in enumerate(batch)]
                )
        elif op == "visibility" and held:
            batch = held[:n]
            if batch:
                sqs.change_message_visibility_batch(
                    name,
                    [
                        {"Id": str(i), "ReceiptHandle": h, "VisibilityTimeout": t}
                        for i, h in enumerate(batch)
                    ],
                )
        elif op == "tick":
            clock.advance(t)
            sqs.queue(name)
        per_call.append(queue.ops - before)
    return per_call


@pytest.fixture(scope="module")
def deep() -> tuple[SqsModel, FakeClock]:
    clock = FakeClock()
    sqs = SqsModel(clock=clock, rng=random.Random(3))
    _fill(sqs, "deep", DEEP)
    return sqs, clock


def _settle(sqs: SqsModel, clock: FakeClock, name: str) -> None:
    """Let every in-flight and delayed message of earlier examples become visible again, and
    bring the depth back to DEEP."""
    clock.advance(120)
    queue = sqs.queue(name)
    queue.next_due()
    assert not queue.inflight_heap and not queue.delayed_heap
    while len(queue.visible) < DEEP:  # top up what earlier examples deleted (at the tail)
        sqs.send_message_batch(name, [SendEntry(str(i), "m") for i in range(10)])


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=OPS)
def test_per_call_work_does_not_grow_with_depth(
    deep: tuple[SqsModel, FakeClock], ops: list[tuple[str, int, int]]
) -> None:
    deep_sqs, deep_clock = deep
    _settle(deep_sqs, deep_clock, "deep")
    assert len(deep_sqs.queues["deep"].visible) >= DEEP
    clock = FakeClock(deep_clock.now)
    shallow_sqs = SqsModel(clock=clock, rng=random.Random(3))
    _fill(shallow_sqs, "shallow", SHALLOW)
    shallow_work = _run(shallow_sqs, clock, "shallow", ops)
    deep_work = _run(deep_sqs, deep_clock, "deep", ops)
    # Same calls, same structure operations, whether 200 or 100,000 messages are queued.
    assert deep_work == shallow_work
    # ... and a bounded number of them per call (each one O(1) or O(log in-flight)).
    assert max(deep_work) <= 4 * 10 + 20


def test_redrive_allow_policy_by_queue(sqs: SqsModel) -> None:
    allowed = "arn:aws:sqs:us-east-1:000000000000:allowed"
    policy = {"redrivePermission": "byQueue", "sourceQueueArns": [allowed]}
    sqs.create_queue("dlq", {"RedriveAllowPolicy": json.dumps(policy)})
    sqs.create_queue("allowed", {"RedrivePolicy": redrive("dlq", 3)})
    with pytest.raises(SqsError) as err:
        sqs.create_queue("refused", {"RedrivePolicy": redrive("dlq", 3)})
    assert "does not allow" in err.value.message
