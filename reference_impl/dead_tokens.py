"""Recently dead tokens, shared by every poller of a consumer: threads and forked processes.

A token that answered dead is deactivated in its user's record, and every batch reads the
records afresh, so the next batch does not try it. But pollers run side by side: a batch that
read the record just before another poller's dead answer would send to the token again, after
the answer left the provider, and that send is one a dead token must never get. So each poller
also remembers the dead answers of the last :data:`REMEMBER_SECONDS` in a table shared with the
others (:class:`reference_impl.shared_deadlines.SharedDeadlines`, made before the consumer forks
its workers) and checks it right before every send. After that, the deactivated record decides
(a token registered again is tried again).

A dead answer is remembered for one registration of the device (:func:`registration_key`, the
recipient with its ``registered_at``): a device registered again after it (an app installed
again, its token valid again) is tried at once, not a minute later.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from reference_impl.shared_deadlines import SharedDeadlines

REMEMBER_SECONDS = 60.0


def registration_key(recipient: str, registered_at: str | None) -> str:
    """The key a dead answer is remembered under: this registration of the recipient."""
    return f"{recipient}@{registered_at}" if registered_at else recipient


class DeadTokens:
    """Make one before forking; every thread and forked child then shares it."""

    def __init__(
        self,
        remember_seconds: float = REMEMBER_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.remember_seconds = remember_seconds
        self.clock = clock
        self._table = SharedDeadlines(clock=clock)

    @staticmethod
    def _key(tenant_id: str, recipient: str) -> str:
        return f"{tenant_id}\x00{recipient}"

    def add(self, tenant_id: str, recipient: str) -> None:
        """Remember that this recipient's token answered dead."""
        self._table.extend(self._key(tenant_id, recipient), self.clock() + self.remember_seconds)

    def dead(self, tenant_id: str, recipient: str) -> bool:
        """Whether this recipient's token answered dead in the last ``remember_seconds``."""
        return self._table.left(self._key(tenant_id, recipient)) > 0
