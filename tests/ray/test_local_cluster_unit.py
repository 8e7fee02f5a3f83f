"""The ports :class:`~tests.ray.local_cluster.LocalCluster` names for ``ray start``: free,
distinct, and outside the kernel's ephemeral range (where any process binding port 0,
such as another Ray instance's gRPC servers, could take one before the cluster binds it)."""

from __future__ import annotations

import random
import socket

from tests.ray.local_cluster import ephemeral_range, free_ports


class Scripted(random.Random):
    """Draws the given ports first, then as a seeded Random would."""

    def __init__(self, first: list[int]):
        super().__init__(0)
        self.first = list(first)

    def randrange(self, *args):
        return self.first.pop(0) if self.first else super().randrange(*args)


def test_ports_are_distinct_free_and_between_rays_worker_ports_and_the_ephemeral_range():
    ports = free_ports(4)
    assert len(set(ports)) == 4
    # (ray start refuses a named port among its workers' ports, 10002-19999 by default)
    assert all(19999 < p < ephemeral_range()[0] for p in ports), (ports, ephemeral_range())
    for port in ports:  # each can be bound at once (by ray start)
        with socket.socket() as s:
            s.bind(("", port))


def test_a_port_in_use_is_never_given():
    with socket.socket() as held:
        held.bind(("127.0.0.1", free_ports(1)[0]))  # (one the helper could pick)
        held.listen()
        taken = held.getsockname()[1]
        ports = free_ports(2, Scripted([taken, taken]))
    assert taken not in ports and len(set(ports)) == 2
