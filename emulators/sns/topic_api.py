"""The topic operations of the query protocol: topics, their attributes, permissions and tags,
subscriptions and their confirmation, Publish and PublishBatch. Each handler takes the request's
parameters and its region's model and returns the ``<Action>Result`` XML (or None).

ConfirmSubscription and Unsubscribe use the region of the ARN they name: SNS's SubscribeURL and
UnsubscribeURL are plain GETs with no signature to tell the region by.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from emulators.sns.common import parse_sns_arn
from emulators.sns.errors import SnsError
from emulators.sns.model import SnsModel
from emulators.sns.query import (
    e,
    map_xml,
    message_attribute_entries,
    next_token_xml,
    query_list,
    query_map,
    query_members,
    required,
)
from emulators.sns.service import SnsService
from emulators.sns.subscriptions import Subscription

Handler = Callable[[dict[str, Any], SnsModel], Awaitable[str | None]]


def _tags(p: dict[str, Any], prefix: str = "Tags") -> list[tuple[str, str]]:
    return [(m.get("Key", ""), m.get("Value", "")) for m in query_members(p, prefix)]


def _subscription_member(sub: Subscription) -> str:
    return (
        f"<member><SubscriptionArn>{e(sub.listed_arn)}</SubscriptionArn>"
        f"<Owner>{e(sub.owner)}</Owner><Protocol>{e(sub.protocol)}</Protocol>"
        f"<Endpoint>{e(sub.endpoint)}</Endpoint><TopicArn>{e(sub.topic_arn)}</TopicArn></member>"
    )


def _true(value: object) -> bool:
    return str(value).lower() == "true"


class TopicApi:
    def __init__(self, service: SnsService) -> None:
        self.service = service

    def operations(self) -> dict[str, Handler]:
        return {
            "CreateTopic": self.create_topic,
            "DeleteTopic": self.delete_topic,
            "ListTopics": self.list_topics,
            "GetTopicAttributes": self.get_topic_attributes,
            "SetTopicAttributes": self.set_topic_attributes,
            "AddPermission": self.add_permission,
            "RemovePermission": self.remove_permission,
            "TagResource": self.tag_resource,
            "UntagResource": self.untag_resource,
            "ListTagsForResource": self.list_tags_for_resource,
            "Subscribe": self.subscribe,
            "ConfirmSubscription": self.confirm_subscription,
            "Unsubscribe": self.unsubscribe,
            "ListSubscriptions": self.list_subscriptions,
            "ListSubscriptionsByTopic": self.list_subscriptions_by_topic,
            "GetSubscriptionAttributes": self.get_subscription_attributes,
            "SetSubscriptionAttributes": self.set_subscription_attributes,
            "Publish": self.publish,
            "PublishBatch": self.publish_batch,
        }

    def _model_of(self, arn: object, model: SnsModel) -> SnsModel:
        """The model of the region ``arn`` names (``model`` when it names none)."""
        try:
            return self.service.model_for(parse_sns_arn(arn, "TopicArn").region)
        except SnsError:
            return model

    # -- topics --------------------------------------------------------------------------------
    async def create_topic(self, p: dict[str, Any], model: SnsModel) -> str:
        tags = _tags(p)
        if len({k for k, _ in tags}) != len(tags):
            raise SnsError(
                "InvalidParameter", "Invalid parameter: Duplicated keys are not allowed."
            )
        topic = model.topics.create_topic(
            required(p, "Name"), query_map(p, "Attributes"), dict(tags)
        )
        return f"<TopicArn>{e(topic.arn)}</TopicArn>"

    async def delete_topic(self, p: dict[str, Any], model: SnsModel) -> None:
        model.topics.delete_topic(required(p, "TopicArn"))

    async def list_topics(self, p: dict[str, Any], model: SnsModel) -> str:
        topics, token = model.topics.list_topics(p.get("NextToken"))
        members = "".join(f"<member><TopicArn>{e(t.arn)}</TopicArn></member>" for t in topics)
        return f"<Topics>{members}</Topics>{next_token_xml('NextToken', token)}"

    async def get_topic_attributes(self, p: dict[str, Any], model: SnsModel) -> str:
        topic = model.topics.topic(required(p, "TopicArn"))
        return map_xml("Attributes", model.topics.topic_attributes(topic))

    async def set_topic_attributes(self, p: dict[str, Any], model: SnsModel) -> None:
        model.topics.set_topic_attribute(
            required(p, "TopicArn"), required(p, "AttributeName"), p.get("AttributeValue")
        )

    async def add_permission(self, p: dict[str, Any], model: SnsModel) -> None:
        model.topics.add_permission(
            required(p, "TopicArn"),
            required(p, "Label"),
            query_list(p, "AWSAccountId"),
            query_list(p, "ActionName"),
        )

    async def remove_permission(self, p: dict[str, Any], model: SnsModel) -> None:
        model.topics.remove_permission(required(p, "TopicArn"), required(p, "Label"))

    # TagResource and UntagResource answer an empty result element (botocore reads one)
    async def tag_resource(self, p: dict[str, Any], model: SnsModel) -> str:
        model.topics.tag(required(p, "ResourceArn"), _tags(p))
        return ""

    async def untag_resource(self, p: dict[str, Any], model: SnsModel) -> str:
        model.topics.untag(required(p, "ResourceArn"), query_list(p, "TagKeys"))
        return ""

    async def list_tags_for_resource(self, p: dict[str, Any], model: SnsModel) -> str:
        tags = model.topics.tags(required(p, "ResourceArn"))
        members = "".join(
            f"<member><Key>{e(k)}</Key><Value>{e(v)}</Value></member>" for k, v in tags.items()
        )
        return f"<Tags>{members}</Tags>"

    # -- subscriptions ---------------------------------------------------------------------------
    async def subscribe(self, p: dict[str, Any], model: SnsModel) -> str:
        sub, created = model.topics.subscribe(
            required(p, "TopicArn"),
            required(p, "Protocol"),
            p.get("Endpoint"),
            query_map(p, "Attributes"),
            endpoint_exists=lambda arn: arn in model.endpoints,
        )
        if created and sub.pending:
            self.service.fanout.confirmation(model, sub, "SubscriptionConfirmation")
        answer = sub.arn
        if sub.pending and not _true(p.get("ReturnSubscriptionArn")):
            answer = "pending confirmation"
        return f"<SubscriptionArn>{e(answer)}</SubscriptionArn>"

    async def confirm_subscription(self, p: dict[str, Any], model: SnsModel) -> str:
        topic_arn = required(p, "TopicArn")
        model = self._model_of(topic_arn, model)
        sub = model.topics.confirm(
            topic_arn, required(p, "Token"), _true(p.get("AuthenticateOnUnsubscribe"))
        )
        return f"<SubscriptionArn>{e(sub.arn)}</SubscriptionArn>"

    async def unsubscribe(self, p: dict[str, Any], model: SnsModel) -> None:
        arn = required(p, "SubscriptionArn")
        model = self._model_of(arn, model)
        sub = model.topics.unsubscribe(arn)
        if sub is not None and not sub.pending and sub.protocol in ("http", "https"):
            self.service.fanout.confirmation(model, sub, "UnsubscribeConfirmation")

    async def list_subscriptions(self, p: dict[str, Any], model: SnsModel) -> str:
        subs, token = model.topics.list_subscriptions(p.get("NextToken"))
        members = "".join(_subscription_member(s) for s in subs)
        return f"<Subscriptions>{members}</Subscriptions>{next_token_xml('NextToken', token)}"

    async def list_subscriptions_by_topic(self, p: dict[str, Any], model: SnsModel) -> str:
        subs, token = model.topics.list_subscriptions_by_topic(
            required(p, "TopicArn"), p.get("NextToken")
        )
        members = "".join(_subscription_member(s) for s in subs)
        return f"<Subscriptions>{members}</Subscriptions>{next_token_xml('NextToken', token)}"

    async def get_subscription_attributes(self, p: dict[str, Any], model: SnsModel) -> str:
        sub = model.topics.subscription(required(p, "SubscriptionArn"))
        return map_xml("Attributes", sub.attribute_map())

    async def set_subscription_attributes(self, p: dict[str, Any], model: SnsModel) -> None:
        model.topics.set_subscription_attribute(
            required(p, "SubscriptionArn"), required(p, "AttributeName"), p.get("AttributeValue")
        )

    # -- publishing ------------------------------------------------------------------------------
    async def publish(self, p: dict[str, Any], model: SnsModel) -> str:
        required(p, "Message")
        p["MessageAttributes"] = message_attribute_entries(p)
        published = await self.service.publish(p, model)
        out = f"<MessageId>{e(published.message_id)}</MessageId>"
        if published.sequence_number is not None:
            out += f"<SequenceNumber>{e(published.sequence_number)}</SequenceNumber>"
        return out

    async def publish_batch(self, p: dict[str, Any], model: SnsModel) -> str:
        topic_arn = required(p, "TopicArn")
        entries = query_members(p, "PublishBatchRequestEntries")
        for entry in entries:
            entry["MessageAttributes"] = message_attribute_entries(entry)
        successful, failed = await self.service.publish_batch(model, topic_arn, entries)
        ok = "".join(
            "<member>" + "".join(f"<{k}>{e(v)}</{k}>" for k, v in item.items()) + "</member>"
            for item in successful
        )
        bad = "".join(
            "<member>"
            + "".join(
                f"<{k}>{e(str(v).lower() if isinstance(v, bool) else v)}</{k}>"
                for k, v in item.items()
            )
            + "</member>"
            for item in failed
        )
        return f"<Successful>{ok}</Successful><Failed>{bad}</Failed>"
