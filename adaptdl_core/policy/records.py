"""What the allocator takes and gives: job, node and result records, with validation.

Inputs are plain data: :class:`JobInfo` per job (per-replica resources, a speedup
function, age, replica limits, restart history) and :class:`NodeInfo` per node (capacity).
An *allocation* of a job is a list of node keys with one entry per replica (a node appears
as many times as the job has replicas on it; ``[]`` means the job does not run).
:class:`AllocationResult` is an allocation of every job together with its quality.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Hashable, List, Mapping, Optional

import numpy as np

from adaptdl_core import validation

LOG = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_RESTART_COST_S",
    "JobInfo",
    "NodeInfo",
    "AllocationResult",
    "UNBOUNDED_REPLICA_CAP",
    "MAX_REPLICAS_PER_JOB",
]

#: Restart cost (seconds) assumed when a job has not measured its own: within the range the
#: Pollux paper reports for a checkpoint-restart. ``benchmarks/resize_cost.py`` measures what
#: one costs a torch trial on Ray on the machine at hand.
DEFAULT_RESTART_COST_S = 30.0

#: Most replicas a job is given when neither its ``max_replicas`` nor its speedup function
#: (``max_useful_replicas``) bounds it: the allocator's work grows with the replica counts it
#: considers, and must not grow with a node's capacity (a node may report 1e9 CPUs).
UNBOUNDED_REPLICA_CAP = 4096

#: Most replicas the allocator gives one job, whatever its ``max_replicas`` and the nodes'
#: capacity: an allocation lists one node key per replica and the allocator's work grows
#: with the replica counts it considers (``benchmarks/policy_bounds.py`` times a round for
#: one job at this bound). A larger ``max_replicas`` is lowered to it with a warning; a larger
#: ``min_replicas`` is refused.
MAX_REPLICAS_PER_JOB = 16384

# max_replicas values already warned about (see JobInfo); bounded, so never a leak.
_WARNED_MAX_REPLICAS: set = set()

SpeedupFn = Callable[[np.ndarray, np.ndarray], Any]
Allocations = Dict[Hashable, List[Hashable]]


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
        value, (bool, np.bool_))


def _check_resources(owner: str, resources: Any, need_positive: bool) -> Dict[str, float]:
    if not isinstance(resources, Mapping):
        raise ValueError(f"{owner}.resources must be a dict of resource name -> amount, "
                         f"got {type(resources).__name__}")
    out: Dict[str, float] = {}
    for name, amount in resources.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"{owner}.resources: resource names must be non-empty strings, "
                             f"got {name!r}")
        out[name] = validation.number(f"{owner}.resources[{name!r}]", amount, 0.0)
    if need_positive and not any(v > 0 for v in out.values()):
        raise ValueError(f"{owner}.resources must request a positive amount of at least one "
                         f"resource, got {dict(resources)!r}")
    return out

@dataclass
class JobInfo:
    """What the allocator knows about one job.

    Attributes:
        resources: resources one replica needs, e.g. ``{"CPU": 1}`` or
            ``{"GPU": 1, "CPU": 4}`` (amounts may be fractional; at least one positive).
        speedup_fn: vectorised ``f(num_nodes, num_replicas) -> speedup`` (see
            :mod:`adaptdl_core.policy.speedup`), 0 at 0 replicas.
        creation_timestamp: when the job was submitted, seconds (same clock as ``now``).
        min_replicas: fewest replicas the job may run with when it runs (``0`` to
            :data:`MAX_REPLICAS_PER_JOB`); below that it waits with 0 replicas.
        max_replicas: most replicas it may use; ``None``: the cluster and the speedup
            function's ``max_useful_replicas`` limit it (:data:`UNBOUNDED_REPLICA_CAP` for a
            speedup function without one). Above :data:`MAX_REPLICAS_PER_JOB` it is lowered
            to that, with a warning.
        preemptible: ``False`` pins a running job to its current allocation and keeps it
            off preemptible nodes.
        num_restarts: checkpoint-restarts the job has gone through so far (``>= 0``).
        restart_cost_s: measured seconds one checkpoint-restart costs the job (``>= 0``);
            defaults to :data:`DEFAULT_RESTART_COST_S` when unknown.
        remaining_s: the front-end's estimate of the seconds of training the job has left
            (``None``: unknown). Pollux ignores it; remaining-work-aware policies weigh by it.
        weight: the job's weight in the fitness (``> 0``, default 1): its power term is
            multiplied by it, so with ``p < 0`` a heavier job is given more replicas.
        type_speedups: accelerator type -> the job's speedup function on nodes of that
            type (:attr:`NodeInfo.accelerator_type`), all in one unit so that types
            compare (twice the value: twice as fast); ``None`` (default): the job runs
            alike on every type, at ``speedup_fn``. A type-aware policy never places the
            job on a type missing here; type-unaware policies use ``speedup_fn``.

    Raises:
        ValueError: when a field is malformed; the message names the field.
    """

    resources: Mapping[str, float]
    speedup_fn: SpeedupFn
    creation_timestamp: float
    min_replicas: int = 0
    max_replicas: Optional[int] = None
    preemptible: bool = True
    num_restarts: int = 0
    restart_cost_s: float = DEFAULT_RESTART_COST_S
    remaining_s: Optional[float] = None
    weight: float = 1.0
    type_speedups: Optional[Mapping[str, SpeedupFn]] = None

    def __post_init__(self) -> None:
        self.resources = _check_resources("JobInfo", self.resources, need_positive=True)
        if self.type_speedups is not None:
            if not isinstance(self.type_speedups, Mapping) or not self.type_speedups:
                raise ValueError("JobInfo.type_speedups must be None or a non-empty dict of "
                                 "accelerator type -> speedup function, got "
                                 f"{self.type_speedups!r}")
            for name, fn in self.type_speedups.items():
                if not callable(fn):
                    raise ValueError(f"JobInfo.type_speedups[{name!r}] must be callable("
                                     f"num_nodes, num_replicas), got {type(fn).__name__}")
        if not callable(self.speedup_fn):
            raise ValueError("JobInfo.speedup_fn must be callable(num_nodes, num_replicas), "
                             f"got {type(self.speedup_fn).__name__}")
        self.creation_timestamp = validation.number(
            "JobInfo.creation_timestamp", self.creation_timestamp,
            what="a finite number of seconds")
        # (The bound is MAX_REPLICAS_PER_JOB: the range in the message shows it.)
        self.min_replicas = validation.integer("JobInfo.min_replicas", self.min_replicas, 0,
                                               MAX_REPLICAS_PER_JOB)
        if self.max_replicas is not None:
            self.max_replicas = validation.integer("JobInfo.max_replicas", self.max_replicas, 0,
                                                   what="None or an integer")
            if self.max_replicas > MAX_REPLICAS_PER_JOB:
                # Once per distinct value: a scheduler rebuilds its JobInfos every round.
                if self.max_replicas not in _WARNED_MAX_REPLICAS and \
                        len(_WARNED_MAX_REPLICAS) < 64:
                    _WARNED_MAX_REPLICAS.add(self.max_replicas)
                    LOG.warning("JobInfo.max_replicas=%d is more than one job is ever given; "
                                "using MAX_REPLICAS_PER_JOB=%d", self.max_replicas,
                                MAX_REPLICAS_PER_JOB)
                self.max_replicas = MAX_REPLICAS_PER_JOB
            if self.max_replicas < self.min_replicas:
                raise ValueError(f"JobInfo.max_replicas ({self.max_replicas}) must be >= "
                                 f"min_replicas ({self.min_replicas})")
        if not isinstance(self.preemptible, (bool, np.bool_)):
            raise ValueError(f"JobInfo.preemptible must be a bool, got {self.preemptible!r}")
        self.preemptible = bool(self.preemptible)
        self.num_restarts = validation.integer("JobInfo.num_restarts", self.num_restarts, 0)
        if self.restart_cost_s is None:
            self.restart_cost_s = DEFAULT_RESTART_COST_S
        if not _is_real(self.restart_cost_s) or not math.isfinite(
                float(self.restart_cost_s)) or self.restart_cost_s < 0:
            raise ValueError(f"JobInfo.restart_cost_s must be a finite number >= 0, "
                             f"got {self.restart_cost_s!r}")
        self.restart_cost_s = float(self.restart_cost_s)
        if self.remaining_s is not None:
            if not _is_real(self.remaining_s) or not math.isfinite(
                    float(self.remaining_s)) or self.remaining_s < 0:
                raise ValueError(f"JobInfo.remaining_s must be None or a finite number of "
                                 f"seconds >= 0, got {self.remaining_s!r}")
            self.remaining_s = float(self.remaining_s)
        if not _is_real(self.weight) or not math.isfinite(float(self.weight)) \
                or self.weight <= 0:
            raise ValueError(f"JobInfo.weight must be a finite number > 0, got {self.weight!r}")
        self.weight = float(self.weight)

    def replica_bound(self) -> int:
        """Most replicas the allocator considers for this job: ``max_replicas``, the speedup
        function's ``max_useful_replicas`` (with ``type_speedups``: the largest of theirs)
        and :data:`UNBOUNDED_REPLICA_CAP`, whichever are given and smallest (never below
        ``min_replicas``)."""
        bound = UNBOUNDED_REPLICA_CAP if self.max_replicas is None else self.max_replicas
        fns = [self.speedup_fn] if self.type_speedups is None else list(
            self.type_speedups.values())
        each = [getattr(fn, "max_useful_replicas", None) for fn in fns]
        useful = max(each) if all(_is_int(u) and u >= 1 for u in each) else None
        if _is_int(useful) and useful >= 1:
            bound = min(bound, int(useful))
        return max(bound, self.min_replicas)


@dataclass
class NodeInfo:
    """One node's capacity.

    Attributes:
        resources: amounts available to jobs, e.g. ``{"CPU": 32, "GPU": 4}``.
        preemptible: whether the node may disappear (spot instance); non-preemptible jobs
            are never placed on it.
        accelerator_type: the kind of accelerator the node carries (e.g. ``"A100"``; Ray's
            ``accelerator_type:<T>`` resource), ``None`` when unknown. A type-aware policy
            runs each job on nodes of one type and weighs the types by the job's speed
            there (:attr:`JobInfo.type_speedups`); type-unaware policies ignore it.

    Raises:
        ValueError: when a field is malformed; the message names the field.
    """

    resources: Mapping[str, float]
    preemptible: bool = False
    accelerator_type: Optional[str] = None

    def __post_init__(self) -> None:
        self.resources = _check_resources("NodeInfo", self.resources, need_positive=False)
        if not isinstance(self.preemptible, (bool, np.bool_)):
            raise ValueError(f"NodeInfo.preemptible must be a bool, got {self.preemptible!r}")
        self.preemptible = bool(self.preemptible)
        if self.accelerator_type is not None and (
                not isinstance(self.accelerator_type, str) or not self.accelerator_type):
            raise ValueError(f"NodeInfo.accelerator_type must be None or a non-empty string "
                             f"such as 'A100', got {self.accelerator_type!r}")


@dataclass(frozen=True)
class AllocationResult:
    """An allocation and how good it is.

    Attributes:
        allocations: job key -> list of node keys, one entry per replica (``[]``: idle).
        speedups: job key -> effective speedup (speedup at its shape times the restart
            penalty when its allocation changed).
        fitness: power mean of ``speedups`` over all jobs (0 if a job idles and ``p <= 0``).
        num_idle: jobs with effective speedup 0.
        optimal: ``True`` when the result provably attains the best objective (it matches
            the dynamic programme's relaxation bound, or the branch and bound completed),
            up to the ``min_gain`` tolerance.
        gap: ``1 - fitness_of_running_jobs / bound``, an upper bound on the relative loss
            against the optimum (0 when optimal; ``inf`` when the relaxation runs more
            jobs; ``nan`` when the DP had to be thinned and gives no bound).
        solve_time_s: wall-clock seconds spent in the allocator.
        details: diagnostics (capacity model, DP size, stage that produced the result,
            search effort, bound and objective); the keys are not a stable API.
    """

    allocations: Allocations
    speedups: Dict[Hashable, float]
    fitness: float
    num_idle: int
    optimal: bool
    gap: float
    solve_time_s: float = 0.0
    details: Dict[str, Any] = field(default_factory=dict)
