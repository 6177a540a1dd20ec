"""The SNS endpoint's own ledgers: every push publish, every SMS, every application event.

Rows follow the provider simulators' conventions (:mod:`emulators.providers.ledger`): ``seq``
counts from 0 and equals the row's index, ``GET ...?since=N`` answers ``{"rows", "next"}``, and
the shared keys mean the same (``provider``, ``received_at``, ``tenant_id``,
``notification_id``, ``token``, ``project``, ``status``, ``reason``, ``delivered``, ``fault``,
``retry_after``, ``collapse_id``).

Push rows (``GET /_sns/ledger``) add: ``message_id``, ``endpoint_arn``, ``application_arn``,
``platform`` (APNS / APNS_SANDBOX / GCM), ``outcome`` (see :mod:`emulators.sns.messages`:
delivered, token_invalid, throttled, provider_error, rejected, unreachable, endpoint_disabled,
sns_throttled, not_configured), ``answer`` (the SNS error code the publisher got, null for a
MessageId), ``endpoint_disabled`` (this publish turned the endpoint off). ``status`` / ``reason``
are the provider's (null when nothing was sent); ``delivered`` is the provider's 200.

SMS rows (``GET /_sns/sms``): ``provider`` "sms", ``token`` the phone number, ``status`` 200 and
``delivered`` true when handed to the (simulated) carrier, 400 / ``OPTED_OUT`` and false for an
opted-out number, plus ``message_id``, ``message``, ``sender_id``, ``sms_type``,
``origination_number``, ``max_price``, ``encoding``, ``parts``, ``answer``.
"""

from __future__ import annotations

import time
from typing import Any

COMMON_KEYS = (
    "provider",
    "tenant_id",
    "notification_id",
    "token",
    "project",
    "status",
    "reason",
    "apns_id",
    "delivered",
    "fault",
    "retry_after",
    "collapse_id",
)


class RowLog:
    """Append-only rows (until :meth:`reset`); single event loop, so no lock."""

    def __init__(self) -> None:
        self._rows: list[dict[str, Any]] = []

    def append(self, **fields: Any) -> dict[str, Any]:
        row: dict[str, Any] = {"seq": len(self._rows), "received_at": time.time()}
        for key in COMMON_KEYS:
            row[key] = None
        row.update(fields)
        self._rows.append(row)
        return row

    def snapshot(
        self, since: int = 0, limit: int | None = None
    ) -> tuple[list[dict[str, Any]], int]:
        """Rows with ``seq >= since`` (at most ``limit``) and the ``seq`` after the last one."""
        if since < 0:
            raise ValueError("since must be >= 0")
        end = len(self._rows) if limit is None else min(len(self._rows), since + limit)
        rows = [dict(r) for r in self._rows[since:end]]
        return rows, since + len(rows) if since <= len(self._rows) else len(self._rows)

    def reset(self) -> None:
        self._rows.clear()

    def __len__(self) -> int:
        return len(self._rows)
