"""The JSON documents SNS delivers to subscriptions, signed as SNS signs them.

* :func:`notification`: a topic message (``Type: Notification``), as SQS and HTTP/S subscribers
  get it unless raw delivery is on;
* :func:`confirmation`: ``SubscriptionConfirmation`` (sent when an endpoint must confirm) and
  ``UnsubscribeConfirmation`` (sent when a confirmed HTTP/S subscription is deleted), with the
  ``Token`` and the ``SubscribeURL`` (a GET of it confirms, as on AWS);
* :class:`NotificationSigner`: ``SignatureVersion`` 1 (SHA1withRSA) or 2 (SHA256withRSA, the
  topic attribute) over AWS's canonical string (the documented keys, each as ``key\\nvalue\\n``),
  with a key made at start whose certificate is served at ``/_sns/SimpleNotificationService.pem``.
"""

from __future__ import annotations

import base64
import datetime
from typing import Any
from urllib.parse import quote

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID

NOTIFICATION_KEYS = ("Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type")
CONFIRMATION_KEYS = (
    "Message",
    "MessageId",
    "SubscribeURL",
    "Timestamp",
    "Token",
    "TopicArn",
    "Type",
)
CERT_PATH = "/_sns/SimpleNotificationService.pem"


def iso_now() -> str:
    now = datetime.datetime.now(datetime.UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"


class NotificationSigner:
    """Signs what SNS delivers with a key made at start (its certificate: :attr:`certificate_pem`)."""

    def __init__(self) -> None:
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sns.local")])
        now = datetime.datetime.now(datetime.UTC)
        self.certificate_pem = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=365))
            .sign(self.key, hashes.SHA256())
            .public_bytes(serialization.Encoding.PEM)
        )

    def sign(self, document: dict[str, Any], version: str = "1") -> str:
        keys = CONFIRMATION_KEYS if "Token" in document else NOTIFICATION_KEYS
        text = "".join(f"{k}\n{document[k]}\n" for k in keys if document.get(k) is not None)
        digest = hashes.SHA256() if version == "2" else hashes.SHA1()
        return base64.b64encode(
            self.key.sign(text.encode("utf-8"), padding.PKCS1v15(), digest)
        ).decode()


def _signed(
    document: dict[str, Any], signer: NotificationSigner, version: str, base_url: str
) -> dict[str, Any]:
    document["SignatureVersion"] = version
    document["Signature"] = signer.sign(document, version)
    document["SigningCertURL"] = base_url + CERT_PATH
    return document


def notification(
    *,
    signer: NotificationSigner,
    base_url: str,
    version: str,
    message_id: str,
    topic_arn: str,
    subscription_arn: str,
    message: str,
    subject: str | None,
    timestamp: str,
    attributes: dict[str, tuple[str, str]],
    sequence_number: str | None = None,
) -> dict[str, Any]:
    """A ``Notification``; ``attributes``: name -> (type, value as text, Binary in base64)."""
    document: dict[str, Any] = {"Type": "Notification", "MessageId": message_id}
    if sequence_number is not None:
        document["SequenceNumber"] = sequence_number
    document["TopicArn"] = topic_arn
    if subject is not None:
        document["Subject"] = subject
    document.update({"Message": message, "Timestamp": timestamp})
    _signed(document, signer, version, base_url)
    document["UnsubscribeURL"] = (
        f"{base_url}/?Action=Unsubscribe&SubscriptionArn={quote(subscription_arn, safe=':')}"
    )
    if attributes:
        document["MessageAttributes"] = {
            name: {"Type": kind, "Value": value} for name, (kind, value) in attributes.items()
        }
    return document


def confirmation(
    *,
    signer: NotificationSigner,
    base_url: str,
    version: str,
    kind: str,
    message_id: str,
    topic_arn: str,
    subscription_arn: str,
    token: str,
) -> dict[str, Any]:
    """A ``SubscriptionConfirmation`` or (``kind``) an ``UnsubscribeConfirmation``."""
    if kind == "SubscriptionConfirmation":
        text = (
            f"You have chosen to subscribe to the topic {topic_arn}.\nTo confirm the "
            "subscription, visit the SubscribeURL included in this message."
        )
    else:
        text = (
            f"You have chosen to deactivate subscription {subscription_arn}.\nTo cancel this "
            "operation and restore the subscription, visit the SubscribeURL included in this "
            "message."
        )
    document: dict[str, Any] = {
        "Type": kind,
        "MessageId": message_id,
        "Token": token,
        "TopicArn": topic_arn,
        "Message": text,
        "SubscribeURL": (
            f"{base_url}/?Action=ConfirmSubscription&TopicArn={quote(topic_arn, safe=':')}"
            f"&Token={token}"
        ),
        "Timestamp": iso_now(),
    }
    return _signed(document, signer, version, base_url)
