"""The audit trail: one JSON record per delivery outcome, batched to a WORM S3 bucket.

Seed 000 (NIST SP 800-53 AU-2/AU-9): every attempt (enqueued, sent, deferred by quiet hours,
denied by consent, deduped, rate-limited, dead token, dead-lettered) is a structured record in
a bucket with Object Lock in COMPLIANCE mode, so that no one, an administrator included, can
alter or delete a record inside the retention window. The seed puts Kinesis Firehose in front
of the bucket; this sink is the same buffering done in the worker (no Firehose emulator here):

* records are buffered and written as one JSON-lines object per (tenant, hour) every
  ``flush_records`` records or ``flush_seconds`` after the oldest buffered one, and on
  :meth:`AuditSink.close` (the pollers call it on SIGTERM);
* keys: ``audit/<tenant>/<yyyy>/<mm>/<dd>/<hh>/<writer-id>-<seq>.jsonl`` (UTC hour of the
  records' ``at``): tenant-partitioned, so a tenant's trail is one prefix to export or to
  grant, and ``seq`` counts the writer's objects without gaps;
* a failed PUT is retried with the same key and body until it succeeds (an ambiguous failure
  that did land leaves two identical versions, never a gap); nothing buffered is dropped, and
  what still cannot be written at close is logged in full;
* retention is the bucket's default (see :func:`reference_impl.provision.ensure_audit_bucket`).

Not durable against kill -9 by itself: up to ``flush_seconds`` of accepted records live only in
memory (the consumer's log line has them too). With ``audit_flush_before_ack`` the handlers
store a batch's records before the batch is acknowledged, and the Lambda entry points always
do, so a crash can only take the records of the batch in flight, whose jobs come back.

Record fields: ``outcome``, ``at`` (ISO 8601, UTC), ``tenant_id``, ``notification_id``,
``recipient_user_id``; per device ``device_id`` and ``token_sha256`` (hex SHA-256 of the device
token: the token itself is a credential to the device and stays out of the trail); ``reason``
and outcome-specific fields; ``writer``.

Per copy: SQS is at-least-once, so one job can be handed out several times (a redelivery, a
visibility timeout that ran out, a lost delete). Every record a consumer writes while handling a
job it received from SQS names that copy: ``sqs_message_id`` (the message's MessageId) and
``receive_count`` (that receive's ApproximateReceiveCount), both from the Lambda event record
(``messageId``, ``attributes.ApproximateReceiveCount``). Each copy ends in exactly one outcome
per subject: per device (or per email address / phone number / in-app connection) ``sent``,
``deduped``, ``suppressed`` (an SMS number on the provider's opt-out list), ``dead_token``,
``retry``, ``rejected``, ``offline``, ``daily_limited``, ``in_flight`` (another copy holds the
dedup lease: this one comes back) or ``paused`` (a Retry-After paused the provider: not tried,
comes back); per job ``denied_consent``, ``opted_out``, ``deferred``, ``no_device``,
``no_address``, ``no_phone``, ``rate_limited``, ``digest_empty``, ``dedup_unavailable``,
``failed`` (another error: not acknowledged, comes back) or ``poison``. ``dlq``, ``digest``,
``digest_scheduled`` and ``rate_limit_unavailable`` accompany an outcome, never replace one. The
fan-out's ``enqueued`` records name no copy (they precede every copy).

Personal fields are sealed (crypto-shredding, :mod:`reference_impl.audit_keys`): a record is
stored with the fields of :data:`CLEAR_FIELDS` as they are (the outcome, when, which tenant and
notification, which copy, the provider's status and reason, ...) and every other field in
``sealed``, a list of envelopes, one per person the record names: the recipient's fields
(``recipient_user_id``, ``device_id``, ``token_sha256``, ``address_sha256``, ``phone_sha256``,
``connection_id``, whatever else a record carries) under the recipient's data key, ``author_id``
(an ``enqueued`` record's) under the author's::

    {"kid": "<key id, 32 hex>", "iv": "<base64url, 12 bytes>", "ct": "<base64url>"}

``ct`` is AES-256-GCM over the JSON object of the fields (keys sorted), with the tag appended
(as ``cryptography``'s AESGCM returns it), and as associated data the JSON array
``[tenant_id, notification_id, outcome, at, kid]`` (compact separators): an envelope opens only
in the record it was sealed in. ``{"kid": ..., "withheld": true}`` (no ``ct``): the person's key
was already destroyed when the record was written (a job still in flight when its recipient was
erased), so their fields were not stored at all. Base64url without padding keeps every
character of ``iv`` and ``ct`` one that an id may hold, so a user id can never be read, bounded,
out of a ciphertext. An auditor opens envelopes with the key table (its ``kid`` names the key);
after erasure nothing opens them.

The process log (one line per record, in clear) is the operational log, with its own short
retention; it is not the trail.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import threading
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from reference_impl.audit_keys import DataKey
from reference_impl.config import Config
from reference_impl.ids import valid_id

log = logging.getLogger("reference_impl.audit")
AUDIT_PREFIX = "audit/"
# '~' cannot appear in a valid id, so this partition never collides with a real tenant's.
UNKNOWN_TENANT = "~unknown"
MAX_BACKOFF_SECONDS = 30.0


# Fields stored in clear: none names a person. Every other field is sealed (a new field
# defaults to sealed: forgetting to list it here can hide it from the auditor, never leak it).
CLEAR_FIELDS = frozenset(
    {
        "outcome",
        "at",
        "tenant_id",
        "notification_id",
        "sqs_message_id",
        "receive_count",
        "writer",
        "status",
        "reason",
        "channel",
        "kind",
        "error",
        "until",
        "retry_in",
        "digest_window",
        "opened",
        "repeat",
        "window_start",
        "count",
    }
)
# Fields that name the author, not the recipient: sealed under the author's key.
AUTHOR_FIELDS = frozenset({"author_id"})
IV_BYTES = 12

# A person's key for sealing: the key, or the id of a key already destroyed (withheld).
Sealing = DataKey | str | None


def token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def seal_aad(record: dict[str, Any], kid: str) -> bytes:
    """The associated data of an envelope: it binds the envelope to its record."""
    fields = [record.get(f) for f in ("tenant_id", "notification_id", "outcome", "at")]
    return json.dumps([*fields, kid], separators=(",", ":"), default=str).encode()


def _envelope(fields: dict[str, Any], key: Sealing, clear: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(key, DataKey):
        return {"kid": key, "withheld": True}
    iv = os.urandom(IV_BYTES)
    plain = json.dumps(fields, sort_keys=True, default=str).encode()
    ct = AESGCM(key.key).encrypt(iv, plain, seal_aad(clear, key.kid))
    return {"kid": key.kid, "iv": b64url(iv), "ct": b64url(ct)}


def seal_record(
    record: dict[str, Any], recipient: Sealing, author: Sealing = None
) -> dict[str, Any]:
    """The stored form of ``record`` (module docstring): the clear fields, and ``sealed``, an
    envelope per person whose fields it holds (the recipient's under ``recipient``, the author's
    under ``author``). No key (None) or a destroyed one (its id): the fields are not stored."""
    clear = {k: v for k, v in record.items() if k in CLEAR_FIELDS}
    personal = {k: v for k, v in record.items() if k not in CLEAR_FIELDS and v is not None}
    theirs = {k: v for k, v in personal.items() if k not in AUTHOR_FIELDS}
    authored = {k: v for k, v in personal.items() if k in AUTHOR_FIELDS}
    envelopes = [
        _envelope(fields, key, clear)
        for fields, key in ((theirs, recipient), (authored, author))
        if fields
    ]
    if envelopes:
        clear["sealed"] = envelopes
    return clear


def sealing_for(key: DataKey | None, expected_kid: str | None) -> Sealing:
    """The key to seal a job's records with. ``expected_kid``: the key the fan-out sealed the
    job's ``enqueued`` record with (``audit_kid``); when the table now holds no key or another
    one, the recipient was erased since: withhold rather than seal under a key no erasure
    destroyed."""
    if expected_kid is None or (key is not None and key.kid == expected_kid):
        return key
    return expected_kid


def _hour_of(at: object) -> datetime:
    try:
        instant = datetime.fromisoformat(str(at))
    except ValueError:
        instant = datetime.now(UTC)
    if instant.tzinfo is None:
        instant = instant.replace(tzinfo=UTC)
    return instant.astimezone(UTC)


def object_key(tenant_id: object, at: datetime, writer_id: str, seq: int) -> str:
    """``audit/<tenant>/<yyyy>/<mm>/<dd>/<hh>/<writer>-<seq>.jsonl``, the hour in UTC."""
    tenant = tenant_id if valid_id(tenant_id) else UNKNOWN_TENANT
    hour = at.astimezone(UTC).strftime("%Y/%m/%d/%H")
    return f"{AUDIT_PREFIX}{tenant}/{hour}/{writer_id}-{seq:010d}.jsonl"


def new_writer_id(component: str) -> str:
    """Unique per process start, so two writers (or one restarted) never share a key."""
    return f"{component}-{uuid.uuid4().hex[:12]}"


class AuditSink:
    """Thread-safe: :meth:`add` only appends to a buffer; one flusher thread does the PUTs."""

    def __init__(
        self,
        s3: Any,
        bucket: str,
        writer_id: str,
        *,
        flush_records: int = 500,
        flush_seconds: float = 5.0,
    ) -> None:
        if flush_records < 1 or flush_seconds <= 0:
            raise ValueError("flush_records must be >= 1 and flush_seconds > 0")
        self.s3 = s3
        self.bucket = bucket
        self.writer_id = writer_id
        self.flush_records = flush_records
        self.flush_seconds = flush_seconds
        self.records_written = 0
        self.objects_written = 0
        self._cond = threading.Condition()
        self._buffer: list[tuple[dict[str, Any], str]] = []  # (record, its JSON line)
        self._oldest = 0.0
        self._retry_at = 0.0
        self._backoff = 0.0
        self._closed = False
        # Serialises writers (flusher, close, a Lambda's per-invocation flush): seq numbers and
        # the order of objects stay those of the buffer.
        self._write_lock = threading.Lock()
        # Objects built but not yet stored, retried verbatim (same key, same body) before any
        # newer one.
        self._unwritten: list[tuple[str, bytes, int]] = []
        self._seq = 0
        self._thread = threading.Thread(target=self._run, name=f"audit-{writer_id}", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, config: Config, component: str) -> AuditSink | None:
        """None when the config names no audit bucket (the audit stays in the log)."""
        if not config.audit_bucket:
            return None
        from reference_impl.aws import client

        return cls(
            client(config, "s3"),
            config.audit_bucket,
            new_writer_id(component),
            flush_records=config.audit_flush_records,
            flush_seconds=config.audit_flush_seconds,
        )

    # -- accepting records ------------------------------------------------------------------

    def add(self, record: dict[str, Any]) -> None:
        """Accept one record (``outcome``, ``at`` and ``tenant_id`` at least). Never blocks on
        S3. After :meth:`close` the record is written at once, so a late one is not lost."""
        missing = [f for f in ("outcome", "at", "tenant_id") if f not in record]
        if missing:
            raise ValueError(f"audit record lacks {', '.join(missing)}")
        line = json.dumps({**record, "writer": self.writer_id}, default=str, sort_keys=True)
        with self._cond:
            first = not self._buffer
            if first:
                self._oldest = time.monotonic()
            self._buffer.append((record, line))
            closed = self._closed
            # The first record starts the flusher's timer; the Nth one ends its wait.
            if first or len(self._buffer) >= self.flush_records:
                self._cond.notify_all()
        if closed:
            try:
                self.flush()
            except Exception as exc:
                log.error("audit record not written to S3 after close (%s): %s", exc, line)

    @property
    def pending(self) -> int:
        """Records accepted and not yet stored."""
        with self._cond:
            return len(self._buffer) + sum(n for _, _, n in self._unwritten)

    # -- writing ----------------------------------------------------------------------------

    def flush(self) -> int:
        """Store everything accepted so far; return the records stored by this call. Raises
        the S3 error when an object could not be stored (it stays queued for the next try)."""
        with self._write_lock:
            with self._cond:
                batch, self._buffer = self._buffer, []
                self._unwritten += self._build(batch)
            stored = 0
            try:
                while self._unwritten:
                    key, body, count = self._unwritten[0]
                    self._put(key, body)
                    with self._cond:
                        self._unwritten.pop(0)
                    stored += count
                    self.records_written += count
                    self.objects_written += 1
            except Exception:
                # Whoever flushed, the flusher thread waits out a backoff before its next try.
                with self._cond:
                    self._backoff = min(MAX_BACKOFF_SECONDS, max(0.5, self._backoff * 2))
                    self._retry_at = time.monotonic() + self._backoff
                    self._cond.notify_all()  # the flusher's wait is now until the retry
                raise
            with self._cond:
                self._backoff = self._retry_at = 0.0
            return stored

    def _put(self, key: str, body: bytes) -> None:
        self.s3.put_object(
            Bucket=self.bucket,
            Key=key,
            Body=body,
            ContentType="application/x-ndjson",
            # S3 refuses an upload into an Object Lock bucket without an integrity header
            # (Content-MD5 or an SDK checksum); MD5 works whatever the SDK's checksum setting.
            ContentMD5=base64.b64encode(hashlib.md5(body, usedforsecurity=False).digest()).decode(),
        )

    def _build(self, batch: list[tuple[dict[str, Any], str]]) -> list[tuple[str, bytes, int]]:
        groups: dict[tuple[str, datetime], list[str]] = {}
        for record, line in batch:
            tenant = record.get("tenant_id")
            tenant = tenant if valid_id(tenant) else UNKNOWN_TENANT
            hour = _hour_of(record.get("at")).replace(minute=0, second=0, microsecond=0)
            groups.setdefault((tenant, hour), []).append(line)
        objects = []
        for (tenant, hour), lines in groups.items():
            self._seq += 1
            body = ("\n".join(lines) + "\n").encode()
            objects.append((object_key(tenant, hour, self.writer_id, self._seq), body, len(lines)))
        return objects

    def _due(self, now: float) -> bool:
        if now < self._retry_at:
            return False
        if self._unwritten:
            return True
        if not self._buffer:
            return False
        return len(self._buffer) >= self.flush_records or now - self._oldest >= self.flush_seconds

    def _wait_seconds(self, now: float) -> float | None:
        if now < self._retry_at:
            return self._retry_at - now
        if self._buffer:
            return max(0.0, self._oldest + self.flush_seconds - now)
        return None  # nothing buffered: sleep until add() or close() notifies

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._due(time.monotonic()):
                    self._cond.wait(self._wait_seconds(time.monotonic()))
                if self._closed:
                    return  # close() does the last flush itself
            try:
                self.flush()
            except Exception as exc:
                log.warning(
                    "audit: S3 write failed (%s); %d record(s) kept, retrying in %.1fs",
                    exc,
                    self.pending,
                    self._backoff,
                )

    def close(self, timeout: float = 3.0) -> int:
        """Stop the flusher and store everything; return the records that could not be stored
        within ``timeout`` (0 normally). Those are logged in full, the last place they can go.
        The default fits inside the grace a stopping process gets (the harness allows 5 s
        between SIGTERM and SIGKILL), so the log gets them before the kill does."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout)
        backoff = 0.2
        while True:
            try:
                self.flush()
                return 0
            except Exception as exc:
                if time.monotonic() + backoff > deadline:
                    return self._log_lost(exc)
                log.warning("audit: S3 write failed at close (%s); retrying", exc)
                time.sleep(backoff)  # a retry's backoff: S3 said no, there is nothing to wait on
                backoff = min(2.0, backoff * 2)

    def _log_lost(self, exc: Exception) -> int:
        with self._write_lock, self._cond:
            lines = [line for _, body, _ in self._unwritten for line in body.decode().splitlines()]
            lines += [line for _, line in self._buffer]
            self._unwritten, self._buffer = [], []
        for line in lines:
            log.error("audit record not written to S3 (%s): %s", exc, line)
        return len(lines)
