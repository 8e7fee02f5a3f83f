"""What a trial asks for, in the shapes Ray Tune and the policy each understand.

A trial with ``n`` replicas requests ``PlacementGroupFactory([{}] + [per_replica] * n)``
(strategy PACK). Tune drops the empty head bundle from the real placement group (the trial
actor runs there with no resources), so bundle ``i`` holds replica ``i``. The policy sees
the same request as ``JobInfo.resources = per_replica``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from ray.tune.execution.placement_groups import PlacementGroupFactory

from adaptdl_core.policy import NodeInfo

__all__ = ["ReplicaSpec", "placement_group_factory", "num_replicas_of", "cluster_nodes",
           "cluster_capacity", "replicas_fitting"]


@dataclasses.dataclass(frozen=True)
class ReplicaSpec:
    """How one trial may be shaped.

    Attributes:
        resources: what one replica needs, e.g. ``{"CPU": 1}`` or ``{"CPU": 4, "GPU": 1}``.
        min_replicas: fewest replicas the trial runs with (``>= 1``).
        max_replicas: most replicas it may get (``None``: only the cluster limits it).

    Raises:
        ValueError: for a malformed field (the message names the argument and the fix).
    """

    resources: Mapping[str, float]
    min_replicas: int = 1
    max_replicas: int | None = None

    def __post_init__(self) -> None:
        res = dict(self.resources)
        for key, value in res.items():
            if not isinstance(key, str) or isinstance(value, bool) or not isinstance(
                    value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"resources per replica must map names to amounts >= 0, got "
                                 f"{key!r}: {value!r}")
        if not any(v > 0 for v in res.values()):
            raise ValueError("each replica must request some resource: pass num_cpus_per_worker"
                             " > 0 or num_gpus_per_worker > 0")
        object.__setattr__(self, "resources", {k: float(v) for k, v in res.items() if v > 0})
        if isinstance(self.min_replicas, bool) or not isinstance(self.min_replicas, int) \
                or self.min_replicas < 1:
            raise ValueError(f"min_replicas must be an integer >= 1, got {self.min_replicas!r}")
        if self.max_replicas is not None:
            if isinstance(self.max_replicas, bool) or not isinstance(self.max_replicas, int):
                raise ValueError(f"max_replicas must be an integer or None, "
                                 f"got {self.max_replicas!r}")
            if self.max_replicas < self.min_replicas:
                raise ValueError(f"min_replicas ({self.min_replicas}) must be <= max_replicas "
                                 f"({self.max_replicas}): lower min_replicas or raise "
                                 "max_replicas")

    def clamp(self, n: int) -> int:
        """``n`` limited to ``[min_replicas, max_replicas]``."""
        n = max(n, self.min_replicas)
        return n if self.max_replicas is None else min(n, self.max_replicas)


def placement_group_factory(spec: ReplicaSpec, num_replicas: int) -> PlacementGroupFactory:
    """The placement group request of a trial with ``num_replicas`` replicas."""
    if num_replicas < 1:
        raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
    return PlacementGroupFactory([{}] + [dict(spec.resources)] * num_replicas,
                                 strategy="PACK")


def num_replicas_of(pgf: PlacementGroupFactory | None) -> int:
    """Replicas in a trial's placement group request (its bundles besides a non-empty head
    bundle; Tune already drops an empty one from ``bundles``)."""
    if pgf is None:
        return 0
    return len(pgf.bundles) - (0 if pgf.head_bundle_is_empty else 1)


def cluster_nodes(nodes: list[dict[str, Any]] | None = None) -> dict[str, NodeInfo]:
    """The alive Ray nodes as policy :class:`NodeInfo` (node id -> CPU/GPU/custom totals).

    Args:
        nodes: ``ray.nodes()`` output (fetched when ``None``).
    """
    if nodes is None:
        import ray
        nodes = ray.nodes()
    out: dict[str, NodeInfo] = {}
    for node in nodes:
        if not node.get("Alive", False):
            continue
        res = {k: float(v) for k, v in node.get("Resources", {}).items()
               if not k.startswith("node:") and not k.startswith("accelerator_type")
               and k not in ("memory", "object_store_memory") and v > 0}
        if res:
            out[node["NodeID"]] = NodeInfo(res)
    return out


def replicas_fitting(resources: Mapping[str, float], node: NodeInfo) -> int:
    """How many replicas requesting ``resources`` one node holds."""
    return min((math.floor(node.resources.get(k, 0.0) / v + 1e-9)
                for k, v in resources.items()), default=0)


def cluster_capacity(spec: ReplicaSpec, nodes: Mapping[str, NodeInfo]) -> int:
    """Most replicas of ``spec`` the whole cluster could hold at once."""
    return sum(replicas_fitting(spec.resources, node) for node in nodes.values())
