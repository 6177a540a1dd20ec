"""Loading the population into a system and injecting events, over its public HTTP API only."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

import httpx
from ulid import ULID

from harness.model.history import History
from harness.model.population import Population, preferences_body


class LoadError(RuntimeError):
    """The system under test refused population data or an event."""


def _check(response: httpx.Response, what: str) -> dict[str, Any]:
    if response.status_code >= 300:
        raise LoadError(f"{what}: HTTP {response.status_code}: {response.text[:300]}")
    return response.json()


USERS_PER_BULK_CALL = 500
FOLLOWERS_PER_CALL = 10_000


def _preferences(user: Any) -> dict[str, Any]:
    return preferences_body(user)


def _per_row_calls(population: Population) -> list[tuple[str, str, dict[str, Any]]]:
    """One PUT per preference and per device: what any Event API offers."""
    calls: list[tuple[str, str, dict[str, Any]]] = []
    for user in population.users:
        base = f"/v1/tenants/{user.tenant_id}/users/{user.user_id}"
        calls.append(("PUT", f"{base}/preferences", _preferences(user)))
    for device in population.devices:
        path = (
            f"/v1/tenants/{device.tenant_id}/users/{device.user_id}"
            f"/devices/{quote(device.token, safe='')}"
        )
        calls.append(("PUT", path, {"platform": device.platform}))
    return calls


def _bulk_calls(population: Population) -> list[tuple[str, str, dict[str, Any]]]:
    """``users:batch``: preferences and devices of 500 users per call (the reference's bulk
    path; a population of a million users is 2,000 calls, not 2.3 million)."""
    devices: dict[tuple[str, str], list[dict[str, str]]] = {}
    for device in population.devices:
        devices.setdefault((device.tenant_id, device.user_id), []).append(
            {"token": device.token, "platform": device.platform}
        )
    by_tenant: dict[str, list[dict[str, Any]]] = {}
    for user in population.users:
        by_tenant.setdefault(user.tenant_id, []).append(
            {
                "user_id": user.user_id,
                "preferences": _preferences(user),
                "devices": devices.get((user.tenant_id, user.user_id), []),
            }
        )
    return [
        ("POST", f"/v1/tenants/{tenant}/users:batch", {"users": users[i : i + USERS_PER_BULK_CALL]})
        for tenant, users in by_tenant.items()
        for i in range(0, len(users), USERS_PER_BULK_CALL)
    ]


def _follower_calls(population: Population) -> list[list[tuple[str, str, dict[str, Any]]]]:
    """Each author's follower list, 10,000 a call, as one chain per author: a system may
    serialise changes to one author's list (the reference does), so the calls of one author go
    one after another and the authors go in parallel."""
    chains = []
    for author in population.authors:
        followers = list(author.followers)
        path = f"/v1/tenants/{author.tenant_id}/users/{author.user_id}/followers:batch"
        chains.append(
            [
                ("POST", path, {"followers": followers[start : start + FOLLOWERS_PER_CALL]})
                for start in range(0, len(followers), FOLLOWERS_PER_CALL)
            ]
        )
    return chains


def load_population(
    api_url: str,
    population: Population,
    workers: int = 8,
    bulk: bool | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> int:
    """Preferences, devices and follower lists into the system; returns the calls made.

    ``bulk``: None tries the bulk path and falls back to a call per row when the API answers
    404 (a system without it); True or False forces one or the other. ``progress(done,
    total)`` is told every call.
    """
    with httpx.Client(
        base_url=api_url, timeout=60, limits=httpx.Limits(max_connections=workers)
    ) as http:
        made = 0
        user_calls = _bulk_calls(population) if bulk is not False else []
        if user_calls and bulk is None:
            method, path, body = user_calls[0]
            first = http.request(method, path, json=body)
            if first.status_code == 404:
                user_calls = []
            else:
                _check(first, f"{method} {path}")
                user_calls, made = user_calls[1:], 1
        if bulk is False or (not user_calls and made == 0):
            user_calls = _per_row_calls(population)
        # The longest chains first: they bound the whole load.
        chains = sorted(_follower_calls(population), key=len, reverse=True)
        chains += [[call] for call in user_calls]
        total = made + sum(len(c) for c in chains)
        done = made
        lock = threading.Lock()

        def run_chain(chain: list[tuple[str, str, dict[str, Any]]]) -> None:
            nonlocal done
            for method, path, body in chain:
                _check(http.request(method, path, json=body), f"{method} {path}")
                with lock:
                    done += 1
                    if progress is not None:
                        progress(done, total)

        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(run_chain, chains))
        return total


def post_event(
    http: httpx.Client,
    history: History,
    tenant_id: str,
    author_id: str,
    kind: str,
    object_id: str,
    event_id: str | None = None,
) -> str:
    """POST one event with an id minted here (or ``event_id``); recorded as ``inject`` once
    accepted, or ``inject_info`` when the answer does not say (5xx, a cut connection: the
    system may have taken it), before the error is raised."""
    event_id = event_id or str(ULID())
    body = {
        "tenant_id": tenant_id,
        "author_id": author_id,
        "kind": kind,
        "object_id": object_id,
        "event_id": event_id,
    }
    started = time.time()
    fields = {"time": started, "tenant_id": tenant_id, "author_id": author_id, "detail": kind}
    try:
        response = http.post("/v1/events", json=body)
    except httpx.HTTPError:
        history.append("inject_info", end=time.time(), notification_id=event_id, **fields)
        raise
    if response.status_code >= 500:
        history.append("inject_info", end=time.time(), notification_id=event_id, **fields)
    accepted = _check(response, f"POST /v1/events {body}")
    history.append("inject", end=time.time(), notification_id=accepted["notification_id"], **fields)
    return accepted["notification_id"]
