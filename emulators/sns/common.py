"""What the SNS model's parts share: the account, ARNs, true/false values and listing pages."""

from __future__ import annotations

import base64
import bisect
import re
from dataclasses import dataclass

from emulators.sns.errors import invalid_parameter

ACCOUNT_ID = "000000000000"
REGION = "us-east-1"
PAGE_SIZE = 100
# a queue name: 1 to 80 of [A-Za-z0-9_-], a FIFO queue's ending in ".fifo" (within the 80)
_SQS_ARN = re.compile(
    r"^arn:aws[\w-]*:sqs:([a-z0-9-]+):(\d{12}):"
    r"((?=[A-Za-z0-9_\-.]{1,80}$)[A-Za-z0-9_\-]+(?:\.fifo)?)$"
)


def sns_arn(region: str, resource: str, account: str = ACCOUNT_ID) -> str:
    return f"arn:aws:sns:{region}:{account}:{resource}"


@dataclass
class ArnParts:
    region: str
    account: str
    resource: str


def parse_sns_arn(arn: object, parameter: str) -> ArnParts:
    """The parts of an SNS ARN; InvalidParameter when it is not one."""
    if not isinstance(arn, str) or not arn:
        raise invalid_parameter(f"Invalid parameter: {parameter}")
    parts = arn.split(":", 5)
    if len(parts) != 6:
        # AWS's words (ARNs are split on ":" and need six elements)
        raise invalid_parameter(
            f"Invalid parameter: {parameter} Reason: An ARN must have at least 6 elements, "
            f"not {len(arn.split(':'))}"
        )
    if parts[0] != "arn" or parts[2] != "sns" or not parts[5]:
        raise invalid_parameter(f"Invalid parameter: {parameter} Reason: An ARN must have format")
    return ArnParts(parts[3], parts[4], parts[5])


@dataclass
class SqsTarget:
    """Where an ``sqs`` subscription delivers: the queue's ARN parts."""

    region: str
    account: str
    queue: str


def parse_sqs_arn(arn: object) -> SqsTarget:
    match = _SQS_ARN.match(arn) if isinstance(arn, str) else None
    if match is None:
        raise invalid_parameter("Invalid parameter: SQS endpoint ARN")
    return SqsTarget(match.group(1), match.group(2), match.group(3))


def bool_text(value: object, name: str) -> str:
    text = str(value).lower()
    if text not in ("true", "false"):
        raise invalid_parameter(
            f"Invalid parameter: Attributes Reason: {name} must be true or false"
        )
    return text


def encode_token(position: int) -> str:
    return base64.urlsafe_b64encode(f"p{position}".encode()).decode()


def decode_token(token: str | None) -> int:
    if not token:
        return 0
    try:
        text = base64.urlsafe_b64decode(token.encode()).decode()
        if not text.startswith("p"):
            raise ValueError(text)
        position = int(text[1:])
        if position < 0:
            raise ValueError(text)
    except (ValueError, UnicodeDecodeError):
        raise invalid_parameter("Invalid parameter: NextToken") from None
    return position


class OrderedPages:
    """Items in insertion order with stable page positions (deletions do not shift a page).

    Each item gets an increasing sequence number; a page starts at the first live sequence at
    or after the token's, found by bisection, so paging costs O(log n + page) per call.
    """

    def __init__(self) -> None:
        self._seqs: list[int] = []
        self._items: dict[int, str] = {}
        self._by_key: dict[str, int] = {}
        self._next = 1

    def add(self, key: str) -> None:
        if key in self._by_key:
            return
        seq = self._next
        self._next += 1
        self._seqs.append(seq)
        self._items[seq] = key
        self._by_key[key] = seq

    def remove(self, key: str) -> None:
        seq = self._by_key.pop(key, None)
        if seq is None:
            return
        del self._items[seq]
        if len(self._seqs) > 64 and len(self._items) * 2 < len(self._seqs):
            self._seqs = [s for s in self._seqs if s in self._items]

    def __len__(self) -> int:
        return len(self._items)

    def page(self, token: str | None, size: int = PAGE_SIZE) -> tuple[list[str], str | None]:
        start = decode_token(token)
        index = bisect.bisect_left(self._seqs, start)
        keys: list[str] = []
        while index < len(self._seqs) and len(keys) < size:
            seq = self._seqs[index]
            index += 1
            key = self._items.get(seq)
            if key is not None:
                keys.append(key)
        while index < len(self._seqs) and self._seqs[index] not in self._items:
            index += 1
        next_token = encode_token(self._seqs[index]) if index < len(self._seqs) else None
        return keys, next_token
