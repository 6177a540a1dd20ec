"""An APNs signing key as Apple hands one out (``AuthKey_<key id>.p8``, EC P-256) and the
provider tokens (ES256 JWTs) signed with it.

The long-lived environment writes one (``load_or_generate_signing_key``) beside its TLS
authority, and registers its public half with the APNs simulator as Apple keeps a team's keys;
a client signs with the ``.p8`` file exactly as it would for Apple (PyJWT, aioapns, node-apn).
"""

from __future__ import annotations

import json
import secrets
import string
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

DEFAULT_TEAM_ID = "FANOUTTEAM"
#: the key id of a long-lived environment's key: fixed, so a team's command lines can name it
ENV_KEY_ID = "FANOUTKEY1"
KEY_FILE = "key.json"
_ALPHABET = string.ascii_uppercase + string.digits


@dataclass(frozen=True)
class ApnsSigningKey:
    key_id: str
    team_id: str
    private_pem: str

    @property
    def file_name(self) -> str:
        return f"AuthKey_{self.key_id}.p8"

    def provider_token(self, now: float | None = None) -> str:
        """An ES256 provider token issued at ``now`` (epoch seconds, default the clock)."""
        issued = int(time.time() if now is None else now)
        return jwt.encode(
            {"iss": self.team_id, "iat": issued},
            self.private_pem,
            algorithm="ES256",
            headers={"kid": self.key_id},
        )

    def registration(self, topics: list[str]) -> dict[str, Any]:
        """The body of ``PUT /_sim/apns/keys``: the public half, the team's bundles."""
        key = serialization.load_pem_private_key(self.private_pem.encode(), password=None)
        public = key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        return {
            "key_id": self.key_id,
            "team_id": self.team_id,
            "public_key": public.decode(),
            "topics": sorted(set(topics)),
        }

    def write(self, directory: Path) -> Path:
        """``AuthKey_<key id>.p8`` (mode 600) and ``key.json`` (key id, team id, file) in
        ``directory``; returns the ``.p8`` path."""
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / self.file_name
        path.touch(mode=0o600)
        path.write_text(self.private_pem)
        (directory / KEY_FILE).write_text(
            json.dumps({"key_id": self.key_id, "team_id": self.team_id, "file": path.name})
        )
        return path


def new_signing_key(team_id: str = DEFAULT_TEAM_ID, key_id: str | None = None) -> ApnsSigningKey:
    """A fresh P-256 key; a key id of 10 upper-case letters and digits, as Apple issues."""
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    kid = key_id or "".join(secrets.choice(_ALPHABET) for _ in range(10))
    return ApnsSigningKey(kid, team_id, pem)


def read_signing_key(directory: Path) -> ApnsSigningKey:
    """The key ``write`` left in ``directory``; FileNotFoundError / ValueError otherwise."""
    meta = json.loads((directory / KEY_FILE).read_text())
    pem = (directory / meta["file"]).read_text()
    return ApnsSigningKey(meta["key_id"], meta["team_id"], pem)


def load_or_generate_signing_key(directory: Path, key_id: str | None = None) -> ApnsSigningKey:
    """The environment's key: kept once written, so clients configure it once."""
    try:
        return read_signing_key(directory)
    except (FileNotFoundError, ValueError, KeyError):
        key = new_signing_key(key_id=key_id)
        key.write(directory)
        return key
