"""Channel delivery (seed 000's per-channel queues): every expected email, in-app message and
SMS delivered exactly once, per channel.

Ground truth is the ``channel`` rows (the SES and in-app simulators' ledgers and the SNS
endpoint's SMS ledger, pulled in by :mod:`harness.run.channel_ledgers`); the expectation is
:func:`harness.model.oracle.expected_channel_deliveries`. Per channel, over (tenant, notification,
token): ``expected``, ``delivered`` (expected keys that arrived), ``duplicated`` (every
delivery of a key beyond its first), ``lost`` (expected keys that never arrived),
``unexpected`` (deliveries of keys the oracle did not expect: no consent, no address, offline,
inside quiet hours, a channel the user switched off, another tenant's recipient). An email or
SMS has no collapse id: every duplicate is visible.

Of the unexpected, ``to_switched_off`` counts the deliveries to a user who turned that channel
off (``channels.<channel>`` false, everything else allowing it: consent, address, connection,
number, quiet hours), to say why they failed; ``withheld_by_switch`` is how many (notification,
recipient) pairs the oracle withheld for a switch alone, what a clean run judged of them.

SMS adds what a carrier would never show: ``sms_to_opted_out`` counts every Publish to a number
on the provider's opt-out list (SNS answers it with a MessageId and texts nothing, so only its
ledger tells), ``sms_without_consent`` every SMS delivered to a number whose user never gave
SMS consent. Both must be 0. A target whose SMS ledger the harness cannot read (capability
``sms_ledger``) gets the SMS part switched off, said so in ``channels.sms``; the rest is judged.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from typing import Any

import pandas as pd

from harness.checkers.evidence import Evidence
from harness.checkers.registry import checker
from harness.checkers.verdict import SWITCHED_OFF, Verdict
from harness.model.history import CHANNEL_OF_PROVIDER
from harness.model.oracle import (
    expected_channel_deliveries,
    never_texted,
    switched_off_deliveries,
)

CHANNELS = ("email", "in_app", "sms")
KEY = ["tenant_id", "notification_id", "token"]
# The capability the SMS part needs: the SMS ledger of the SNS endpoint the system texts through.
SMS_LEDGER = "sms_ledger"
EXAMPLES = 5
Key = tuple[str, str, str]


def _channel_of(provider: Any, detail: Any) -> str | None:
    channel = CHANNEL_OF_PROVIDER.get(str(provider))
    if channel is None and isinstance(detail, str):
        try:
            parsed = json.loads(detail)
        except json.JSONDecodeError:
            return None
        channel = parsed.get("channel") if isinstance(parsed, dict) else None
    return channel


def _sms_barred(
    history: pd.DataFrame, never: Mapping[str, str]
) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """SMS publishes to numbers no SMS may reach: to opted-out numbers (any publish, delivered
    or not), and delivered to numbers without SMS consent; with a few examples."""
    counts = {"sms_to_opted_out": 0, "sms_without_consent": 0}
    examples: list[dict[str, Any]] = []
    if not never:
        return counts, examples
    rows = history[(history["kind"] == "channel") & (history["provider"] == "sms")]
    columns = [*KEY, "delivered", "reason"]
    for tenant, nid, token, delivered, reason in rows[columns].itertuples(index=False, name=None):
        why = never.get(str(token))
        if why == "opted_out":
            counts["sms_to_opted_out"] += 1
        elif why == "no_sms_consent" and not pd.isna(delivered) and bool(delivered):
            counts["sms_without_consent"] += 1
        else:
            continue
        if len(examples) < EXAMPLES:
            examples.append(
                {"tenant_id": tenant, "notification_id": nid, "token": token, "why": why,
                 "provider_reason": None if pd.isna(reason) else reason}
            )  # fmt: skip
    return counts, examples


def _keys_by_channel(rows: pd.DataFrame | None, skipped: set[str]) -> dict[str, set[Key]]:
    """(tenant, notification, token) per channel of oracle rows (every judged channel present)."""
    keys: dict[str, set[Key]] = {c: set() for c in CHANNELS if c not in skipped}
    if rows is None:
        return keys
    for tenant, nid, token, channel in rows[KEY + ["channel"]].itertuples(index=False, name=None):
        if str(channel) not in skipped:
            keys.setdefault(str(channel), set()).add((str(tenant), str(nid), str(token)))
    return keys


def check(
    expected_rows: pd.DataFrame,
    history: pd.DataFrame,
    max_lost: int = 0,
    max_duplicated: int = 0,
    never: Mapping[str, str] | None = None,
    sms_off: str | None = None,
    switched_off_rows: pd.DataFrame | None = None,
) -> Verdict:
    """``expected_rows``: tenant_id, notification_id, token, channel. Tolerances apply to each
    channel's figure (a scenario may accept a residual and still see it reported). ``never``:
    number -> why no SMS may reach it (:func:`harness.model.oracle.never_texted`); ``sms_off``:
    why the SMS part cannot be judged on this target (then it is left out, and said so);
    ``switched_off_rows``: what the oracle withheld for a channel switch alone
    (:func:`harness.model.oracle.switched_off_deliveries`), same columns as ``expected_rows``."""
    skipped = {"sms"} if sms_off else set()
    expected = _keys_by_channel(expected_rows, skipped)
    withheld = _keys_by_channel(switched_off_rows, skipped)
    rows = history[(history["kind"] == "channel") & (history["delivered"].fillna(False))]
    delivered: dict[str, Counter[Key]] = {c: Counter() for c in expected}
    for tenant, nid, token, provider, detail in rows[KEY + ["provider", "detail"]].itertuples(
        index=False, name=None
    ):
        channel = _channel_of(provider, detail)
        if channel is None or channel in skipped:
            continue
        delivered.setdefault(channel, Counter())[(str(tenant), str(nid), str(token))] += 1
        expected.setdefault(channel, set())

    counts: dict[str, int] = {}
    examples: dict[str, dict[str, list[dict[str, Any]]]] = {}
    valid = True
    totals: Counter[str] = Counter()
    for channel in sorted(expected):
        wanted, got = expected[channel], delivered.get(channel, Counter())
        lost_keys = sorted(wanted - set(got))
        duplicate_keys = sorted(k for k, n in got.items() if n > 1)
        unexpected_keys = sorted(k for k in got if k not in wanted)
        off = withheld.get(channel, set())
        switched_off_keys = [k for k in unexpected_keys if k in off]
        figures = {
            "expected": len(wanted),
            "delivered": sum(1 for k in wanted if k in got),
            "duplicated": sum(n - 1 for n in got.values()),
            "lost": len(lost_keys),
            "unexpected": sum(got[k] for k in unexpected_keys),
            "to_switched_off": sum(got[k] for k in switched_off_keys),
            "withheld_by_switch": len(off),
        }
        for name, value in figures.items():
            counts[f"{channel}_{name}"] = value
            totals[name] += value
        valid = valid and (
            figures["lost"] <= max_lost
            and figures["duplicated"] <= max_duplicated
            and figures["unexpected"] == 0
        )

        def records(keys: list[Key], with_n: bool = False, got: Counter[Key] = got) -> list:
            return [
                dict(zip(KEY, k, strict=True)) | ({"n": got[k]} if with_n else {})
                for k in keys[:EXAMPLES]
            ]

        examples[channel] = {
            "lost_examples": records(lost_keys),
            "duplicate_examples": records(duplicate_keys, with_n=True),
            "unexpected_examples": records(unexpected_keys, with_n=True),
            "to_switched_off_examples": records(switched_off_keys, with_n=True),
        }
    counts.update(dict(totals))
    channels: dict[str, Any] = dict(examples)
    if sms_off:
        channels["sms"] = {SWITCHED_OFF: sms_off}
    else:
        barred, barred_examples = _sms_barred(history, never or {})
        counts.update(barred)
        valid = valid and not any(barred.values())
        channels.setdefault("sms", {})["barred_examples"] = barred_examples
    details = {
        "channels": channels,
        "tolerance": {"max_lost": max_lost, "max_duplicated": max_duplicated},
    }
    return Verdict("channel_delivery", valid, counts, details)


@checker(
    "channel_delivery",
    summary=(
        "email, in-app and SMS deliveries effectively once, per channel, against the oracle; "
        "nothing to a channel the user switched off; "
        "no SMS to an opted-out number or without SMS consent"
    ),
    tolerances={"max_lost": 0, "max_duplicated": 0},
    # With the history on disk these kinds come as a frame (see registry.in_memory_for).
    reads=("inject", "channel"),
)
def probe(evidence: Evidence, tolerance: Mapping[str, Any]) -> Verdict:
    history = evidence.history
    injected = history[history["kind"] == "inject"]
    population, channels_by_kind = evidence.population, evidence.policy.channels_by_kind
    expected = expected_channel_deliveries(population, injected, channels_by_kind)
    capabilities = evidence.capabilities
    sms_off = (
        None
        if capabilities is None or SMS_LEDGER in capabilities
        else f"not available on this target: it has no {SMS_LEDGER}"
    )
    return check(
        expected,
        history,
        max_lost=int(tolerance["max_lost"]),
        max_duplicated=int(tolerance["max_duplicated"]),
        never=never_texted(evidence.population),
        sms_off=sms_off,
        switched_off_rows=switched_off_deliveries(population, injected, channels_by_kind),
    )
