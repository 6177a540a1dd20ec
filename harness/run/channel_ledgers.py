"""The email, in-app and SMS side of a run: online users and opted-out numbers in, ledgers out.

* :func:`register_online_users`: the population's online users get a live connection at the
  in-app gateway simulator (call it when the population is loaded, before events go in).
* :func:`opt_out_numbers`: the population's numbers that replied STOP before the run go on the
  SNS endpoint's opt-out list (the handset's side, which only the SMS provider sees).
* :class:`ChannelLedgers`: pulls the SES and in-app ledgers and the SNS endpoint's SMS ledger
  (``GET /_sns/sms``) into the history as kind ``channel`` rows. Not ``provider`` rows: the push
  checkers read every ``provider`` row as a push and would count these as unexpected deliveries.
  A row carries ``provider`` (``ses`` / ``inapp`` / ``sms``), ``token`` (address / connection id
  / phone number), ``tenant_id``, ``notification_id``, ``status``, ``reason``, ``delivered``,
  ``time`` (the simulator's receive time) and ``detail`` ``{"channel": "email" | "in_app" |
  "sms", "fault": ...}``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import httpx
import pandas as pd

from emulators.sns.faults import SnsControl
from harness.model.history import CHANNEL_OF_PROVIDER, History
from harness.model.population import Population, connection_id
from harness.run.provider_control import SimulatorControl

# Simulator (ledger provider) -> channel.
PART_OF_PROVIDER = {"ses": "ses", "inapp": "inapp"}
REGISTER_BATCH = 5_000
# Rows one GET /_sns/sms answers at most (the endpoint's own page limit).
SMS_PAGE = 10_000
MAX_SMS_PAGES = 10_000

DeliveryKey = tuple[str, str, str, str]  # tenant, notification, token, channel


def online_connections(population: Population) -> list[str]:
    return [connection_id(u.tenant_id, u.user_id) for u in population.users if u.online]


def register_online_users(inapp_url: str, population: Population) -> int:
    """Open a connection at the in-app simulator for every online user; returns how many."""
    ids = online_connections(population)
    with httpx.Client(base_url=inapp_url, timeout=30) as http:
        for start in range(0, len(ids), REGISTER_BATCH):
            http.post(
                "/_sim/connections", json={"connections": ids[start : start + REGISTER_BATCH]}
            ).raise_for_status()
    return len(ids)


def opt_out_numbers(sns_url: str, population: Population) -> int:
    """Put the population's opted-out numbers on the SNS endpoint's opt-out list; returns how
    many numbers that is."""
    numbers = [u.phone for u in population.users if u.phone and u.sms_opted_out]
    with SnsControl(sns_url, timeout=30) as sns:
        for start in range(0, len(numbers), REGISTER_BATCH):
            sns.opt_out(numbers[start : start + REGISTER_BATCH])
    return len(numbers)


class SmsLedger:
    """The SNS endpoint's SMS ledger, read on from where the last call stopped (the ledger
    source :class:`ChannelLedgers` polls, like a simulator's)."""

    def __init__(self, sns_url: str) -> None:
        self.http = httpx.Client(base_url=sns_url, timeout=10)
        self.next = 0

    def new_rows(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for _ in range(MAX_SMS_PAGES):
            response = self.http.get("/_sns/sms", params={"since": self.next, "limit": SMS_PAGE})
            response.raise_for_status()
            page = response.json()
            rows += page["rows"]
            self.next = page["next"]
            if len(page["rows"]) < SMS_PAGE:
                break
        return rows

    def close(self) -> None:
        self.http.close()


def append_channel_rows(history: History, rows: Iterable[dict[str, Any]]) -> int:
    """Ledger rows of the channel simulators as ``channel`` history rows; returns how many."""
    added = 0
    for row in rows:
        provider = row.get("provider")
        history.append(
            "channel",
            time=row["received_at"],
            mono=float("nan"),
            tenant_id=row.get("tenant_id"),
            notification_id=row.get("notification_id"),
            token=row.get("token"),
            provider=provider,
            status=row.get("status"),
            reason=row.get("reason"),
            delivered=row.get("delivered", row.get("status") == 200),
            retry_after=row.get("retry_after"),
            detail=json.dumps(
                {"channel": CHANNEL_OF_PROVIDER.get(str(provider)), "fault": row.get("fault")}
            ),
        )
        added += 1
    return added


class ChannelLedgers:
    """Pulls the SES and in-app ledgers and the SMS ledger into the history; ``delivered``
    holds the (tenant, notification, token, channel) keys delivered so far."""

    def __init__(self, history: History, controls: list[SimulatorControl | SmsLedger]) -> None:
        self.history = history
        self.controls = controls
        self.delivered: set[DeliveryKey] = set()
        self.rows = 0

    @classmethod
    def for_stack(
        cls, history: History, urls: dict[str, str], sms_url: str | None = None
    ) -> ChannelLedgers:
        """``urls``: simulator name (``ses``, ``inapp``) -> its URL; ``sms_url``: the SNS
        endpoint whose SMS ledger to read. The absent ones are skipped (a stack or target
        without that channel)."""
        sources: list[SimulatorControl | SmsLedger] = [
            SimulatorControl(urls[p]) for p in PART_OF_PROVIDER if p in urls
        ]
        if sms_url:
            sources.append(SmsLedger(sms_url))
        return cls(history, sources)

    def poll(self) -> int:
        added = 0
        for control in self.controls:
            rows = control.new_rows()
            added += append_channel_rows(self.history, rows)
            for row in rows:
                channel = CHANNEL_OF_PROVIDER.get(str(row.get("provider")))
                if channel and row.get("delivered", row.get("status") == 200):
                    key = (row["tenant_id"], row["notification_id"], row["token"], channel)
                    self.delivered.add(key)
        self.rows += added
        return added

    def seen(self, expected_rows: pd.DataFrame) -> int:
        """How many of the oracle's expected channel deliveries have arrived (for a wait)."""
        columns = ["tenant_id", "notification_id", "token", "channel"]
        expected = set(expected_rows[columns].itertuples(index=False, name=None))
        return len(expected & self.delivered)

    def close(self) -> None:
        for control in self.controls:
            control.close()
