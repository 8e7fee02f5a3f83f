"""The inputs and the run of one solve (:class:`SolveRequest`), apart from the decision core
that takes and applies them (:mod:`.core`): what a solve sees of each live job
(:class:`SolveEntry`), the request as plain data (a solve run in another process, or the
shared solve of a cluster allocator: :mod:`.shared`), and the run itself, which touches no
core state and so may run in a worker thread.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import Any, Callable, Hashable, Mapping, Sequence

from adaptdl_core.policy import AllocationResult, NodeInfo

from .held import held_reasons
from .jobs import EXPLORATION_FACTOR, JobSpec, cluster_capacity, job_info, profiled_extent
from .type_models import TypeSpeeds, typed_speedups

LOG = logging.getLogger(__name__)

__all__ = ["SolveEntry", "SolveRequest"]


@dataclasses.dataclass(frozen=True)
class SolveEntry:
    """One live job as a solve sees it (a snapshot)."""

    job_id: Hashable
    spec: JobSpec
    created: float
    hints: Any
    restarts: int
    cost_s: float
    current: int
    pinned: bool
    remaining_s: float | None = None
    name: str | None = None
    type_hints: dict | None = None
    current_type: Any = None


class SolveRequest:
    """The inputs of one solve, taken by :meth:`DecisionCore.begin_solve`; :meth:`run`
    computes the allocation without touching the core (so it may run in a worker thread),
    and :meth:`DecisionCore.finish_solve` applies it.

    Attributes:
        now: clock time of the snapshot (seconds).
        entries: the live jobs then.
        result: the policy's :class:`~adaptdl_core.policy.AllocationResult` once run
            (``None`` before, or when no job can run).
        unfit: job id -> why the cluster cannot hold it at all (judged on
            :attr:`totals`).
        totals: the whole cluster, other work's share included (``None``: ``nodes``): a job
            that fits there but not in ``nodes`` waits instead of being unfit.
        error: the exception the run raised, if any (re-raised by ``finish_solve``).
        seconds: wall-clock seconds the run took (models built and policy solved).
        reasons: job id -> why the solve kept it below its maximum while the cluster had
            room for more of it (see :mod:`adaptdl_core.decision.held`).
        ended: job id -> ``{"name", "outcome"}`` of the jobs the front-end removed since
            its previous solve (a shared cluster keeps listing them for a while).
    """

    def __init__(self, now: float, nodes: dict, entries: list, base: dict, policy: Any,
                 speedup_for: Callable[[Hashable, Any], Any],
                 totals: Mapping[Hashable, NodeInfo] | None = None) -> None:
        self.now = now
        self.nodes = nodes
        self.totals = totals
        self.entries = entries
        self.base = base
        self.policy = policy
        self._speedup_for = speedup_for
        self.result: Any = None
        self.unfit: dict = {}
        self.error: BaseException | None = None
        self.seconds = 0.0
        self.reasons: dict = {}
        self.ended: dict = {}
        #: On a cluster of several accelerator types: the type speed ratios, and
        #: ``(job id, type, hints) -> speedup function`` (a cache; see ``job_infos``).
        self.speeds: TypeSpeeds | None = None
        self.typed_speedup_for: Callable[[Hashable, Any, Any], Any] | None = None
        #: The policy's jobs of the latest :meth:`run` (job id -> JobInfo).
        self.infos: dict = {}

    # -- the request as plain data (a solve run in another process) ------------------
    def to_plain(self) -> dict[str, Any]:
        """The request's jobs as JSON-compatible data, for a solver in another process
        (the cluster allocator): ``{"now", "jobs": {job id: {...}}}``, each job with its
        spec (``JobSpec.to_dict()``), creation time, hints, restarts, resize cost,
        current replicas, whether it is pinned, its remaining seconds, its current
        placement (``base``) and its name; and ``"ended"``, the jobs removed since the
        front-end's previous solve (see :attr:`ended`). Job ids must be strings."""
        jobs = {}
        for e in self.entries:
            jobs[str(e.job_id)] = {
                "spec": e.spec.to_dict(), "created": e.created, "hints": e.hints,
                "restarts": e.restarts, "cost_s": e.cost_s, "current": e.current,
                "pinned": e.pinned, "remaining_s": e.remaining_s,
                "base": list(self.base.get(e.job_id, [])), "name": e.name}
            if e.type_hints is not None:
                jobs[str(e.job_id)]["type_hints"] = {str(k): v for k, v in
                                                     e.type_hints.items() if k is not None}
                jobs[str(e.job_id)]["current_type"] = e.current_type
        return {"now": self.now, "jobs": jobs,
                "ended": {str(k): dict(v) for k, v in self.ended.items()}}

    @classmethod
    def from_plain(cls, now: float, nodes: Mapping[Hashable, NodeInfo],
                   jobs: Mapping[Hashable, Mapping[str, Any]], policy: Any,
                   speedup_for: Callable[[Hashable, Any], Any],
                   totals: Mapping[Hashable, NodeInfo] | None = None) -> "SolveRequest":
        """A request over ``jobs`` (job id -> one job of :meth:`to_plain`'s ``"jobs"``,
        possibly gathered from several front-ends) on ``nodes``, solved by ``policy``
        (``totals``: see :attr:`totals`).

        Raises:
            ValueError: a job entry that lacks a field or has a malformed spec (named)."""
        entries, base = [], {}
        for job_id, job in jobs.items():
            try:
                entries.append(SolveEntry(job_id, JobSpec.from_dict(job["spec"]),
                                      float(job["created"]), job.get("hints"),
                                      int(job["restarts"]), float(job["cost_s"]),
                                      int(job["current"]), bool(job["pinned"]),
                                      job.get("remaining_s"), job.get("name"),
                                      job.get("type_hints"), job.get("current_type")))
            except (KeyError, TypeError) as exc:
                raise ValueError(f"job {job_id!r}: malformed solve entry ({exc!r})") from None
            if job.get("base"):
                base[job_id] = list(job["base"])
        return cls(float(now), dict(nodes), entries, base, policy, speedup_for, totals)

    def accept(self, allocations: Mapping[Hashable, Sequence[Hashable]],
               unfit: Mapping[Hashable, str] | None = None, *,
               solve_time_s: float = 0.0, seconds: float | None = None,
               reasons: Mapping[Hashable, str] | None = None) -> None:
        """Fill the request in with an allocation solved elsewhere (instead of
        :meth:`run`): job id -> node ids, one per replica; ``unfit``: job id -> why the
        cluster cannot hold it; ``seconds``: the whole round trip; ``reasons``: job id ->
        why it was kept below its maximum (see :attr:`reasons`)."""
        self.result = AllocationResult({k: list(v) for k, v in allocations.items()}, {},
                                       math.nan, 0, False, math.nan, float(solve_time_s))
        self.unfit = dict(unfit or {})
        self.reasons = dict(reasons or {})
        self.error = None
        if seconds is not None:
            self.seconds = float(seconds)

    def job_infos(self, nodes: Mapping[Hashable, NodeInfo] | None = None
                  ) -> dict[Hashable, Any]:
        """The policy's jobs (job id -> :class:`~adaptdl_core.policy.JobInfo`) on
        ``nodes`` (default: the request's own; another cluster, e.g. a larger one the
        autoscaler could grow to, bounds each job's replicas by what fits there). A job
        that cannot fit at all is left out and its reason kept in :attr:`unfit`."""
        nodes = self.nodes if nodes is None else nodes
        jobs: dict[Hashable, Any] = {}
        # How far beyond its profile a job may grow: the policy's own bound, else Pollux's.
        factor = getattr(self.policy, "exploration_factor", EXPLORATION_FACTOR)
        capacities: dict = {}   # per replica request: what the whole cluster holds
        for e in self.entries:
            need = tuple(sorted(e.spec.resources.items()))
            if need not in capacities:
                capacities[need] = cluster_capacity(e.spec, nodes)
            try:
                fn, fns = self._speedup_for(e.job_id, e.hints), None
                if e.type_hints is not None:
                    fns = self._typed(e, factor)
                    fn = fns.get(e.current_type) or next(iter(fns.values()))
                jobs[e.job_id] = job_info(
                    e.spec, nodes, created=e.created, hints=e.hints,
                    restarts=e.restarts, restart_cost_s=e.cost_s,
                    current_replicas=e.current, speedup_fn=fn,
                    remaining_s=e.remaining_s, exploration_factor=factor,
                    type_speedups=fns, capacity=capacities[need])
            except ValueError as exc:
                # Only a job the whole cluster cannot hold is unfit: one that other work
                # (or a trial's own reservation, not reported yet) leaves no room for now
                # waits, unannounced.
                if self.totals is None or \
                        cluster_capacity(e.spec, self.totals) < e.spec.min_replicas:
                    self.unfit[e.job_id] = str(exc)
                continue
            if e.pinned:
                # It would spend most of its remaining time on a resize: keep it.
                jobs[e.job_id].preemptible = False
        return jobs

    def _typed(self, e: "SolveEntry", factor: int) -> dict:
        """Entry ``e``'s speedup per accelerator type (one unit across types)."""
        speeds = self.speeds if self.speeds is not None else TypeSpeeds({})
        cache = self.typed_speedup_for
        build = None if cache is None else (lambda kind, hints: cache(e.job_id, kind, hints))
        return typed_speedups(e.type_hints, speeds, factor=factor,
                              current_type=e.current_type, current_replicas=e.current,
                              build=build)

    def run(self) -> None:
        """Build the policy's jobs and solve; errors are kept in :attr:`error`."""
        t0 = time.perf_counter()
        try:
            jobs = self.infos = self.job_infos()
            base = {k: v for k, v in self.base.items() if k in jobs}
            _unpin_conflicts(jobs, base, self.nodes)
            if jobs:
                self.result = self.policy.allocate(jobs, self.nodes, base, now=self.now)
                self.reasons = held_reasons(
                    jobs, self.nodes, self.result.allocations, self.now,
                    allowed={e.job_id: e.spec.max_replicas for e in self.entries},
                    profiled={e.job_id: profiled_extent(e.hints) for e in self.entries},
                    exploration_factor=getattr(self.policy, "exploration_factor",
                                               EXPLORATION_FACTOR))
        except Exception as exc:  # handed to finish_solve, in the core's thread
            self.error = exc
        finally:
            self.seconds = time.perf_counter() - t0


def _unpin_conflicts(jobs: Mapping[Hashable, Any], base: Mapping[Hashable, list],
                     nodes: Mapping[Hashable, NodeInfo]) -> None:
    """Pinned (finishing) jobs whose assumed placements overload a node, or name a node
    that is gone, are left movable: a guess must not make the round infeasible."""
    used: dict[Hashable, dict[str, float]] = {key: {} for key in nodes}
    for job_id, info in jobs.items():
        if info.preemptible or job_id not in base:
            continue
        placement = base[job_id]
        fits = all(key in used for key in placement)
        if fits:
            trial_use = {key: dict(used[key]) for key in set(placement)}
            for key in placement:
                for name, amount in info.resources.items():
                    trial_use[key][name] = trial_use[key].get(name, 0.0) + amount
            fits = all(trial_use[key].get(name, 0.0) <= nodes[key].resources.get(
                name, 0.0) + 1e-6 for key in trial_use for name in trial_use[key])
        if fits:
            used.update(trial_use)
        else:
            LOG.debug("job %s: its placement is not known to fit; not pinned", job_id)
            info.preemptible = True
