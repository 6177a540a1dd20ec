"""Small clients the integration tests share: a tenant of their own on the session stack."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from harness.run.provider_control import SimulatorControl
from harness.stack.supervisor import ROOT, Stack, stop_process, wait_until


def apns_token(n: int, salt: str) -> str:
    return (uuid.uuid5(uuid.NAMESPACE_OID, f"{salt}-{n}").hex * 2)[:64]


def fcm_token(n: int, salt: str) -> str:
    return f"fcm_{salt}_{n}_" + "x" * 120


class TenantClient:
    """Registers users through the Event API and reads the simulators' ledgers."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.tenant = f"it-{uuid.uuid4().hex[:10]}"
        self.api = httpx.Client(base_url=stack.info.url("event-api"), timeout=10)
        self.apns = SimulatorControl(stack.info.url("apns"), stack.info.tls_ca)
        self.fcm = SimulatorControl(stack.info.url("fcm"))

    def user(
        self,
        user_id: str,
        *,
        consent: bool = True,
        zone: str = "UTC",
        quiet_hours: dict[str, str] | None = None,
        devices: list[tuple[str, str]] = (),
    ) -> None:
        prefs = {
            "zone": zone,
            "quiet_hours": quiet_hours,
            "push_consent": {"granted_at": "2026-01-01T00:00:00+00:00", "version": "1"}
            if consent
            else None,
        }
        base = f"/v1/tenants/{self.tenant}/users/{user_id}"
        self.api.put(f"{base}/preferences", json=prefs).raise_for_status()
        for platform, token in devices:
            self.api.put(
                f"{base}/devices/{quote(token, safe='')}", json={"platform": platform}
            ).raise_for_status()

    def follow(self, author: str, followers: list[str]) -> None:
        for start in range(0, len(followers), 1000):
            self.api.post(
                f"/v1/tenants/{self.tenant}/users/{author}/followers:batch",
                json={"followers": followers[start : start + 1000]},
            ).raise_for_status()

    def post(self, author: str, kind: str = "post") -> str:
        response = self.api.post(
            "/v1/events",
            json={"tenant_id": self.tenant, "author_id": author, "kind": kind, "object_id": "o1"},
        )
        assert response.status_code == 202, response.text
        return response.json()["notification_id"]

    def ledger(self) -> list[dict[str, Any]]:
        rows = []
        for control in (self.apns, self.fcm):
            response = control.http.get("/_sim/ledger", params={"since": 0})
            response.raise_for_status()
            rows += [r for r in response.json()["rows"] if r["tenant_id"] == self.tenant]
        return rows

    def rows_for(self, notification_id: str) -> list[dict[str, Any]]:
        return [r for r in self.ledger() if r["notification_id"] == notification_id]

    def wait_rows(
        self, notification_id: str, count: int, timeout: float = 30
    ) -> list[dict[str, Any]]:
        wait_until(
            lambda: len(self.rows_for(notification_id)) >= count,
            timeout,
            f"{count} provider request(s) for {notification_id}",
            interval=0.1,
        )
        return self.rows_for(notification_id)


def audit_lines(stack: Stack, part: str) -> list[dict[str, Any]]:
    log = Path(stack.info.parts[part].log)
    records = []
    for line in log.read_text(errors="replace").splitlines():
        start = line.find('{"audit"')
        if start >= 0:
            try:
                records.append(json.loads(line[start:]))
            except json.JSONDecodeError:
                continue
    return records


def start_process(argv: list[str], ready: Callable[[], bool], what: str) -> subprocess.Popen[bytes]:
    """A server process of the test's own (own session), once ``ready()`` holds; stopped again
    when it exits or times out while starting."""
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_until(lambda: proc.poll() is not None or ready(), 30, what)
    except BaseException:
        stop_process(proc)
        raise
    if proc.poll() is not None:
        raise RuntimeError(f"{what}: exited with code {proc.returncode}")
    return proc


def answers_200(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
