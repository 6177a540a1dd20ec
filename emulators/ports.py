"""Loopback ports: pick free ones, and tell a taken one apart before a server fails on it."""

from __future__ import annotations

import socket
from collections import deque

LOOPBACK = "127.0.0.1"


class PortInUse(RuntimeError):
    def __init__(self, port: int, host: str = LOOPBACK) -> None:
        super().__init__(
            f"port {port} on {host} is already in use: stop what holds it "
            f"(ss -ltnp 'sport = :{port}') or choose another --port"
        )
        self.port = port


_HANDED_OUT: deque[int] = deque(maxlen=256)


def free_port(host: str = LOOPBACK) -> int:
    """A port free now, and not one this process handed out recently: parts started together
    pick their ports before any of them binds, so the kernel could offer one port twice."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
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
