"""A topic's messages delivered to its subscriptions: SQS queues, HTTP/S endpoints, phones
(the SMS ledger) and platform endpoints (mobile push through the providers).

* Each confirmed subscription whose filter policy passes the message gets it (pending ones get
  nothing, as on AWS); the text is the protocol's key of a ``MessageStructure=json`` message,
  else ``default``.
* SQS: SNS's signed JSON envelope, or the message itself with ``RawMessageDelivery`` (the message
  attributes then become SQS message attributes). From a FIFO topic, the message group and
  deduplication id go with it (the group id alone to a standard queue); from a standard topic, a
  ``MessageGroupId`` goes to standard queues (SQS fair queues), as AWS documents.
* **The first attempt at every SQS delivery is made before Publish answers**, so a receive right
  after the Publish finds the message (AWS delivers within milliseconds; a local endpoint has no
  reason to be slower, and clients' tests, moto's among them, rely on it). Failed attempts are
  retried in the background, up to :data:`ATTEMPTS` in all. HTTP/S, SMS-by-topic and mobile push
  are delivered in the background, as AWS does.
* HTTP/S: :mod:`emulators.sns.http_delivery` (loopback only); a new subscription gets its
  ``SubscriptionConfirmation``, a deleted confirmed one its ``UnsubscribeConfirmation``; an SQS
  subscription from another account gets its confirmation in the queue, as on AWS.
* Every delivery attempted (or refused) is a row of the deliveries ledger (``GET
  /_sns/deliveries``): ``provider`` the protocol, ``kind`` Notification /
  SubscriptionConfirmation / UnsubscribeConfirmation, ``delivered``, ``error``, ``attempts``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from emulators.sns import filter_policy
from emulators.sns import messages as msg
from emulators.sns.delivery import TransportError
from emulators.sns.errors import SnsError
from emulators.sns.http_delivery import Refused, headers_for
from emulators.sns.model import SnsModel
from emulators.sns.notifications import confirmation, iso_now, notification
from emulators.sns.subscriptions import Subscription
from emulators.sns.topics import Published, Topic

if TYPE_CHECKING:
    from emulators.sns.service import SnsService

log = logging.getLogger(__name__)

ATTEMPTS = 3
BACKOFF = (0.2, 1.0)


class Fanout:
    """Topic publishes and subscription confirmations, for :class:`SnsService`."""

    def __init__(self, service: SnsService) -> None:
        self.service = service

    # -- publishing ------------------------------------------------------------------------------
    async def publish(
        self,
        model: SnsModel,
        topic: Topic,
        message: str,
        per_protocol: dict[str, Any] | None,
        subject: str | None,
        attributes: dict[str, msg.Attribute],
        *,
        group_id: str | None = None,
        deduplication_id: str | None = None,
        wait: bool = True,
        event_type: str | None = None,
        endpoint_arn: str | None = None,
    ) -> Published:
        """Deliver to every subscription; ``wait``: return after the first SQS attempts."""
        if topic.fifo:
            assert group_id is not None
            published = model.topics.publish_fifo(topic, message, group_id, deduplication_id)
            if published.duplicate:
                return published  # accepted, not delivered again (AWS's deduplication)
        else:
            published = Published(str(uuid.uuid4()))
        timestamp = iso_now()
        first_attempts: list[asyncio.Event] = []
        for sub in model.topics.topic_subscriptions(topic):
            if sub.pending or not filter_policy.matches(sub.filter, attributes, message):
                continue
            text = msg.platform_message(message, per_protocol, sub.protocol) or message
            context = {
                "provider": sub.protocol,
                "topic_arn": topic.arn,
                "subscription_arn": sub.arn,
                "message_id": published.message_id,
                "event_type": event_type,
                "endpoint_arn": endpoint_arn,
                "kind": "Notification",
            }
            if sub.protocol == "sms":
                self._text(model, sub, text, attributes, context)
                continue
            if sub.protocol == "application":
                self._spawn(self._push(model, sub, message, per_protocol, attributes, context))
                continue
            document = None
            if not sub.raw:
                document = json.dumps(
                    notification(
                        signer=self.service.signer,
                        base_url=self.service.base_url,
                        version=topic.signature_version,
                        message_id=published.message_id,
                        topic_arn=topic.arn,
                        subscription_arn=sub.arn,
                        message=text,
                        subject=subject,
                        timestamp=timestamp,
                        attributes=_envelope_attributes(attributes),
                        sequence_number=published.sequence_number,
                    ),
                    ensure_ascii=False,
                )
            if sub.protocol == "sqs":
                first = asyncio.Event()
                first_attempts.append(first)
                send = self._sqs_send(sub, topic, document or text, attributes, published, group_id)
                self._spawn(self._attempts(send, context, first, queue=sub))
            else:
                headers = headers_for(
                    "Notification",
                    published.message_id,
                    topic.arn,
                    sub.arn,
                    raw=sub.raw,
                    content_type=_content_type(sub),
                )
                post = self._post(sub.endpoint, document or text, headers)
                self._spawn(self._attempts(post, {**context, "url": sub.endpoint}))
        if wait and first_attempts:
            await asyncio.gather(*(e.wait() for e in first_attempts))
        return published

    def _sqs_send(
        self,
        sub: Subscription,
        topic: Topic,
        body: str,
        attributes: dict[str, msg.Attribute],
        published: Published,
        group_id: str | None,
    ) -> Callable[[], Awaitable[str]]:
        assert sub.target is not None
        target = sub.target
        fifo_queue = target.queue.endswith(".fifo")
        sqs_attributes = _sqs_attributes(attributes) if sub.raw else None

        async def send() -> str:
            return await self.service.sqs.send_message(
                target,
                body,
                sqs_attributes,
                group_id=group_id,
                deduplication_id=published.deduplication_id if fifo_queue else None,
            )

        return send

    def _post(self, url: str, body: str, headers: dict[str, str]) -> Callable[[], Awaitable[str]]:
        async def post() -> str:
            status = await self.service.http.post(url, body, headers)
            if not 200 <= status < 300:
                raise TransportError(f"the endpoint answered {status}")
            return str(status)

        return post

    async def _attempts(
        self,
        attempt: Callable[[], Awaitable[str]],
        context: dict[str, Any],
        first: asyncio.Event | None = None,
        queue: Subscription | None = None,
    ) -> None:
        """Up to :data:`ATTEMPTS` tries with back-off (none after a refusal); one ledger row."""
        error: str | None = None
        answer: str | None = None
        attempts = 0
        try:
            for attempts in range(1, ATTEMPTS + 1):
                try:
                    answer = await attempt()
                    error = None
                    break
                except Refused as exc:
                    error = str(exc)
                    break
                except TransportError as exc:
                    error = str(exc)[:300]
                finally:
                    if first is not None:
                        first.set()
                if attempts < ATTEMPTS:
                    await asyncio.sleep(BACKOFF[attempts - 1])
        finally:
            if first is not None:
                first.set()
        if error is not None:
            log.warning("sns: delivery of %s failed: %s", context.get("subscription_arn"), error)
        row = dict(context)
        if queue is not None and queue.target is not None:
            sqs = self.service.sqs
            row["queue_url"] = sqs.queue_url(queue.target) if sqs.configured() else None
            row["sqs_message_id"] = answer
        else:
            row["status"] = int(answer) if answer else None
        self.service.deliveries.append(
            **row, delivered=error is None, error=error, attempts=attempts
        )

    def _text(
        self,
        model: SnsModel,
        sub: Subscription,
        text: str,
        attributes: dict[str, msg.Attribute],
        context: dict[str, Any],
    ) -> None:
        number = "+" + "".join(c for c in sub.endpoint if c.isdigit())
        error = None
        try:
            self.service.publish_sms(number, text, None, attributes, model=model, faults=False)
        except SnsError as exc:
            error = exc.message
        self.service.deliveries.append(**context, delivered=error is None, error=error, attempts=1)

    async def _push(
        self,
        model: SnsModel,
        sub: Subscription,
        message: str,
        per_protocol: dict[str, Any] | None,
        attributes: dict[str, msg.Attribute],
        context: dict[str, Any],
    ) -> None:
        error = None
        push_id = None
        try:
            push_id = await self.service.publish_to_endpoint(
                sub.endpoint, message, per_protocol, attributes, model=model
            )
        except SnsError as exc:
            error = f"{exc.code}: {exc.message}"
        self.service.deliveries.append(
            **{**context, "endpoint_arn": sub.endpoint},
            push_message_id=push_id,
            delivered=error is None,
            error=error,
            attempts=1,
        )

    # -- confirmations ---------------------------------------------------------------------------
    def confirmation(self, model: SnsModel, sub: Subscription, kind: str) -> None:
        """Send ``sub`` a SubscriptionConfirmation or an UnsubscribeConfirmation (its token)."""
        topic = model.topics.get(sub.topic_arn)
        if topic is None or sub.protocol not in ("http", "https", "sqs"):
            if sub.protocol in ("email", "email-json"):
                self.service.deliveries.append(
                    provider=sub.protocol,
                    kind=kind,
                    topic_arn=sub.topic_arn,
                    subscription_arn=sub.arn,
                    delivered=False,
                    error="not sent: this endpoint sends no email (the subscription stays pending)",
                    attempts=0,
                )
            return
        token = model.topics.new_token(sub, restore=kind == "UnsubscribeConfirmation")
        message_id = str(uuid.uuid4())
        document = json.dumps(
            confirmation(
                signer=self.service.signer,
                base_url=self.service.base_url,
                version=topic.signature_version,
                kind=kind,
                message_id=message_id,
                topic_arn=topic.arn,
                subscription_arn=sub.arn,
                token=token,
            ),
            ensure_ascii=False,
        )
        context = {
            "provider": sub.protocol,
            "topic_arn": topic.arn,
            "subscription_arn": sub.arn,
            "message_id": message_id,
            "kind": kind,
            "token": token,
        }
        if sub.protocol == "sqs":
            assert sub.target is not None
            target = sub.target

            async def send() -> str:
                return await self.service.sqs.send_message(target, document)

            self._spawn(self._attempts(send, context, queue=sub))
        else:
            headers = headers_for(kind, message_id, topic.arn, content_type=_content_type(sub))
            post = self._post(sub.endpoint, document, headers)
            self._spawn(self._attempts(post, {**context, "url": sub.endpoint}))

    def _spawn(self, coro: Awaitable[None]) -> None:
        self.service.background(coro)


def _content_type(sub: Subscription) -> str | None:
    policy = sub.effective_delivery_policy().get("requestPolicy") or {}
    value = policy.get("headerContentType") if isinstance(policy, dict) else None
    return value if isinstance(value, str) else None


def _envelope_attributes(attributes: dict[str, msg.Attribute]) -> dict[str, tuple[str, str]]:
    return {
        name: (
            attr.data_type,
            base64.b64encode(attr.value).decode() if isinstance(attr.value, bytes) else attr.value,
        )
        for name, attr in attributes.items()
    }


def _sqs_attributes(attributes: dict[str, msg.Attribute]) -> dict[str, Any] | None:
    """Raw delivery: the message attributes as SQS message attributes (at most 10, SQS's limit)."""
    out: dict[str, Any] = {}
    for name, attr in attributes.items():
        if isinstance(attr.value, bytes):
            value = {"BinaryValue": base64.b64encode(attr.value).decode()}
        else:
            value = {"StringValue": attr.value}
        out[name] = {"DataType": attr.data_type, **value}
    return out or None
