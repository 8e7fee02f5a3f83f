"""The fixed-size baselines of the Pollux paper's cluster experiment, as plain policies.

Both schedule jobs with their TunedJobs configuration (the workload's hand-tuned batch size;
Tiresias also its replica count) and never change a job's batch size. Each policy is a
plain object whose :meth:`decide` maps the active jobs and their current allocations to new
allocations (job name -> list of node ids, one entry per replica; a job left out does not
run). Time comes in as an argument (the simulator's clock).

* :class:`TiresiasPolicy`: two-queue discretised least-attained-service (Gu et al.,
  NSDI'19). A job enters the high-priority queue and drops to the low one once its attained
  GPU-time (seconds run x replicas) reaches ``queue_threshold_gpu_s`` (16 GPU-hours, the
  artifact's setting); within a queue, first come first served. Each round the queues are
  scanned in order and every job that fits in what is left of the cluster runs (smaller
  later jobs may pass a large one that does not fit); a job that no longer fits is
  preempted. Running jobs keep their nodes; new ones are packed onto the nodes with the
  most free GPUs first.
* :class:`FixedSharePolicy`: the sweep's static arm: every job gets the same number of
  GPUs, packed, as soon as that many are free, and keeps them to its end.
* :class:`OptimusPolicy`: Optimus (Peng et al., EuroSys'18) with an oracle for the
  remaining work: every active job gets one GPU (in arrival order, while GPUs last), then
  GPUs go one at a time to the job whose remaining time (exact remaining optimizer steps x
  the traced step time at its TunedJobs batch) drops most with one more replica. Jobs whose
  replica count is unchanged keep their nodes; the others are re-packed, smallest first.
"""

from __future__ import annotations

import math
from typing import Dict, List, Mapping, Sequence

from adaptdl_core import validation

from .job_model import SimJob

__all__ = ["TiresiasPolicy", "OptimusPolicy", "FixedSharePolicy", "pack", "packed_placement"]

Allocations = Dict[str, List[int]]


def pack(count: int, free: Dict[int, int]) -> List[int]:
    """Take ``count`` GPUs from ``free`` (node id -> free GPUs, updated in place), always from
    the node with the most free GPUs (lowest id on ties), as many as it has.

    Raises:
        ValueError: if fewer than ``count`` GPUs are free.
    """
    if count > sum(free.values()):
        raise ValueError(f"cannot place {count} replicas: only {sum(free.values())} GPUs free")
    out: List[int] = []
    while len(out) < count:
        node = max(free, key=lambda n: (free[n], -n))
        take = min(free[node], count - len(out))
        out.extend([node] * take)
        free[node] -= take
    return out


def packed_placement(num_replicas: int, gpus_per_node: int = 4) -> tuple:
    """Replicas per node when ``num_replicas`` fill whole nodes first (the shape Optimus
    predicts with)."""
    full, rest = divmod(num_replicas, gpus_per_node)
    return (gpus_per_node,) * full + ((rest,) if rest else ())


def _free_gpus(nodes: Mapping[int, int], allocations: Mapping[str, Sequence[int]]) -> Dict[int, int]:
    free = dict(nodes)
    for alloc in allocations.values():
        for n in alloc:
            free[n] -= 1
    return free


class TiresiasPolicy:
    """Two-queue least-attained-service with TunedJobs replica counts (see module doc).

    Args:
        queue_threshold_gpu_s: attained GPU-seconds after which a job is demoted.

    Raises:
        ValueError: a non-positive threshold.
    """

    name = "tiresias"
    #: Workload columns its jobs keep: the TunedJobs batch size and replica count.
    tuned = ("batch_size", "num_replicas")

    def __init__(self, queue_threshold_gpu_s: float = 16 * 3600.0) -> None:
        self.threshold = validation.number("queue_threshold_gpu_s", queue_threshold_gpu_s, 0.0,
                                           low_open=True, what="a finite number of GPU-seconds")
        self._queues: List[List[str]] = [[], []]
        self._running: Dict[str, bool] = {}
        self._executed: Dict[str, int] = {}
        self._last_check: Dict[str, int] = {}

    def decide(self, now: float, jobs: Mapping[str, SimJob], allocations: Mapping[str, List[int]],
               nodes: Mapping[int, int]) -> Allocations:
        """New allocations for the active ``jobs`` (name -> job, in arrival order) at time
        ``now`` given their current ``allocations`` and the ``nodes`` (id -> GPUs)."""
        t = int(now)
        self._queues = [[k for k in q if k in jobs] for q in self._queues]
        self._running = {k: v for k, v in self._running.items() if k in jobs}
        allocs = {k: list(v) for k, v in allocations.items() if k in jobs}
        for key in jobs:
            if key not in self._running:
                self._running[key] = False
                self._queues[0].append(key)
        for key, job in jobs.items():
            elapsed = t - self._last_check.get(key, 0)
            self._last_check[key] = t
            if self._running[key]:
                self._executed[key] = self._executed.get(key, 0) + elapsed
                gpu_s = self._executed[key] * job.target_num_replicas
                if key in self._queues[0] and gpu_s >= self.threshold:
                    self._queues[0].remove(key)
                    self._queues[1].append(key)
        left = sum(nodes.values())
        for queue in self._queues:
            for key in queue:
                need = jobs[key].target_num_replicas
                if need <= left:
                    self._running[key] = True
                    left -= need
                else:
                    self._running[key] = False
                    allocs.pop(key, None)
        free = _free_gpus(nodes, allocs)
        for queue in self._queues:
            for key in queue:
                if self._running[key] and not allocs.get(key):
                    allocs[key] = pack(jobs[key].target_num_replicas, free)
        return allocs


class OptimusPolicy:
    """Optimus+Oracle with TunedJobs batch sizes (see module doc).

    Args:
        gpus_per_node: GPUs per node of the shape the step time is predicted for.
    """

    name = "optimus"
    #: Workload columns its jobs keep: the TunedJobs batch size.
    tuned = ("batch_size",)

    def __init__(self, gpus_per_node: int = 4) -> None:
        self.gpus_per_node = int(gpus_per_node)
        self._cache: Dict[tuple, float] = {}

    def step_time(self, job: SimJob, num_replicas: int) -> float:
        """Oracle seconds of one optimizer step of ``job`` at its target batch on
        ``num_replicas`` replicas packed onto whole nodes (accumulation included; a single
        replica always accumulates at least once, as the artifact's predictor does)."""
        key = (job.app.name, job.target_batch_size, num_replicas)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        app = job.app
        local = math.ceil(job.target_batch_size / num_replicas - 1e-8)
        accum = math.ceil(local / app.max_local_bsz - 1e-8) - 1
        if num_replicas == 1:
            accum = max(1, accum)
        atomic = math.ceil(local / (accum + 1) - 1e-8)
        atomic = min(atomic, int(app.max_batch_size / (num_replicas * (accum + 1))))
        step, sync = app.step_time(packed_placement(num_replicas, self.gpus_per_node), atomic)
        out = step + (step - sync) * accum
        self._cache[key] = out
        return out

    @staticmethod
    def max_replicas(job: SimJob) -> int:
        """Most replicas Optimus gives ``job``: its batch at the smallest micro-batch (1 for
        ncf, whose model does not scale out)."""
        if job.app.name == "ncf":
            return 1
        return max(1, job.target_batch_size // job.app.min_local_bsz)

    def decide(self, now: float, jobs: Mapping[str, SimJob], allocations: Mapping[str, List[int]],
               nodes: Mapping[int, int]) -> Allocations:
        """New allocations for the active ``jobs`` (name -> job, in arrival order) given
        their current ``allocations`` and the ``nodes`` (id -> GPUs)."""
        left = sum(nodes.values())
        remaining = {k: j.remaining_iterations() for k, j in jobs.items()}
        counts: Dict[str, int] = {}
        gain: Dict[str, float] = {}

        def marginal(key: str) -> float:
            job, k = jobs[key], counts[key]
            if k + 1 > self.max_replicas(job) or left < 1:
                return 0.0
            return (self.step_time(job, k) - self.step_time(job, k + 1)) * remaining[key]

        for key in jobs:
            if left < 1:
                counts[key], gain[key] = 0, 0.0
                continue
            counts[key] = 1
            left -= 1
            gain[key] = marginal(key)
        while left > 0 and gain and max(gain.values()) > 0:
            key = max(gain, key=gain.get)
            counts[key] += 1
            gain[key] = marginal(key)
            left -= 1
        allocs = {k: list(v) for k, v in allocations.items()
                  if k in jobs and len(v) == counts[k]}
        free = _free_gpus(nodes, allocs)
        for key in sorted(jobs, key=lambda k: counts[k]):
            if counts[key] > 0 and not allocs.get(key):
                allocs[key] = pack(counts[key], free)
        return allocs


class FixedSharePolicy:
    """Every job gets ``gpus`` GPUs (packed on the nodes with the most free GPUs) as soon as
    that many are free, in the order the jobs are given, and keeps them.

    Raises:
        ValueError: ``gpus`` < 1.
    """

    name = "static"

    def __init__(self, gpus: int) -> None:
        self.gpus = validation.integer("gpus", gpus, 1)

    def decide(self, now: float, jobs: Mapping[str, SimJob], allocations: Mapping[str, List[int]],
               nodes: Mapping[int, int]) -> Allocations:
        """The current ``allocations`` of ``jobs``, plus ``gpus`` GPUs for each job without
        any while they last."""
        allocs = {k: list(v) for k, v in allocations.items() if k in jobs}
        free = _free_gpus(nodes, allocs)
        for key in jobs:
            if key not in allocs and sum(free.values()) >= self.gpus:
                allocs[key] = pack(self.gpus, free)
        return allocs
