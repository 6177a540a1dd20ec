"""Dead-letter redrive (seed 004): each channel queue has a dead-letter queue "with a redrive
after 3 failed receives", so a job that keeps failing neither loops forever nor waits long
before an operator sees it.

Two observations, neither from the system's own code: the redrive policy SQS states for each of
the contract's delivery queues (``queue_policy`` rows: GetQueueAttributes at the end of the
run), and, where the SQS endpoint is the harness's, every copy it handed out with its receive
count (``receive`` rows). Counts: ``queues`` read; ``no_redrive`` (no policy, or a target that
is not the contract's dead-letter queue); ``wrong_max_receives`` (a ``maxReceiveCount`` other
than the policy's ``max_receives``); ``copies_past_redrive`` (a copy handed out after more than
``max_receives`` receives: the job should have been dead-lettered instead).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pandas as pd

from harness.checkers.evidence import Evidence
from harness.checkers.registry import checker, unknown_verdict
from harness.checkers.verdict import Verdict

EXAMPLES = 5


def _details(history: pd.DataFrame, kind: str) -> list[dict[str, Any]]:
    rows = history.loc[history["kind"] == kind, "detail"]
    return [json.loads(str(d)) for d in rows]


def check(history: pd.DataFrame, max_receives: int) -> Verdict:
    policies = _details(history, "queue_policy")
    if not policies:
        return unknown_verdict("redrive", "the run read no queue's redrive policy")
    no_redrive, wrong, examples = [], [], []
    for p in policies:
        target = p.get("dead_letter_target")
        dead = p.get("dead")
        # An ARN's last part is the queue's name.
        if not target or (dead and str(target).rsplit(":", 1)[-1] != dead):
            no_redrive.append(p["queue"])
        elif int(p.get("max_receive_count") or 0) != max_receives:
            wrong.append(p["queue"])
    copies = _details(history, "receive")
    past = [c for c in copies if int(c["receive_count"]) > max_receives]
    examples = [{"queue": q, "why": "no redrive to the contract's DLQ"} for q in no_redrive]
    examples += [
        {"queue": p["queue"], "max_receive_count": p.get("max_receive_count")}
        for p in policies
        if p["queue"] in wrong
    ]
    examples += past[:EXAMPLES]
    counts = {
        "queues": len(policies),
        "no_redrive": len(no_redrive),
        "wrong_max_receives": len(wrong),
        "copies": len(copies),
        "copies_past_redrive": len(past),
    }
    valid = not no_redrive and not wrong and not past
    return Verdict(
        "redrive",
        valid,
        counts,
        {"max_receives": max_receives, "examples": examples[: 2 * EXAMPLES]},
    )


@checker(
    "redrive",
    summary="every delivery queue dead-letters a job after the design's 3 receives",
    needs=("queues",),
    reads=("queue_policy", "receive"),
)
def probe(evidence: Evidence, tolerance: Mapping[str, Any]) -> Verdict:
    return check(evidence.history, evidence.policy.max_receives)
