"""Pollux in the simulator: this library's scheduler fed by each job's own agent.

Two paths, same inputs (each job's :meth:`SimJob.hints`: its refitted ``PerfParams``, its
``GradParams``, batch limits and profiled extent):

* :class:`CorePollux` (default): :class:`adaptdl_core.decision.DecisionCore` around
  :class:`~adaptdl_core.policy.PolluxPolicy` (p = -1) or another policy object, the path
  the Ray Tune scheduler takes: arrivals, hints and progress go in as events, and the
  core's decisions (start, resize, hold, keep, wait) come out, including its own rules (a
  resize only when it pays for its cost, jobs close to the end left alone).
* :class:`DirectPollux` (``use_core=False``): the same policy called directly every round,
  its allocation applied as is (the paper's Pollux, without the core's resize rules).

Both weigh jobs as Pollux does: each job's speedup relative to its speedup at its fair share
of the cluster (``PolluxPolicy(fair_share=True)``). Both are plain objects with the
simulator's ``decide(now, jobs, allocations, nodes)``. What they learn of a job's remaining
work is what a front-end knows (:func:`remaining_seconds`), never the traces' exact figure.
"""

from __future__ import annotations

import logging
from typing import Dict, List, Mapping, Optional

from ..decision import (CoreDriver, DecisionCore, JobProgress, JobSpec, NodeInfo,
                        estimate_remaining_s, job_info)
from ..policy import PolluxPolicy
from .baselines import pack
from .job_model import SimJob

__all__ = ["CorePollux", "DirectPollux", "make_pollux", "job_spec", "remaining_seconds"]

logger = logging.getLogger(__name__)

#: Most replicas a job may use in the simulated cluster (the traces reach 64).
MAX_REPLICAS = 64


def job_spec(job: SimJob, max_replicas: int = MAX_REPLICAS,
             profile_group: Optional[str] = None) -> JobSpec:
    """One GPU per replica, at most ``max_replicas`` (64) replicas and no more than its
    largest batch at the smallest micro-batch (1 for a fixed-batch job such as ncf, which
    does not scale out), in ``profile_group`` if given."""
    app = job.app
    if job.target_batch_size is not None:
        return JobSpec({"GPU": 1}, min_replicas=1, max_replicas=1, profile_group=profile_group)
    return JobSpec({"GPU": 1}, min_replicas=1,
                   max_replicas=max(1, min(max_replicas, app.max_batch_size // app.min_local_bsz)),
                   profile_group=profile_group)


def epochs_done(job: SimJob) -> float:
    """Epochs the job has trained, with the fraction of the current one: what its loader
    knows (its progress into the epoch, the quantity that ends an epoch under adaptive
    batch sizes), as a job agent reports it every round."""
    app = job.app
    if job.epoch >= app.max_epochs:
        return float(app.max_epochs)
    start, end = app.epoch_progress(job.epoch), app.epoch_progress(job.epoch + 1)
    fraction = (job.progress - start) / (end - start) if end > start else 0.0
    return job.epoch + min(max(fraction, 0.0), 1.0)


def remaining_seconds(job: SimJob) -> Optional[float]:
    """What a front-end estimates the job has left: the core's
    :func:`~adaptdl_core.decision.estimate_remaining_s` from the epochs trained so far
    (:func:`epochs_done`, fractions included), the planned epochs and its training time so
    far (``None`` before it has trained at all). Never the traces' exact figure: the
    estimate lags changes of allocation and batch, as a real one does."""
    return estimate_remaining_s(epochs_done(job), job.app.max_epochs, job.trained_s)


class CorePollux:
    """Pollux through the decision core (see module doc).

    Args:
        p: power-mean exponent of the fitness.
        interval: seconds between re-solves (the simulator's round).
        resize_rule: the core's resize rule (``None``: its default,
            :func:`~adaptdl_core.policy.resize_verdict`).
        policy: the core's allocation policy instead of Pollux (``p`` is then unused),
            e.g. :class:`~adaptdl_core.policy.RemainingWorkPolicy`; its ``name``
            attribute, if any, names this object.
        max_replicas: most replicas a job may get.
        node_types: node id -> GPU type on a typed cluster: the core's nodes carry their
            type, each job's hints name the type they were measured on, and a start or
            resize the core could not place where it said is placed on its own type.
        profile_groups: put the jobs of one model in one profile group (see
            :class:`~adaptdl_core.decision.JobSpec`).
        report_restarting: tell the core which jobs are still paying their restart
            (``JobProgress.restarting``), so that it keeps them where they are.

    Attributes:
        conflicts: starts/resizes whose target nodes were still held by a job the core
            kept or held, placed on other free GPUs instead (or not carried out).
    """

    name = "pollux"
    path = "decision-core"

    def __init__(self, p: float = -1.0, interval: float = 60.0, resize_rule=None,
                 policy=None, *, max_replicas: int = MAX_REPLICAS,
                 node_types: Optional[Mapping[int, str]] = None,
                 profile_groups: bool = False, report_restarting: bool = False) -> None:
        self._now = 0.0
        self.max_replicas = int(max_replicas)
        self.node_types = dict(node_types) if node_types is not None else None
        self.profile_groups = bool(profile_groups)
        self.report_restarting = bool(report_restarting)
        if policy is not None:
            self.name = getattr(policy, "name", type(policy).__name__)
        self.core = DecisionCore(policy=policy or PolluxPolicy(p=p, fair_share=True),
                                 clock=lambda: self._now,
                                 interval_s=interval, resize_rule=resize_rule)
        # Driven as every front-end drives its core (here in the calling thread: the
        # simulated clock waits for each solve).
        self.driver = CoreDriver(self.core, solve_wait_s=None)
        self._known: set = set()
        self._nodes: Optional[Dict[int, int]] = None
        self.conflicts = 0

    def decide(self, now: float, jobs: Mapping[str, SimJob], allocations: Mapping[str, List[int]],
               nodes: Mapping[int, int]) -> Dict[str, List[int]]:
        """New allocations (name -> node ids) for the active ``jobs``."""
        self._now = float(now)
        core = self.core
        types = self.node_types or {}
        if self._nodes != dict(nodes):
            self._nodes = dict(nodes)
            core.set_nodes({n: NodeInfo({"GPU": float(c)}, accelerator_type=types.get(n))
                            for n, c in nodes.items()})
        for name in list(self._known):
            if name not in jobs:
                core.remove(name)
                self._known.discard(name)
        for name, job in jobs.items():
            if name not in self._known:
                group = job.app.name if self.profile_groups else None
                core.add_job(name, job_spec(job, self.max_replicas, group),
                             submitted=job.submission_time)
                self._known.add(name)
            hints = job.hints().to_dict()
            if self.node_types is not None and job.gpu_type is not None and job.profile:
                hints["accelerator_type"] = job.gpu_type
            core.update(name, hints=hints,
                        progress=JobProgress(remaining_s=remaining_seconds(job),
                                             restarts=job.num_restarts or 0,
                                             launch_s=job.restart_s or None,
                                             restarting=(job.rescale_left > 0
                                                         if self.report_restarting else None)))
            core.running(name, nodes=list(allocations.get(name, [])))
        decisions = self.driver.decide()
        free = dict(nodes)
        out: Dict[str, List[int]] = {}
        moves = []
        for name, d in decisions.items():
            if d.action in ("keep", "hold"):
                out[name] = list(allocations.get(name, []))
                for n in out[name]:
                    free[n] -= 1
            elif d.action in ("start", "resize") and d.replicas > 0:
                moves.append((name, d))
        late = []
        for name, d in moves:
            want: Dict[int, int] = {}
            for n in d.nodes:
                want[n] = want.get(n, 0) + 1
            if all(free.get(n, 0) >= c for n, c in want.items()):
                out[name] = list(d.nodes)
                for n in d.nodes:
                    free[n] -= 1
            else:
                late.append((name, d))
        for name, d in late:
            self.conflicts += 1
            room = free
            if self.node_types is not None and d.nodes:
                # A job runs on one type: place it among its target type's nodes only.
                kind = self.node_types[d.nodes[0]]
                room = {n: c for n, c in free.items() if self.node_types[n] == kind}
            if d.replicas <= sum(room.values()):
                out[name] = pack(d.replicas, room)
                for n in out[name]:
                    free[n] = room[n]
            elif allocations.get(name) and all(
                    free[n] >= allocations[name].count(n) for n in set(allocations[name])):
                out[name] = list(allocations[name])
                for n in out[name]:
                    free[n] -= 1
        return out


class DirectPollux:
    """Pollux's allocation applied as is every round (see module doc)."""

    name = "pollux"
    path = "direct"

    def __init__(self, p: float = -1.0, max_replicas: int = MAX_REPLICAS) -> None:
        self.policy = PolluxPolicy(p=p, fair_share=True)
        self.max_replicas = int(max_replicas)
        self._created: Dict[str, float] = {}
        self._speedups: Dict[str, tuple] = {}

    def decide(self, now: float, jobs: Mapping[str, SimJob], allocations: Mapping[str, List[int]],
               nodes: Mapping[int, int]) -> Dict[str, List[int]]:
        """New allocations (name -> node ids) for the active ``jobs``."""
        from ..decision import speedup_from_hints

        infos = {n: NodeInfo({"GPU": float(c)}) for n, c in nodes.items()}
        pjobs = {}
        for name, job in jobs.items():
            self._created.setdefault(name, float(now))
            hints = job.hints().to_dict()
            cached = self._speedups.get(name)
            if cached is None or cached[0] != hints:
                cached = self._speedups[name] = (hints, speedup_from_hints(hints))
            pjobs[name] = job_info(job_spec(job, self.max_replicas), infos, created=self._created[name],
                                   hints=hints, restarts=job.num_restarts or 0,
                                   restart_cost_s=job.restart_s,
                                   current_replicas=len(allocations.get(name, [])),
                                   speedup_fn=cached[1])
        base = {k: list(v) for k, v in allocations.items() if k in jobs}
        result = self.policy.allocate(pjobs, infos, base, now=now)
        return {k: list(v) for k, v in result.allocations.items() if v}


def make_pollux(p: float = -1.0, use_core: Optional[bool] = None, interval: float = 60.0,
                max_replicas: int = MAX_REPLICAS):
    """:class:`CorePollux` (``use_core`` true or ``None``) or :class:`DirectPollux`, its
    jobs given at most ``max_replicas`` replicas."""
    if use_core is False:
        return DirectPollux(p=p, max_replicas=max_replicas)
    return CorePollux(p=p, interval=interval, max_replicas=max_replicas)
