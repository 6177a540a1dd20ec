"""Subscriptions: what one is, and the checks of a new one's endpoint and of its attributes,
with AWS's words (see :mod:`emulators.sns.topics` for the choices of our own). Pure."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from emulators.sns import filter_policy
from emulators.sns.common import SqsTarget, parse_sqs_arn
from emulators.sns.errors import invalid_parameter

PROTOCOLS = (
    "http",
    "https",
    "email",
    "email-json",
    "sms",
    "sqs",
    "application",
    "lambda",
    "firehose",
)
DELIVERED = ("sqs", "http", "https", "sms", "application")
CONFIRMED_BY_ENDPOINT = ("http", "https", "email", "email-json")
_SMS_ENDPOINT = re.compile(r"^\+?[1-9][0-9]{1,14}$")
SUBSCRIPTION_ATTRIBUTES = (
    "DeliveryPolicy",
    "FilterPolicy",
    "FilterPolicyScope",
    "RawMessageDelivery",
    "RedrivePolicy",
    "SubscriptionRoleArn",
)
# AWS's default retry policy for HTTP/S endpoints
DEFAULT_HTTP_RETRY = {
    "minDelayTarget": 20,
    "maxDelayTarget": 20,
    "numRetries": 3,
    "numMaxDelayRetries": 0,
    "numNoDelayRetries": 0,
    "numMinDelayRetries": 0,
    "backoffFunction": "linear",
}


def compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


@dataclass
class Subscription:
    arn: str
    topic_arn: str
    protocol: str
    endpoint: str
    owner: str
    pending: bool = False
    authenticated: bool = True  # ConfirmationWasAuthenticated
    raw: bool = False
    filter: filter_policy.FilterPolicy | None = None
    attributes: dict[str, str] = field(default_factory=dict)  # the optional ones, as set
    target: SqsTarget | None = None

    @property
    def listed_arn(self) -> str:
        return "PendingConfirmation" if self.pending else self.arn

    def attribute_map(self) -> dict[str, str]:
        out = {
            "SubscriptionArn": self.arn,
            "TopicArn": self.topic_arn,
            "Protocol": self.protocol,
            "Endpoint": self.endpoint,
            "Owner": self.owner,
            "ConfirmationWasAuthenticated": "true" if self.authenticated else "false",
            "PendingConfirmation": "true" if self.pending else "false",
            "RawMessageDelivery": "true" if self.raw else "false",
        }
        for name, value in self.attributes.items():
            if name not in ("FilterPolicyScope", "RawMessageDelivery"):
                out[name] = value
        if "FilterPolicy" in self.attributes:  # AWS names the scope only beside a policy
            out["FilterPolicyScope"] = self.scope
        if self.protocol in ("http", "https"):
            out["EffectiveDeliveryPolicy"] = compact(self.effective_delivery_policy())
        return out

    @property
    def scope(self) -> str:
        return self.attributes.get("FilterPolicyScope", filter_policy.ATTRIBUTES)

    def effective_delivery_policy(self) -> dict[str, Any]:
        policy: dict[str, Any] = {
            "healthyRetryPolicy": dict(DEFAULT_HTTP_RETRY),
            "sicklyRetryPolicy": None,
            "throttlePolicy": None,
            "requestPolicy": {"headerContentType": "text/plain; charset=UTF-8"},
            "guaranteed": False,
        }
        try:
            own = json.loads(self.attributes.get("DeliveryPolicy") or "{}")
        except ValueError:
            own = {}
        if isinstance(own, dict):
            policy.update({k: v for k, v in own.items() if v is not None})
        return policy


@dataclass
class Confirmation:
    """A token sent to an endpoint: it confirms a pending subscription, or (sent on
    unsubscribing) brings an unsubscribed one back."""

    topic_arn: str
    subscription_arn: str
    expires: float
    restore: Subscription | None = None


def check_endpoint(
    fifo: bool, protocol: str, endpoint: str, endpoint_exists: Callable[[str], bool]
) -> SqsTarget | None:
    """The endpoint of a new subscription, checked (an ``sqs`` one's queue, parsed)."""
    target = None
    if protocol in ("http", "https") and not endpoint.lower().startswith(f"{protocol}://"):
        raise invalid_parameter("Invalid parameter: Endpoint must match the specified protocol")
    if protocol == "sms" and (
        re.search(r"[./-]{2,}|^[./-]|[./-]$", endpoint)
        or not _SMS_ENDPOINT.match(re.sub(r"[./-]", "", endpoint))
    ):
        raise invalid_parameter(f"Invalid SMS endpoint: {endpoint}")
    if protocol == "sqs":
        target = parse_sqs_arn(endpoint)
        if target.queue.endswith(".fifo") and not fifo:
            raise invalid_parameter(
                "Invalid parameter: Invalid parameter: Endpoint Reason: FIFO SQS Queues can "
                "not be subscribed to standard SNS topics"
            )
    if protocol == "application" and not endpoint_exists(endpoint):
        raise invalid_parameter(
            f"Invalid parameter: Endpoint Reason: Endpoint does not exist for endpoint arn{endpoint}"
        )
    if protocol not in DELIVERED and protocol not in ("email", "email-json"):
        raise invalid_parameter(
            f"Invalid parameter: Protocol Reason: {protocol} is not delivered by this endpoint "
            f"(it delivers {', '.join(DELIVERED)}; email stays pending)"
        )
    if fifo and protocol != "sqs":
        raise invalid_parameter(
            f"Invalid parameter: Protocol Reason: FIFO topics deliver to Amazon SQS queues "
            f"only, not {protocol}"
        )
    return target


def check_attribute(name: object, value: object, subscribe: bool) -> str:
    """A subscription attribute's value to keep; InvalidParameter (AWS's words) otherwise."""
    prefix = "Invalid parameter: Attributes Reason: " if subscribe else "Invalid parameter: "
    if name not in SUBSCRIPTION_ATTRIBUTES:
        raise invalid_parameter(f"{prefix}AttributeName")
    text = "" if value is None else str(value)
    if name == "RawMessageDelivery":
        if text.lower() not in ("true", "false"):
            raise invalid_parameter(
                f"{prefix}RawMessageDelivery: Invalid value [{text}]. Must be true or false."
            )
        return text.lower()
    if name == "FilterPolicyScope":
        return filter_policy.check_scope(text)
    if name in ("DeliveryPolicy", "RedrivePolicy") and text:
        try:
            parsed = json.loads(text)
        except ValueError:
            raise invalid_parameter(f"{prefix}{name}: failed to parse JSON.") from None
        if name == "RedrivePolicy" and not str(
            (parsed or {}).get("deadLetterTargetArn", "")
        ).startswith("arn:"):
            raise invalid_parameter(f"{prefix}RedrivePolicy: deadLetterTargetArn is an invalid arn")
    return text


def policy_of(
    attributes: dict[str, str], subscribe: bool, scope: str | None = None
) -> filter_policy.FilterPolicy | None:
    scope = attributes.get("FilterPolicyScope", scope or filter_policy.ATTRIBUTES)
    return filter_policy.parse(attributes.get("FilterPolicy"), scope, subscribe=subscribe)


def apply_attributes(
    sub: Subscription, attributes: dict[str, str], policy: filter_policy.FilterPolicy | None
) -> None:
    for name, value in attributes.items():
        if name == "RawMessageDelivery":
            sub.raw = value == "true"
        elif name == "FilterPolicy" and not value:
            # AWS: an empty policy removes the policy (and the scope is no longer shown)
            sub.attributes.pop("FilterPolicy", None)
            sub.attributes.pop("FilterPolicyScope", None)
            continue
        sub.attributes[name] = value
    if "FilterPolicy" in attributes or "FilterPolicyScope" in attributes:
        sub.filter = policy if "FilterPolicy" in sub.attributes else None


SUB_DEFAULTS = {"RawMessageDelivery": "false", "FilterPolicyScope": filter_policy.ATTRIBUTES}
