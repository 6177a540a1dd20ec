"""The SNS endpoint's own observations, collected into the history like the simulators' ledgers.

SNS is an observable endpoint of the contract, as the APNs and FCM simulators are: a system that
publishes pushes through SNS (the reference with ``push_transport: sns``, or a target naming
``sns_listen``) is seen at SNS's door too. Two logs of its control API:

* ``GET /_sns/ledger``: every Publish to a platform endpoint, as a ``sns_publish`` row:
  ``time`` when SNS received it, ``tenant_id``, ``notification_id`` and ``token`` from the
  payload and the endpoint, ``reason`` the SNS error the publisher got (``EndpointDisabled``,
  ``Throttling``, ``InternalError`` ...; null when SNS accepted it), ``status`` the provider's
  answer (null when nothing was sent), ``detail`` the endpoint ARN;
* ``GET /_sns/endpoint-events``: every change to a platform endpoint, as a ``sns_endpoint``
  row: ``detail`` the endpoint ARN, ``reason`` ``off`` or ``on`` (its ``Enabled`` after the
  change; ``deleted`` when it went away), ``provider`` who changed it: ``sns`` (a provider's
  dead answer turned it off) or ``api`` (a caller: a registration, a SetEndpointAttributes).
"""

from __future__ import annotations

from typing import Any

import httpx

from harness.model.history import History

PAGE = 5000


def publish_row(row: dict[str, Any]) -> dict[str, Any]:
    """A ledger row of the SNS endpoint as the fields of a ``sns_publish`` history row."""
    return {
        "time": row["received_at"],
        "tenant_id": row.get("tenant_id"),
        "notification_id": row.get("notification_id"),
        "token": row.get("token"),
        "provider": "sns",
        "project": row.get("project"),
        "status": row.get("status"),
        "reason": row.get("answer"),
        "delivered": bool(row.get("delivered")),
        "detail": row.get("endpoint_arn"),
    }


def endpoint_row(row: dict[str, Any]) -> dict[str, Any]:
    """An endpoint event of the SNS endpoint as the fields of a ``sns_endpoint`` row."""
    state = "deleted" if row.get("event") == "deleted" else "on" if row.get("enabled") else "off"
    return {
        "time": row["received_at"],
        "token": row.get("token"),
        "provider": row.get("by"),
        "reason": state,
        "detail": row.get("endpoint_arn"),
    }


class SnsObserver:
    """Pages the two logs from where it last stopped; :meth:`poll` appends what is new."""

    def __init__(self, url: str) -> None:
        self.http = httpx.Client(base_url=url.rstrip("/"), timeout=10)
        self.next = {"ledger": 0, "endpoint-events": 0}

    def _new(self, log: str) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for _ in range(1000):  # bounded: 5M rows a poll at most
            response = self.http.get(
                f"/_sns/{log}", params={"since": self.next[log], "limit": PAGE}
            )
            response.raise_for_status()
            data = response.json()
            rows += data["rows"]
            if data["next"] == self.next[log]:
                break
            self.next[log] = data["next"]
        return rows

    def skip_to_end(self) -> int:
        """Start after what the logs hold now (a long-lived endpoint's earlier runs); returns
        how many rows were skipped."""
        return len(self._new("ledger")) + len(self._new("endpoint-events"))

    def poll(self, history: History) -> int:
        added = 0
        for row in self._new("ledger"):
            history.append("sns_publish", mono=float("nan"), **publish_row(row))
            added += 1
        for row in self._new("endpoint-events"):
            history.append("sns_endpoint", mono=float("nan"), **endpoint_row(row))
            added += 1
        return added

    def close(self) -> None:
        self.http.close()
