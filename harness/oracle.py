"""What should have happened, from the population and the injected load alone."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import pandas as pd

from harness.population import Population

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
