"""Loading the population into a system and injecting events, over its public HTTP API only."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

import httpx

from harness.history import History
from harness.population import Population


class LoadError(RuntimeError):
    """The system under test refused population data or an event."""


def _check(response: httpx.Response, what: str) -> dict[str, Any]:
    if response.status_code >= 300:
        raise LoadError(f"{what}: HTTP {response.status_code}: {response.text[:300]}")
    return response.json()


def load_population(api_url: str, population: Population, workers: int = 8) -> int:
    """PUT preferences and devices, POST follower lists; returns the number of calls made."""
    calls: list[tuple[str, str, dict[str, Any]]] = []
    for user in population.users:
        base = f"/v1/tenants/{user.tenant_id}/users/{user.user_id}"
        calls.append(
            (
                "PUT",
                f"{base}/preferences",
                {
                    "zone": user.zone,
                    "quiet_hours": user.quiet_hours,
                    "channels": {"push": True},
                    "push_consent": user.consent,
                },
            )
        )
    for device in population.devices:
        path = (
            f"/v1/tenants/{device.tenant_id}/users/{device.user_id}"
            f"/devices/{quote(device.token, safe='')}"
        )
        calls.append(("PUT", path, {"platform": device.platform}))
    for author in population.authors:
        followers = list(author.followers)
        for start in range(0, len(followers), 1000):
            calls.append(
                (
                    "POST",
                    f"/v1/tenants/{author.tenant_id}/users/{author.user_id}/followers:batch",
                    {"followers": followers[start : start + 1000]},
                )
            )
    with httpx.Client(base_url=api_url, timeout=10) as http:

        def call(item: tuple[str, str, dict[str, Any]]) -> None:
            method, path, body = item
            _check(http.request(method, path, json=body), f"{method} {path}")

        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(call, calls))
    return len(calls)


def post_event(
    http: httpx.Client,
    history: History,
    tenant_id: str,
    author_id: str,
    kind: str,
    object_id: str,
    event_id: str | None = None,
) -> str:
    """POST one event; record it in the history as injected only once it is accepted."""
    body = {"tenant_id": tenant_id, "author_id": author_id, "kind": kind, "object_id": object_id}
    if event_id is not None:
        body["event_id"] = event_id
    started = time.time()
    accepted = _check(http.post("/v1/events", json=body), f"POST /v1/events {body}")
    history.append(
        "inject",
        time=started,
        tenant_id=tenant_id,
        author_id=author_id,
        notification_id=accepted["notification_id"],
        detail=kind,
    )
    return accepted["notification_id"]
