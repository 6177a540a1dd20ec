"""Loopback ports for the parts the harness starts (emulators/ports.py): handed out below the
kernel's ephemeral range, where no outgoing connection can take one before its part binds."""

from __future__ import annotations

import socket

from emulators.ports import LOOPBACK, free_port, listen_range


def test_the_listen_range_lies_below_the_kernels_ephemeral_range(tmp_path):
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("32768\t60999\n")
    assert listen_range(ranges) == (20768, 32767)
    ranges.write_text("10000\t60999\n")
    assert listen_range(ranges) is None  # no room below: the kernel's choice
    assert listen_range(tmp_path / "absent") is None


def test_free_ports_are_bindable_distinct_and_outside_the_ephemeral_range():
    span = listen_range()
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    for port in ports:
        if span is not None:
            assert span[0] <= port <= span[1]
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((LOOPBACK, port))  # free when handed out
