"""APNs (HTTP/2) and FCM HTTP v1: the requests a job becomes, what their answers mean, and a
thin sender over httpx (a well-kept HTTP/2 client; it speaks h2c by prior knowledge and h2 over
TLS with ALPN).

Both payloads carry ``tenant_id`` and ``notification_id`` (APNs: top-level custom keys; FCM:
``data``) and a collapse id (the notification id), so a redelivered push replaces the first.
"""

from __future__ import annotations

import json
import ssl
import time
import zlib
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import jwt
from ulid import ULID

from systems.minifanout.rules import retry_after_s

RETRYABLE = frozenset({429, 500, 502, 503, 504})


@dataclass(frozen=True)
class Job:
    """One push to one device, as it travels on the queue."""

    tenant: str
    user: str
    id: str
    token: str
    os: str
    actor: str
    verb: str
    target: str
    deferrals: int = 0

    def body(self) -> str:
        return json.dumps(
            {
                "tenant": self.tenant,
                "user": self.user,
                "id": self.id,
                "token": self.token,
                "os": self.os,
                "actor": self.actor,
                "verb": self.verb,
                "target": self.target,
                "deferrals": self.deferrals,
            },
            separators=(",", ":"),
        )

    @classmethod
    def parse(cls, text: str, check_id: bool = True) -> Job:
        """A job from its queue body; ValueError for anything else (a poison message): a
        notification id that is no ULID too, unless ``check_id`` is off."""
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("a job is a JSON object")
        fields = ("tenant", "user", "id", "token", "os", "actor", "verb", "target")
        if not all(isinstance(data.get(f), str) and data[f] for f in fields[:5]):
            raise ValueError("a job names tenant, user, id, token and os")
        if data["os"] not in ("ios", "android"):
            raise ValueError(f"unknown os {data['os']!r}")
        if check_id:
            ULID.from_str(data["id"])  # ValueError: not 26 Crockford base-32 characters
        return cls(
            **{f: str(data.get(f) or "") for f in fields},
            deferrals=int(data.get("deferrals") or 0),
        )

    @property
    def provider(self) -> str:
        return "apns" if self.os == "ios" else "fcm"


@dataclass(frozen=True)
class Request:
    method: str
    url: str
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True)
class Outcome:
    """``delivered``, ``dead`` (the token is gone), ``retry`` (later; ``retry_after_s`` when
    the provider said) or ``rejected`` (the request itself is wrong: never retried)."""

    kind: str
    status: int
    reason: str | None = None
    retry_after_s: float | None = None


def _alert(job: Job) -> dict[str, str]:
    return {"title": f"{job.actor} {job.verb}", "body": job.target or job.verb}


def apns_request(job: Job, base_url: str, topic: str) -> Request:
    payload = {
        "aps": {"alert": _alert(job), "sound": "default"},
        "tenant_id": job.tenant,
        "notification_id": job.id,
    }
    headers = {
        "apns-push-type": "alert",
        "apns-priority": "10",
        "apns-topic": topic,
        "apns-collapse-id": job.id,
        "content-type": "application/json",
    }
    url = f"{base_url}/3/device/{quote(job.token, safe='')}"
    return Request("POST", url, headers, json.dumps(payload).encode())


def fcm_request(job: Job, base_url: str, project: str) -> Request:
    message = {
        "token": job.token,
        "notification": _alert(job),
        "data": {"tenant_id": job.tenant, "notification_id": job.id, "actor": job.actor},
        "android": {"collapse_key": job.id},
    }
    url = f"{base_url}/v1/projects/{quote(project, safe='')}/messages:send"
    body = json.dumps({"message": message}).encode()
    return Request("POST", url, {"content-type": "application/json"}, body)


def _json(body: bytes) -> Any:
    try:
        return json.loads(body) if body else None
    except ValueError:
        return None


def apns_outcome(status: int, body: bytes, retry_after: str | None, now: datetime) -> Outcome:
    reason = (_json(body) or {}).get("reason") if status != 200 else None
    if status == 200:
        return Outcome("delivered", status)
    if status == 410:
        return Outcome("dead", status, reason)
    if status in RETRYABLE:
        return Outcome("retry", status, reason, retry_after_s(retry_after, now))
    return Outcome("rejected", status, reason)


def fcm_error_code(body: Any) -> str | None:
    error = body.get("error") if isinstance(body, dict) else None
    for detail in (error or {}).get("details") or []:
        if isinstance(detail, dict) and detail.get("errorCode"):
            return str(detail["errorCode"])
    return (error or {}).get("status")


def fcm_outcome(status: int, body: bytes, retry_after: str | None, now: datetime) -> Outcome:
    if status == 200:
        return Outcome("delivered", status)
    code = fcm_error_code(_json(body))
    if code in ("UNREGISTERED", "SENDER_ID_MISMATCH"):
        return Outcome("dead", status, code)
    if status in RETRYABLE:
        return Outcome("retry", status, code, retry_after_s(retry_after, now))
    return Outcome("rejected", status, code)


def fcm_project_of(user: str, projects: tuple[str, ...], mapping: str) -> str:
    """``digits-mod``: the digits of the person's id mod K (the reference's rule); ``crc32``:
    crc32 of the id's UTF-8 mod K (a team's own sticky rule, which a target file must state)."""
    if len(projects) == 1:
        return projects[0]
    if mapping == "crc32":
        return projects[zlib.crc32(user.encode()) % len(projects)]
    digits = "".join(c for c in user if c.isdigit())
    return projects[int(digits or "0") % len(projects)]


class ProviderToken:
    """APNs token authentication: an ES256 JWT of the team's key, renewed every 50 minutes
    (Apple refuses one older than an hour, and a new one sooner than 20 minutes)."""

    def __init__(self, key_file: Path, key_id: str, team_id: str) -> None:
        self.key, self.key_id, self.team_id = key_file.read_text(), key_id, team_id
        self.token, self.issued = "", 0.0

    def bearer(self) -> str:
        now = time.time()
        if not self.token or now - self.issued >= 50 * 60:
            claims = {"iss": self.team_id, "iat": int(now)}
            headers = {"kid": self.key_id}
            self.token = jwt.encode(claims, self.key, algorithm="ES256", headers=headers)
            self.issued = now
        return self.token


class AccessToken:
    """FCM's OAuth2 access token from a service-account file (the JWT-bearer grant at its
    token_uri), fetched again five minutes before it expires."""

    def __init__(self, path: Path, client: httpx.AsyncClient) -> None:
        account = json.loads(path.read_text())
        self.email, self.key = account["client_email"], account["private_key"]
        self.token_uri, self.client = account["token_uri"], client
        self.token, self.until = "", 0.0

    async def get(self) -> str:
        if self.token and time.monotonic() < self.until:
            return self.token
        now = int(time.time())
        claims = {"iss": self.email, "aud": self.token_uri, "iat": now, "exp": now + 3600,
                  "scope": "https://www.googleapis.com/auth/firebase.messaging"}  # fmt: skip
        grant = {
            "grant_type": "urn:ietf:params:oauth:grant-type:jwt-bearer",
            "assertion": jwt.encode(claims, self.key, algorithm="RS256"),
        }
        answer = await self.client.post(self.token_uri, data=grant)
        answer.raise_for_status()
        body = answer.json()
        self.token = str(body["access_token"])
        self.until = time.monotonic() + float(body.get("expires_in", 3600)) - 300
        return self.token


class Senders:
    """One HTTP/2 client for APNs and one for FCM, shared by every job of the consumer."""

    def __init__(
        self,
        apns_url: str,
        fcm_url: str,
        *,
        apns_topic: str,
        fcm_projects: tuple[str, ...],
        fcm_mapping: str = "digits-mod",
        apns_ca_file: str | None = None,
        apns_key: tuple[Path, str, str] | None = None,
        fcm_credentials: Path | None = None,
        timeout_s: float = 10.0,
        connections: int = 32,
    ) -> None:
        self.apns_url, self.fcm_url = apns_url, fcm_url
        self.apns_topic, self.fcm_projects = apns_topic, fcm_projects
        self.fcm_mapping = fcm_mapping
        self.apns_token = ProviderToken(*apns_key) if apns_key else None
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        verify: ssl.SSLContext | bool = True
        if apns_ca_file:
            verify = ssl.create_default_context(cafile=apns_ca_file)
        # APNs speaks only HTTP/2: over http:// that is h2c with prior knowledge (http1=False).
        self.apns = httpx.AsyncClient(
            http1=False, http2=True, verify=verify, timeout=timeout_s, limits=limits
        )
        self.fcm = httpx.AsyncClient(timeout=timeout_s, limits=limits)
        self.fcm_token = AccessToken(fcm_credentials, self.fcm) if fcm_credentials else None

    def project(self, job: Job) -> str:
        """The person's FCM sender project: always the same one for a person."""
        return fcm_project_of(job.user, self.fcm_projects, self.fcm_mapping)

    def scope(self, job: Job) -> str:
        """What one Retry-After applies to: APNs as a whole, FCM per project."""
        return "apns" if job.provider == "apns" else f"fcm/{self.project(job)}"

    async def send(self, job: Job) -> Outcome:
        if job.provider == "apns":
            request = apns_request(job, self.apns_url, self.apns_topic)
            if self.apns_token is not None:
                request.headers["authorization"] = f"bearer {self.apns_token.bearer()}"
            client, classify = self.apns, apns_outcome
        else:
            request = fcm_request(job, self.fcm_url, self.project(job))
            client, classify = self.fcm, fcm_outcome
            if self.fcm_token is not None:
                try:
                    request.headers["authorization"] = f"Bearer {await self.fcm_token.get()}"
                except (httpx.HTTPError, ValueError, KeyError) as exc:
                    return Outcome("retry", 0, f"OAuth token: {type(exc).__name__}: {exc}")
        try:
            response = await client.request(
                request.method, request.url, headers=request.headers, content=request.body
            )
            if response.status_code == 401 and job.provider != "apns" and self.fcm_token:
                # A token Google no longer takes: a new one, and the send once more (as
                # google-auth's AuthorizedSession does).
                self.fcm_token.token = ""
                request.headers["authorization"] = f"Bearer {await self.fcm_token.get()}"
                response = await client.request(
                    request.method, request.url, headers=request.headers, content=request.body
                )
        except httpx.HTTPError as exc:
            # The request may have reached the device (a timeout after sending): a retry may
            # duplicate it, which the collapse id hides on the device.
            return Outcome("retry", 0, f"{type(exc).__name__}: {exc}")
        return classify(
            response.status_code,
            response.content,
            response.headers.get("retry-after"),
            datetime.now(UTC),
        )

    async def close(self) -> None:
        await self.apns.aclose()
        await self.fcm.aclose()
