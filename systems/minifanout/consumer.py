"""The one consumer: receive push jobs, decide, claim, send, acknowledge.

Per job, in order: the device must still be active; consent (default deny); quiet hours in the
person's zone (deferred: a copy re-enqueued with a delay, then the job deleted); a Retry-After
still running for the provider (the job waits it out, invisible); the claim in the dedup store
(``SET NX`` with a lease; an error leaves the job on the queue: fail closed); the send; then
``sent`` marked and the job deleted, or the token deactivated (410 / UNREGISTERED), or the claim
released and the job left to come back (429 / 5xx / a transport error), or the job moved to the
dead-letter queue (a request the provider refuses for good). A job received more than
``max_receives`` times moves to the dead-letter queue by SQS's redrive policy.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime

from redis.exceptions import RedisError

from systems.minifanout.config import Config
from systems.minifanout.jobqueue import JobQueue, QueueError, Received
from systems.minifanout.providers import Job, Outcome, Senders
from systems.minifanout.rules import backoff_s, decide
from systems.minifanout.store import Claims, People, dedup_key

log = logging.getLogger("minifanout.consumer")


class Pauses:
    """Retry-After per scope (APNs, FCM per project): no request to it until the time passes."""

    def __init__(self) -> None:
        self._until: dict[str, float] = {}

    def pause(self, scope: str, seconds: float, now: float) -> None:
        self._until[scope] = max(self._until.get(scope, 0.0), now + seconds)

    def remaining(self, scope: str, now: float) -> float:
        return max(0.0, self._until.get(scope, 0.0) - now)


class Consumer:
    def __init__(
        self,
        config: Config,
        people: People,
        claims: Claims,
        queue: JobQueue,
        senders: Senders,
    ) -> None:
        self.config = config
        self.people, self.claims, self.queue, self.senders = people, claims, queue, senders
        self.pauses = Pauses()
        self.counts: Counter[str] = Counter()

    async def run(self, stop: asyncio.Event) -> None:
        """``workers`` receive loops until ``stop``; the jobs in hand are finished first."""
        await asyncio.gather(*(self._loop(stop) for _ in range(self.config.workers)))

    async def _loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                messages = await self.queue.receive(wait_s=1)
            except QueueError as exc:
                self.counts["receive_errors"] += 1
                log.warning("receive failed: %s", exc)
                await _sleep_unless(stop, 1.0)
                continue
            done = await asyncio.gather(*(self.handle(m) for m in messages))
            finished = [m for m, ack in zip(messages, done, strict=True) if ack]
            try:
                # One call for the batch: SQS calls are most of a job's cost.
                await self.queue.delete_batch(finished)
            except QueueError as exc:  # they come back, and their claims say "sent"
                self.counts["queue_errors"] += 1
                log.warning("deleting %d finished jobs failed: %s", len(finished), exc)

    async def handle(self, message: Received) -> bool:
        """One job; True when it is finished and is to be deleted. Every error is caught here
        so one job cannot stop the loop."""
        try:
            return await self._handle(message)
        except QueueError as exc:
            # The job's fate is SQS's now: it comes back after its visibility timeout.
            self.counts["queue_errors"] += 1
            log.warning("queue call failed for %s: %s", message.message_id, exc)
            return False

    async def _handle(self, message: Received) -> bool:
        try:
            job = Job.parse(message.body, check_id=not self.config.bug("no_id_check"))
        except (ValueError, TypeError) as exc:
            self.counts["poison"] += 1
            log.warning("malformed job %s set aside: %s", message.message_id, exc)
            await self.queue.to_dead_letter(message, f"malformed: {exc}", poison=True)
            return False
        if self.config.bug("ack_before_send"):
            await self.queue.delete(message)
        try:
            settings, device = await self.people.job_state(job.tenant, job.user, job.token)
        except RedisError as exc:
            self.counts["data_store_errors"] += 1
            log.warning("data store unavailable for %s: %s", job.id, exc)
            return await self._leave(message, backoff_s(message.receive_count))
        if device is None or not device.get("active", True):
            return self._done("device_gone", job)
        decision = decide(
            settings,
            datetime.now(UTC),
            quiet_hours_utc=self.config.bug("quiet_hours_utc"),
            consent_default_allow=self.config.bug("consent_default_allow"),
        )
        if decision.action == "deny":
            return self._done("denied", job)
        if decision.action == "defer":
            # The copy first: if deleting the original fails, both come back and the claim
            # keeps it to one send.
            later = replace(job, deferrals=job.deferrals + 1)
            await self.queue.send([later.body()], job.tenant, delay_s=decision.delay_s)
            return self._done("deferred", job, f"{decision.reason}, {decision.delay_s}s")
        scope = self.senders.scope(job)
        wait = self.pauses.remaining(scope, time.monotonic())
        if wait > 0:
            self.counts["paused"] += 1
            return await self._leave(message, wait)
        return await self._claim_and_send(message, job, scope)

    async def _claim_and_send(self, message: Received, job: Job, scope: str) -> bool:
        key = dedup_key(job.tenant, job.user, job.id, job.token)
        claimed = False
        if not self.config.bug("no_dedup"):
            try:
                state, lease_left = await self.claims.claim(key, self.config.lease_s)
            except RedisError as exc:
                self.counts["dedup_unavailable"] += 1
                if not self.config.bug("fail_open"):
                    log.warning("dedup store unavailable, %s left on the queue: %s", job.id, exc)
                    return await self._leave(message, backoff_s(message.receive_count))
                log.warning("dedup store unavailable, sending %s anyway: %s", job.id, exc)
            else:
                if state == "sent":
                    return self._done("duplicate", job)
                if state == "busy":  # another copy is being sent right now
                    self.counts["busy"] += 1
                    return await self._leave(message, lease_left + 1)
                claimed = True
        outcome = await self.senders.send(job)
        return await self._settle(message, job, key, claimed, scope, outcome)

    async def _settle(
        self, message: Received, job: Job, key: str, claimed: bool, scope: str, outcome: Outcome
    ) -> bool:
        if outcome.kind == "delivered":
            if claimed:
                try:
                    await self.claims.mark_sent(key)
                except RedisError as exc:  # the lease still guards the job for a while
                    log.warning("could not mark %s sent: %s", job.id, exc)
            return self._done("sent", job)
        if claimed and outcome.kind != "dead":
            try:
                await self.claims.release(key)
            except RedisError as exc:  # the lease ends on its own
                log.warning("could not release the claim of %s: %s", job.id, exc)
        if outcome.kind == "dead":
            if not self.config.bug("keep_dead_tokens"):
                try:
                    await self.people.deactivate(job.tenant, job.user, job.token, job.os)
                except RedisError as exc:
                    log.warning("could not deactivate a dead token of %s: %s", job.user, exc)
                    return await self._leave(message, backoff_s(message.receive_count))
            return self._done("dead_token", job, f"{outcome.status} {outcome.reason}")
        if outcome.kind == "retry":
            self.counts["retried"] += 1
            now = time.monotonic()
            if outcome.retry_after_s is not None:
                self.pauses.pause(scope, outcome.retry_after_s, now)
            wait = outcome.retry_after_s or backoff_s(message.receive_count)
            log.info(
                "%s to %s: %s %s, again in %ss", job.id, scope, outcome.status, outcome.reason, wait
            )
            return await self._leave(message, wait)
        self.counts["rejected"] += 1
        log.warning("%s rejected by %s: %s %s", job.id, scope, outcome.status, outcome.reason)
        if not self.config.bug("ack_before_send"):
            await self.queue.to_dead_letter(message, f"rejected: {outcome.status} {outcome.reason}")
        return False

    def _done(self, what: str, job: Job, detail: str = "") -> bool:
        """Counted, and to be deleted (unless the ack_before_send bug deleted it already)."""
        self.counts[what] += 1
        log.debug("%s %s/%s %s %s", what, job.tenant, job.user, job.id, detail)
        return not self.config.bug("ack_before_send")

    async def _leave(self, message: Received, seconds: float) -> bool:
        """The job comes back after ``seconds`` (unless the ack_before_send bug lost it)."""
        if not self.config.bug("ack_before_send"):
            await self.queue.hide(message, seconds)
        return False


async def _sleep_unless(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        pass
