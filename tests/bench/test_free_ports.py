"""bench.server.free_ports: distinct loopback ports, each bindable, all below the kernel's
ephemeral range (where outgoing connections take their local ports)."""

from __future__ import annotations

import socket

from bench.server import free_port, free_ports


def _ephemeral_floor() -> int:
    with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as ports:
        return int(ports.read().split()[0])


def test_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    ports = free_ports(3)
    assert len(set(ports)) == 3
    assert all(port < _ephemeral_floor() for port in [*ports, free_port()])
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_in_use_is_never_chosen() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", free_port()))
        held.listen()
        taken = held.getsockname()[1]
        assert all(taken not in free_ports(8) for _ in range(20))
