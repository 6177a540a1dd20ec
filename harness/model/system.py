"""What the verifier knows of a system's policies: the values its promises are judged against.

The checkers read these, never the system's own code or config class: a team's system states
them in its target file, the reference's launcher derives them from the reference's config.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.model.fcm_mapping import project_function

# Seed 000: a mention goes to push, email and in-app; every other kind to push.
DEFAULT_CHANNELS_BY_KIND: Mapping[str, tuple[str, ...]] = {
    "mention": ("push", "email", "in_app"),
}


@dataclass(frozen=True)
class SystemPolicy:
    # Which channels each event kind goes to (a kind not named goes to push only).
    channels_by_kind: Mapping[str, tuple[str, ...]] = field(
        default_factory=lambda: dict(DEFAULT_CHANNELS_BY_KIND)
    )
    # Per (user, channel) sliding window and per (device, kind, local day) cap; 0 = off.
    rate_limit_per_window: int = 0
    rate_limit_window_seconds: float = 60.0
    daily_limit_per_device_type: int = 0
    # A durable second dedup store decides while the first is out (fail_closed reads it).
    dedup_fallback: bool = False
    # The dedup store keeps its keys through a crash (MemoryDB with its transaction log); a
    # volatile one (ElastiCache) may lose them, a duplicate the design admits.
    durable_dedup_store: bool = True
    # FCM sender projects, in the order the mapping indexes them.
    fcm_projects: tuple[str, ...] = ()
    # How a user's project is chosen (harness/model/fcm_mapping.py): ``digits-mod``, an
    # expression, or ``package.module:function``. None: only stickiness is judged.
    fcm_mapping: str | None = None
    # Seed 000: a delivery's dedup key lives 30 days; the keys match this pattern (Redis
    # SCAN MATCH syntax) in the dedup store. None: the harness cannot tell them apart.
    dedup_window_seconds: float = 2_592_000.0
    # Seed 004: a job goes to its channel's dead-letter queue after this many receives.
    max_receives: int = 3
    dedup_key_pattern: str | None = "dedup:*"
    # Seed 000: inbox rows (and celebrity pointers) carry a 90-day TTL from their acceptance.
    inbox_ttl_seconds: float = 7_776_000.0
    # Seed 000: a post reaches its followers' devices within a 60 s SLA: the bound on the time
    # from an event's acceptance (or a quiet window's end) to the push that delivered it.
    delivery_bound_s: float = 60.0
    # Seed 000: cached preferences live 5 minutes at most, "only a backstop": the bound on a
    # change written straight to the preferences table while its change stream delivered nothing
    # (an invalidator-stop window; preference_changes).
    preferences_cache_ttl_s: float = 300.0
    # What each push asks of its provider (push_attributes). No seed names a header value; the
    # design's pushes are alerts a person sees ("a generic body when locked"), sent when the
    # system decides (quiet hours defer in the system, not on the device) and kept by the
    # provider for a device that is offline. These defaults say so; a target states its own,
    # null: that attribute is not judged. APNs apns-push-type; apns-priority (absent: 10);
    # FCM android.priority (absent: high for a notification message, normal for data);
    # the least time the provider may keep a push for an offline device (APNs apns-expiration
    # from its arrival, FCM android.ttl; 0 is deliver-once: stating 0 accepts it); and an
    # alert with text.
    apns_push_type: str | None = "alert"
    apns_priority: int | None = 10
    fcm_priority: str | None = "high"
    push_min_ttl_s: float | None = 1.0
    push_text_required: bool = True
    # The alert text the system makes of an event (push_attributes' wrong_text): a template
    # over the event's fields (PUSH_TEXT_FIELDS, in braces), the title and body joined by a
    # newline as the simulators record them. None: which text is not judged, only that there
    # is some. No seed names one ("a reference plus a generic body when locked").
    push_text: str | None = None

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> SystemPolicy:
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(
                f"unknown policy key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        data = dict(values)
        if "channels_by_kind" in data:
            data["channels_by_kind"] = {
                str(k): tuple(v) for k, v in dict(data["channels_by_kind"]).items()
            }
        if "fcm_projects" in data:
            data["fcm_projects"] = tuple(data["fcm_projects"])
        for key in ("delivery_bound_s", "preferences_cache_ttl_s"):
            if key in data:
                bound = data[key]
                if isinstance(bound, bool) or not isinstance(bound, int | float) or not bound > 0:
                    raise ValueError(f"{key} must be a positive number of seconds: {bound!r}")
                data[key] = float(bound)
        data.update(_push_attribute_policy(data))
        policy = cls(**data)
        # A mapping that cannot be evaluated is refused with the target file, before any load.
        project_function(policy.fcm_mapping, policy.fcm_projects or ("p",))
        return policy

    def to_dict(self) -> dict[str, Any]:
        return {
            "channels_by_kind": {k: list(v) for k, v in self.channels_by_kind.items()},
            "rate_limit_per_window": self.rate_limit_per_window,
            "rate_limit_window_seconds": self.rate_limit_window_seconds,
            "daily_limit_per_device_type": self.daily_limit_per_device_type,
            "dedup_fallback": self.dedup_fallback,
            "durable_dedup_store": self.durable_dedup_store,
            "fcm_projects": list(self.fcm_projects),
            "fcm_mapping": self.fcm_mapping,
            "dedup_window_seconds": self.dedup_window_seconds,
            "max_receives": self.max_receives,
            "dedup_key_pattern": self.dedup_key_pattern,
            "inbox_ttl_seconds": self.inbox_ttl_seconds,
            "delivery_bound_s": self.delivery_bound_s,
            "preferences_cache_ttl_s": self.preferences_cache_ttl_s,
            "apns_push_type": self.apns_push_type,
            "apns_priority": self.apns_priority,
            "fcm_priority": self.fcm_priority,
            "push_min_ttl_s": self.push_min_ttl_s,
            "push_text_required": self.push_text_required,
            "push_text": self.push_text,
        }


APNS_PRIORITIES = (1, 5, 10)
FCM_PRIORITIES = ("high", "normal")


def _push_attribute_policy(data: Mapping[str, Any]) -> dict[str, Any]:
    """The push attribute keys of ``data``, checked and normalised (ValueError naming the key)."""
    out: dict[str, Any] = {}
    if "apns_push_type" in data:
        value = data["apns_push_type"]
        if value is not None and (not isinstance(value, str) or not value):
            raise ValueError(f"apns_push_type must be an APNs push type or null: {value!r}")
        out["apns_push_type"] = value
    if "apns_priority" in data:
        value = data["apns_priority"]
        if value is not None and (isinstance(value, bool) or value not in APNS_PRIORITIES):
            raise ValueError(f"apns_priority must be one of 1, 5, 10 or null: {value!r}")
        out["apns_priority"] = None if value is None else int(value)
    if "fcm_priority" in data:
        value = data["fcm_priority"]
        if value is not None and (
            not isinstance(value, str) or value.lower() not in FCM_PRIORITIES
        ):
            raise ValueError(f"fcm_priority must be high, normal or null: {value!r}")
        out["fcm_priority"] = None if value is None else value.lower()
    if "push_min_ttl_s" in data:
        value = data["push_min_ttl_s"]
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0
        ):
            raise ValueError(f"push_min_ttl_s must be a number of seconds >= 0 or null: {value!r}")
        out["push_min_ttl_s"] = None if value is None else float(value)
    if "push_text_required" in data and not isinstance(data["push_text_required"], bool):
        raise ValueError(
            f"push_text_required must be true or false: {data['push_text_required']!r}"
        )
    if "push_text" in data:
        out["push_text"] = check_push_text(data["push_text"])
    return out


# The event's fields a push_text template may name: what the harness posted (and the id the
# system answered with).
PUSH_TEXT_FIELDS = ("tenant_id", "author_id", "kind", "object_id", "notification_id")


def check_push_text(value: Any) -> str | None:
    """``value`` as a push_text template, or ValueError saying what is wrong with it."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"push_text must be a non-empty template string or null: {value!r}")
    if "{{" in value or "}}" in value:
        raise ValueError(f"push_text cannot hold a literal brace ({{{{ or }}}}): {value!r}")
    try:
        parts = list(string.Formatter().parse(value))
    except ValueError as exc:
        raise ValueError(f"push_text is not a template: {exc}: {value!r}") from exc
    for _, name, spec, conversion in parts:
        if name is None:
            continue
        if name not in PUSH_TEXT_FIELDS or spec or conversion:
            raise ValueError(
                f"push_text names {{{name}{'!' + conversion if conversion else ''}"
                f"{':' + spec if spec else ''}}}; it may name only "
                + ", ".join("{" + f + "}" for f in PUSH_TEXT_FIELDS)
            )
    return value


def render_push_text(template: str, event: Mapping[str, Any]) -> str:
    """The text ``template`` makes of ``event`` (a mapping of PUSH_TEXT_FIELDS; a missing one is
    empty). The same rule as push_attributes' SQL (a replace per field)."""
    text = template
    for name in PUSH_TEXT_FIELDS:
        value = event.get(name)
        text = text.replace("{" + name + "}", "" if value is None else str(value))
    return text
