"""Who decides a submitted job's size: the one seam between an elastic job and a
decision core.

An :class:`~adaptdl_ray.cluster.elastic_job.ElasticJob` asks a :class:`Sizer` how many
replicas to start with, tells it what it runs and what its replicas report, and carries
out the resizes it decides. :class:`CoreSizer` decides with a
:class:`~adaptdl_core.decision.DecisionCore` of the job's own, driven by a
:class:`~adaptdl_core.decision.CoreDriver` as every front-end drives its core; by default
(:func:`default_sizer`) its solves go to the cluster allocator, which weighs every job and
trial on the cluster together (and it decides alone, over the whole cluster, while the
allocator cannot be reached).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Mapping, Protocol, Sequence

from adaptdl_core.decision import (CoreDriver, Decision, DecisionCore, JobProgress,
                                   JobSpec, NodeInfo, SolveRequest)
from adaptdl_core.policy import amortised_resize_verdict
from adaptdl_ray.replicas.nodes import Cached, cluster_nodes

LOG = logging.getLogger(__name__)

__all__ = ["Sizer", "CoreSizer", "default_sizer"]

# How long the cluster's node list is reused before ray.nodes() is asked again.
_NODES_TTL_S = 10.0
#: Seconds between periodic re-decisions of a submitted job's size.
DEFAULT_INTERVAL_S = 30.0
#: Seconds a resize is assumed to cost before one is measured (raised to the measured
#: start-up), for submitted jobs and Tune trials alike: both resize in place, keeping the
#: replicas that stay and starting new ones while they train, so a resize costs a
#: checkpoint, a rendezvous and a first step (benchmarks/resize_cost.py measures it), far
#: below Pollux's 30-s prior for relaunched jobs; that prior kept young jobs from growing
#: for minutes.
JOB_RESIZE_COST_PRIOR_S = 5.0


class Sizer(Protocol):
    """The decisions an elastic job acts on (see the module docstring)."""

    def start(self) -> int:
        """Register the job; the number of replicas to start it with (>= min_replicas).
        A sizer may also set ``start_type``: the accelerator type to start them on."""

    def observe(self, replicas: int, *, nodes: Sequence[str] | None = None,
                hints: Mapping[str, Any] | None = None,
                progress: JobProgress | None = None) -> None:
        """What the job runs now (``replicas``, on ``nodes``: one node id per replica, if
        known), its latest scheduler hints and progress."""

    def decision(self) -> Decision:
        """The job's standing decision (re-solving when due)."""

    def begin_resize(self, decision: Decision) -> None:
        """The job is carrying out ``decision`` (a resize) now."""

    def end(self, outcome: str = "ended") -> None:
        """The job ended (``outcome``: ``finished``, ``failed``, ``stopped``...): its
        replicas are free."""


class CoreSizer:
    """A :class:`Sizer` with a decision core of the job's own, driven by a
    :class:`~adaptdl_core.decision.CoreDriver` (its solves in this thread).

    Args:
        job_id: the job's name.
        spec: its replicas' shape and bounds.
        state_dir: where the core's record of the job is kept across submissions (its age,
            resizes and their measured costs); ``None``: not kept.
        interval_s: seconds between periodic re-decisions.
        nodes_fn: returns the cluster as node id -> NodeInfo (default: ``ray.nodes()``).
        clock: the core's clock.
        solver: where its solves run (see :class:`~adaptdl_core.decision.CoreDriver`):
            ``None`` plans alone over every alive node (work the core does not know about
            is not subtracted: a grow is carried out only once its replicas' resources are
            free, see ``ElasticJob``); an
            :class:`~adaptdl_ray.cluster.client.AllocatorSolver` shares the cluster.
        resize_cost_prior_s: seconds a resize is assumed to cost before one is measured
            (see :data:`JOB_RESIZE_COST_PRIOR_S`).

    Attributes:
        start_type: the accelerator type :meth:`start` chose for the job's replicas
            (``None``: any node; always on a cluster of one type).
    """

    def __init__(self, job_id: str, spec: JobSpec, *, state_dir: str | None = None,
                 interval_s: float = DEFAULT_INTERVAL_S,
                 nodes_fn: Callable[[], Mapping[Any, NodeInfo]] | None = None,
                 clock: Callable[[], float] = time.time,
                 solver: Callable[[SolveRequest], None] | None = None,
                 resize_cost_prior_s: float = JOB_RESIZE_COST_PRIOR_S) -> None:
        self.job_id = job_id
        self.spec = spec
        self._nodes = Cached(nodes_fn or cluster_nodes, _NODES_TTL_S)
        self.core = DecisionCore(clock=clock, interval_s=interval_s,
                                 resize_cost_prior_s=resize_cost_prior_s,
                                 resize_rule=amortised_resize_verdict)
        self.driver = CoreDriver(self.core, solve_wait_s=None, solver=solver,
                                 state_dir=state_dir)
        self.driver.restore_saved()  # (its age, resizes and their costs, across submissions)
        self.start_type: str | None = None

    def _refresh_nodes(self, force: bool = False) -> None:
        self.core.set_nodes(self._nodes.get(refresh=force))

    def start(self) -> int:
        """Add the job to the core and solve; the policy's start size, kept within the
        job's bounds and the cluster.

        Raises:
            ValueError: the cluster cannot hold ``min_replicas`` replicas at all.
        """
        self._refresh_nodes(force=True)
        self.core.add_job(self.job_id, self.spec)
        decision = self.driver.decide()[self.job_id]
        replicas = self.spec.fitted(max(decision.replicas, 1), self.core.nodes)
        self.start_type = decision.accelerator_type
        # The core now knows the job runs at that size (a start is not a resize).
        self.core.running(self.job_id, replicas=replicas)
        self.driver.save()
        return replicas

    def observe(self, replicas: int, *, nodes: Sequence[str] | None = None,
                hints: Mapping[str, Any] | None = None,
                progress: JobProgress | None = None) -> None:
        """Pass the job's size (and where its replicas run, when ``nodes`` gives one
        known node per replica: on a cluster of several types, the type it runs on), hints
        and progress to the core."""
        if nodes is not None and len(nodes) == replicas and replicas and \
                all(n in self.core.nodes for n in nodes):
            self.core.running(self.job_id, nodes=list(nodes))
        else:
            self.core.running(self.job_id, replicas=replicas)
        if self.core.update(self.job_id, hints=hints, progress=progress):
            self.driver.save()

    def decision(self) -> Decision:
        """The core's decision (it re-solves when its interval is up or the cluster
        changed; the record is written after each solve)."""
        self._refresh_nodes()
        return self.driver.decide()[self.job_id]

    def begin_resize(self, decision: Decision) -> None:
        """Record the resize (its reason, predicted saving and cost)."""
        self.core.begin_resize(self.job_id, decision)
        self.driver.save()

    def end(self, outcome: str = "ended") -> None:
        """Remove the job from the core (its record stays for a later submission) and
        free its share of a shared cluster, saying how it ended (``outcome``)."""
        self.core.remove(self.job_id, outcome)
        self.driver.save()
        leave = getattr(self.driver.solver, "leave", None)
        if callable(leave):
            leave({str(k): v for k, v in self.core.pending_outcomes().items()})


def default_sizer(job_id: str, spec: JobSpec, state_dir: str | None, *,
                  owner: str | None = None, interval_s: float = DEFAULT_INTERVAL_S) -> Sizer:
    """The sizer a submitted job uses: a :class:`CoreSizer` whose solves go to the cluster
    allocator (started on first use), sharing the cluster with every other AdaptDL job and
    experiment on it (``owner``: who submitted it, for listings; ``interval_s``: seconds
    between re-decisions of its size)."""
    from adaptdl_ray.cluster.client import AllocatorSolver, new_member_id
    solver = AllocatorSolver(new_member_id("job"), job_id, interval_s=interval_s,
                             kind="job", owner=owner)
    return CoreSizer(job_id, spec, state_dir=state_dir, interval_s=interval_s,
                     solver=solver)
