"""Token-based provider authentication and topics, as APNs enforces them (Apple, "Establishing
a token-based connection to APNs" and "Handling notification responses from APNs").

* A provider token is an ES256 JWT: header ``alg`` ES256 and ``kid`` a signing key registered
  for the team, claims ``iss`` that team and ``iat`` when it was issued. A token whose key is
  unknown, whose ``iss`` is not the key's team or whose signature does not verify: 403
  InvalidProviderToken. One issued more than an hour ago: 403 ExpiredProviderToken. No token:
  403 MissingProviderToken (the simulator asks for no client certificate).
* A connection may take a new token no sooner than 20 minutes (by ``iat``) after the one it
  used before: 429 TooManyProviderTokenUpdates otherwise. A client that signs every request
  anew (ES256 signatures differ each time) is refused from its second request on.
* ``apns-topic`` is required with token authentication (400 MissingTopic) and must be a bundle
  of the key's team (400 TopicDisallowed); a device token belongs to the bundle it was
  registered for (400 DeviceTokenNotForTopic): the one bound to it, else the default topic.

Signing keys, token bindings and the default topic are the environment's (as Apple keeps a
team's keys): they survive ``/_sim/reset``. Strictness is a run's: ``PUT /_sim/strict`` with
``{"enabled": false}`` switches it off until the next reset.

Verifying ES256 costs ~0.1 ms; a token string is verified once and remembered (Apple's cache
is per connection; one per process is enough here), so a run signs and verifies once per
20 minutes per connection, not per push.
"""

from __future__ import annotations

import base64
import json
import re
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

#: Apple: a provider token is valid for an hour, and may be renewed once per 20 minutes.
TOKEN_LIFETIME_S = 3600
TOKEN_REFRESH_MIN_S = 20 * 60
_VERIFIED_CACHE = 4096
_ID_RE = re.compile(r"^[A-Z0-9]{10}$")
_TOPIC_RE = re.compile(r"^[A-Za-z0-9.\-]+$")


@dataclass(frozen=True)
class SigningKey:
    """A team's APNs signing key as Apple knows it: its public half and the team's bundles."""

    key_id: str
    team_id: str
    public_key: ec.EllipticCurvePublicKey
    topics: frozenset[str]

    def describe(self) -> dict[str, Any]:
        pem = self.public_key.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        return {
            "key_id": self.key_id,
            "team_id": self.team_id,
            "public_key": pem.decode(),
            "topics": sorted(self.topics),
        }


def parse_key(body: Any) -> dict[str, Any]:
    """A ``PUT /_sim/apns/keys`` body checked: ``key_id`` and ``team_id`` (10 upper-case letters
    or digits, as Apple issues them), ``public_key`` or ``private_key`` (PEM, EC P-256: the
    ``.p8`` file itself is accepted, only its public half is kept), ``topics`` (bundle ids).
    Returns the journal event's fields; ValueError says what is wrong."""
    if not isinstance(body, dict):
        raise ValueError("body must be a JSON object")
    fields = {"key_id", "team_id", "public_key", "private_key", "topics"}
    unknown = set(body) - fields
    if unknown:
        raise ValueError(f"unknown fields {sorted(unknown)}; known: {sorted(fields)}")
    for name in ("key_id", "team_id"):
        value = body.get(name)
        if not isinstance(value, str) or not _ID_RE.match(value):
            raise ValueError(f"{name} must be 10 upper-case letters or digits, got {value!r}")
    topics = body.get("topics", [])
    if not isinstance(topics, list) or not all(
        isinstance(t, str) and _TOPIC_RE.match(t) for t in topics
    ):
        raise ValueError("topics must be a list of bundle ids (letters, digits, '.', '-')")
    pem = body.get("public_key") or body.get("private_key")
    if not isinstance(pem, str):
        raise ValueError("public_key or private_key (PEM) is required")
    public = _public_key(pem)
    text = public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()
    return {"key_id": body["key_id"], "team_id": body["team_id"], "public_key": text,
            "topics": sorted(set(topics))}  # fmt: skip


def _public_key(pem: str) -> ec.EllipticCurvePublicKey:
    data = pem.encode()
    try:
        key: Any = serialization.load_pem_public_key(data)
    except ValueError:
        try:
            key = serialization.load_pem_private_key(data, password=None).public_key()
        except (ValueError, TypeError) as exc:
            raise ValueError("the key is not a PEM public or private key") from exc
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp256r1":
        raise ValueError("an APNs signing key is EC P-256 (ES256)")
    return key


def parse_topics(body: Any) -> dict[str, Any]:
    """A ``PUT /_sim/apns/topics`` body: ``default`` (the bundle of every device token not bound
    otherwise; null: any bundle of the key's team) and/or ``tokens`` (token -> bundle)."""
    if not isinstance(body, dict) or not set(body) <= {"default", "tokens"} or not body:
        raise ValueError('body must be {"default": bundle or null, "tokens": {token: bundle}}')
    event: dict[str, Any] = {}
    if "default" in body:
        default = body["default"]
        if default is not None and not (isinstance(default, str) and _TOPIC_RE.match(default)):
            raise ValueError(f"default must be a bundle id or null, got {default!r}")
        event["default"] = default
    if "tokens" in body:
        tokens = body["tokens"]
        if not isinstance(tokens, dict) or not all(
            isinstance(k, str) and k and isinstance(v, str) and _TOPIC_RE.match(v)
            for k, v in tokens.items()
        ):
            raise ValueError("tokens must map device tokens to bundle ids")
        event["tokens"] = dict(tokens)
    return event


def parse_strict(body: Any) -> dict[str, Any]:
    """A ``PUT /_sim/strict`` body: ``{"enabled": true|false}``."""
    if (
        not isinstance(body, dict)
        or set(body) != {"enabled"}
        or not isinstance(body["enabled"], bool)
    ):
        raise ValueError('body must be {"enabled": true} or {"enabled": false}')
    return {"enabled": body["enabled"]}


def _b64(segment: str) -> bytes:
    return base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))


@dataclass(frozen=True)
class _Verified:
    key: SigningKey
    issued_at: int


class _ConnectionToken:
    """The token a connection last authenticated with."""

    __slots__ = ("token", "issued_at")

    def __init__(self, token: str, issued_at: int) -> None:
        self.token, self.issued_at = token, issued_at


class ApnsAuth:
    """Keys, topics and strictness of one simulator, and the checks that use them.

    ``clock`` (epoch seconds) is injectable: tests age a token without waiting an hour."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.keys: dict[str, SigningKey] = {}
        self.token_topics: dict[str, str] = {}
        self.default_topic: str | None = None
        self.strict = True
        self._verified: OrderedDict[str, _Verified] = OrderedDict()
        self._connections: weakref.WeakKeyDictionary[Any, _ConnectionToken] = (
            weakref.WeakKeyDictionary()
        )

    # -- journal events ---------------------------------------------------------------------
    def apply_key(self, event: dict[str, Any]) -> None:
        public = serialization.load_pem_public_key(event["public_key"].encode())
        assert isinstance(public, ec.EllipticCurvePublicKey)
        self.keys[event["key_id"]] = SigningKey(
            event["key_id"], event["team_id"], public, frozenset(event["topics"])
        )
        self._verified.clear()  # a replaced key no longer vouches for its old tokens

    def apply_topics(self, event: dict[str, Any]) -> None:
        if "default" in event:
            self.default_topic = event["default"]
        self.token_topics.update(event.get("tokens", {}))

    def apply_strict(self, event: dict[str, Any]) -> None:
        self.strict = bool(event["enabled"])

    def on_reset(self) -> None:
        self.strict = True

    def describe(self) -> dict[str, Any]:
        return {
            "strict": self.strict,
            "keys": [k.describe() for k in self.keys.values()],
            "default_topic": self.default_topic,
            "bound_tokens": len(self.token_topics),
        }

    # -- checks -----------------------------------------------------------------------------
    def credential_refusal(
        self, headers: dict[str, str], connection: Any
    ) -> tuple[tuple[int, str] | None, SigningKey | None]:
        """Apple's (status, reason) when the provider token is refused, else the key that
        signed it (None when not strict)."""
        if not self.strict:
            return None, None
        auth = headers.get("authorization")
        if auth is None:
            return (403, "MissingProviderToken"), None
        scheme, _, credential = auth.partition(" ")
        credential = credential.strip()
        verified = self._verify(credential) if scheme.lower() == "bearer" else None
        if verified is None:
            return (403, "InvalidProviderToken"), None
        if self.clock() - verified.issued_at > TOKEN_LIFETIME_S:
            return (403, "ExpiredProviderToken"), None
        if connection is not None and not self._connection_takes(
            connection, credential, verified.issued_at
        ):
            return (429, "TooManyProviderTokenUpdates"), None
        return None, verified.key

    def topic_refusal(
        self, headers: dict[str, str], key: SigningKey, token: str
    ) -> tuple[int, str] | None:
        """Apple's (status, reason) when the topic is missing, not the key's team's, or not
        the bundle the device token belongs to."""
        topic = headers.get("apns-topic")
        if not topic:
            return 400, "MissingTopic"
        if key.topics and topic not in key.topics:  # no bundles stated: any of the team's
            return 400, "TopicDisallowed"
        bound = self.token_topics.get(token, self.default_topic)
        if bound is not None and bound != topic:
            return 400, "DeviceTokenNotForTopic"
        return None

    def _connection_takes(self, connection: Any, token: str, issued_at: int) -> bool:
        try:
            current = self._connections.get(connection)
        except TypeError:  # a connection object that cannot be weakly referenced
            return True
        if current is None:
            self._connections[connection] = _ConnectionToken(token, issued_at)
            return True
        if current.token == token:
            return True
        if issued_at - current.issued_at < TOKEN_REFRESH_MIN_S:
            return False
        current.token, current.issued_at = token, issued_at
        return True

    def _verify(self, token: str) -> _Verified | None:
        cached = self._verified.get(token)
        if cached is not None:
            return cached
        verified = self._check_signature(token)
        if verified is not None:
            self._verified[token] = verified
            if len(self._verified) > _VERIFIED_CACHE:
                self._verified.popitem(last=False)
        return verified

    def _check_signature(self, token: str) -> _Verified | None:
        parts = token.split(".")
        if len(parts) != 3:
            return None
        try:
            header = json.loads(_b64(parts[0]))
            claims = json.loads(_b64(parts[1]))
            signature = _b64(parts[2])
        except (ValueError, TypeError):
            return None
        if not isinstance(header, dict) or not isinstance(claims, dict):
            return None
        if header.get("alg") != "ES256":
            return None
        key = self.keys.get(header.get("kid"))  # type: ignore[arg-type]
        issued_at = claims.get("iat")
        if key is None or claims.get("iss") != key.team_id:
            return None
        if not isinstance(issued_at, int) or isinstance(issued_at, bool) or len(signature) != 64:
            return None
        der = encode_dss_signature(
            int.from_bytes(signature[:32], "big"), int.from_bytes(signature[32:], "big")
        )
        try:
            key.public_key.verify(der, f"{parts[0]}.{parts[1]}".encode(), ec.ECDSA(hashes.SHA256()))
        except InvalidSignature:
            return None
        return _Verified(key, issued_at)
