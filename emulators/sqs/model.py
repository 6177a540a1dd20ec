"""SQS Standard and FIFO queues as a pure data model: no I/O, an injected clock and an injected
RNG.

Every call costs O(log n) or better in queue depth, and memory is proportional to the messages
held (plus, for a while, the in-flight entries of messages deleted recently; see below):

* ``Queue.messages``: every message held, an ``OrderedDict`` in send order (retention expiry
  looks only at its head; O(1) removal of any message);
* ``Queue.visible``: the visible messages, an ``OrderedDict`` used as a FIFO with O(1) removal
  from anywhere (Standard queues promise no order; a message that becomes visible again goes to
  the tail);
* ``Queue.inflight_heap`` / ``Queue.delayed_heap``: binary heaps keyed by the time a message
  becomes visible, with lazy deletion (an entry is live while ``entry.gen == message.gen``). A
  heap is rebuilt from its live entries once its stale entries outnumber them (amortised O(1));
* receipt handles encode (queue, message id, token), so finding a message from a handle is a
  dict lookup, and no table of handles is kept.

Semantics follow the SQS Developer Guide and the API reference (service model 2012-11-05):
visibility timeout, ``ApproximateReceiveCount``, delay queues and per-message delays, retention,
dead-letter queues (``RedrivePolicy.maxReceiveCount``: a message received more often than that
moves to the DLQ on its next receive), DLQ redrive with message move tasks, ``PurgeQueue``'s
once-per-60-seconds rule, ``QueueDeletedRecently`` for 60 seconds after ``DeleteQueue``, the
120,000 in-flight limit, and the MD5 digests of bodies and attributes. Errors are
:class:`SqsError` with AWS's error shapes, query-compatible codes and HTTP statuses.

FIFO queues (:class:`Queue` keeps their messages per :class:`Group`): order per message group,
no hand-out from a group while a message of it is in flight, deduplication ids remembered for 5
minutes (per queue or per group), content-based deduplication, sequence numbers,
ReceiveRequestAttemptId, the in-flight limit and the throughput quotas, high-throughput mode.
Also AddPermission/RemovePermission (the policy document SQS builds) and tags. One model is one
account in one region; the protocol keeps one per region.

Fault hooks (:class:`FaultHooks`) let the chaos layer decide, per call, whether a receive hands
out a duplicate, whether a received message's visibility expires at once, and whether a delete
is lost; they are consulted here so the effects stay inside the model's invariants.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import heapq
import itertools
import json
import random
import re
import struct
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

ACCOUNT_ID = "000000000000"
REGION = "us-east-1"
SENDER_ID = "AIDAEXAMPLESQSLOCAL00"
MAX_BATCH_ENTRIES = 10
MAX_RECEIVE = 10
MAX_INFLIGHT = 120_000
MAX_VISIBILITY_TIMEOUT = 43_200
MAX_WAIT_SECONDS = 20
MAX_DELAY_SECONDS = 900
MAX_PAYLOAD = 1_048_576  # the absolute message and batch size limit (1 MiB)
MAX_MESSAGE_ATTRIBUTES = 10
PURGE_INTERVAL = 60.0
DELETED_QUEUE_COOLDOWN = 60.0
MAX_MOVE_RATE = 500
MOVE_TASKS_KEPT = 10
FIFO_SUFFIX = ".fifo"
# The API reference (ChangeMessageVisibility): "For FIFO queues, there can be a maximum of
# 120,000 in flight messages ... If you reach this limit, Amazon SQS returns no error messages"
# (the limit was 20,000 until 2024): a receive at the limit hands out nothing.
FIFO_MAX_INFLIGHT = 120_000
DEDUPLICATION_INTERVAL = 300.0  # FIFO: a deduplication id is remembered for 5 minutes
RECEIVE_ATTEMPT_INTERVAL = 300.0  # FIFO: a ReceiveRequestAttemptId is honoured for 5 minutes
# FIFO throughput quotas (Developer Guide, "Amazon SQS FIFO queue quotas"): 300 calls per second
# per API action and queue (a batch is one call: 3,000 messages per second); in high-throughput
# mode (DeduplicationScope=messageGroup, FifoThroughputLimit=perMessageGroupId) the per-queue
# quota is up to 70,000 per action (the largest regions') and 300 per second per message group.
FIFO_CALLS_PER_SECOND = 300
HIGH_THROUGHPUT_CALLS_PER_SECOND = 70_000
GROUP_CALLS_PER_SECOND = 300
MAX_PERMISSION_ACTIONS = 7
MAX_TAGS = 50
# Actions AddPermission may grant (AddPermission's own and the like are the owner's alone).
PERMISSION_ACTIONS = frozenset(
    {
        "*",
        "SendMessage",
        "ReceiveMessage",
        "DeleteMessage",
        "ChangeMessageVisibility",
        "GetQueueAttributes",
        "GetQueueUrl",
        "ListDeadLetterSourceQueues",
        "PurgeQueue",
        "ListQueueTags",
    }
)
OWNER_ONLY_ACTIONS = frozenset(
    {
        "AddPermission",
        "RemovePermission",
        "CreateQueue",
        "DeleteQueue",
        "SetQueueAttributes",
        "TagQueue",
        "UntagQueue",
        "ListQueues",
    }
)

# name -> (minimum, maximum, default) for the integer queue attributes
INT_ATTRIBUTES: dict[str, tuple[int, int, int]] = {
    "VisibilityTimeout": (0, MAX_VISIBILITY_TIMEOUT, 30),
    "MaximumMessageSize": (1024, MAX_PAYLOAD, MAX_PAYLOAD),
    "MessageRetentionPeriod": (60, 1_209_600, 345_600),
    "DelaySeconds": (0, MAX_DELAY_SECONDS, 0),
    "ReceiveMessageWaitTimeSeconds": (0, MAX_WAIT_SECONDS, 0),
    "KmsDataKeyReusePeriodSeconds": (60, 86_400, 300),
}
STRING_ATTRIBUTES = frozenset(
    {"Policy", "RedrivePolicy", "RedriveAllowPolicy", "KmsMasterKeyId", "SqsManagedSseEnabled"}
)
# FIFO queues only: name -> allowed values (FifoQueue itself is set at creation only)
FIFO_CHOICES: dict[str, tuple[str, ...]] = {
    "ContentBasedDeduplication": ("true", "false"),
    "DeduplicationScope": ("messageGroup", "queue"),
    "FifoThroughputLimit": ("perQueue", "perMessageGroupId"),
}
FIFO_DEFAULTS = {
    "FifoQueue": "true",
    "ContentBasedDeduplication": "false",
    "DeduplicationScope": "queue",
    "FifoThroughputLimit": "perQueue",
}
SETTABLE_ATTRIBUTES = frozenset(INT_ATTRIBUTES) | STRING_ATTRIBUTES
FIFO_ATTRIBUTES = frozenset(
    {"FifoQueue", "ContentBasedDeduplication", "DeduplicationScope", "FifoThroughputLimit"}
)
READ_ONLY_ATTRIBUTES = frozenset(
    {
        "ApproximateNumberOfMessages",
        "ApproximateNumberOfMessagesNotVisible",
        "ApproximateNumberOfMessagesDelayed",
        "CreatedTimestamp",
        "LastModifiedTimestamp",
        "QueueArn",
    }
)
READABLE_ATTRIBUTES = SETTABLE_ATTRIBUTES | READ_ONLY_ATTRIBUTES | FIFO_ATTRIBUTES
SYSTEM_ATTRIBUTE_NAMES = frozenset(
    {
        "All",
        "SenderId",
        "SentTimestamp",
        "ApproximateReceiveCount",
        "ApproximateFirstReceiveTimestamp",
        "SequenceNumber",
        "MessageDeduplicationId",
        "MessageGroupId",
        "AWSTraceHeader",
        "DeadLetterQueueSourceArn",
    }
)

_NO_ATTRIBUTES: dict[str, dict[str, Any]] = {}  # shared by messages without attributes
_QUEUE_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,80}$")
_FIFO_QUEUE_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,75}\.fifo$")
# MessageGroupId, MessageDeduplicationId, ReceiveRequestAttemptId: alphanumerics and
# punctuation, i.e. printable ASCII without the space, up to 128 characters.
_FIFO_TOKEN_RE = re.compile(r"^[!-~]{1,128}$")
_PERMISSION_LABEL_RE = re.compile(r"^[A-Za-z0-9_-]{1,80}$")
_ACCOUNT_ID_RE = re.compile(r"^\d{12}$")
_BATCH_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,80}$")
_ATTRIBUTE_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,256}$")
# Characters SQS refuses in a body or string attribute (W3C XML 1.0 Char production).
_INVALID_CHARS_RE = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")

# ---------------------------------------------------------------------------------------------
# Errors: error shape -> (query-compatible code, HTTP status), from the SQS service model.
# ---------------------------------------------------------------------------------------------
ERROR_SHAPES: dict[str, tuple[str, int]] = {
    "BatchEntryIdsNotDistinct": ("AWS.SimpleQueueService.BatchEntryIdsNotDistinct", 400),
    "BatchRequestTooLong": ("AWS.SimpleQueueService.BatchRequestTooLong", 400),
    "EmptyBatchRequest": ("AWS.SimpleQueueService.EmptyBatchRequest", 400),
    "InvalidAddress": ("InvalidAddress", 404),
    "InvalidAttributeName": ("InvalidAttributeName", 400),
    "InvalidAttributeValue": ("InvalidAttributeValue", 400),
    "InvalidBatchEntryId": ("AWS.SimpleQueueService.InvalidBatchEntryId", 400),
    "InvalidIdFormat": ("InvalidIdFormat", 400),
    "InvalidMessageContents": ("InvalidMessageContents", 400),
    "InvalidSecurity": ("InvalidSecurity", 403),
    "MessageNotInflight": ("AWS.SimpleQueueService.MessageNotInflight", 400),
    "OverLimit": ("OverLimit", 403),
    "PurgeQueueInProgress": ("AWS.SimpleQueueService.PurgeQueueInProgress", 403),
    "QueueDeletedRecently": ("AWS.SimpleQueueService.QueueDeletedRecently", 400),
    "QueueDoesNotExist": ("AWS.SimpleQueueService.NonExistentQueue", 400),
    "QueueNameExists": ("QueueAlreadyExists", 400),
    "ReceiptHandleIsInvalid": ("ReceiptHandleIsInvalid", 404),
    "RequestThrottled": ("RequestThrottled", 400),
    "ResourceNotFoundException": ("ResourceNotFoundException", 404),
    "TooManyEntriesInBatchRequest": ("AWS.SimpleQueueService.TooManyEntriesInBatchRequest", 400),
    "UnsupportedOperation": ("AWS.SimpleQueueService.UnsupportedOperation", 400),
    # Not modelled as shapes, but answered by SQS under these names:
    "InvalidParameterValueException": ("InvalidParameterValue", 400),
    "MissingRequiredParameterException": ("MissingParameter", 400),
    "InternalError": ("InternalError", 500),
}


def queue_arn(name: str, region: str = REGION, account_id: str = ACCOUNT_ID) -> str:
    return f"arn:aws:sqs:{region}:{account_id}:{name}"


class SqsError(Exception):
    """An SQS error: ``shape`` is the JSON ``__type``; ``code`` the query-compatible code."""

    def __init__(self, shape: str, message: str) -> None:
        super().__init__(message)
        self.shape = shape
        self.message = message
        self.code, self.status = ERROR_SHAPES.get(shape, (shape, 400))
        self.sender_fault = self.status < 500

    def __repr__(self) -> str:
        return f"SqsError({self.shape!r}, {self.message!r})"


def invalid_parameter(message: str) -> SqsError:
    return SqsError("InvalidParameterValueException", message)


def missing_parameter(name: str) -> SqsError:
    return SqsError(
        "MissingRequiredParameterException", f"The request must contain the parameter {name}."
    )


def queue_does_not_exist() -> SqsError:
    return SqsError("QueueDoesNotExist", "The specified queue does not exist.")


def receipt_handle_invalid(handle: str) -> SqsError:
    return SqsError(
        "ReceiptHandleIsInvalid",
        f'The input receipt handle "{handle}" is not a valid receipt handle.',
    )


# ---------------------------------------------------------------------------------------------
# MD5 digests (the algorithm the AWS SDKs use to verify MD5OfMessageAttributes)
# ---------------------------------------------------------------------------------------------
def md5_of_body(body: str) -> str:
    return hashlib.md5(body.encode("utf-8"), usedforsecurity=False).hexdigest()


def _length_prefixed(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def md5_of_attributes(attributes: Mapping[str, Mapping[str, Any]]) -> str | None:
    """MD5 of message attributes as SQS computes it; ``None`` when there are none.

    For each attribute, in name order: length-prefixed (4-byte big-endian) name, length-prefixed
    data type, one transport byte (1 for String/Number, 2 for Binary), length-prefixed value
    (UTF-8 of a string, the raw bytes of a binary).
    """
    if not attributes:
        return None
    digest = hashlib.md5(usedforsecurity=False)
    for name in sorted(attributes):
        value = attributes[name]
        data_type = str(value["DataType"])
        digest.update(_length_prefixed(name.encode("utf-8")))
        digest.update(_length_prefixed(data_type.encode("utf-8")))
        if data_type.startswith("Binary"):
            digest.update(b"\x02")
            digest.update(_length_prefixed(bytes(value["BinaryValue"])))
        else:
            digest.update(b"\x01")
            digest.update(_length_prefixed(str(value["StringValue"]).encode("utf-8")))
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------------
# Fault hooks
# ---------------------------------------------------------------------------------------------
class FaultHooks(Protocol):
    def duplicate(self, queue: str) -> bool:
        """A received message also stays visible (it will be handed out again)."""
        ...

    def expire_on_receive(self, queue: str) -> bool:
        """A received message becomes visible again at once (its handle stays valid)."""
        ...

    def lose_delete(self, queue: str) -> bool:
        """A delete answers success but leaves the message in place."""
        ...

    def fail_entry(self, queue: str) -> bool:
        """An entry of a SendMessageBatch fails on its own (the rest of the batch goes in)."""
        ...


class NoFaults:
    def duplicate(self, queue: str) -> bool:
        return False

    def expire_on_receive(self, queue: str) -> bool:
        return False

    def lose_delete(self, queue: str) -> bool:
        return False

    def fail_entry(self, queue: str) -> bool:
        return False


NO_FAULTS = NoFaults()

# ---------------------------------------------------------------------------------------------
# Messages and queues
# ---------------------------------------------------------------------------------------------
VISIBLE = "visible"
INFLIGHT = "inflight"
DELAYED = "delayed"
GONE = "gone"


class Message:
    __slots__ = (
        "id",
        "body",
        "attributes",
        "system_attributes",
        "md5_body",
        "md5_attributes",
        "md5_system",
        "size",
        "sent_at",
        "first_received_at",
        "received_at",
        "receive_count",
        "state",
        "gen",
        "token",
        "dlq_source_arn",
        "group_id",
        "deduplication_id",
        "sequence_number",
    )

    def __init__(
        self,
        message_id: str,
        body: str,
        attributes: dict[str, dict[str, Any]],
        system_attributes: dict[str, dict[str, Any]],
        sent_at: float,
        size: int,
    ) -> None:
        self.id = message_id
        self.body = body
        self.attributes = attributes
        self.system_attributes = system_attributes
        self.md5_body = md5_of_body(body)
        self.md5_attributes = md5_of_attributes(attributes)
        self.md5_system = md5_of_attributes(system_attributes)
        self.size = size
        self.sent_at = sent_at
        self.first_received_at: float | None = None
        self.received_at = 0.0  # the latest receive (a message's visibility ends 12 h after it)
        self.receive_count = 0
        self.state = VISIBLE
        self.gen = 0  # bumped whenever a heap entry for this message goes stale
        self.token = 0  # the current receipt's token (0: never received)
        self.dlq_source_arn: str | None = None
        self.group_id: str | None = None  # FIFO queues, and fair (standard) queues
        self.deduplication_id: str | None = None  # FIFO queues only
        self.sequence_number: str | None = None  # FIFO queues only

    def system_attribute_values(self, names: Iterable[str]) -> dict[str, str]:
        wanted = set(names)
        every = "All" in wanted
        out: dict[str, str] = {}

        def want(name: str) -> bool:
            return every or name in wanted

        if want("SenderId"):
            out["SenderId"] = SENDER_ID
        if want("SentTimestamp"):
            out["SentTimestamp"] = str(int(self.sent_at * 1000))
        if want("ApproximateReceiveCount"):
            out["ApproximateReceiveCount"] = str(self.receive_count)
        if want("ApproximateFirstReceiveTimestamp") and self.first_received_at is not None:
            out["ApproximateFirstReceiveTimestamp"] = str(int(self.first_received_at * 1000))
        if want("AWSTraceHeader") and "AWSTraceHeader" in self.system_attributes:
            out["AWSTraceHeader"] = str(self.system_attributes["AWSTraceHeader"]["StringValue"])
        if want("DeadLetterQueueSourceArn") and self.dlq_source_arn is not None:
            out["DeadLetterQueueSourceArn"] = self.dlq_source_arn
        if want("MessageGroupId") and self.group_id is not None:
            out["MessageGroupId"] = self.group_id
        if want("MessageDeduplicationId") and self.deduplication_id is not None:
            out["MessageDeduplicationId"] = self.deduplication_id
        if want("SequenceNumber") and self.sequence_number is not None:
            out["SequenceNumber"] = self.sequence_number
        return out

    def select_attributes(self, names: Iterable[str]) -> dict[str, dict[str, Any]]:
        """The message attributes a receive asked for: ``All`` or ``.*`` (every one), a name,
        or ``prefix.*`` (every name that starts with ``prefix``: the API reference's "all
        message attributes starting with a prefix, for example bar.*")."""
        names = list(names)
        if not names or not self.attributes:
            return {}
        if "All" in names or ".*" in names:
            return self.attributes
        prefixes = tuple(n[:-2] for n in names if n.endswith(".*"))
        exact = set(names)
        return {
            k: v
            for k, v in self.attributes.items()
            if k in exact or (prefixes and k.startswith(prefixes))
        }


@dataclass
class Received:
    """One message handed out by a receive, with the receipt handle of this delivery."""

    message: Message
    receipt_handle: str


@dataclass
class SendEntry:
    id: str
    body: str
    delay_seconds: int | None = None
    attributes: dict[str, dict[str, Any]] = field(default_factory=dict)
    system_attributes: dict[str, dict[str, Any]] = field(default_factory=dict)
    group_id: str | None = None
    deduplication_id: str | None = None


class Group:
    """One message group of a FIFO queue: its messages in send order, and how many of them are
    in flight (while any is, the group hands out nothing more)."""

    __slots__ = ("messages", "inflight")

    def __init__(self) -> None:
        self.messages: OrderedDict[str, Message] = OrderedDict()
        self.inflight = 0

    def head(self) -> Message | None:
        return next(iter(self.messages.values()), None)


@dataclass
class ReceiveAttempt:
    """A FIFO ReceiveMessage that may be retried with its ReceiveRequestAttemptId."""

    expires_at: float
    handed: list[tuple[Message, int, int]]  # (message, token of that hand-out, its gen)


class RateBucket:
    """A token bucket holding at most one second of calls (the quotas are per second)."""

    __slots__ = ("tokens", "at")

    def __init__(self, rate: int, now: float) -> None:
        self.tokens = float(rate)
        self.at = now

    def refill(self, rate: int, now: float) -> float:
        if now > self.at:
            self.tokens = min(float(rate), self.tokens + (now - self.at) * rate)
            self.at = now
        return self.tokens


class Queue:
    """One queue (Standard or FIFO). Mutated only through :class:`SqsModel`.

    A FIFO queue also keeps its messages per message group (:class:`Group`, send order) and the
    groups that can hand out a message now (``ready``: no message of the group in flight and
    its first message visible), so a receive takes the first ready group in O(1) and a group's
    next message is never handed out while an earlier one is in flight. Every state change
    below keeps ``ready`` current in O(1).
    """

    def __init__(
        self,
        name: str,
        created_at: float,
        arn: str | None = None,
        fifo: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.arn = arn if arn is not None else queue_arn(name)
        self.created_at = created_at
        self.modified_at = created_at
        self.ints: dict[str, int] = {k: v[2] for k, v in INT_ATTRIBUTES.items()}
        self.strings: dict[str, str] = {"SqsManagedSseEnabled": "true"}
        self.redrive: tuple[str, int] | None = None  # (dead-letter target ARN, maxReceiveCount)
        self.tags: dict[str, str] = {}
        self.messages: OrderedDict[str, Message] = OrderedDict()
        self.visible: OrderedDict[str, Message] = OrderedDict()
        self.inflight_heap: list[tuple[float, int, int, Message]] = []
        self.delayed_heap: list[tuple[float, int, int, Message]] = []
        self.inflight_count = 0
        self.delayed_count = 0
        self.stale_inflight = 0
        self.stale_delayed = 0
        self.last_purge: float | None = None
        self._seq = itertools.count()
        # FIFO only: the FIFO attributes, groups, ready groups, deduplication ids (key ->
        # (expires at, message id, sequence number), oldest first), receive attempts.
        self.fifo_attributes: dict[str, str] | None = dict(fifo) if fifo is not None else None
        self.groups: dict[str, Group] = {}
        self.ready: OrderedDict[str, None] = OrderedDict()
        self.dedup: OrderedDict[str, tuple[float, str, str]] = OrderedDict()
        self.attempts: OrderedDict[str, ReceiveAttempt] = OrderedDict()
        self.last_sequence = 0
        # FIFO throughput: a bucket per API action, and per (action, group) in high-throughput
        # mode, least recently used first (idle ones are dropped: memory stays bounded).
        self.rates: dict[str, RateBucket] = {}
        self.group_rates: OrderedDict[tuple[str, str], RateBucket] = OrderedDict()
        #: structure operations performed (dict/heap inserts, removals, pops); for tests
        self.ops = 0

    # -- attributes ---------------------------------------------------------------------------
    @property
    def fifo(self) -> bool:
        return self.fifo_attributes is not None

    @property
    def visibility_timeout(self) -> int:
        return self.ints["VisibilityTimeout"]

    @property
    def max_message_size(self) -> int:
        return self.ints["MaximumMessageSize"]

    @property
    def retention(self) -> int:
        return self.ints["MessageRetentionPeriod"]

    @property
    def delay_seconds(self) -> int:
        return self.ints["DelaySeconds"]

    @property
    def receive_wait_seconds(self) -> int:
        return self.ints["ReceiveMessageWaitTimeSeconds"]

    # -- FIFO groups (each O(1)) --------------------------------------------------------------
    def _refresh_group(self, group_id: str) -> None:
        """Put a group in ``ready`` (at the end) or take it out, as its state says."""
        group = self.groups.get(group_id)
        head = group.head() if group is not None else None
        if group is not None and head is not None and group.inflight == 0 and head.state == VISIBLE:
            if group_id not in self.ready:
                self.ready[group_id] = None
                self.ops += 1
        elif self.ready.pop(group_id, 0) is None:
            self.ops += 1

    @property
    def high_throughput(self) -> bool:
        fifo = self.fifo_attributes
        return fifo is not None and fifo["FifoThroughputLimit"] == "perMessageGroupId"

    def admit(self, action: str, groups: Iterable[str | None], now: float) -> bool:
        """Whether a FIFO call of ``action`` (touching ``groups``) is within the throughput
        quotas; if so it is counted. O(1) per group named, amortised."""
        high = self.high_throughput
        rate = HIGH_THROUGHPUT_CALLS_PER_SECOND if high else FIFO_CALLS_PER_SECOND
        bucket = self.rates.get(action)
        if bucket is None:
            bucket = self.rates[action] = RateBucket(rate, now)
        wanted = [bucket.refill(rate, now)]
        group_buckets: list[RateBucket] = []
        if high:
            group_rates = self.group_rates
            while group_rates:  # drop buckets idle for a second or more (they are full again)
                key, oldest = next(iter(group_rates.items()))
                if now - oldest.at < 1.0:
                    break
                del group_rates[key]
            for group in {g for g in groups if g is not None}:
                key = (action, group)
                gb = group_rates.pop(key, None) or RateBucket(GROUP_CALLS_PER_SECOND, now)
                group_rates[key] = gb  # most recently used last
                wanted.append(gb.refill(GROUP_CALLS_PER_SECOND, now))
                group_buckets.append(gb)
        if min(wanted) < 1.0:
            return False
        bucket.tokens -= 1.0
        for gb in group_buckets:
            gb.tokens -= 1.0
        return True

    def _group_of(self, msg: Message) -> str | None:
        return msg.group_id if self.fifo_attributes is not None else None

    def next_sequence_number(self, now: float) -> str:
        """A 20-digit number, larger than every earlier one of this queue and not consecutive
        (time in microseconds, shifted, plus a counter), as SQS's FIFO sequence numbers are."""
        candidate = (int(now * 1_000_000) << 8) % 10**20
        self.last_sequence = max(self.last_sequence + 1, candidate)
        return f"{self.last_sequence:020d}"

    # -- structure primitives (each O(1) or O(log n)) -----------------------------------------
    def _push(self, heap: list[tuple[float, int, int, Message]], at: float, msg: Message) -> None:
        heapq.heappush(heap, (at, next(self._seq), msg.gen, msg))
        self.ops += 1

    def make_visible(self, msg: Message) -> None:
        msg.state = VISIBLE
        self.visible[msg.id] = msg
        self.ops += 1
        group_id = self._group_of(msg)
        if group_id is not None:
            self._refresh_group(group_id)

    def make_inflight(self, msg: Message, until: float) -> None:
        msg.state = INFLIGHT
        self.inflight_count += 1
        self._push(self.inflight_heap, until, msg)
        group_id = self._group_of(msg)
        if group_id is not None:
            group = self.groups.get(group_id)
            if group is not None:
                group.inflight += 1
            self._refresh_group(group_id)

    def make_delayed(self, msg: Message, until: float) -> None:
        msg.state = DELAYED
        self.delayed_count += 1
        self._push(self.delayed_heap, until, msg)
        group_id = self._group_of(msg)
        if group_id is not None:
            self._refresh_group(group_id)

    def _inflight_ended(self, msg: Message) -> None:
        self.inflight_count -= 1
        group_id = self._group_of(msg)
        if group_id is not None:
            group = self.groups.get(group_id)
            if group is not None:
                group.inflight -= 1

    def leave_state(self, msg: Message) -> None:
        """Take a message out of whatever structure holds it (not out of ``messages``)."""
        if msg.state == VISIBLE:
            if self.visible.pop(msg.id, None) is not None:
                self.ops += 1
        elif msg.state == INFLIGHT:
            self._inflight_ended(msg)
            self.stale_inflight += 1
            msg.gen += 1
        elif msg.state == DELAYED:
            self.delayed_count -= 1
            self.stale_delayed += 1
            msg.gen += 1
        msg.state = GONE

    def forget(self, msg: Message) -> None:
        """Remove a message from the queue altogether."""
        self.leave_state(msg)
        if self.messages.pop(msg.id, None) is not None:
            self.ops += 1
        group_id = self._group_of(msg)
        if group_id is not None:
            group = self.groups.get(group_id)
            if group is not None:
                group.messages.pop(msg.id, None)
                if not group.messages:
                    del self.groups[group_id]
            self._refresh_group(group_id)

    def add(self, msg: Message) -> None:
        self.messages[msg.id] = msg
        self.ops += 1
        group_id = self._group_of(msg)
        if group_id is not None:
            group = self.groups.get(group_id)
            if group is None:
                group = self.groups[group_id] = Group()
            group.messages[msg.id] = msg

    def advance(self, now: float) -> int:
        """Due delayed and in-flight messages become visible, expired ones go. Returns how many
        messages became visible. Each due entry is handled once: amortised O(log n)."""
        became = 0
        heap = self.delayed_heap
        while heap and heap[0][0] <= now:
            _, _, gen, msg = heapq.heappop(heap)
            self.ops += 1
            if msg.gen != gen or msg.state != DELAYED:
                self.stale_delayed -= 1
                continue
            self.delayed_count -= 1
            self.make_visible(msg)
            became += 1
        heap = self.inflight_heap
        while heap and heap[0][0] <= now:
            _, _, gen, msg = heapq.heappop(heap)
            self.ops += 1
            if msg.gen != gen or msg.state != INFLIGHT:
                self.stale_inflight -= 1
                continue
            self._inflight_ended(msg)
            self.make_visible(msg)
            became += 1
        retention = self.retention
        while self.messages:
            msg = next(iter(self.messages.values()))
            if msg.sent_at + retention > now:
                break
            self.forget(msg)
        if self.fifo_attributes is not None:
            self._expire_fifo_records(now)
        self._compact()
        return became

    def _expire_fifo_records(self, now: float) -> None:
        """Drop deduplication ids and receive attempts past their 5 minutes (oldest first)."""
        dedup = self.dedup
        while dedup:
            key, (expires_at, _, _) = next(iter(dedup.items()))
            if expires_at > now:
                break
            del dedup[key]
            self.ops += 1
        attempts = self.attempts
        while attempts:
            key, attempt = next(iter(attempts.items()))
            if attempt.expires_at > now:
                break
            del attempts[key]
            self.ops += 1

    def _compact(self) -> None:
        """Rebuild a heap from its live entries once stale ones outnumber them."""
        if self.stale_inflight > 1024 and self.stale_inflight > self.inflight_count:
            self.inflight_heap = [
                e for e in self.inflight_heap if e[2] == e[3].gen and e[3].state == INFLIGHT
            ]
            heapq.heapify(self.inflight_heap)
            self.stale_inflight = len(self.inflight_heap) - self.inflight_count
        if self.stale_delayed > 1024 and self.stale_delayed > self.delayed_count:
            self.delayed_heap = [
                e for e in self.delayed_heap if e[2] == e[3].gen and e[3].state == DELAYED
            ]
            heapq.heapify(self.delayed_heap)
            self.stale_delayed = len(self.delayed_heap) - self.delayed_count

    def next_due(self) -> float | None:
        """When the next delayed or in-flight message becomes visible (None: none pending)."""
        due: float | None = None
        for heap, state in ((self.delayed_heap, DELAYED), (self.inflight_heap, INFLIGHT)):
            while heap and (heap[0][2] != heap[0][3].gen or heap[0][3].state != state):
                heapq.heappop(heap)
                self.ops += 1
                if state == DELAYED:
                    self.stale_delayed -= 1
                else:
                    self.stale_inflight -= 1
            if heap and (due is None or heap[0][0] < due):
                due = heap[0][0]
        return due

    def clear(self) -> None:
        for msg in self.messages.values():
            msg.state = GONE
        self.messages.clear()
        self.visible.clear()
        self.inflight_heap.clear()
        self.delayed_heap.clear()
        self.inflight_count = self.delayed_count = 0
        self.stale_inflight = self.stale_delayed = 0
        self.groups.clear()
        self.ready.clear()
        self.attempts.clear()


@dataclass
class MoveTask:
    handle: str
    source_arn: str
    destination_arn: str | None
    rate: int | None
    started_at: float
    to_move: int
    moved: int = 0
    status: str = "RUNNING"
    failure_reason: str | None = None

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "Status": self.status,
            "SourceArn": self.source_arn,
            "ApproximateNumberOfMessagesMoved": self.moved,
            "ApproximateNumberOfMessagesToMove": self.to_move,
            "StartedTimestamp": int(self.started_at * 1000),
        }
        if self.status == "RUNNING":
            out["TaskHandle"] = self.handle
        if self.destination_arn is not None:
            out["DestinationArn"] = self.destination_arn
        if self.rate is not None:
            out["MaxNumberOfMessagesPerSecond"] = self.rate
        if self.failure_reason is not None:
            out["FailureReason"] = self.failure_reason
        return out


# ---------------------------------------------------------------------------------------------
# Validation helpers
# ---------------------------------------------------------------------------------------------
def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
        return int(value)
    return None


def _parse_policy(value: str) -> str:
    """A queue policy: a JSON object (kept compact, as SQS returns it)."""
    try:
        policy = json.loads(value)
    except ValueError:
        policy = None
    if not isinstance(policy, dict):
        raise SqsError("InvalidAttributeValue", "Invalid value for the parameter Policy.")
    return json.dumps(policy, separators=(",", ":"))


def _validate_tags(queue: str, tags: Mapping[str, Any], existing: Mapping[str, str]) -> None:
    """Tag keys 1-128 characters, values up to 256, at most 50 tags on a queue."""
    for key, value in tags.items():
        if not isinstance(key, str) or not 1 <= len(key) <= 128:
            raise invalid_parameter("Tag keys must be between 1 and 128 characters in length.")
        if not isinstance(value, str) or len(value) > 256:
            raise invalid_parameter("Tag values may only be up to 256 characters in length.")
    if len(set(existing) | set(tags)) > MAX_TAGS:
        raise invalid_parameter(f"Too many tags added for queue {queue}.")


def validate_batch_ids(entries: list[Any], kind: str) -> None:
    """Common batch checks, in SQS's order: empty, too many, duplicate ids, bad ids."""
    if not entries:
        raise SqsError(
            "EmptyBatchRequest",
            f"There should be at least one {kind}RequestEntry in the request.",
        )
    if len(entries) > MAX_BATCH_ENTRIES:
        raise SqsError(
            "TooManyEntriesInBatchRequest",
            f"Maximum number of entries per request are {MAX_BATCH_ENTRIES}. "
            f"You have sent {len(entries)}.",
        )
    seen: set[str] = set()
    for entry in entries:
        entry_id = entry.id if hasattr(entry, "id") else str(entry.get("Id", ""))
        if entry_id in seen:
            raise SqsError("BatchEntryIdsNotDistinct", f"Id {entry_id} repeated.")
        seen.add(entry_id)
    for entry_id in seen:
        if not _BATCH_ID_RE.match(entry_id):
            raise SqsError(
                "InvalidBatchEntryId",
                "A batch entry id can only contain alphanumeric characters, hyphens and "
                "underscores. It can be at most 80 letters long.",
            )


def _validate_message_attributes(attributes: Mapping[str, Mapping[str, Any]]) -> int:
    """Check user message attributes; returns their size in bytes."""
    if len(attributes) > MAX_MESSAGE_ATTRIBUTES:
        raise invalid_parameter(
            f"Number of message attributes [{len(attributes)}] exceeds the allowed maximum "
            f"[{MAX_MESSAGE_ATTRIBUTES}]."
        )
    size = 0
    for name, value in attributes.items():
        lowered = name.lower()
        if (
            not _ATTRIBUTE_NAME_RE.match(name)
            or lowered.startswith(("aws.", "amazon."))
            or name.startswith(".")
            or name.endswith(".")
            or ".." in name
        ):
            raise invalid_parameter(
                f"The message attribute name '{name}' is invalid. Attribute name can contain "
                "A-Z, a-z, 0-9, underscore (_), hyphen (-), and period (.) characters."
            )
        data_type = value.get("DataType")
        if not isinstance(data_type, str) or not data_type:
            raise invalid_parameter(
                f"The message attribute '{name}' must contain non-empty message attribute type."
            )
        base = data_type.split(".", 1)[0]
        if base not in ("String", "Number", "Binary"):
            raise invalid_parameter(
                f"The message attribute '{name}' has an invalid message attribute type, the set "
                "of supported type prefixes is Binary, Number, and String."
            )
        if base == "Binary":
            raw = value.get("BinaryValue")
            if raw is None or len(raw) == 0:
                raise invalid_parameter(
                    f"The message attribute '{name}' with type '{base}' must use field '{base}'."
                )
            size += len(raw)
        else:
            text = value.get("StringValue")
            if text is None or text == "":
                raise invalid_parameter(
                    f"The message attribute '{name}' with type '{base}' must use field 'String'."
                )
            if _INVALID_CHARS_RE.search(text):
                raise SqsError(
                    "InvalidMessageContents",
                    f"The message attribute '{name}' contains characters outside the allowed set.",
                )
            size += len(text.encode("utf-8"))
        size += len(name.encode("utf-8")) + len(data_type.encode("utf-8"))
    return size


# ---------------------------------------------------------------------------------------------
# Receipt handles
# ---------------------------------------------------------------------------------------------
def encode_receipt_handle(queue: str, message_id: str, token: int) -> str:
    raw = f"sqslocal\x1f{queue}\x1f{message_id}\x1f{token}".encode()
    return base64.urlsafe_b64encode(raw).decode("ascii")


def decode_receipt_handle(handle: str) -> tuple[str, str, int] | None:
    if not isinstance(handle, str) or not handle or len(handle) > 1024:
        return None
    try:
        raw = base64.urlsafe_b64decode(handle.encode("ascii")).decode("utf-8")
    except (binascii.Error, UnicodeError, ValueError):
        return None
    parts = raw.split("\x1f")
    if len(parts) != 4 or parts[0] != "sqslocal" or not parts[3].isdigit():
        return None
    return parts[1], parts[2], int(parts[3])


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------
class SqsModel:
    """All queues of one account in one region.

    ``clock`` returns epoch seconds (inject a fake one in tests); ``rng`` makes message ids and
    everything random repeatable; ``hooks`` is consulted for injected faults; ``on_visible`` is
    called with a queue name whenever messages become visible in it (long polls wake on it);
    ``account_id`` and ``region`` go into every queue ARN.
    """

    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        hooks: FaultHooks = NO_FAULTS,
        on_visible: Callable[[str], None] | None = None,
        account_id: str = ACCOUNT_ID,
        region: str = REGION,
        fifo_throughput_limits: bool = True,
    ) -> None:
        self.clock = clock
        self.fifo_throughput_limits = fifo_throughput_limits
        self.rng = rng if rng is not None else random.Random()
        self.hooks = hooks
        self.on_visible = on_visible
        self.account_id = account_id
        self.region = region
        self.queues: dict[str, Queue] = {}
        self._by_arn: dict[str, Queue] = {}
        self._deleted: dict[str, float] = {}
        self._tokens = itertools.count(1)
        self.move_tasks: dict[str, list[MoveTask]] = {}  # source ARN -> newest last

    # -- helpers ------------------------------------------------------------------------------
    def _new_id(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def _notify(self, queue: Queue, count: int) -> None:
        if count and self.on_visible is not None:
            self.on_visible(queue.name)

    def arn(self, name: str) -> str:
        return queue_arn(name, self.region, self.account_id)

    def queue(self, name: str) -> Queue:
        """The queue called ``name``, brought up to date with the clock."""
        queue = self.queues.get(name)
        if queue is None:
            raise queue_does_not_exist()
        self._notify(queue, queue.advance(self.clock()))
        return queue

    def queue_by_arn(self, arn: str) -> Queue | None:
        return self._by_arn.get(arn)

    def _throttle(self, queue: Queue, action: str, groups: Iterable[str | None] = ()) -> None:
        """Refuse a FIFO call over the throughput quotas with RequestThrottled."""
        if (
            queue.fifo_attributes is not None
            and self.fifo_throughput_limits
            and not queue.admit(action, groups, self.clock())
        ):
            raise SqsError(
                "RequestThrottled",
                f"Rate exceeded: {action} on FIFO queue {queue.name} is over its throughput quota.",
            )

    def reset(self) -> None:
        """Drop every queue, move task and deleted-queue record."""
        for queue in self.queues.values():
            queue.clear()
        self.queues.clear()
        self._by_arn.clear()
        self._deleted.clear()
        self.move_tasks.clear()

    # -- queue management ---------------------------------------------------------------------
    def _parse_attributes(
        self, queue_name: str, attributes: Mapping[str, Any], creating: bool, fifo: bool
    ) -> tuple[dict[str, int], dict[str, str], tuple[str, int] | None | bool, dict[str, str]]:
        """Validate queue attributes. Returns (ints, strings, redrive, fifo attributes) where
        redrive is False when RedrivePolicy is not being set, None when it is being removed."""
        ints: dict[str, int] = {}
        strings: dict[str, str] = {}
        fifo_values: dict[str, str] = {}
        redrive: tuple[str, int] | None | bool = False
        for attr, raw in attributes.items():
            value = "" if raw is None else str(raw)
            if attr == "FifoQueue":
                # Set at creation only (create_queue checks it against the name).
                if not creating:
                    raise SqsError("InvalidAttributeName", f"Unknown Attribute {attr}.")
                continue
            if attr in FIFO_CHOICES:
                if not fifo:  # a Standard queue has no FIFO attributes
                    raise SqsError("InvalidAttributeName", f"Unknown Attribute {attr}.")
                if value not in FIFO_CHOICES[attr]:
                    raise SqsError(
                        "InvalidAttributeValue", f"Invalid value for the parameter {attr}."
                    )
                fifo_values[attr] = value
                continue
            if attr not in SETTABLE_ATTRIBUTES:
                raise SqsError("InvalidAttributeName", f"Unknown Attribute {attr}.")
            if attr in INT_ATTRIBUTES:
                low, high, _ = INT_ATTRIBUTES[attr]
                number = _as_int(value)
                if number is None or not low <= number <= high:
                    raise SqsError(
                        "InvalidAttributeValue", f"Invalid value for the parameter {attr}."
                    )
                ints[attr] = number
            elif attr == "RedrivePolicy":
                redrive = None if value == "" else self._parse_redrive(queue_name, value, fifo)
            elif attr == "RedriveAllowPolicy":
                strings[attr] = self._parse_redrive_allow(value) if value else ""
            elif attr == "Policy":
                strings[attr] = _parse_policy(value) if value else ""
            elif attr == "SqsManagedSseEnabled":
                if value.lower() not in ("true", "false"):
                    raise SqsError(
                        "InvalidAttributeValue", f"Invalid value for the parameter {attr}."
                    )
                strings[attr] = value.lower()
            else:
                strings[attr] = value
        return ints, strings, redrive, fifo_values

    def _parse_redrive(self, name: str, value: str, fifo: bool) -> tuple[str, int]:
        def bad(reason: str) -> SqsError:
            return invalid_parameter(
                f"Value {value} for parameter RedrivePolicy is invalid. Reason: {reason}"
            )

        try:
            policy = json.loads(value)
        except ValueError:
            raise bad("Redrive policy is not a valid JSON map.") from None
        if not isinstance(policy, dict):
            raise bad("Redrive policy is not a valid JSON map.")
        target = policy.get("deadLetterTargetArn")
        if not isinstance(target, str) or not target:
            raise bad("Redrive policy does not contain mandatory attribute: deadLetterTargetArn.")
        count = _as_int(policy.get("maxReceiveCount"))
        if policy.get("maxReceiveCount") is None:
            raise bad("Redrive policy does not contain mandatory attribute: maxReceiveCount.")
        if count is None or not 1 <= count <= 1000:
            raise bad(
                f"Invalid value for maxReceiveCount: {policy.get('maxReceiveCount')}, valid "
                "values are from 1 to 1000 both inclusive."
            )
        dlq = self._by_arn.get(target)
        if dlq is None:
            raise bad("Dead letter target does not exist.")
        if dlq.fifo != fifo:
            # The Developer Guide: the dead-letter queue of a FIFO queue must be a FIFO queue,
            # and that of a standard queue a standard queue.
            raise bad("Dead-letter queue must be the same type of queue as the source queue.")
        allow = dlq.strings.get("RedriveAllowPolicy")
        if allow:
            rules = json.loads(allow)
            permission = rules.get("redrivePermission")
            source_arn = self.arn(name)
            if permission == "denyAll" or (
                permission == "byQueue" and source_arn not in rules.get("sourceQueueArns", [])
            ):
                raise bad(
                    f"Queue {target} does not allow this queue to use it as a dead-letter queue."
                )
        return target, count

    @staticmethod
    def _parse_redrive_allow(value: str) -> str:
        def bad(reason: str) -> SqsError:
            return invalid_parameter(
                f"Value {value} for parameter RedriveAllowPolicy is invalid. Reason: {reason}"
            )

        try:
            policy = json.loads(value)
        except ValueError:
            raise bad("Amazon SQS can't parse the policy.") from None
        if not isinstance(policy, dict):
            raise bad("Amazon SQS can't parse the policy.")
        permission = policy.get("redrivePermission")
        if permission not in ("allowAll", "denyAll", "byQueue"):
            raise bad("redrivePermission must be one of allowAll, denyAll, byQueue.")
        sources = policy.get("sourceQueueArns")
        if permission == "byQueue":
            if not isinstance(sources, list) or not 1 <= len(sources) <= 10:
                raise bad("sourceQueueArns must list 1 to 10 queue ARNs when byQueue.")
        elif sources is not None:
            raise bad("sourceQueueArns can be specified only when redrivePermission is byQueue.")
        return json.dumps(policy, separators=(",", ":"))

    @staticmethod
    def _apply_attributes(
        queue: Queue,
        ints: dict[str, int],
        strings: dict[str, str],
        redrive: tuple[str, int] | None | bool,
        fifo_values: dict[str, str],
    ) -> None:
        queue.ints.update(ints)
        for name, value in strings.items():
            if value == "":  # an empty value removes the attribute (Policy="" included)
                queue.strings.pop(name, None)
            else:
                queue.strings[name] = value
        if redrive is not False:
            queue.redrive = redrive if isinstance(redrive, tuple) else None
        if queue.fifo_attributes is not None:
            queue.fifo_attributes.update(fifo_values)
            if (
                queue.fifo_attributes["FifoThroughputLimit"] == "perMessageGroupId"
                and queue.fifo_attributes["DeduplicationScope"] != "messageGroup"
            ):
                # High throughput: the Developer Guide pairs perMessageGroupId with
                # messageGroup deduplication; SQS refuses perMessageGroupId with queue scope.
                raise SqsError(
                    "InvalidAttributeValue",
                    "Invalid value for the parameter FifoThroughputLimit. Reason: "
                    "perMessageGroupId is only available when DeduplicationScope is "
                    "messageGroup.",
                )

    @staticmethod
    def _fifo_requested(name: str, attributes: Mapping[str, Any]) -> bool:
        """Whether CreateQueue asks for a FIFO queue; refuses a name and a FifoQueue attribute
        that disagree (a FIFO queue's name must end in .fifo, and only a FIFO queue's may)."""
        raw = attributes.get("FifoQueue")
        value = None if raw is None else str(raw).lower()
        if value is not None and value not in ("true", "false"):
            raise SqsError("InvalidAttributeValue", "Invalid value for the parameter FifoQueue.")
        wants_fifo = value == "true"
        if wants_fifo and not _FIFO_QUEUE_NAME_RE.match(name):
            raise invalid_parameter(
                "The name of a FIFO queue can only include alphanumeric characters, hyphens, "
                "or underscores, must end with .fifo suffix and be 1 to 80 in length."
            )
        if not wants_fifo and name.endswith(FIFO_SUFFIX):
            raise invalid_parameter(
                "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in "
                "length"
            )
        if not wants_fifo and not _QUEUE_NAME_RE.match(name):
            raise invalid_parameter(
                "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in "
                "length"
            )
        return wants_fifo

    def create_queue(
        self,
        name: str,
        attributes: Mapping[str, Any] | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> Queue:
        if not isinstance(name, str) or not name:
            raise invalid_parameter(
                "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in "
                "length"
            )
        attributes = dict(attributes or {})
        fifo = self._fifo_requested(name, attributes)
        now = self.clock()
        existing = self.queues.get(name)
        ints, strings, redrive, fifo_values = self._parse_attributes(
            name, attributes, creating=True, fifo=fifo
        )
        if tags is not None:
            _validate_tags(name, tags, {})
        if existing is not None:
            current = self.queue_attributes(name, ["All"])
            for key, raw in attributes.items():
                wanted = str(raw)
                if key in INT_ATTRIBUTES:
                    wanted = str(ints[key])
                elif key == "RedrivePolicy" and isinstance(redrive, tuple):
                    wanted = _redrive_json(redrive)
                elif key == "FifoQueue":
                    wanted = "true" if fifo else ""
                elif key == "Policy" and strings.get(key):
                    wanted = strings[key]
                if current.get(key, "") != wanted:
                    raise SqsError(
                        "QueueNameExists",
                        "A queue already exists with the same name and a different value for "
                        f"attribute {key}",
                    )
            return existing
        deleted_at = self._deleted.get(name)
        if deleted_at is not None and now - deleted_at < DELETED_QUEUE_COOLDOWN:
            raise SqsError(
                "QueueDeletedRecently",
                "You must wait 60 seconds after deleting a queue before you can create another "
                "with the same name.",
            )
        self._deleted.pop(name, None)
        queue = Queue(name, now, self.arn(name), dict(FIFO_DEFAULTS) if fifo else None)
        self._apply_attributes(queue, ints, strings, redrive, fifo_values)
        queue.tags.update({str(k): str(v) for k, v in (tags or {}).items()})
        self.queues[name] = queue
        self._by_arn[queue.arn] = queue
        return queue

    def delete_queue(self, name: str) -> None:
        queue = self.queue(name)
        queue.clear()
        del self.queues[name]
        self._by_arn.pop(queue.arn, None)
        now = self.clock()
        self._deleted = {k: t for k, t in self._deleted.items() if now - t < DELETED_QUEUE_COOLDOWN}
        self._deleted[name] = now

    def list_queues(
        self,
        prefix: str | None = None,
        max_results: int | None = None,
        next_token: str | None = None,
    ) -> tuple[list[str], str | None]:
        if max_results is not None and not 1 <= max_results <= 1000:
            raise invalid_parameter(
                f"Value {max_results} for parameter MaxResults is invalid. Reason: MaxResults "
                "must be an integer between 1 and 1000."
            )
        names = sorted(n for n in self.queues if not prefix or n.startswith(prefix))
        if next_token:
            try:
                after = base64.urlsafe_b64decode(next_token.encode()).decode()
            except (binascii.Error, UnicodeError, ValueError):
                raise invalid_parameter("Invalid NextToken value.") from None
            names = [n for n in names if n > after]
        limit = max_results if max_results is not None else 1000
        page = names[:limit]
        token = None
        if max_results is not None and len(names) > limit:
            token = base64.urlsafe_b64encode(page[-1].encode()).decode()
        return page, token

    def purge_queue(self, name: str) -> None:
        queue = self.queue(name)
        now = self.clock()
        if queue.last_purge is not None and now - queue.last_purge < PURGE_INTERVAL:
            raise SqsError(
                "PurgeQueueInProgress",
                f"Only one PurgeQueue operation on {name} is allowed every 60 seconds.",
            )
        queue.last_purge = now
        queue.clear()

    def queue_attributes(self, name: str, names: Iterable[str] | None) -> dict[str, str]:
        queue = self.queue(name)
        wanted = list(names or [])
        readable = READABLE_ATTRIBUTES if queue.fifo else READABLE_ATTRIBUTES - FIFO_ATTRIBUTES
        for attr in wanted:
            if attr != "All" and attr not in readable:
                raise SqsError("InvalidAttributeName", f"Unknown Attribute {attr}.")
        if not wanted:
            return {}
        every = "All" in wanted
        values: dict[str, str] = {
            "ApproximateNumberOfMessages": str(len(queue.visible)),
            "ApproximateNumberOfMessagesNotVisible": str(queue.inflight_count),
            "ApproximateNumberOfMessagesDelayed": str(queue.delayed_count),
            "CreatedTimestamp": str(int(queue.created_at)),
            "LastModifiedTimestamp": str(int(queue.modified_at)),
            "QueueArn": queue.arn,
        }
        for key, number in queue.ints.items():
            if key == "KmsDataKeyReusePeriodSeconds" and "KmsMasterKeyId" not in queue.strings:
                continue
            values[key] = str(number)
        values.update(queue.strings)
        if queue.redrive is not None:
            values["RedrivePolicy"] = _redrive_json(queue.redrive)
        if queue.fifo_attributes is not None:
            values.update(queue.fifo_attributes)
        if every:
            return values
        return {k: values[k] for k in wanted if k in values}

    def set_queue_attributes(self, name: str, attributes: Mapping[str, Any]) -> None:
        queue = self.queue(name)
        ints, strings, redrive, fifo_values = self._parse_attributes(
            name, attributes, creating=False, fifo=queue.fifo
        )
        before = dict(queue.fifo_attributes) if queue.fifo_attributes is not None else None
        try:
            self._apply_attributes(queue, ints, strings, redrive, fifo_values)
        except SqsError:
            queue.fifo_attributes = before
            raise
        queue.modified_at = self.clock()

    def dead_letter_source_queues(self, name: str) -> list[str]:
        queue = self.queue(name)
        return sorted(
            q.name for q in self.queues.values() if q.redrive and q.redrive[0] == queue.arn
        )

    def tag_queue(self, name: str, tags: Mapping[str, str]) -> None:
        queue = self.queue(name)
        if not tags:
            raise missing_parameter("Tags")
        _validate_tags(name, tags, queue.tags)
        queue.tags.update({str(k): str(v) for k, v in tags.items()})

    def untag_queue(self, name: str, keys: Iterable[str]) -> None:
        queue = self.queue(name)
        keys = list(keys)
        if not keys or any(not isinstance(k, str) or not 1 <= len(k) <= 128 for k in keys):
            raise invalid_parameter("Tag keys must be between 1 and 128 characters in length.")
        for key in keys:
            queue.tags.pop(key, None)

    def queue_tags(self, name: str) -> dict[str, str]:
        return dict(self.queue(name).tags)

    # -- permissions (the queue policy AddPermission builds) ----------------------------------
    def add_permission(self, name: str, label: Any, account_ids: Any, actions: Any) -> None:
        """Add a statement to the queue's policy, as AddPermission builds it: Sid the label,
        Principal the accounts' root ARNs, Action ``SQS:<action>``, Resource the queue."""
        queue = self.queue(name)
        if not isinstance(label, str) or not label:
            raise missing_parameter("Label")
        if not _PERMISSION_LABEL_RE.match(label):
            raise invalid_parameter(
                f"Value {label} for parameter Label is invalid. Reason: Can only include "
                "alphanumeric characters, hyphens, or underscores. 1 to 80 in length."
            )
        if not isinstance(actions, list) or not actions:
            raise missing_parameter("Actions")
        if not isinstance(account_ids, list) or not account_ids:
            raise invalid_parameter(
                f"Value {account_ids if isinstance(account_ids, list) else '[]'} for parameter "
                "PrincipalId is invalid. Reason: Unable to verify."
            )
        for account in account_ids:
            if not isinstance(account, str) or not _ACCOUNT_ID_RE.match(account):
                raise invalid_parameter(
                    f"Value {account} for parameter PrincipalId is invalid. Reason: Unable to "
                    "verify."
                )
        if len(actions) > MAX_PERMISSION_ACTIONS:
            raise SqsError(
                "OverLimit",
                f"{len(actions)} Actions were found, maximum allowed is {MAX_PERMISSION_ACTIONS}.",
            )
        for action in actions:
            if action in OWNER_ONLY_ACTIONS:
                raise invalid_parameter(
                    f"Value SQS:{action} for parameter ActionName is invalid. Reason: Only the "
                    "queue owner is allowed to invoke this action."
                )
            if action not in PERMISSION_ACTIONS:
                raise invalid_parameter(
                    f"Value SQS:{action} for parameter ActionName is invalid. Reason: Please "
                    "refer to the appropriate WSDL for a list of valid actions."
                )
        policy = self._policy(queue)
        statements = policy["Statement"]
        if any(isinstance(s, dict) and s.get("Sid") == label for s in statements):
            raise invalid_parameter(
                f"Value {label} for parameter Label is invalid. Reason: Already exists."
            )
        principals = [f"arn:aws:iam::{a}:root" for a in account_ids]
        granted = [f"SQS:{a}" for a in actions]
        statements.append(
            {
                "Sid": label,
                "Effect": "Allow",
                "Principal": {"AWS": principals[0] if len(principals) == 1 else principals},
                "Action": granted[0] if len(granted) == 1 else granted,
                "Resource": queue.arn,
            }
        )
        queue.strings["Policy"] = json.dumps(policy, separators=(",", ":"))

    def remove_permission(self, name: str, label: Any) -> None:
        queue = self.queue(name)
        if not isinstance(label, str) or not label:
            raise missing_parameter("Label")
        policy = self._policy(queue)
        kept = [
            s for s in policy["Statement"] if not (isinstance(s, dict) and s.get("Sid") == label)
        ]
        if len(kept) == len(policy["Statement"]):
            raise invalid_parameter(
                f"Value {label} for parameter Label is invalid. Reason: can't find label on "
                "existing policy."
            )
        if kept:
            policy["Statement"] = kept
            queue.strings["Policy"] = json.dumps(policy, separators=(",", ":"))
        else:
            queue.strings.pop("Policy", None)

    @staticmethod
    def _policy(queue: Queue) -> dict[str, Any]:
        """The queue's policy document (a fresh default one when it has none)."""
        text = queue.strings.get("Policy")
        if text:
            policy = json.loads(text)
            if isinstance(policy.get("Statement"), dict):
                policy["Statement"] = [policy["Statement"]]
            policy.setdefault("Statement", [])
            return policy
        return {"Version": "2012-10-17", "Id": f"{queue.arn}/SQSDefaultPolicy", "Statement": []}

    # -- messages -----------------------------------------------------------------------------
    @staticmethod
    def _check_queue_type_parameters(queue: Queue, entry: SendEntry) -> None:
        """The parameters that depend on the queue's type, checked for the whole request (a
        batch fails as a whole, as SQS answers): a FIFO message needs a group and a
        deduplication id (or content-based deduplication) and takes no per-message delay; a
        standard message takes no deduplication id (a group id makes it a fair-queue tenant)."""
        group = entry.group_id
        if group is not None and (not isinstance(group, str) or not _FIFO_TOKEN_RE.match(group)):
            raise invalid_parameter(
                f"Value {group} for parameter MessageGroupId is invalid. Reason: MessageGroupId "
                "can only include alphanumeric and punctuation characters. 1 to 128 in length."
            )
        dedup = entry.deduplication_id
        if dedup is not None and (not isinstance(dedup, str) or not _FIFO_TOKEN_RE.match(dedup)):
            raise invalid_parameter(
                f"Value {dedup} for parameter MessageDeduplicationId is invalid. Reason: "
                "MessageDeduplicationId can only include alphanumeric and punctuation "
                "characters. 1 to 128 in length."
            )
        fifo = queue.fifo_attributes
        if fifo is None:
            if dedup is not None:
                raise invalid_parameter(
                    f"Value {dedup} for parameter MessageDeduplicationId is invalid. Reason: The "
                    "request include parameter that is not valid for this queue type."
                )
            return
        if entry.delay_seconds:
            raise invalid_parameter(
                f"Value {entry.delay_seconds} for parameter DelaySeconds is invalid. Reason: The "
                "request include parameter that is not valid for this queue type."
            )
        if group is None:
            raise missing_parameter("MessageGroupId")
        if dedup is None and fifo["ContentBasedDeduplication"] != "true":
            raise invalid_parameter(
                "The queue should either have ContentBasedDeduplication enabled or "
                "MessageDeduplicationId provided explicitly"
            )

    def _build_message(self, queue: Queue, entry: SendEntry) -> Message:
        body = entry.body
        if not isinstance(body, str) or body == "":
            raise missing_parameter("MessageBody")
        if _INVALID_CHARS_RE.search(body):
            raise SqsError(
                "InvalidMessageContents",
                "Invalid characters found. Valid unicode characters are #x9 | #xA | #xD | "
                "#x20 to #xD7FF | #xE000 to #xFFFD | #x10000 to #x10FFFF",
            )
        size = len(body.encode("utf-8")) + _validate_message_attributes(entry.attributes)
        for key in entry.system_attributes:
            if key != "AWSTraceHeader":
                raise invalid_parameter(f"Message system attribute name '{key}' is invalid.")
        if size > queue.max_message_size:
            raise invalid_parameter(
                "One or more parameters are invalid. Reason: Message must be shorter than "
                f"{queue.max_message_size} bytes."
            )
        delay = entry.delay_seconds
        if delay is not None and not 0 <= delay <= MAX_DELAY_SECONDS:
            raise invalid_parameter(
                f"Value {delay} for parameter DelaySeconds is invalid. Reason: DelaySeconds "
                "must be >= 0 and <= 900."
            )
        msg = Message(
            self._new_id(),
            body,
            dict(entry.attributes) if entry.attributes else _NO_ATTRIBUTES,
            dict(entry.system_attributes) if entry.system_attributes else _NO_ATTRIBUTES,
            self.clock(),
            size,
        )
        msg.group_id = entry.group_id
        if queue.fifo:
            msg.deduplication_id = (
                entry.deduplication_id or hashlib.sha256(body.encode("utf-8")).hexdigest()
            )
        return msg

    def _enqueue(self, queue: Queue, msg: Message, delay: int | None) -> bool:
        """Put a new message in ``queue``; True when it is visible at once. A FIFO message
        whose deduplication id was seen in the last 5 minutes is accepted but not enqueued: it
        takes the first one's message id and sequence number (False)."""
        fifo = queue.fifo_attributes
        if fifo is not None:
            dedup_id = msg.deduplication_id or ""
            key = (
                f"{msg.group_id}\x1f{dedup_id}"
                if fifo["DeduplicationScope"] == "messageGroup"
                else dedup_id
            )
            seen = queue.dedup.get(key)
            if seen is not None and seen[0] > msg.sent_at:
                msg.id, msg.sequence_number = seen[1], seen[2]
                msg.state = GONE
                return False
            msg.sequence_number = queue.next_sequence_number(msg.sent_at)
            queue.dedup.pop(key, None)
            queue.dedup[key] = (msg.sent_at + DEDUPLICATION_INTERVAL, msg.id, msg.sequence_number)
            queue.ops += 1
        queue.add(msg)
        delay = queue.delay_seconds if delay is None else delay
        if delay > 0:
            queue.make_delayed(msg, msg.sent_at + delay)
            return False
        queue.make_visible(msg)
        return True

    def send_message(self, name: str, entry: SendEntry) -> Message:
        queue = self.queue(name)
        self._throttle(queue, "SendMessage", [entry.group_id])
        self._check_queue_type_parameters(queue, entry)
        msg = self._build_message(queue, entry)
        if self._enqueue(queue, msg, entry.delay_seconds):
            self._notify(queue, 1)
        return msg

    def send_message_batch(
        self, name: str, entries: list[SendEntry]
    ) -> tuple[list[tuple[str, Message]], list[tuple[str, SqsError]]]:
        queue = self.queue(name)
        validate_batch_ids(entries, "SendMessageBatch")
        self._throttle(queue, "SendMessageBatch", [e.group_id for e in entries])
        for entry in entries:
            self._check_queue_type_parameters(queue, entry)
        total = sum(len(e.body.encode("utf-8")) if isinstance(e.body, str) else 0 for e in entries)
        for e in entries:
            for attr_name, value in e.attributes.items():
                total += len(attr_name) + len(str(value.get("DataType", "")))
                total += len(value.get("BinaryValue") or b"") + len(
                    str(value.get("StringValue") or "").encode("utf-8")
                )
        if total > MAX_PAYLOAD:
            raise SqsError(
                "BatchRequestTooLong",
                f"Batch requests cannot be longer than {MAX_PAYLOAD} bytes. You have sent "
                f"{total} bytes.",
            )
        ok: list[tuple[str, Message]] = []
        failed: list[tuple[str, SqsError]] = []
        visible = 0
        for entry in entries:
            # Drawn before the message is built: a failed entry leaves no trace (no FIFO
            # deduplication id taken, no sequence number used).
            if self.hooks.fail_entry(queue.name):
                failed.append((entry.id, SqsError("InternalError", "Internal error (injected).")))
                continue
            try:
                msg = self._build_message(queue, entry)
            except SqsError as exc:
                failed.append((entry.id, exc))
                continue
            visible += self._enqueue(queue, msg, entry.delay_seconds)
            ok.append((entry.id, msg))
        self._notify(queue, visible)
        return ok, failed

    def receive_message(
        self,
        name: str,
        max_messages: int | None = None,
        visibility_timeout: int | None = None,
        wait_seconds: int | None = None,
        attempt_id: str | None = None,
    ) -> list[Received]:
        """Hand out up to ``max_messages`` visible messages. ``wait_seconds`` is only
        validated here: long polling is the caller's loop around this call. ``attempt_id``
        (FIFO queues): a retry with the same ReceiveRequestAttemptId within 5 minutes, while
        none of the messages was deleted or had its visibility changed, gets the same messages
        and receipt handles again, their visibility timeout started anew."""
        if max_messages is not None and not 1 <= max_messages <= MAX_RECEIVE:
            raise invalid_parameter(
                f"Value {max_messages} for parameter MaxNumberOfMessages is invalid. Reason: "
                "Must be between 1 and 10, if provided."
            )
        if wait_seconds is not None and not 0 <= wait_seconds <= MAX_WAIT_SECONDS:
            raise invalid_parameter(
                f"Value {wait_seconds} for parameter WaitTimeSeconds is invalid. Reason: Must "
                "be >= 0 and <= 20, if provided."
            )
        if visibility_timeout is not None and not 0 <= visibility_timeout <= MAX_VISIBILITY_TIMEOUT:
            raise invalid_parameter(
                f"Value {visibility_timeout} for parameter VisibilityTimeout is invalid. "
                "Reason: Must be >= 0 and <= 43200, if provided."
            )
        if attempt_id is not None and (
            not isinstance(attempt_id, str) or not _FIFO_TOKEN_RE.match(attempt_id)
        ):
            raise invalid_parameter(
                f"Value {attempt_id} for parameter ReceiveRequestAttemptId is invalid. Reason: "
                "ReceiveRequestAttemptId can only include alphanumeric and punctuation "
                "characters. 1 to 128 in length."
            )
        queue = self.queue(name)
        self._throttle(queue, "ReceiveMessage")
        wanted = max_messages or 1
        if queue.fifo:
            wanted = min(wanted, FIFO_MAX_INFLIGHT - queue.inflight_count)
            if wanted <= 0:
                return []
        elif queue.inflight_count >= MAX_INFLIGHT:
            raise SqsError(
                "OverLimit",
                f"You have reached the limit of {MAX_INFLIGHT} in-flight messages for this queue.",
            )
        timeout = queue.visibility_timeout if visibility_timeout is None else visibility_timeout
        now = self.clock()
        if queue.fifo and attempt_id is not None:
            replayed = self._replay_attempt(queue, attempt_id, now + timeout)
            if replayed is not None:
                return replayed
        dlq: Queue | None = None
        max_count = 0
        if queue.redrive is not None:
            dlq = self._by_arn.get(queue.redrive[0])
            max_count = queue.redrive[1]
        if queue.fifo:
            out, moved_to_dlq = self._receive_fifo(queue, wanted, now, timeout, dlq, max_count)
            if attempt_id is not None and out:
                queue.attempts.pop(attempt_id, None)
                queue.attempts[attempt_id] = ReceiveAttempt(
                    now + RECEIVE_ATTEMPT_INTERVAL,
                    [(r.message, r.message.token, r.message.gen) for r in out],
                )
        else:
            out, moved_to_dlq = self._receive_standard(queue, wanted, now, timeout, dlq, max_count)
        if dlq is not None and moved_to_dlq:
            self._notify(dlq, moved_to_dlq)
        return out

    def _hand_out(self, queue: Queue, msg: Message, now: float, timeout: int) -> Received:
        """Deliver one message (already out of ``visible``): count it, give it a new receipt,
        put it in flight, unless a fault makes the copy a ghost or its visibility expire."""
        msg.receive_count += 1
        if msg.first_received_at is None:
            msg.first_received_at = now
        msg.received_at = now
        msg.token = next(self._tokens)
        received = Received(msg, encode_receipt_handle(queue.name, msg.id, msg.token))
        hooks = self.hooks
        if hooks.duplicate(queue.name):
            # Handed out, and still visible: the copy just handed out is a ghost whose
            # receipt handle no longer deletes the message.
            msg.token = next(self._tokens)
            queue.make_visible(msg)
        elif hooks.expire_on_receive(queue.name):
            queue.make_inflight(msg, now)
        else:
            queue.make_inflight(msg, now + timeout)
        return received

    @staticmethod
    def _move_to_dlq(queue: Queue, dlq: Queue, msg: Message) -> None:
        queue.forget(msg)
        msg.dlq_source_arn = queue.arn
        dlq.add(msg)
        dlq.make_visible(msg)

    def _receive_standard(
        self, queue: Queue, wanted: int, now: float, timeout: int, dlq: Queue | None, max_count: int
    ) -> tuple[list[Received], int]:
        out: list[Received] = []
        budget = len(queue.visible)
        moved_to_dlq = 0
        while len(out) < wanted and budget > 0 and queue.visible:
            budget -= 1
            _, msg = queue.visible.popitem(last=False)
            queue.ops += 1
            msg.state = GONE  # out of ``visible``; each branch below gives it its next state
            if msg.sent_at + queue.retention <= now:  # e.g. an old message redriven here
                queue.forget(msg)
                continue
            if dlq is not None and dlq is not queue and msg.receive_count >= max_count:
                self._move_to_dlq(queue, dlq, msg)
                moved_to_dlq += 1
                continue
            out.append(self._hand_out(queue, msg, now, timeout))
        return out, moved_to_dlq

    def _receive_fifo(
        self, queue: Queue, wanted: int, now: float, timeout: int, dlq: Queue | None, max_count: int
    ) -> tuple[list[Received], int]:
        """Take the first ready group's messages in order (as many as wanted, stopping at one
        that is not visible), then the next ready group's: SQS "tries to return as many
        messages with the same message group ID as possible". Each group is visited once per
        call; the cost is O(messages handed out + messages moved or expired) per call."""
        out: list[Received] = []
        moved_to_dlq = 0
        visited: set[str] = set()
        while len(out) < wanted and queue.ready:
            group_id = next(iter(queue.ready))
            if group_id in visited:
                break
            visited.add(group_id)
            del queue.ready[group_id]
            queue.ops += 1
            group = queue.groups[group_id]
            handed = 0  # messages of this group handed out by this call precede the next one
            while len(out) < wanted:
                msg = next(itertools.islice(group.messages.values(), handed, None), None)
                if msg is None or msg.state != VISIBLE:
                    break
                queue.leave_state(msg)
                if msg.sent_at + queue.retention <= now:
                    queue.forget(msg)
                    continue
                if dlq is not None and dlq is not queue and msg.receive_count >= max_count:
                    self._move_to_dlq(queue, dlq, msg)
                    moved_to_dlq += 1
                    continue
                out.append(self._hand_out(queue, msg, now, timeout))
                handed += 1
            queue._refresh_group(group_id)
        return out, moved_to_dlq

    def _replay_attempt(self, queue: Queue, attempt_id: str, until: float) -> list[Received] | None:
        """The messages of an earlier receive with this attempt id, if it can be replayed."""
        attempt = queue.attempts.get(attempt_id)
        if attempt is None:
            return None
        for msg, token, gen in attempt.handed:
            if msg.state != INFLIGHT or msg.token != token or msg.gen != gen:
                del queue.attempts[attempt_id]
                return None
        out: list[Received] = []
        handed: list[tuple[Message, int, int]] = []
        for msg, token, _ in attempt.handed:
            queue.leave_state(msg)
            queue.make_inflight(msg, until)
            handed.append((msg, token, msg.gen))
            out.append(Received(msg, encode_receipt_handle(queue.name, msg.id, token)))
        attempt.handed = handed
        return out

    def _message_for(self, queue: Queue, handle: str) -> Message | None:
        """The message a well-formed handle names, if it is still the latest receipt."""
        decoded = decode_receipt_handle(handle)
        if decoded is None or decoded[0] != queue.name:
            raise receipt_handle_invalid(handle)
        _, message_id, token = decoded
        msg = queue.messages.get(message_id)
        if msg is None or msg.token != token:
            return None
        return msg

    def delete_message(self, name: str, handle: str) -> None:
        """Delete by receipt handle. A stale handle (the message was received again since, or
        is gone) succeeds without effect, as SQS documents."""
        if not isinstance(handle, str) or not handle:
            raise missing_parameter("ReceiptHandle")
        queue = self.queue(name)
        self._throttle(queue, "DeleteMessage")
        self._delete(queue, handle)

    def _delete(self, queue: Queue, handle: str) -> None:
        msg = self._message_for(queue, handle)
        if msg is None or self.hooks.lose_delete(queue.name):
            return
        queue.forget(msg)

    def delete_message_batch(
        self, name: str, entries: list[dict[str, Any]]
    ) -> tuple[list[str], list[tuple[str, SqsError]]]:
        queue = self.queue(name)
        validate_batch_ids(entries, "DeleteMessageBatch")
        self._throttle(queue, "DeleteMessageBatch")
        ok: list[str] = []
        failed: list[tuple[str, SqsError]] = []
        for entry in entries:
            entry_id = str(entry["Id"])
            try:
                handle = entry.get("ReceiptHandle")
                if not isinstance(handle, str) or not handle:
                    raise missing_parameter("ReceiptHandle")
                self._delete(queue, handle)
            except SqsError as exc:
                failed.append((entry_id, exc))
                continue
            ok.append(entry_id)
        return ok, failed

    def change_message_visibility(self, name: str, handle: str, timeout: Any) -> None:
        queue = self.queue(name)
        self._throttle(queue, "ChangeMessageVisibility")
        self._change_visibility(queue, handle, timeout)

    def _change_visibility(self, queue: Queue, handle: Any, timeout: Any) -> None:
        if not isinstance(handle, str) or not handle:
            raise missing_parameter("ReceiptHandle")
        seconds = _as_int(timeout)
        if timeout is None:
            raise missing_parameter("VisibilityTimeout")
        if seconds is None or not 0 <= seconds <= MAX_VISIBILITY_TIMEOUT:
            raise invalid_parameter(
                f"Value {timeout} for parameter VisibilityTimeout is invalid. Reason: Must be "
                ">= 0 and <= 43200, if provided."
            )
        msg = self._message_for(queue, handle)
        if msg is None:
            raise invalid_parameter(
                f"Value {handle} for parameter ReceiptHandle is invalid. Reason: Message does "
                "not exist or is not available for visibility timeout change."
            )
        if msg.state != INFLIGHT:
            raise SqsError("MessageNotInflight", "The specified message isn't in flight.")
        now = self.clock()
        if int(now - msg.received_at) + seconds > MAX_VISIBILITY_TIMEOUT:  # whole seconds
            # ChangeMessageVisibility: "If you attempt to set the VisibilityTimeout to a value
            # greater than the maximum time left, Amazon SQS returns an error" (12 hours from
            # the receive).
            raise invalid_parameter(
                f"Value {timeout} for parameter VisibilityTimeout is invalid. Reason: Total "
                f"VisibilityTimeout for the message is beyond the limit [{MAX_VISIBILITY_TIMEOUT} "
                "seconds]"
            )
        queue.leave_state(msg)
        if seconds == 0:
            queue.make_visible(msg)
            self._notify(queue, 1)
        else:
            queue.make_inflight(msg, now + seconds)

    def change_message_visibility_batch(
        self, name: str, entries: list[dict[str, Any]]
    ) -> tuple[list[str], list[tuple[str, SqsError]]]:
        queue = self.queue(name)
        validate_batch_ids(entries, "ChangeMessageVisibilityBatch")
        self._throttle(queue, "ChangeMessageVisibilityBatch")
        ok: list[str] = []
        failed: list[tuple[str, SqsError]] = []
        for entry in entries:
            entry_id = str(entry["Id"])
            try:
                self._change_visibility(
                    queue, entry.get("ReceiptHandle"), entry.get("VisibilityTimeout", 0)
                )
            except SqsError as exc:
                failed.append((entry_id, exc))
                continue
            ok.append(entry_id)
        return ok, failed

    # -- faults -------------------------------------------------------------------------------
    def force_visibility_expiry(
        self, names: Iterable[str] | None, p: float, rng: random.Random
    ) -> int:
        """Make in-flight messages visible now, each with probability ``p``: O(in-flight)."""
        now = self.clock()
        chosen = 0
        targets = list(self.queues) if names is None else [n for n in names if n in self.queues]
        for name in targets:
            queue = self.queues[name]
            queue.advance(now)
            live = [
                e[3] for e in queue.inflight_heap if e[2] == e[3].gen and e[3].state == INFLIGHT
            ]
            count = 0
            for msg in live:
                if rng.random() < p:
                    queue.leave_state(msg)
                    queue.make_visible(msg)
                    count += 1
            chosen += count
            self._notify(queue, count)
        return chosen

    # -- dead-letter queue redrive ------------------------------------------------------------
    def start_message_move_task(
        self, source_arn: str, destination_arn: str | None = None, rate: int | None = None
    ) -> str:
        source = self._by_arn.get(source_arn) if isinstance(source_arn, str) else None
        if source is None:
            raise SqsError(
                "ResourceNotFoundException",
                "The resource that you specified for the SourceArn parameter doesn't exist.",
            )
        if not any(q.redrive and q.redrive[0] == source_arn for q in self.queues.values()):
            raise invalid_parameter("Source queue must be configured as a Dead Letter Queue.")
        if destination_arn is not None and destination_arn not in self._by_arn:
            raise SqsError(
                "ResourceNotFoundException",
                "The resource that you specified for the DestinationArn parameter doesn't exist.",
            )
        if destination_arn is not None and self._by_arn[destination_arn].fifo != source.fifo:
            raise invalid_parameter(
                "The source queue and the destination queue must be of the same queue type."
            )
        if rate is not None and not 1 <= rate <= MAX_MOVE_RATE:
            raise invalid_parameter(
                f"Value {rate} for parameter MaxNumberOfMessagesPerSecond is invalid. Reason: "
                f"Must be between 1 and {MAX_MOVE_RATE}."
            )
        tasks = self.move_tasks.setdefault(source_arn, [])
        if any(t.status == "RUNNING" for t in tasks):
            raise SqsError(
                "UnsupportedOperation",
                "There is already a task running. Only one active task is allowed for a source "
                "queue arn at a given time.",
            )
        self.queue(source.name)
        handle = base64.urlsafe_b64encode(
            json.dumps({"taskId": self._new_id(), "sourceArn": source_arn}).encode()
        ).decode()
        task = MoveTask(
            handle, source_arn, destination_arn, rate, self.clock(), len(source.visible)
        )
        tasks.append(task)
        del tasks[:-MOVE_TASKS_KEPT]
        if task.to_move == 0:
            task.status = "COMPLETED"
        return handle

    def list_message_move_tasks(
        self, source_arn: str, max_results: int | None = None
    ) -> list[dict[str, Any]]:
        if not isinstance(source_arn, str) or source_arn not in self._by_arn:
            raise SqsError(
                "ResourceNotFoundException",
                "The resource that you specified for the SourceArn parameter doesn't exist.",
            )
        limit = 1 if max_results is None else max_results
        if not 1 <= limit <= 10:
            raise invalid_parameter(
                f"Value {limit} for parameter MaxResults is invalid. Reason: Must be between 1 "
                "and 10."
            )
        tasks = self.move_tasks.get(source_arn, [])
        return [t.describe() for t in reversed(tasks[-limit:])]

    def cancel_message_move_task(self, handle: str) -> int:
        for tasks in self.move_tasks.values():
            for task in tasks:
                if task.handle == handle and task.status == "RUNNING":
                    task.status = "CANCELLED"
                    return task.moved
        raise SqsError("ResourceNotFoundException", "Task does not exist.")

    def running_move_tasks(self) -> bool:
        return any(t.status == "RUNNING" for ts in self.move_tasks.values() for t in ts)

    def step_move_tasks(self, limit: int = 1000) -> bool:
        """Move the messages running tasks are due to move (at most ``limit`` per task).
        Returns True while a task is still running."""
        now = self.clock()
        running = False
        for source_arn, tasks in list(self.move_tasks.items()):
            for task in tasks:
                if task.status != "RUNNING":
                    continue
                self._step_task(task, source_arn, now, limit)
                running = running or task.status == "RUNNING"
        return running

    def _step_task(self, task: MoveTask, source_arn: str, now: float, limit: int) -> None:
        source = self._by_arn.get(source_arn)
        if source is None:
            task.status, task.failure_reason = "FAILED", "The source queue no longer exists."
            return
        self._notify(source, source.advance(now))
        due = task.to_move - task.moved
        if task.rate is not None:
            due = min(due, int(task.rate * (now - task.started_at)) + 1 - task.moved)
        due = min(due, limit)
        woken: dict[str, tuple[Queue, int]] = {}
        while due > 0 and source.visible:
            msg = next(iter(source.visible.values()))
            target_arn = task.destination_arn or msg.dlq_source_arn
            target = self._by_arn.get(target_arn) if target_arn else None
            if target is None:
                task.status = "FAILED"
                task.failure_reason = (
                    f"The destination queue {target_arn} does not exist."
                    if target_arn
                    else "A message has no original source queue to move back to."
                )
                break
            source.forget(msg)
            msg.receive_count = 0
            msg.first_received_at = None
            msg.dlq_source_arn = None
            msg.token = 0
            target.add(msg)
            target.make_visible(msg)
            count = woken.get(target.name, (target, 0))[1]
            woken[target.name] = (target, count + 1)
            task.moved += 1
            due -= 1
        for target, count in woken.values():
            self._notify(target, count)
        if task.status == "RUNNING" and (task.moved >= task.to_move or not source.visible):
            task.status = "COMPLETED"


def _redrive_json(redrive: tuple[str, int]) -> str:
    return json.dumps(
        {"deadLetterTargetArn": redrive[0], "maxReceiveCount": redrive[1]}, separators=(",", ":")
    )
