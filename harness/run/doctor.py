"""``python -m harness doctor --target FILE``: a target file probed before any load.

A team writes its target file from the docs; what it gets wrong there surfaces in a run as
counts with no hint (a wrong payload key: every push lost and unexpected at once). The doctor
tries the contract for real, with a handful of users of its own (tenant ``doctor-<hex>-0``)
and says in plain words what is off:

* every endpoint the file names answers;
* every queue it names exists;
* every driver operation it offers works and its answer reads back;
* a test push reaches the APNs and the FCM simulators with the tenant and notification ids where
  the file says (``payload_ids``), to the FCM project its mapping names (``fcm_mapping``);
* the push left a dedup key that ``policy.dedup_key_pattern`` matches;
* the process hooks it declares (named, not run: they are destructive).

It uses the target's long-lived environment when one is up (``harness env up``), else starts
the parts the file places and stops them after.
"""

from __future__ import annotations

import fnmatch
import random
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import redis

from harness.contract.driver import Call, DriverError, Event, HttpExecutor, Unsupported
from harness.model.fcm_mapping import project_function
from harness.model.population import Device, PopulationSpec, User, generate, preferences_body
from harness.run.provider_control import SimulatorControl
from harness.stack import environment
from harness.stack.supervisor import Stack, StackError, StackInfo
from harness.stack.target import Target, unreachable

PUSH_WAIT_S = 30.0
KEY_SCAN_CAP = 200_000


@dataclass(frozen=True)
class Finding:
    check: str
    status: str  # ok, problem, note
    line: str


class Doctor:
    def __init__(self, target: Target, say: Callable[[Finding], None] = lambda f: None) -> None:
        self.target = target
        self.say = say
        self.findings: list[Finding] = []

    def _add(self, check: str, status: str, line: str) -> None:
        finding = Finding(check, status, line)
        self.findings.append(finding)
        self.say(finding)

    def ok(self, check: str, line: str) -> None:
        self._add(check, "ok", line)

    def problem(self, check: str, line: str) -> None:
        self._add(check, "problem", line)

    def note(self, check: str, line: str) -> None:
        self._add(check, "note", line)

    @property
    def problems(self) -> list[Finding]:
        return [f for f in self.findings if f.status == "problem"]

    # -- the checks ------------------------------------------------------------------------

    def examine(self) -> list[Finding]:
        why = unreachable(self.target)
        if why:
            self.problem("endpoints", f"{self.target.name}: {why}")
            return self.findings
        self.ok("endpoints", "every endpoint the file names answers")
        attached = environment.running(self.target)
        workdir = Path(tempfile.mkdtemp(prefix="harness-doctor-"))
        stack = Stack(workdir, target=self.target, attach=attached)
        try:
            info = stack.up()
        except StackError as exc:
            self.problem("parts", f"the harness's parts could not start: {exc}")
            return self.findings
        try:
            how = "its long-lived environment" if attached else "parts started for the doctor"
            self.ok("parts", f"simulators and proxies on the file's addresses ({how})")
            environment.tell_payload_ids(info, self.target)
            self._queues(info)
            self._push_path(info)
            self._hooks()
        finally:
            stack.down()
        return self.findings

    def _queues(self, info: StackInfo) -> None:
        contract = self.target.contract(info)
        queues = contract.queues
        if queues is None:
            self.note("queues", "no sqs_endpoint: queue checkers and redrive are off")
            return
        sqs = info.aws_client("sqs")
        missing = []
        named = 0
        for kind, names in (
            ("work", queues.work),
            ("dead", queues.dead),
            ("poison", queues.poison),
        ):
            for channel, name in names.items():
                if self.target.queues is None and channel != "push":
                    continue  # the default naming lists every channel; push is the one needed
                named += 1
                try:
                    sqs.get_queue_url(QueueName=name)
                except sqs.exceptions.QueueDoesNotExist:
                    missing.append(f"{name} (queues.{kind}.{channel})")
                except Exception as exc:  # an endpoint that refuses the call altogether
                    self.problem("queues", f"SQS at {self.target.sqs_endpoint}: {exc}")
                    return
        for name in missing:
            self.problem("queues", f"queue {name} does not exist at {self.target.sqs_endpoint}")
        if not missing:
            self.ok("queues", f"the {named} queue(s) the file names exist")

    def _push_path(self, info: StackInfo) -> None:
        contract = self.target.contract(info)
        driver = contract.driver
        offered = contract.operations()
        author, followers, devices = _doctor_users()
        tenant = author.tenant_id
        before = self._dedup_keys()
        apns = SimulatorControl(info.url("apns"), info.tls_ca)
        fcm = SimulatorControl(info.url("fcm"))
        for control in (apns, fcm):
            control.new_rows()  # what was there already is not the test push's
        with HttpExecutor(contract.api_url) as execute:

            def call(operation: str, make: Callable[[], Call]) -> Any:
                try:
                    built = make()
                except Unsupported:
                    return None
                try:
                    answer = execute(built)
                except httpx.HTTPError as exc:
                    self.problem("driver", f"{operation}: {type(exc).__name__}: {exc}")
                    return None
                if answer.status >= 300:
                    self.problem(
                        "driver",
                        f"{operation} ({built.method} {built.path}) answered {answer.status}: "
                        f"{str(answer.body)[:200]}",
                    )
                    return None
                return answer

            for user in (author, *followers):
                call("set_preferences",
                     lambda u=user: driver.set_preferences(tenant, u.user_id, preferences_body(u)))  # fmt: skip
            for device in devices:
                call("register_device", lambda d=device: driver.register_device(
                    tenant, d.user_id, d.token, d.platform))  # fmt: skip
            call("follow", lambda: driver.follow(tenant, author.user_id,
                                                 [u.user_id for u in followers]))  # fmt: skip
            sent = time.time()
            answer = call("post_event", lambda: driver.post_event(
                Event(tenant, author.user_id, "post", "doctor", str(_ulid()))))  # fmt: skip
            if answer is None:
                return
            try:
                nid = driver.parse_post_event(answer.status, answer.body)
            except DriverError as exc:
                self.problem("driver", f"post_event's answer does not read back: {exc}")
                return
            self._await_pushes(apns, fcm, tenant, nid, devices, sent)
            self._dedup(before)
            self._read_side(call, driver, offered, tenant, followers[0].user_id, nid)
            if "erase_user" in offered:
                for user in (author, *followers):  # also the doctor's own clean-up
                    call("erase_user", lambda u=user: driver.erase_user(tenant, u.user_id))
        for control in (apns, fcm):
            control.close()
        self.ok("driver", f"operations tried: {', '.join(sorted(offered))}")

    def _await_pushes(
        self,
        apns: SimulatorControl,
        fcm: SimulatorControl,
        tenant: str,
        nid: str,
        devices: list[Device],
        sent: float,
    ) -> None:
        wanted = {d.token: d for d in devices}
        rows: dict[str, dict[str, Any]] = {}
        refused: dict[str, dict[str, Any]] = {}
        deadline = time.monotonic() + PUSH_WAIT_S
        while time.monotonic() < deadline and len(rows) < len(wanted):
            for control in (apns, fcm):
                for row in control.new_rows():
                    if row.get("token") not in wanted:
                        continue
                    if row.get("status") == 200:
                        rows.setdefault(str(row["token"]), row)
                    else:
                        refused[str(row["token"])] = row
            time.sleep(0.25)
        for token, device in wanted.items():
            provider = "APNs" if device.platform == "apns" else "FCM"
            listen = (
                self.target.apns_listen if device.platform == "apns" else self.target.fcm_listen
            )
            row = rows.get(token)
            if row is None and token in refused:
                answer = refused[token]
                reason = answer.get("reason") or answer.get("status")
                self.problem(
                    "push",
                    f"{provider} refused the test push: {answer.get('status')} {reason}"
                    f"{REFUSALS.get(str(reason), '')}",
                )
                continue
            if row is None:
                self.problem(
                    "push",
                    f"no {provider} push for the test notification reached {listen} within "
                    f"{PUSH_WAIT_S:.0f} s: is the system's {provider} host set there, does it "
                    "send on a post to a follower with consent and a device?",
                )
                continue
            paths = self.target.payload_paths(device.platform)
            wrong = [
                f"{field} at '{paths[field]}' read {row.get(field)!r}, not {want!r}"
                for field, want in (("tenant_id", tenant), ("notification_id", nid))
                if str(row.get(field)) != want
            ]
            if wrong:
                self.problem(
                    "payload_ids",
                    f"the {provider} push arrived but its ids are not where the file says: "
                    + "; ".join(wrong)
                    + f" (state payload_ids.{device.platform} in the target file)",
                )
            else:
                self.ok(
                    "payload_ids",
                    f"{provider} push arrived {row['received_at'] - sent:.1f} s after the "
                    "event, ids where the file says",
                )
            if device.platform == "fcm":
                self._fcm_project(tenant, device.user_id, row.get("project"))

    def _fcm_project(self, tenant: str, user: str, project: Any) -> None:
        policy = self.target.contract(None).policy
        mapping = project_function(policy.fcm_mapping, policy.fcm_projects)
        if mapping is None:
            if len(policy.fcm_projects) > 1:
                self.note(
                    "fcm_mapping",
                    "several fcm_projects and no fcm_mapping: stickiness is judged, not which",
                )
            return
        expected = mapping(tenant, user)
        if expected is not None and str(project) != expected:
            self.problem(
                "fcm_mapping",
                f"the FCM push went to project {project!r}; fcm_mapping "
                f"'{policy.fcm_mapping}' names {expected!r} for {user}",
            )
        else:
            self.ok("fcm_mapping", f"the FCM push went to {project!r}, as fcm_mapping says")

    def _dedup_url(self) -> str | None:
        if not self.target.dedup_redis:
            return None
        return f"redis://{self.target.dedup_redis}/0"

    def _dedup_keys(self) -> set[bytes] | None:
        url = self._dedup_url()
        if url is None:
            return None
        try:
            client = redis.Redis.from_url(url, socket_timeout=5)
            keys = set()
            for key in client.scan_iter(count=1000):
                keys.add(key)
                if len(keys) >= KEY_SCAN_CAP:
                    break
            client.close()
            return keys
        except redis.RedisError as exc:
            self.problem("dedup", f"the dedup store at {self.target.dedup_redis}: {exc}")
            return None

    def _dedup(self, before: set[bytes] | None) -> None:
        pattern = self.target.contract(None).policy.dedup_key_pattern
        if before is None:
            self.note("dedup", "no dedup_redis: dedup_window is off")
            return
        after = self._dedup_keys() or set()
        new = sorted(k.decode(errors="replace") for k in after - before)
        if not new:
            self.problem(
                "dedup",
                f"no new key in the dedup store at {self.target.dedup_redis} after the test "
                "push: is the system's dedup store behind dedup_listen?",
            )
            return
        glob = (pattern or "").replace("${tenant_prefix}", "doctor-*")
        matching = [k for k in new if fnmatch.fnmatchcase(k, glob)]
        if not matching:
            self.problem(
                "dedup_key_pattern",
                f"{len(new)} new key(s) after the test push (e.g. {new[0]!r}), none matching "
                f"dedup_key_pattern {pattern!r}",
            )
        else:
            self.ok("dedup_key_pattern", f"{len(matching)} new key(s) match {pattern!r}")

    def _read_side(
        self,
        call: Callable[[str, Callable[[], Call]], Any],
        driver: Any,
        offered: set[str],
        tenant: str,
        user: str,
        nid: str,
    ) -> None:
        if "inbox" in offered:
            answer = call("inbox", lambda: driver.inbox_page(tenant, user, 10, None))
            if answer is not None:
                try:
                    page = driver.parse_inbox_page(answer.status, answer.body)
                except DriverError as exc:
                    self.problem("driver", f"an inbox page does not read back: {exc}")
                else:
                    if nid not in {i.notification_id for i in page.items}:
                        self.note("inbox", "the test notification is not (yet) in the inbox")
        if "unread" in offered:
            answer = call("unread", lambda: driver.unread_count(tenant, user))
            if answer is not None:
                try:
                    driver.parse_unread_count(answer.status, answer.body)
                except DriverError as exc:
                    self.problem("driver", f"an unread count does not read back: {exc}")
        if "mark_read" in offered:
            call("mark_read", lambda: driver.mark_read(tenant, user, nid))
        if "read_all" in offered:
            call("read_all", lambda: driver.read_all(tenant, user))

    def _hooks(self) -> None:
        roles = sorted((self.target.processes or {}).items())
        if not roles:
            self.note("processes", "no process hooks: consumer-crash and dedup-crash are off")
            return
        for role, hooks in roles:
            self.note("processes", f"{role}: {', '.join(sorted(hooks))} (not run: destructive)")


# What a provider's refusal asks of the team, in plain words.
REFUSALS = {
    "MissingProviderToken": ": send an ES256 provider token (authorization: bearer <JWT>)",
    "InvalidProviderToken": (
        ": the token is not signed by a key Apple has for its team: sign with the "
        "environment's key, or list yours in apns_keys (file, key_id, team_id)"
    ),
    "ExpiredProviderToken": ": the token was issued more than an hour ago; renew it",
    "TooManyProviderTokenUpdates": (
        ": a new token on the same connection within 20 minutes; sign once, reuse it"
    ),
    "MissingTopic": ": send apns-topic, the app's bundle",
    "TopicDisallowed": ": apns-topic is not a bundle of the key's team (apns_topic)",
    "DeviceTokenNotForTopic": ": the device token belongs to the bundle in apns_topic",
    "InvalidPushType": ": send apns-push-type (alert for a notification)",
    "UNAUTHENTICATED": (
        ": send an OAuth2 access token from the FCM simulator's /token (a service-account "
        "file whose token_uri points there)"
    ),
}


def _ulid() -> str:
    from ulid import ULID

    return str(ULID())


def _doctor_users() -> tuple[User, list[User], list[Device]]:
    """An author and two followers of a tenant of the doctor's own, with consent, no quiet
    window, and one live device each: one APNs, one FCM."""
    prefix = f"doctor-{uuid.uuid4().hex[:6]}"
    spec = PopulationSpec(tenants=1, users_per_tenant=60, celebrity_followers=10,
                          regular_authors=1, regular_followers=5)  # fmt: skip
    population = generate(random.randrange(2**31), datetime.now(UTC), spec, prefix)
    author = population.authors[0]
    author_user = population.user(author.tenant_id, author.user_id)

    def ready(user: User, platform: str) -> Device | None:
        if user.consent is None or user.quiet_state != "none" or user.user_id == author.user_id:
            return None
        live = [d for d in population.devices_of(user.tenant_id, user.user_id) if not d.dead]
        if len(live) != 1 or live[0].platform != platform:
            return None
        return live[0]

    followers: list[User] = []
    devices: list[Device] = []
    for platform in ("apns", "fcm"):
        user, device = next(_each(population.users, lambda u, p=platform: ready(u, p)))
        followers.append(user)
        devices.append(device)
    return author_user, followers, devices


def _each(users: Iterable[User], pick: Callable[[User], Device | None]) -> Any:
    for user in users:
        device = pick(user)
        if device is not None:
            yield user, device


def run_doctor(target: Target, say: Callable[[Finding], None]) -> list[Finding]:
    return Doctor(target, say).examine()
