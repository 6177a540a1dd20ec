"""Locust users and the load-plan shape, shared by every file in ``locustfiles/``.

The same code runs under plain ``locust -f locustfiles/<shape>.py --headless`` (against the
stack file, or ``--host``) and under ``python -m harness run`` (``harness.load.loadgen`` drives it
through Locust's library API, locally or with Locust's own master and workers).

Each user records what it did for the oracle (:mod:`harness.load.record`): every event before
it is sent and again when answered (``injected.jsonl``), every inbox page, read-all, per-item
read and unread count it saw (``reads.jsonl``); locally into ``<out>/``; on a Locust worker into
its own files and as messages to the master, which writes the same files. Celebrities are
claimed the same way, so two workers never post as the same celebrity.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import gevent
import gevent.pool
from gevent.event import AsyncResult
from locust import FastHttpUser, LoadTestShape, User, constant_throughput, events, task
from locust.env import Environment
from locust.runners import MasterRunner, WorkerRunner
from ulid import ULID

from harness.contract.driver import (
    Call,
    Driver,
    DriverError,
    Event,
    FanoutApiDriver,
    InboxItem,
    Unsupported,
    load_driver,
)
from harness.load.record import RecordFiles
from harness.model.population import Author as PopulationAuthor
from harness.model.population import Population, PopulationSpec, generate, preferences_body
from harness.model.shapes import LoadPlan, celebrity_post_times, like_times, users_at

_RECORD_MESSAGE = "harness_record"
_CLAIM_MESSAGE = "harness_claim"
_CLAIMED_MESSAGE = "harness_claimed"


class LoadContext:
    """What every user of this process shares: the plan, the population, where to record."""

    def __init__(
        self,
        plan: LoadPlan,
        population: Population,
        record: Callable[[str, dict], None],
        driver: Driver | None = None,
    ):
        self.plan = plan
        self.population = population
        self.record = record
        # How the system's API is reached (its contract's driver; the Event API's by default).
        self.driver = driver or FanoutApiDriver()
        self.regular = [a for a in population.authors if not a.celebrity]
        self.celebrities = [a for a in population.authors if a.celebrity]
        # Readers are followers (their inboxes hold something to walk), drawn author first so
        # that a regular author's few followers are read as often as a celebrity's many.
        self.audiences = [
            (a.tenant_id, sorted(a.followers)) for a in population.authors if a.followers
        ]
        self._walks = itertools.count()
        self.started = time.monotonic()
        self._claims: dict[str, itertools.count] = {}
        self.claim: Callable[[str], int] = self._claim_locally

    def _claim_locally(self, what: str) -> int:
        return next(self._claims.setdefault(what, itertools.count()))

    def walk_id(self) -> str:
        return f"{os.getpid()}-{next(self._walks)}"


_context: LoadContext | None = None


def context() -> LoadContext:
    if _context is None:
        raise RuntimeError("the load context is built on Locust's init event; run through locust")
    return _context


class WorkerRelay:
    """On a Locust worker: rows batched to the master every 200 ms (and at stop)."""

    def __init__(self, runner: WorkerRunner) -> None:
        self.runner = runner
        self.pending: list[tuple[str, dict]] = []
        self._loop = gevent.spawn(self._flush_forever)

    def add(self, stream: str, row: dict) -> None:
        self.pending.append((stream, row))

    def flush(self) -> None:
        if self.pending:
            rows, self.pending = self.pending, []
            self.runner.send_message(_RECORD_MESSAGE, rows)

    def _flush_forever(self) -> None:
        while True:
            gevent.sleep(0.2)
            self.flush()


# -- command line and setup -----------------------------------------------------------------


@events.init_command_line_parser.add_listener
def _arguments(parser: Any) -> None:
    group = parser.add_argument_group("harness")
    group.add_argument(
        "--harness-population",
        env_var="HARNESS_POPULATION",
        default="",
        help="population.json (the oracle); default: generate one from --harness-seed and load "
        "it into the target before the run",
    )
    group.add_argument(
        "--harness-plan", env_var="HARNESS_PLAN", default="{}", help="load plan JSON overrides"
    )
    group.add_argument(
        "--harness-out", env_var="HARNESS_OUT", default="", help="where injected.jsonl goes"
    )
    group.add_argument("--harness-seed", env_var="HARNESS_SEED", type=int, default=1)
    group.add_argument(
        "--harness-driver",
        env_var="HARNESS_DRIVER",
        default="",
        help="the system's driver class, package.module:Class (default: the Event API's)",
    )
    group.add_argument(
        "--harness-driver-options", env_var="HARNESS_DRIVER_OPTIONS", default="{}",
        help="the driver's options, JSON",
    )  # fmt: skip


def default_host() -> str | None:
    """The Event API of the stack in the stack file, when one is up."""
    from harness.stack.supervisor import StackError, StackInfo, stack_file_path

    try:
        return StackInfo.read(stack_file_path()).url("event-api")
    except (StackError, OSError, KeyError):
        return None


def _population(options: Any, is_master_or_local: bool, host: str | None) -> Population:
    if options.harness_population:
        return Population.load(Path(options.harness_population))
    population = generate(options.harness_seed, datetime.now(UTC), PopulationSpec())
    if is_master_or_local:
        # Plain `locust -f`: the population is ours to create. Workers generate the same one
        # from the same seed (ids do not depend on the clock), and only the master loads it.
        from harness.load.loader import load_population

        if not host:
            raise SystemExit(
                "harness: no --host and no stack file; run `python -m harness stack up`"
            )
        load_population(host, population)
        out = Path(options.harness_out or "reports/locust")
        out.mkdir(parents=True, exist_ok=True)
        population.save(out / "population.json")
    return population


def setup(environment: Environment, shape_name: str | None = None) -> LoadContext:
    """Build this process's load context and fit the user classes to the plan (its shape from
    ``shape_name`` when a locustfile fixes one, else from the plan, ``celebrity_burst`` by
    default)."""
    global _context
    options = environment.parsed_options
    values = json.loads(options.harness_plan or "{}")
    if shape_name is not None:
        values["shape"] = shape_name
    plan = LoadPlan.from_mapping(values)
    runner = environment.runner
    local_or_master = not isinstance(runner, WorkerRunner)
    # One local process replays its choices from the seed; a worker also mixes in its pid, so
    # workers do not all pick the same authors (a distributed run repeats its plan, not its
    # exact choices).
    random.seed(
        options.harness_seed if local_or_master else f"{options.harness_seed}-{os.getpid()}"
    )
    host = environment.host or default_host()
    population = _population(options, local_or_master, host)
    out = Path(options.harness_out or "reports/locust")

    if isinstance(runner, WorkerRunner):
        # The worker's own files first (nothing in flight is lost if the relay is cut short),
        # then the relay to the master.
        relay = WorkerRelay(runner)
        local = RecordFiles(out, worker=os.getpid())

        def record(stream: str, row: dict) -> None:
            local.write(stream, [row])
            relay.add(stream, row)

        events.test_stopping.add_listener(lambda **_: relay.flush())
        events.test_stop.add_listener(lambda **_: relay.flush())
        events.quitting.add_listener(lambda **_: (relay.flush(), local.close()))
    else:
        sink = RecordFiles(out)

        def record(stream: str, row: dict) -> None:
            sink.write(stream, [row])

        events.quitting.add_listener(lambda **_: sink.close())
    driver = load_driver(
        options.harness_driver or None, json.loads(options.harness_driver_options or "{}")
    )
    _context = LoadContext(plan, population, record, driver)
    # Plan offsets count from the start of the load, not from process start.
    events.test_start.add_listener(lambda **_: setattr(_context, "started", time.monotonic()))

    if isinstance(runner, MasterRunner):

        def relayed(msg: Any, **_: Any) -> None:
            for stream, row in msg.data:
                sink.write(stream, [row])

        runner.register_message(_RECORD_MESSAGE, relayed)
        runner.register_message(
            _CLAIM_MESSAGE,
            lambda msg, **_: runner.send_message(
                _CLAIMED_MESSAGE,
                {"id": msg.data["id"], "index": _context._claim_locally(msg.data["what"])},
                client_id=msg.node_id,
            ),
        )
    if isinstance(runner, WorkerRunner):
        waiting: dict[str, AsyncResult] = {}
        runner.register_message(
            _CLAIMED_MESSAGE, lambda msg, **_: waiting.pop(msg.data["id"]).set(msg.data["index"])
        )

        def claim_from_master(what: str) -> int:
            request = f"{os.getpid()}-{random.getrandbits(64):x}"
            waiting[request] = AsyncResult()
            runner.send_message(_CLAIM_MESSAGE, {"id": request, "what": what})
            return waiting[request].get(timeout=30)

        _context.claim = claim_from_master

    fit_user_classes(environment, plan)
    return _context


def fit_user_classes(environment: Environment, plan: LoadPlan) -> None:
    """Fixed users for the celebrities and the like storm, weights for the background."""
    CelebrityPoster.fixed_count = plan.celebrity_users
    LikeStorm.fixed_count = plan.like_users
    for cls in BACKGROUND:
        cls.weight = plan.weights.get(cls.__name__, 0)
    wanted = [c for c in (CelebrityPoster, LikeStorm, *BACKGROUND) if c.fixed_count or c.weight]
    by_name = {c.__name__: c for c in environment.user_classes}
    # Keep the classes the locustfile defined (plain locust found them there), fitted.
    environment.user_classes[:] = [by_name.get(c.__name__, c) for c in wanted]


# -- users ----------------------------------------------------------------------------------


class FanoutUser(FastHttpUser):
    abstract = True
    host = default_host()

    def stop_forever(self, why: str) -> None:
        """An operation the system does not offer: this user has nothing left to do."""
        gevent.sleep(context().plan.duration_s)

    def inject(self, author: PopulationAuthor, kind: str, object_id: str) -> str | None:
        """POST one event with an id minted here, recorded before it is sent and again with
        its answer: an answer that never comes leaves the event indeterminate, never unknown."""
        client_id = str(ULID())
        row = {
            "time": time.time(),
            "tenant_id": author.tenant_id,
            "author_id": author.user_id,
            "notification_id": client_id,
            "client_id": client_id,
            "kind": kind,
            "object_id": object_id,
            "user_class": type(self).__name__,
        }
        record = context().record
        driver = context().driver
        call = driver.post_event(
            Event(author.tenant_id, author.user_id, kind, object_id, client_id)
        )
        record("injected", {**row, "op": "invoke"})
        answer: dict[str, Any] = {"op": "info"}
        try:
            with self.client.request(
                call.method, call.url, json=call.body, name=call.name, catch_response=True
            ) as response:
                status = response.status_code
                if 200 <= status < 300:
                    try:
                        nid = driver.parse_post_event(status, response.json())
                        answer = {"op": "ok", "notification_id": nid, "status": status}
                    except (DriverError, ValueError) as exc:
                        # Accepted, in words the driver cannot read: it may be in the system.
                        response.failure(str(exc))
                        answer = {"op": "info", "status": status}
                elif 400 <= status < 500:
                    # A definite refusal: the event is not in the system.
                    answer = {"op": "fail", "status": status}
                    response.failure(f"HTTP {status}: {(response.text or '')[:200]}")
                else:
                    # 5xx or no answer (status 0): it may or may not have been taken.
                    answer = {"op": "info", "status": status}
                    response.failure(f"HTTP {status}: {(response.text or '')[:200]}")
        finally:
            # Also when the greenlet is killed mid-request: the answer then says "info".
            record("injected", {**row, **answer, "end": time.time()})
        return answer.get("notification_id") if answer["op"] == "ok" else None

    def reader(self) -> tuple[str, str]:
        tenant, followers = random.choice(context().audiences)
        return tenant, random.choice(followers)

    def make(self, call: Call) -> tuple[int, Any, float, float]:
        """Make a driver's call, with the instants sent and answered; the body when it is
        JSON (None otherwise)."""
        sent = time.time()
        with self.client.request(
            call.method, call.url, json=call.body, name=call.name or call.path,
            catch_response=True,
        ) as response:  # fmt: skip
            answered = time.time()
            status = response.status_code
            body = None
            if 200 <= status < 300 and response.content:
                try:
                    body = response.json()
                except ValueError:
                    response.failure("not JSON")
            if not 200 <= status < 300:
                response.failure(f"HTTP {status}")
        return status, body, sent, answered

    def walk(self, tenant: str, user: str, pages: int) -> list[InboxItem]:
        """Walk the inbox newest first by cursor, up to ``pages`` pages; each page recorded."""
        plan = context().plan
        driver = context().driver
        walk, cursor, seen = context().walk_id(), None, []
        for page in range(pages):
            status, body, sent, answered = self.make(
                driver.inbox_page(tenant, user, plan.page_limit, cursor)
            )
            parsed = driver.parse_inbox_page(status, body) if status == 200 else None
            items = list(parsed.items) if parsed else []
            next_cursor = parsed.next_cursor if parsed else None
            context().record(
                "reads",
                {
                    "op": "page", "walk": walk, "page": page, "tenant_id": tenant,
                    "user_id": user, "limit": plan.page_limit, "cursor": cursor,
                    "next_cursor": next_cursor, "status": status, "time": sent,
                    "end": answered,
                    "ids": [i.notification_id for i in items],
                    "authors": [i.author_id for i in items],
                    "read": [i.read for i in items],
                },
            )  # fmt: skip
            seen += items
            if status != 200 or not next_cursor:
                break
            cursor = next_cursor
        return seen

    def pause_until(self, offset_s: float) -> None:
        """Sleep until ``offset_s`` after the load started (the plan's schedule)."""
        delay = context().started + offset_s - time.monotonic()
        if delay > 0:
            gevent.sleep(delay)


class Author(FanoutUser):
    """Regular authors: post, like, comment and mention (every kind fans out to followers)."""

    weight = 4

    def wait_time(self) -> float:
        return constant_throughput(context().plan.author_rate)(self)

    @task
    def act(self) -> None:
        authors = context().regular
        if not authors:
            return
        author = random.choice(authors)
        kind = random.choices(("post", "like", "comment", "mention"), (4, 3, 2, 1))[0]
        self.inject(author, kind, f"{kind}-{random.getrandbits(48):x}")


class CelebrityPoster(FanoutUser):
    """One celebrity each: posts at the plan's burst times, then stays idle."""

    fixed_count = 1

    def on_start(self) -> None:
        ctx = context()
        self.index = ctx.claim("celebrity")
        schedule = celebrity_post_times(ctx.plan)
        self.times = schedule[self.index] if self.index < len(schedule) else []
        celebrities = ctx.celebrities
        self.author = celebrities[self.index % len(celebrities)] if celebrities else None

    @task
    def post(self) -> None:
        if self.author is None or not self.times:
            gevent.sleep(1)
            return
        self.pause_until(self.times.pop(0))
        self.inject(self.author, "post", f"celebrity-post-{random.getrandbits(48):x}")

    def wait_time(self) -> float:
        return 0.0 if self.times else 1.0


class LikeStorm(FanoutUser):
    """The like storm: ``likes`` like events inside the burst window, over the regular authors."""

    fixed_count = 1

    def on_start(self) -> None:
        ctx = context()
        self.times = like_times(ctx.plan) if ctx.claim("like-storm") == 0 else []
        self.post_id = f"storm-post-{random.getrandbits(48):x}"
        self.in_flight = gevent.pool.Group()

    @task
    def like(self) -> None:
        authors = context().regular
        if not self.times or not authors:
            gevent.sleep(1)
            return
        self.pause_until(self.times.pop(0))
        # An open model: each like leaves at its instant, whatever the answers before it take.
        # One after the other, slow answers on a loaded machine pushed 5 of 30 likes past the
        # end of the load (the storm's schedule bent by the system it measures).
        self.in_flight.spawn(self.inject, random.choice(authors), "like", self.post_id)

    def on_stop(self) -> None:
        self.in_flight.join(timeout=10)  # bounded: an answer that never comes is indeterminate

    def wait_time(self) -> float:
        return 0.0


class InboxReader(FanoutUser):
    """App open: a follower walks their inbox newest first (celebrity pointers merged), a small
    page at a time by cursor, and every page is recorded for the read-side checkers."""

    weight = 3

    def wait_time(self) -> float:
        return constant_throughput(context().plan.reader_rate)(self)

    @task
    def open_app(self) -> None:
        tenant, user = self.reader()
        try:
            self.walk(tenant, user, context().plan.max_pages)
        except Unsupported:
            self.stop_forever("the system offers no inbox reads")


class ReadAllUser(FanoutUser):
    """Users clearing their unread count (seed 003): the unread count as they open the app,
    the first page, read-all, then a while later the newest page again, a few of its new items
    read one by one, and the unread count, each recorded with the instants it was sent and
    answered. The first count is the one that can be short: everything since the user's last
    read-all counts, much of it older than any lag (red team 3: a count that left out the
    merged celebrity pointers passed, every count having followed a read-all within 1.5 s)."""

    weight = 1

    def wait_time(self) -> float:
        return constant_throughput(context().plan.reader_rate)(self)

    @task
    def read_all(self) -> None:
        tenant, user = self.reader()
        driver = context().driver
        try:
            self.count(tenant, user)
            self.walk(tenant, user, 1)
            status, _, sent, answered = self.make(driver.read_all(tenant, user))
            self.note("read_all", tenant, user, status, sent, answered)
            gevent.sleep(random.uniform(0.2, 1.5))  # new notifications arrive meanwhile
            fresh = [i for i in self.walk(tenant, user, 1) if not i.read]
            for item in fresh[: context().plan.marks_per_visit]:
                nid = item.notification_id
                status, _, sent, answered = self.make(driver.mark_read(tenant, user, nid))
                self.note("mark_read", tenant, user, status, sent, answered, notification_id=nid)
            self.count(tenant, user)
        except Unsupported:
            self.stop_forever("the system offers no read-all, per-item read or unread count")

    def count(self, tenant: str, user: str) -> None:
        """One unread count, recorded (raises Unsupported where the system has none)."""
        driver = context().driver
        status, body, sent, answered = self.make(driver.unread_count(tenant, user))
        unread, capped = driver.parse_unread_count(status, body) if status == 200 else (None, None)
        self.note("unread", tenant, user, status, sent, answered, unread=unread, capped=capped)

    def note(
        self, op: str, tenant: str, user: str, status: int, sent: float, answered: float,
        **fields: Any,
    ) -> None:  # fmt: skip
        context().record(
            "reads",
            {"op": op, "tenant_id": tenant, "user_id": user, "status": status, "time": sent,
             "end": answered, **fields},
        )  # fmt: skip


class PreferenceChanger(FanoutUser):
    """Users saving their preferences during the run: every save invalidates the cached copy
    the push consumers read, mid-burst. They save the values they have, so the oracle's
    expectation holds while the write and invalidation paths carry load."""

    weight = 1

    def wait_time(self) -> float:
        return constant_throughput(context().plan.reader_rate)(self)

    @task
    def save(self) -> None:
        user = random.choice(context().population.users)
        call = context().driver.set_preferences(
            user.tenant_id, user.user_id, preferences_body(user)
        )
        self.make(call)


BACKGROUND: tuple[type[User], ...] = (Author, InboxReader, ReadAllUser, PreferenceChanger)


class PlanShape(LoadTestShape):
    """Users over time from ``harness.model.shapes.users_at`` for the plan ``install`` named."""

    abstract = True

    def tick(self) -> tuple[int, float] | None:
        plan = context().plan
        users = users_at(plan, self.get_run_time())
        return None if users is None else (users, plan.spawn_rate)


def install(shape_name: str | None = None) -> None:
    """Called by a locustfile: build the context on init (for a fixed shape, or the plan's)."""

    @events.init.add_listener
    def _on_init(environment: Environment, **_: Any) -> None:
        setup(environment, shape_name)
