"""A scripted policy for tests of placement by accelerator type: every job on nodes of one
type, then, once told, on nodes of another (no Ray needed)."""

from __future__ import annotations

import os
from typing import Callable

from adaptdl_core.policy import AllocationResult


class TypeSwitchPolicy:
    """Gives every job ``replicas`` replicas on the nodes of type ``first`` until
    ``switch()`` says so, then on the nodes of type ``second`` (a type of ``None``: no
    replicas for any job); once a job runs on
    ``second`` (its base allocation says so), touches ``done_file`` if given.

    Use type names the speed prior does not know (no type then looks faster), so that
    a move is carried out as soon as the policy proposes it while the job's remaining
    training is unknown or long."""

    knows_types = True  # (it places by type: no warning that it ignores types)

    def __init__(self, first: str, second: str, replicas: int,
                 switch: Callable[[], bool], done_file: str | None = None) -> None:
        self.first, self.second, self.replicas = first, second, replicas
        self.switch = switch
        self.done_file = done_file

    def allocate(self, jobs, nodes, base_allocations=None, *, now=None):
        kind = self.second if self.switch() else self.first
        if kind is None:  # no room for anyone
            return AllocationResult({key: [] for key in jobs}, {key: 0.0 for key in jobs},
                                    1.0, 0, True, 0.0)
        typed = [n for n, info in nodes.items() if info.accelerator_type == kind]
        allocations = {key: [typed[i % len(typed)] for i in range(self.replicas)]
                       for key in jobs}
        if self.done_file:
            for placed in (base_allocations or {}).values():
                if placed and all(nodes[n].accelerator_type == self.second
                                  for n in placed if n in nodes):
                    open(self.done_file, "w").close()
        return AllocationResult(allocations, {k: float(len(v)) for k, v in allocations.items()},
                                1.0, 0, True, 0.0)


def file_switch(path: str) -> Callable[[], bool]:
    """A switch that says so once ``path`` exists."""
    return lambda: os.path.exists(path)
