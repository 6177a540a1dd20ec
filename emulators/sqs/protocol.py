"""The AWS JSON 1.0 protocol of SQS (what boto3 speaks), mapped onto :class:`SqsModel`.

A request is ``POST /`` with ``X-Amz-Target: AmazonSQS.<Operation>`` and a JSON body; the
answer is JSON (``application/x-amz-json-1.0``). Errors are answered as SQS does since it
moved to JSON: ``{"__type": "com.amazonaws.sqs#<Shape>", "message": ...}`` with the error's
HTTP status, plus ``x-amzn-query-error: <legacy code>;Sender|Receiver``. botocore 1.44 reads
that header (``JSONParser._do_query_compatible_error_parse``): ``Error.Code`` becomes the legacy
code (e.g. ``AWS.SimpleQueueService.NonExistentQueue``) and the SQS ``after-call`` handler raises
the modelled exception named by the shape (``client.exceptions.QueueDoesNotExist``), exactly as
against AWS.

Queues are scoped by region, as on AWS: the region of a request is the one its SigV4
credential scope names (``Credential=<key>/<date>/<region>/sqs/aws4_request``), else the one an
AWS-style host names (``sqs.<region>.amazonaws.com``), else the endpoint's default; each region
has its own :class:`SqsModel` (its queues, ARNs ``arn:aws:sqs:<region>:<account>:<name>``, move
tasks). A queue URL is ``http://<host>/<account>/<name>``, the form moto's server answers too.

Long polling (``WaitTimeSeconds``) waits on a future per waiting request, woken when messages
become visible in that queue (a send, a visibility timeout ending, a redrive) or at the time the
next in-flight or delayed message is due: no busy loop.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import itertools
import json
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from emulators.http_server import Request, Response
from emulators.sqs.faults import FaultState
from emulators.sqs.model import (
    Received,
    SendEntry,
    SqsError,
    SqsModel,
    invalid_parameter,
    md5_of_attributes,
    missing_parameter,
    queue_does_not_exist,
)

log = logging.getLogger(__name__)

CONTENT_TYPE = "application/x-amz-json-1.0"
TARGET_PREFIX = "AmazonSQS."
MOVE_STEP_SECONDS = 0.02

THROTTLED = ("RequestThrottled", "Rate exceeded")
_CREDENTIAL_REGION_RE = re.compile(r"Credential=[^/,\s]+/\d{8}/([a-z0-9-]+)/")
_HOST_REGION_RE = re.compile(r"^sqs[.-]([a-z]{2}(?:-[a-z]+)+-\d)\.")


def request_region(headers: dict[str, str], default: str) -> str:
    """The region a request is for: its SigV4 credential scope, else an AWS-style host."""
    match = _CREDENTIAL_REGION_RE.search(headers.get("authorization", ""))
    if match:
        return match.group(1)
    match = _HOST_REGION_RE.match(headers.get("host", ""))
    if match:
        return match.group(1)
    return default


@dataclass
class Call:
    """What an operation needs besides its parameters: the URL base, region and its model."""

    base: str
    region: str
    model: SqsModel


INTERNAL = ("InternalError", "We encountered an internal error. Please try again.")


class _Ids:
    """Cheap unique request ids (a random prefix and a counter)."""

    def __init__(self) -> None:
        self.prefix = os.urandom(8).hex()
        self.counter = itertools.count(1)

    def next(self) -> str:
        return f"{self.prefix}-{next(self.counter):012d}"


def queue_name_from_url(url: Any) -> str:
    """The queue a ``QueueUrl`` names: its last path segment, whatever the host."""
    if not isinstance(url, str) or not url:
        raise missing_parameter("QueueUrl")
    name = url.rstrip("/").rsplit("/", 1)[-1]
    if not name:
        raise queue_does_not_exist()
    return name


def _queue_hint(params: dict[str, Any]) -> str | None:
    """The queue a call concerns, for scoping faults (None: not one queue)."""
    url = params.get("QueueUrl")
    if isinstance(url, str) and url:
        return url.rstrip("/").rsplit("/", 1)[-1]
    name = params.get("QueueName")
    if isinstance(name, str):
        return name
    arn = params.get("SourceArn")
    if isinstance(arn, str):
        return arn.rsplit(":", 1)[-1]
    return None


def _int_param(params: dict[str, Any], name: str) -> int | None:
    value = params.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            return int(value)
        raise invalid_parameter(f"Value {value} for parameter {name} is invalid.")
    return value


def _list_param(params: dict[str, Any], name: str) -> list[Any]:
    value = params.get(name)
    if value is None:
        return []
    if not isinstance(value, list):
        raise invalid_parameter(f"Value for parameter {name} must be a list.")
    return value


def _decode_attributes(raw: Any, field: str = "MessageAttributes") -> dict[str, dict[str, Any]]:
    """JSON message attributes -> the model's form (binary values as bytes)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise invalid_parameter(f"Value for parameter {field} must be a map.")
    out: dict[str, dict[str, Any]] = {}
    for name, value in raw.items():
        if not isinstance(value, dict):
            raise invalid_parameter(f"The message attribute '{name}' is invalid.")
        attr: dict[str, Any] = {"DataType": value.get("DataType")}
        if "StringValue" in value:
            attr["StringValue"] = value["StringValue"]
        if "BinaryValue" in value:
            try:
                attr["BinaryValue"] = base64.b64decode(value["BinaryValue"], validate=True)
            except (binascii.Error, TypeError, ValueError):
                raise invalid_parameter(
                    f"The message attribute '{name}' has an invalid binary value."
                ) from None
        out[str(name)] = attr
    return out


def _encode_attributes(attrs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, value in attrs.items():
        item: dict[str, Any] = {"DataType": value["DataType"]}
        if "BinaryValue" in value and str(value["DataType"]).startswith("Binary"):
            item["BinaryValue"] = base64.b64encode(value["BinaryValue"]).decode("ascii")
        else:
            item["StringValue"] = value["StringValue"]
        out[name] = item
    return out


def _send_entry(params: dict[str, Any], entry_id: str = "") -> SendEntry:
    return SendEntry(
        id=entry_id,
        body=params.get("MessageBody"),  # type: ignore[arg-type]  # validated by the model
        delay_seconds=_int_param(params, "DelaySeconds"),
        attributes=_decode_attributes(params.get("MessageAttributes")),
        system_attributes=_decode_attributes(
            params.get("MessageSystemAttributes"), "MessageSystemAttributes"
        ),
        group_id=params.get("MessageGroupId"),
        deduplication_id=params.get("MessageDeduplicationId"),
    )


def _batch_error(entry_id: str, err: SqsError) -> dict[str, Any]:
    return {
        "Id": entry_id,
        "SenderFault": err.sender_fault,
        "Code": err.code,
        "Message": err.message,
    }


class SqsProtocol:
    """Request handler for the SQS API: one :class:`SqsModel` per region, created on first use
    with the default model's clock, RNG, fault hooks and account."""

    def __init__(
        self,
        model: SqsModel,
        faults: FaultState | None = None,
        base_url: str = "http://127.0.0.1",
    ) -> None:
        self.model = model  # the default region's
        self.models: dict[str, SqsModel] = {model.region: model}
        self.faults = faults if faults is not None else FaultState()
        self.base_url = base_url.rstrip("/")
        self.waiters: dict[tuple[str, str], set[asyncio.Future[None]]] = {}
        self.ids = _Ids()
        self._mover: asyncio.Task[None] | None = None
        # Every copy handed out, in order: (epoch time, queue, message id, receive count,
        # region). The endpoint's own record of what it delivered, ground truth for per-copy
        # accounting.
        self.handouts: list[tuple[float, str, str, int, str]] = []
        model.on_visible = self._waker(model.region)
        self.operations: dict[str, Callable[[dict[str, Any], Call], dict[str, Any]]] = {
            "CreateQueue": self.create_queue,
            "GetQueueUrl": self.get_queue_url,
            "ListQueues": self.list_queues,
            "GetQueueAttributes": self.get_queue_attributes,
            "SetQueueAttributes": self.set_queue_attributes,
            "DeleteQueue": self.delete_queue,
            "PurgeQueue": self.purge_queue,
            "SendMessage": self.send_message,
            "SendMessageBatch": self.send_message_batch,
            "DeleteMessage": self.delete_message,
            "DeleteMessageBatch": self.delete_message_batch,
            "ChangeMessageVisibility": self.change_message_visibility,
            "ChangeMessageVisibilityBatch": self.change_message_visibility_batch,
            "StartMessageMoveTask": self.start_message_move_task,
            "ListMessageMoveTasks": self.list_message_move_tasks,
            "CancelMessageMoveTask": self.cancel_message_move_task,
            "ListDeadLetterSourceQueues": self.list_dead_letter_source_queues,
            "TagQueue": self.tag_queue,
            "UntagQueue": self.untag_queue,
            "ListQueueTags": self.list_queue_tags,
            "AddPermission": self.add_permission,
            "RemovePermission": self.remove_permission,
        }

    # -- regions ------------------------------------------------------------------------------
    def _waker(self, region: str) -> Callable[[str], None]:
        return lambda name: self.wake(name, region)

    def model_for(self, region: str) -> SqsModel:
        """The model of ``region``, created on first use."""
        model = self.models.get(region)
        if model is None:
            base = self.model
            model = SqsModel(
                clock=base.clock,
                rng=base.rng,
                hooks=base.hooks,
                account_id=base.account_id,
                region=region,
                fifo_throughput_limits=base.fifo_throughput_limits,
            )
            model.on_visible = self._waker(region)
            self.models[region] = model
        return model

    # -- responses ----------------------------------------------------------------------------
    def _ok(self, body: dict[str, Any]) -> Response:
        return Response(
            200,
            {"content-type": CONTENT_TYPE, "x-amzn-requestid": self.ids.next()},
            json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8"),
        )

    def error(self, shape: str, message: str, status: int, code: str, sender: bool) -> Response:
        body = {"__type": f"com.amazonaws.sqs#{shape}", "message": message}
        headers = {
            "content-type": CONTENT_TYPE,
            "x-amzn-requestid": self.ids.next(),
            "x-amzn-query-error": f"{code};{'Sender' if sender else 'Receiver'}",
        }
        return Response(status, headers, json.dumps(body, separators=(",", ":")).encode())

    def sqs_error(self, err: SqsError) -> Response:
        return self.error(err.shape, err.message, err.status, err.code, err.sender_fault)

    def _plain_error(self, status: int, shape: str, message: str) -> Response:
        body = {"__type": f"com.amazon.coral.service#{shape}", "message": message}
        headers = {"content-type": CONTENT_TYPE, "x-amzn-requestid": self.ids.next()}
        return Response(status, headers, json.dumps(body).encode())

    def _url_base(self, request: Request) -> str:
        host = request.headers.get("host")
        return f"http://{host}" if host else self.base_url

    def queue_url(self, base: str, name: str) -> str:
        return f"{base}/{self.model.account_id}/{name}"

    # -- dispatch -----------------------------------------------------------------------------
    async def handle(self, request: Request) -> Response:
        if request.method != "POST":
            return self._plain_error(
                405, "UnknownOperationException", "SQS takes POST requests (AWS JSON 1.0)."
            )
        target = request.headers.get("x-amz-target", "")
        if not target.startswith(TARGET_PREFIX):
            return self._plain_error(
                400,
                "UnknownOperationException",
                "Missing or unknown X-Amz-Target: this endpoint speaks the AWS JSON 1.0 "
                "protocol (X-Amz-Target: AmazonSQS.<Operation>).",
            )
        operation = target[len(TARGET_PREFIX) :]
        try:
            params = json.loads(request.body) if request.body else {}
        except ValueError:
            return self._plain_error(400, "SerializationException", "Malformed JSON body.")
        if not isinstance(params, dict):
            return self._plain_error(400, "SerializationException", "The body must be an object.")
        is_receive = operation == "ReceiveMessage"
        if not is_receive and operation not in self.operations:
            return self._plain_error(
                400, "UnknownOperationException", f"Operation {operation} is not supported."
            )
        faults = self.faults
        queue = _queue_hint(params)
        delay = faults.latency_for(queue)
        if delay > 0:
            await asyncio.sleep(delay)
        kind = faults.error_for(queue)
        if kind == "throttling":
            return self.error(*THROTTLED, 400, "RequestThrottled", True)
        if kind == "internal":
            return self.error(*INTERNAL, 500, "InternalError", False)
        region = request_region(request.headers, self.model.region)
        call = Call(self._url_base(request), region, self.model_for(region))
        try:
            if is_receive:
                return self._ok(await self.receive_message(params, call))
            return self._ok(self.operations[operation](params, call))
        except SqsError as err:
            return self.sqs_error(err)

    # -- long polling -------------------------------------------------------------------------
    def wake(self, queue: str, region: str | None = None) -> None:
        waiting = self.waiters.pop((region or self.model.region, queue), None)
        if waiting:
            for fut in waiting:
                if not fut.done():
                    fut.set_result(None)

    def wake_all(self) -> None:
        for region, queue in list(self.waiters):
            self.wake(queue, region)

    async def _wait(self, key: tuple[str, str], timeout: float) -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self.waiters.setdefault(key, set()).add(fut)
        timer = loop.call_later(timeout, lambda: fut.done() or fut.set_result(None))
        try:
            await fut
        finally:
            timer.cancel()
            waiting = self.waiters.get(key)
            if waiting is not None:
                waiting.discard(fut)
                if not waiting:
                    del self.waiters[key]

    async def receive_message(self, params: dict[str, Any], call: Call) -> dict[str, Any]:
        model = call.model
        name = queue_name_from_url(params.get("QueueUrl"))
        max_messages = _int_param(params, "MaxNumberOfMessages")
        visibility = _int_param(params, "VisibilityTimeout")
        wait = _int_param(params, "WaitTimeSeconds")
        attempt = params.get("ReceiveRequestAttemptId")
        got = model.receive_message(name, max_messages, visibility, wait, attempt)
        if not got:
            if wait is None:
                wait = model.queue(name).receive_wait_seconds
            if wait > 0:
                loop = asyncio.get_running_loop()
                deadline = loop.time() + wait
                while not got:
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        break
                    due = model.queue(name).next_due()
                    timeout = remaining
                    if due is not None:
                        timeout = min(remaining, max(0.0, due - model.clock()) + 0.001)
                    await self._wait((call.region, name), timeout)
                    got = model.receive_message(name, max_messages, visibility, None, attempt)
        if not got:
            return {}
        now = model.clock()
        self.handouts.extend(
            (now, name, r.message.id, r.message.receive_count, call.region) for r in got
        )
        system_names = set(_list_param(params, "AttributeNames")) | set(
            _list_param(params, "MessageSystemAttributeNames")
        )
        attribute_names = _list_param(params, "MessageAttributeNames")
        return {"Messages": [self._render(r, system_names, attribute_names) for r in got]}

    @staticmethod
    def _render(
        received: Received, system_names: set[str], attribute_names: list[str]
    ) -> dict[str, Any]:
        msg = received.message
        out: dict[str, Any] = {
            "MessageId": msg.id,
            "ReceiptHandle": received.receipt_handle,
            "MD5OfBody": msg.md5_body,
            "Body": msg.body,
        }
        if system_names:
            values = msg.system_attribute_values(system_names)
            if values:
                out["Attributes"] = values
        attrs = msg.select_attributes(attribute_names)
        if attrs:
            out["MessageAttributes"] = _encode_attributes(attrs)
            out["MD5OfMessageAttributes"] = (
                msg.md5_attributes if attrs is msg.attributes else md5_of_attributes(attrs)
            )
        return out

    # -- queues -------------------------------------------------------------------------------
    def create_queue(self, params: dict[str, Any], call: Call) -> dict[str, Any]:
        attributes = params.get("Attributes") or {}
        tags = params.get("tags")
        if not isinstance(attributes, dict) or not isinstance(tags, dict | None):
            raise invalid_parameter("Attributes and tags must be maps.")
        queue = call.model.create_queue(params.get("QueueName"), attributes, tags)  # type: ignore[arg-type]
        return {"QueueUrl": self.queue_url(call.base, queue.name)}

    def get_queue_url(self, params: dict[str, Any], call: Call) -> dict[str, Any]:
        name = params.get("QueueName")
        if not isinstance(name, str) or not name:
            raise missing_parameter("QueueName")
        return {"QueueUrl": self.queue_url(call.base, call.model.queue(name).name)}

    def list_queues(self, params: dict[str, Any], call: Call) -> dict[str, Any]:
        names, token = call.model.list_queues(
            params.get("QueueNamePrefix"), _int_param(params, "MaxResults"), params.get("NextToken")
        )
        out: dict[str, Any] = {}
        if names:
            out["QueueUrls"] = [self.queue_url(call.base, n) for n in names]
        if token:
            out["NextToken"] = token
        return out

    def get_queue_attributes(self, params: dict[str, Any], call: Call) -> dict[str, Any]:
        name = queue_name_from_url(params.get("QueueUrl"))
        values = call.model.queue_attributes(name, _list_param(params, "AttributeNames"))
        return {"Attributes": values} if values else {}

    def set_queue_attributes(self, params: dict[str, Any], call: Call) -> dict[str, Any]:
        name = queue_name_from_url(params.get("QueueUrl"))
        attributes = params.get("Attributes")
        if not isinstance(attributes, dict):
            raise missing_parameter("Attributes")
        call.model.set_queue_attributes(name, attributes)
        return {}

    def delete_queue(self, params: dict[str, Any], call: Call) -> dict[str, Any]:
        name = queue_name_from_url(params.get("QueueUrl"))
        call.model.delete_queue(name)
        self.wake(name, call.region)
        return {}

    def purge_queue(self, params: dict[str, Any], call: Call) -> dict[str, Any]:
        call.model.purge_queue(queue_name_from_url(params.get("QueueUrl")))
        return {}

    def list_dead_letter_source_queues(self, params: dict[str, Any], call: Call) -> dict[str, Any]:
        names = call.model.dead_letter_source_queues(queue_name_from_url(params.get("QueueUrl")))
        return {"queueUrls": [self.queue_url(call.base, n) for n in names]}

    def tag_queue(self, params: dict[str, Any], call: Call) -> dict[str, Any]:
        name = queue_name_from_url(params.get("QueueUrl"))
        tags = params.get("Tags")
        if tags is not None and not isinstance(tags, dict):
            raise invalid_parameter("Value for parameter Tags must be a map.")
        call.model.tag_queue(name, tags or {})
        return {}

    def untag_queue(self, params: dict[str, Any], call: Call) -> dict[str, Any]:
        name = queue_name_from_url(params.get("QueueUrl"))
        call.model.untag_queue(name, _list_param(params, "TagKeys"))
        return {}

    def list_queue_tags(self, params: dict[str, Any], call: Call) -> dict[str, Any]:
        tags = call.model.queue_tags(queue_name_from_url(params.get("QueueUrl")))
        return {"Tags": tags} if tags else {}

    def add_permission(self, params: dict[str, Any], call: Call) -> dict[str, Any]:
        call.model.add_permission(
            queue_name_from_url(params.get("QueueUrl")),
            params.get("Label"),
            params.get("AWSAccountIds"),
            params.get("Actions"),
        )
        return {}

    def remove_permission(self, params: dict[str, Any], call: Call) -> dict[str, Any]:
        call.model.remove_permission(
            queue_name_from_url(params.get("QueueUrl")), params.get("Label")
        )
        return {}

    # -- messages -----------------------------------------------------------------------------
    @staticmethod
    def _sent(msg: Any) -> dict[str, Any]:
        out = {"MessageId": msg.id, "MD5OfMessageBody": msg.md5_body}
        if msg.md5_attributes is not None:
            out["MD5OfMessageAttributes"] = msg.md5_attributes
        if msg.md5_system is not None:
            out["MD5OfMessageSystemAttributes"] = msg.md5_system
        if msg.sequence_number is not None:
            out["SequenceNumber"] = msg.sequence_number
        return out

    def send_message(self, params: dict[str, Any], call: Call) -> dict[str, Any]:
        name = queue_name_from_url(params.get("QueueUrl"))
        if "MessageBody" not in params:
            raise missing_parameter("MessageBody")
        return self._sent(call.model.send_message(name, _send_entry(params)))

    def send_message_batch(self, params: dict[str, Any], call: Call) -> dict[str, Any]:
        name = queue_name_from_url(params.get("QueueUrl"))
        raw = _list_param(params, "Entries")
        entries = []
        for item in raw:
            if not isinstance(item, dict):
                raise invalid_parameter("Each batch entry must be an object.")
            entries.append(_send_entry(item, str(item.get("Id", ""))))
        ok, failed = call.model.send_message_batch(name, entries)
        return {
            "Successful": [{"Id": entry_id, **self._sent(msg)} for entry_id, msg in ok],
            "Failed": [_batch_error(entry_id, err) for entry_id, err in failed],
        }

    def delete_message(self, params: dict[str, Any], call: Call) -> dict[str, Any]:
        name = queue_name_from_url(params.get("QueueUrl"))
        call.model.delete_message(name, params.get("ReceiptHandle"))  # type: ignore[arg-type]
        return {}

    def _entries(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        entries = _list_param(params, "Entries")
        if not all(isinstance(e, dict) for e in entries):
            raise invalid_parameter("Each batch entry must be an object.")
        return entries

    def delete_message_batch(self, params: dict[str, Any], call: Call) -> dict[str, Any]:
        name = queue_name_from_url(params.get("QueueUrl"))
        ok, failed = call.model.delete_message_batch(name, self._entries(params))
        return {
            "Successful": [{"Id": entry_id} for entry_id in ok],
            "Failed": [_batch_error(entry_id, err) for entry_id, err in failed],
        }

    def change_message_visibility(self, params: dict[str, Any], call: Call) -> dict[str, Any]:
        name = queue_name_from_url(params.get("QueueUrl"))
        call.model.change_message_visibility(
            name,
            params.get("ReceiptHandle"),
            params.get("VisibilityTimeout"),  # type: ignore[arg-type]
        )
        return {}

    def change_message_visibility_batch(self, params: dict[str, Any], call: Call) -> dict[str, Any]:
        name = queue_name_from_url(params.get("QueueUrl"))
        ok, failed = call.model.change_message_visibility_batch(name, self._entries(params))
        return {
            "Successful": [{"Id": entry_id} for entry_id in ok],
            "Failed": [_batch_error(entry_id, err) for entry_id, err in failed],
        }

    # -- dead-letter redrive ------------------------------------------------------------------
    def start_message_move_task(self, params: dict[str, Any], call: Call) -> dict[str, Any]:
        handle = call.model.start_message_move_task(
            params.get("SourceArn"),  # type: ignore[arg-type]
            params.get("DestinationArn"),
            _int_param(params, "MaxNumberOfMessagesPerSecond"),
        )
        self._drive_moves()
        return {"TaskHandle": handle}

    def list_message_move_tasks(self, params: dict[str, Any], call: Call) -> dict[str, Any]:
        results = call.model.list_message_move_tasks(
            params.get("SourceArn"),  # type: ignore[arg-type]
            _int_param(params, "MaxResults"),
        )
        return {"Results": results}

    def cancel_message_move_task(self, params: dict[str, Any], call: Call) -> dict[str, Any]:
        moved = call.model.cancel_message_move_task(params.get("TaskHandle"))  # type: ignore[arg-type]
        return {"ApproximateNumberOfMessagesMoved": moved}

    def _step_all_moves(self) -> bool:
        running = False
        for model in list(self.models.values()):
            running = model.step_move_tasks() or running
        return running

    def _drive_moves(self) -> None:
        """Run the move tasks in the background until none is running."""
        if self._mover is not None and not self._mover.done():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # called outside the server (e.g. a unit test): step once
            self._step_all_moves()
            return
        self._mover = loop.create_task(self._move_loop())

    async def _move_loop(self) -> None:
        try:
            while self._step_all_moves():
                await asyncio.sleep(MOVE_STEP_SECONDS)
        except Exception:  # noqa: BLE001 - keep the endpoint up, say why the task stopped
            log.exception("message move task failed")
