"""The process: the queues created, the API and/or the consumer started, both stopped on
SIGTERM or SIGINT.

One process runs the API and the consumer (``--role both``, the default), or one of them, so
that a crash experiment can kill the consumer alone. Logs go to stderr. SIGTERM or SIGINT stops
it cleanly (exit 0): the API stops accepting and finishes its requests, the consumer finishes
the jobs in hand. Exit 2: a bad command line or a port already taken; exit 1: the queues could
not be created.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web
from botocore.exceptions import BotoCoreError, ClientError
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from systems.minifanout.api import Api
from systems.minifanout.config import Config
from systems.minifanout.consumer import Consumer
from systems.minifanout.jobqueue import JobQueue, sqs_client
from systems.minifanout.providers import Senders
from systems.minifanout.store import SENT_TTL_S, Claims, People

log = logging.getLogger("minifanout")
STORE_TIMEOUT_S = 2.0
STOP_TIMEOUT_S = 20.0
# The dedup_short_ttl bug's claim lifetime: an hour, far short of any provider's retry horizon.
SHORT_SENT_TTL_S = 3600


def _stores(config: Config) -> tuple[Redis, Redis]:
    data = Redis.from_url(
        config.redis_url, socket_timeout=STORE_TIMEOUT_S, socket_connect_timeout=STORE_TIMEOUT_S
    )
    # No retries inside the client for the dedup store: a failed claim leaves the job on the
    # queue, and SQS is the retry.
    dedup = Redis.from_url(
        config.dedup_redis_url,
        socket_timeout=STORE_TIMEOUT_S,
        socket_connect_timeout=STORE_TIMEOUT_S,
        retry=Retry(NoBackoff(), 0),
    )
    return data, dedup


async def serve(config: Config) -> int:
    loop = asyncio.get_running_loop()
    # boto3 runs in threads: one long poll per receive loop, plus sends, deletes and the API's.
    loop.set_default_executor(
        ThreadPoolExecutor(config.workers * 2 + 16, thread_name_prefix="minifanout-sqs")
    )
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    queue = JobQueue(
        sqs_client(config.sqs_endpoint, config.region),
        config.queue,
        config.dead_queue,
        config.poison_queue,
    )
    try:
        await asyncio.to_thread(queue.ensure, config.visibility_timeout_s, config.max_receives)
    except (BotoCoreError, ClientError) as exc:
        log.error("cannot create the queues %s and %s: %s", config.queue, config.dead_queue, exc)
        return 1
    log.info(
        "queues ready: %s (dead letters: %s after %d receives)",
        queue.url,
        queue.dead_url,
        config.max_receives,
    )
    data, dedup = _stores(config)
    people, claims = (
        People(data),
        Claims(dedup, sent_ttl_s=SHORT_SENT_TTL_S if config.bug("dedup_short_ttl") else SENT_TTL_S),
    )
    runner: web.AppRunner | None = None
    api: Api | None = None
    consumer_task: asyncio.Task[None] | None = None
    senders: Senders | None = None
    try:
        if config.role in ("both", "api"):
            api = Api(people, claims, queue)
            api.bugs = sorted(config.bugs)
            runner = web.AppRunner(api.app(), access_log=None, shutdown_timeout=5.0)
            await runner.setup()
            try:
                await web.TCPSite(runner, config.host, config.port).start()
            except OSError as exc:
                log.error("cannot listen on %s:%d: %s", config.host, config.port, exc)
                return 2
            log.info("API listening on http://%s:%d", config.host, config.port)
        if config.role in ("both", "consumer"):
            senders = Senders(
                config.apns_url,
                config.fcm_url,
                apns_topic=config.apns_topic,
                fcm_projects=config.fcm_projects,
                fcm_mapping=config.fcm_mapping,
                apns_ca_file=str(config.apns_ca_file) if config.apns_ca_file else None,
                apns_key=config.apns_key,
                fcm_credentials=config.fcm_credentials,
                timeout_s=config.provider_timeout_s,
            )
            consumer = Consumer(config, people, claims, queue, senders)
            if api is not None:
                api.consumer_counts = consumer.counts
            consumer_task = asyncio.create_task(consumer.run(stop))
            log.info("consumer running: %d receive loops on %s", config.workers, config.queue)
        if config.bugs:
            log.warning("planted bugs on: %s", ", ".join(sorted(config.bugs)))
        await stop.wait()
        log.info("stopping")
    finally:
        if runner is not None:
            await runner.cleanup()
        if consumer_task is not None:
            stop.set()
            try:
                await asyncio.wait_for(consumer_task, STOP_TIMEOUT_S)
            except TimeoutError:
                log.warning("the consumer did not finish its jobs within %ss", STOP_TIMEOUT_S)
        if senders is not None:
            await senders.close()
        await data.aclose()
        await dedup.aclose()
    log.info("stopped")
    return 0
