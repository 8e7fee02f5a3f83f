"""Test doubles shared by the decision core's and the Tune scheduler's unit tests."""

from __future__ import annotations

from adaptdl_core.policy import AllocationResult, PolluxPolicy


class CountingPolicy(PolluxPolicy):
    """PolluxPolicy that counts its solves (``calls``)."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def allocate(self, *args, **kwargs):
        self.calls += 1
        return super().allocate(*args, **kwargs)


class FixedSizePolicy:
    """A policy that proposes ``replicas`` replicas for every job, on the first node
    (the resize rule then decides whether the change goes ahead)."""

    def __init__(self, replicas):
        self.replicas = replicas

    def allocate(self, jobs, nodes, base_allocations=None, *, now=None):
        node = next(iter(nodes))
        allocations = {key: [node] * self.replicas for key in jobs}
        return AllocationResult(allocations, {key: float(self.replicas) for key in jobs},
                                float(self.replicas), 0, True, 0.0)
