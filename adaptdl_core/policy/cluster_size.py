"""Desired cluster size: Pollux's goodput-based rule for adding and removing nodes.

Pollux (OSDI'21, section 5.4.1) sizes a cloud cluster by how well the jobs would use it:
the cluster's *utility* at ``n`` nodes is its goodput per GPU relative to the ideal,

    UTILITY(n) = sum_j SPEEDUP_j(A_j) * g_j / (n * G)

where ``A`` is the allocation the policy would choose for the jobs on ``n`` nodes, ``g_j``
the GPUs one replica of job ``j`` uses and ``G`` the GPUs of one node. A replica that adds
a full replica's worth of speedup is ideal (utility 1); a job that gains nothing from more
GPUs drags it towards 0. The rule keeps two thresholds, an upper ``U`` (default 2/3) and a
lower ``L`` (default 1/2):

* **grow** while the goodput per GPU stays above ``U``: the desired size is the largest
  ``n`` above the current size whose utility is at least ``U`` (when there is one), less
  any trailing nodes that add no goodput at all. Sizes are tried upwards until one falls
  below ``U`` with every job running (beyond it more nodes only add replicas to running
  jobs, which with concave speedups lowers the goodput per GPU further);
* **hold** the current size while its utility is at least ``L``;
* **shrink** otherwise, aiming for ``L``: the largest ``n`` below the current size whose
  utility is at least ``L``, or, if none reaches it, the size with the best utility
  (the smallest such; with no jobs at all that is ``min_nodes``).

The band ``[L, U)`` is the hysteresis that keeps the size from flapping round to round.
All sizes stay within ``[min_nodes, max_nodes]``, counted in nodes of one template (the
resources of one node the autoscaler would add). Everything here is a pure function of
its inputs: the jobs, the current size and the clock ``now`` passed in.

This is a reading of the paper's rule, not a copy of AdaptDL's genetic-algorithm variant
(which aims for ``(L + U) / 2`` when leaving its band); ``docs/autoscaling.md`` says more.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Hashable, Mapping, Optional, Tuple

from adaptdl_core import validation

from .allocator import PolluxPolicy
from .records import JobInfo, NodeInfo

__all__ = [
    "DEFAULT_UPPER_UTILITY",
    "DEFAULT_LOWER_UTILITY",
    "ClusterSizeDecision",
    "ClusterSizeRule",
]

#: ``U``: grow while the cluster's goodput per GPU stays at least this share of the ideal.
DEFAULT_UPPER_UTILITY = 2.0 / 3.0
#: ``L``: shrink when the utility falls below this, to the largest size that reaches it.
DEFAULT_LOWER_UTILITY = 0.5


@dataclass(frozen=True)
class ClusterSizeDecision:
    """What :meth:`ClusterSizeRule.decide` concluded.

    Attributes:
        desired_nodes: nodes of the template the cluster should have, in
            ``[min_nodes, max_nodes]``.
        current_nodes: the size it was asked about (as given, before clamping).
        action: ``"grow"``, ``"shrink"`` or ``"hold"`` (``desired_nodes`` against
            ``current_nodes``).
        utilities: cluster size -> utility, for every size the rule evaluated (one
            allocation each).
        reason: one line for logs saying why.
    """

    desired_nodes: int
    current_nodes: int
    action: str
    utilities: Dict[int, float] = field(default_factory=dict)
    reason: str = ""


class ClusterSizeRule:
    """Pollux's goodput-based cluster-size rule (see the module docstring).

    Args:
        node_template: resources of one node the autoscaler would add, e.g.
            ``{"CPU": 32, "GPU": 4}``.
        min_nodes: fewest template nodes the cluster may have (``>= 0``).
        max_nodes: most template nodes (``>= max(min_nodes, 1)``).
        upper: ``U``, the utility the cluster must keep for a larger size to be wanted.
        lower: ``L``, the utility below which the cluster shrinks (``0 < L <= U <= 1``).
        resource: the resource utility is measured per unit of (default ``"GPU"`` when the
            template has GPUs, else ``"CPU"``). A job whose replicas use none of it counts
            for nothing.
        policy: the allocator that decides each size's allocation (an object with
            :meth:`PolluxPolicy.allocate`); default ``PolluxPolicy()`` (fair, ``p = -1``).

    Raises:
        ValueError: for a malformed argument; the message names it, its value and the fix.
    """

    def __init__(self, node_template: Mapping[str, float], min_nodes: int, max_nodes: int,
                 *, upper: float = DEFAULT_UPPER_UTILITY, lower: float = DEFAULT_LOWER_UTILITY,
                 resource: Optional[str] = None, policy: Optional[Any] = None) -> None:
        self.node_template = dict(NodeInfo(node_template).resources)
        min_nodes = validation.integer("min_nodes", min_nodes, 0)
        max_nodes = validation.integer("max_nodes", max_nodes, max(min_nodes, 1))  # and >= 1
        self.min_nodes, self.max_nodes = min_nodes, max_nodes
        for name, value in (("upper", upper), ("lower", lower)):
            validation.number(name, value, 0.0, 1.0, low_open=True,
                              what="a share of the ideal goodput per GPU")
        if float(lower) > float(upper):
            raise ValueError(f"lower ({lower!r}) must be <= upper ({upper!r}); the band "
                             "between them is where the size holds")
        self.upper, self.lower = float(upper), float(lower)
        if resource is None:
            resource = "GPU" if self.node_template.get("GPU", 0.0) > 0 else "CPU"
        if not isinstance(resource, str) or self.node_template.get(resource, 0.0) <= 0:
            raise ValueError(f"resource={resource!r}: the node template "
                             f"{self.node_template!r} has none of it; name a resource the "
                             "template provides (e.g. 'GPU')")
        self.resource = resource
        if policy is None:
            policy = PolluxPolicy()
        if not callable(getattr(policy, "allocate", None)):
            raise ValueError("policy must have an allocate(jobs, nodes, now=...) method like "
                             f"PolluxPolicy, got {type(policy).__name__}")
        self.policy = policy

    def utility(self, jobs: Mapping[Hashable, JobInfo], num_nodes: int, *, now: float
                ) -> float:
        """The cluster's goodput per unit of :attr:`resource` relative to the ideal, with
        the jobs allocated afresh (no restart penalty) on ``num_nodes`` template nodes.

        Returns 0 for ``num_nodes == 0`` or no jobs.

        Raises:
            ValueError: for a negative ``num_nodes`` or malformed jobs (from the policy).
        """
        num_nodes = validation.integer("num_nodes", num_nodes, 0)
        return self._evaluate(jobs, num_nodes, float(now))[0]

    def _evaluate(self, jobs: Mapping[Hashable, JobInfo], num_nodes: int, now: float
                  ) -> Tuple[float, int]:
        """``(utility, jobs left idle)`` at ``num_nodes`` template nodes."""
        if num_nodes == 0 or not jobs:
            return 0.0, len(jobs)
        nodes = {i: NodeInfo(self.node_template) for i in range(num_nodes)}
        result = self.policy.allocate(jobs, nodes, None, now=now)
        used = sum(float(result.speedups[key]) * job.resources.get(self.resource, 0.0)
                   for key, job in jobs.items())
        idle = sum(1 for key in jobs if not result.allocations[key])
        return used / (num_nodes * self.node_template[self.resource]), idle

    def decide(self, jobs: Mapping[Hashable, JobInfo], current_nodes: int, *, now: float
               ) -> ClusterSizeDecision:
        """The desired cluster size for ``jobs``, given the current size.

        Args:
            jobs: job key -> :class:`JobInfo` (their speedup functions as the allocator
                uses them, relative to one replica).
            current_nodes: template nodes the cluster has now (``>= 0``; outside
                ``[min_nodes, max_nodes]`` it is first brought inside).
            now: the clock of the jobs' ``creation_timestamp`` (seconds).

        Returns:
            a :class:`ClusterSizeDecision`.

        Raises:
            ValueError: for a malformed ``current_nodes`` or ``now`` (named), or malformed
                jobs.
        """
        current_nodes = validation.integer("current_nodes", current_nodes, 0)
        now = validation.number("now", now, what="a finite number of seconds")
        start = min(max(int(current_nodes), self.min_nodes), self.max_nodes)
        utilities: Dict[int, float] = {}
        idle: Dict[int, int] = {}

        def u(n: int) -> float:
            if n not in utilities:
                utilities[n], idle[n] = self._evaluate(jobs, n, float(now))
            return utilities[n]

        desired, why = start, ""
        grow = []
        for n in range(start + 1, self.max_nodes + 1):
            if u(n) >= self.upper:
                grow.append(n)
            elif idle[n] == 0:
                # Every job runs: more nodes only add replicas to running jobs, whose
                # goodput per GPU falls with more (concave speedups), so no larger size
                # gets back above U.
                break
        if grow:
            desired = max(grow)
            # A node that adds no goodput is not worth paying for, even while the
            # utility stays above U: stop at the smallest size with the same goodput.
            while (desired - 1 > start
                   and u(desired - 1) * (desired - 1) >= u(desired) * desired * (1 - 1e-9)):
                desired -= 1
            why = (f"utility {u(desired):.3f} at {desired} nodes stays >= upper "
                   f"{self.upper:.3f}")
        elif u(start) >= self.lower:
            why = f"utility {u(start):.3f} at {start} nodes is within [lower, upper)"
            if u(start) >= self.upper:
                why = f"utility {u(start):.3f} at {start} nodes; more would fall below upper"
        else:
            below = next((n for n in range(start - 1, self.min_nodes - 1, -1)
                          if u(n) >= self.lower), None)
            if below is not None:
                desired = below
                why = (f"utility {u(start):.3f} at {start} nodes < lower {self.lower:.3f}; "
                       f"{desired} nodes reach {u(desired):.3f}")
            else:
                # Nothing reaches L: keep the size that uses its nodes best (the smallest
                # among equals, so an empty cluster goes down to min_nodes).
                sizes = range(self.min_nodes, start + 1)
                desired = max(sizes, key=lambda n: (u(n), -n))
                why = (f"no size reaches lower {self.lower:.3f}; {desired} nodes use theirs "
                       f"best ({u(desired):.3f})")
        action = ("grow" if desired > current_nodes else
                  "shrink" if desired < current_nodes else "hold")
        return ClusterSizeDecision(desired, int(current_nodes), action, dict(utilities), why)

    def __repr__(self) -> str:
        return (f"ClusterSizeRule(node_template={self.node_template!r}, "
                f"min_nodes={self.min_nodes}, max_nodes={self.max_nodes}, "
                f"upper={self.upper:.4g}, lower={self.lower:.4g}, resource={self.resource!r})")
