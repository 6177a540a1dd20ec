"""Loopback ports: pick free ones, and tell a taken one apart before a server fails on it."""

from __future__ import annotations

import random
import socket
from collections import deque
from pathlib import Path

LOOPBACK = "127.0.0.1"


class PortInUse(RuntimeError):
    def __init__(self, port: int, host: str = LOOPBACK) -> None:
        super().__init__(
            f"port {port} on {host} is already in use: stop what holds it "
            f"(ss -ltnp 'sport = :{port}') or choose another --port"
        )
        self.port = port


_HANDED_OUT: deque[int] = deque(maxlen=256)
_RANDOM = random.SystemRandom()
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def listen_range(path: Path = EPHEMERAL_RANGE) -> tuple[int, int] | None:
    """The ports handed out for listening: the 12,000 below the kernel's ephemeral range,
    which no outgoing connection takes as its local port; None when the range is unknown or
    leaves no room below it."""
    try:
        low = int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    if low <= 11024:
        return None
    return (max(10000, low - 12000), low - 1)


def free_port(host: str = LOOPBACK) -> int:
    """A port free now, and not one this process handed out recently: parts started together
    pick their ports before any of them binds, so the kernel could offer one port twice.

    Chosen at random below the kernel's ephemeral range (:func:`listen_range`): a port the
    kernel picked for a bind to port 0 is an ephemeral one, which any outgoing connection of
    the machine (a client's local port) may take before the part that was to listen on it
    binds (CI: a toxiproxy listen port taken so, "address already in use")."""
    span = listen_range()
    for _ in range(200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, _RANDOM.randint(*span) if span else 0))
            except OSError:
                continue  # taken: another
            port = sock.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.append(port)
            return port
    raise RuntimeError("no free loopback port that was not handed out already")


def port_in_use(port: int, host: str = LOOPBACK) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
        return False


def require_free(port: int, host: str = LOOPBACK) -> None:
    if port_in_use(port, host):
        raise PortInUse(port, host)
