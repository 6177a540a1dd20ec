"""Platform application credentials, as CreatePlatformApplication takes them, checked and parsed.

* APNS / APNS_SANDBOX, token authentication: ``PlatformPrincipal`` the signing key id,
  ``PlatformCredential`` the ``.p8`` EC P-256 private key (PEM), ``ApplePlatformTeamID`` and
  ``ApplePlatformBundleID``. Pushes carry ``authorization: bearer <ES256 JWT>`` (``iss`` the team
  id, ``kid`` the key id), re-signed every 50 minutes (Apple refuses tokens older than an hour
  and asks for no more than one new token per 20 minutes).
* APNS / APNS_SANDBOX, certificate authentication: ``PlatformPrincipal`` the certificate (PEM),
  ``PlatformCredential`` its private key (PEM); the topic is the certificate's subject UID (the
  bundle id), ``AppleCertificateExpiryDate`` its expiry. The pushes carry no JWT; the simulator
  asks for no client certificate, so none is presented.
* GCM (FCM HTTP v1): ``PlatformCredential`` a service-account JSON (``project_id``,
  ``client_email``, ``private_key``); pushes go to ``/v1/projects/<project_id>/messages:send``
  with an OAuth2 access token got by the JWT-bearer grant (RS256 assertion). The legacy server
  key is refused: Google shut the legacy API down in 2024.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import UTC
from typing import Any

import jwt
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from emulators.sns.errors import invalid_parameter

FCM_SCOPE = "https://www.googleapis.com/auth/firebase.messaging"
APNS_JWT_LIFETIME = 50 * 60  # seconds: re-sign before Apple's one-hour limit
_UID_OID = x509.ObjectIdentifier("0.9.2342.19200300.100.1.1")


def _bad_credentials(reason: str) -> Exception:
    return invalid_parameter(f"Invalid parameter: Attributes Reason: {reason}")


# (team, key id) -> (token, signed at, key): the provider token every application signing
# with that key sends
_SIGNED: dict[tuple[str, str, int], tuple[str, float, int]] = {}


@dataclass
class ApnsTokenCredential:
    key_id: str
    team_id: str
    bundle_id: str
    private_key: ec.EllipticCurvePrivateKey = field(repr=False)

    method = "Token"

    @property
    def topic(self) -> str:
        return self.bundle_id

    @property
    def connection_group(self) -> str:
        """Pushes signed by one key share connections (and one token: Apple refuses a new
        token on a connection sooner than 20 minutes after the last)."""
        return f"token:{self.team_id}:{self.key_id}"

    def bearer(self, now: float | None = None) -> str:
        """The current provider token (signed again when it is 50 minutes old), one per key
        for every application that uses it."""
        now = time.time() if now is None else now
        group = (self.team_id, self.key_id, id(type(self)))
        shared = _SIGNED.get(group)
        if (
            shared is not None
            and shared[2] == self._fingerprint()
            and (now - shared[1] < APNS_JWT_LIFETIME)
        ):
            return shared[0]
        token = jwt.encode(
            {"iss": self.team_id, "iat": int(now)},
            self.private_key,
            algorithm="ES256",
            headers={"kid": self.key_id},
        )
        _SIGNED[group] = (token, now, self._fingerprint())
        return token

    def _fingerprint(self) -> int:
        return self.private_key.public_key().public_numbers().x

    def public_attributes(self) -> dict[str, str]:
        return {
            "ApplePlatformTeamID": self.team_id,
            "ApplePlatformBundleID": self.bundle_id,
            "AuthenticationMethod": "Token",
        }


@dataclass
class ApnsCertificateCredential:
    topic: str
    expires: str  # ISO 8601, as AppleCertificateExpiryDate

    method = "Certificate"

    @property
    def connection_group(self) -> str:
        return f"certificate:{self.topic}"

    def bearer(self, now: float | None = None) -> str | None:
        return None

    def public_attributes(self) -> dict[str, str]:
        return {"AppleCertificateExpiryDate": self.expires, "AuthenticationMethod": "Certificate"}


@dataclass
class FcmCredential:
    project_id: str
    client_email: str
    private_key: rsa.RSAPrivateKey = field(repr=False)
    private_key_id: str | None = None

    method = "Token"

    def assertion(self, audience: str, now: float | None = None) -> str:
        """The JWT-bearer grant's assertion (RS256), as google-auth builds it."""
        now = int(time.time() if now is None else now)
        headers = {"kid": self.private_key_id} if self.private_key_id else None
        return jwt.encode(
            {
                "iss": self.client_email,
                "scope": FCM_SCOPE,
                "aud": audience,
                "iat": now,
                "exp": now + 3600,
            },
            self.private_key,
            algorithm="RS256",
            headers=headers,
        )

    def public_attributes(self) -> dict[str, str]:
        return {"AuthenticationMethod": "Token"}


Credential = ApnsTokenCredential | ApnsCertificateCredential | FcmCredential


def _private_key(pem: str, what: str) -> Any:
    try:
        return serialization.load_pem_private_key(pem.encode(), password=None)
    except (ValueError, TypeError) as exc:
        raise _bad_credentials(f"{what} is not a PEM private key ({exc})") from None


def parse_credentials(platform: str, attributes: dict[str, str]) -> Credential:
    """The credential an application's attributes describe; InvalidParameter when unusable."""
    credential = attributes.get("PlatformCredential")
    if not credential:
        raise _bad_credentials("PlatformCredential attribute is required")
    if platform == "GCM":
        return _fcm_credential(credential)
    principal = attributes.get("PlatformPrincipal")
    if not principal:
        raise _bad_credentials("PlatformPrincipal attribute is required for APNS")
    if "BEGIN CERTIFICATE" in principal:
        return _apns_certificate(principal, credential)
    team = attributes.get("ApplePlatformTeamID")
    bundle = attributes.get("ApplePlatformBundleID")
    if not team or not bundle:
        raise _bad_credentials(
            "ApplePlatformTeamID and ApplePlatformBundleID are required with token authentication"
        )
    key = _private_key(credential, "PlatformCredential")
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != "secp256r1":
        raise _bad_credentials("PlatformCredential must be an APNs signing key (EC P-256, .p8)")
    return ApnsTokenCredential(principal, team, bundle, key)


def _apns_certificate(principal: str, credential: str) -> ApnsCertificateCredential:
    try:
        cert = x509.load_pem_x509_certificate(principal.encode())
    except ValueError as exc:
        raise _bad_credentials(f"PlatformPrincipal is not a PEM certificate ({exc})") from None
    key = _private_key(credential, "PlatformCredential")
    if key.public_key().public_numbers() != cert.public_key().public_numbers():
        raise _bad_credentials("PlatformCredential is not the private key of PlatformPrincipal")
    uids = cert.subject.get_attributes_for_oid(_UID_OID)
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    topic = str(uids[0].value) if uids else (str(names[0].value) if names else "")
    expires = cert.not_valid_after_utc.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return ApnsCertificateCredential(topic, expires)


def _fcm_credential(credential: str) -> FcmCredential:
    try:
        info = json.loads(credential)
    except ValueError:
        raise _bad_credentials(
            "PlatformCredential must be an FCM v1 service-account JSON (the legacy server key "
            "API was shut down in 2024)"
        ) from None
    if not isinstance(info, dict):
        raise _bad_credentials("PlatformCredential must be a service-account JSON object")
    missing = [k for k in ("project_id", "client_email", "private_key") if not info.get(k)]
    if missing:
        raise _bad_credentials(f"the service-account JSON lacks {', '.join(missing)}")
    key = _private_key(str(info["private_key"]), "the service account's private_key")
    if not isinstance(key, rsa.RSAPrivateKey):
        raise _bad_credentials("the service account's private_key must be an RSA key")
    return FcmCredential(
        project_id=str(info["project_id"]),
        client_email=str(info["client_email"]),
        private_key=key,
        private_key_id=str(info["private_key_id"]) if info.get("private_key_id") else None,
    )
