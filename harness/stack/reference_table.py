"""Writes straight to the reference's preferences table, as a console edit, a backfill or
another service would: the Event API never hears of them, so only the table's change stream
can tell the system (seed 000: "DynamoDB Streams emits a change record on every write").

Reference-specific (the item layout of ``reference_impl/user_record.py``): a team's system
offers its own such writer through its driver, or none.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from harness.stack.supervisor import StackInfo
from reference_impl.config import Config
from reference_impl.ids import user_key


def write_preferences(info: StackInfo, tenant: str, user: str, prefs: dict[str, Any]) -> None:
    """Replace the user's stored preferences (their devices stay as they are)."""
    config = Config.load(info.reference_config)
    ddb = info.aws_client("dynamodb")
    ddb.update_item(
        TableName=config.table("preferences"),
        Key={"pk": {"S": user_key(tenant, user)}},
        UpdateExpression="SET prefs = :p, updated_at = :t",
        ExpressionAttributeValues={
            ":p": {"S": json.dumps(prefs)},
            ":t": {"S": datetime.now(UTC).isoformat()},
        },
    )
