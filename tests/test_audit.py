"""The audit trail: the batching sink, the WORM bucket (on the stack's moto S3), the collector
and the ``audit_complete`` checker, then the whole path on a stack of its own."""

from __future__ import annotations

import json
import random
import re
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import quote

import boto3
import httpx
import pandas as pd
import pytest
from botocore.config import Config as BotoConfig
from botocore.exceptions import ClientError, EndpointConnectionError
from engines import engine  # noqa: F401 - the fixture, pandas and DuckDB
from helpers import TenantClient, apns_token, audit_lines, fcm_token
from ulid import ULID

from emulators.ports import free_port
from harness.checkers import audit_complete, audit_outcomes
from harness.checkers.audit_personal import readable_personal_ids
from harness.checkers.store import HistoryStore
from harness.load.loader import load_population, post_event
from harness.model.history import History
from harness.model.oracle import expected_deliveries
from harness.model.population import Author, Device, Population, PopulationSpec, User, generate
from harness.run.audit_trail import audit_keys_by_kid, audit_versions, open_record
from harness.run.provider_control import SimulatorControl
from harness.run.runner import Collector, wait_for_outcome
from harness.stack.supervisor import Stack, wait_until
from reference_impl.audit import AuditSink, object_key, seal_record, sealing_for, token_sha256
from reference_impl.audit_keys import AuditKeys, DataKey
from reference_impl.aws import client
from reference_impl.config import Config, ConfigError
from reference_impl.erasure import erase_user
from reference_impl.provision import ensure_audit_bucket
from reference_impl.push_consumer import PushConsumer
from reference_impl.redis_store import connect_redis

KEY = re.compile(
    r"^audit/(?P<tenant>[A-Za-z0-9_.\-]+|~unknown)/\d{4}/\d{2}/\d{2}/\d{2}/"
    r"(?P<writer>[a-z\-]+-[0-9a-f]{12})-(?P<seq>\d{10})\.jsonl$"
)
AT = datetime(2026, 11, 22, 10, 15, tzinfo=UTC)


# -- the sink, against the stack's real moto server -------------------------------------------


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # Records reach S3 only by the flush on SIGTERM (no count or timer fires during a test):
    # the end-to-end test proves that a stopping worker loses nothing it accepted.
    overrides = {
        "audit_flush_records": 100_000,
        "audit_flush_seconds": 600,
        "celebrity_threshold": 5,
        # Straight to the providers: a 'sent' record then always stands for a provider's
        # answer (through SNS it means SNS accepted the publish; the scenarios run that).
        "push_transport": "direct",
    }
    with Stack(tmp_path_factory.mktemp("audit-stack"), reference_overrides=overrides) as running:
        yield running


@pytest.fixture
def s3(audited: Stack):
    return client(Config.load(audited.info.reference_config), "s3")


@pytest.fixture
def bucket(s3) -> str:
    name = f"audit-test-{uuid.uuid4().hex[:12]}"
    ensure_audit_bucket(s3, name, retention_days=1, region="us-east-1")
    return name


def _record(tenant: str = "acme", at: datetime = AT, **extra: object) -> dict[str, object]:
    return {
        "outcome": "sent",
        "at": at.isoformat(),
        "tenant_id": tenant,
        "notification_id": "01JD5V3KX9B9Q0ZC4S6Y2M8N7P",
        "recipient_user_id": "u1",
        **extra,
    }


def _objects(s3, bucket: str) -> dict[str, list[dict[str, object]]]:
    listed = s3.list_objects_v2(Bucket=bucket).get("Contents", [])
    return {
        o["Key"]: [
            json.loads(line)
            for line in s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read().splitlines()
        ]
        for o in listed
    }


def test_sink_writes_a_batch_at_flush_records_and_the_rest_on_close(s3, bucket):
    sink = AuditSink(s3, bucket, "push-consumer-0123456789ab", flush_records=3, flush_seconds=600)
    for n in range(3):
        sink.add(_record(n=n))
    wait_until(lambda: sink.objects_written == 1, 10, "the first batch of three")
    sink.add(_record(n=3))
    assert sink.pending == 1  # below the count, long before the timer: held
    assert sink.close() == 0
    objects = _objects(s3, bucket)
    assert [[r["n"] for r in records] for records in objects.values()] == [[0, 1, 2], [3]]
    assert sink.records_written == 4 and sink.pending == 0
    # A record from a poller that outlived the close is stored at once, not dropped.
    sink.add(_record(n=4))
    assert len(_objects(s3, bucket)) == 3


def test_sink_writes_after_flush_seconds_without_reaching_the_count(s3, bucket):
    sink = AuditSink(
        s3, bucket, "fanout-worker-0123456789ab", flush_records=1000, flush_seconds=0.3
    )
    added = time.monotonic()
    sink.add(_record())
    sink.add(_record())
    wait_until(lambda: sink.records_written == 2, 10, "the timer's flush")
    assert time.monotonic() - added >= 0.3
    assert sink.objects_written == 1
    sink.close()


def test_keys_are_tenant_and_hour_partitioned_with_gapless_writer_sequence(s3, bucket):
    writer = "push-consumer-abcdefabcdef"
    sink = AuditSink(s3, bucket, writer, flush_records=1000, flush_seconds=600)
    later = AT + timedelta(hours=1)
    for record in (
        _record("acme"),
        _record("globex"),
        _record("acme", later),
        _record("acme"),
        _record("bad#tenant"),  # not a valid id: kept, under a partition no tenant can own
    ):
        sink.add(record)
    sink.close()
    objects = _objects(s3, bucket)
    assert sorted(objects) == sorted(
        [
            f"audit/acme/2026/11/22/10/{writer}-0000000001.jsonl",
            f"audit/globex/2026/11/22/10/{writer}-0000000002.jsonl",
            f"audit/acme/2026/11/22/11/{writer}-0000000003.jsonl",
            f"audit/~unknown/2026/11/22/10/{writer}-0000000004.jsonl",
        ]
    )
    assert all(KEY.match(key) for key in objects)
    assert len(objects[f"audit/acme/2026/11/22/10/{writer}-0000000001.jsonl"]) == 2
    for key, records in objects.items():
        tenant = KEY.match(key)["tenant"]
        assert all(r["writer"] == writer for r in records)
        assert all(r["tenant_id"] == tenant or tenant == "~unknown" for r in records)
    assert object_key("acme", later, writer, 7).endswith(
        "/2026/11/22/11/" + writer + "-0000000007.jsonl"
    )


def test_a_failed_put_keeps_the_records_and_retries_the_same_key(s3, bucket):
    unreachable = boto3.session.Session().client(
        "s3",
        endpoint_url=f"http://127.0.0.1:{free_port()}",  # nothing listens there
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=BotoConfig(retries={"max_attempts": 1}, s3={"addressing_style": "path"}),
    )
    writer = "push-consumer-000000000000"
    sink = AuditSink(unreachable, bucket, writer, flush_records=1000, flush_seconds=600)
    sink.add(_record())
    with pytest.raises(EndpointConnectionError):
        sink.flush()
    assert sink.pending == 1  # kept, not dropped
    sink.s3 = s3  # S3 is back
    wait_until(lambda: sink.records_written == 1, 10, "the flusher's retry after its backoff")
    assert list(_objects(s3, bucket)) == [f"audit/acme/2026/11/22/10/{writer}-0000000001.jsonl"]
    assert sink.close() == 0


def test_config_refuses_bad_audit_settings():
    for bad in (
        {"audit_flush_records": 0},
        {"audit_flush_seconds": 0},
        {"audit_retention_days": 0},
        {"audit_flush_records": True},
    ):
        with pytest.raises(ConfigError):
            Config.from_mapping(bad)
    assert Config().audit_bucket is None  # off unless named: the audit stays in the log


# -- Object Lock in COMPLIANCE mode -----------------------------------------------------------


def _one_version(s3, bucket: str) -> tuple[str, str]:
    sink = AuditSink(s3, bucket, "push-consumer-111111111111", flush_records=1, flush_seconds=600)
    sink.add(_record())
    sink.close()
    version = s3.list_object_versions(Bucket=bucket)["Versions"][0]
    return version["Key"], version["VersionId"]


def test_put_object_takes_the_default_compliance_retention(s3, bucket):
    config = s3.get_object_lock_configuration(Bucket=bucket)["ObjectLockConfiguration"]
    assert config["ObjectLockEnabled"] == "Enabled"
    assert config["Rule"]["DefaultRetention"]["Mode"] == "COMPLIANCE"
    assert s3.get_bucket_versioning(Bucket=bucket)["Status"] == "Enabled"
    key, version = _one_version(s3, bucket)
    head = s3.head_object(Bucket=bucket, Key=key, VersionId=version)
    assert head["ObjectLockMode"] == "COMPLIANCE"
    until = head["ObjectLockRetainUntilDate"].astimezone(UTC)
    assert timedelta(hours=23) < until - datetime.now(UTC) <= timedelta(days=1, minutes=1)


def test_deleting_a_version_inside_retention_is_denied_even_with_bypass(s3, bucket):
    key, version = _one_version(s3, bucket)
    for bypass in (False, True):
        with pytest.raises(ClientError) as denied:
            s3.delete_object(
                Bucket=bucket, Key=key, VersionId=version, BypassGovernanceRetention=bypass
            )
        assert denied.value.response["Error"]["Code"] == "AccessDenied"
    batch = s3.delete_objects(
        Bucket=bucket, Delete={"Objects": [{"Key": key, "VersionId": version}]}
    )
    assert [e["Code"] for e in batch.get("Errors", [])] == ["AccessDenied"]
    # A plain delete only stacks a delete marker on top: the record is still there, and the
    # collector (which reads every version) still reads it.
    assert s3.delete_object(Bucket=bucket, Key=key)["DeleteMarker"] is True
    assert s3.get_object(Bucket=bucket, Key=key, VersionId=version)["Body"].read()
    assert [(k, v) for k, v, _ in audit_versions(s3, bucket)] == [(key, version)]


def test_compliance_retention_cannot_be_shortened(s3, bucket):
    key, version = _one_version(s3, bucket)
    try:
        s3.put_object_retention(
            Bucket=bucket,
            Key=key,
            VersionId=version,
            Retention={"Mode": "COMPLIANCE", "RetainUntilDate": datetime(2000, 1, 1, tzinfo=UTC)},
        )
    except ClientError as exc:
        assert exc.response["Error"]["Code"] == "AccessDenied"
        return
    try:
        s3.delete_object(Bucket=bucket, Key=key, VersionId=version)
        then = "DeleteObject of that version then succeeded"
    except ClientError as exc:
        then = f"DeleteObject of that version was still refused ({exc.response['Error']['Code']})"
    pytest.skip(
        "moto does not enforce it: PutObjectRetention shortened a COMPLIANCE retention to a "
        f"past date and {then}; AWS S3 refuses the shortening with AccessDenied"
    )


def test_versioning_cannot_be_suspended_on_a_locked_bucket(s3, bucket):
    try:
        s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Suspended"})
    except ClientError as exc:
        assert exc.response["Error"]["Code"] == "InvalidBucketState"
        return
    pytest.skip(
        "moto does not enforce it: PutBucketVersioning suspended versioning on an Object Lock "
        "bucket; AWS S3 answers InvalidBucketState"
    )


# -- the checker on synthetic histories -------------------------------------------------------

T = "t1"
CONSENT = {"granted_at": "2026-01-01T00:00:00+00:00", "version": "1"}
LIVE, DEAD, QUIET, DENIED = "tok-live", "tok-dead", "tok-quiet", "tok-denied"


def _population() -> Population:
    users = [
        User(T, "live", "UTC", None, CONSENT, "none", None),
        User(T, "dead", "UTC", None, CONSENT, "none", None),
        User(T, "quiet", "UTC", {"start": "00:00", "end": "23:59"}, CONSENT, "whole_run", None),
        User(T, "denied", "UTC", None, None, "none", None),
    ]
    devices = [
        Device(T, "live", "fcm", LIVE, False),
        Device(T, "dead", "apns", DEAD, True),
        Device(T, "quiet", "fcm", QUIET, False),
        Device(T, "denied", "fcm", DENIED, False),
    ]
    followers = ("dead", "denied", "live", "quiet")
    return Population(0, 0.0, PopulationSpec(), users, devices, [Author(T, "a", False, followers)])


def _audit(history: History, outcome: str, user: str, token: str | None = None) -> None:
    detail: dict[str, object] = {"recipient_user_id": user}
    if token is not None:
        detail["token_sha256"] = token_sha256(token)
    history.append(
        "audit", tenant_id=T, notification_id="n1", reason=outcome, detail=json.dumps(detail)
    )


def _history(skip: tuple[str, str] | None = None, dlq: bool = False) -> pd.DataFrame:
    """A run of one notification in which every outcome is audited, except ``skip``
    (outcome, user)."""
    history = History()
    history.append("inject", tenant_id=T, author_id="a", notification_id="n1", detail="post")
    history.append(
        "provider", tenant_id=T, notification_id="n1", token=LIVE, status=200, delivered=True
    )
    history.append(
        "provider", tenant_id=T, notification_id="n1", token=DEAD, status=410, delivered=False
    )
    records = [("enqueued", u, None) for u in ("live", "dead", "quiet", "denied")] + [
        ("sent", "live", LIVE),
        ("dead_token", "dead", DEAD),
        ("deferred", "quiet", None),
        ("denied_consent", "denied", None),
    ]
    for outcome, user, token in records:
        if (outcome, user) != skip:
            _audit(history, outcome, user, token)
    if dlq:
        history.append(
            "dlq",
            tenant_id=T,
            notification_id="n1",
            detail=json.dumps({"queue": "fanout-push-dlq", "recipient_user_id": "live"}),
        )
    return history.frame()


def _check(history: pd.DataFrame, **tolerance: int) -> audit_complete.Verdict:
    population = _population()
    expectation = expected_deliveries(population, history[history["kind"] == "inject"])
    return audit_complete.check(expectation, history, population, **tolerance)


@pytest.mark.usefixtures("engine")
def test_checker_passes_a_complete_trail():
    verdict = _check(_history())
    assert verdict.valid, verdict
    assert verdict.counts["deliveries"] == verdict.counts["audited_sends"] == 1
    assert verdict.counts["suppressions"] == 3
    assert verdict.counts["unaudited_suppressions"] == 0
    assert verdict.counts["jobs"] == 4 and verdict.counts["unaudited_enqueues"] == 0
    assert verdict.counts["audit_records"] == 8


@pytest.mark.parametrize(
    ("skip", "count"),
    [
        (("sent", "live"), "unaudited_sends"),
        (("denied_consent", "denied"), "unaudited_no_consent"),
        (("deferred", "quiet"), "unaudited_quiet_hours_pending"),
        (("dead_token", "dead"), "unaudited_dead_token"),
        (("enqueued", "quiet"), "unaudited_enqueues"),
    ],
)
@pytest.mark.usefixtures("engine")
def test_checker_fails_a_missing_record(skip, count):
    verdict = _check(_history(skip=skip))
    assert not verdict.valid
    assert verdict.counts[count] == 1
    assert verdict.details["examples"]


@pytest.mark.usefixtures("engine")
def test_checker_matches_the_device_not_just_the_notification():
    history = _history(skip=("sent", "live"))
    wrong = History()
    wrong.append(
        "audit",
        tenant_id=T,
        notification_id="n1",
        reason="sent",
        detail=json.dumps({"recipient_user_id": "live", "token_sha256": token_sha256("other")}),
    )
    verdict = _check(pd.concat([history, wrong.frame()], ignore_index=True))
    assert not verdict.valid and verdict.counts["unaudited_sends"] == 1


@pytest.mark.usefixtures("engine")
def test_an_email_record_does_not_stand_in_for_the_push_job():
    history = _history(skip=("denied_consent", "denied"))
    email = History()
    email.append(
        "audit",
        tenant_id=T,
        notification_id="n1",
        reason="denied_consent",
        detail=json.dumps({"recipient_user_id": "denied", "channel": "email"}),
    )
    verdict = _check(pd.concat([history, email.frame()], ignore_index=True))
    assert not verdict.valid and verdict.counts["unaudited_no_consent"] == 1


@pytest.mark.usefixtures("engine")
def test_checker_tolerates_sent_records_lost_in_a_crash_only_when_told_and_only_those():
    """kill -9 loses the sink's buffer: the redelivered job is audited 'deduped' instead."""
    history = _history(skip=("sent", "live"))
    later = History()
    later.append(
        "audit",
        tenant_id=T,
        notification_id="n1",
        reason="deduped",
        detail=json.dumps({"recipient_user_id": "live", "token_sha256": token_sha256(LIVE)}),
    )
    crashed = pd.concat([history, later.frame()], ignore_index=True)
    verdict = _check(crashed)
    assert not verdict.valid
    assert verdict.counts["unaudited_sends"] == verdict.counts["sent_records_lost"] == 1
    assert _check(crashed, max_lost_sent_records=1).valid
    assert not _check(history, max_lost_sent_records=1).valid  # no record at all: never


@pytest.mark.usefixtures("engine")
def test_checker_wants_a_record_for_a_dead_lettered_job_unless_tolerated():
    history = _history(skip=("sent", "live"), dlq=True)
    history = history[~((history["kind"] == "provider") & (history["token"] == LIVE))]
    verdict = _check(history)
    assert not verdict.valid and verdict.counts["unaudited_dlq"] == 1
    assert _check(history, max_unaudited_dlq=1).valid
    extra = History()
    extra.append(
        "audit",
        tenant_id=T,
        notification_id="n1",
        reason="dlq",
        detail=json.dumps({"recipient_user_id": "live"}),
    )
    assert _check(pd.concat([history, extra.frame()], ignore_index=True)).valid


# -- end to end on the stack ------------------------------------------------------------------


@pytest.mark.integration
def test_a_deactivated_device_is_audited_as_a_dead_token_for_later_notifications(audited):
    t = TenantClient(audited)
    dead = apns_token(1, t.tenant)
    t.user("d1", devices=[("apns", dead)])
    t.apns.unregister([dead])
    t.follow("dt-author", ["d1"])
    first = t.post("dt-author")
    assert [r["status"] for r in t.wait_rows(first, 1)] == [410]
    second = t.post("dt-author")

    def outcome_of(nid: str) -> list[tuple[str, str | None, str | None]]:
        return [
            (r["audit"], r.get("reason"), r.get("token_sha256"))
            for r in audit_lines(audited, "push-consumer")
            if r["notification_id"] == nid and r["audit"] == "dead_token"
        ]

    wait_until(lambda: outcome_of(second), 20, "the second notification's audit")
    assert outcome_of(first) == [("dead_token", "Unregistered", token_sha256(dead))]
    assert outcome_of(second) == [("dead_token", "deactivated", token_sha256(dead))]
    assert t.rows_for(second) == []  # not tried again


@pytest.mark.integration
def test_flush_before_ack_stores_the_batch_trail_before_the_handler_returns(audited, s3, bucket):
    """With ``audit_flush_before_ack`` a kill -9 right after the acknowledgement loses nothing:
    the records are in S3 before the handler hands the batch back for deletion."""
    values = json.loads(Path(audited.info.reference_config).read_text())
    config = Config.from_mapping({**values, "audit_bucket": bucket, "audit_flush_before_ack": True})
    t = TenantClient(audited)
    t.user("nc", consent=False, devices=[("fcm", fcm_token(1, t.tenant))])
    job = {
        "tenant_id": t.tenant,
        "notification_id": str(ULID()),
        "recipient_user_id": "nc",
        "author_id": "a",
        "kind": "post",
    }
    record = {
        "messageId": "m1",
        "receiptHandle": "r1",
        "body": json.dumps(job),
        "attributes": {"ApproximateReceiveCount": "1"},
        "messageAttributes": {"tenant_id": {"stringValue": t.tenant, "dataType": "String"}},
    }
    consumer = PushConsumer(config)
    try:
        assert consumer({"Records": [record]}, None) == {"batchItemFailures": []}
        assert consumer.audit_sink.pending == 0  # stored, not merely buffered
        (records,) = _objects(s3, bucket).values()
        assert [(r["outcome"], r["notification_id"]) for r in records] == [
            ("denied_consent", job["notification_id"])
        ]
    finally:
        consumer.apns.close()
        consumer.fcm.close()
        consumer.audit_sink.close()


SPEC = PopulationSpec(
    tenants=2,
    users_per_tenant=14,
    celebrity_followers=8,  # above the module stack's threshold of 5: the pointer tier
    regular_authors=1,
    regular_followers=4,
    dead_token_fraction=0.2,
    no_consent_fraction=0.15,
    no_device_fraction=0.1,
    quiet_whole_run_fraction=0.15,
    quiet_ends_fraction=0.0,  # nothing to wait for: the test stays short
    quiet_outside_fraction=0.3,
)
REASONS = ("no_consent", "quiet_hours_pending", "dead_token", "no_device")


def _covering_population(start: datetime) -> Population:
    """The first seed whose population meets every kind of suppression."""
    for seed in range(200):
        population = generate(seed, start, SPEC)
        posts = pd.DataFrame(
            [
                {"tenant_id": a.tenant_id, "author_id": a.user_id, "notification_id": str(n)}
                for n, a in enumerate(population.authors)
            ]
        )
        suppressed = expected_deliveries(population, posts).suppressed
        if all(suppressed[r] > 0 for r in REASONS):
            return population
    raise AssertionError("no seed below 200 covers every suppression")


@pytest.mark.integration
def test_every_outcome_of_a_run_is_in_the_worm_trail(audited):
    info = audited.info
    population = _covering_population(datetime.now(UTC))
    apns, fcm = SimulatorControl(info.url("apns"), info.tls_ca), SimulatorControl(info.url("fcm"))
    apns.unregister([d.token for d in population.devices if d.dead and d.platform == "apns"])
    fcm.unregister([d.token for d in population.devices if d.dead and d.platform == "fcm"])
    load_population(info.url("event-api"), population)
    history = History()
    with httpx.Client(base_url=info.url("event-api"), timeout=10) as http:
        for author in population.authors:
            post_event(http, history, author.tenant_id, author.user_id, "post", "o1")
    expectation = expected_deliveries(population, history.frame().query("kind == 'inject'"))
    expected = set(
        expectation.deliveries[["tenant_id", "notification_id", "token"]].itertuples(
            index=False, name=None
        )
    )
    collector = Collector(history, [apns, fcm])
    outcome = wait_for_outcome(collector, expected, info, time.monotonic() + 60, lambda *_: None)
    assert outcome == "complete"

    # Nothing reached S3 yet (no count or timer fires): the SIGTERM flush must store it all.
    s3 = client(Config.load(info.reference_config), "s3")
    assert audit_versions(s3, "fanout-audit") == []
    # None killed: a SIGKILL after the grace would lose the buffer this test is about.
    assert audited.stop_parts(["fanout-worker", "push-consumer"]) == []
    assert _collect(info, history) > 0

    frame = history.frame()
    verdict = audit_complete.check(expectation, frame, population)
    # As a string: pytest shortens a dict message, and the examples say what went missing.
    assert verdict.valid, json.dumps(verdict.to_dict(), default=str)
    assert verdict.counts["audited_sends"] == verdict.counts["deliveries"] == len(expected)
    assert verdict.counts["suppressions"] == sum(expectation.suppressed.values())
    for outcome_name in ("enqueued", "sent", "deferred", "denied_consent", "dead_token"):
        assert verdict.counts[f"records_{outcome_name}"] > 0
    audit_rows = frame[frame["kind"] == "audit"]
    for row in audit_rows.itertuples(index=False):
        match = KEY.match(json.loads(row.detail)["object"])
        assert match and match["tenant"] == row.tenant_id  # each tenant in its own prefix
    assert {
        KEY.match(k)["writer"].rsplit("-", 1)[0] for k, _, _ in audit_versions(s3, "fanout-audit")
    } == {
        "fanout-worker",
        "push-consumer",
    }

    # The same run with one notification's 'sent' records gone fails.
    sent = audit_rows[audit_rows["reason"] == "sent"]
    gone = sent[sent["notification_id"] == sent["notification_id"].iloc[0]].index
    broken = audit_complete.check(expectation, frame.drop(index=gone), population)
    assert not broken.valid and broken.counts["unaudited_sends"] >= 1


# -- sealed personal fields (crypto-shredding) ------------------------------------------------

KEY_A, KEY_B = DataKey("a" * 32, b"A" * 32), DataKey("b" * 32, b"B" * 32)


def _enqueued() -> dict[str, object]:
    return _record(
        outcome="enqueued",
        author_id="celeb-1",
        device_id="dev-1",
        token_sha256=token_sha256("tok-1"),
        sqs_message_id="m1",
        receive_count=2,
        channel="push",
    )


def test_a_sealed_record_keeps_only_non_personal_fields_in_clear_and_opens_with_the_keys():
    record = _enqueued()
    stored = seal_record(record, KEY_A, KEY_B)
    assert {k for k in stored if k != "sealed"} == {
        "outcome",
        "at",
        "tenant_id",
        "notification_id",
        "sqs_message_id",
        "receive_count",
        "channel",
    }
    text = json.dumps(stored)
    for personal in ("u1", "celeb-1", "dev-1", token_sha256("tok-1")):
        assert f'"{personal}"' not in text
    assert [e["kid"] for e in stored["sealed"]] == [KEY_A.kid, KEY_B.kid]
    opened = open_record(stored, {KEY_A.kid: KEY_A.key, KEY_B.kid: KEY_B.key})
    assert opened == {
        "decrypted": {
            "recipient_user_id": "u1",
            "device_id": "dev-1",
            "token_sha256": token_sha256("tok-1"),
            "author_id": "celeb-1",
        }
    }
    # The author's key destroyed: the recipient's fields still open, the author's do not.
    partly = open_record(stored, {KEY_A.kid: KEY_A.key})
    assert partly["key_destroyed"] and "author_id" not in partly["decrypted"]
    assert open_record(stored, {}) == {"key_destroyed": True}


def test_an_envelope_opens_only_in_the_record_it_was_sealed_in():
    first, second = seal_record(_record(n=1), KEY_A), seal_record(_record(outcome="retry"), KEY_A)
    moved = {**second, "sealed": first["sealed"]}
    assert open_record(moved, {KEY_A.kid: KEY_A.key}) == {"seal_broken": True}
    assert open_record(first, {KEY_A.kid: b"C" * 32}) == {"seal_broken": True}


def test_a_destroyed_key_withholds_the_fields_and_a_record_naming_no_one_has_no_envelope():
    withheld = seal_record(_record(device_id="dev-1"), "c" * 32)
    assert withheld["sealed"] == [{"kid": "c" * 32, "withheld": True}]
    assert "u1" not in json.dumps(withheld) and "dev-1" not in json.dumps(withheld)
    assert open_record(withheld, {"c" * 32: b"C" * 32}) == {"key_destroyed": True}
    poison = seal_record({"outcome": "poison", "at": "x", "tenant_id": None, "reason": "bad"}, None)
    assert "sealed" not in poison


def test_a_job_sealed_at_enqueue_is_withheld_once_its_key_is_gone_or_replaced():
    assert sealing_for(KEY_A, None) is KEY_A  # no key named: whatever the table holds
    assert sealing_for(KEY_A, KEY_A.kid) is KEY_A
    assert sealing_for(None, KEY_A.kid) == KEY_A.kid  # erased since it was enqueued
    assert sealing_for(KEY_B, KEY_A.kid) == KEY_A.kid  # erased, and registered again


def _sealed_history(keys: dict[str, bytes], skip: tuple[str, str] | None = None) -> pd.DataFrame:
    """``_history`` with every record's personal fields sealed, read back as the collector
    does (the detail as stored, plus what the keys open)."""
    frame = _history(skip=skip)
    details = []
    for row in frame.itertuples(index=False):
        if row.kind != "audit":
            details.append(row.detail)
            continue
        record = {
            "outcome": row.reason,
            "at": "2026-11-22T10:15:00+00:00",
            "tenant_id": row.tenant_id,
            "notification_id": row.notification_id,
            **json.loads(row.detail),
        }
        stored = seal_record(record, KEY_A)
        rest = {
            k: v for k, v in stored.items() if k not in ("outcome", "tenant_id", "notification_id")
        }
        details.append(json.dumps({**rest, **open_record(stored, keys)}))
    return frame.assign(detail=pd.array(details, dtype="string"))


@pytest.mark.usefixtures("engine")
def test_audit_complete_reads_the_decrypted_fields_of_a_sealed_trail():
    keys = {KEY_A.kid: KEY_A.key}
    assert _check(_sealed_history(keys)).valid
    verdict = _check(_sealed_history(keys, skip=("deferred", "quiet")))
    assert not verdict.valid and verdict.counts["unaudited_quiet_hours_pending"] == 1
    # Without the key (every user erased) the records name no one: nothing is matched.
    assert _check(_sealed_history({})).counts["unaudited_suppressions"] == 3


def _audit_row(history: History, tenant: str, outcome: str, detail: dict[str, object]) -> None:
    history.append(
        "audit", tenant_id=tenant, notification_id="n1", reason=outcome, detail=json.dumps(detail)
    )


def test_readable_personal_ids_finds_an_erased_users_id_or_token_in_clear_anywhere():
    history = History()
    sealed = {"sealed": [{"kid": "k", "iv": "u1AAAAAA", "ct": "xu1y-u1_z"}], "object": "audit/u1"}
    _audit_row(history, T, "sent", {**sealed, "decrypted": {"recipient_user_id": "u1"}})
    _audit_row(history, T, "sent", {"recipient_user_id": "u12"})  # another user
    _audit_row(history, "t2", "sent", {"recipient_user_id": "u1"})  # another tenant's u1
    _audit_row(history, T, "sent", {"note": "sent to t1:u1 today"})  # a field of no format
    _audit_row(history, T, "deduped", {"token_sha256": token_sha256("tok-1")})
    _audit_row(history, T, "retry", {"device": {"token": "tok-1"}})
    history.append("audit", tenant_id=T, reason="unreadable", detail=json.dumps({"line": "{u1"}))
    found = readable_personal_ids(history.frame(), {(T, "u1")}, {(T, "u1"): {"tok-1"}})
    assert [(f["seq"], f["found"]) for f in found] == [
        (3, "user_id"),
        (4, "token_sha256"),
        (5, "token"),
        (6, "user_id"),
    ]
    assert found[0] == {
        "seq": 3,
        "tenant_id": T,
        "user_id": "u1",
        "found": "user_id",
        "outcome": "sent",
        "notification_id": "n1",
    }
    assert readable_personal_ids(history.frame(), set(), {}) == []


def test_readable_personal_ids_is_not_a_registered_checker():
    from harness.checkers import registry

    assert "audit_personal" not in registry.known()
    assert "audit_per_copy" in registry.known()


@pytest.mark.integration
def test_two_writers_creating_one_users_key_end_with_one_key(audited):
    info = audited.info
    config = Config.load(info.reference_config)
    keys = AuditKeys(client(config, "dynamodb"), config.table("audit_keys"))
    user = ("race", f"u-{uuid.uuid4().hex[:8]}")
    with ThreadPoolExecutor(8) as pool:
        created = list(pool.map(lambda _: keys.create(user), range(8)))
    assert len({k.kid for k in created}) == 1 and len({k.key for k in created}) == 1
    assert keys.read([user]) == {user: created[0]}
    assert keys.ensure([user, ("race", "other")])[user] == created[0]
    assert keys.destroy(*user) is True and keys.read([user]) == {}
    assert keys.destroy(*user) is False  # a retried erasure: nothing left, no error
    again = keys.create(user)
    assert again.kid != created[0].kid  # the same id registered again: a new key


class _PutCounter:
    """A DynamoDB client that counts the PutItems sent through it (the key creations)."""

    def __init__(self, ddb) -> None:
        self._ddb = ddb
        self.puts = 0

    def put_item(self, **kwargs):
        self.puts += 1
        return self._ddb.put_item(**kwargs)

    def __getattr__(self, name: str):
        return getattr(self._ddb, name)


def _keys_of(info) -> AuditKeys:
    config = Config.load(info.reference_config)
    return AuditKeys(client(config, "dynamodb"), config.table("audit_keys"))


@pytest.mark.integration
def test_registration_makes_one_key_kept_on_update_and_a_new_one_after_erasure(audited):
    """The Event API makes a user's key when it first stores them (preferences, a device, the
    bulk path), keeps it when they are stored again, and an erased user registered again under
    the same id gets a new key."""
    t = TenantClient(audited)
    keys = _keys_of(audited.info)
    user = (t.tenant, "reg")
    assert keys.read([user]) == {}
    t.user("reg")  # preferences only
    first = keys.read([user])[user]
    t.user("reg", consent=False, devices=[("fcm", fcm_token(11, t.tenant))])
    bulk = {
        "users": [
            {"user_id": "reg", "preferences": {"zone": "UTC"}},
            {"user_id": "bulk", "devices": [{"token": fcm_token(12, t.tenant), "platform": "fcm"}]},
        ]
    }
    t.api.post(f"/v1/tenants/{t.tenant}/users:batch", json=bulk).raise_for_status()
    device_only = (t.tenant, "dev")
    token = quote(fcm_token(13, t.tenant), safe="")
    t.api.put(
        f"/v1/tenants/{t.tenant}/users/dev/devices/{token}", json={"platform": "fcm"}
    ).raise_for_status()
    found = keys.read([user, (t.tenant, "bulk"), device_only])
    assert found[user] == first  # stored again: the same key
    assert set(found) == {user, (t.tenant, "bulk"), device_only}
    assert len({k.kid for k in found.values()}) == 3

    erased = t.api.delete(f"/v1/tenants/{t.tenant}/users/reg")
    assert erased.status_code == 200 and erased.json()["removed"]["audit_keys"] == 1
    assert keys.read([user]) == {}
    t.user("reg")
    again = keys.read([user])[user]
    assert again.kid != first.kid and again.key != first.key


@pytest.mark.integration
def test_a_registration_racing_the_fan_out_ends_with_the_one_key_both_use(audited):
    """Eight registrations of one new user at once (two API processes' threads) and the
    fan-out's own ensure: one key, the one the fan-out hands its jobs."""
    t = TenantClient(audited)
    keys = _keys_of(audited.info)
    user = (t.tenant, "racer")
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: t.user("racer"), range(8)))
    assert answers == [None] * 8  # each PUT answered 2xx (raise_for_status)
    stored = keys.read([user])[user]
    assert keys.ensure([user]) == {user: stored}


@pytest.mark.integration
def test_the_first_notification_to_registered_users_creates_no_key(audited):
    """The fan-out's page keys for users the Event API registered (bulk and one by one) are
    read, not made: no PutItem, and the kids are the registration's. A follower who never
    registered still gets a key from the fan-out (the fallback), by one PutItem."""
    from reference_impl.fanout import FanoutEvent
    from reference_impl.fanout_worker import FanoutWorker

    t = TenantClient(audited)
    bulk = [{"user_id": f"b{i}", "preferences": {"zone": "UTC"}} for i in range(30)]
    t.api.post(f"/v1/tenants/{t.tenant}/users:batch", json={"users": bulk}).raise_for_status()
    for user in ("author", "one"):
        t.user(user)
    followers = [u["user_id"] for u in bulk] + ["one"]
    registered = _keys_of(audited.info).read([(t.tenant, u) for u in [*followers, "author"]])
    assert len(registered) == len(followers) + 1

    event = FanoutEvent(
        t.tenant, "author", "post", "o1", str(ULID()), datetime.now(UTC).isoformat()
    )
    worker = FanoutWorker(Config.load(audited.info.reference_config))
    try:
        assert worker.audit_keys is not None
        counter = _PutCounter(worker.audit_keys.ddb)
        worker.audit_keys.ddb = counter
        page = worker.page_keys(event, followers)
        assert counter.puts == 0
        assert page == registered
        fallback = worker.page_keys(event, ["never-registered"])
        assert counter.puts == 1 and (t.tenant, "never-registered") in fallback
    finally:
        if worker.audit_sink is not None:
            worker.audit_sink.close()


def _stored(s3, bucket: str) -> list[dict[str, object]]:
    return [r for records in _objects(s3, bucket).values() for r in records]


@pytest.mark.integration
def test_a_consumer_seals_each_copys_record_and_withholds_a_job_whose_key_is_gone(
    audited, s3, bucket
):
    values = json.loads(Path(audited.info.reference_config).read_text())
    config = Config.from_mapping({**values, "audit_bucket": bucket, "audit_flush_before_ack": True})
    t = TenantClient(audited)
    t.user("fresh", consent=False, devices=[("fcm", fcm_token(2, t.tenant))])
    t.user("erased", consent=False)
    # Registration made the user's key; erasure has destroyed it since the job was enqueued.
    assert AuditKeys(client(config, "dynamodb"), config.table("audit_keys")).destroy(
        t.tenant, "erased"
    )

    def record(user: str, message_id: str, **job_extra: str) -> dict[str, object]:
        job = {
            "tenant_id": t.tenant,
            "notification_id": str(ULID()),
            "recipient_user_id": user,
            "author_id": "a",
            "kind": "post",
            **job_extra,
        }
        return {
            "messageId": message_id,
            "receiptHandle": message_id,
            "body": json.dumps(job),
            "attributes": {"ApproximateReceiveCount": "2"},
            "messageAttributes": {"tenant_id": {"stringValue": t.tenant, "dataType": "String"}},
        }

    gone_kid = uuid.uuid4().hex  # the key the job was enqueued under, destroyed since
    consumer = PushConsumer(config)
    try:
        poison = {
            **record("fresh", "m-poison"),
            "body": json.dumps({"tenant_id": t.tenant, "x": 1}),
        }
        event = {
            "Records": [
                record("fresh", "m-fresh"),
                record("erased", "m-gone", audit_kid=gone_kid),
                poison,
            ]
        }
        assert consumer(event, None) == {"batchItemFailures": []}
    finally:
        consumer.apns.close()
        consumer.fcm.close()
        consumer.audit_sink.close()
    stored = {r["sqs_message_id"]: r for r in _stored(s3, bucket)}
    assert {m: (r["outcome"], r["receive_count"]) for m, r in stored.items()} == {
        "m-fresh": ("denied_consent", 2),
        "m-gone": ("denied_consent", 2),
        "m-poison": ("poison", 2),  # even a malformed copy ends in a record
    }
    assert stored["m-poison"]["tenant_id"] == t.tenant and "sealed" not in stored["m-poison"]
    assert stored["m-gone"]["sealed"] == [{"kid": gone_kid, "withheld": True}]
    assert "erased" not in json.dumps(stored["m-gone"])
    ddb = client(config, "dynamodb")
    table_keys = audit_keys_by_kid(ddb, config.table("audit_keys"))
    assert open_record(stored["m-fresh"], table_keys)["decrypted"] == {"recipient_user_id": "fresh"}
    # No key was created for the erased user: only a job that names no key creates one.
    assert AuditKeys(ddb, config.table("audit_keys")).read([(t.tenant, "erased")]) == {}


def _collect(info, history) -> int:
    """The reference's audit trail into ``history``, read through the reference's contract."""
    from harness.stack.reference import contract

    return contract(info, durable=False).audit.read(history)


def _tenant_trail(info, tenant: str) -> pd.DataFrame:
    history = History()
    _collect(info, history)
    frame = history.frame()
    return frame[(frame["kind"] == "audit") & (frame["tenant_id"] == tenant)]


def _readers(frame: pd.DataFrame) -> list[tuple[str, object, str | None, bool]]:
    """(outcome, the decrypted recipient or None, the recipient envelope's key id, key
    destroyed) per record."""
    out = []
    for row in frame.itertuples(index=False):
        detail = json.loads(row.detail)
        user = (detail.get("decrypted") or {}).get("recipient_user_id")
        kid = detail["sealed"][0]["kid"] if detail.get("sealed") else None
        out.append((str(row.reason), user, kid, bool(detail.get("key_destroyed"))))
    return out


@pytest.mark.integration
def test_erasure_leaves_the_users_audit_records_intact_but_unreadable(stack):
    """Against the real stack: a user's trail opens with the key table until erasure destroys
    their key; after it the WORM records are all still there, no longer open, and their id is
    in no stored record in clear; another user's records still open. The defect variant
    (``erasure_keeps_audit_key``) leaves them readable."""
    info = stack.info
    t = TenantClient(stack)
    tokens = {u: apns_token(n, t.tenant) for n, u in enumerate(("gone", "kept", "stays"))}
    for user, token in tokens.items():
        t.user(user, devices=[("apns", token)])
    t.follow("er-author", list(tokens))
    nid = t.post("er-author")
    t.wait_rows(nid, 3)

    def trail_complete() -> bool:
        readers = _readers(_tenant_trail(info, t.tenant))
        return all(
            {u for o, u, _, _ in readers if o == outcome} == set(tokens)
            for outcome in ("enqueued", "sent")
        )

    wait_until(trail_complete, 30, "the three users' records in the bucket", interval=0.5)
    before = _readers(_tenant_trail(info, t.tenant))
    kids = {u: kid for _, u, kid, _ in before}
    assert len(set(kids.values())) == 3  # one key per user

    response = t.api.delete(f"/v1/tenants/{t.tenant}/users/gone")
    assert response.status_code == 200 and response.json()["removed"]["audit_keys"] == 1
    config = Config.from_mapping(
        {
            **json.loads(Path(info.reference_config).read_text()),
            "defects": ["erasure_keeps_audit_key"],
        }
    )
    kept = erase_user(config, client(config, "dynamodb"), connect_redis(config), t.tenant, "kept")
    assert kept["audit_keys"] == 0  # the defect: the key stays

    trail = _tenant_trail(info, t.tenant)
    after = _readers(trail)
    assert len(after) == len(before)  # WORM: every record is still there, and only those
    by_kid = {kid: [(o, u, d) for o, u, k, d in after if k == kid] for kid in kids.values()}
    assert len(by_kid[kids["gone"]]) == 2  # enqueued, sent: still there, no longer open
    assert all(u is None and destroyed for _, u, destroyed in by_kid[kids["gone"]])
    assert {u for _, u, _ in by_kid[kids["kept"]]} == {"kept"}  # the defect: still readable
    assert {u for _, u, _ in by_kid[kids["stays"]]} == {"stays"}
    erased = {(t.tenant, "gone"), (t.tenant, "kept")}
    tokens_of = {(t.tenant, u): {tokens[u]} for u in ("gone", "kept")}
    assert readable_personal_ids(trail, erased, tokens_of) == []  # never in clear
    # Retried, the erasure ends in the same state.
    again = t.api.delete(f"/v1/tenants/{t.tenant}/users/gone")
    assert again.status_code == 200 and again.json()["removed"]["audit_keys"] == 0


def _outcome(history: History, outcome: str, token: str, **detail: object) -> None:
    fields = {"token_sha256": audit_complete.token_sha256(token), **detail}
    history.append(
        "audit", tenant_id=T, notification_id="n1", reason=outcome, detail=json.dumps(fields)
    )


@pytest.mark.usefixtures("engine")
def test_sent_records_may_not_outnumber_what_the_provider_or_sns_accepted():
    history = History()
    # Straight to APNs: a 429, then a 200 on the retry.
    history.extend_provider(
        [
            {"received_at": 1.0, "tenant_id": T, "notification_id": "n1", "token": "direct",
             "provider": "apns", "project": None, "status": status, "reason": None}
            for status in (429, 200)
        ]
    )  # fmt: skip
    # Through SNS: the publish accepted, the token then dead at APNs (SNS's own request).
    history.append("sns_publish", time=1.0, tenant_id=T, notification_id="n1", token="via-sns",
                   provider="sns", reason=None)  # fmt: skip
    history.extend_provider(
        [{"received_at": 1.1, "tenant_id": T, "notification_id": "n1", "token": "via-sns",
          "provider": "apns", "project": None, "status": 410, "reason": "Unregistered"}]
    )  # fmt: skip
    _outcome(history, "retry", "direct")
    _outcome(history, "sent", "direct")
    _outcome(history, "sent", "direct")  # the same record stored twice counts once
    _outcome(history, "sent", "via-sns", channel="push")
    _outcome(history, "sent", "mail", channel="email")  # another channel's: not judged here
    verdict = audit_outcomes.check(history.frame())
    assert verdict.valid, verdict.details
    assert verdict.counts["devices_judged"] == 2
    # The 429 written down as 'sent' before its answer was read.
    _outcome(history, "sent", "direct", status=429)
    verdict = audit_outcomes.check(history.frame())
    assert not verdict.valid
    assert verdict.counts["sent_beyond_acceptance"] == 1 and verdict.counts["devices_over"] == 1
    assert verdict.details["examples"][0]["accepted"] == 1


@pytest.mark.usefixtures("engine")
def test_a_sent_record_stamped_before_its_first_request_fails_on_both_engines():
    """Red team 3: a trail stamped with the event's acceptance time (``at`` = accepted_at), not
    the attempt's. The record says 'sent' at 1.0 while the first request for that device
    reached APNs at 1.4 (or SNS at 1.4): no system can know a send happened before it tried.
    A record stamped after its request, or within the clock slack of it, passes."""
    history = History()
    history.extend_provider(
        [{"received_at": 1.4, "tenant_id": T, "notification_id": "n1", "token": token,
          "provider": "apns", "project": None, "status": 200, "reason": None}
         for token in ("early", "after", "within-slack")]
    )  # fmt: skip
    history.append("sns_publish", time=1.4, tenant_id=T, notification_id="n1",
                   token="published-early", provider="sns", reason=None)  # fmt: skip
    for token, at in (("after", 1.45), ("within-slack", 1.38)):
        history.append("audit", time=at, tenant_id=T, notification_id="n1", reason="sent",
                       detail=json.dumps({"token_sha256": audit_complete.token_sha256(token)}))  # fmt: skip
    assert audit_outcomes.check(history.frame()).valid
    for token in ("early", "published-early"):
        history.append("audit", time=1.0, tenant_id=T, notification_id="n1", reason="sent",
                       detail=json.dumps({"token_sha256": audit_complete.token_sha256(token)}))  # fmt: skip
    frame = history.frame()
    verdict = audit_outcomes.check(frame)
    assert not verdict.valid
    assert verdict.counts["sent_before_request"] == 2
    assert verdict.counts["sent_beyond_acceptance"] == 0  # each was accepted: only the time lies
    with HistoryStore.from_frame(
        frame, expected_deliveries(_population(), frame[frame["kind"] == "inject"])
    ) as store:
        assert audit_outcomes.check_store(store).to_dict() == verdict.to_dict()


def _random_outcomes_history(seed: int) -> pd.DataFrame:
    """A history of direct sends and SNS publishes with their answers, and an audit trail
    that is right about most devices and wrong about some: 'sent' written for a 429 or 5xx
    before its retry, records stored twice, devices named in each way a record can name one
    (decrypted, in clear, by token), records naming none, other channels, unreadable lines."""
    rng = random.Random(seed)
    history = History()
    tenants = [T, "other", None]
    nids = ["n1", "n2", None]
    tokens = [f"tok-{i}" for i in range(6)]
    for _ in range(rng.randint(0, 40)):
        history.extend_provider(
            [{"received_at": rng.uniform(0, 10), "tenant_id": rng.choice(tenants),
              "notification_id": rng.choice(nids), "token": rng.choice([*tokens, None]),
              "provider": rng.choice(["apns", "fcm", "sns", "ses"]), "project": None,
              "status": rng.choice([200, 200, 200, 429, 503, None]), "reason": None}]
        )  # fmt: skip
    for _ in range(rng.randint(0, 15)):
        history.append("sns_publish", time=rng.uniform(0, 10), tenant_id=rng.choice(tenants),
                       notification_id=rng.choice(nids), token=rng.choice([*tokens, None]),
                       provider="sns", reason=rng.choice([None, None, "EndpointDisabled"]))  # fmt: skip
    for i in range(rng.randint(0, 40)):
        token = rng.choice(tokens)
        digest = audit_complete.token_sha256(token)
        named = rng.choice(["decrypted", "clear", "token", "none", "destroyed"])
        detail: dict[str, object] = {"attempt": rng.randint(1, 2)}
        if named == "decrypted":
            detail["decrypted"] = {"token_sha256": digest, "recipient_user_id": "u"}
        elif named == "clear":
            detail["token_sha256"] = digest
        elif named == "destroyed":
            detail["decrypted"] = {"key_destroyed": True}
        if rng.random() < 0.2:
            detail["channel"] = rng.choice(["push", "email", "in_app"])
        row = {
            "tenant_id": rng.choice(tenants),
            "notification_id": rng.choice(nids),
            "token": token if named == "token" else None,
            "reason": rng.choice(["sent", "sent", "sent", "retry", "deduped", None]),
            "detail": json.dumps(detail) if rng.random() < 0.95 else "not json",
        }
        for _ in range(rng.choice([1, 1, 1, 2])):  # a batch stored twice
            history.append("audit", time=float(i), **row)
    return history.frame()


@pytest.mark.parametrize("seed", range(40))
def test_audit_outcomes_gives_one_verdict_on_both_engines(seed):
    """Random histories, the trail right or wrong about each device: the store's verdict,
    counts and examples are the in-memory path's."""
    history = _random_outcomes_history(seed)
    expectation = expected_deliveries(_population(), history[history["kind"] == "inject"])
    with HistoryStore.from_frame(history, expectation) as store:
        on_disk = audit_outcomes.check_store(store)
    assert on_disk.to_dict() == audit_outcomes.check(history).to_dict()


def test_random_outcome_histories_pass_and_fail():
    """The random histories above judge something: some pass, some fail, many devices."""
    verdicts = [audit_outcomes.check(_random_outcomes_history(seed)) for seed in range(40)]
    assert {v.valid for v in verdicts} == {True, False}
    assert sum(v.counts["devices_judged"] for v in verdicts) > 100
    assert sum(v.counts["sent_beyond_acceptance"] for v in verdicts) > 10
    assert sum(v.counts["sent_before_request"] for v in verdicts) >= 5


@pytest.mark.usefixtures("engine")
def test_a_429_audited_sent_fails_on_both_engines_and_sns_errors_are_no_acceptance():
    """The planted defect, beside each thing that does or does not count as an acceptance:
    a 200 from APNs or FCM, a publish SNS accepted; not a 429, not a 200 from another
    provider, not a publish SNS refused, not another tenant's or notification's 200."""
    history = History()
    history.extend_provider(
        [{"received_at": 1.0, "tenant_id": tenant, "notification_id": nid, "token": token,
          "provider": provider, "project": None, "status": status, "reason": None}
         for tenant, nid, token, provider, status in [
             (T, "n1", "throttled", "apns", 429),
             (T, "n1", "ses-only", "ses", 200),
             ("other", "n1", "elsewhere", "fcm", 200),
             (T, "n2", "elsewhere", "fcm", 200),
             (T, "n1", "twice", "fcm", 200),
             (T, "n1", "twice", "fcm", 200),
         ]]
    )  # fmt: skip
    history.append("sns_publish", time=1.0, tenant_id=T, notification_id="n1",
                   token="refused", provider="sns", reason="EndpointDisabled")  # fmt: skip
    for token in ("throttled", "ses-only", "elsewhere", "refused"):
        _outcome(history, "sent", token)
    _outcome(history, "sent", "twice", attempt=1)
    _outcome(history, "sent", "twice", attempt=2)  # two sends, two 200s: no defect
    verdict = audit_outcomes.check(history.frame())
    assert not verdict.valid
    assert verdict.counts == {
        "sent_records": 6,
        "devices_judged": 5,
        "sent_beyond_acceptance": 4,
        "devices_over": 4,
        "sent_before_request": 0,
    }
    over = {e["token_sha256"] for e in verdict.details["examples"]}
    assert audit_complete.token_sha256("throttled") in over
    assert audit_complete.token_sha256("twice") not in over
