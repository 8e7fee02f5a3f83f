"""A clock the test moves by hand, for the pure pieces that take an injected clock."""

from __future__ import annotations


class Clock:
    """Returns :attr:`now` (seconds) when called; a test sets or advances it."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
