"""A local Redis Cluster (MemoryDB cluster mode): three masters on loopback, slots split
evenly, formed with CLUSTER ADDSLOTSRANGE and CLUSTER MEET (no redis-cli needed).

The seed sizes the 30-day dedup keyspace at ~240 GB: a sharded cluster, not one node. Dedup,
rate limits and caches must work unchanged against it, so the tests run them on both.

    with RedisCluster(workdir) as cluster:
        client = redis.RedisCluster.from_url(cluster.url)
"""

from __future__ import annotations

import random
import subprocess
from pathlib import Path

import redis

from emulators.ports import LOOPBACK, free_port, port_in_use
from harness.stack.supervisor import require_redis_server, stop_processes, wait_until

SLOTS = 16384
MAX_NODE_PORT = 55535
_HANDED_OUT: set[int] = set()


def slot_ranges(masters: int) -> list[tuple[int, int]]:
    """Contiguous, even slot ranges covering 0..16383 (what redis-cli --cluster create does)."""
    if masters < 1:
        raise ValueError("a cluster needs at least one master")
    bounds = [round(i * SLOTS / masters) for i in range(masters + 1)]
    return [(bounds[i], bounds[i + 1] - 1) for i in range(masters)]


def cluster_node_port(rng: random.Random | None = None) -> int:
    """A free port at most 55535: redis-server 7.0 refuses a cluster node above it (it checks
    port + 10000 against 65535 even when --cluster-port names the bus port)."""
    rng = rng or random.SystemRandom()
    for _ in range(1000):
        port = rng.randint(20000, MAX_NODE_PORT)
        if port not in _HANDED_OUT and not port_in_use(port):
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError(f"no free loopback port between 20000 and {MAX_NODE_PORT}")


class RedisCluster:
    def __init__(self, workdir: Path, masters: int = 3, timeout: float = 30.0) -> None:
        self.workdir = Path(workdir)
        self.masters = masters
        self.timeout = timeout
        self.ports: list[int] = []
        self.bus_ports: list[int] = []
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        return f"redis://{LOOPBACK}:{self.ports[0]}/0"

    def _node(self, port: int) -> redis.Redis:
        return redis.Redis(host=LOOPBACK, port=port, socket_timeout=2)

    def _alive(self, port: int) -> bool:
        try:
            return bool(self._node(port).ping())
        except redis.RedisError:
            return False

    def _all_alive(self) -> bool:
        for i, proc in enumerate(self.procs):
            if proc.poll() is not None:
                log = (self.workdir / f"node-{i}.log").read_text(errors="replace")
                raise RuntimeError(
                    f"cluster node {i} exited with code {proc.returncode}: {log[-600:]}"
                )
        return all(self._alive(p) for p in self.ports)

    def up(self) -> RedisCluster:
        server = require_redis_server()
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            for i in range(self.masters):
                port, bus_port = cluster_node_port(), free_port()
                self.bus_ports.append(bus_port)
                data = self.workdir / f"node-{i}"
                data.mkdir(exist_ok=True)
                log = open(self.workdir / f"node-{i}.log", "ab")  # noqa: SIM115 - child owns it
                self.procs.append(
                    subprocess.Popen(
                        [
                            server,
                            "--port",
                            str(port),
                            "--bind",
                            LOOPBACK,
                            "--cluster-enabled",
                            "yes",
                            # Explicit: the default bus port (port + 10000) may be taken.
                            "--cluster-port",
                            str(bus_port),
                            "--cluster-config-file",
                            str(data / "nodes.conf"),
                            "--dir",
                            str(data),
                            "--save",
                            "",
                            "--appendonly",
                            "no",
                            "--protected-mode",
                            "yes",
                        ],  # fmt: skip
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                    )
                )
                log.close()
                self.ports.append(port)
            wait_until(self._all_alive, self.timeout, "the cluster nodes to answer PING")
            for port, (first, last) in zip(self.ports, slot_ranges(self.masters), strict=True):
                self._node(port).execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
            for port in self.ports[1:]:
                self._node(port).execute_command(
                    "CLUSTER", "MEET", LOOPBACK, self.ports[0], self.bus_ports[0]
                )
            wait_until(self._formed, self.timeout, "the cluster to agree on its slots")
        except BaseException:
            self.down()
            raise
        return self

    def _formed(self) -> bool:
        for port in self.ports:
            info = self._node(port).execute_command("CLUSTER", "INFO")
            text = info.decode() if isinstance(info, bytes) else str(info)
            if "cluster_state:ok" not in text or f"cluster_known_nodes:{self.masters}" not in text:
                return False
        return True

    def down(self) -> None:
        stop_processes(self.procs)
        self.procs.clear()

    def __enter__(self) -> RedisCluster:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()
