"""Who decides a submitted job's size: the one seam between an elastic job and a
decision core.

An :class:`~adaptdl_ray.cluster.elastic_job.ElasticJob` asks a :class:`Sizer` how many
replicas to start with, tells it what it runs and what its replicas report, and carries
out the resizes it decides. :class:`LocalSizer` decides with a
:class:`~adaptdl_core.decision.DecisionCore` of the job's own over the whole cluster (the
way a lone ``AdaptDLScheduler`` decides for its trials); a sizer backed by the cluster
allocator, which weighs every job and trial on the cluster together, implements the same
five methods.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Mapping, Protocol

from adaptdl_core.decision import (CoreState, Decision, DecisionCore, JobProgress, JobSpec,
                                   NodeInfo, cluster_capacity)

LOG = logging.getLogger(__name__)

__all__ = ["Sizer", "LocalSizer", "default_sizer"]

# How long the cluster's node list is reused before ray.nodes() is asked again.
_NODES_TTL_S = 10.0


class Sizer(Protocol):
    """The decisions an elastic job acts on (see the module docstring)."""

    def start(self) -> int:
        """Register the job; the number of replicas to start it with (>= min_replicas)."""

    def observe(self, replicas: int, *, hints: Mapping[str, Any] | None = None,
                progress: JobProgress | None = None) -> None:
        """What the job runs now (``replicas``), its latest scheduler hints and progress."""

    def decision(self) -> Decision:
        """The job's standing decision (re-solving when due)."""

    def begin_resize(self, decision: Decision) -> None:
        """The job is carrying out ``decision`` (a resize) now."""

    def end(self) -> None:
        """The job finished, failed or stopped: its replicas are free."""


def _ray_nodes() -> dict[str, NodeInfo]:
    from adaptdl_ray.tune.resources import cluster_nodes
    return cluster_nodes()


class LocalSizer:
    """A :class:`Sizer` with a decision core of the job's own, planning over every alive
    node of the cluster (work the core does not know about is not subtracted: a grow is
    carried out only once its replicas' resources are free, see ``ElasticJob``).

    Args:
        job_id: the job's name.
        spec: its replicas' shape and bounds.
        state_dir: where the core's record of the job is kept across submissions (its age,
            resizes and their measured costs); ``None``: not kept.
        interval_s: seconds between periodic re-decisions.
        nodes_fn: returns the cluster as node id -> NodeInfo (default: ``ray.nodes()``).
        clock: the core's clock.
    """

    def __init__(self, job_id: str, spec: JobSpec, *, state_dir: str | None = None,
                 interval_s: float = 30.0,
                 nodes_fn: Callable[[], Mapping[Any, NodeInfo]] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.job_id = job_id
        self.spec = spec
        self._state_dir = state_dir
        self._nodes_fn = nodes_fn or _ray_nodes
        self._nodes_at = -float("inf")
        state = None
        if state_dir is not None:
            try:
                state = CoreState.load(state_dir)
            except (OSError, ValueError) as exc:
                LOG.warning("ignoring the job's decision record in %s: %s", state_dir, exc)
        self.core = DecisionCore(clock=clock, interval_s=interval_s, state=state)

    def _refresh_nodes(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._nodes_at > _NODES_TTL_S:
            self.core.set_nodes(self._nodes_fn())
            self._nodes_at = now

    def _save(self) -> None:
        if self._state_dir is None:
            return
        try:
            self.core.state.save(self._state_dir)
        except OSError as exc:
            LOG.warning("could not save the job's decision record: %s", exc)

    def start(self) -> int:
        """Add the job to the core and solve; the policy's start size, kept within the
        job's bounds and the cluster.

        Raises:
            ValueError: the cluster cannot hold ``min_replicas`` replicas at all.
        """
        self._refresh_nodes(force=True)
        self.core.add_job(self.job_id, self.spec)
        decision = self.core.decide(force=True)[self.job_id]
        fitting = cluster_capacity(self.spec, self.core.nodes)
        replicas = self.spec.clamp(min(max(decision.replicas, 1), max(fitting, 1)))
        # The core now knows the job runs at that size (a start is not a resize).
        self.core.running(self.job_id, replicas=replicas)
        self._save()
        return replicas

    def observe(self, replicas: int, *, hints: Mapping[str, Any] | None = None,
                progress: JobProgress | None = None) -> None:
        """Pass the job's size, hints and progress to the core."""
        self.core.running(self.job_id, replicas=replicas)
        if self.core.update(self.job_id, hints=hints, progress=progress):
            self._save()

    def decision(self) -> Decision:
        """The core's decision (it re-solves when its interval is up or the cluster
        changed)."""
        self._refresh_nodes()
        due = self.core.due()
        decision = self.core.decide()[self.job_id]
        if due:
            self._save()
        return decision

    def begin_resize(self, decision: Decision) -> None:
        """Record the resize (its reason, predicted saving and cost)."""
        self.core.begin_resize(self.job_id, decision)
        self._save()

    def end(self) -> None:
        """Remove the job from the core (its record stays for a later submission)."""
        self.core.remove(self.job_id)
        self._save()


def default_sizer(job_id: str, spec: JobSpec, state_dir: str | None) -> Sizer:
    """The sizer a submitted job uses: today a :class:`LocalSizer` of its own (the one
    place where a sizer backed by the cluster allocator is to be chosen instead)."""
    return LocalSizer(job_id, spec, state_dir=state_dir)
