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


class FcmClient:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.http = Http2Client(config.fcm_url, None, config.provider_timeout_seconds)
        self.base_path = urlsplit(config.fcm_url).path.rstrip("/")

    def send(self, project: str, message: dict[str, Any]) -> SendResult:
        headers = {"content-type": "application/json"}
        if self.config.fcm_access_token:
            headers["authorization"] = f"Bearer {self.config.fcm_access_token}"
        try:
            response = self.http.post(
                f"{self.base_path}/v1/projects/{project}/messages:send",
                headers,
                json.dumps({"message": message}).encode(),
            )
        except Http2Error as exc:
            return SendResult("retry", None, f"transport: {type(exc).__name__}")
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
    ) -> None:
        self.max_in_flight = max_in_flight
        self.max_rate_per_s = max_rate_per_s
        self.clock = clock
        self.pauses = pauses or SharedDeadlines(slots=1024, clock=clock)
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
            if self.max_rate_per_s:
                with self._lock:
                    now = self.clock()
                    at = max(now, self._next_send.get(scope, now))
                    self._next_send[scope] = at + 1.0 / self.max_rate_per_s
                if at > now:
                    time.sleep(at - now)  # pacing to the configured cap, not waiting on a result
            yield
