"""minifanout, the second system, as real processes: redis-server, our SQS endpoint, the APNs
(h2c and TLS) and FCM simulators, and ``python -m systems.minifanout``, driven only through
its driver (``systems.minifanout.driver``) with the contract's HttpExecutor.

What each promise looks like in the simulators' ledgers, and each planted bug making the
observable difference (the same test with the bug on fails the promise).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import boto3
import httpx
import pytest
import redis
from sim_process import SIGNING_KEY, Sim, run_sim
from ulid import ULID

from emulators.ports import free_port
from emulators.providers.fcm import write_service_account_file
from emulators.sqs.faults import SqsFaultControl
from emulators.sqs.processes import EndpointProcess, start_ours
from harness.contract.driver import (
    Call,
    DriverError,
    Event,
    HttpExecutor,
    Unsupported,
    load_driver,
)
from harness.model.population import User, preferences_body
from harness.stack.target import parse as parse_target
from systems.minifanout.driver import MiniFanoutDriver, settings_from_preferences

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]
CONSENT = {"granted_at": "2026-01-01T00:00:00+00:00", "version": "1"}


def wait_for(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``condition`` until it is truthy (returned); AssertionError naming what after the
    timeout."""
    deadline = time.monotonic() + timeout
    delay = 0.02
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(delay)  # back-off between polls of a condition, bounded by the deadline
        delay = min(delay * 2, 0.2)


def apns_token() -> str:
    return uuid.uuid4().hex * 2


def fcm_token() -> str:
    return f"fcm_{uuid.uuid4().hex}"


# -- the driver alone ---------------------------------------------------------------------------


def test_the_driver_speaks_minifanouts_api_and_translates_preferences():
    driver = load_driver("systems.minifanout.driver:MiniFanoutDriver", {})
    assert isinstance(driver, MiniFanoutDriver)
    nid = str(ULID())
    call = driver.post_event(Event("t-0", "a1", "like", "o1", nid))
    assert (call.method, call.path) == ("POST", "/api/notify")
    assert call.body == {"tenant": "t-0", "actor": "a1", "verb": "like", "target": "o1", "id": nid}
    assert driver.parse_post_event(202, {"id": nid, "recipients": 1, "jobs": 1}) == nid
    with pytest.raises(DriverError):
        driver.parse_post_event(202, {"accepted": True})
    assert (
        driver.inbox_page("t", "u/1", 3, "01J").url
        == "/api/t/t/people/u%2F1/feed?count=3&before=01J"
    )
    page = driver.parse_inbox_page(
        200, {"entries": [{"id": "n2", "actor": "a", "verb": "v", "seen": True}], "before": "n2"}
    )
    assert page.items[0].notification_id == "n2" and page.items[0].read and page.next_cursor == "n2"
    assert driver.parse_unread_count(200, {"unseen": 4}) == (4, False)
    with pytest.raises(DriverError):
        driver.parse_unread_count(200, {"unseen": "4"})
    assert driver.register_device("t", "u", "tok", "fcm").body == {
        "devices": [{"token": "tok", "os": "android"}]
    }
    for unsupported in (
        lambda: driver.mark_read("t", "u", nid),
        lambda: driver.load_users("t", []),
        lambda: driver.register_device("t", "u", "tok", "sms"),
    ):
        with pytest.raises(Unsupported):
            unsupported()
    user = User(
        "t-0",
        "u1",
        "Asia/Kathmandu",
        {"start": "22:00:00", "end": "07:00:30"},
        CONSENT,
        "whole_run",
        None,
        email="u1@example.com",
        email_consent=CONSENT,
    )
    assert settings_from_preferences(preferences_body(user)) == {
        "timezone": "Asia/Kathmandu",
        "dnd": {"from": "22:00:00", "to": "07:00:30"},
        "push": {"enabled": True, "consent": {"at": CONSENT["granted_at"], "version": "1"}},
    }
    denied = User("t-0", "u2", "UTC", None, None, "none", None)
    assert settings_from_preferences(preferences_body(denied))["push"]["consent"] is None


# -- the pure decisions ------------------------------------------------------------------------


def test_minifanout_stands_alone():
    """It imports nothing of the harness, chaos, the emulators or the reference; its driver
    imports only the contract."""
    import ast

    forbidden = ("harness", "chaos", "emulators", "reference_impl", "locustfiles")
    for path in sorted((REPO / "systems").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                if name.split(".")[0] not in forbidden:
                    continue
                allowed = path.name == "driver.py" and name == "harness.contract.driver"
                assert allowed, f"{path.relative_to(REPO)} imports {name}"


def test_quiet_hours_are_read_on_the_persons_own_wall_clock():
    from systems.minifanout.rules import decide, quiet_remaining

    tz = ZoneInfo("Asia/Kathmandu")  # UTC+05:45
    night = {"from": "22:00", "to": "07:00"}
    # 23:00 in Kathmandu is 17:15 UTC: inside the window there, 8 hours before its end.
    at = datetime(2026, 3, 10, 17, 15, tzinfo=UTC)
    assert quiet_remaining(night, tz, at) == 8 * 3600
    assert quiet_remaining(night, ZoneInfo("UTC"), at) is None
    assert quiet_remaining({"from": "07:00", "to": "07:00"}, tz, at) is None  # covers nothing
    assert quiet_remaining({"from": "23:00", "to": "23:00:30"}, tz, at) == 30  # [from, to)
    # New York springs forward on 2026-03-08: 01:30 -> 03:00 local is 1.5 h, not 2.5 h.
    ny = ZoneInfo("America/New_York")
    before_gap = datetime(2026, 3, 8, 1, 30, tzinfo=ny).astimezone(UTC)
    assert quiet_remaining({"from": "22:00", "to": "03:00"}, ny, before_gap) == 1800
    local = datetime(2026, 3, 8, 1, 30, tzinfo=ny)  # the same instant in the zone's own tzinfo
    assert quiet_remaining({"from": "22:00", "to": "03:00"}, ny, local) == 1800
    consented = {
        "timezone": "Asia/Kathmandu",
        "dnd": night,
        "push": {"enabled": True, "consent": {"at": "x", "version": "1"}},
    }
    assert decide(consented, at).action == "defer"
    assert decide(consented, at).delay_s == 900  # SQS's longest delay; deferred again then
    assert decide(consented, at, quiet_hours_utc=True).action == "send"
    assert decide({**consented, "timezone": "Nowhere/Else"}, at).action == "defer"
    assert decide({**consented, "dnd": None}, at).action == "send"


def test_consent_is_default_deny_in_the_decision():
    from systems.minifanout.rules import decide

    at = datetime(2026, 3, 10, 12, tzinfo=UTC)
    no_record = {"timezone": "UTC", "dnd": None, "push": {"enabled": True, "consent": None}}
    switched_off = {
        "timezone": "UTC",
        "dnd": None,
        "push": {"enabled": False, "consent": {"at": "x", "version": "1"}},
    }
    for settings in (None, no_record, switched_off):
        assert decide(settings, at).action == "deny"
    assert decide(no_record, at, consent_default_allow=True).action == "send"
    assert decide(switched_off, at, consent_default_allow=True).action == "deny"


def test_a_job_whose_id_is_no_ulid_is_poison_unless_the_bug_skips_the_check():
    from systems.minifanout.providers import Job

    job = {"tenant": "t", "user": "u1", "id": str(ULID()), "token": apns_token(), "os": "ios"}
    assert Job.parse(json.dumps(job)).id == job["id"]
    bad = json.dumps({**job, "id": "malformed-" + "0" * 32})
    with pytest.raises(ValueError):
        Job.parse(bad)
    assert Job.parse(bad, check_id=False).id.startswith("malformed-")


def test_the_fcm_project_is_sticky_by_the_stated_mapping():
    import zlib

    from systems.minifanout.providers import fcm_project_of

    projects = ("p0", "p1", "p2")
    assert fcm_project_of("user-7", projects, "digits-mod") == "p1"
    for user in ("user-7", "alice", "user-12"):
        crc = fcm_project_of(user, projects, "crc32")
        assert crc == projects[zlib.crc32(user.encode()) % 3]
        assert fcm_project_of(user, projects, "crc32") == crc  # the same every time
    assert fcm_project_of("user-7", ("only",), "crc32") == "only"


def test_the_driver_refuses_erasure_when_told():
    with pytest.raises(Unsupported):
        MiniFanoutDriver({"erasure": False}).erase_user("t", "u")
    assert MiniFanoutDriver().erase_user("t", "u").method == "DELETE"


def test_provider_answers_are_classified():
    from systems.minifanout.providers import Job, apns_outcome, apns_request, fcm_outcome
    from systems.minifanout.rules import backoff_s, retry_after_s

    now = datetime(2026, 3, 10, 12, tzinfo=UTC)
    assert apns_outcome(200, b"", None, now).kind == "delivered"
    assert apns_outcome(410, b'{"reason":"Unregistered"}', None, now).kind == "dead"
    throttled = apns_outcome(429, b'{"reason":"TooManyRequests"}', "3", now)
    assert (throttled.kind, throttled.retry_after_s) == ("retry", 3.0)
    assert apns_outcome(400, b'{"reason":"BadDeviceToken"}', None, now).kind == "rejected"
    unregistered = b'{"error":{"code":404,"details":[{"errorCode":"UNREGISTERED"}]}}'
    assert fcm_outcome(404, unregistered, None, now).kind == "dead"
    assert fcm_outcome(503, b"{}", "Tue, 10 Mar 2026 12:00:05 GMT", now).retry_after_s == 5
    assert fcm_outcome(400, b"{}", None, now).kind == "rejected"
    assert retry_after_s("soon", now) is None
    assert [backoff_s(n) for n in (1, 2, 3, 4, 9)] == [3, 6, 12, 20, 20]
    job = Job("t", "u", "01J0000000000000000000000A", "ab" * 32, "ios", "a", "like", "o")
    assert Job.parse(job.body()) == job
    request = apns_request(job, "http://apns", "topic")
    assert request.headers["apns-collapse-id"] == job.id
    assert b'"tenant_id": "t"' in request.body and b'"notification_id"' in request.body
    for poison in ("[]", "{}", '{"tenant":"t","user":"u","id":"i","token":"x","os":"palm"}'):
        with pytest.raises(ValueError):
            Job.parse(poison)


# -- the processes ------------------------------------------------------------------------------


@contextmanager
def redis_server(port: int, log_dir: Path) -> Iterator[subprocess.Popen[bytes]]:
    log = open(log_dir / f"redis-{port}.log", "ab")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            "redis-server",
            "--bind",
            "127.0.0.1",
            "--port",
            str(port),
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    client = redis.Redis(port=port, socket_connect_timeout=0.5)

    def pings() -> bool:
        try:
            return bool(client.ping())
        except redis.RedisError:
            return proc.poll() is not None and _raise(f"redis-server on {port} exited")

    try:
        wait_for(pings, 20, f"redis-server on {port}")
        yield proc
    finally:
        client.close()
        if proc.poll() is None:
            proc.terminate()
            proc.wait(10)
        log.close()


def _raise(message: str) -> bool:
    raise AssertionError(message)


@dataclass
class Infra:
    log_dir: Path
    redis_port: int
    sqs: EndpointProcess
    apns: Sim
    fcm: Sim
    sqs_client: Any = field(repr=False)


@pytest.fixture(scope="module")
def infra(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Infra]:
    log_dir = tmp_path_factory.mktemp("minifanout")
    port = free_port()
    with (
        redis_server(port, log_dir),
        start_ours() as sqs,
        run_sim("emulators.providers.apns", log_dir) as apns,
        run_sim("emulators.providers.fcm", log_dir) as fcm,
    ):
        client = boto3.client(
            "sqs",
            endpoint_url=sqs.url,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        yield Infra(log_dir, port, sqs, apns, fcm, client)


@dataclass
class System:
    """A running minifanout, the driver and an executor for it, and a tenant of its own."""

    proc: subprocess.Popen[bytes]
    url: str
    queue: str
    stderr: Path
    infra: Infra
    driver: MiniFanoutDriver
    http: HttpExecutor
    argv: list[str] = field(default_factory=list)
    tenant: str = field(default_factory=lambda: f"t{uuid.uuid4().hex[:8]}")

    def call(self, call: Call, expect: int | tuple[int, ...] = (200, 202)) -> Any:
        answer = self.http(call)
        expected = (expect,) if isinstance(expect, int) else expect
        assert answer.status in expected, (call, answer.status, answer.body)
        return answer.body

    def person(
        self,
        user: str,
        *,
        consent: dict[str, str] | None = CONSENT,
        zone: str = "UTC",
        quiet_hours: dict[str, str] | None = None,
        devices: tuple[tuple[str, str], ...] = (),
        settings: bool = True,
    ) -> None:
        """A person as the harness's loader registers one: preferences, then each device."""
        if settings:
            record = User(self.tenant, user, zone, quiet_hours, consent, "none", None)
            self.call(self.driver.set_preferences(self.tenant, user, preferences_body(record)))
        for platform, token in devices:
            self.call(self.driver.register_device(self.tenant, user, token, platform))

    def follow(self, author: str, followers: list[str]) -> None:
        self.call(self.driver.follow(self.tenant, author, followers))

    def post(self, author: str, kind: str = "post") -> str:
        event = Event(self.tenant, author, kind, "o1", str(ULID()))
        return self.driver.parse_post_event(202, self.call(self.driver.post_event(event), 202))

    def rows(self, token: str | None = None) -> list[dict[str, Any]]:
        rows = self.infra.apns.ledger() + self.infra.fcm.ledger()
        return [
            r
            for r in rows
            if r["tenant_id"] == self.tenant and (token is None or r["token"] == token)
        ]

    def delivered(self, token: str, notification_id: str) -> list[dict[str, Any]]:
        return [
            r
            for r in self.rows(token)
            if r["delivered"] and r["notification_id"] == notification_id
        ]

    def health(self) -> dict[str, Any]:
        return self.call(Call("GET", "/api/health"), 200)

    def queue_counts(self, name: str | None = None) -> dict[str, int]:
        sqs = self.infra.sqs_client
        url = sqs.get_queue_url(QueueName=name or self.queue)["QueueUrl"]
        keys = [
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed",
        ]
        attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=keys)["Attributes"]
        return {
            k.removeprefix("ApproximateNumberOfMessages") or "Visible": int(attrs[k]) for k in keys
        }

    def drained(self) -> bool:
        return not any(self.queue_counts().values())

    def log(self) -> str:
        return self.stderr.read_text(errors="replace")


@contextmanager
def minifanout(
    infra: Infra,
    *,
    bugs: tuple[str, ...] = (),
    dedup_port: int | None = None,
    apns: Sim | None = None,
    extra: tuple[str, ...] = (),
) -> Iterator[System]:
    apns = apns or infra.apns
    port = free_port()
    queue = f"mini-{uuid.uuid4().hex[:8]}"
    stderr = infra.log_dir / f"minifanout-{port}.stderr"
    argv = [
        sys.executable,
        "-m",
        "systems.minifanout",
        "--redis",
        f"redis://127.0.0.1:{infra.redis_port}/0",
        "--dedup-redis",
        f"redis://127.0.0.1:{dedup_port or infra.redis_port}/0",
        "--sqs-endpoint",
        infra.sqs.url,
        "--queue",
        queue,
        "--apns-url",
        apns.url,
        "--fcm-url",
        infra.fcm.url,
        "--port",
        str(port),
        "--bugs",
        ",".join(bugs),
        *extra,
    ]
    if apns.cert_dir is not None:
        argv += ["--apns-ca-file", str(apns.ca)]
    # the suite's team key, registered with the simulator for minifanout's bundle
    apns.apns_headers("com.example.minifanout")
    key = SIGNING_KEY.write(infra.log_dir / "apns")
    argv += ["--apns-key", str(key), "--apns-key-id", SIGNING_KEY.key_id]
    argv += ["--apns-team-id", SIGNING_KEY.team_id]
    account = infra.log_dir / "fcm-service-account.json"
    if not account.exists():
        write_service_account_file(account, f"{infra.fcm.url}/token", "minifanout")
    argv += ["--fcm-credentials", str(account)]
    with open(stderr, "wb") as err:
        proc = subprocess.Popen(
            argv,
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
    http = HttpExecutor(f"http://127.0.0.1:{port}", timeout_s=10)
    system = System(
        proc, f"http://127.0.0.1:{port}", queue, stderr, infra, MiniFanoutDriver(), http, argv
    )
    try:

        def up() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"minifanout exited {proc.returncode}:\n{system.log()}")
            try:
                return http(Call("GET", "/api/health")).status == 200
            except httpx.TransportError:  # not listening yet
                return False

        wait_for(up, 30, "minifanout to answer /api/health")
        yield system
    except BaseException:
        failed = True
        raise
    else:
        failed = False
    finally:
        http.close()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
            raise
        if not failed:  # a failure in the test stays the one reported
            assert code == 0, (
                f"minifanout did not stop cleanly on SIGTERM ({code}):\n{system.log()}"
            )
            assert "stopped" in system.log()


@contextmanager
def consumer_process(system: System, name: str) -> Iterator[subprocess.Popen[bytes]]:
    """A second process of the same system running only the consumer (``--role consumer``)."""
    stderr = system.infra.log_dir / f"consumer-{name}-{system.queue}.stderr"
    with open(stderr, "wb") as err:
        proc = subprocess.Popen(
            [*system.argv, "--role", "consumer"],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
    try:
        wait_for(
            lambda: "consumer running" in stderr.read_text() or proc.poll() is not None,
            30,
            "the consumer to start",
        )
        assert proc.poll() is None, stderr.read_text()
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        proc.wait(30)


# -- the promises, and the bugs that break them -------------------------------------------------


def test_a_post_reaches_each_device_once_and_the_feed_reads_back(infra: Infra) -> None:
    with minifanout(infra) as mini:
        phone, tablet, android = apns_token(), apns_token(), fcm_token()
        mini.person("alice", devices=(("apns", phone), ("apns", tablet)))
        mini.person("bob", devices=(("fcm", android),))
        mini.person("carol")  # no device: a feed entry, no push
        mini.follow("star", ["alice", "bob", "carol"])
        posted = [mini.post("star") for _ in range(3)]
        for token in (phone, tablet, android):
            for nid in posted:
                wait_for(lambda t=token, n=nid: mini.delivered(t, n), 20, f"{nid} on {token}")
        wait_for(mini.drained, 20, "the queue to drain")
        rows = mini.rows()
        assert len(rows) == 9 and all(r["status"] == 200 for r in rows)
        # Collapse ids: a redelivered push would replace the first on the device.
        assert all(r["collapse_id"] == r["notification_id"] for r in rows)
        assert {r["project"] for r in rows if r["provider"] == "fcm"} == {"minifanout"}

        # The feed, newest first, two a page, through the driver.
        driver, seen = mini.driver, []
        cursor = None
        for _ in range(3):
            page = driver.parse_inbox_page(
                200, mini.call(driver.inbox_page(mini.tenant, "carol", 2, cursor), 200)
            )
            seen += [item.notification_id for item in page.items]
            assert all(item.author_id == "star" and not item.read for item in page.items)
            cursor = page.next_cursor
            if cursor is None:
                break
        assert seen == sorted(posted, reverse=True)
        unread = mini.call(driver.unread_count(mini.tenant, "carol"), 200)
        assert driver.parse_unread_count(200, unread) == (3, False)
        mini.call(driver.read_all(mini.tenant, "carol"), 200)
        unread = mini.call(driver.unread_count(mini.tenant, "carol"), 200)
        assert driver.parse_unread_count(200, unread) == (0, False)
        later = mini.post("star")
        page = driver.parse_inbox_page(
            200, mini.call(driver.inbox_page(mini.tenant, "carol", 10, None), 200)
        )
        assert [(i.notification_id, i.read) for i in page.items][:2] == [
            (later, False),
            (posted[-1], True),
        ]

        # Erasure: nothing of alice readable, and no push to her after it.
        wait_for(mini.drained, 20, "the queue to drain")
        mini.call(driver.erase_user(mini.tenant, "alice"), 200)
        mini.call(Call("GET", f"/api/t/{mini.tenant}/people/alice"), 404)
        page = driver.parse_inbox_page(
            200, mini.call(driver.inbox_page(mini.tenant, "alice", 10, None), 200)
        )
        assert page.items == ()
        after = mini.post("star")
        wait_for(lambda: mini.delivered(android, after), 20, "bob's push after the erasure")
        wait_for(mini.drained, 20, "the queue to drain")
        assert len(mini.delivered(phone, later)) == 1
        assert not [
            r for r in mini.rows(phone) + mini.rows(tablet) if r["notification_id"] == after
        ]

        # Registered again with the same id and phone, and an event re-sent with a used id:
        # alice's claims went with her (she gets it again), bob's stay (he does not).
        mini.person("alice", devices=(("apns", phone),))
        mini.follow("star", ["alice"])
        resent = Event(mini.tenant, "star", "post", "o1", later)
        assert mini.driver.parse_post_event(202, mini.call(driver.post_event(resent), 202)) == later
        wait_for(lambda: len(mini.delivered(phone, later)) == 2, 20, "alice's second copy")
        wait_for(mini.drained, 20, "the queue to drain")
        assert len(mini.delivered(android, later)) == 1


@pytest.mark.parametrize("bugs", [(), ("consent_default_allow",)], ids=["correct", "bug"])
def test_consent_is_default_deny(infra: Infra, bugs: tuple[str, ...]) -> None:
    with minifanout(infra, bugs=bugs) as mini:
        granted, missing, unset = apns_token(), fcm_token(), apns_token()
        mini.person("yes", devices=(("apns", granted),))
        mini.person("no", consent=None, devices=(("fcm", missing),))
        mini.person("never", settings=False, devices=(("apns", unset),))  # a device, no settings
        mini.follow("star", ["yes", "no", "never"])
        nid = mini.post("star")
        wait_for(lambda: mini.delivered(granted, nid), 20, "the consented push")
        wait_for(mini.drained, 20, "the queue to drain")
        pushed_without_consent = mini.rows(missing) + mini.rows(unset)
        if bugs:
            assert len(pushed_without_consent) == 2
        else:
            assert pushed_without_consent == []
            assert mini.health()["consumer"]["denied"] == 2


def _window_ending_in(seconds: float, zone: str) -> tuple[dict[str, str], float]:
    """A quiet window in ``zone``'s wall clock that began an hour ago and ends ``seconds``
    from now (whole seconds), and the epoch second it ends at."""
    end = (datetime.now(UTC) + timedelta(seconds=seconds)).replace(microsecond=0)
    local_end = end.astimezone(ZoneInfo(zone))
    local_start = local_end - timedelta(hours=1, seconds=seconds)
    window = {"start": local_start.strftime("%H:%M:%S"), "end": local_end.strftime("%H:%M:%S")}
    return window, end.timestamp()


@pytest.mark.parametrize("bugs", [(), ("quiet_hours_utc",)], ids=["correct", "bug"])
def test_quiet_hours_defer_in_the_users_own_zone(infra: Infra, bugs: tuple[str, ...]) -> None:
    with minifanout(infra, bugs=bugs) as mini:
        token = apns_token()
        window, ends_at = _window_ending_in(4, "Asia/Kathmandu")  # UTC+05:45
        mini.person(
            "sleeper", zone="Asia/Kathmandu", quiet_hours=window, devices=(("apns", token),)
        )
        mini.follow("star", ["sleeper"])
        nid = mini.post("star")
        [row] = wait_for(lambda: mini.delivered(token, nid), 20, "the deferred push")
        if bugs:
            assert row["received_at"] < ends_at, "the UTC clock put it outside the window"
        else:
            assert row["received_at"] >= ends_at, (row["received_at"], ends_at)
            assert mini.health()["consumer"]["deferred"] >= 1
        wait_for(mini.drained, 20, "the queue to drain")
        assert len(mini.rows(token)) == 1


@pytest.mark.parametrize("bugs", [(), ("no_dedup",)], ids=["correct", "bug"])
def test_sqs_redelivery_is_sent_once(infra: Infra, bugs: tuple[str, ...]) -> None:
    with minifanout(infra, bugs=bugs) as mini, SqsFaultControl(infra.sqs.url) as sqs_faults:
        tokens = [apns_token(), fcm_token(), apns_token()]
        for n, token in enumerate(tokens):
            platform = "fcm" if token.startswith("fcm_") else "apns"
            mini.person(f"f{n}", devices=((platform, token),))
        mini.follow("star", ["f0", "f1", "f2"])
        # Every receive hands the job out again while it stays visible (up to the DLQ).
        window = sqs_faults.duplicate_delivery(1.0, queues=[mini.queue], seed=7)
        try:
            nid = mini.post("star")
            for token in tokens:
                wait_for(lambda t=token: mini.delivered(t, nid), 20, f"a push to {token}")
            wait_for(mini.drained, 30, "the queue to drain")
        finally:
            sqs_faults.stop(window.id)
        sends = [len(mini.delivered(token, nid)) for token in tokens]
        if bugs:
            assert max(sends) >= 2, sends
        else:
            assert sends == [1, 1, 1]


@pytest.mark.parametrize("bugs", [(), ("keep_dead_tokens",)], ids=["correct", "bug"])
def test_a_dead_token_is_deactivated_and_never_tried_again(
    infra: Infra, bugs: tuple[str, ...]
) -> None:
    with minifanout(infra, bugs=bugs) as mini:
        dead_apns, dead_fcm, live = apns_token(), fcm_token(), fcm_token()
        assert (
            infra.apns.control("POST", "/_sim/tokens/unregistered", {"tokens": [dead_apns]})[0]
            == 200
        )
        assert (
            infra.fcm.control("POST", "/_sim/tokens/unregistered", {"tokens": [dead_fcm]})[0] == 200
        )
        mini.person("gone", devices=(("apns", dead_apns), ("fcm", dead_fcm), ("fcm", live)))
        mini.follow("star", ["gone"])
        for _ in range(2):
            nid = mini.post("star")
            wait_for(lambda n=nid: mini.delivered(live, n), 20, "the live device's push")
            wait_for(mini.drained, 20, "the queue to drain")
        statuses = sorted(r["status"] for r in mini.rows(dead_apns) + mini.rows(dead_fcm))
        devices = mini.call(Call("GET", f"/api/t/{mini.tenant}/people/gone"), 200)["devices"]
        active = {d["token"]: d["active"] for d in devices}
        if bugs:
            assert statuses == [404, 404, 410, 410]
            assert active[dead_apns] and active[dead_fcm]
        else:
            assert statuses == [404, 410]  # once each, then never again
            assert active == {dead_apns: False, dead_fcm: False, live: True}


@pytest.mark.parametrize("bugs", [(), ("fail_open",)], ids=["correct", "bug"])
def test_the_dedup_store_down_fails_closed(infra: Infra, bugs: tuple[str, ...]) -> None:
    dedup_port = free_port()
    with redis_server(dedup_port, infra.log_dir) as dedup:
        with minifanout(infra, bugs=bugs, dedup_port=dedup_port) as mini:
            token = apns_token()
            mini.person("f", devices=(("apns", token),))
            mini.follow("star", ["f"])
            dedup.terminate()
            dedup.wait(10)
            nid = mini.post("star")  # the API's data store is up: the event is accepted
            if bugs:
                wait_for(lambda: mini.delivered(token, nid), 20, "a blind send")
                return
            wait_for(
                lambda: mini.health()["consumer"].get("dedup_unavailable", 0) >= 1,
                20,
                "the consumer to meet the dead dedup store",
            )
            assert mini.rows(token) == []
            assert mini.queue_counts()["NotVisible"] == 1  # left on the queue, not acked
            with redis_server(dedup_port, infra.log_dir):
                wait_for(lambda: mini.delivered(token, nid), 30, "the push once the store is back")
                wait_for(mini.drained, 20, "the queue to drain")
                assert len(mini.rows(token)) == 1
                assert "dedup store unavailable" in mini.log()


@pytest.mark.parametrize("bugs", [(), ("ack_before_send",)], ids=["correct", "bug"])
def test_a_provider_error_leaves_the_job_for_a_retry(infra: Infra, bugs: tuple[str, ...]) -> None:
    with minifanout(infra, bugs=bugs) as mini:
        token = apns_token()
        mini.person("f", devices=(("apns", token),))
        mini.follow("star", ["f"])
        fault = infra.apns.start_fault("status", {"status": 500, "tokens": [token]})
        try:
            nid = mini.post("star")
            wait_for(
                lambda: [r for r in mini.rows(token) if r["status"] == 500],
                20,
                "APNs to answer 500",
            )
        finally:
            infra.apns.stop_fault(fault["id"])
        if bugs:
            wait_for(mini.drained, 20, "the queue to drain")
            assert mini.delivered(token, nid) == []  # deleted before the send: lost
        else:
            wait_for(lambda: mini.delivered(token, nid), 30, "the retried push")
            wait_for(mini.drained, 20, "the queue to drain")
            assert len(mini.delivered(token, nid)) == 1


def test_retry_after_holds_every_request_to_that_provider(infra: Infra) -> None:
    with minifanout(infra) as mini:
        throttled, other, android = apns_token(), apns_token(), fcm_token()
        mini.person("f0", devices=(("apns", throttled),))
        mini.person("f1", devices=(("apns", other), ("fcm", android)))
        mini.follow("a0", ["f0"])
        mini.follow("a1", ["f1"])
        fault = infra.apns.start_fault(
            "status", {"status": 429, "retry_after": 3, "tokens": [throttled]}
        )
        try:
            first = mini.post("a0")
            [answer] = wait_for(lambda: mini.rows(throttled), 20, "APNs to answer 429")
        finally:
            infra.apns.stop_fault(fault["id"])  # one 429, then APNs would take everything
        assert answer["status"] == 429
        # A job that comes after the 429 waits for the Retry-After too: APNs as a whole said
        # so, not one token. FCM is another scope and goes at once.
        second = mini.post("a1")
        [held] = wait_for(lambda: mini.delivered(other, second), 20, "the held push")
        [fcm] = wait_for(lambda: mini.delivered(android, second), 20, "the FCM push")
        assert held["received_at"] >= answer["answered_at"] + 3
        assert fcm["received_at"] < answer["answered_at"] + 3
        wait_for(lambda: mini.delivered(throttled, first), 30, "the throttled push, later")
        retried = [r for r in mini.rows(throttled) if r["status"] == 200]
        assert retried[0]["received_at"] >= answer["answered_at"] + 3


def test_apns_over_tls_with_a_ca_file(infra: Infra) -> None:
    with run_sim("emulators.providers.apns", infra.log_dir, tls=True) as tls_apns:
        with minifanout(infra, apns=tls_apns) as mini:
            token = apns_token()
            mini.person("f", devices=(("apns", token),))
            mini.follow("star", ["f"])
            nid = mini.post("star")
            wait_for(
                lambda: [r for r in tls_apns.ledger() if r["notification_id"] == nid],
                20,
                "the push over TLS",
            )
            [row] = tls_apns.ledger()
            assert (row["status"], row["tenant_id"], row["collapse_id"]) == (200, mini.tenant, nid)


def test_bad_requests_get_json_4xx_and_lose_nothing(infra: Infra) -> None:
    with minifanout(infra) as mini:
        person = f"/api/t/{mini.tenant}/people/u1"
        cases = [
            (
                Call(
                    "POST",
                    "/api/notify",
                    {"tenant": mini.tenant, "actor": "a", "verb": "v", "id": "not-a-ulid"},
                ),
                400,
                "ULID",
            ),
            (
                Call("POST", "/api/notify", {"tenant": "bad tenant", "actor": "a", "verb": "v"}),
                400,
                "tenant",
            ),
            (Call("PUT", person, {"settings": {"timezone": "Mars/Olympus"}}), 400, "IANA"),
            (
                Call("PUT", person, {"settings": {"dnd": {"from": "25:00", "to": "07:00"}}}),
                400,
                "HH:MM",
            ),
            (Call("PUT", person, {"devices": [{"token": "x", "os": "symbian"}]}), 400, "os"),
            (Call("POST", f"{person}/followers", {"add": []}), 400, "add"),
            (Call("GET", f"{person}/feed", query={"count": "0"}), 400, "count"),
            (Call("GET", "/api/nowhere"), 404, ""),
            (Call("PATCH", person, {}), 405, ""),
        ]
        for call, status, words in cases:
            answer = mini.http(call)
            assert answer.status == status and isinstance(answer.body, dict), (call, answer)
            assert words in answer.body["error"], answer.body
        raw = mini.http.http.put(
            person, content=b"{not json", headers={"content-type": "application/json"}
        )
        assert raw.status_code == 400 and "JSON" in raw.json()["error"]
        big = mini.http.http.post("/api/notify", content=b"x" * (2 << 20))
        assert big.status_code == 413 and "error" in big.json()
        # Nothing refused was stored; a good call still works.
        mini.call(Call("GET", person), 404)
        mini.person("u1")
        assert mini.call(Call("GET", person), 200)["settings"]["timezone"] == "UTC"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--redis", "http://x"], "--redis: expected a redis"),
        (["--bugs", "no_dedup,telepathy"], "unknown telepathy"),
        (["--host", "0.0.0.0"], "loopback only"),
        (["--port", "70000"], "not a TCP port"),
    ],
)
def test_a_bad_command_line_exits_2(args: list[str], message: str) -> None:
    base = {
        "--redis": "redis://127.0.0.1:1",
        "--apns-url": "http://127.0.0.1:1",
        "--fcm-url": "http://127.0.0.1:1",
        "--port": "1",
    }
    for flag, value in zip(args[::2], args[1::2], strict=True):
        base[flag] = value
    argv = [a for pair in base.items() for a in pair]
    result = subprocess.run(
        [sys.executable, "-m", "systems.minifanout", *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 2 and message in result.stderr, result.stderr


def test_a_taken_port_exits_2(infra: Infra) -> None:
    with minifanout(infra) as mini:
        port = mini.url.rsplit(":", 1)[1]
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "systems.minifanout",
                "--redis",
                f"redis://127.0.0.1:{infra.redis_port}",
                "--sqs-endpoint",
                infra.sqs.url,
                "--queue",
                mini.queue,
                "--apns-url",
                infra.apns.url,
                "--fcm-url",
                infra.fcm.url,
                "--port",
                port,
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        assert result.returncode == 2 and "cannot listen" in result.stderr, result.stderr


def test_the_target_file_names_the_driver_and_the_queues():
    import yaml

    from systems.minifanout.config import DEAD_SUFFIX, DEFAULT_QUEUE

    target = yaml.safe_load((REPO / "targets" / "minifanout.yaml").read_text())
    driver = load_driver(target["driver"], target["driver_options"])
    assert isinstance(driver, MiniFanoutDriver)
    assert target["queues"] == {
        "work": {"push": DEFAULT_QUEUE},
        "dead": {"push": DEFAULT_QUEUE + DEAD_SUFFIX},
        "poison": {"push": "mini-poison"},
    }
    assert target["dedup_redis"] != target["dedup_listen"]
    # The command line it shows is the one the file describes (queues, mapping, projects).
    text = (REPO / "targets" / "minifanout.yaml").read_text()
    assert "--poison-queue mini-poison" in text and "--fcm-mapping crc32" in text
    assert "--fcm-projects " + ",".join(target["policy"]["fcm_projects"]) in text
    parse_target(target, "targets/minifanout.yaml")


@pytest.mark.slow
def test_measure_a_celebrity_burst(infra: Infra) -> None:
    """Figures for the README: ``pytest -m slow tests/test_minifanout.py -k burst -s``."""
    followers = 2000
    with minifanout(infra) as mini:
        tokens = []
        for n in range(followers):
            token = apns_token() if n % 2 else fcm_token()
            mini.person(f"f{n}", devices=(("apns" if n % 2 else "fcm", token),))
            tokens.append(token)
        for start in range(0, followers, 1000):
            mini.follow("star", [f"f{n}" for n in range(start, min(start + 1000, followers))])
        cpu_before = _cpu_seconds(mini.proc.pid)
        began = time.monotonic()
        nid = mini.post("star")
        accepted = time.monotonic() - began

        def delivered() -> int:
            return sum(1 for r in mini.rows() if r["notification_id"] == nid and r["delivered"])

        wait_for(lambda: delivered() == followers, 300, "every push of the burst")
        drained = time.monotonic() - began
        cpu = _cpu_seconds(mini.proc.pid) - cpu_before
        wait_for(mini.drained, 60, "the queue to drain")
        assert delivered() == followers
        print(
            f"\nminifanout burst: {followers} followers, POST answered in {accepted:.2f} s "
            f"(fan-out in the request), all delivered in {drained:.1f} s "
            f"({followers / drained:.0f} pushes/s, one consumer, 4 receive loops); the "
            f"minifanout process used {cpu:.1f} s of CPU ({cpu / followers * 1000:.1f} ms a "
            f"push, API included); load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} "
            "cores"
        )


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_consumer_killed_mid_send_is_replaced_and_the_job_finished(infra: Infra) -> None:
    """API and consumer as two commands; kill -9 of the consumer while APNs holds a send: the
    job comes back, the claim's lease ends, a new consumer sends it again with the same
    collapse id (the duplicate the design admits for a crash between send and 'sent')."""
    with minifanout(infra, extra=("--role", "api", "--visibility-timeout", "5")) as mini:
        assert "consumer" not in mini.health()  # this process runs no consumer
        token = apns_token()
        mini.person("f", devices=(("apns", token),))
        mini.follow("star", ["f"])
        fault = infra.apns.start_fault("latency", {"ms": 3000, "tokens": [token]})
        try:
            with consumer_process(mini, "first") as first:
                nid = mini.post("star")
                wait_for(lambda: mini.rows(token), 20, "the send to reach APNs")
                first.send_signal(signal.SIGKILL)  # before the answer: no 'sent' mark
                first.wait(10)
        finally:
            infra.apns.stop_fault(fault["id"])
        [held] = mini.rows(token)
        with consumer_process(mini, "second") as second:
            wait_for(lambda: len(mini.delivered(token, nid)) == 2, 40, "the job sent again")
            wait_for(mini.drained, 20, "the queue to drain")
            second.send_signal(signal.SIGTERM)
            assert second.wait(30) == 0
        again = mini.delivered(token, nid)[1]
        assert {r["collapse_id"] for r in mini.rows(token)} == {nid}
        # Not before the first claim's lease (15 s) ended: no second copy while one was sending.
        assert again["received_at"] >= held["received_at"] + 15
