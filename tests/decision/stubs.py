"""Test doubles shared by the decision core's and the Tune scheduler's unit tests."""

from __future__ import annotations

from adaptdl_core.policy import PolluxPolicy


class CountingPolicy(PolluxPolicy):
    """PolluxPolicy that counts its solves (``calls``)."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def allocate(self, *args, **kwargs):
        self.calls += 1
        return super().allocate(*args, **kwargs)
