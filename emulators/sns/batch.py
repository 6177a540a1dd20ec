"""PublishBatch's own rules, with AWS's codes and words (botocore's SNS model; the messages as
AWS answers them, recorded in LocalStack's snapshot tests).

* 1 to 10 entries (``EmptyBatchRequest``, ``TooManyEntriesInBatchRequest``);
* distinct ids (``BatchEntryIdsNotDistinct``) of at most 80 letters, digits, hyphens and
  underscores (``InvalidBatchEntryId``);
* all messages with their attributes within the topic's ``MaximumMessageSize``
  (``BatchRequestTooLong``).

Each entry is otherwise checked as a Publish is, and a malformed one fails the whole request, as
AWS does; ``Failed`` entries are those refused for a reason of the moment (here: the throttle
fault).
"""

from __future__ import annotations

import re
from typing import Any

from emulators.sns.errors import SnsError

MAX_ENTRIES = 10
_ENTRY_ID = re.compile(r"^[A-Za-z0-9_-]+$")


def check_entries(entries: list[dict[str, Any]]) -> None:
    if not entries:
        raise SnsError("EmptyBatchRequest", "The batch request doesn't contain any entries.")
    if len(entries) > MAX_ENTRIES:
        raise SnsError(
            "TooManyEntriesInBatchRequest",
            "The batch request contains more entries than permissible.",
        )
    ids = [entry.get("Id") for entry in entries]
    if len(set(ids)) != len(ids):
        raise SnsError(
            "BatchEntryIdsNotDistinct", "Two or more batch entries in the request have the same Id."
        )
    for entry_id in ids:
        text = "" if entry_id is None else str(entry_id)
        if len(text) > 80:
            raise SnsError(
                "InvalidBatchEntryId",
                f"The Id of a batch entry in the batch request is too long: {text}",
            )
        if not _ENTRY_ID.match(text):
            raise SnsError(
                "InvalidBatchEntryId",
                "The Id of a batch entry in the batch request contains an impermissible "
                f"character: {text}",
            )


def too_long() -> SnsError:
    return SnsError(
        "BatchRequestTooLong", "The length of all the messages put together is more than the limit."
    )


def throttled(entry_id: str) -> dict[str, Any]:
    return {"Id": entry_id, "Code": "Throttling", "Message": "Rate exceeded", "SenderFault": False}
