"""What a running job does when a replica fails and when its size changes: the rules the
job supervisor and a Tune trial share.

* :func:`judge_failure`: a replica's failure over a lost node is no failure of the job; it
  continues from its newest checkpoint (:class:`Verdict`).
* :func:`resize_step`: a grow starts its new replicas while the job trains and the job
  checkpoints only once they are up; a decision for the current size gives them back
  (:class:`ResizeStep`).
* :func:`hand_over`: after the checkpoint of a resize, the replicas that stay keep their
  processes and the others stop.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from typing import Any, Callable, Collection, Sequence

from adaptdl_ray.replicas.failures import first_line_of

LOG = logging.getLogger(__name__)

__all__ = ["Verdict", "FailureVerdict", "judge_failure", "ResizeStep", "resize_step",
           "hand_over"]


class Verdict(str, enum.Enum):
    """What a replica's failure means for its job."""

    CONTINUE = "continue"  #: a node under its replicas was lost: continue from a checkpoint
    FAIL = "fail"          #: the job's own failure

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass(frozen=True)
class FailureVerdict:
    """The verdict on a replica's failure.

    Attributes:
        verdict: continue, or fail.
        lost_nodes: the nodes under the replicas that are gone (none when it fails).
        error: the failure's first line.
    """

    verdict: Verdict
    lost_nodes: tuple[str, ...]
    error: str


def judge_failure(exc: BaseException, group: Any, usable: Callable[[], Collection[str]], *,
                  name: str) -> FailureVerdict:
    """Whether ``exc``, a failure of ``group``'s replicas, came from a lost node (see
    :func:`~adaptdl_ray.replicas.nodes.lost_nodes_under`: ``usable()`` gives the usable
    nodes' ids); a loss is logged as such, with ``name`` (how log lines name the job)."""
    from adaptdl_ray.replicas.nodes import lost_nodes_under
    lost = lost_nodes_under(group.node_ids, group.actors, usable)
    error = first_line_of(exc)
    if not lost:
        return FailureVerdict(Verdict.FAIL, (), error)
    LOG.warning("%s: node(s) %s under its replicas were lost (%s); continuing from its "
                "newest checkpoint", name, ", ".join(n[:12] for n in lost), error)
    return FailureVerdict(Verdict.CONTINUE, tuple(lost), error)


class ResizeStep(str, enum.Enum):
    """What a job running on ``current`` replicas does about a decision for ``target``."""

    HOLD = "hold"  #: nothing to change (a grow started for another size was given back)
    WAIT = "wait"  #: a grow's new replicas are starting while the job trains
    GO = "go"      #: checkpoint at the next batch boundary and continue on ``target``

    def __str__(self) -> str:
        return self.value


def resize_step(current: int, target: int, *, grow_ready: Callable[[int], bool],
                cancel_grow: Callable[[], None], moves: bool = False) -> ResizeStep:
    """The step toward ``target`` replicas from ``current``: a grow first asks
    ``grow_ready(extra)`` (which starts the new replicas while the job trains) and goes
    once they are up; the same size holds and ``cancel_grow()`` gives back a grow's
    replicas. ``moves``: the replicas change accelerator type, a resize also at the same
    size (its new replicas start after the checkpoint)."""
    if target == current and not moves:
        cancel_grow()
        return ResizeStep.HOLD
    if target > current and not moves and not grow_ready(target - current):
        return ResizeStep.WAIT
    return ResizeStep.GO


def hand_over(actors: Sequence[Any], stay: Sequence[Any], trial_info: dict[str, Any], *,
              release: Callable[[list], None]) -> list[Any]:
    """After a resize's checkpoint: every replica of ``actors`` (all of a stopped launch)
    leaves the job's process group together (one that loses its peers first would wait out
    the store's timeout), then ``release`` stops the ones not in ``stay``. Returns the
    replicas that stay, idle, in rank order: none if they could not be made idle (every
    replica is then replaced)."""
    from adaptdl_ray.replicas.group import recycle_workers
    stay = list(stay)
    if stay and not recycle_workers(actors, trial_info):
        stay = []
    release([a for a in actors if a not in stay])
    return stay
