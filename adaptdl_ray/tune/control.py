"""The meeting point of one experiment's AdaptDL trials and its scheduler.

A Tune trial actor can only talk to the driver through the results it returns, one per
report. Two things do not fit there:

* **Scheduler hints** (the trial's fitted throughput model and gradient statistics): a
  JSON blob the scheduler needs but the user should not see in every result, progress table
  and ``progress.csv``. Trials post them here; the scheduler reads them when it re-divides
  the cluster.
* **A pause is coming**: Tune asks a trial to save before it pauses it (a resize) and
  before a periodic or user checkpoint alike; the scheduler says which, so that a pausing
  trial's replicas stop at the checkpoint instead of training on until they are stopped.
* **An interrupt of the driver** (Ctrl-C, SIGTERM): a trial blocked waiting for its next
  report must learn at once that it should save where it is, before Tune stops it.
* **Where a trial's replicas run** (their Ray node ids, posted at each launch): the
  scheduler moves a trial off a node Ray is draining (a spot node's preemption notice).
* **How many replicas a trial should run on** (the scheduler's decision): the trial
  resizes itself in place, keeping the replicas that stay, without Tune pausing it.

:class:`ExperimentControl` is a small async Ray actor (no CPUs) that the scheduler starts
in the driver's Ray job; trials find it by name (:func:`find`). A trial run without
:class:`~adaptdl_ray.tune.AdaptDLScheduler` finds none and simply skips both.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

LOG = logging.getLogger(__name__)

__all__ = ["ExperimentControl", "TargetReader", "control_name", "start", "find"]


def control_name() -> str:
    """The name of this Ray job's control actor (a driver and the actors it starts share
    the job id, so concurrent experiments on one cluster do not meet)."""
    return f"adaptdl_control_{ray.get_runtime_context().get_job_id()}"


class ExperimentControl:
    """Actor body: hints, replica nodes and target sizes by trial id, trials about to
    pause, one interrupt flag, and the trials' acknowledgements of it."""

    def __init__(self) -> None:
        self._hints: dict[str, str] = {}
        self._nodes: dict[str, tuple[list[str], int | None]] = {}  # trial -> its launch
        self._targets: dict[str, tuple[int, float]] = {}
        self._pausing: set[str] = set()
        self._interrupted = asyncio.Event()
        self._acks: set[str] = set()

    async def pausing(self, trial_id: str) -> None:
        """The scheduler paused the trial: its next save precedes a stop."""
        self._pausing.add(trial_id)

    async def take_pausing(self, trial_id: str) -> bool:
        """Whether the trial's save now precedes a pause (and forget it)."""
        if trial_id in self._pausing:
            self._pausing.discard(trial_id)
            return True
        return False

    async def put_hints(self, trial_id: str, hints_json: str) -> None:
        """Store a trial's latest scheduler hints (``SchedHints`` as JSON)."""
        self._hints[trial_id] = hints_json

    async def get_hints(self, trial_ids: list[str]) -> dict[str, str]:
        """The latest hints of the given trials that posted any."""
        return {t: self._hints[t] for t in trial_ids if t in self._hints}

    async def put_nodes(self, trial_id: str, node_ids: list[str],
                        restarts: int | None = None) -> None:
        """Store the Ray node ids (hex) of a trial's replicas in its current launch, one
        per replica, and the launch's restart count (``None``: not said)."""
        self._nodes[trial_id] = (list(node_ids), restarts)

    async def get_nodes(self, trial_ids: list[str]
                        ) -> dict[str, tuple[list[str], int | None]]:
        """``(replica node ids, restart count)`` of the current launch of each given trial
        that posted one (see :meth:`put_nodes`)."""
        return {t: self._nodes[t] for t in trial_ids if t in self._nodes}

    async def set_target(self, trial_id: str, replicas: int, decided: float) -> None:
        """The scheduler's decision, taken at ``decided`` (seconds since the epoch): the
        trial should run on ``replicas`` replicas."""
        self._targets[trial_id] = (int(replicas), float(decided))

    async def get_target(self, trial_id: str) -> tuple[int, float] | None:
        """``(replicas, decided)`` the scheduler last decided for the trial (``None``:
        none yet)."""
        return self._targets.get(trial_id)

    async def forget(self, trial_id: str) -> None:
        """Drop an ended trial's hints, nodes and target."""
        self._hints.pop(trial_id, None)
        self._nodes.pop(trial_id, None)
        self._targets.pop(trial_id, None)
        self._pausing.discard(trial_id)

    async def new_experiment(self) -> None:
        """Forget an earlier experiment's interrupt (the driver ran it to its end). The
        event is cleared, not replaced: a trial that began waiting before this call
        still wakes on the next interrupt (the driver does not wait for this call)."""
        self._interrupted.clear()
        self._acks.clear()

    async def interrupt(self) -> None:
        """Tell every trial to save where it is: wakes all :meth:`wait_interrupt` calls."""
        self._interrupted.set()

    async def wait_interrupt(self) -> bool:
        """Returns (True) once :meth:`interrupt` was called."""
        await self._interrupted.wait()
        return True

    async def ack(self, trial_id: str) -> None:
        """A trial saved its state after the interrupt (or had nothing to save)."""
        self._acks.add(trial_id)

    async def acks(self) -> list[str]:
        """Trial ids that acknowledged the interrupt."""
        return sorted(self._acks)


# The driver's handle of its job's control actor, held for the driver's whole life: a
# (non-detached) actor dies with the last handle to it, and one experiment's scheduler is
# freed before the next experiment of the same driver starts. Keyed by the Ray session
# and job: after ``ray.shutdown()`` and ``ray.init()`` (a notebook restarting Ray, a
# script looping over experiments) the job id can repeat in the new cluster, where the old
# handle names no actor.
_driver_handle: tuple[tuple[str, str], Any] | None = None


def start() -> Any:
    """Start this job's control actor (in the driver), or return the running one, with its
    interrupt state cleared for a new experiment (asked, not waited for)."""
    global _driver_handle
    context = ray.get_runtime_context()
    key = (context.get_session_name(), context.get_job_id())
    if _driver_handle is None or _driver_handle[0] != key:
        # On the driver's node: it lives as long as the driver, and a node that is drained
        # or lost must not take the experiment's control with it.
        here = NodeAffinitySchedulingStrategy(context.get_node_id(), soft=False)
        remote = ray.remote(ExperimentControl).options(
            name=control_name(), num_cpus=0, max_concurrency=1000, get_if_exists=True,
            scheduling_strategy=here)
        _driver_handle = (key, remote.remote())
    handle = _driver_handle[1]
    # Not waited for: the actor's start would hold up Tune's first trial by a second or
    # more (benchmarks/many_trials.py); a call made after this one sees the cleared state.
    handle.new_experiment.remote()
    return handle


def find() -> Any | None:
    """This job's control actor, or ``None`` when no AdaptDLScheduler runs the experiment."""
    try:
        return ray.get_actor(control_name())
    except ValueError:
        return None


class TargetReader:
    """A trial's view of its size as the scheduler decided it: asked of the experiment's
    control actor at most every ``every_s`` seconds (a trial's loop asks each second).

    Args:
        control: the control actor (``None``: no scheduler; there is no target then).
        trial_id: the trial.
        every_s: seconds between asks.
    """

    def __init__(self, control: Any | None, trial_id: str, every_s: float = 1.0) -> None:
        self.control = control
        self.trial_id = trial_id
        self.every_s = every_s
        #: The latest decision (replicas) and when it was taken (seconds since the epoch).
        self.target: int | None = None
        self.decided_at: float | None = None
        self._next = 0.0

    def read(self, force: bool = False) -> int | None:
        """The scheduler's latest decision for the trial (``force``: ask now; ``None``: no
        scheduler or no decision yet). A failed ask keeps the last answer (logged)."""
        now = time.monotonic()
        if self.control is None or (not force and now < self._next):
            return self.target
        self._next = now + self.every_s
        try:
            answer = ray.get(self.control.get_target.remote(self.trial_id), timeout=10)
        except ray.exceptions.RayError as exc:
            LOG.debug("trial %s: could not read its target size: %s", self.trial_id, exc)
            return self.target
        if answer is not None:
            self.target, self.decided_at = int(answer[0]), float(answer[1])
        return self.target
