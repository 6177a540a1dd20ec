"""The dedup store with a password and TLS, as the design asks of MemoryDB (seed 000: "transit
encryption with Redis ACL users, no anonymous access"): the reference reaches a real
redis-server over TLS with a password, directly and through the harness's fault proxy (a TCP
proxy: the TLS session is end to end), and a wrong password fails closed."""

from __future__ import annotations

import select
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import trustme
from conftest import ROOT
from toxiproxy import Toxiproxy

from emulators.ports import LOOPBACK, free_port
from harness.stack.supervisor import stop_process, wait_until
from reference_impl.config import Config
from reference_impl.dedup import DedupStore
from reference_impl.redis_store import connect_redis

pytestmark = pytest.mark.integration
PASSWORD = "s3cret-for-tests"


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    d = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    cert = ca.issue_cert(LOOPBACK)
    cert.private_key_pem.write_to_path(str(d / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(d / "cert.pem"))
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--bind", LOOPBACK, "--port", "0", "--tls-port", str(port),
         "--tls-cert-file", str(d / "cert.pem"), "--tls-key-file", str(d / "key.pem"),
         "--tls-ca-cert-file", str(d / "ca.pem"), "--tls-auth-clients", "no",
         "--requirepass", PASSWORD, "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        url = f"rediss://default:{PASSWORD}@{LOOPBACK}:{port}/0?ssl_ca_certs={d / 'ca.pem'}"
        wait_until(lambda: _pings(url), 10, "redis-server with TLS")
        yield port, d / "ca.pem"
    finally:
        stop_process(proc)  # type: ignore[arg-type]


def _pings(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_timeout=1).ping())
    except redis.RedisError:
        return False


def _store(port: int, ca: Path, password: str = PASSWORD) -> DedupStore:
    url = (
        f"rediss://default:{password}@{LOOPBACK}:{port}/0?ssl_ca_certs={ca}&ssl_cert_reqs=required"
    )
    config = Config.from_mapping({"redis_url": url, "redis_timeout_seconds": 2})
    return DedupStore(connect_redis(config), lease_seconds=30)


def test_dedup_over_tls_with_a_password(tls_redis):
    port, ca = tls_redis
    store = _store(port, ca)
    assert store.claim("dedup:tls-1", "c1") == "won"
    assert store.claim("dedup:tls-1", "c2") == "in_flight"


def test_a_wrong_password_fails_closed(tls_redis):
    port, ca = tls_redis
    with pytest.raises(redis.RedisError):
        _store(port, ca, password="wrong").claim("dedup:tls-2", "c1")


def test_the_fault_proxy_carries_tls_end_to_end(tls_redis):
    port, ca = tls_redis
    proc = subprocess.Popen(
        [sys.executable, "-m", "chaos.toxiproxy", "--host", LOOPBACK, "--port", "0"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 20)
        line = proc.stdout.readline() if ready else ""
        api_port = int(line.strip().rsplit(":", 1)[1])
        server = Toxiproxy()
        server.update_api_consumer(LOOPBACK, api_port)
        listen = free_port()
        proxy = server.create(
            name="dedup-tls", upstream=f"{LOOPBACK}:{port}", listen=f"{LOOPBACK}:{listen}"
        )
        store = _store(listen, ca)
        assert store.claim("dedup:tls-3", "c1") == "won"
        proxy.disable()  # an outage through the proxy: no decision, no send
        with pytest.raises(redis.RedisError):
            _store(listen, ca).claim("dedup:tls-4", "c1")
        proxy.enable()
    finally:
        stop_process(proc)  # type: ignore[arg-type]
