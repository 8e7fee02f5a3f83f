"""The simulator's round loop, shared by the cluster and the sweep simulations.

:func:`run_rounds` advances simulated time in steps and, at each step,

1. lets the **admission** (:class:`ArrivalAdmission`: jobs as they are submitted;
   :class:`QueueAdmission`: a fixed queue with at most so many jobs at once) add jobs to
   the active set; a new job's clock is brought to the loop's;
2. asks the **policy** (any object with ``decide(now, jobs, allocations, nodes)`` returning
   job name -> node ids, one entry per replica) for new allocations when a decision is due
   (:class:`Schedule`: every round of ``interval`` seconds, and optionally whenever a job
   was admitted or ended); a job whose allocation changed is restarted on its new one;
3. trains every active job for one step (a ``tick``, cut at the next round boundary), with
   an optional slowdown of multi-node jobs sharing a node (``interference``);
4. ends the jobs that finished their epochs and those the **stopping** rule (e.g. ASHA,
   :class:`adaptdl_core.sim.sweep.AshaStopping`) stops; their GPUs are free at the step's
   end.

An :class:`Observer` sees every admission, allocation, step and end: the cluster and sweep
modes record their results through one. An optional **cluster** (e.g.
:class:`adaptdl_core.sim.autoscale.ElasticCluster`) makes the node set change over time: it
is asked for the usable nodes before every decision; a job holding a node that is no longer
usable is stopped (its workers are gone) and the policy is consulted at once. The loop
stops when no job is active or pending, or when ``max_time`` is reached (after that
moment's decisions, before training further).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence

from .job_model import SimJob

__all__ = ["Schedule", "ArrivalAdmission", "QueueAdmission", "Observer", "RoundsOutcome",
           "run_rounds", "placement_of", "check_allocations"]

logger = logging.getLogger(__name__)

Allocations = Dict[str, List[int]]


@dataclass(frozen=True)
class Schedule:
    """When the loop steps and consults the policy.

    Attributes:
        tick: seconds per training step (``> 0``).
        interval: seconds between policy rounds (``None``: no rounds; decisions only on
            events). Steps are cut so that every round boundary is a step boundary.
        first_round: time of the first round.
        on_events: also decide at a step where a job was admitted or one ended.
    """

    tick: float
    interval: Optional[float] = None
    first_round: float = 0.0
    on_events: bool = False

    def __post_init__(self) -> None:
        """Raises ValueError for a ``tick`` or ``interval`` that is not a finite number
        ``> 0``."""
        for name in ("tick", "interval"):
            value = getattr(self, name)
            if value is None and name == "interval":
                continue
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number of seconds > 0, got "
                                 f"{value!r}")


class ArrivalAdmission:
    """Admit each job once its submission time has come, in arrival order (submission
    time, then the given order).

    Args:
        jobs: the jobs (their ``submission_time`` says when they arrive).
    """

    def __init__(self, jobs: Iterable[SimJob]) -> None:
        self._queue = sorted(jobs, key=lambda j: j.submission_time)  # stable: given order

    def admit(self, now: float, active: Mapping[str, SimJob]) -> List[SimJob]:
        """The jobs submitted by ``now`` and not admitted before."""
        i = 0
        while i < len(self._queue) and self._queue[i].submission_time <= now:
            i += 1
        out, self._queue = self._queue[:i], self._queue[i:]
        return out

    def pending(self) -> bool:
        """Whether jobs are still to arrive."""
        return bool(self._queue)


class QueueAdmission:
    """Admit a fixed queue in order, keeping at most ``concurrent`` jobs active (Ray Tune's
    ``max_concurrent_trials``); a job is created by ``make_job(name, now)`` when admitted.

    Raises:
        ValueError: ``concurrent`` < 1.
    """

    def __init__(self, names: Sequence[str], make_job: Callable[[str, float], SimJob],
                 concurrent: int) -> None:
        if concurrent < 1:
            raise ValueError(f"concurrent must be >= 1, got {concurrent}")
        self._queue = list(names)
        self._make = make_job
        self.concurrent = int(concurrent)

    def admit(self, now: float, active: Mapping[str, SimJob]) -> List[SimJob]:
        """New jobs from the head of the queue while fewer than ``concurrent`` run."""
        out = []
        while self._queue and len(active) + len(out) < self.concurrent:
            out.append(self._make(self._queue.pop(0), now))
        return out

    def pending(self) -> bool:
        """Whether jobs are still queued."""
        return bool(self._queue)


class Observer:
    """Hooks the loop calls; every one does nothing here (subclass what you record)."""

    def admitted(self, job: SimJob, now: float) -> None:
        """``job`` joined the active set at ``now``."""

    def allocated(self, now: float, jobs: Mapping[str, SimJob], allocations: Allocations,
                  decided: bool) -> None:
        """After the allocations for the step at ``now`` are in force (``decided``: the
        policy was consulted at this step)."""

    def trained(self, job: SimJob, epochs_before: int) -> None:
        """``job`` trained for one step; it had ``epochs_before`` epochs before it."""

    def ended(self, job: SimJob, status: str, at: float) -> None:
        """``job`` ended at ``at``: ``"completed"`` or ``"stopped"`` (by the stopping
        rule)."""


@dataclass
class RoundsOutcome:
    """What :func:`run_rounds` returns.

    Attributes:
        now: simulated time at the end.
        decision_times: wall seconds of each policy call.
        max_held: most GPUs held at once.
        admitted: every job admitted, in admission order.
        active: the jobs still active at the end (``max_time``).
    """

    now: float
    decision_times: List[float] = field(default_factory=list)
    max_held: int = 0
    admitted: List[SimJob] = field(default_factory=list)
    active: Dict[str, SimJob] = field(default_factory=dict)


def placement_of(alloc: Sequence[int]) -> tuple:
    """Replicas per node of an allocation (node ids, one per replica), in allocation order
    (runs of the same node id)."""
    out: List[int] = []
    for i, n in enumerate(alloc):
        if i == 0 or n != alloc[i - 1]:
            out.append(1)
        else:
            out[-1] += 1
    return tuple(out)


def check_allocations(allocs: Mapping[str, Sequence[int]], nodes: Mapping[int, int]) -> None:
    """Raises RuntimeError if ``allocs`` use a node that does not exist or more GPUs of a
    node than it has."""
    used: Dict[int, int] = {}
    for a in allocs.values():
        for n in a:
            used[n] = used.get(n, 0) + 1
    for n, c in used.items():
        if n not in nodes or c > nodes[n]:
            raise RuntimeError(f"policy over-allocated node {n}: {c} replicas, capacity "
                               f"{nodes.get(n, 0)}")


def _slowdowns(active: Mapping[str, SimJob], alloc: Mapping[str, List[int]],
               interference: float) -> Dict[str, float]:
    """Per job, ``interference`` if it spans nodes and shares one with another job that
    spans nodes, else nothing."""
    if interference <= 0:
        return {}
    multi: Dict[int, int] = {}
    for a in alloc.values():
        if len(set(a)) > 1:
            for n in set(a):
                multi[n] = multi.get(n, 0) + 1
    out = {}
    for name in active:
        a = set(alloc.get(name, ()))
        if len(a) > 1 and any(multi.get(n, 0) > 1 for n in a):
            out[name] = interference
    return out


def _cluster_nodes(cluster, now: float, active: Mapping[str, SimJob], alloc: Allocations,
                   nodes: Mapping[int, int]) -> tuple:
    """``(usable nodes, whether they changed)`` from ``cluster`` at ``now``; a job holding
    a node no longer usable is stopped and loses its allocation (``alloc`` is updated)."""
    current = dict(cluster.update(now, active, alloc))
    if current == dict(nodes):
        return nodes, False
    for name in [k for k, v in alloc.items() if any(n not in current for n in v)]:
        active[name].reallocate(())
        del alloc[name]
    return current, True


def _allocation_type(name: str, alloc: Sequence[int], node_types: Mapping[int, str]) -> str:
    """The one GPU type of ``alloc``'s nodes.

    Raises:
        RuntimeError: the allocation spans several types (a job runs on one at a time)."""
    types = {node_types[n] for n in alloc}
    if len(types) != 1:
        raise RuntimeError(f"policy placed job {name} on several GPU types {sorted(types)}: "
                           "a job runs on one type at a time")
    return types.pop()


def run_rounds(policy, admission, *, nodes: Mapping[int, int], schedule: Schedule,
               stopping=None, observer: Optional[Observer] = None,
               max_time: Optional[float] = None, interference: float = 0.0,
               cluster=None, node_types: Optional[Mapping[int, str]] = None) -> RoundsOutcome:
    """Run the loop of the module doc until no job is active or pending, or ``max_time``.

    Args:
        policy: ``decide(now, jobs, allocations, nodes) -> allocations`` (see module doc).
        admission: ``admit(now, active) -> new jobs`` and ``pending() -> bool``.
        nodes: node id -> GPUs.
        schedule: steps and rounds.
        stopping: ``stop(name, job, epochs_before) -> bool`` after each step of a job that
            has not completed (``None``: jobs end only by completing).
        observer: see :class:`Observer`.
        max_time: stop at this simulated time (``None``: run to the end).
        interference: slowdown fraction of a multi-node job sharing a node with another
            multi-node job, in ``[0, 1)``.
        cluster: ``None`` (``nodes`` are fixed), or an object whose
            ``update(now, jobs, allocations) -> {node id: GPUs}`` gives the usable nodes at
            every step (it may change the jobs' progress, e.g. a loss to a preemption).
            ``nodes`` is then only the set before the first step. When the set changes,
            jobs holding a node that left it are stopped and the policy decides at once; with
            no usable node at all, every job waits (the policy is not called).
        node_types: node id -> GPU type, on a cluster of several types (``None``: one
            kind of GPU). Each job is then told the type of every allocation it gets
            (``SimJob.reallocate(placement, gpu_type)``).

    Raises:
        RuntimeError: the policy allocated more GPUs of a node than it has, or (with
            ``node_types``) placed a job on GPUs of several types.
    """
    obs = observer or Observer()
    out = RoundsOutcome(now=0.0)
    active = out.active
    alloc: Allocations = {}
    interval = schedule.interval
    next_round = schedule.first_round if interval is not None else math.inf
    now = 0.0
    event = False
    while True:
        for job in admission.admit(now, active):
            if job.now < now:
                job.advance(now - job.now)  # its clock starts at the loop's
            active[job.name] = job
            out.admitted.append(job)
            event = True
            obs.admitted(job, now)
        changed = False
        if cluster is not None:
            nodes, changed = _cluster_nodes(cluster, now, active, alloc, nodes)
        decided = bool(active) and (now >= next_round or (schedule.on_events and event)
                                    or changed)
        if decided:
            t0 = time.perf_counter()
            new = (policy.decide(now, active, alloc, nodes) if nodes or cluster is None
                   else {})
            out.decision_times.append(time.perf_counter() - t0)
            check_allocations(new, nodes)
            for name, job in active.items():
                if new.get(name) != alloc.get(name):
                    if node_types is not None and new.get(name):
                        job.reallocate(placement_of(new[name]),
                                       _allocation_type(name, new[name], node_types))
                    else:
                        job.reallocate(placement_of(new.get(name) or []))
            alloc = {k: list(v) for k, v in new.items() if v and k in active}
            if len(out.decision_times) % 100 == 0:
                logger.info("t=%.0f s: %d active, last decision %.0f ms", now, len(active),
                            out.decision_times[-1] * 1e3)
        if interval is not None and now >= next_round:
            next_round += interval * math.floor((now - next_round) / interval + 1)
        event = False
        out.max_held = max(out.max_held, sum(len(v) for v in alloc.values()))
        obs.allocated(now, active, alloc, decided)
        if not active and not admission.pending():
            break
        if max_time is not None and now >= max_time:
            break
        # One step: a tick, cut at the next round boundary.
        dt = schedule.tick if now + schedule.tick <= next_round else next_round - now
        dt = max(dt, 1e-9)
        slow = _slowdowns(active, alloc, interference)
        ended = []
        for name, job in active.items():
            before = job.epoch
            job.advance(dt, interference=slow.get(name, 0.0))
            obs.trained(job, before)
            if job.done:
                ended.append((name, "completed", float(job.completion_time)))
            elif stopping is not None and stopping.stop(name, job, before):
                ended.append((name, "stopped", now + dt))
        now += dt
        for name, status, at in ended:
            job = active.pop(name)
            alloc.pop(name, None)
            event = True
            obs.ended(job, status, at)
    out.now = now
    return out
