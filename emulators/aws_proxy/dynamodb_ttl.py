"""DynamoDB Time to Live for a DynamoDB without it (dynalite answers DescribeTimeToLive with
DISABLED always and UpdateTimeToLive with UnknownOperationException): the per-table status,
pure.

Only the status is emulated (UpdateTimeToLive, DescribeTimeToLive): nothing is ever deleted
when its TTL attribute passes, and the status changes at once (AWS passes through ENABLING /
DISABLING, and refuses a second change within about an hour; neither is emulated). The checks
are AWS's: both members of ``TimeToLiveSpecification`` are required, the attribute name is 1 to
255 characters, enabling an enabled TTL is "TimeToLive is already enabled", disabling a
disabled one "TimeToLive is already disabled", and disabling names the attribute it is on.
"""

from __future__ import annotations

from typing import Any

from emulators.aws_proxy.dynamodb_streams import AwsError, validation

ATTRIBUTE_NAME_MAX = 255
SPEC_MEMBER = "timeToLiveSpecification"


def _null(member: str) -> AwsError:
    return validation(
        f"1 validation error detected: Value null at '{member}' failed to satisfy constraint: "
        "Member must not be null"
    )


def ttl_specification(value: Any) -> tuple[bool, str]:
    """``(enabled, attribute name)`` of an UpdateTimeToLive ``TimeToLiveSpecification``;
    AwsError (ValidationException) when it is not one DynamoDB accepts."""
    if value is None:
        raise _null(SPEC_MEMBER)
    if not isinstance(value, dict):
        raise validation("TimeToLiveSpecification must be an object")
    enabled, name = value.get("Enabled"), value.get("AttributeName")
    if enabled is None:
        raise _null(f"{SPEC_MEMBER}.enabled")
    if name is None:
        raise _null(f"{SPEC_MEMBER}.attributeName")
    if not isinstance(enabled, bool):
        raise validation("TimeToLiveSpecification.Enabled must be a boolean")
    if not isinstance(name, str):
        raise validation("TimeToLiveSpecification.AttributeName must be a string")
    if not 1 <= len(name) <= ATTRIBUTE_NAME_MAX:
        bound = "greater than or equal to 1" if not name else "less than or equal to 255"
        raise validation(
            f"1 validation error detected: Value '{name}' at '{SPEC_MEMBER}.attributeName' "
            f"failed to satisfy constraint: Member must have length {bound}"
        )
    return enabled, name


class TtlStore:
    """The TTL attribute of every table whose TTL is enabled; a table not here has it
    disabled."""

    def __init__(self) -> None:
        self.enabled: dict[str, str] = {}

    def update(self, table: str, spec: Any) -> dict[str, Any]:
        """UpdateTimeToLive on an existing table: its answer's body, or AwsError, with nothing
        changed."""
        enabled, name = ttl_specification(spec)
        current = self.enabled.get(table)
        if enabled and current is not None:
            raise validation("TimeToLive is already enabled")
        if not enabled:
            if current is None:
                raise validation("TimeToLive is already disabled")
            if current != name:
                raise validation(
                    "TimeToLive is active on a different AttributeName: current AttributeName "
                    f"is {current}"
                )
        if enabled:
            self.enabled[table] = name
        else:
            del self.enabled[table]
        return {"TimeToLiveSpecification": {"Enabled": enabled, "AttributeName": name}}

    def describe(self, table: str) -> dict[str, Any]:
        """DescribeTimeToLive of an existing table: its answer's body."""
        name = self.enabled.get(table)
        if name is None:
            return {"TimeToLiveDescription": {"TimeToLiveStatus": "DISABLED"}}
        return {"TimeToLiveDescription": {"TimeToLiveStatus": "ENABLED", "AttributeName": name}}

    def table_deleted(self, table: str) -> None:
        """A table made again under a deleted one's name starts with TTL disabled."""
        self.enabled.pop(table, None)
