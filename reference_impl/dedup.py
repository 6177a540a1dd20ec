"""The dedup store: Redis ``SET NX`` with a short lease, then a 30-day 'sent' mark.

The seed's protocol is ``SET key 1 NX EX 2592000`` then send. Taken literally, a send that
fails with a 5xx after the key is set would suppress the retry forever, and a crash between the
SET and the send would lose the notification. So the key is first written as a lease that
expires (``pending:<owner>``); after a definite provider outcome it becomes ``sent`` for 30 days;
after a retriable failure the owner deletes it. A crash between the provider's acceptance and
the ``sent`` mark leaves a lease that expires, and the redelivered job then sends again: that is
the residual duplicate the seed means by *effectively* once.

Every Redis error propagates: the consumer fails closed (no send, no ack).
"""

from __future__ import annotations

from typing import Any, Literal

from reference_impl.dedup_key import DEDUP_TTL_SECONDS

Claim = Literal["won", "already_sent", "in_flight"]
_SENT = b"sent"
# Delete only our own lease: another consumer may hold the key by now.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class DedupStore:
    def __init__(self, redis: Any, lease_seconds: int, ttl_seconds: int = DEDUP_TTL_SECONDS):
        self.redis = redis
        self.lease_seconds = lease_seconds
        self.ttl_seconds = ttl_seconds
        self._release = redis.register_script(_RELEASE)

    def claim(self, key: str, owner: str) -> Claim:
        for _ in range(2):
            if self.redis.set(key, f"pending:{owner}", nx=True, ex=self.lease_seconds):
                return "won"
            value = self.redis.get(key)
            if value == _SENT:
                return "already_sent"
            if value is not None:
                return "in_flight"
            # The lease expired between SET and GET: try once more.
        return "in_flight"

    def mark_sent(self, key: str) -> None:
        self.redis.set(key, "sent", ex=self.ttl_seconds)

    def release(self, key: str, owner: str) -> None:
        self._release(keys=[key], args=[f"pending:{owner}"])
