"""Channel delivery (seed 000's per-channel queues): every expected email and in-app message
delivered exactly once, per channel.

Ground truth is the ``channel`` rows (the SES and in-app simulators' ledgers, pulled in by
:mod:`harness.run.channel_ledgers`); the expectation is
:func:`harness.model.oracle.expected_channel_deliveries`. Per channel, over (tenant, notification,
token): ``expected``, ``delivered`` (expected keys that arrived), ``duplicated`` (every
delivery of a key beyond its first), ``lost`` (expected keys that never arrived),
``unexpected`` (deliveries of keys the oracle did not expect: no consent, no address, offline,
another tenant's recipient). An email has no collapse id: every duplicate is visible.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from typing import Any

import pandas as pd

from harness.checkers.evidence import Evidence
from harness.checkers.registry import checker
from harness.checkers.verdict import Verdict
from harness.model.history import CHANNEL_OF_PROVIDER
from harness.model.oracle import expected_channel_deliveries

CHANNELS = ("email", "in_app")
KEY = ["tenant_id", "notification_id", "token"]
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


def check(
    expected_rows: pd.DataFrame,
    history: pd.DataFrame,
    max_lost: int = 0,
    max_duplicated: int = 0,
) -> Verdict:
    """``expected_rows``: tenant_id, notification_id, token, channel. Tolerances apply to each
    channel's figure (a scenario may accept a residual and still see it reported)."""
    expected: dict[str, set[Key]] = {c: set() for c in CHANNELS}
    for tenant, nid, token, channel in expected_rows[KEY + ["channel"]].itertuples(
        index=False, name=None
    ):
        expected.setdefault(str(channel), set()).add((str(tenant), str(nid), str(token)))
    rows = history[(history["kind"] == "channel") & (history["delivered"].fillna(False))]
    delivered: dict[str, Counter[Key]] = {c: Counter() for c in expected}
    for tenant, nid, token, provider, detail in rows[KEY + ["provider", "detail"]].itertuples(
        index=False, name=None
    ):
        channel = _channel_of(provider, detail)
        if channel is None:
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
        figures = {
            "expected": len(wanted),
            "delivered": sum(1 for k in wanted if k in got),
            "duplicated": sum(n - 1 for n in got.values()),
            "lost": len(lost_keys),
            "unexpected": sum(got[k] for k in unexpected_keys),
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
        }
    counts.update(dict(totals))
    details = {
        "channels": examples,
        "tolerance": {"max_lost": max_lost, "max_duplicated": max_duplicated},
    }
    return Verdict("channel_delivery", valid, counts, details)


@checker(
    "channel_delivery",
    summary="email and in-app deliveries effectively once, per channel, against the oracle",
    tolerances={"max_lost": 0, "max_duplicated": 0},
    # With the history on disk these kinds come as a frame (see registry.in_memory_for).
    reads=("inject", "channel"),
)
def probe(evidence: Evidence, tolerance: Mapping[str, Any]) -> Verdict:
    history = evidence.history
    expected = expected_channel_deliveries(
        evidence.population, history[history["kind"] == "inject"], evidence.policy.channels_by_kind
    )
    return check(
        expected,
        history,
        max_lost=int(tolerance["max_lost"]),
        max_duplicated=int(tolerance["max_duplicated"]),
    )
