"""minifanout: a small push fan-out system, written for the harness's tests and independent of
the reference implementation.

One HTTP API process fans an event out synchronously, in the request, to the author's
followers kept in Redis: a feed entry per follower (a Redis sorted set ordered by the event's
ULID) and one push job per follower device on an SQS queue. One consumer process takes the
jobs: consent (default deny), quiet hours in the user's IANA zone (deferred by re-enqueueing
with a delay), a ``SET NX`` claim in a dedup Redis (fail closed), then APNs (HTTP/2) or FCM
HTTP v1. No Kinesis, no DynamoDB, no audit trail.

Deliberate bugs, off by default, switched on with ``--bugs``: :data:`config.BUGS`.
"""
