"""APNs and FCM clients: one HTTP/2 request per device (:mod:`reference_impl.http2`),
classified into what to do next."""

from __future__ import annotations

import json
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

from reference_impl.config import Config
from reference_impl.http2 import Http2Client, Http2Error, Http2Response
from reference_impl.shared_deadlines import SharedDeadlines

# "offline": the in-app channel's 410 Gone (no live connection; the inbox row holds it).
Outcome = Literal["sent", "dead_token", "rejected", "retry", "offline"]


@dataclass(frozen=True)
class SendResult:
    outcome: Outcome
    status: int | None
    reason: str | None = None
    retry_after: float | None = None


def _retry_after(response: Http2Response) -> float | None:
    value = response.headers.get("retry-after")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _json(response: Http2Response) -> Any:
    try:
        return json.loads(response.body)
    except ValueError:
        return None


def fcm_project_for(recipient_user_id: str, projects: tuple[str, ...]) -> str:
    """Shard over K sender projects by recipient_user_id mod K (sticky per user)."""
    digits = "".join(ch for ch in recipient_user_id if ch.isdigit())
    number = int(digits) if digits else zlib.crc32(recipient_user_id.encode())
    return projects[number % len(projects)]


#: Apple refuses a provider token older than an hour and a new one sooner than 20 minutes
APNS_TOKEN_RENEW_SECONDS = 50 * 60


class ApnsProviderToken:
    """The ES256 provider token of a signing key, signed again when 50 minutes old."""

    def __init__(
        self, config: Config, clock: Callable[[], float] = time.time, per_push: bool = False
    ) -> None:
        assert config.apns_key_file and config.apns_key_id and config.apns_team_id
        with open(config.apns_key_file) as handle:
            self.key = handle.read()
        self.key_id, self.team_id = config.apns_key_id, config.apns_team_id
        self.clock, self.per_push = clock, per_push
        self._token, self._issued = "", 0.0
        self._lock = threading.Lock()

    def bearer(self) -> str:
        import jwt  # PyJWT: imported here, a config without a key never needs it

        with self._lock:
            now = self.clock()
            if self.per_push or not self._token or now - self._issued >= APNS_TOKEN_RENEW_SECONDS:
                self._token = jwt.encode(
                    {"iss": self.team_id, "iat": int(now)},
                    self.key,
                    algorithm="ES256",
                    headers={"kid": self.key_id},
                )
                self._issued = now
            return self._token


class ApnsClient:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.token = (
            ApnsProviderToken(config, per_push="apns_token_per_push" in config.defects)
            if config.apns_key_file
            else None
        )
        self.http = Http2Client(
            config.apns_url, config.apns_ca_file, config.provider_timeout_seconds
        )
        self.base_path = urlsplit(config.apns_url).path.rstrip("/")

    def send(
        self, token: str, payload: dict[str, Any], apns_id: str, collapse_id: str | None = None
    ) -> SendResult:
        headers = {
            "apns-topic": self.config.apns_topic,
            "apns-push-type": "alert",
            "apns-id": apns_id,
        }
        if collapse_id:
            # A retried send that the provider had in fact delivered replaces the first one on
            # the device instead of showing twice.
            headers["apns-collapse-id"] = collapse_id
        if "apns_background_push_type" in self.config.defects:  # the defect: a silent push
            headers.update({"apns-push-type": "background", "apns-priority": "5"})
        if "apns_expiration_zero" in self.config.defects:  # the defect: never stored
            headers["apns-expiration"] = "0"
        if self.token is not None:
            headers["authorization"] = f"bearer {self.token.bearer()}"
        try:
            response = self.http.post(
                f"{self.base_path}/3/device/{token}",
                headers,
                json.dumps(payload, separators=(",", ":")).encode(),
            )
        except Http2Error as exc:
            return SendResult("retry", None, f"transport: {type(exc).__name__}")
        status = response.status
        reason = None
        if status != 200:
            answer = _json(response)
            reason = answer.get("reason") if isinstance(answer, dict) else None
        if status == 200:
            return SendResult("sent", status)
        if status == 410 or reason in ("BadDeviceToken", "Unregistered", "DeviceTokenNotForTopic"):
            return SendResult("dead_token", status, reason)
        if status == 429 or status >= 500:
            return SendResult("retry", status, reason, _retry_after(response))
        return SendResult("rejected", status, reason)

    def close(self) -> None:
        self.http.close()


FCM_SCOPE = "https://www.googleapis.com/auth/firebase.messaging"
JWT_BEARER_GRANT = "urn:ietf:params:oauth:grant-type:jwt-bearer"
# Fetch a new access token this long before the old one expires (google-auth: 3m45s).
FCM_TOKEN_MARGIN_SECONDS = 300


class FcmAccessToken:
    """OAuth2 access tokens of a service account (the JWT-bearer grant at its token_uri),
    kept until five minutes before they expire. Written out rather than taken from google-auth:
    the reference's consumers are threads over one blocking HTTP/2 client, and the grant is
    one signed POST."""

    def __init__(
        self, path: str, timeout: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        with open(path) as handle:
            account = json.load(handle)
        self.email, self.key = account["client_email"], account["private_key"]
        self.token_uri, self.key_id = account["token_uri"], account.get("private_key_id")
        self.timeout, self.clock = timeout, clock
        self._token, self._until = "", 0.0
        self._lock = threading.Lock()

    def bearer(self, refresh: bool = False) -> str:
        with self._lock:
            if refresh or not self._token or self.clock() >= self._until:
                self._token, lifetime = self._grant()
                self._until = self.clock() + max(0.0, lifetime - FCM_TOKEN_MARGIN_SECONDS)
            return self._token

    def _grant(self) -> tuple[str, float]:
        import urllib.parse
        import urllib.request

        import jwt  # PyJWT, imported here: a config without credentials never needs it

        now = int(time.time())
        claims = {"iss": self.email, "scope": FCM_SCOPE, "aud": self.token_uri,
                  "iat": now, "exp": now + 3600}  # fmt: skip
        headers = {"kid": self.key_id} if self.key_id else None
        assertion = jwt.encode(claims, self.key, algorithm="RS256", headers=headers)
        body = urllib.parse.urlencode({"grant_type": JWT_BEARER_GRANT, "assertion": assertion})
        request = urllib.request.Request(
            self.token_uri,
            data=body.encode(),
            headers={"content-type": "application/x-www-form-urlencoded"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=self.timeout) as answer:
            grant = json.loads(answer.read())
        return str(grant["access_token"]), float(grant.get("expires_in", 3600))


class FcmClient:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.http = Http2Client(config.fcm_url, None, config.provider_timeout_seconds)
        self.base_path = urlsplit(config.fcm_url).path.rstrip("/")
        self.token = (
            FcmAccessToken(config.fcm_credentials_file, config.provider_timeout_seconds)
            if config.fcm_credentials_file
            else None
        )

    def send(self, project: str, message: dict[str, Any]) -> SendResult:
        body = json.dumps({"message": message}).encode()
        response = None
        # A 401 once: the token may have been revoked or expired early; fetch one and retry
        # (as google-auth's AuthorizedSession does).
        for attempt in (0, 1) if self.token is not None else (0,):
            headers = {"content-type": "application/json"}
            try:
                if self.token is not None:
                    headers["authorization"] = f"Bearer {self.token.bearer(refresh=attempt == 1)}"
                response = self.http.post(
                    f"{self.base_path}/v1/projects/{project}/messages:send", headers, body
                )
            except (Http2Error, OSError, ValueError, KeyError) as exc:
                return SendResult("retry", None, f"transport: {type(exc).__name__}")
            if response.status != 401:
                break
        assert response is not None
        status = response.status
        if status == 200:
            return SendResult("sent", status)
        code = None
        try:
            error = _json(response).get("error", {})
            details = error.get("details") or [{}]
            code = details[0].get("errorCode") or error.get("status")
        except (AttributeError, IndexError, TypeError):
            code = None
        if code == "UNREGISTERED" or status == 404:
            return SendResult("dead_token", status, code)
        if status == 429 or status >= 500:
            return SendResult("retry", status, code, _retry_after(response))
        return SendResult("rejected", status, code)

    def close(self) -> None:
        self.http.close()


#: Of an FCM project's quota, the share a consumer paces its sends to: the provider's minutes
#: are not aligned to ours, and a send can arrive a little later than it left.
FCM_QUOTA_HEADROOM = 0.95


def fcm_send_interval(quota_per_minute: int | None, defects: tuple[str, ...] = ()) -> float | None:
    """Seconds between two sends to one FCM project to stay within its quota (None: no quota
    known, not paced)."""
    if not quota_per_minute or "fcm_quota_unpaced" in defects:
        return None  # the defect: the quota known, the sends not paced to it
    per_minute = quota_per_minute * FCM_QUOTA_HEADROOM
    if "fcm_quota_per_hour" in defects:
        per_minute /= 60  # the defect: the quota read as per hour
    return 60.0 / per_minute


class ProviderGate:
    """Shared by a consumer process's threads: honours Retry-After per provider scope (APNs, or
    one FCM project), caps requests in flight, and optionally paces the send rate. ``pauses``:
    where the Retry-After pauses are kept, shared with the consumer's other worker processes
    (made before they fork), so a scope throttled for one is paused for all."""

    def __init__(
        self,
        max_in_flight: int,
        max_rate_per_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        pauses: SharedDeadlines | None = None,
        fcm_quota_per_minute: int | None = None,
        defects: tuple[str, ...] = (),
    ) -> None:
        self.max_in_flight = max_in_flight
        self.max_rate_per_s = max_rate_per_s
        self.clock = clock
        self.pauses = pauses or SharedDeadlines(slots=1024, clock=clock)
        # Seconds between two sends to one FCM project, consumer-wide (None: not paced).
        self.fcm_interval = fcm_send_interval(fcm_quota_per_minute, defects)
        self._lock = threading.Lock()
        self._slots: dict[str, threading.BoundedSemaphore] = {}
        self._next_send: dict[str, float] = {}

    def paused_for(self, scope: str) -> float:
        return self.pauses.left(scope)

    def pause(self, scope: str, seconds: float) -> None:
        self.pauses.extend(scope, self.clock() + seconds)

    @contextmanager
    def slot(self, scope: str) -> Iterator[None]:
        with self._lock:
            semaphore = self._slots.setdefault(
                scope, threading.BoundedSemaphore(self.max_in_flight)
            )
        with semaphore:
            if self.fcm_interval is not None and scope.startswith("fcm/"):
                # The project's quota, shared by every process (the pauses' table): a backlog
                # goes out at the rate the provider takes, not in bursts it refuses.
                at = self.pauses.reserve(f"pace:{scope}", self.fcm_interval)
                wait = at - self.clock()
                if wait > 0:
                    time.sleep(wait)  # pacing to the project's quota, not waiting on a result
            if self.max_rate_per_s:
                with self._lock:
                    now = self.clock()
                    at = max(now, self._next_send.get(scope, now))
                    self._next_send[scope] = at + 1.0 / self.max_rate_per_s
                if at > now:
                    time.sleep(at - now)  # pacing to the configured cap, not waiting on a result
            yield
