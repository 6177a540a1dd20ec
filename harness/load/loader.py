"""Loading the population into a system and injecting events, over its public HTTP API only."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from ulid import ULID

from harness.contract.driver import Call, Driver, Event, FanoutApiDriver, Unsupported
from harness.model.history import History
from harness.model.population import Population, preferences_body

# An answer that asks the producer to send again (HTTP 429, 503), and how often and how soon
# post_event does: 0.25, 0.5 and 1 s, under two seconds in all.
RETRY_STATUSES = frozenset({429, 503})
RETRIES = 3
RETRY_BACKOFF_S = 0.25


class LoadError(RuntimeError):
    """The system under test refused population data or an event."""


def _per_row_calls(population: Population, driver: Driver) -> list[Call]:
    """One call per preference and per device: what any API offers."""
    calls = [
        driver.set_preferences(user.tenant_id, user.user_id, preferences_body(user))
        for user in population.users
    ]
    calls += [
        driver.register_device(d.tenant_id, d.user_id, d.token, d.platform)
        for d in population.devices
    ]
    return calls


def _bulk_calls(population: Population, driver: Driver) -> list[Call]:
    """Users, with their preferences and devices, in bulk (the reference's ``users:batch``
    takes 500 a call: a million users are 2,000 calls, not 2.3 million); [] when the system
    offers no bulk path."""
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
                "preferences": preferences_body(user),
                "devices": devices.get((user.tenant_id, user.user_id), []),
            }
        )
    size = getattr(driver, "users_per_call", 500)
    try:
        return [
            driver.load_users(tenant, users[i : i + size])
            for tenant, users in by_tenant.items()
            for i in range(0, len(users), size)
        ]
    except Unsupported:
        return []


def _follower_calls(population: Population, driver: Driver) -> list[list[Call]]:
    """Each author's follower list in calls of the driver's size (or the population's
    ``followers_per_call``, when smaller), as one chain per author: a
    system may serialise changes to one author's list (the reference does), so the calls of
    one author go one after another and the authors go in parallel."""
    size = getattr(driver, "followers_per_call", 10_000)
    if population.spec.followers_per_call:
        size = min(size, int(population.spec.followers_per_call))
    warm = max(0, int(population.spec.warm_reads_while_following))
    chains = []
    for author in population.authors:
        followers = list(author.followers)
        chain = [
            driver.follow(author.tenant_id, author.user_id, followers[start : start + size])
            for start in range(0, len(followers), size)
        ]
        if warm and len(chain) > 1:
            chain[1:1] = _warm_reads(driver, author.tenant_id, followers[: min(size, warm)])
        chains.append(chain)
    return chains


def _warm_reads(driver: Driver, tenant: str, users: list[str]) -> list[Call]:
    """A one-item inbox page for each of ``users`` (none when the system has no inbox)."""
    try:
        return [driver.inbox_page(tenant, user, 1, None) for user in users]
    except Unsupported:
        return []


def _check(response: httpx.Response, call: Call) -> Any:
    if response.status_code >= 300:
        raise LoadError(
            f"{call.method} {call.url}: HTTP {response.status_code}: {response.text[:300]}"
        )
    return response.json() if response.content else None


def load_population(
    api_url: str,
    population: Population,
    workers: int = 8,
    bulk: bool | None = None,
    progress: Callable[[int, int], None] | None = None,
    driver: Driver | None = None,
) -> int:
    """Preferences, devices and follower lists into the system, through its driver (the
    Event API's by default); returns the calls made.

    ``bulk``: None tries the bulk path and falls back to a call per row when the API answers
    404 (a system without it); True or False forces one or the other. ``progress(done,
    total)`` is told every call.
    """
    driver = driver or FanoutApiDriver()
    with httpx.Client(
        base_url=api_url, timeout=60, limits=httpx.Limits(max_connections=workers)
    ) as http:

        def make(call: Call) -> httpx.Response:
            return http.request(call.method, call.url, json=call.body)

        made = 0
        user_calls = _bulk_calls(population, driver) if bulk is not False else []
        if user_calls and bulk is None:
            first = make(user_calls[0])
            if first.status_code == 404:
                user_calls = []
            else:
                _check(first, user_calls[0])
                user_calls, made = user_calls[1:], 1
        if bulk is False or (not user_calls and made == 0):
            user_calls = _per_row_calls(population, driver)
        # The longest chains first: they bound the whole load.
        chains = sorted(_follower_calls(population, driver), key=len, reverse=True)
        chains += [[call] for call in user_calls]
        total = made + sum(len(c) for c in chains)
        done = made
        lock = threading.Lock()

        def run_chain(chain: list[Call]) -> None:
            nonlocal done
            for call in chain:
                _check(make(call), call)
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
    driver: Driver | None = None,
    system_minted: bool = False,
) -> str:
    """POST one event with an id minted here (or ``event_id``; or, ``system_minted``, none:
    the system mints it and answers it); recorded as ``inject`` once accepted, or
    ``inject_info`` when the answer does not say (5xx, a cut connection: the system may have
    taken it; a system-minted id is then unknown), before the error is raised."""
    driver = driver or FanoutApiDriver()
    event_id = None if system_minted else event_id or str(ULID())
    call = driver.post_event(Event(tenant_id, author_id, kind, object_id, event_id))
    for attempt in range(RETRIES + 1):
        started = time.time()
        fields = {
            "time": started, "tenant_id": tenant_id, "author_id": author_id, "detail": kind,
            "object_id": object_id,
        }  # fmt: skip
        try:
            response = http.request(call.method, call.url, json=call.body)
        except httpx.HTTPError:
            history.append("inject_info", end=time.time(), notification_id=event_id, **fields)
            raise
        if response.status_code >= 500:
            history.append("inject_info", end=time.time(), notification_id=event_id, **fields)
        if response.status_code not in RETRY_STATUSES or attempt == RETRIES:
            break
        # The system said "retry" (a store of its own unavailable): a producer sends the same
        # event again, as the design's idempotent ids allow, a few times and no longer.
        time.sleep(RETRY_BACKOFF_S * 2**attempt)
    nid = driver.parse_post_event(response.status_code, _check(response, call))
    history.append("inject", end=time.time(), notification_id=nid, **fields)
    return nid
