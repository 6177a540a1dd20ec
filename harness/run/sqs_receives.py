"""Reads the SQS endpoint's log of every copy it handed out into the history.

The harness's SQS endpoint records each message a ReceiveMessage hands out, with that receive's
ApproximateReceiveCount (``GET /_sqs/receives``). That log is the ground truth of what the
consumers were given: the ``audit_per_copy`` checker holds the system's audit trail against it.

One history row per copy, kind ``receive``: ``time`` the hand-out time (epoch seconds, the
endpoint's clock, the machine's), ``detail`` JSON ``{"queue", "message_id", "receive_count"}``.
Only the log's own fields: the job body is the system's business, and the verifier never needs
to parse it.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from harness.model.history import History

PAGE = 10_000  # the endpoint's largest page
MAX_PAGES = 10_000  # bounded: 100 million copies


def receive_rows(page: dict[str, Any], queues: set[str] | None) -> list[dict[str, Any]]:
    """The history fields of one page's rows on ``queues`` (None: every queue)."""
    rows = []
    for row in page.get("rows", []):
        if queues is not None and row.get("queue") not in queues:
            continue
        detail = {
            "queue": row["queue"],
            "message_id": row["message_id"],
            "receive_count": int(row["receive_count"]),
        }
        rows.append({"time": float(row["time"]), "detail": json.dumps(detail)})
    return rows


def log_position(sqs_control_url: str) -> int:
    """Where the endpoint's receive log ends now (0 for an endpoint that cannot say)."""
    with httpx.Client(base_url=sqs_control_url.rstrip("/"), timeout=30) as http:
        response = http.get("/_sqs/receives/position")
        if response.status_code == 404:
            return 0
        response.raise_for_status()
        return int(response.json()["next"])


def collect_receives(
    sqs_control_url: str,
    history: History,
    queues: set[str] | None,
    *,
    page_size: int = PAGE,
    since: int = 0,
    not_before: float = 0.0,
) -> int:
    """Append one ``receive`` row per copy the endpoint at ``sqs_control_url`` handed out from
    ``queues`` (None: every queue), from log position ``since`` and at or after epoch
    ``not_before`` (a long-lived endpoint's log holds every earlier run's copies: never this
    run's evidence); return how many."""
    added = 0
    with httpx.Client(base_url=sqs_control_url.rstrip("/"), timeout=30) as http:
        for _ in range(MAX_PAGES):
            response = http.get("/_sqs/receives", params={"since": since, "limit": page_size})
            response.raise_for_status()
            page = response.json()
            for row in receive_rows(page, queues):
                if row["time"] >= not_before:
                    history.append("receive", **row)
                    added += 1
            following = int(page["next"])
            if following == since:
                return added
            since = following
    raise RuntimeError(f"the receive log of {sqs_control_url} did not end in {MAX_PAGES} pages")
