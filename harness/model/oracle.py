"""What should have happened, from the population and the injected load alone."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pandas as pd

from harness.model.population import Population, connection_id

EXPECTED_COLUMNS = ["tenant_id", "notification_id", "token", "user_id", "quiet_until"]


@dataclass
class Expectation:
    """One row per (notification, device) that must be delivered exactly once by run end."""

    deliveries: pd.DataFrame
    suppressed: Counter[str] = field(default_factory=Counter)


def expected_deliveries(population: Population, injected: pd.DataFrame) -> Expectation:
    """``injected``: one row per accepted event with tenant_id, author_id, notification_id."""
    rows: list[tuple[str, str, str, str, float | None]] = []
    suppressed: Counter[str] = Counter()
    for event in injected.itertuples(index=False):
        author = population.author(event.tenant_id, event.author_id)
        for follower in author.followers:
            user = population.user(event.tenant_id, follower)
            devices = population.devices_of(event.tenant_id, follower)
            if not devices:
                suppressed["no_device"] += 1
                continue
            for device in devices:
                if user.consent is None:
                    suppressed["no_consent"] += 1
                elif user.quiet_state == "whole_run":
                    suppressed["quiet_hours_pending"] += 1
                elif device.dead:
                    suppressed["dead_token"] += 1
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
    return Expectation(pd.DataFrame(rows, columns=EXPECTED_COLUMNS), suppressed)


CHANNEL_EXPECTED_COLUMNS = ["tenant_id", "notification_id", "token", "channel"]


def expected_channel_deliveries(
    population: Population,
    injected: pd.DataFrame,
    channels_by_kind: Mapping[str, Sequence[str]],
) -> pd.DataFrame:
    """One row per (notification, recipient) the email and in-app channels must deliver exactly
    once: ``token`` is the address (email) or the connection id ``<tenant>:<user>`` (in-app).

    ``injected``: the accepted events; their kind in ``detail`` (history ``inject`` rows, whose
    own ``kind`` column says "inject"), else in ``kind``. A kind ``channels_by_kind`` does not
    name goes to push only. Email needs an address and an
    email consent; in-app needs the user online (connection registered with the gateway). Push
    stays with :func:`expected_deliveries`."""
    rows: list[tuple[str, str, str, str]] = []
    kind_column = "detail" if "detail" in injected.columns else "kind"
    for event in injected.itertuples(index=False):
        channels = channels_by_kind.get(str(getattr(event, kind_column)), ("push",))
        if "email" not in channels and "in_app" not in channels:
            continue
        author = population.author(event.tenant_id, event.author_id)
        for follower in author.followers:
            user = population.user(event.tenant_id, follower)
            if "email" in channels and user.email and user.email_consent is not None:
                rows.append((event.tenant_id, event.notification_id, user.email, "email"))
            if "in_app" in channels and user.online:
                token = connection_id(event.tenant_id, follower)
                rows.append((event.tenant_id, event.notification_id, token, "in_app"))
    return pd.DataFrame(rows, columns=CHANNEL_EXPECTED_COLUMNS)
