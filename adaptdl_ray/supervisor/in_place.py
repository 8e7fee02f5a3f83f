"""In-place checkpoints: every ``interval_s`` of a launch's training, the replicas
checkpoint at their next batch boundary and train on.

One :class:`InPlaceCheckpoints` per job (the job supervisor's, a Tune trial's) keeps the
schedule and takes the saves; what a save is kept as is the front-end's (the submitted
job's storage, the trial's directory on the run's storage). A lost node costs what was
trained since the newest one.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Callable

LOG = logging.getLogger(__name__)

__all__ = ["InPlaceSave", "InPlaceCheckpoints"]


@dataclasses.dataclass(frozen=True)
class InPlaceSave:
    """One in-place checkpoint, taken at a batch boundary while the replicas train on.

    Attributes:
        archive: rank 0's checkpoint (tar bytes; ``None``: rank 0 wrote none).
        index: the boundary's report index: the reports tagged below it were made before
            the checkpoint (a resumption from it does not make them again).
        seconds: how long the save took.
    """

    archive: bytes | None
    index: int
    seconds: float


class InPlaceCheckpoints:
    """The schedule and the saves of one job's in-place checkpoints.

    Args:
        interval_s: seconds of training between saves (``None``: none).
        timeout_s: how long a save waits for the replicas' next batch boundary.
        name: how log lines name the job (``job NAME``, ``trial ID``).
        clock: seconds, monotonic (default ``time.monotonic``; tests pass a fake).
    """

    def __init__(self, interval_s: float | None, timeout_s: float, *, name: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.name = name
        self._clock = clock
        self._next: float | None = None  # when the next save is due (None: not scheduled)

    def restart(self) -> None:
        """A launch started: its first save is due one interval from now."""
        self._next = None if self.interval_s is None else self._clock() + self.interval_s

    def due(self) -> bool:
        """Whether a save is due now (the first call of a launch not :meth:`restart`-ed
        schedules the first save one interval later)."""
        if self.interval_s is None:
            return False
        if self._next is None:
            self.restart()
            return False
        return self._clock() >= self._next

    def save(self, group: Any) -> InPlaceSave | None:
        """Checkpoint ``group``'s replicas at their next batch boundary while they train
        on; ``None`` if the function ended before one (nothing was taken).

        Raises:
            TimeoutError: no batch boundary within ``timeout_s``.
            WorkerFailed: a replica failed meanwhile.
            ray.exceptions.RayError: rank 0's checkpoint could not be fetched.
        """
        started = self._clock()
        answer = group.save(self.timeout_s)
        if not answer["taken"]:
            return None
        archive = group.checkpoint_archive(answer["path"])
        return InPlaceSave(archive, answer["index"], self._clock() - started)

    def save_if_due(self, group: Any) -> InPlaceSave | None:
        """:meth:`save` when one is due (the next is due one interval after it ends); a
        save that finds no batch boundary in time is skipped, logged.

        Raises:
            WorkerFailed: a replica failed meanwhile.
            ray.exceptions.RayError: rank 0's checkpoint could not be fetched.
        """
        if not self.due():
            return None
        try:
            return self.save(group)
        except TimeoutError as exc:
            LOG.warning("%s: in-place checkpoint skipped: %s", self.name, exc)
            return None
        finally:
            self.restart()
