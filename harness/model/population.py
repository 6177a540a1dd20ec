"""The synthetic population: the harness's own users, graph, devices, zones, quiet hours, consent.

This is the independent oracle. It is generated from a seed and a start instant, written to the
run directory, loaded into the system under test through its public API, and read again by the
checkers, which never look at the system's own state or logs.

Quiet hours are chosen relative to the run's start so that the run meets every case: users
inside their window for the whole run, users whose window ends while the run goes on (their
notifications must be deferred and then delivered), users outside their window, users with no
window. Windows are written in the user's local wall-clock time of their IANA zone.

The other channels (seed 000: email, in-app): a user may have an email address and an email
consent (or one withdrawn, kept with ``revoked_at``), and may be online (an open WebSocket connection for in-app delivery). They are drawn
from a generator of their own, so a seed yields the same push population as before they
existed, and a population file written before them still loads (no address, offline).

Channel switches (seed 000: a user can turn a channel off): some users have email, in-app or
SMS switched off (``channels.<channel>`` false in their preferences, consent kept). A stream of
its own again: every seed's users, devices, addresses and numbers are what they were, and a
file written before the switches existed loads with every channel on.
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal
from zoneinfo import ZoneInfo

QuietState = Literal["none", "outside", "ends_during_run", "whole_run"]
# The channels the population switches off for some users, in draw order.
SWITCHABLE_CHANNELS = ("email", "in_app", "sms")

# Half-hour and 45-minute offsets and DST zones on purpose: they are where quiet-hours code breaks.
ZONES = (
    "Asia/Kathmandu",  # +05:45
    "Asia/Kolkata",  # +05:30
    "America/New_York",
    "Europe/London",
    "Australia/Lord_Howe",  # +10:30/+11, a 30-minute DST shift
    "America/St_Johns",  # -03:30/-02:30
    "Pacific/Chatham",  # +12:45/+13:45
    "Asia/Tokyo",
    "UTC",
)


@dataclass(frozen=True)
class PopulationSpec:
    tenants: int = 2
    users_per_tenant: int = 120
    celebrity_followers: int = 80
    regular_authors: int = 3
    regular_followers: int = 12
    fcm_fraction: float = 0.5
    second_device_fraction: float = 0.3
    dead_token_fraction: float = 0.08
    # Of the dead APNs tokens, the share that APNs answers 400 BadDeviceToken rather than 410
    # Unregistered (both are invalid-token answers). Chosen by a hash of the token, not drawn:
    # the population's streams stay as they were.
    bad_device_token_fraction: float = 0.0
    no_consent_fraction: float = 0.1
    no_device_fraction: float = 0.03
    quiet_whole_run_fraction: float = 0.1
    quiet_ends_fraction: float = 0.15
    quiet_outside_fraction: float = 0.35
    # Windows that end during the run end this long after the population's start instant.
    quiet_release_seconds: float = 20.0
    # Users of tenant-1.. whose first device is the same physical device (token) as the same
    # user id's in tenant-0: one phone with two tenants' apps (seed: cross-tenant suppression).
    shared_token_fraction: float = 0.0
    email_fraction: float = 0.7
    no_email_consent_fraction: float = 0.15
    online_fraction: float = 0.5
    # SMS (a stream of its own: the users, devices and emails above are drawn as before): a
    # number, SMS consent, and the numbers that replied STOP before the run (on the SMS
    # provider's opt-out list: never texted, whatever the consent says).
    phone_fraction: float = 0.6
    no_sms_consent_fraction: float = 0.2
    sms_opted_out_fraction: float = 0.1
    # Each of email, in-app and SMS is switched off (``channels.<channel>`` false) for this
    # share of users, drawn per channel independently (a stream of its own).
    channel_off_fraction: float = 0.1
    # The share of users who ever registered anything (preferences, devices, an address). The
    # rest follow and read but have nothing the delivery path reads: the population holds no
    # record for them and nothing is loaded for them (consent is default-deny, so the system
    # sends them no push). Below 1 it is what makes a million-follower celebrity loadable:
    # the seed sizes a celebrity burst by the ~20% of followers who have push enabled.
    push_enabled_fraction: float = 1.0
    # Followers per follow call when loading (0: as many as the system's driver takes in one).
    # Small, a celebrity's list is loaded in several calls and it crosses a system's celebrity
    # threshold part way: the later follows are made to an author already above it, as most of
    # a real celebrity's are.
    followers_per_call: int = 0
    # With followers_per_call: after an author's first follow call, this many of the followers
    # it added read their inbox once (a page of one), as users opening the app while the author
    # gains followers do. A system that caches what a reader follows then holds an entry made
    # before the author crossed its threshold (red team 3: a cache not dropped at the crossing
    # hid the celebrity's posts from those readers, and no run had a reader before it).
    warm_reads_while_following: int = 0

    def problem(self) -> str | None:
        """What makes this spec unusable, said plainly; None when it is fine."""
        import math

        for name, value in asdict(self).items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                return f"{name} must be a number"
            if isinstance(value, float) and not math.isfinite(value):
                return f"{name} must be a finite number"
            if name.endswith("_fraction") and not 0 <= value <= 1:
                return f"{name} must be between 0 and 1"
            if value < 0:
                return f"{name} must not be negative"
        for name in ("tenants", "users_per_tenant"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                return f"{name} must be a whole number >= 1"
        if self.users_per_tenant < self.celebrity_followers + 1:
            return (
                f"users_per_tenant ({self.users_per_tenant}) must be at least "
                f"celebrity_followers + 1 ({self.celebrity_followers + 1})"
            )
        return None

    def scaled(self, factor: float) -> PopulationSpec:
        values = asdict(self)
        for name in ("users_per_tenant", "celebrity_followers", "regular_followers"):
            values[name] = max(1, int(values[name] * factor))
        return PopulationSpec(**values)


@dataclass(frozen=True)
class Device:
    tenant_id: str
    user_id: str
    platform: Literal["apns", "fcm"]
    token: str
    dead: bool


@dataclass(frozen=True)
class User:
    tenant_id: str
    user_id: str
    zone: str
    quiet_hours: dict[str, str] | None
    consent: dict[str, Any] | None
    quiet_state: QuietState
    # Epoch seconds at which the user's window ends, for "ends_during_run".
    quiet_until: float | None
    email: str | None = None
    email_consent: dict[str, Any] | None = None
    # An open in-app (WebSocket) connection for the whole run.
    online: bool = False
    phone: str | None = None  # E.164
    sms_consent: dict[str, Any] | None = None
    # The number replied STOP before the run: on the SMS provider's opt-out list.
    sms_opted_out: bool = False
    # The channels the user switched off (``channels.<channel>`` false): of SWITCHABLE_CHANNELS.
    # Push's switch is turned off mid-run only (``switch_off_push``, judged by the timeline).
    channels_off: tuple[str, ...] = ()


@dataclass(frozen=True)
class Author:
    tenant_id: str
    user_id: str
    celebrity: bool
    followers: tuple[str, ...]


@dataclass
class Population:
    seed: int
    started_at: float
    spec: PopulationSpec
    users: list[User] = field(default_factory=list)
    devices: list[Device] = field(default_factory=list)
    authors: list[Author] = field(default_factory=list)

    def user(self, tenant_id: str, user_id: str) -> User:
        """The user's record; with ``push_enabled_fraction`` below 1, a user without one is a
        follower who never registered: no consent, no device, no address, offline."""
        found = self._users_by_key().get((tenant_id, user_id))
        if found is not None:
            return found
        if self.spec.push_enabled_fraction < 1.0:
            return User(tenant_id, user_id, "UTC", None, None, "none", None)
        raise KeyError((tenant_id, user_id))

    def devices_of(self, tenant_id: str, user_id: str) -> list[Device]:
        return self._devices_by_user().get((tenant_id, user_id), [])

    def author(self, tenant_id: str, user_id: str) -> Author:
        for author in self.authors:
            if (author.tenant_id, author.user_id) == (tenant_id, user_id):
                return author
        raise KeyError(f"{tenant_id}/{user_id} is not an author in this population")

    def _users_by_key(self) -> dict[tuple[str, str], User]:
        cache = self.__dict__.get("_users_cache")
        if cache is None:
            cache = {(u.tenant_id, u.user_id): u for u in self.users}
            self.__dict__["_users_cache"] = cache
        return cache

    def _devices_by_user(self) -> dict[tuple[str, str], list[Device]]:
        cache = self.__dict__.get("_devices_cache")
        if cache is None:
            cache = {}
            for device in self.devices:
                cache.setdefault((device.tenant_id, device.user_id), []).append(device)
            self.__dict__["_devices_cache"] = cache
        return cache

    def to_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "started_at": self.started_at,
            "spec": asdict(self.spec),
            # vars(), not asdict(): asdict deep-copies every field, 10x slower on a big file.
            "users": [vars(u) for u in self.users],
            "devices": [vars(d) for d in self.devices],
            "authors": [vars(a) for a in self.authors],
        }

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict()))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Population:
        # A file written before the switches existed: nobody switched anything off, and its
        # spec says so (the default would claim a share that was never drawn).
        spec = {"channel_off_fraction": 0.0, **data["spec"]}
        return cls(
            seed=data["seed"],
            started_at=data["started_at"],
            spec=PopulationSpec(**spec),
            users=[_user_from_dict(u) for u in data["users"]],
            devices=[Device(**d) for d in data["devices"]],
            authors=[Author(**{**a, "followers": tuple(a["followers"])}) for a in data["authors"]],
        )

    @classmethod
    def load(cls, path: Path) -> Population:
        return cls.from_dict(json.loads(path.read_text()))


def _user_from_dict(values: dict[str, Any]) -> User:
    """A user as saved: JSON holds ``channels_off`` as a list (absent in an older file)."""
    off = values.get("channels_off")
    if off is None:
        return User(**values)
    return User(**{**values, "channels_off": tuple(off)})


def preferences_body(user: User) -> dict[str, Any]:
    """The user's preferences as the Event API takes them (the loader and every mid-run save
    send the same values, so the oracle's expectation holds). The email and SMS fields only when
    the user has them, a channel in ``channels`` only when it is switched off (false): a system
    without those channels, or a user with nothing off, sees the body it always saw."""
    prefs: dict[str, Any] = {
        "zone": user.zone,
        "quiet_hours": user.quiet_hours,
        "channels": {"push": True, **dict.fromkeys(user.channels_off, False)},
        "push_consent": user.consent,
    }
    if user.email:
        prefs["email"] = user.email
    if user.email_consent:
        prefs["email_consent"] = user.email_consent
    if user.phone:
        prefs["phone"] = user.phone
    if user.sms_consent:
        prefs["sms_consent"] = user.sms_consent
    return prefs


def phone_number(index: int) -> str:
    """The ``index``-th user's number: unique in the population, E.164 (+44 77 and nine digits,
    room for a billion users)."""
    return f"+4477{index:09d}"


def _sms_fields(
    rng: random.Random, spec: PopulationSpec, index: int
) -> tuple[str | None, dict[str, Any] | None, bool]:
    """(phone, sms_consent, sms_opted_out) of the ``index``-th user: four draws every user, so
    the stream stays aligned whatever the fractions. Of the users without SMS consent, half
    never gave it (None), half withdrew it (a record with ``revoked_at``)."""
    has_phone = rng.random() < spec.phone_fraction
    consented = rng.random() >= spec.no_sms_consent_fraction
    withdrawn = rng.random() < 0.5
    opted_out = rng.random() < spec.sms_opted_out_fraction
    if not has_phone:
        return None, None, False
    consent: dict[str, Any] | None = {
        "granted_at": "2026-01-01T00:00:00+00:00",
        "version": "2026-01",
    }
    if not consented:
        consent = {**consent, "revoked_at": "2026-06-01T00:00:00+00:00"} if withdrawn else None
    return phone_number(index), consent, opted_out


def _channels_off(rng: random.Random, spec: PopulationSpec) -> tuple[str, ...]:
    """The channels a user switched off: one draw per switchable channel every user, so the
    stream stays aligned whatever the fraction."""
    draws = [(channel, rng.random()) for channel in SWITCHABLE_CHANNELS]
    return tuple(channel for channel, draw in draws if draw < spec.channel_off_fraction)


def channel_switched_off(user: User, channel: str) -> bool:
    """The user turned ``channel`` off (``channels.<channel>`` false): nothing goes to it,
    whatever the consent."""
    return channel in user.channels_off


def bad_device_tokens(tokens: list[str], fraction: float) -> set[str]:
    """The dead APNs tokens that answer 400 BadDeviceToken: those whose SHA-256 falls in the
    first ``fraction`` of the hash space (the same tokens in every run of a seed)."""
    if fraction <= 0:
        return set()
    return {
        t for t in tokens if int(hashlib.sha256(t.encode()).hexdigest()[:8], 16) < fraction * 2**32
    }


def consent_stands(record: Any) -> bool:
    """A consent record (``{granted_at, version[, revoked_at]}``) stands: a record, not
    withdrawn. A withdrawal is ``revoked_at`` at or after ``granted_at`` (or no record at all);
    a ``revoked_at`` earlier than ``granted_at`` is a withdrawal the user took back by granting
    again, and the consent stands. A time that cannot be read (or ordered) stands for nothing."""
    if not isinstance(record, Mapping):
        return False
    revoked = record.get("revoked_at")
    if not revoked:
        return True
    try:
        return datetime.fromisoformat(revoked) < datetime.fromisoformat(record["granted_at"])
    except (KeyError, TypeError, ValueError):
        return False


def sms_consented(user: User) -> bool:
    """The user's SMS consent stands (:func:`consent_stands`)."""
    return consent_stands(user.sms_consent)


def connection_id(tenant_id: str, user_id: str) -> str:
    """The user's in-app connection id at the gateway: ``<tenant>:<user>`` (the reference's
    convention; the harness registers it for every online user)."""
    return f"{tenant_id}:{user_id}"


def _local_hms(instant: datetime, zone: str) -> str:
    return instant.astimezone(ZoneInfo(zone)).strftime("%H:%M:%S")


def _window(
    state: QuietState, start: datetime, zone: str, release_seconds: float
) -> tuple[dict[str, str] | None, float | None]:
    if state == "none":
        return None, None
    if state == "whole_run":
        begin, end = start - timedelta(hours=1), start + timedelta(hours=6)
    elif state == "ends_during_run":
        begin, end = start - timedelta(hours=2), start + timedelta(seconds=release_seconds)
    else:  # outside: a window that starts hours after the run
        begin, end = start + timedelta(hours=3), start + timedelta(hours=5)
    window = {"start": _local_hms(begin, zone), "end": _local_hms(end, zone)}
    # Wall-clock seconds only: the instant the window ends is the second it names.
    until = end.replace(microsecond=0) if state == "ends_during_run" else None
    return window, (until.timestamp() if until else None)


def _token(rng: random.Random, platform: str) -> str:
    """APNs: 64 hex digits; FCM: 22 + '_' + 140 characters of the URL-safe base64 alphabet.
    Drawn as whole random bytes: a character at a time was 85% of generating a population."""
    if platform == "apns":
        return f"{rng.getrandbits(256):064x}"
    return (
        base64.urlsafe_b64encode(rng.randbytes(17)).decode()[:22]
        + "_"
        + base64.urlsafe_b64encode(rng.randbytes(105)).decode()
    )


DEFAULT_TENANT_PREFIX = "tenant"
_RUN_TENANT = re.compile(r"tenant-[0-9a-f]{6}-[0-9]+")


def of_another_run(tenant_id: str, tenant_prefix: str) -> bool:
    """A tenant of another harness run on the same long-lived system (a run-prefixed tenant
    that is not this run's): its traffic is that run's backlog, not this run's to judge."""
    return bool(_RUN_TENANT.fullmatch(tenant_id)) and not tenant_id.startswith(f"{tenant_prefix}-")


def generate(
    seed: int,
    start: datetime,
    spec: PopulationSpec | None = None,
    tenant_prefix: str = "tenant",
    clock_offset_s: float = 0.0,
) -> Population:
    """A population whose quiet windows are placed relative to ``start`` (timezone-aware).

    ``clock_offset_s``: how far the system's clock runs ahead of real time (a scenario that
    moves it, harness/contract/clock.py). The windows are wall-clock times the *system* reads
    on its clock, so they are placed relative to ``start`` as the system sees it; every instant
    the population states (``quiet_until``, ``started_at``) stays in real time, as the
    history's are.

    Tenants are ``<tenant_prefix>-0``, ``-1``...: a run against a long-lived system gives each
    run a prefix of its own, so that what earlier runs left in it (feeds, devices, follower
    sets of the same seed's user ids) is never read as this run's."""
    if start.tzinfo is None:
        raise ValueError("start must be timezone-aware")
    spec = spec or PopulationSpec()
    needed = spec.celebrity_followers + 1
    if spec.users_per_tenant < needed:
        raise ValueError(f"users_per_tenant must be at least celebrity_followers + 1 ({needed})")
    if not 0.0 <= spec.push_enabled_fraction <= 1.0:
        raise ValueError("push_enabled_fraction must be between 0 and 1")
    rng = random.Random(seed)
    channel_rng = random.Random(f"channels:{seed}")
    sms_rng = random.Random(f"sms:{seed}")
    # A stream of its own: at 1.0 every user is drawn exactly as before the fraction existed.
    enabled_rng = random.Random(f"enabled:{seed}")
    switch_rng = random.Random(f"switches:{seed}")
    # Every user's window is one of (state, zone): computed once per pair, not per user.
    windows: dict[tuple[QuietState, str], tuple[dict[str, str] | None, float | None]] = {}
    population = Population(seed=seed, started_at=start.timestamp(), spec=spec)
    first_tenant_devices: dict[str, list[Device]] = {}
    for t in range(spec.tenants):
        tenant = f"{tenant_prefix}-{t}"
        # Both tenants use the same user ids on purpose: isolation must come from the tenant.
        user_ids = [f"u{n:06d}" for n in range(spec.users_per_tenant)]
        for user_id in user_ids:
            if enabled_rng.random() >= spec.push_enabled_fraction:
                continue
            zone = rng.choice(ZONES)
            roll = rng.random()
            edges = (
                spec.quiet_whole_run_fraction,
                spec.quiet_whole_run_fraction + spec.quiet_ends_fraction,
                spec.quiet_whole_run_fraction
                + spec.quiet_ends_fraction
                + spec.quiet_outside_fraction,
            )
            state: QuietState = (
                "whole_run"
                if roll < edges[0]
                else "ends_during_run"
                if roll < edges[1]
                else "outside"
                if roll < edges[2]
                else "none"
            )
            if (state, zone) not in windows:
                window, until = _window(
                    state, start + timedelta(seconds=clock_offset_s), zone,
                    spec.quiet_release_seconds,
                )  # fmt: skip
                real_until = None if until is None else until - clock_offset_s
                windows[state, zone] = (window, real_until)
            window, until = windows[state, zone]
            consent = (
                None
                if rng.random() < spec.no_consent_fraction
                else {"granted_at": "2026-01-01T00:00:00+00:00", "version": "2026-01"}
            )
            email = (
                f"{user_id}.{tenant}@mail.example.com"
                if channel_rng.random() < spec.email_fraction
                else None
            )
            email_consent: dict[str, Any] | None = {
                "granted_at": "2026-01-01T00:00:00+00:00",
                "version": "2026-01",
            }
            if channel_rng.random() < spec.no_email_consent_fraction:
                # As for SMS, half of those without it withdrew it (the record kept, revoked):
                # both must deny. A draw of its own, so the channel stream stays aligned.
                withdrew = random.Random(f"email-withdrawn:{seed}:{tenant}:{user_id}").random()
                email_consent = (
                    {**email_consent, "revoked_at": "2026-06-01T00:00:00+00:00"}
                    if withdrew < 0.5
                    else None
                )
            online = channel_rng.random() < spec.online_fraction
            population.users.append(
                User(
                    tenant,
                    user_id,
                    zone,
                    window,
                    consent,
                    state,
                    until,
                    email,
                    email_consent,
                    online,
                    *_sms_fields(sms_rng, spec, len(population.users)),
                    _channels_off(switch_rng, spec),
                )
            )
            if rng.random() < spec.no_device_fraction:
                continue
            count = 2 if rng.random() < spec.second_device_fraction else 1
            shared = first_tenant_devices.get(user_id, []) if t > 0 else []
            for n in range(count):
                platform = "fcm" if rng.random() < spec.fcm_fraction else "apns"
                dead = rng.random() < spec.dead_token_fraction
                token = _token(rng, platform)
                if tenant_prefix != DEFAULT_TENANT_PREFIX:
                    # A run's own tokens on a long-lived system and environment: the same seed
                    # in another run must not meet this device's state (an SNS endpoint an
                    # earlier run's dead answer turned off, a token marked dead).
                    token = _token(random.Random(f"{tenant_prefix}:{token}"), platform)
                sharing = spec.shared_token_fraction > 0 and n == 0 and shared
                if sharing and rng.random() < spec.shared_token_fraction:
                    platform, token, dead = shared[0].platform, shared[0].token, shared[0].dead
                device = Device(tenant, user_id, platform, token, dead)
                population.devices.append(device)
                if t == 0:
                    first_tenant_devices.setdefault(user_id, []).append(device)
        celebrity = user_ids[0]
        followers = rng.sample(user_ids[1:], spec.celebrity_followers)
        population.authors.append(Author(tenant, celebrity, True, tuple(sorted(followers))))
        for a in range(spec.regular_authors):
            author = user_ids[1 + a]
            pool = [u for u in user_ids if u != author]
            chosen = rng.sample(pool, min(spec.regular_followers, len(pool)))
            population.authors.append(Author(tenant, author, False, tuple(sorted(chosen))))
    return population
