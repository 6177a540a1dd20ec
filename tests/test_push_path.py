"""The reference push path end to end on the real local stack (real sockets everywhere)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
import redis
from helpers import TenantClient, apns_token, audit_lines, fcm_token

from harness.stack.supervisor import wait_until
from reference_impl.dedup_key import dedup_key
from reference_impl.ids import device_id

pytestmark = pytest.mark.integration


def _statuses(rows):
    return sorted((r["token"], r["status"]) for r in rows)


def test_event_reaches_apns_and_fcm_devices_once_and_respects_consent(stack):
    t = TenantClient(stack)
    salt = t.tenant
    a1, f1, dead = apns_token(1, salt), fcm_token(2, salt), apns_token(4, salt)
    t.user("f1", devices=[("apns", a1)])
    t.user("f2", devices=[("fcm", f1)])
    t.user("f3", consent=False, devices=[("apns", apns_token(3, salt))])
    t.user("f4", devices=[("apns", dead)])
    t.user("f5")  # consent but no device
    t.apns.unregister([dead])
    t.follow("author", ["f1", "f2", "f3", "f4", "f5"])

    first = t.post("author")
    rows = t.wait_rows(first, 3)
    assert _statuses(rows) == sorted([(a1, 200), (f1, 200), (dead, 410)])

    # The 410 deactivated the dead token: a second notification does not try it again.
    second = t.post("author")
    rows = t.wait_rows(second, 2)
    wait_until(
        lambda: any(
            r.get("audit") == "sent" and r["notification_id"] == second
            for r in audit_lines(stack, "push-consumer")
        ),
        20,
        "the second notification's audit",
    )
    assert _statuses(t.rows_for(second)) == sorted([(a1, 200), (f1, 200)])
    # Nothing ever reached the user without consent.
    assert all(r["token"] != apns_token(3, salt) for r in t.ledger())
    outcomes = {
        (r["audit"], r["recipient_user_id"])
        for r in audit_lines(stack, "push-consumer")
        if r["notification_id"] == first
    }
    assert ("denied_consent", "f3") in outcomes
    assert ("no_device", "f5") in outcomes


def test_celebrity_post_writes_one_pointer_and_pushes_every_follower(stack):
    t = TenantClient(stack)
    followers = [f"c{n}" for n in range(60)]  # the stack's threshold is 50
    for n, follower in enumerate(followers):
        t.user(follower, devices=[("fcm", fcm_token(n, t.tenant))])
    t.follow("celebrity", followers)
    nid = t.post("celebrity")
    rows = t.wait_rows(nid, len(followers))
    assert len(rows) == len(followers)
    assert {r["status"] for r in rows} == {200}
    # FCM is sharded over the configured sender projects by recipient id mod K.
    assert {r["project"] for r in rows} == {"fanout-sender-0", "fanout-sender-1"}

    ddb = stack.info.aws_client("dynamodb")
    pointers = ddb.query(
        TableName="fanout-celebrity_posts",
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": f"{t.tenant}#celebrity"}},
    )["Items"]
    assert [p["sk"]["S"] for p in pointers] == [nid]
    inbox = ddb.query(
        TableName="fanout-inbox",
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": f"{t.tenant}#c0"}},
    )["Items"]
    assert inbox == []  # no per-follower write for a celebrity

    # The fan-out of fan-out: the stream record only listed pages; page tasks (20 followers
    # each in the stack's config) made the jobs, and a walk task handed the listing on.
    def fanout_records() -> list[dict]:
        lines = audit_lines(stack, "fanout-worker")
        return [r for r in lines if r.get("notification_id") == nid]

    wait_until(lambda: len(fanout_records()) >= 5, 10, "the fan-out's five log lines")
    records = fanout_records()
    first = [r for r in records if "task" not in r]
    assert len(first) == 1 and first[0]["page_tasks"] == 2 and first[0]["walk_on"] is True
    pages = [r for r in records if r.get("task") == "page"]
    assert len(pages) == 3 and all(r["jobs"] <= 20 for r in pages)
    assert sum(r["jobs"] for r in pages) == len(followers)
    assert [r.get("task") for r in records].count("walk") == 1


def test_regular_post_writes_inbox_rows(stack):
    t = TenantClient(stack)
    t.user("r1", devices=[("apns", apns_token(1, t.tenant))])
    t.follow("writer", ["r1"])
    nid = t.post("writer")
    t.wait_rows(nid, 1)
    item = stack.info.aws_client("dynamodb").get_item(
        TableName="fanout-inbox", Key={"pk": {"S": f"{t.tenant}#r1"}, "sk": {"S": nid}}
    )["Item"]
    assert item["author_id"]["S"] == "writer"
    assert int(item["expires_at"]["N"]) > time.time() + 89 * 86400


def test_quiet_hours_deferral_survives_a_consumer_crash_and_releases_once(stack):
    t = TenantClient(stack)
    zone = "Asia/Kathmandu"
    now = datetime.now(UTC)
    end = (now + timedelta(seconds=12)).replace(microsecond=0)

    def local(instant: datetime) -> str:
        return instant.astimezone(ZoneInfo(zone)).strftime("%H:%M:%S")

    token = apns_token(1, t.tenant)
    t.user(
        "q1",
        zone=zone,
        quiet_hours={"start": local(now - timedelta(hours=1)), "end": local(end)},
        devices=[("apns", token)],
    )
    t.follow("night-author", ["q1"])
    nid = t.post("night-author")
    wait_until(
        lambda: any(
            r.get("audit") == "deferred" and r["notification_id"] == nid
            for r in audit_lines(stack, "push-consumer")
        ),
        20,
        "the job to be deferred",
    )
    assert t.rows_for(nid) == []
    stack.kill_part("push-consumer")  # kill -9: the deferral must live in the queue, not memory
    stack.start_part("push-consumer")
    rows = t.wait_rows(nid, 1, timeout=40)
    assert rows[0]["received_at"] >= end.timestamp()
    # Settle: nothing else for this notification arrives once the queue is idle.
    sqs = stack.info.aws_client("sqs")
    url = sqs.get_queue_url(QueueName="fanout-push")["QueueUrl"]

    def idle() -> bool:
        attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        return (
            sum(
                int(attrs[k])
                for k in (
                    "ApproximateNumberOfMessages",
                    "ApproximateNumberOfMessagesNotVisible",
                    "ApproximateNumberOfMessagesDelayed",
                )
            )
            == 0
        )

    wait_until(idle, 30, "the push queue to drain")
    assert [r["status"] for r in t.rows_for(nid)] == [200]


def test_dedup_store_down_means_no_send_then_exactly_one_after_recovery(stack):
    t = TenantClient(stack)
    token = fcm_token(1, t.tenant)
    t.user("d1", devices=[("fcm", token)])
    t.follow("dedup-author", ["d1"])
    stack.stop_part("redis")
    try:
        nid = t.post("dedup-author")
        wait_until(
            lambda: (
                t.rows_for(nid)
                or any(
                    r.get("audit") == "dedup_unavailable" and r["notification_id"] == nid
                    for r in audit_lines(stack, "push-consumer")
                )
            ),
            30,
            "the consumer to meet the dedup outage",
        )
        assert t.rows_for(nid) == []  # fail closed: no send without a dedup decision
    finally:
        stack.start_part("redis")
    rows = t.wait_rows(nid, 1, timeout=40)
    assert [r["status"] for r in rows] == [200]
    key = dedup_key(t.tenant, nid, "d1#" + device_id(token))
    assert redis.Redis.from_url(stack.info.redis_url).get(key) == b"sent"


def test_malformed_job_goes_to_the_poison_queue(stack):
    sqs = stack.info.aws_client("sqs")
    url = sqs.get_queue_url(QueueName="fanout-push")["QueueUrl"]
    poison = sqs.get_queue_url(QueueName="fanout-push-poison")["QueueUrl"]
    marker = f"not-json-{time.time_ns()}"
    sqs.send_message(QueueUrl=url, MessageBody=marker)  # no tenant_id attribute either
    found: list[str] = []

    def arrived() -> bool:
        for m in sqs.receive_message(
            QueueUrl=poison, MaxNumberOfMessages=10, WaitTimeSeconds=1
        ).get("Messages", []):
            found.append(m["Body"])
            sqs.delete_message(QueueUrl=poison, ReceiptHandle=m["ReceiptHandle"])
        return marker in found

    wait_until(arrived, 30, "the malformed job in the poison queue")


def test_withdrawn_consent_takes_effect_on_the_next_notification(stack):
    t = TenantClient(stack)
    token = apns_token(1, t.tenant)
    t.user("w1", devices=[("apns", token)])
    t.follow("consent-author", ["w1"])
    cache = redis.Redis.from_url(stack.info.redis_url)
    # The consumer caches the preferences on its first read; the stream invalidator's copy of
    # the user's creation can still drop that entry afterwards, so post until it stays cached.
    for _ in range(5):
        first = t.post("consent-author")
        t.wait_rows(first, 1)
        if cache.get(f"{t.tenant}:prefs:w1") is not None:
            break
    assert cache.get(f"{t.tenant}:prefs:w1") is not None  # the consumer cached the preferences
    t.user("w1", consent=False)  # withdraws consent; the API drops the cached copy
    assert cache.get(f"{t.tenant}:prefs:w1") is None
    second = t.post("consent-author")
    wait_until(
        lambda: any(
            r.get("audit") == "denied_consent" and r["notification_id"] == second
            for r in audit_lines(stack, "push-consumer")
        ),
        20,
        "the second notification to be denied",
    )
    assert t.rows_for(second) == []


def test_a_dead_recipient_is_known_to_every_thread_and_the_oldest_are_forgotten_first():
    from reference_impl.job_consumer import KnownDead

    known = KnownDead(capacity=2)
    known.add(("t", "u1#d1"))
    known.add(("t", "u2#d2"))
    assert ("t", "u1#d1") in known and ("t2", "u1#d1") not in known
    known.add(("t", "u3#d3"))
    assert ("t", "u1#d1") not in known and ("t", "u3#d3") in known
