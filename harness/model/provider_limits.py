"""The provider limits in force during a run, as the run stated them in its history.

A run records one ``provider_limits`` row per provider whose limits it knows, after setting
them (a scenario's ``configuration.providers``) and reading them back from the simulator, so
that a checker judges the rate against the limits *this* run had, from its own evidence, never
a default it assumes. Google's documented FCM limits ("FCM throttling and quotas"): a quota of
messages per project per minute (600,000 by default; minutes not aligned to the clock), and
per device 240 messages a minute and 5,000 an hour. A limit is ``None`` when not in force (the
simulator runs lenient) or not known.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd

KIND = "provider_limits"


@dataclass(frozen=True)
class ProviderLimits:
    provider: str
    # Messages per project (sender) per window of ``window_s``; None: no quota in force.
    project_quota: int | None = None
    # Messages per device (registration token) per minute and per hour; None: not in force.
    device_per_minute: int | None = None
    device_per_hour: int | None = None
    window_s: float = 60.0
    # The provider enforces them (a strict simulator); False: stated but not in force.
    enforced: bool = True
    # "scenario" (the run set the quota) or "provider" (the provider's own setting, read back).
    set_by: str = "provider"

    def to_detail(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_mapping(cls, values: dict[str, Any]) -> ProviderLimits:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in values.items() if k in known})


def recorded(history: pd.DataFrame) -> dict[str, ProviderLimits]:
    """The limits each provider had in the run (the last row per provider wins); empty when the
    run stated none (a history written before runs recorded them)."""
    if "kind" not in history or "detail" not in history:
        return {}
    found: dict[str, ProviderLimits] = {}
    for detail in history.loc[history["kind"] == KIND, "detail"].dropna():
        try:
            values = json.loads(str(detail))
        except ValueError:
            continue
        if isinstance(values, dict) and isinstance(values.get("provider"), str):
            limits = ProviderLimits.from_mapping(values)
            found[limits.provider] = limits
    return found


def summary(history: pd.DataFrame) -> dict[str, dict[str, Any]] | None:
    """The run summary's ``provider_limits``: per provider, the limits in force; None when the
    run recorded none."""
    limits = recorded(history)
    return {name: asdict(value) for name, value in sorted(limits.items())} or None


def sentence(limits: dict[str, dict[str, Any]] | None) -> str:
    """The report's line on the limits in force (empty when none were recorded)."""
    if not limits:
        return ""
    parts = []
    for name, values in limits.items():
        if not values.get("enforced", True):
            parts.append(f"{name.upper()} ran without its limits (lenient)")
            continue
        quota = values.get("project_quota")
        said = (
            f"{name.upper()} project quota {quota:,} messages per "
            f"{float(values.get('window_s', 60)):g} s per project"
            if quota is not None
            else f"{name.upper()} no project quota"
        )
        said += " (set by the scenario)" if values.get("set_by") == "scenario" else ""
        minute, hour = values.get("device_per_minute"), values.get("device_per_hour")
        if minute is not None or hour is not None:
            said += f", per device {minute}/min and {hour}/h"
        parts.append(said)
    return " Provider limits in force: " + "; ".join(parts) + "."
