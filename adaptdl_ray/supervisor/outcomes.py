"""What a supervised job's launches and runs end in, as types (not strings)."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Mapping, Sequence

__all__ = ["Ending", "Change", "LaunchEnd", "RunResult", "Phase", "Boundary", "boundary_of"]


class Ending(str, enum.Enum):
    """How a whole run of a job ended (a ``str`` enum: it equals its value)."""

    FINISHED = "finished"  #: every replica's training function returned
    STOPPED = "stopped"    #: checkpointed at a batch boundary on a stop request
    FAILED = "failed"      #: a replica failed (not because its node was lost)

    def __str__(self) -> str:
        return self.value


class Change(str, enum.Enum):
    """Why a launch ended while the job goes on, in another launch."""

    RESIZE = "resize"      #: the sizer's decision: a new size pays
    MOVE = "move"          #: a node under the replicas is being drained
    RELAUNCH = "relaunch"  #: the training function checkpointed and stopped itself

    def __str__(self) -> str:
        return self.value


class Phase(str, enum.Enum):
    """What the job is doing, for its record (``adaptdl-ray ls`` shows it)."""

    PENDING = "pending"    #: waiting for its replicas' resources
    RUNNING = "running"
    RESIZING = "resizing"  #: checkpointing for a resize
    MOVING = "moving"      #: checkpointing to leave draining nodes
    STOPPING = "stopping"  #: checkpointing on a stop request

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass(frozen=True)
class LaunchEnd:
    """How one launch ended.

    Attributes:
        kind: an :class:`Ending` (the run ends) or a :class:`Change` (it goes on).
        replicas: the next launch's replicas (0 when the run ends).
    """

    kind: Ending | Change
    replicas: int = 0

    @property
    def final(self) -> bool:
        """Whether the run ends with this launch."""
        return isinstance(self.kind, Ending)


@dataclasses.dataclass(frozen=True)
class RunResult:
    """How a supervised run ended.

    Attributes:
        ending: finished, stopped or failed.
        restarts: the restart count of its last launch.
        error: the failure's first line (``FAILED`` only).
    """

    ending: Ending
    restarts: int
    error: str | None = None


class Boundary(str, enum.Enum):
    """Where a launch's replicas stopped, from what each says when it ends."""

    FINISHED = "finished"          #: every replica's function ran to its end
    CHECKPOINTED = "checkpointed"  #: they checkpointed at a batch boundary and stopped

    def __str__(self) -> str:
        return self.value


def boundary_of(outcomes: Sequence[Mapping[str, Any]]) -> Boundary:
    """Where replicas stopped: :attr:`Boundary.FINISHED` when every outcome (a worker
    group's ``stop`` or ``finished``) says its function ran to its end, else
    :attr:`Boundary.CHECKPOINTED` (the function stopped at a checkpoint)."""
    finished = all(o["status"] == "finished" for o in outcomes)
    return Boundary.FINISHED if finished else Boundary.CHECKPOINTED
