"""What should have happened, from the population and the injected load alone."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import pandas as pd

from harness.model.population import (
    Device,
    Population,
    User,
    channel_switched_off,
    connection_id,
    consent_stands,
    sms_consented,
)
from harness.model.timeline import Timeline

EXPECTED_COLUMNS = ["tenant_id", "notification_id", "token", "user_id", "quiet_until"]
OPTIONAL_COLUMNS = ["tenant_id", "notification_id", "token", "user_id", "why"]


def _empty(columns: list[str]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object) for c in columns})


@dataclass
class Expectation:
    """What the oracle expects of every (notification, device):

    * ``deliveries``: must be delivered exactly once by run end (after ``quiet_until`` when set);
    * ``optional``: may be delivered, at most once, or not at all: the event's acceptance is
      unknown (its request was cut off), or the recipient changed during the run and a correct
      system could have acted on either state (``why`` says which);
    * the rest must not be delivered: ``suppressed`` counts them by the oracle's reason for users
      the run did not change and events the system surely took (the audit checker cross-checks
      these), ``changed_suppressed`` for the others.
    """

    deliveries: pd.DataFrame
    suppressed: Counter[str] = field(default_factory=Counter)
    optional: pd.DataFrame = field(default_factory=lambda: _empty(OPTIONAL_COLUMNS))
    changed_suppressed: Counter[str] = field(default_factory=Counter)
    # (tenant, token) of an erased user's device registered again -> when that was sent: the
    # erasure checker judges its deliveries from then on.
    reregistered: dict[tuple[str, str], float] = field(default_factory=dict)
    # Required deliveries a stated rate limit may have withheld, moved to ``optional``
    # (harness/checkers/limited.py): ``rate_limit`` judges them (EXPECTED_COLUMNS).
    limited: pd.DataFrame = field(default_factory=lambda: _empty(EXPECTED_COLUMNS))


def push_suppressed(user: User, device: Device) -> str | None:
    """Why a push to a device of a user the run did not change must not be delivered
    (``no_consent``, ``quiet_hours_pending``: quiet all run, ``dead_token``), or None: every
    post of an author the user follows must reach it."""
    if user.consent is None:
        return "no_consent"
    if user.quiet_state == "whole_run":
        return "quiet_hours_pending"
    if device.dead:
        return "dead_token"
    return None


def required_push_recipients(
    population: Population,
) -> dict[tuple[str, str], list[tuple[str, float | None]]]:
    """Per (tenant, token): the users (with the end of their quiet window, None when not
    quiet) who must get on that device what the authors they follow post, on a run that
    changes no user (the live latency check's share of :func:`expected_deliveries`)."""
    found: dict[tuple[str, str], list[tuple[str, float | None]]] = {}
    for user in population.users:
        for device in population.devices_of(user.tenant_id, user.user_id):
            if push_suppressed(user, device) is None:
                recipients = found.setdefault((user.tenant_id, device.token), [])
                recipients.append((user.user_id, user.quiet_until))
    return found


def expected_deliveries(
    population: Population,
    injected: pd.DataFrame,
    timeline: Timeline | None = None,
    indeterminate: pd.DataFrame | None = None,
) -> Expectation:
    """``injected``: one row per accepted event with tenant_id, author_id, notification_id (and
    ``time``, the instant it was sent, when a ``timeline`` of changed users is given);
    ``indeterminate``: events whose acceptance is unknown (same columns)."""
    rows: list[tuple[str, str, str, str, float | None]] = []
    optional: list[tuple[str, str, str, str, str]] = []
    suppressed: Counter[str] = Counter()
    changed_suppressed: Counter[str] = Counter()
    # When each notification id was first accepted: one posted again with the same id after a
    # device's token came back is the notification the system already settled (the dead token
    # answered), which it may rightly dedup: optional on that device, never required.
    first_posted: dict[str, float] = (
        injected.groupby("notification_id")["time"].min().to_dict()
        if timeline is not None and timeline.reinstalls and len(injected)
        else {}
    )
    events = [(e, False) for e in injected.itertuples(index=False)]
    if indeterminate is not None:
        events += [(e, True) for e in indeterminate.itertuples(index=False)]
    for event, unknown in events:
        author = population.author(event.tenant_id, event.author_id)
        author_key = (event.tenant_id, event.author_id)
        for follower in author.followers:
            devices = population.devices_of(event.tenant_id, follower)
            if timeline is not None and timeline.changed(event.tenant_id, follower):
                states = timeline.seen_from(event.tenant_id, follower, float(event.time))
                for device in devices or [None]:
                    decisions = [
                        timeline.decision(s, author_key, device, float(event.time)) for s in states
                    ]
                    kinds = {kind for kind, _ in decisions}
                    if kinds == {"suppress"}:
                        changed_suppressed[str(decisions[-1][1])] += 1
                        continue
                    assert device is not None  # "no device" always suppresses
                    key = (event.tenant_id, event.notification_id, device.token, follower)
                    revived = timeline.revived_at(event.tenant_id, follower, device.token)
                    settled_dead = revived is not None and (
                        first_posted.get(event.notification_id, math.inf) < revived
                    )
                    if "suppress" in kinds or unknown or settled_dead:
                        optional.append((*key, "indeterminate" if unknown else "changed"))
                        continue
                    ends = {v for kind, v in decisions if kind == "defer"}
                    until = float(max(ends)) if ends else None  # type: ignore[type-var]
                    rows.append((*key, until))
                continue
            user = population.user(event.tenant_id, follower)
            # An event the system may never have taken owes no suppression a record: its
            # suppressions are not counted with the certain ones the audit is held to.
            counted = changed_suppressed if unknown else suppressed
            if not devices:
                counted["no_device"] += 1
                continue
            for device in devices:
                if (why := push_suppressed(user, device)) is not None:
                    counted[why] += 1
                elif unknown:
                    optional.append(
                        (event.tenant_id, event.notification_id, device.token, follower,
                         "indeterminate")
                    )  # fmt: skip
                else:
                    rows.append(
                        (
                            event.tenant_id,
                            event.notification_id,
                            device.token,
                            follower,
                            user.quiet_until,
                        )
                    )
    # An event posted again with the same id (an idempotent retry) is one notification: one
    # row per (notification, device), a must over a may.
    key = ["tenant_id", "notification_id", "token"]
    must = pd.DataFrame(rows, columns=EXPECTED_COLUMNS)
    if len(injected) and injected["notification_id"].duplicated().any():
        must = must.drop_duplicates(key).reset_index(drop=True)
    may = pd.DataFrame(optional, columns=OPTIONAL_COLUMNS) if optional else _empty(OPTIONAL_COLUMNS)
    if len(may):
        may = may.drop_duplicates(key)
        required = set(must[key].itertuples(index=False, name=None))
        keep = [k not in required for k in may[key].itertuples(index=False, name=None)]
        may = may[keep].reset_index(drop=True)
    return Expectation(must, suppressed, may, changed_suppressed)


CHANNEL_EXPECTED_COLUMNS = ["tenant_id", "notification_id", "token", "channel"]


def sms_expected(user: User) -> bool:
    """The user must be texted a notification of an SMS kind: a number, SMS consent, not opted
    out at the provider, and not inside a quiet window for the whole run."""
    return bool(
        user.phone
        and sms_consented(user)
        and not user.sms_opted_out
        and user.quiet_state != "whole_run"
    )


def never_texted(population: Population) -> dict[str, str]:
    """Numbers no SMS may ever reach, with why: opted out at the provider, or no SMS consent
    (never given or withdrawn; a number shared with a consenting user is left out: that user
    may be texted)."""
    allowed = {u.phone for u in population.users if u.phone and sms_consented(u)}
    why: dict[str, str] = {}
    for user in population.users:
        if not user.phone:
            continue
        if user.sms_opted_out:
            why[user.phone] = "opted_out"
        elif not sms_consented(user) and user.phone not in allowed:
            why.setdefault(user.phone, "no_sms_consent")
    return why


def _channel_rows(
    population: Population,
    injected: pd.DataFrame,
    channels_by_kind: Mapping[str, Sequence[str]],
) -> Iterator[tuple[str, str, str, str, bool]]:
    """(tenant, notification, token, channel, switched_off) of every email, in-app and SMS
    delivery the user's consent, address, connection, number and quiet hours allow;
    ``switched_off``: the user turned that channel off, so it must not happen after all."""
    kind_column = "detail" if "detail" in injected.columns else "kind"
    for event in injected.itertuples(index=False):
        channels = channels_by_kind.get(str(getattr(event, kind_column)), ("push",))
        if not set(channels) & {"email", "in_app", "sms"}:
            continue
        tenant, nid = event.tenant_id, event.notification_id
        author = population.author(tenant, event.author_id)
        for follower in author.followers:
            user = population.user(tenant, follower)
            if "email" in channels and user.email and consent_stands(user.email_consent):
                yield tenant, nid, user.email, "email", channel_switched_off(user, "email")
            if "in_app" in channels and user.online:
                token = connection_id(tenant, follower)
                yield tenant, nid, token, "in_app", channel_switched_off(user, "in_app")
            if "sms" in channels and sms_expected(user):
                assert user.phone is not None
                yield tenant, nid, user.phone, "sms", channel_switched_off(user, "sms")


def expected_channel_deliveries(
    population: Population,
    injected: pd.DataFrame,
    channels_by_kind: Mapping[str, Sequence[str]],
) -> pd.DataFrame:
    """One row per (notification, recipient) the email, in-app and SMS channels must deliver
    exactly once: ``token`` is the address (email), the connection id ``<tenant>:<user>``
    (in-app) or the phone number (SMS).

    ``injected``: the accepted events; their kind in ``detail`` (history ``inject`` rows, whose
    own ``kind`` column says "inject"), else in ``kind``. A kind ``channels_by_kind`` does not
    name goes to push only. Email needs an address and an
    email consent; in-app needs the user online (connection registered with the gateway); SMS
    needs a number, SMS consent, a number not on the provider's opt-out list, and a quiet window
    that ends during the run if there is one (SMS buzzes: quiet hours hold it, as for push).
    None goes to a channel the user switched off (``channels.<channel>`` false).
    Push stays with :func:`expected_deliveries`."""
    rows = [row[:4] for row in _channel_rows(population, injected, channels_by_kind) if not row[4]]
    return pd.DataFrame(rows, columns=CHANNEL_EXPECTED_COLUMNS)


def switched_off_deliveries(
    population: Population,
    injected: pd.DataFrame,
    channels_by_kind: Mapping[str, Sequence[str]],
) -> pd.DataFrame:
    """The (notification, recipient) rows :func:`expected_channel_deliveries` withholds only
    because the user switched that channel off: everything else allows them. Any delivery of
    one is a delivery the oracle says must not happen (counted apart, to say why), and their
    number is what a clean run judged of the switches."""
    rows = [row[:4] for row in _channel_rows(population, injected, channels_by_kind) if row[4]]
    return pd.DataFrame(rows, columns=CHANNEL_EXPECTED_COLUMNS)
