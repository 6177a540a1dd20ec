"""Timed actions of a scenario's method, beside the faults: what an operator or the users do
mid-run, each recorded in the history with the instant it was sent and the instant the system
acknowledged it, so that the oracle knows what should hold from when.

* ``redrive-dlq``: the runbook's DLQ redrive (every channel queue and the page queue);
* ``change-preferences``: some users withdraw push consent (no record, or the record kept with
  ``revoked_at``), turn push off (``channels.push`` false), grant consent, move their quiet hours
  over the present, or move to a zone where their window covers the present; through the API,
  or written straight to the system's preferences table (``via``: api, table, mixed); and
  some get a zone no tz database knows (``unknown_zone``) or a quiet window no clock can read
  (``unreadable_quiet_hours``, 25:00), which only a table write can give (an API refuses
  them), the cases where quiet hours must fail closed;
* ``post-probes``: one event per chosen author, remembered for ``reregister-users``
  (``system_minted_ids``: the system mints their ids, as ``load.system_minted_ids``);
* ``erase-users``: erase some followers of the probe authors (retrying while the system cannot
  finish, e.g. with its dedup store cut), each having first read items of their first page one
  by one and then all (read state for the erasure to purge), then read their inbox and unread
  count;
  ``latest_followers`` (a fraction) picks them among each author's last followers as loaded;
* ``reregister-users``: register the erased users again (same id, same devices), follow the
  probe authors again, post the probes again with the same id and content, and once they must
  have landed read their inbox again;
* ``reinstall-devices``: some users whose device's token the population made dead install the
  app again: the token answers again at the APNs/FCM simulator (the same string, as the
  providers may hand back) and the device is registered again through the system's API; once
  that must have taken effect, one new event of an author each follows is posted, which the
  oracle then expects on the device (the system must turn the endpoint SNS disabled on again);
  followers of the probe authors first (their probe already met the dead token);
* ``count-unread``: the unread count of ``users`` followers of each celebrity, once (the seed
  picks them), late enough that the celebrity's posts are older than any lag: counts a
  read-all did not just precede, which an undercount (the merged pointers left out) can show;
  with ``readers: true``, of every user who read items one by one (as a rollback: once every
  delivery is in, a count that forgot those reads is surely over);
* ``inject-malformed-jobs``: put jobs no retry can fix straight onto channel work queues
  through the public SQS API (a body that is not JSON, a JSON job without its fields, a job
  whose notification id is not a ULID but whose tenant and recipient are real), each carrying
  an id of its own the harness finds again in whatever queue it ends in (``malformed`` rows);
  skipped, and said so, on a system that names no poison queue (``poison_queue`` is then off).

The users each action picks come from the run's seed. Every load loop is bounded in count and
time; an action stops retrying when the run rolls back.
"""

from __future__ import annotations

import functools
import json
import random
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, available_timezones

import httpx
import pandas as pd

from harness.contract.driver import Call, Driver, FanoutApiDriver, Unsupported
from harness.contract.system import JobTemplate
from harness.load.loader import post_event
from harness.load.record import append_read
from harness.model import local_time
from harness.model.history import History
from harness.model.inbox import read_rows
from harness.model.population import (
    Author,
    Population,
    User,
    consent_stands,
    preferences_body,
)
from harness.model.timeline import PENDING_AFTER_S

PREFERENCE_CHANGES = (
    "withdraw_consent",
    "revoke_consent",
    "switch_off_push",
    "grant_consent",
    "regrant_consent",
    "enter_quiet_hours",
    "change_zone",
    "unknown_zone",
    "unreadable_quiet_hours",
)
# Changes an API refuses (a zone no tz database knows, a window no clock has): written to the
# table whatever ``via``.
TABLE_ONLY = frozenset({"unknown_zone", "unreadable_quiet_hours"})
UNKNOWN_ZONE = "Mars/Olympus_Mons"
UNREADABLE_WINDOW = {"start": "25:00", "end": "07:00"}
CONSENT = {"granted_at": "2026-11-01T00:00:00+00:00", "version": "2026-11"}
REVOKED_BEFORE_REGRANT = "2026-06-01T00:00:00+00:00"
MAX_RETRY_S = 120.0
# Items an erased user reads one by one before the erasure (then read-all).
MARKS_BEFORE_ERASURE = 3


class ActionError(ValueError):
    """An action or its parameters are not valid."""


@dataclass
class ActionContext:
    """What the actions of one run share."""

    api_url: str
    population: Population
    history: History
    seed: int
    stop: threading.Event = field(default_factory=threading.Event)
    # Writes the system's preferences table directly; None: the target offers no such writer.
    table_writer: Callable[[str, str, dict[str, Any]], None] | None = None
    redrive: Callable[[], str] | None = None
    # How the system's API is reached (its contract's driver).
    driver: Driver = field(default_factory=FanoutApiDriver)
    # How long after its acknowledgement a change must have taken effect (the scenario's
    # preference_bound_s): events meant to meet the new state are posted after it.
    bound_s: float = 5.0
    # Sends a raw message (body, message attributes) to a channel's work queue; the channels
    # whose system names a poison queue. None / empty: the system exposes no such queues.
    send_raw: Callable[[str, str, dict[str, Any]], None] | None = None
    poison_channels: tuple[str, ...] = ()
    # A well-formed job of the system's schema (its contract's), to write one wrong in its id.
    job_template: JobTemplate | None = None
    # An erasure run as a job: whether it has completed (None: the API's answer is it).
    erasure_done: Callable[[str, str], bool] | None = None
    # Brings dead tokens of a platform back to life at its provider simulator; None: no
    # simulator the harness controls.
    revive: Callable[[str, list[str]], None] | None = None
    # How far the system's clock runs ahead of real time: a window placed over "the present"
    # is placed over the system's present (its wall clock reads it).
    clock_offset_s: float = 0.0
    probes: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    erased: list[tuple[str, str]] = field(default_factory=list)
    chosen: set[tuple[str, str]] = field(default_factory=set)

    def rng(self, name: str) -> random.Random:
        return random.Random(f"{self.seed}:{name}")

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.api_url, timeout=10)

    def make(self, http: httpx.Client, call: Call) -> httpx.Response:
        return http.request(call.method, call.url, json=call.body)


# -- choosing users ---------------------------------------------------------------------------


def _followers(population: Population, authors: list[Author] | None = None) -> list[User]:
    wanted = authors if authors is not None else population.authors
    keys = sorted({(a.tenant_id, f) for a in wanted for f in a.followers})
    return [population.user(t, u) for t, u in keys]


def _live_devices(population: Population, user: User) -> bool:
    return any(not d.dead for d in population.devices_of(user.tenant_id, user.user_id))


def _pick(ctx: ActionContext, name: str, users: list[User], count: int) -> list[User]:
    free = [u for u in users if (u.tenant_id, u.user_id) not in ctx.chosen]
    chosen = ctx.rng(name).sample(free, min(count, len(free)))
    ctx.chosen.update((u.tenant_id, u.user_id) for u in chosen)
    return chosen


# -- preference changes -----------------------------------------------------------------------


_ZONES = tuple(
    zone
    for zone in sorted(available_timezones())
    if zone not in ("Factory", "localtime", "posixrules")
    and not zone.startswith(("Etc/", "SystemV"))
)


def _window_now(zone: str, now: float) -> dict[str, str]:
    """A window in ``zone``'s wall clock that covers the present and the next hours."""
    local = datetime.fromtimestamp(now, ZoneInfo(zone))
    start, end = local - timedelta(hours=2), local + timedelta(hours=5)
    return {"start": start.strftime("%H:%M"), "end": end.strftime("%H:%M")}


def zone_covering(window: dict[str, str], now: float, horizon: float) -> str | None:
    """An IANA zone whose wall clock puts ``now`` inside ``window`` until past ``horizon`` (and
    since some minutes before now), or None."""
    return _zone_covering(tuple(sorted(window.items())), now, horizon)


@functools.lru_cache(maxsize=256)
def _zone_covering(window: tuple[tuple[str, str], ...], now: float, horizon: float) -> str | None:
    # Cached: one plan asks it of every candidate (the same few windows, the same instant), and
    # a walk over the tz database takes a tenth of a second: uncached, a plan of 27 changes
    # started 10 s after its offset, past the posts meant to meet its changes.
    for zone in _ZONES:
        try:
            if not local_time.inside(dict(window), zone, now - 600):
                continue
            end = local_time.window_end(dict(window), zone, now)
        except (ValueError, KeyError):
            continue
        if end is not None and end > horizon:
            return zone
    return None


def preference_change(kind: str, user: User, now: float, horizon: float) -> dict[str, Any] | None:
    """The preferences body after ``kind``, or None when the user cannot make that change
    observable (the oracle could not tell it from the state before)."""
    body = preferences_body(user)
    calm = user.quiet_state in ("none", "outside")
    if kind == "withdraw_consent" and user.consent is not None and calm:
        return {**body, "push_consent": None}
    # The other way to withdraw: the record kept (the proof it was once given), revoked now.
    if kind == "revoke_consent" and user.consent is not None and calm:
        revoked = datetime.fromtimestamp(now, UTC).isoformat()
        return {**body, "push_consent": {**user.consent, "revoked_at": revoked}}
    # Push turned off in the app's settings, consent untouched: an opt-out holds all the same.
    if kind == "switch_off_push" and user.consent is not None and calm:
        return {**body, "channels": {**body.get("channels", {}), "push": False}}
    if kind == "grant_consent" and user.consent is None and calm:
        return {**body, "push_consent": CONSENT}
    # Given, withdrawn, given again: the record keeps the withdrawal, older than the new grant.
    if kind == "regrant_consent" and user.consent is None and calm:
        return {**body, "push_consent": {**CONSENT, "revoked_at": REVOKED_BEFORE_REGRANT}}
    if kind == "enter_quiet_hours" and user.consent is not None and calm:
        return {**body, "quiet_hours": _window_now(user.zone, now)}
    if kind == "change_zone" and user.consent is not None and user.quiet_state == "outside":
        zone = zone_covering(user.quiet_hours or {}, now, horizon)
        return None if zone is None else {**body, "zone": zone}
    # A user with no window at all: only failing closed on the zone holds their pushes, so any
    # system that fails open (sends now, reads the zone as UTC) shows it on every push.
    if kind == "unknown_zone" and user.consent is not None and user.quiet_state == "none":
        return {**body, "zone": UNKNOWN_ZONE}
    if kind == "unreadable_quiet_hours" and user.consent is not None and calm:
        return {**body, "quiet_hours": dict(UNREADABLE_WINDOW)}
    return None


def kinds_for(params: dict[str, Any]) -> list[str]:
    """The changes ``change-preferences`` makes: those named, else every one the ``via`` can
    write (through the API alone, not the table-only ones)."""
    if params.get("kinds"):
        return list(params["kinds"])
    via = params.get("via", "mixed")
    return [k for k in PREFERENCE_CHANGES if via != "api" or k not in TABLE_ONLY]


def change_preferences(ctx: ActionContext, params: dict[str, Any]) -> str:
    kinds = kinds_for(params)
    count = int(params.get("count", 8))
    via = str(params.get("via", "mixed"))
    spread = float(params.get("spread_s", 0.0))
    if via in ("table", "mixed") and ctx.table_writer is None:
        raise ActionError("this target offers no direct write to its preferences table")
    of = str(params.get("of", "any"))
    authors = [
        a for a in ctx.population.authors if of == "any" or a.celebrity == (of == "celebrity")
    ]
    # On the system's clock: the windows placed are wall-clock times it reads.
    now = time.time() + ctx.clock_offset_s
    horizon = ctx.population.started_at + PENDING_AFTER_S + ctx.clock_offset_s
    candidates = [
        u for u in _followers(ctx.population, authors) if _live_devices(ctx.population, u)
    ]
    plan: list[tuple[User, str, dict[str, Any]]] = []
    for i, kind in enumerate(kinds * count):
        if len(plan) >= count:
            break
        eligible = [u for u in candidates if preference_change(kind, u, now, horizon)]
        for user in _pick(ctx, f"change-{kind}-{i}", eligible, 1):
            body = preference_change(kind, user, now, horizon)
            assert body is not None
            plan.append((user, kind, body))
    done = 0
    gap = spread / max(1, len(plan) - 1) if len(plan) > 1 else 0.0
    with ctx.client() as http:
        for i, (user, kind, body) in enumerate(plan):
            if ctx.stop.wait(gap if i else 0.0):
                break
            how = (
                "table"
                if kind in TABLE_ONLY
                else via
                if via != "mixed"
                else ("api" if i % 2 == 0 else "table")
            )
            sent = time.time()
            ok = True
            try:
                if how == "api":
                    call = ctx.driver.set_preferences(user.tenant_id, user.user_id, body)
                    ok = ctx.make(http, call).status_code < 300
                else:
                    assert ctx.table_writer is not None
                    ctx.table_writer(user.tenant_id, user.user_id, body)
            except (httpx.HTTPError, OSError, RuntimeError):
                ok = False
            record_change(ctx.history, user.tenant_id, user.user_id, sent, ok,
                          change="preferences", what=kind, via=how, preferences=body)  # fmt: skip
            done += ok
    return f"{done}/{len(plan)} preference change(s) acknowledged"


def record_change(
    history: History, tenant: str, user: str, sent: float, ok: bool, **detail: Any
) -> None:
    history.append(
        "change",
        time=sent,
        end=time.time() if ok else None,
        tenant_id=tenant,
        user_id=user,
        detail=json.dumps({**detail, "ok": ok}),
    )


# -- erasure ----------------------------------------------------------------------------------


def _probe_authors(population: Population, which: str) -> list[Author]:
    out = []
    for tenant in sorted({a.tenant_id for a in population.authors}):
        mine = [a for a in population.authors if a.tenant_id == tenant]
        if which in ("regular", "both"):
            out += [a for a in mine if not a.celebrity][:1]
        if which in ("celebrity", "both"):
            out += [a for a in mine if a.celebrity][:1]
    return out


def post_probes(ctx: ActionContext, params: dict[str, Any]) -> str:
    authors = _probe_authors(ctx.population, str(params.get("authors", "both")))
    # ``kind``: "post" (push only) or e.g. "mention" (every channel: the erasure must purge the
    # email, in-app and SMS keys too, which a post never sets).
    kind = str(params.get("kind", "post"))
    # The system mints the ids (no event_id sent), as a load with system_minted_ids does: on a
    # moved clock an id the harness minted carries the harness's time, not the system's.
    minted = bool(params.get("system_minted_ids", False))
    with ctx.client() as http:
        for author in authors:
            object_id = f"probe-{author.user_id}-{ctx.seed}"
            nid = post_event(
                http, ctx.history, author.tenant_id, author.user_id, kind, object_id,
                driver=ctx.driver, system_minted=minted,
            )  # fmt: skip
            ctx.probes[(author.tenant_id, author.user_id)] = {
                "event_id": nid, "kind": kind, "object_id": object_id,
            }  # fmt: skip
    return f"{len(authors)} probe event(s) posted"


def _retrying(ctx: ActionContext, attempt: Callable[[], bool], for_s: float) -> bool:
    deadline = time.monotonic() + min(for_s, MAX_RETRY_S)
    while True:
        if attempt():
            return True
        if time.monotonic() >= deadline or ctx.stop.wait(0.5):
            return False


def latest_followers(authors: list[Author], fraction: float) -> set[tuple[str, str]]:
    """(tenant, user) of the last ``fraction`` (at least one) of each author's followers as the
    loader adds them: with the population's ``followers_per_call`` small, their follow reached
    an author already past any celebrity threshold below its count (a path the first follows
    never take)."""
    return {
        (a.tenant_id, f)
        for a in authors
        for f in a.followers[len(a.followers) - max(1, int(len(a.followers) * fraction)) :]
    }


def erase_users(ctx: ActionContext, params: dict[str, Any]) -> str:
    if not ctx.probes:
        raise ActionError("erase-users needs post-probes earlier in the method")
    count = int(params.get("count", 2))
    retry_for = float(params.get("retry_for_s", 30.0))
    authors = [ctx.population.author(t, a) for t, a in ctx.probes]
    # Users who surely got a probe: consent, no quiet window, a live device.
    eligible = [
        u
        for u in _followers(ctx.population, authors)
        if u.consent is not None
        and u.quiet_state in ("none", "outside")
        and _live_devices(ctx.population, u)
    ]
    latest = float(params.get("latest_followers", 0.0))
    if latest:
        late = latest_followers(authors, latest)
        eligible = [u for u in eligible if (u.tenant_id, u.user_id) in late] or eligible
    if any(probe.get("kind", "post") != "post" for probe in ctx.probes.values()):
        # Probes that reach email and SMS: users those channels reach first, so that the
        # erasure of their channel dedup keys is judged (red team 3).
        eligible = [u for u in eligible if _texted_or_mailed(u)] or eligible
    erased = 0
    with ctx.client() as http:
        for user in _pick(ctx, "erase", eligible, count):
            read_before_erasure(ctx, http, user.tenant_id, user.user_id)
            call = ctx.driver.erase_user(user.tenant_id, user.user_id)

            def attempt(user: User = user, call: Call = call) -> bool:
                sent = time.time()
                try:
                    ok = ctx.make(http, call).status_code < 300
                except httpx.HTTPError:
                    ok = False
                if ok and ctx.erasure_done is not None:
                    # Acknowledged when the job says it is done, not when it was accepted.
                    ok = _completed(ctx, user.tenant_id, user.user_id)
                record_change(ctx.history, user.tenant_id, user.user_id, sent, ok,
                              change="erasure")  # fmt: skip
                return ok

            if not _retrying(ctx, attempt, retry_for):
                continue
            erased += 1
            ctx.erased.append((user.tenant_id, user.user_id))
            read_after_erasure(ctx, http, user.tenant_id, user.user_id)
    return f"{erased} user(s) erased"


ERASURE_JOB_TIMEOUT_S = 120.0


def _completed(ctx: ActionContext, tenant: str, user: str) -> bool:
    """Whether the system's erasure job for the user completes within its bound (polled)."""
    assert ctx.erasure_done is not None
    deadline = time.monotonic() + ERASURE_JOB_TIMEOUT_S
    while not ctx.stop.is_set():
        if ctx.erasure_done(tenant, user):
            return True
        if time.monotonic() >= deadline:
            return False
        ctx.stop.wait(0.25)  # a poll interval, bounded by the deadline above
    return False


def _texted_or_mailed(user: User) -> bool:
    """Whether a mention may reach the user by email or SMS (an address or number with that
    channel's consent, the channel on): the consent-bearing channels the erasure checker reads."""
    off = set(user.channels_off or ())
    mailed = bool(user.email) and consent_stands(user.email_consent) and "email" not in off
    texted = bool(user.phone) and consent_stands(user.sms_consent) and "sms" not in off
    return mailed or texted


def _note(ctx: ActionContext, op: str, tenant: str, user: str, status: int, sent: float,
          **fields: Any) -> None:  # fmt: skip
    append_read(ctx.history, {"op": op, "tenant_id": tenant, "user_id": user, "status": status,
                              "time": sent, "end": time.time(), **fields})  # fmt: skip


def read_before_erasure(ctx: ActionContext, http: httpx.Client, tenant: str, user: str) -> None:
    """The user leaves read state for the erasure to purge: the items of their first page read
    one by one, then read-all (the per-item marks and the watermark are both theirs). The
    person registered again later must see none of it (the erasure checker's
    ``read_state_survived``). A system without these reads is left as it is."""
    driver = ctx.driver
    try:
        page_call = driver.inbox_page(tenant, user, 20, None)
        read_all = driver.read_all(tenant, user)
    except Unsupported:
        return
    sent = time.time()
    page = ctx.make(http, page_call)
    ids: list[str] = []
    if page.status_code == 200:
        ids = [i.notification_id for i in driver.parse_inbox_page(200, page.json()).items]
    for nid in ids[:MARKS_BEFORE_ERASURE]:
        try:
            call = driver.mark_read(tenant, user, nid)
        except Unsupported:
            break
        sent = time.time()
        status = ctx.make(http, call).status_code
        _note(ctx, "mark_read", tenant, user, status, sent, notification_id=nid)
    sent = time.time()
    _note(ctx, "read_all", tenant, user, ctx.make(http, read_all).status_code, sent)


def read_after_erasure(
    ctx: ActionContext, http: httpx.Client, tenant: str, user: str, walk: str = "erasure"
) -> None:
    """Their inbox and unread count, as read rows the erasure checker judges."""
    driver = ctx.driver
    call = driver.inbox_page(tenant, user, 20, None)
    sent = time.time()
    page = ctx.make(http, call)
    answered = time.time()
    parsed = (
        driver.parse_inbox_page(page.status_code, page.json()) if page.status_code == 200 else None
    )
    items = list(parsed.items) if parsed else []
    append_read(ctx.history, {
        "op": "page", "walk": f"{walk}-{tenant}-{user}", "page": 0, "tenant_id": tenant,
        "user_id": user, "limit": 20, "cursor": None,
        "next_cursor": parsed.next_cursor if parsed else None, "status": page.status_code,
        "time": sent, "end": answered,
        "ids": [i.notification_id for i in items], "authors": [i.author_id for i in items],
        "read": [i.read for i in items],
    })  # fmt: skip
    try:
        call = driver.unread_count(tenant, user)
    except Unsupported:
        return
    sent = time.time()
    count = ctx.make(http, call)
    unread = (
        driver.parse_unread_count(count.status_code, count.json())[0]
        if count.status_code == 200
        else None
    )
    append_read(ctx.history, {
        "op": "unread", "tenant_id": tenant, "user_id": user, "status": count.status_code,
        "time": sent, "end": time.time(), "unread": unread,
    })  # fmt: skip


def reregister_users(ctx: ActionContext, params: dict[str, Any]) -> str:
    done = 0
    reposts: list[tuple[str, list[tuple[str, str]]]] = []
    again: list[tuple[str, str]] = []
    with ctx.client() as http:
        for tenant, user_id in list(ctx.erased):
            user = ctx.population.user(tenant, user_id)
            follows = [
                (t, a) for (t, a) in ctx.probes
                if t == tenant and user_id in ctx.population.author(t, a).followers
            ]  # fmt: skip
            driver = ctx.driver
            sent = time.time()
            calls = [driver.set_preferences(tenant, user_id, preferences_body(user))]
            calls += [
                driver.register_device(tenant, user_id, d.token, d.platform)
                for d in ctx.population.devices_of(tenant, user_id)
            ]
            calls += [driver.follow(tenant, author, [user_id]) for _, author in follows]
            ok = all(ctx.make(http, call).status_code < 300 for call in calls)
            # The tokens, for whoever reads the change without the population (the live view).
            tokens = [d.token for d in ctx.population.devices_of(tenant, user_id)]
            record_change(ctx.history, tenant, user_id, sent, ok, change="registration",
                          follows=[list(f) for f in follows], tokens=tokens)  # fmt: skip
            if not ok:
                continue
            done += 1
            reposts.append((tenant, follows))
            again.append((tenant, user_id))
    # Posted again once the registrations must have taken effect: the oracle then requires the
    # new person to get them (a surviving dedup key would suppress them).
    if reposts and ctx.stop.wait(ctx.bound_s + 1.0):
        return f"{done} user(s) registered again; stopped before posting the probes again"
    with ctx.client() as http:
        for tenant, follows in reposts:
            for key in follows:
                probe = ctx.probes[key]
                post_event(http, ctx.history, tenant, key[1], probe["kind"], probe["object_id"],
                           probe["event_id"], driver=ctx.driver)  # fmt: skip
    # Their inbox once the probes must have landed again: nothing the erased person read may
    # show as read to the new one (the erasure checker's read_state_survived).
    if reposts and ctx.stop.wait(ctx.bound_s + 1.0):
        return f"{done} user(s) registered again; their probes posted again"
    with ctx.client() as http:
        for tenant, user_id in again:
            read_after_erasure(ctx, http, tenant, user_id, walk="registered-again")
    return f"{done} user(s) registered again; their probes posted again"


# -- apps installed again --------------------------------------------------------------------


def reinstallable(population: Population, among: list[User]) -> list[User]:
    """Users of ``among`` with a dead device whose token no other device shares (reviving a
    shared token would bring another tenant's or user's dead device back too)."""
    uses: dict[str, int] = {}
    for device in population.devices:
        uses[device.token] = uses.get(device.token, 0) + 1
    return [
        u for u in among
        if any(d.dead and uses[d.token] == 1 for d in population.devices_of(u.tenant_id, u.user_id))
    ]  # fmt: skip


def reinstall_devices(ctx: ActionContext, params: dict[str, Any]) -> str:
    if ctx.revive is None:
        raise ActionError("reinstall-devices needs provider simulators the harness controls")
    count = int(params.get("count", 3))
    kind = str(params.get("kind", "post"))
    authors = [ctx.population.author(*key) for key in sorted(ctx.probes)] or None
    candidates = reinstallable(ctx.population, _followers(ctx.population, authors))
    chosen = _pick(ctx, "reinstall-devices", candidates, count)
    done: list[User] = []
    with ctx.client() as http:
        for user in chosen:
            dead = [d for d in ctx.population.devices_of(user.tenant_id, user.user_id) if d.dead]
            sent = time.time()
            ok = True
            try:
                for platform in sorted({d.platform for d in dead}):
                    ctx.revive(platform, [d.token for d in dead if d.platform == platform])
                calls = [
                    ctx.driver.register_device(user.tenant_id, user.user_id, d.token, d.platform)
                    for d in dead
                ]
                ok = all(ctx.make(http, call).status_code < 300 for call in calls)
            except (httpx.HTTPError, OSError, RuntimeError):
                ok = False
            record_change(ctx.history, user.tenant_id, user.user_id, sent, ok,
                          change="reinstall", tokens=[d.token for d in dead])  # fmt: skip
            if ok:
                done.append(user)
    # One new event per author a reinstalled user follows (the probe authors first), posted
    # once the registrations must have taken effect: the oracle then requires the devices.
    if not done or ctx.stop.wait(ctx.bound_s + 1.0):
        return f"{len(done)}/{len(chosen)} device(s) reinstalled; no event posted after"
    wanted = authors if authors is not None else ctx.population.authors
    posting: list[Author] = []
    for user in done:
        followed = [a for a in wanted if a.tenant_id == user.tenant_id
                    and user.user_id in a.followers]  # fmt: skip
        if followed and followed[0] not in posting:
            posting.append(followed[0])
    with ctx.client() as http:
        for author in posting:
            post_event(http, ctx.history, author.tenant_id, author.user_id, kind,
                       f"reinstall-{author.user_id}-{ctx.seed}", driver=ctx.driver)  # fmt: skip
    return f"{len(done)}/{len(chosen)} device(s) reinstalled; {len(posting)} event(s) posted after"


# -- malformed jobs ---------------------------------------------------------------------------

MALFORMED_FORMS = ("not_json", "missing_fields", "bad_notification_id")
# The id a malformed job carries in its body: found again in any queue's message by its shape.
MALFORMED_ID = re.compile(r"malformed-[0-9a-f]{32}")


def malformed_id_in(body: str) -> str | None:
    """The harness's malformed-job id a message body carries, or None."""
    found = MALFORMED_ID.search(body or "")
    return found.group(0) if found else None


def malformed_job(
    form: str, marker: str, values: dict[str, str], template: JobTemplate | None
) -> tuple[str, dict[str, Any]] | None:
    """(body, SQS message attributes) of one malformed job, None when ``form`` cannot be built
    for this system. ``bad_notification_id`` is a well-formed job of the system's own schema
    (``template``, filled with ``values``: a real tenant, recipient, author, device) whose id
    alone is wrong: only the id's shape (seed 000: ULIDs) tells it apart, so a consumer that
    skips that check sends it. Without a template that form is not sent: a job that merely
    lacks fields proves nothing about the id check."""
    attributes = {"tenant_id": {"DataType": "String", "StringValue": values["tenant"]}}
    if form == "not_json":
        return f"{{{marker} is not a job", attributes
    if form == "missing_fields":
        return json.dumps({"tenant_id": values["tenant"], "malformed_id": marker}), attributes
    if form == "bad_notification_id":
        if template is None:
            return None
        return template.build(**values, notification=marker), attributes
    raise ActionError(f"unknown malformed form {form!r}; known: {', '.join(MALFORMED_FORMS)}")


def inject_malformed_jobs(ctx: ActionContext, params: dict[str, Any]) -> str:
    channels = [str(c) for c in params.get("channels", ["push"])]
    count = int(params.get("count", 3))
    if ctx.send_raw is None or not ctx.poison_channels:
        return "not injected: the system names no poison queue (poison_queue not judged)"
    wanted = [c for c in channels if c in ctx.poison_channels]
    skipped = sorted(set(channels) - set(wanted))
    users = [u for u in _followers(ctx.population) if _live_devices(ctx.population, u)]
    rng = ctx.rng("malformed")
    sent = unbuilt = 0
    for channel in wanted:
        for i in range(count):
            if ctx.stop.is_set():
                break
            form = MALFORMED_FORMS[i % len(MALFORMED_FORMS)]
            user = rng.choice(users)
            device = next(
                d for d in ctx.population.devices_of(user.tenant_id, user.user_id) if not d.dead
            )
            marker = f"malformed-{uuid.UUID(int=rng.getrandbits(128)).hex}"
            values = {
                "tenant": user.tenant_id,
                "recipient": user.user_id,
                "author": rng.choice(ctx.population.authors).user_id,
                "token": device.token,
                "platform": device.platform,
            }
            job = malformed_job(form, marker, values, ctx.job_template)
            if job is None:
                unbuilt += 1
                continue
            at = time.time()
            ctx.send_raw(channel, *job)
            ctx.history.append(
                "malformed", time=at, end=time.time(), tenant_id=user.tenant_id,
                user_id=user.user_id, notification_id=marker,
                detail=json.dumps({"channel": channel, "form": form}),
            )  # fmt: skip
            sent += 1
    note = f"; no poison queue for {', '.join(skipped)}" if skipped else ""
    if unbuilt:
        note += (
            f"; {unbuilt} with a bad notification id not sent: the system states no "
            "job_template, so the harness cannot write a job that is wrong in its id only"
        )
    return f"{sent} malformed job(s) on {', '.join(wanted) or 'no queue'}{note}"


def count_unread(ctx: ActionContext, params: dict[str, Any]) -> str:
    """Unread counts of ``users`` followers of each celebrity; with ``readers: true``, of
    every user who read an item one by one instead. As a rollback, once every delivery is in,
    such a count leaves no post in flight to hide in: one that forgets the per-item reads is
    over what any post could make it (a loaded run's counts, taken mid-load with posts
    seconds behind, let that defect pass)."""
    if params.get("readers"):
        who = _item_readers(ctx.history.frame())
        what = "readers who read items one by one"
    else:
        users = max(0, int(params.get("users", 10)))
        rng = ctx.rng("count-unread")
        who = [
            (author.tenant_id, user)
            for author in ctx.population.authors
            if author.celebrity
            for user in rng.sample(list(author.followers), min(users, len(author.followers)))
        ]
        what = "celebrity followers"
    erased = set(ctx.erased)
    counted = 0
    with ctx.client() as http:
        for tenant, user in who:
            if (tenant, user) in erased:
                continue  # the erasure checker's
            try:
                call = ctx.driver.unread_count(tenant, user)
            except Unsupported:
                return "the system offers no unread count"
            sent = time.time()
            answer = ctx.make(http, call)
            unread, capped = (
                ctx.driver.parse_unread_count(answer.status_code, answer.json())
                if answer.status_code == 200
                else (None, None)
            )
            append_read(ctx.history, {
                "op": "unread", "tenant_id": tenant, "user_id": user,
                "status": answer.status_code, "time": sent, "end": time.time(),
                "unread": unread, "capped": capped,
            })  # fmt: skip
            counted += 1
    return f"{counted} unread count(s) of {what}"


def _item_readers(history: pd.DataFrame) -> list[tuple[str, str]]:
    """(tenant, user) of every item read one by one the system acknowledged, sorted."""
    marks = read_rows(history, "mark_read")
    return sorted(
        {(str(t), str(u)) for t, u in zip(marks["tenant_id"], marks["user_id"], strict=True)}
    )


def redrive_dlq(ctx: ActionContext, params: dict[str, Any]) -> str:
    if ctx.redrive is None:
        raise ActionError("this target has no dead-letter queues the harness can redrive")
    return ctx.redrive()


ACTIONS: dict[str, Callable[[ActionContext, dict[str, Any]], str]] = {
    "redrive-dlq": redrive_dlq,
    "change-preferences": change_preferences,
    "post-probes": post_probes,
    "erase-users": erase_users,
    "reregister-users": reregister_users,
    "reinstall-devices": reinstall_devices,
    "inject-malformed-jobs": inject_malformed_jobs,
    "count-unread": count_unread,
}

# The actions that change users (recorded as ``change`` rows): the oracle's timeline follows them.
USER_CHANGING_ACTIONS = frozenset(
    ("change-preferences", "erase-users", "reregister-users", "reinstall-devices")
)

# What each action needs of the system: contract capabilities (driver operations among them,
# harness/contract/system.py). A system lacking one cannot take a scenario that schedules it.
ACTION_NEEDS: dict[str, tuple[str, ...]] = {
    "redrive-dlq": ("queues",),
    "post-probes": ("post_event",),
    "erase-users": ("erase_user",),
    "reregister-users": ("set_preferences", "register_device", "follow"),
    "reinstall-devices": ("register_device",),
    "count-unread": ("unread",),
}


def unavailable(name: str, params: dict[str, Any], capabilities: frozenset[str]) -> str | None:
    """Why the action cannot act on this system (what it lacks), or None: asked before the run
    starts, so that a scenario the system cannot take says so instead of failing midway (an
    erasure the driver refuses would leave erasure switched off and the run ending FAIL)."""
    lacks = [c for c in ACTION_NEEDS.get(name, ()) if c not in capabilities]
    if name == "change-preferences":
        via = params.get("via", "mixed")
        if via in ("table", "mixed") and "table_writes" not in capabilities:
            return f"{name} via {via} needs a direct preferences-table writer"
        lacks = [c for c in ("set_preferences",) if c not in capabilities]
    if not lacks:
        return None  # inject-malformed-jobs says for itself what it could not send
    if lacks == ["queues"]:
        return f"{name} needs dead-letter queues the harness can redrive (the target has none)"
    return f"{name} needs {', '.join(lacks)}, which {_offered_by(lacks)}"


def _offered_by(lacks: list[str]) -> str:
    operations = {"post_event", "set_preferences", "register_device", "follow", "erase_user",
                  "unread", "inbox", "read_all", "mark_read", "load_users"}  # fmt: skip
    if set(lacks) <= operations:
        return "its driver does not offer (the driver raises Unsupported)"
    return "its contract does not offer"


def validate(name: str, params: dict[str, Any]) -> None:
    """Raise ActionError for an unknown action or bad parameters."""
    if name not in ACTIONS:
        raise ActionError(f"unknown action {name!r}; known: {', '.join(sorted(ACTIONS))}")
    if name == "change-preferences":
        kinds = kinds_for(params)
        unknown = sorted(set(kinds) - set(PREFERENCE_CHANGES))
        if unknown:
            raise ActionError(
                f"unknown preference change(s) {', '.join(unknown)}; "
                f"known: {', '.join(PREFERENCE_CHANGES)}"
            )
        if params.get("via", "mixed") not in ("api", "table", "mixed"):
            raise ActionError("via must be api, table or mixed")
        table_only = sorted(set(kinds) & TABLE_ONLY)
        if params.get("via") == "api" and table_only:
            raise ActionError(
                f"{', '.join(table_only)} can only be written to the preferences table "
                "(an API refuses it): use via table or mixed"
            )
        if params.get("of", "any") not in ("any", "celebrity", "regular"):
            raise ActionError("of must be any, celebrity or regular (whose followers change)")
    if name == "post-probes" and not isinstance(params.get("system_minted_ids", False), bool):
        raise ActionError(f"{name}: system_minted_ids must be true or false")
    if name == "inject-malformed-jobs":
        channels = params.get("channels", ["push"])
        if not isinstance(channels, list) or not all(isinstance(c, str) for c in channels):
            raise ActionError(f"{name}: channels must be a list of channel names")
    if name == "count-unread" and not isinstance(params.get("readers", False), bool):
        raise ActionError(f"{name}: readers must be true or false")
    for key in ("count",):
        value = params.get(key, 1)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= 1000:
            raise ActionError(f"{name}: {key} must be a whole number from 1 to 1000")
