"""From a job's shape and scheduler hints to the policy's :class:`JobInfo` (pure functions).

Each job becomes a :class:`~adaptdl_core.policy.JobInfo`: its speedup function comes from
the goodput model in its hints (or the linear prior before it has one; with the sync cost
of replicas not measured yet taken as zero, Pollux's prior-driven exploration), its replica
bounds from its :class:`JobSpec`, the cluster, and bounded exploration (at most twice the
largest replica count it has been profiled at, so an extrapolated model is never trusted
far beyond what was measured).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any, Hashable, Mapping

from adaptdl_core import validation
from adaptdl_core.goodput import GoodputFunction, PerfParams
from adaptdl_core.policy import (JobInfo, LinearSpeedup, NodeInfo, PolluxPolicy, SpeedupFunction,
                                 policy_by_name)
from adaptdl_core.sched_hints import SchedHints

LOG = logging.getLogger(__name__)

__all__ = ["JobSpec", "replicas_fitting", "cluster_capacity", "pack_guess",
           "speedup_from_hints", "exploring_params", "EXPLORATION_FACTOR", "exploration_cap",
           "job_info", "profiled_extent", "group_hints", "check_profile_group"]


@dataclasses.dataclass(frozen=True)
class JobSpec:
    """How one job (or trial) may be shaped.

    Attributes:
        resources: what one replica needs, e.g. ``{"CPU": 1}`` or ``{"CPU": 4, "GPU": 1}``
            (amounts >= 0, at least one > 0; zero amounts are dropped).
        min_replicas: fewest replicas the job runs with (``>= 1``).
        max_replicas: most replicas it may get (``None``: only the cluster limits it).
        profile_group: jobs that train the same model on the same kind of replica (e.g.
            the trials of one sweep) name the same group; a job whose own throughput
            profile covers fewer replicas than the group's best-profiled job is modelled
            with that job's profile (see :func:`group_hints`) instead of starting from one
            replica and growing by bounded exploration. ``None`` (default): no sharing.

    Raises:
        ValueError: for a malformed field (the message names the argument and the fix).
    """

    resources: Mapping[str, float]
    min_replicas: int = 1
    max_replicas: int | None = None
    profile_group: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.resources, Mapping):
            raise ValueError(f"resources must be a dict of resource name -> amount per "
                             f"replica, got {self.resources!r}")
        res = dict(self.resources)
        for key, value in res.items():
            if not isinstance(key, str):
                raise ValueError(f"resources per replica must map names to amounts >= 0, got "
                                 f"{key!r}: {value!r}")
            validation.number(f"resources[{key!r}]", value, 0.0)
        if not any(v > 0 for v in res.values()):
            raise ValueError("each replica must request some resource: pass num_cpus_per_worker"
                             " > 0 or num_gpus_per_worker > 0")
        object.__setattr__(self, "resources", {k: float(v) for k, v in res.items() if v > 0})
        # (Stored as int: a numpy integer passes the check but must not reach the state file.)
        object.__setattr__(self, "min_replicas",
                           validation.integer("min_replicas", self.min_replicas, 1))
        if self.max_replicas is not None:
            object.__setattr__(self, "max_replicas", validation.integer(
                "max_replicas", self.max_replicas, what="None or an integer"))
            if self.max_replicas < self.min_replicas:
                raise ValueError(f"min_replicas ({self.min_replicas}) must be <= max_replicas "
                                 f"({self.max_replicas}): lower min_replicas or raise "
                                 "max_replicas")
        check_profile_group(self.profile_group)

    def clamp(self, n: int) -> int:
        """``n`` limited to ``[min_replicas, max_replicas]``."""
        n = max(n, self.min_replicas)
        return n if self.max_replicas is None else min(n, self.max_replicas)

    def fitted(self, wanted: int, nodes: Mapping[Any, NodeInfo]) -> int:
        """The size a job starts, relaunches or moves with when it wants ``wanted``
        replicas: as many of them as ``nodes`` hold, within ``[min_replicas,
        max_replicas]`` (never below ``min_replicas``: such a start waits for room). The one
        place every front-end bounds a size it did not get from a solve."""
        return self.clamp(min(wanted, cluster_capacity(self, nodes)))

    def to_dict(self) -> dict:
        """Plain JSON-able form (see :meth:`from_dict`)."""
        return {"resources": dict(self.resources), "min_replicas": self.min_replicas,
                "max_replicas": self.max_replicas, "profile_group": self.profile_group}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "JobSpec":
        """Inverse of :meth:`to_dict`.

        Raises:
            ValueError: malformed fields."""
        return cls(dict(d["resources"]), int(d.get("min_replicas", 1)),
                   None if d.get("max_replicas") is None else int(d["max_replicas"]),
                   d.get("profile_group"))


def allocation_policy(policy: Any) -> Any:
    """The policy a decision maker solves with: ``policy`` itself (anything with
    ``allocate(jobs, nodes, base, now=...)``), a name of
    :func:`~adaptdl_core.policy.policy_by_name`, or for ``None`` the default,
    ``PolluxPolicy(p=-1, fair_share=True)`` (Pollux's normalisation).

    Raises:
        TypeError: an object without ``allocate``; ValueError: an unknown name."""
    if isinstance(policy, str):
        return policy_by_name(policy)
    if policy is None:
        return PolluxPolicy(-1.0, fair_share=True)
    if not callable(getattr(policy, "allocate", None)):
        raise TypeError(f"policy must be an allocation policy such as PolluxPolicy() "
                        f"(with an allocate() method), got {policy!r}")
    return policy


def checked_nodes(nodes: Mapping[Hashable, NodeInfo]) -> dict[Hashable, NodeInfo]:
    """``nodes`` as a dict (node id -> :class:`~adaptdl_core.policy.NodeInfo`).

    Raises:
        TypeError: a value that is not a NodeInfo (named by its key)."""
    nodes = dict(nodes)
    for key, node in nodes.items():
        if not isinstance(node, NodeInfo):
            raise TypeError(f"nodes[{key!r}] must be a NodeInfo, got {node!r}")
    return nodes


def replicas_fitting(resources: Mapping[str, float], node: NodeInfo) -> int:
    """How many replicas requesting ``resources`` one node holds."""
    return min((math.floor(node.resources.get(k, 0.0) / v + 1e-9)
                for k, v in resources.items()), default=0)


def cluster_capacity(spec: JobSpec, nodes: Mapping[Hashable, NodeInfo]) -> int:
    """Most replicas of ``spec`` the whole cluster could hold at once."""
    return sum(replicas_fitting(spec.resources, node) for node in nodes.values())


def pack_guess(nodes: Mapping[Hashable, NodeInfo], spec: JobSpec, count: int) -> list:
    """Where ``count`` replicas of ``spec`` most likely sit when the front-end does not
    say (Ray's PACK strategy: fill the first nodes first); one node id per replica,
    fewer entries if the cluster cannot hold ``count``."""
    placement: list = []
    for key, node in nodes.items():
        if len(placement) >= count:
            break
        placement += [key] * min(replicas_fitting(spec.resources, node),
                                 count - len(placement))
    return placement


def speedup_from_hints(hints: Mapping[str, Any] | None) -> Any:
    """The speedup function for a job's hints: Pollux's goodput-based one when the hints
    hold a throughput fit and gradient statistics, else :class:`LinearSpeedup`."""
    if not hints:
        return LinearSpeedup(0)
    try:
        parsed = SchedHints.from_dict(hints)
    except ValueError as exc:
        LOG.warning("ignoring malformed scheduler hints (%s); using the linear prior", exc)
        return LinearSpeedup(0)
    goodput = parsed.goodput_function()
    if goodput is None:
        return LinearSpeedup(parsed.max_profiled_replicas)
    explored = exploring_params(parsed.perf_params, parsed.max_profiled_replicas)
    if explored is not parsed.perf_params:  # (built once more only when the rule applies)
        goodput = GoodputFunction(explored, parsed.grad_params, parsed.init_batch_size)
    try:
        return SpeedupFunction(goodput, parsed.max_batch_size, parsed.local_bsz_bounds,
                               parsed.gradient_accumulation)
    except ValueError as exc:
        LOG.warning("goodput model unusable (%s); using the linear prior", exc)
        return LinearSpeedup(parsed.max_profiled_replicas)


def exploring_params(perf: PerfParams, measured_replicas: int) -> PerfParams:
    """Pollux's prior-driven exploration: the throughput fit a policy values a job by.

    A job measured on one replica only (``measured_replicas <= 1``, the most replicas its
    fit has seen) has no measured gradient-sync cost, and the fit's stand-in for it is a
    guess; take the intra-node sync as free instead, so that a job with idle room next to
    it tries a second replica (its growth is bounded by :func:`exploration_cap`, and it
    must pay for its resize). Once it has run on several replicas, the fitted sync cost
    decides: ``perf`` itself is returned (the same object). Every policy that values jobs
    by goodput uses this rule (the decision core's, and the simulator's Sia baseline, as
    Sia's own fit does)."""
    if measured_replicas > 1:
        return perf
    return PerfParams(perf.alpha_c, perf.beta_c, perf.alpha_n, perf.beta_n, 0.0, 0.0,
                      perf.gamma)


def check_profile_group(group: Any) -> None:
    """Check a profile group name (see :class:`JobSpec`).

    Raises:
        ValueError: ``group`` is neither ``None`` nor a non-empty string."""
    if group is not None and (not isinstance(group, str) or not group):
        raise ValueError(f"profile_group must be a non-empty string or None, got {group!r}")


def profiled_extent(hints: Mapping[str, Any] | None) -> int:
    """The largest replica count that ``hints`` hold a throughput fit for (0: no fit)."""
    if not hints or not hints.get("perf_params"):
        return 0
    value = hints.get("max_profiled_replicas")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 \
        else 0


def group_hints(own: Mapping[str, Any] | None,
                donor: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The hints a job of a profile group is modelled with (pure).

    While ``donor`` (the group's best-profiled job's hints) holds a throughput fit over
    more replicas than ``own``: ``own`` with the donor's ``perf_params`` and profiled
    extent (``max_profiled_replicas``, ``max_profiled_nodes``), and the donor's
    ``grad_params`` only while ``own`` has none; the job's own batch limits and restart
    cost stay. A job with no hints of its own takes the donor's whole. Otherwise ``own``
    itself (the same object).
    """
    if donor is None or profiled_extent(donor) <= profiled_extent(own):
        return own
    if not own:
        return donor
    merged = dict(own)
    merged["perf_params"] = donor["perf_params"]
    merged["max_profiled_replicas"] = donor["max_profiled_replicas"]
    merged["max_profiled_nodes"] = min(int(donor.get("max_profiled_nodes") or 0),
                                       donor["max_profiled_replicas"])
    if not own.get("grad_params"):
        merged["grad_params"] = donor.get("grad_params")
    return merged


#: Pollux's bounded exploration: a job may get up to this many times the largest replica
#: count it was profiled at (a policy may set its own, see :func:`exploration_cap`).
EXPLORATION_FACTOR = 2


def exploration_cap(hints: Mapping[str, Any] | None,
                    factor: int = EXPLORATION_FACTOR) -> int:
    """Most replicas a job may get next: ``factor`` times the largest count it was
    profiled at, and 1 for a job not profiled yet (it grows once its first measurements
    say it pays). With the default factor 2 this is Pollux's bound and the linear prior's
    cap; a policy object with an ``exploration_factor`` attribute sets its own (the
    decision core reads it).

    Raises:
        ValueError: ``factor`` is not an integer >= 2."""
    factor = validation.integer("exploration_factor", factor, 2)
    profiled = max(int((hints or {}).get("max_profiled_replicas") or 0), 0)
    return max(factor * profiled, 1)


def job_info(spec: JobSpec, nodes: Mapping[Hashable, NodeInfo], *, created: float,
             hints: Mapping[str, Any] | None, restarts: int = 0,
             restart_cost_s: float | None = None, current_replicas: int = 0,
             speedup_fn: Any = None, remaining_s: float | None = None,
             exploration_factor: int = EXPLORATION_FACTOR,
             type_speedups: Mapping[Any, Any] | None = None,
             capacity: int | None = None) -> JobInfo:
    """One job as a policy job.

    Args:
        spec: the job's replica spec.
        nodes: the cluster (to bound ``max_replicas`` by what fits at all).
        created: when the job arrived (seconds, the policy's clock).
        hints: its latest scheduler hints (``SchedHints.to_dict()``), or ``None``.
        restarts, restart_cost_s: for the restart penalty (``None``: the policy default).
        current_replicas: replicas it runs with now (exploration never shrinks it below).
        speedup_fn: the speedup function of ``hints`` if already built (a cache), else
            ``None`` to build it with :func:`speedup_from_hints`.
        remaining_s: the front-end's estimate of the seconds of training left (``None``:
            unknown), for policies that weigh remaining work.
        exploration_factor: see :func:`exploration_cap`.
        type_speedups: on a cluster of several accelerator types, the job's speedup
            function per type (:func:`~adaptdl_core.decision.type_models.typed_speedups`;
            each flat beyond its own exploration bound, its ``cap``): the job may get up
            to the largest of those bounds.
        capacity: :func:`cluster_capacity` of ``spec`` on ``nodes`` if known (a cache).

    Raises:
        ValueError: if the cluster cannot hold ``spec.min_replicas`` replicas at all (the
            message says what is missing).
    """
    if capacity is None:
        capacity = cluster_capacity(spec, nodes)
    if capacity < spec.min_replicas:
        raise ValueError(
            f"the job needs at least min_replicas={spec.min_replicas} replicas of "
            f"{dict(spec.resources)} but the whole cluster holds {capacity}: lower "
            "min_replicas or the resources per worker, or add nodes")
    if type_speedups:
        explore = max(int(getattr(fn, "cap", 1)) for fn in type_speedups.values())
    else:
        explore = exploration_cap(hints, exploration_factor)
    upper = max(explore, current_replicas, spec.min_replicas)
    upper = min(upper, capacity)
    if spec.max_replicas is not None:
        upper = min(upper, spec.max_replicas)
    return JobInfo(resources=spec.resources,
                   speedup_fn=speedup_fn if speedup_fn is not None else
                   speedup_from_hints(hints),
                   creation_timestamp=created, min_replicas=spec.min_replicas,
                   max_replicas=upper, num_restarts=restarts,
                   restart_cost_s=restart_cost_s, remaining_s=remaining_s,
                   type_speedups=dict(type_speedups) if type_speedups else None)
