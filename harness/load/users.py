"""Locust users and the load-plan shape, shared by every file in ``locustfiles/``.

The same code runs under plain ``locust -f locustfiles/<shape>.py --headless`` (against the
stack file, or ``--host``) and under ``python -m harness run`` (``harness.load.loadgen`` drives it
through Locust's library API, locally or with Locust's own master and workers).

Each user records what it actually injected (accepted events: ids and times) for the oracle:
locally into ``<out>/injected.jsonl``; on a Locust worker, as messages to the master, which
writes the same file. Celebrities are claimed the same way, so two workers never post as the
same celebrity.
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
from urllib.parse import quote

import gevent
from gevent.event import AsyncResult
from locust import FastHttpUser, LoadTestShape, User, constant_throughput, events, task
from locust.env import Environment
from locust.runners import MasterRunner, WorkerRunner

from harness.load.loadgen import INJECTED_FILE
from harness.model.population import Author as PopulationAuthor
from harness.model.population import Population, PopulationSpec, generate, preferences_body
from harness.model.shapes import LoadPlan, celebrity_post_times, like_times, users_at

_INJECTED_MESSAGE = "harness_injected"
_CLAIM_MESSAGE = "harness_claim"
_CLAIMED_MESSAGE = "harness_claimed"


class LoadContext:
    """What every user of this process shares: the plan, the population, where to record."""

    def __init__(self, plan: LoadPlan, population: Population, record: Callable[[dict], None]):
        self.plan = plan
        self.population = population
        self.record = record
        self.regular = [a for a in population.authors if not a.celebrity]
        self.celebrities = [a for a in population.authors if a.celebrity]
        self.started = time.monotonic()
        self._claims: dict[str, itertools.count] = {}
        self.claim: Callable[[str], int] = self._claim_locally

    def _claim_locally(self, what: str) -> int:
        return next(self._claims.setdefault(what, itertools.count()))


_context: LoadContext | None = None


def context() -> LoadContext:
    if _context is None:
        raise RuntimeError("the load context is built on Locust's init event; run through locust")
    return _context


class InjectionFile:
    """Append-only JSON lines, flushed per row: a crash keeps what was accepted."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed on quit

    def write(self, rows: list[dict]) -> None:
        for row in rows:
            self._file.write(json.dumps(row) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class WorkerRelay:
    """On a Locust worker: injected rows batched to the master every 200 ms (and at stop)."""

    def __init__(self, runner: WorkerRunner) -> None:
        self.runner = runner
        self.pending: list[dict] = []
        self._loop = gevent.spawn(self._flush_forever)

    def add(self, row: dict) -> None:
        self.pending.append(row)

    def flush(self) -> None:
        if self.pending:
            rows, self.pending = self.pending, []
            self.runner.send_message(_INJECTED_MESSAGE, rows)

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


def setup(environment: Environment, shape_name: str) -> LoadContext:
    """Build this process's load context and fit the user classes to the plan."""
    global _context
    options = environment.parsed_options
    plan = LoadPlan.from_mapping({**json.loads(options.harness_plan or "{}"), "shape": shape_name})
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
        relay = WorkerRelay(runner)
        record: Callable[[dict], None] = relay.add
        events.test_stopping.add_listener(lambda **_: relay.flush())
        events.quitting.add_listener(lambda **_: relay.flush())
    else:
        sink = InjectionFile(out / INJECTED_FILE)
        record = lambda row: sink.write([row])  # noqa: E731
        events.quitting.add_listener(lambda **_: sink.close())
    _context = LoadContext(plan, population, record)
    # Plan offsets count from the start of the load, not from process start.
    events.test_start.add_listener(lambda **_: setattr(_context, "started", time.monotonic()))

    if isinstance(runner, MasterRunner):
        runner.register_message(_INJECTED_MESSAGE, lambda msg, **_: sink.write(msg.data))
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

    def inject(self, author: PopulationAuthor, kind: str, object_id: str) -> str | None:
        """POST one event; record it only once the API accepted it."""
        body = {
            "tenant_id": author.tenant_id,
            "author_id": author.user_id,
            "kind": kind,
            "object_id": object_id,
        }
        started = time.time()
        with self.client.post(
            "/v1/events", json=body, name="POST /v1/events", catch_response=True
        ) as response:
            if response.status_code != 202 and response.status_code != 200:
                response.failure(f"HTTP {response.status_code}: {response.text[:200]}")
                return None
            notification_id = response.json()["notification_id"]
        context().record(
            {
                "time": started,
                "tenant_id": author.tenant_id,
                "author_id": author.user_id,
                "notification_id": notification_id,
                "kind": kind,
                "user_class": type(self).__name__,
            }
        )
        return notification_id

    def pause_until(self, offset_s: float) -> None:
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

    @task
    def like(self) -> None:
        authors = context().regular
        if not self.times or not authors:
            gevent.sleep(1)
            return
        self.pause_until(self.times.pop(0))
        self.inject(random.choice(authors), "like", self.post_id)

    def wait_time(self) -> float:
        return 0.0


class InboxReader(FanoutUser):
    """App open: the newest 20 (celebrity pointers merged), then the next page by cursor."""

    weight = 3

    def wait_time(self) -> float:
        return constant_throughput(context().plan.reader_rate)(self)

    @task
    def open_app(self) -> None:
        user = random.choice(context().population.users)
        base = f"/v1/tenants/{user.tenant_id}/users/{user.user_id}/inbox"
        with self.client.get(f"{base}?limit=20", name="GET inbox", catch_response=True) as first:
            if first.status_code != 200:
                first.failure(f"HTTP {first.status_code}")
                return
            cursor = first.json().get("next_cursor")
        if cursor:
            self.client.get(
                f"{base}?limit=20&cursor={quote(cursor, safe='')}", name="GET inbox (next page)"
            )


class ReadAllUser(FanoutUser):
    """Users clearing large unread counts: read-all must be O(1) (seed 003)."""

    weight = 1

    def wait_time(self) -> float:
        return constant_throughput(context().plan.reader_rate)(self)

    @task
    def read_all(self) -> None:
        user = random.choice(context().population.users)
        base = f"/v1/tenants/{user.tenant_id}/users/{user.user_id}"
        self.client.get(f"{base}/unread-count", name="GET unread-count")
        self.client.post(f"{base}/inbox/read-all", name="POST inbox/read-all")


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
        self.client.put(
            f"/v1/tenants/{user.tenant_id}/users/{user.user_id}/preferences",
            json=preferences_body(user),
            name="PUT preferences",
        )


BACKGROUND: tuple[type[User], ...] = (Author, InboxReader, ReadAllUser, PreferenceChanger)


class PlanShape(LoadTestShape):
    """Users over time from ``harness.model.shapes.users_at`` for the plan ``install`` named."""

    abstract = True

    def tick(self) -> tuple[int, float] | None:
        plan = context().plan
        users = users_at(plan, self.get_run_time())
        return None if users is None else (users, plan.spawn_rate)


def install(shape_name: str) -> None:
    """Called by each locustfile: build the context on init, for this file's shape."""

    @events.init.add_listener
    def _on_init(environment: Environment, **_: Any) -> None:
        setup(environment, shape_name)
