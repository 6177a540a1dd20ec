"""Loopback ports: pick free ones, and tell a taken one apart before a server fails on it."""

from __future__ import annotations

import socket

LOOPBACK = "127.0.0.1"


class PortInUse(RuntimeError):
    def __init__(self, port: int, host: str = LOOPBACK) -> None:
        super().__init__(
            f"port {port} on {host} is already in use: stop what holds it "
            f"(ss -ltnp 'sport = :{port}') or choose another --port"
        )
        self.port = port


def free_port(host: str = LOOPBACK) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


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
