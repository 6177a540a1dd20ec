"""Topics and their subscriptions for one account in one region, pure: what SNS keeps and checks.

Delivery is :mod:`emulators.sns.fanout`'s. The behaviour is AWS's, as its API reference says it
and, where the reference is silent, as AWS answered (the error words recorded against AWS in
LocalStack's snapshot tests); the choices of our own are said here:

* Topic names: ``[A-Za-z0-9_-]{1,256}``, a FIFO topic's ending ``.fifo`` (``FifoTopic``);
  anything else is ``Invalid parameter: Topic Name``. CreateTopic is idempotent; naming an
  attribute or a tag that differs from the existing topic's is an error.
* A topic ARN of another region is ``Invalid parameter: TopicArn`` (AWS: topics are regional).
* Protocols: every one SNS has is accepted by Subscribe's checks, but only ``sqs``, ``http``,
  ``https``, ``sms`` and ``application`` are delivered here. ``email`` and ``email-json`` stay
  pending (no mail is sent, so nobody confirms them, as on AWS with an address nobody reads);
  ``lambda`` and ``firehose`` are refused with a reason, there being no Lambda or Firehose to
  deliver to. FIFO topics deliver to SQS queues only.
* Pending confirmation, as on AWS: ``http``/``https``/``email``/``email-json`` subscriptions, and
  ``sqs`` ones whose queue is in another account, until ConfirmSubscription with the token that
  was sent; Subscribe then answers ``pending confirmation`` (unless ``ReturnSubscriptionArn``)
  and the listings show ``PendingConfirmation`` as the ARN. Tokens last two days.
* FIFO topics keep each deduplication id five minutes (per topic, or per message group with
  ``FifoThroughputScope=MessageGroup``): a repeat is accepted, answers the first message's id
  and sequence number, and is not delivered (SQS answers its duplicates the same way).
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from emulators.sns import filter_policy
from emulators.sns.common import (
    OrderedPages,
    bool_text,
    parse_sns_arn,
    sns_arn,
)
from emulators.sns.errors import SnsError, authorization_error, invalid_parameter, not_found
from emulators.sns.subscriptions import (
    CONFIRMED_BY_ENDPOINT,
    DEFAULT_HTTP_RETRY,
    PROTOCOLS,
    SUB_DEFAULTS,
    Confirmation,
    Subscription,
    apply_attributes,
    check_attribute,
    check_endpoint,
    compact,
    policy_of,
)

TOKEN_LIFETIME = 2 * 24 * 3600.0  # AWS: confirmation tokens are valid for two days
DEDUP_WINDOW = 300.0  # AWS: the five-minute deduplication interval of FIFO topics
MAX_TAGS = 50
DEFAULT_MAX_MESSAGE_SIZE = 262144
_TOPIC_NAME = re.compile(r"^[A-Za-z0-9_-]{1,256}$")
_FIFO_TOPIC_NAME = re.compile(r"^[A-Za-z0-9_-]{1,251}\.fifo$")
_FIFO_TOKEN = re.compile(r"^[!-~]{1,128}$")  # alphanumerics and punctuation, 1 to 128
_ACCOUNT = re.compile(r"^\d{12}$")
_FEEDBACK = tuple(
    f"{proto}{kind}"
    for proto in ("Application", "Firehose", "HTTP", "Lambda", "SQS")
    for kind in ("SuccessFeedbackRoleArn", "SuccessFeedbackSampleRate", "FailureFeedbackRoleArn")
)
TOPIC_ATTRIBUTES = frozenset(
    {
        "DeliveryPolicy",
        "DisplayName",
        "Policy",
        "TracingConfig",
        "KmsMasterKeyId",
        "SignatureVersion",
        "ContentBasedDeduplication",
        "FifoThroughputScope",
        "ArchivePolicy",
        "MaximumMessageSize",
        *_FEEDBACK,
    }
)
POLICY_ACTIONS = (
    "GetTopicAttributes",
    "SetTopicAttributes",
    "AddPermission",
    "RemovePermission",
    "DeleteTopic",
    "Subscribe",
    "ListSubscriptionsByTopic",
    "Publish",
)
EFFECTIVE_TOPIC_DELIVERY_POLICY = {
    "http": {
        "defaultHealthyRetryPolicy": DEFAULT_HTTP_RETRY,
        "disableSubscriptionOverrides": False,
        "defaultRequestPolicy": {"headerContentType": "text/plain; charset=UTF-8"},
    }
}


@dataclass
class Topic:
    arn: str
    name: str
    account: str
    fifo: bool
    attributes: dict[str, str]
    tags: dict[str, str] = field(default_factory=dict)
    subscriptions: OrderedPages = field(default_factory=OrderedPages)
    # FIFO: dedup key -> (expires, message id, sequence number), oldest first
    dedup: OrderedDict[str, tuple[float, str, str]] = field(default_factory=OrderedDict)
    last_sequence: int = 0

    @property
    def content_based_deduplication(self) -> bool:
        return self.attributes.get("ContentBasedDeduplication") == "true"

    @property
    def signature_version(self) -> str:
        return self.attributes.get("SignatureVersion", "1")

    @property
    def max_message_size(self) -> int:
        return int(self.attributes.get("MaximumMessageSize", DEFAULT_MAX_MESSAGE_SIZE))

    def default_policy(self) -> dict[str, Any]:
        return {
            "Version": "2008-10-17",
            "Id": "__default_policy_ID",
            "Statement": [
                {
                    "Sid": "__default_statement_ID",
                    "Effect": "Allow",
                    "Principal": {"AWS": "*"},
                    "Action": [f"SNS:{a}" for a in POLICY_ACTIONS],
                    "Resource": self.arn,
                    "Condition": {"StringEquals": {"AWS:SourceOwner": self.account}},
                }
            ],
        }

    def policy_text(self) -> str:
        return self.attributes.get("Policy") or compact(self.default_policy())

    def editable_policy(self) -> dict[str, Any]:
        """The policy, its ``Statement`` a list (AddPermission and RemovePermission edit it)."""
        policy = json.loads(self.policy_text())
        statements = policy.get("Statement", [])
        policy["Statement"] = [statements] if isinstance(statements, dict) else list(statements)
        return policy


@dataclass
class Published:
    """What a FIFO topic made of one publish."""

    message_id: str
    sequence_number: str | None = None
    duplicate: bool = False
    deduplication_id: str | None = None


class Topics:
    """Every topic and subscription of one account in one region."""

    def __init__(self, region: str, account: str, clock: Callable[[], float]) -> None:
        self.region = region
        self.account = account
        self.clock = clock
        self.topics: dict[str, Topic] = {}
        self.topic_pages = OrderedPages()
        self.subscriptions: dict[str, Subscription] = {}
        self.subscription_pages = OrderedPages()
        self.tokens: dict[str, Confirmation] = {}

    def __len__(self) -> int:
        return len(self.topics)

    def get(self, arn: str) -> Topic | None:
        return self.topics.get(arn)

    # -- topics --------------------------------------------------------------------------------
    def _arn(self, arn: object, parameter: str = "TopicArn") -> str:
        parts = parse_sns_arn(arn, parameter)
        if parts.region != self.region:
            raise invalid_parameter(f"Invalid parameter: {parameter}")
        if parts.account != self.account:
            raise authorization_error(
                f"User: arn:aws:iam::{self.account}:root is not authorized to access {arn}"
            )
        return str(arn)

    def topic(self, arn: object) -> Topic:
        topic = self.topics.get(self._arn(arn))
        if topic is None:
            raise not_found("Topic does not exist")
        return topic

    def create_topic(
        self, name: object, attributes: dict[str, str], tags: dict[str, str] | None = None
    ) -> Topic:
        attributes = dict(attributes)
        fifo = bool_text(attributes.pop("FifoTopic", "false"), "FifoTopic") == "true"
        pattern = _FIFO_TOPIC_NAME if fifo else _TOPIC_NAME
        if not isinstance(name, str) or not pattern.match(name):
            raise invalid_parameter("Invalid parameter: Topic Name")
        checked = {
            k: self._topic_attribute(fifo, k, v, "Attributes") for k, v in attributes.items()
        }
        arn = sns_arn(self.region, name, self.account)
        existing = self.topics.get(arn)
        if existing is not None:
            if any(existing.attributes.get(k, _DEFAULTS.get(k)) != v for k, v in checked.items()):
                raise invalid_parameter(
                    "Invalid parameter: Attributes Reason: Topic already exists with different "
                    "attributes"
                )
            if tags and any(existing.tags.get(k) != v for k, v in tags.items()):
                raise invalid_parameter(
                    "Invalid parameter: Tags Reason: Topic already exists with different tags"
                )
            return existing
        if fifo:
            checked.setdefault("ContentBasedDeduplication", "false")
        topic = Topic(arn, name, self.account, fifo, checked)
        if tags:
            self._check_tags(topic, tags)
            topic.tags.update(tags)
        self.topics[arn] = topic
        self.topic_pages.add(arn)
        return topic

    def _topic_attribute(self, fifo: bool, name: str, value: object, parameter: str) -> str:
        """The value to keep for a settable topic attribute; InvalidParameter when wrong."""
        if name not in TOPIC_ATTRIBUTES:
            raise invalid_parameter(f"Invalid parameter: {parameter}")
        text = "" if value is None else str(value)
        if name == "Policy":
            try:
                policy = json.loads(text)
            except ValueError:
                policy = None
            if not isinstance(policy, dict):
                raise invalid_parameter("Invalid parameter: Policy Error: null")
            return compact(policy)  # AWS answers policies compact
        if name == "ContentBasedDeduplication":
            text = bool_text(text, name)
            if not fifo and text == "true":
                raise invalid_parameter(
                    "Invalid parameter: Attributes Reason: ContentBasedDeduplication can only be "
                    "set for FIFO topics"
                )
        elif name == "FifoThroughputScope":
            if not fifo or text not in ("Topic", "MessageGroup"):
                raise invalid_parameter(f"Invalid parameter: {name}")
        elif name == "SignatureVersion" and text not in ("1", "2"):
            raise invalid_parameter(f"Invalid parameter: {name}")
        elif name == "TracingConfig" and text not in ("PassThrough", "Active"):
            raise invalid_parameter(f"Invalid parameter: {name}")
        elif name == "MaximumMessageSize" and not (text.isdigit() and 1024 <= int(text) <= 1048576):
            raise invalid_parameter(f"Invalid parameter: {name}")
        return text

    def set_topic_attribute(self, arn: object, name: object, value: object) -> None:
        topic = self.topic(arn)
        if not isinstance(name, str) or name == "FifoTopic":
            raise invalid_parameter("Invalid parameter: AttributeName")
        topic.attributes[name] = self._topic_attribute(topic.fifo, name, value, "AttributeName")

    def topic_attributes(self, topic: Topic) -> dict[str, str]:
        subs = [self.subscriptions[a] for a in topic.subscriptions.page(None, size=1 << 30)[0]]
        pending = sum(s.pending for s in subs)
        out = {
            "TopicArn": topic.arn,
            "Owner": topic.account,
            "Policy": topic.policy_text(),
            "DisplayName": "",
            "SubscriptionsConfirmed": str(len(subs) - pending),
            "SubscriptionsPending": str(pending),
            "SubscriptionsDeleted": "0",
            "EffectiveDeliveryPolicy": compact(EFFECTIVE_TOPIC_DELIVERY_POLICY),
        }
        out.update({k: v for k, v in topic.attributes.items() if k != "Policy"})
        if topic.fifo:
            out["FifoTopic"] = "true"
        return out

    def delete_topic(self, arn: object) -> None:
        topic = self.topics.pop(self._arn(arn), None)
        if topic is None:
            return  # AWS: DeleteTopic is idempotent
        self.topic_pages.remove(topic.arn)
        for sub_arn in topic.subscriptions.page(None, size=1 << 30)[0]:
            self.subscriptions.pop(sub_arn, None)
            self.subscription_pages.remove(sub_arn)

    def list_topics(self, next_token: str | None) -> tuple[list[Topic], str | None]:
        arns, token = self.topic_pages.page(next_token)
        return [self.topics[a] for a in arns], token

    # -- permissions -----------------------------------------------------------------------------
    def add_permission(
        self, arn: object, label: object, accounts: list[str], actions: list[str]
    ) -> None:
        topic = self.topic(arn)
        policy = topic.editable_policy()
        if not isinstance(label, str) or not label:
            raise invalid_parameter("Invalid parameter: Label")
        if any(isinstance(s, dict) and s.get("Sid") == label for s in policy["Statement"]):
            raise invalid_parameter("Invalid parameter: Statement already exists")
        if not actions or any(a not in (*POLICY_ACTIONS, "Receive") for a in actions):
            raise invalid_parameter(
                "Invalid parameter: Policy statement action out of service scope!"
            )
        if not accounts or any(not _ACCOUNT.match(a) for a in accounts):
            raise invalid_parameter("Invalid parameter: AWSAccountId")
        principals = [f"arn:aws:iam::{a}:root" for a in accounts]
        sns_actions = [f"SNS:{a}" for a in actions]
        policy["Statement"].append(
            {
                "Sid": label,
                "Effect": "Allow",
                "Principal": {"AWS": principals[0] if len(principals) == 1 else principals},
                "Action": sns_actions[0] if len(sns_actions) == 1 else sns_actions,
                "Resource": topic.arn,
            }
        )
        topic.attributes["Policy"] = compact(policy)

    def remove_permission(self, arn: object, label: object) -> None:
        topic = self.topic(arn)
        policy = topic.editable_policy()
        policy["Statement"] = [
            s for s in policy["Statement"] if not isinstance(s, dict) or s.get("Sid") != label
        ]
        topic.attributes["Policy"] = compact(policy)

    # -- tags ------------------------------------------------------------------------------------
    def _tagged(self, arn: object) -> Topic:
        topic = self.topics.get(arn) if isinstance(arn, str) else None  # type: ignore[arg-type]
        if topic is None:
            raise SnsError("ResourceNotFound", "Resource does not exist", 404)
        return topic

    @staticmethod
    def _check_tags(topic: Topic, tags: dict[str, str]) -> None:
        if len({**topic.tags, **tags}) > MAX_TAGS:
            raise SnsError(
                "TagLimitExceeded", "Could not complete request: tag quota of per resource exceeded"
            )

    def tag(self, arn: object, tags: list[tuple[str, str]]) -> None:
        topic = self._tagged(arn)
        keys = [k for k, _ in tags]
        if len(set(keys)) != len(keys):
            raise invalid_parameter("Invalid parameter: Duplicated keys are not allowed.")
        new = dict(tags)
        self._check_tags(topic, new)
        topic.tags.update(new)

    def untag(self, arn: object, keys: list[str]) -> None:
        topic = self._tagged(arn)
        for key in keys:
            topic.tags.pop(key, None)

    def tags(self, arn: object) -> dict[str, str]:
        return dict(self._tagged(arn).tags)

    # -- subscriptions ---------------------------------------------------------------------------
    def subscribe(
        self,
        topic_arn: object,
        protocol: object,
        endpoint: object,
        attributes: dict[str, str],
        endpoint_exists: Callable[[str], bool] = lambda arn: True,
    ) -> tuple[Subscription, bool]:
        """(subscription, created): the existing one when the same endpoint subscribes again."""
        topic = self.topic(topic_arn)
        if protocol not in PROTOCOLS:
            raise invalid_parameter(
                f"Invalid parameter: Amazon SNS does not support this protocol string: {protocol}"
            )
        if not isinstance(endpoint, str) or not endpoint:
            raise invalid_parameter("Invalid parameter: Endpoint")
        target = check_endpoint(topic.fifo, str(protocol), endpoint, endpoint_exists)
        checked = {k: check_attribute(k, v, True) for k, v in attributes.items()}
        policy = policy_of(checked, True)
        for sub_arn in topic.subscriptions.page(None, size=1 << 30)[0]:
            sub = self.subscriptions[sub_arn]
            if sub.protocol == protocol and sub.endpoint == endpoint:
                if any(
                    sub.attribute_map().get(k, SUB_DEFAULTS.get(k)) != v for k, v in checked.items()
                ):
                    raise invalid_parameter(
                        "Invalid parameter: Attributes Reason: Subscription already exists with "
                        "different attributes"
                    )
                return sub, False
        pending = protocol in CONFIRMED_BY_ENDPOINT or (
            target is not None and target.account != self.account
        )
        sub = Subscription(
            arn=f"{topic.arn}:{uuid.uuid4()}",
            topic_arn=topic.arn,
            protocol=str(protocol),
            endpoint=endpoint,
            owner=self.account,
            pending=pending,
            authenticated=not pending,
            target=target,
        )
        apply_attributes(sub, checked, policy)
        self.subscriptions[sub.arn] = sub
        self.subscription_pages.add(sub.arn)
        topic.subscriptions.add(sub.arn)
        return sub, True

    def subscription(self, arn: object) -> Subscription:
        if not isinstance(arn, str) or len(arn.split(":")) < 6:
            parse_sns_arn(arn, "SubscriptionArn")  # AWS's words for a malformed ARN
        sub = self.subscriptions.get(arn)  # type: ignore[arg-type]
        if sub is None:
            raise not_found("Subscription does not exist")
        return sub

    def set_subscription_attribute(self, arn: object, name: object, value: object) -> None:
        sub = self.subscription(arn)
        checked = {str(name): check_attribute(name, value, False)}
        policy_text = checked.get("FilterPolicy", sub.attributes.get("FilterPolicy"))
        scope = checked.get("FilterPolicyScope", sub.scope)
        policy = filter_policy.parse(policy_text, scope) if policy_text else None
        apply_attributes(sub, checked, policy)

    def unsubscribe(self, arn: object) -> Subscription | None:
        if not isinstance(arn, str) or len(arn.split(":")) < 6:
            parse_sns_arn(arn, "SubscriptionArn")
        sub = self.subscriptions.pop(arn, None)  # type: ignore[arg-type]
        if sub is None:
            return None  # AWS: unsubscribing twice is not an error
        self.subscription_pages.remove(sub.arn)
        topic = self.topics.get(sub.topic_arn)
        if topic is not None:
            topic.subscriptions.remove(sub.arn)
        return sub

    def topic_subscriptions(self, topic: Topic) -> list[Subscription]:
        return [self.subscriptions[a] for a in topic.subscriptions.page(None, size=1 << 30)[0]]

    def list_subscriptions(self, next_token: str | None) -> tuple[list[Subscription], str | None]:
        arns, token = self.subscription_pages.page(next_token)
        return [self.subscriptions[a] for a in arns], token

    def list_subscriptions_by_topic(
        self, topic_arn: object, next_token: str | None
    ) -> tuple[list[Subscription], str | None]:
        topic = self.topic(topic_arn)
        arns, token = topic.subscriptions.page(next_token)
        return [self.subscriptions[a] for a in arns], token

    # -- confirmation ----------------------------------------------------------------------------
    def new_token(self, sub: Subscription, restore: bool = False) -> str:
        """A confirmation token for ``sub`` (``restore``: it brings an unsubscribed one back)."""
        token = secrets.token_hex(144)  # AWS's tokens are 288 hex digits
        now = self.clock()
        for stale in [t for t, c in self.tokens.items() if c.expires <= now]:
            del self.tokens[stale]
        self.tokens[token] = Confirmation(
            sub.topic_arn, sub.arn, now + TOKEN_LIFETIME, sub if restore else None
        )
        return token

    def confirm(self, topic_arn: object, token: object, authenticate: bool) -> Subscription:
        try:
            arn = self._arn(topic_arn)
        except SnsError:
            raise invalid_parameter("Invalid parameter: Topic") from None
        if not isinstance(token, str) or not re.fullmatch(r"[0-9a-fA-F]{16,}", token):
            raise invalid_parameter("Invalid token")
        confirmation = self.tokens.get(token)
        topic = self.topics.get(arn)
        if (
            confirmation is None
            or topic is None
            or confirmation.topic_arn != arn
            or confirmation.expires <= self.clock()
        ):
            raise invalid_parameter("Invalid parameter: Token")
        sub = self.subscriptions.get(confirmation.subscription_arn)
        if sub is None and confirmation.restore is not None:
            sub = confirmation.restore
            self.subscriptions[sub.arn] = sub
            self.subscription_pages.add(sub.arn)
            topic.subscriptions.add(sub.arn)
        if sub is None:
            raise invalid_parameter("Invalid parameter: Token")
        if sub.pending:
            sub.pending = False
            sub.authenticated = authenticate
        return sub

    # -- FIFO ------------------------------------------------------------------------------------
    def publish_fifo(
        self, topic: Topic, message: str, group_id: str, dedup_id: str | None
    ) -> Published:
        """The message id and sequence number of a FIFO publish, or the first one's for a
        repeat inside the deduplication window (``duplicate``: not to be delivered)."""
        now = self.clock()
        dedup_id = dedup_id or hashlib.sha256(message.encode("utf-8")).hexdigest()
        per_group = topic.attributes.get("FifoThroughputScope") == "MessageGroup"
        key = f"{group_id}\x1f{dedup_id}" if per_group else dedup_id
        while topic.dedup:
            oldest_key, (expires, _, _) = next(iter(topic.dedup.items()))
            if expires > now:
                break
            del topic.dedup[oldest_key]
        seen = topic.dedup.get(key)
        if seen is not None:
            return Published(seen[1], seen[2], True, dedup_id)
        candidate = (int(now * 1_000_000) << 8) % 10**20
        topic.last_sequence = max(topic.last_sequence + 1, candidate)
        published = Published(str(uuid.uuid4()), f"{topic.last_sequence:020d}", False, dedup_id)
        topic.dedup[key] = (now + DEDUP_WINDOW, published.message_id, published.sequence_number)
        return published


def check_fifo_parameters(topic: Topic, group_id: object, dedup_id: object) -> None:
    """Publish's FIFO rules, with AWS's words."""
    for name, value in (("MessageGroupId", group_id), ("MessageDeduplicationId", dedup_id)):
        if value is not None and (not isinstance(value, str) or not _FIFO_TOKEN.match(value)):
            raise invalid_parameter(
                f"Invalid parameter: {name} Reason: {name} can only include alphanumeric and "
                "punctuation characters. 1 to 128 in length."
            )
    if not topic.fifo:
        if dedup_id is not None:
            raise invalid_parameter(
                "Invalid parameter: MessageDeduplicationId Reason: The request includes "
                "MessageDeduplicationId parameter that is not valid for this topic type"
            )
        return
    if group_id is None:
        raise invalid_parameter(
            "Invalid parameter: The MessageGroupId parameter is required for FIFO topics"
        )
    if dedup_id is None and not topic.content_based_deduplication:
        raise invalid_parameter(
            "Invalid parameter: The topic should either have ContentBasedDeduplication enabled "
            "or MessageDeduplicationId provided explicitly"
        )


_DEFAULTS = {"DisplayName": "", "ContentBasedDeduplication": "false", "SignatureVersion": "1"}
