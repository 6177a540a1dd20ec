"""What a Publish says, and what SNS makes of it: pure functions, no I/O.

* :func:`message_attributes`: the ``MessageAttributes`` map, checked (``ParameterValueInvalid``
  as SNS answers for a bad type or an empty value);
* :func:`platform_message`: the message for one platform from a plain or ``MessageStructure=json``
  Publish (the platform's key, else ``default``);
* :func:`apns_request` / :func:`fcm_request`: the provider request SNS sends, with the headers
  and fields SNS sets from the reserved ``AWS.SNS.MOBILE.*`` attributes;
* :func:`classify`: the provider's answer as an :class:`Outcome` (delivered, token dead,
  throttled, provider error, rejected);
* :func:`sms_parts`: how many SMS parts a text takes (GSM-7 or UCS-2).

Reserved attributes (AWS's names): ``AWS.SNS.MOBILE.APNS.COLLAPSE_ID`` -> ``apns-collapse-id``,
``AWS.SNS.MOBILE.APNS.PUSH_TYPE`` -> ``apns-push-type`` (default: ``background`` for a payload
with only ``content-available``, else ``alert``), ``AWS.SNS.MOBILE.APNS.PRIORITY`` ->
``apns-priority`` (default 10, 5 for background), ``AWS.SNS.MOBILE.APNS.TTL`` /
``AWS.SNS.MOBILE.APNS_SANDBOX.TTL`` -> ``apns-expiration`` (publish time + TTL; 0 stays 0),
``AWS.SNS.MOBILE.APNS.TOPIC`` -> ``apns-topic`` (default: the application's bundle id or
certificate topic), ``AWS.SNS.MOBILE.FCM.TTL`` (or the older ``AWS.SNS.MOBILE.GCM.TTL``) ->
``android.ttl`` (it wins over a TTL in the payload, as AWS documents). ``apns-id`` is the SNS MessageId.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass
from typing import Any

from emulators.sns.errors import invalid_parameter, parameter_value_invalid

MAX_MESSAGE_BYTES = 256 * 1024
MAX_TOPIC_MESSAGE_BYTES = 1024 * 1024  # a topic's MaximumMessageSize may go up to 1 MiB
MAX_SMS_CHARS = 1600
APNS_TTL = {"APNS": "AWS.SNS.MOBILE.APNS.TTL", "APNS_SANDBOX": "AWS.SNS.MOBILE.APNS_SANDBOX.TTL"}
APNS_COLLAPSE_ID = "AWS.SNS.MOBILE.APNS.COLLAPSE_ID"
APNS_PUSH_TYPE = "AWS.SNS.MOBILE.APNS.PUSH_TYPE"
APNS_PRIORITY = "AWS.SNS.MOBILE.APNS.PRIORITY"
APNS_TOPIC = "AWS.SNS.MOBILE.APNS.TOPIC"
FCM_TTL = "AWS.SNS.MOBILE.FCM.TTL"
GCM_TTL = "AWS.SNS.MOBILE.GCM.TTL"  # the name before SNS renamed GCM to FCM; still accepted
SMS_SENDER_ID = "AWS.SNS.SMS.SenderID"
SMS_TYPE = "AWS.SNS.SMS.SMSType"
SMS_MAX_PRICE = "AWS.SNS.SMS.MaxPrice"
SMS_ORIGINATION = "AWS.MM.SMS.OriginationNumber"
_ATTRIBUTE_NAME = re.compile(r"^(?!\.)(?!.*\.\.)[A-Za-z0-9_.\-]{1,256}(?<!\.)$")
_DATA_TYPE = re.compile(r"^(String|Number|Binary|String\.Array)(\.[A-Za-z0-9_\-.]{1,200})?$")
_NUMBER = re.compile(r"^-?\d+(\.\d+)?([eE][-+]?\d+)?$")
# GSM 03.38 basic character set, and the extension table (each of those costs two septets)
_GSM7 = frozenset(
    "@£$¥èéùìòÇ\nØø\rÅåΔ_ΦΓΛΩΠΨΣΘΞÆæßÉ !\"#¤%&'()*+,-./0123456789:;<=>?¡ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    "ÄÖÑÜ§¿abcdefghijklmnopqrstuvwxyzäöñüà"
)
_GSM7_EXT = frozenset("^{}\\[~]|€\f")


@dataclass(frozen=True)
class Attribute:
    data_type: str
    value: str | bytes


def message_attributes(entries: dict[str, dict[str, str]]) -> dict[str, Attribute]:
    """Checked message attributes from the query map (``Name`` -> ``{DataType, StringValue,
    BinaryValue}``)."""
    out: dict[str, Attribute] = {}
    for name, entry in entries.items():
        if not _ATTRIBUTE_NAME.match(name):
            raise parameter_value_invalid(f"The message attribute name '{name}' is invalid.")
        data_type = entry.get("DataType")
        if not data_type:
            raise parameter_value_invalid(
                f"The message attribute '{name}' must contain non-empty message attribute type."
            )
        match = _DATA_TYPE.match(data_type)
        if match is None:
            raise parameter_value_invalid(
                f"The message attribute '{name}' has an invalid message attribute type, the set "
                "of supported type prefixes is Binary, Number, and String."
            )
        base = match.group(1)
        if base == "Binary":
            raw = entry.get("BinaryValue")
            try:
                value: str | bytes = base64.b64decode(raw or "", validate=True)
            except (binascii.Error, ValueError):
                raise parameter_value_invalid(
                    f"The message attribute '{name}' has an invalid binary value."
                ) from None
            if not value:
                raise parameter_value_invalid(
                    f"The message attribute '{name}' must contain non-empty message attribute "
                    f"value for message attribute type '{data_type}'."
                )
        else:
            text = entry.get("StringValue")
            if not text:
                raise parameter_value_invalid(
                    f"The message attribute '{name}' must contain non-empty message attribute "
                    f"value for message attribute type '{data_type}'."
                )
            if base == "Number" and not _NUMBER.match(text):
                raise parameter_value_invalid(
                    f"The message attribute '{name}' with type 'Number' must have a numeric value."
                )
            # String.Array is not checked: SNS takes any text (filter policies read a JSON value
            # that is not an array as one element, and text that is not JSON as nothing)
            value = text
        out[name] = Attribute(data_type, value)
    return out


def text_attribute(attributes: dict[str, Attribute], name: str) -> str | None:
    attr = attributes.get(name)
    if attr is None:
        return None
    return attr.value if isinstance(attr.value, str) else None


def _whole_number(attributes: dict[str, Attribute], name: str, low: int, high: int) -> int | None:
    text = text_attribute(attributes, name)
    if text is None:
        return None
    try:
        number = int(text)
    except ValueError:
        number = low - 1
    if not low <= number <= high:
        raise parameter_value_invalid(
            f"The message attribute '{name}' must be a whole number from {low} to {high}."
        )
    return number


def check_message(message: object, limit: int = MAX_MESSAGE_BYTES) -> str:
    if message is None:
        raise invalid_parameter("Invalid parameter: Message")
    if not isinstance(message, str) or not message:
        raise invalid_parameter("Invalid parameter: Empty message")
    if len(message.encode("utf-8")) > limit:
        raise invalid_parameter("Invalid parameter: Message too long")
    return message


def publish_size(message: str, attributes: dict[str, Attribute]) -> int:
    """What a publish weighs against a topic's ``MaximumMessageSize``: the message and its
    attributes (names, types and values), in bytes, as AWS counts them."""
    size = len(message.encode("utf-8"))
    for name, attr in attributes.items():
        value = attr.value if isinstance(attr.value, bytes) else attr.value.encode("utf-8")
        size += len(name.encode("utf-8")) + len(attr.data_type.encode("utf-8")) + len(value)
    return size


def structured(message: str, structure: object) -> dict[str, Any] | None:
    """The per-protocol messages of a ``MessageStructure=json`` publish (None: a plain one)."""
    if structure is None or structure == "":
        return None
    if structure != "json":
        raise invalid_parameter("Invalid parameter: MessageStructure")
    try:
        parsed = json.loads(message)
    except ValueError:
        raise invalid_parameter(
            "Invalid parameter: Message Structure - JSON message body failed to parse"
        ) from None
    if not isinstance(parsed, dict):
        raise invalid_parameter(
            "Invalid parameter: Message Structure - JSON message body failed to parse"
        )
    # AWS ignores a key whose value is not a string (so a non-string "default" is no default)
    return {key: value for key, value in parsed.items() if isinstance(value, str)}


def platform_message(message: str, per_protocol: dict[str, Any] | None, key: str) -> str | None:
    """The text for ``key`` (a platform, or ``sqs``); None: neither it nor ``default`` given."""
    if per_protocol is None:
        return message
    value = per_protocol.get(key, per_protocol.get("default"))
    return value if isinstance(value, str) else None


def _payload_object(text: str, platform: str) -> dict[str, Any]:
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise invalid_parameter(
            f"Invalid parameter: Message Reason: Invalid notification for protocol {platform}: "
            "Notification is malformed"
        )
    return parsed


@dataclass
class ProviderRequest:
    """One HTTP request to a provider, with what the ledger keeps of it."""

    path: str
    headers: dict[str, str]
    body: bytes
    collapse_id: str | None = None
    tenant_id: str | None = None
    notification_id: str | None = None


def _custom(payload: Any, key: str) -> str | None:
    if isinstance(payload, dict) and payload.get(key) is not None:
        return str(payload[key])
    return None


def payload_ids(text: str, platform: str, is_platform_payload: bool) -> tuple[str | None, ...]:
    """(tenant_id, notification_id) a platform payload carries, where the requests built from it
    would find them; (None, None) for a plain or unreadable message. For the ledger rows of
    publishes refused before a request is built (throttled, endpoint disabled)."""
    if not is_platform_payload:
        return (None, None)
    try:
        payload = json.loads(text)
    except ValueError:
        return (None, None)
    if not isinstance(payload, dict):
        return (None, None)
    if platform == "GCM":
        v1 = payload.get("fcmV1Message")
        message = v1.get("message") if isinstance(v1, dict) else None
        payload = message.get("data") if isinstance(message, dict) else payload.get("data")
    return (_custom(payload, "tenant_id"), _custom(payload, "notification_id"))


def apns_request(
    *,
    platform: str,
    token: str,
    text: str,
    is_platform_payload: bool,
    attributes: dict[str, Attribute],
    default_topic: str,
    bearer: str | None,
    message_id: str,
    published_at: float,
) -> ProviderRequest:
    """The APNs request for one endpoint (``text``: the APNS key's JSON, or a plain message)."""
    if is_platform_payload:
        payload = _payload_object(text, platform)
        body = text.encode("utf-8")
    else:
        payload = {"aps": {"alert": text}}
        body = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    aps = payload.get("aps") if isinstance(payload.get("aps"), dict) else {}
    background = bool(aps.get("content-available")) and not any(
        k in aps for k in ("alert", "badge", "sound")
    )
    push_type = text_attribute(attributes, APNS_PUSH_TYPE) or (
        "background" if background else "alert"
    )
    priority = _whole_number(attributes, APNS_PRIORITY, 1, 10)
    headers = {
        "apns-id": message_id,
        "apns-push-type": push_type,
        "apns-priority": str(priority if priority is not None else (5 if background else 10)),
    }
    topic = text_attribute(attributes, APNS_TOPIC) or default_topic
    if topic:
        headers["apns-topic"] = topic
    ttl = _whole_number(attributes, APNS_TTL.get(platform, APNS_TTL["APNS"]), 0, 2**31)
    if ttl is not None:
        headers["apns-expiration"] = "0" if ttl == 0 else str(int(published_at) + ttl)
    collapse_id = text_attribute(attributes, APNS_COLLAPSE_ID)
    if collapse_id is not None:
        headers["apns-collapse-id"] = collapse_id
    if bearer:
        headers["authorization"] = f"bearer {bearer}"
    return ProviderRequest(
        path=f"/3/device/{token}",
        headers=headers,
        body=body,
        collapse_id=collapse_id,
        tenant_id=_custom(payload, "tenant_id"),
        notification_id=_custom(payload, "notification_id"),
    )


_LEGACY_NOTIFICATION_TOP = ("title", "body", "image")


def _legacy_to_v1(payload: dict[str, Any]) -> dict[str, Any]:
    """A legacy GCM payload (``data``, ``notification``, ``collapse_key``, ``time_to_live``,
    ``priority``) as the FCM v1 message SNS sends for it."""
    message: dict[str, Any] = {}
    android: dict[str, Any] = {}
    data = payload.get("data")
    if isinstance(data, dict):
        message["data"] = {
            str(k): v if isinstance(v, str) else json.dumps(v, separators=(",", ":"))
            for k, v in data.items()
        }
    notification = payload.get("notification")
    if isinstance(notification, dict):
        top = {k: str(v) for k, v in notification.items() if k in _LEGACY_NOTIFICATION_TOP}
        rest = {k: v for k, v in notification.items() if k not in _LEGACY_NOTIFICATION_TOP}
        if top:
            message["notification"] = top
        if rest:
            android["notification"] = rest
    if isinstance(payload.get("collapse_key"), str):
        android["collapse_key"] = payload["collapse_key"]
    if isinstance(payload.get("time_to_live"), int):
        android["ttl"] = f"{payload['time_to_live']}s"
    if payload.get("priority") in ("high", "normal"):
        android["priority"] = payload["priority"].upper()
    if android:
        message["android"] = android
    return message


def fcm_request(
    *,
    project_id: str,
    token: str,
    text: str,
    is_platform_payload: bool,
    attributes: dict[str, Attribute],
) -> ProviderRequest:
    """The FCM v1 ``messages:send`` request for one endpoint (``text``: the GCM key's JSON —
    ``{"fcmV1Message": {"message": {...}}}`` or a legacy payload — or a plain message)."""
    validate_only: bool | None = None
    if is_platform_payload:
        payload = _payload_object(text, "GCM")
        v1 = payload.get("fcmV1Message")
        if isinstance(v1, dict):
            inner = v1.get("message")
            if not isinstance(inner, dict):
                raise invalid_parameter(
                    "Invalid parameter: Message Reason: Invalid notification for protocol GCM: "
                    "fcmV1Message must hold a message object"
                )
            message = dict(inner)
            if "validate_only" in v1:
                validate_only = bool(v1["validate_only"])
        else:
            message = _legacy_to_v1(payload)
    else:
        message = {"data": {"default": text}}
    for key in ("topic", "condition"):
        message.pop(key, None)
    message["token"] = token
    ttl = _whole_number(attributes, FCM_TTL, 0, 2419200)
    if ttl is None:
        ttl = _whole_number(attributes, GCM_TTL, 0, 2419200)
    if ttl is not None:
        android = dict(message.get("android") or {})
        android["ttl"] = f"{ttl}s"
        message["android"] = android
    body: dict[str, Any] = {"message": message}
    if validate_only is not None:
        body["validate_only"] = validate_only
    android = message.get("android")
    collapse = android.get("collapse_key") if isinstance(android, dict) else None
    data = message.get("data")
    return ProviderRequest(
        path=f"/v1/projects/{project_id}/messages:send",
        headers={"content-type": "application/json"},
        body=json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8"),
        collapse_id=collapse if isinstance(collapse, str) else None,
        tenant_id=_custom(data, "tenant_id"),
        notification_id=_custom(data, "notification_id"),
    )


# -- provider answers -----------------------------------------------------------------------------
DELIVERED = "delivered"
TOKEN_INVALID = "token_invalid"  # the provider said the token is dead: the endpoint is disabled
THROTTLED = "throttled"  # 429
PROVIDER_ERROR = "provider_error"  # 5xx
REJECTED = "rejected"  # another 4xx: a permanent failure of this message
UNREACHABLE = "unreachable"  # no answer (connection refused, reset, timeout)
ENDPOINT_DISABLED = "endpoint_disabled"  # not sent: the endpoint was already disabled
SNS_THROTTLED = "sns_throttled"  # not sent: the throttle fault answered first
NOT_CONFIGURED = "not_configured"  # not sent: no provider URL for the platform

APNS_DEAD_TOKEN = frozenset({"Unregistered", "BadDeviceToken", "DeviceTokenNotForTopic"})


@dataclass(frozen=True)
class Outcome:
    kind: str
    status: int | None
    reason: str | None
    retry_after: float | None = None


def _retry_after(headers: dict[str, str]) -> float | None:
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def _fcm_reason(body: bytes) -> tuple[str | None, str]:
    try:
        error = json.loads(body).get("error", {})
    except (ValueError, AttributeError):
        return None, ""
    if not isinstance(error, dict):
        return None, ""
    for detail in error.get("details") or []:
        if isinstance(detail, dict) and detail.get("errorCode"):
            return str(detail["errorCode"]), str(error.get("message", ""))
    status = error.get("status")
    return (str(status) if status else None), str(error.get("message", ""))


def classify(provider: str, status: int, headers: dict[str, str], body: bytes) -> Outcome:
    """What a provider's answer means for SNS."""
    if provider == "apns":
        reason = None
        if body:
            try:
                reason = json.loads(body).get("reason")
            except (ValueError, AttributeError):
                reason = None
        if status == 200:
            return Outcome(DELIVERED, status, None)
        if status == 410 or (status == 400 and reason in APNS_DEAD_TOKEN):
            return Outcome(TOKEN_INVALID, status, reason)
    else:
        reason, message = _fcm_reason(body) if status != 200 else (None, "")
        if status == 200:
            return Outcome(DELIVERED, status, None)
        if reason in ("UNREGISTERED", "SENDER_ID_MISMATCH") or (
            status == 400 and "registration token" in message.lower()
        ):
            return Outcome(TOKEN_INVALID, status, reason)
    if status == 429:
        return Outcome(THROTTLED, status, reason, _retry_after(headers))
    if status >= 500:
        return Outcome(PROVIDER_ERROR, status, reason, _retry_after(headers))
    return Outcome(REJECTED, status, reason)


# -- SMS ------------------------------------------------------------------------------------------
def sms_parts(text: str) -> tuple[str, int]:
    """(encoding, parts): GSM-7 fits 160 septets in one part, 153 per part when split; anything
    outside GSM-7 is UCS-2, 70 characters in one part, 67 per part (UTF-16 code units)."""
    if all(c in _GSM7 or c in _GSM7_EXT for c in text):
        septets = sum(2 if c in _GSM7_EXT else 1 for c in text)
        return "GSM", 1 if septets <= 160 else -(-septets // 153)
    units = len(text.encode("utf-16-le")) // 2
    return "UCS2", 1 if units <= 70 else -(-units // 67)
