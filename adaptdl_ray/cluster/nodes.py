"""The cluster's nodes as the allocation and the relaunch decisions see them: which are
usable (alive, not draining), which of a job's nodes are draining or lost, and how many
replicas a job relaunches with on what is left.

Used by the Tune scheduler and trials and by submitted jobs and the cluster allocator
alike; nothing here imports Ray Tune (the allocator's actor does not pay for it).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Collection, Mapping

from adaptdl_core.decision.jobs import JobSpec, cluster_capacity
from adaptdl_core.policy import NodeInfo

LOG = logging.getLogger(__name__)

__all__ = ["cluster_nodes", "node_accelerator_type", "ACCELERATOR_LABEL", "draining_under",
           "replicas_to_move", "lost_nodes_under", "placed_bundles", "wait_for_bundles",
           "NODE_LOSS_WAIT_S"]

#: After a replica failed, the longest wait (seconds) for Ray to declare a node dead while
#: a replica does not answer (Ray's health checks take some seconds to notice a lost node).
NODE_LOSS_WAIT_S = 45.0


#: Ray's node label naming a node's accelerator type; it overrides the resource.
ACCELERATOR_LABEL = "ray.io/accelerator-type"
_ACCELERATOR_RESOURCE = "accelerator_type:"


def node_accelerator_type(node: dict[str, Any]) -> str | None:
    """The accelerator type of one ``ray.nodes()`` entry: its ``ray.io/accelerator-type``
    label, else its one ``accelerator_type:<T>`` resource (Ray sets it for known GPUs; a
    user can with ``ray start --resources``), else ``None`` (none, or several)."""
    label = (node.get("Labels") or {}).get(ACCELERATOR_LABEL)
    if isinstance(label, str) and label:
        return label
    kinds = [k[len(_ACCELERATOR_RESOURCE):] for k, v in node.get("Resources", {}).items()
             if k.startswith(_ACCELERATOR_RESOURCE) and v > 0]
    return kinds[0] if len(kinds) == 1 and kinds[0] else None


def cluster_nodes(nodes: list[dict[str, Any]] | None = None,
                  draining: Collection[str] | None = None) -> dict[str, NodeInfo]:
    """The alive Ray nodes that are not being drained, as policy :class:`NodeInfo`
    (node id -> CPU/GPU/custom totals and accelerator type, see
    :func:`node_accelerator_type`). A draining node (a spot node given its notice, one
    the autoscaler is removing) is left out at once, so no decision places work there.

    Args:
        nodes: ``ray.nodes()`` output (fetched when ``None``).
        draining: ids of the nodes being drained (asked of Ray when ``None`` and
            ``nodes`` is fetched; else none).
    """
    if nodes is None:
        import ray
        nodes = ray.nodes()
        if draining is None:
            draining = _draining()
    draining = set(draining or ())
    out: dict[str, NodeInfo] = {}
    for node in nodes:
        if not node.get("Alive", False) or node.get("NodeID") in draining:
            continue
        res = {k: float(v) for k, v in node.get("Resources", {}).items()
               if not k.startswith("node:") and not k.startswith("accelerator_type")
               and k not in ("memory", "object_store_memory") and v > 0}
        if res:
            out[node["NodeID"]] = NodeInfo(res, accelerator_type=node_accelerator_type(node))
    return out


def draining_under(node_ids: Collection[str], draining: Mapping[str, float | None]
                   ) -> tuple[list[str], str] | None:
    """Which of ``node_ids`` (a job's or trial's replicas' nodes) Ray is draining, and the
    nearest drain deadline in words (``"deadline in 57 s"`` or ``"no deadline"``);
    ``None`` when none is.

    Args:
        draining: node id -> the drain's deadline (seconds since the epoch, or ``None``),
            as ``_ray_private.draining_nodes`` returns it."""
    hit = sorted(set(node_ids) & set(draining))
    if not hit:
        return None
    deadlines = [draining[n] for n in hit if draining[n]]
    when = f"deadline in {min(deadlines) - time.time():.0f} s" if deadlines else "no deadline"
    return hit, when


def replicas_to_move(spec: JobSpec, current: int, nodes: Mapping[Any, NodeInfo]) -> int:
    """How many replicas a job of ``current`` replicas relaunches with on ``nodes`` (the
    cluster without a drained or lost node): as many as now if they hold them, else as many
    as they hold, at least ``spec.min_replicas`` (the relaunch then waits for room)."""
    return max(spec.min_replicas, min(current, cluster_capacity(spec, nodes)))


def _draining() -> set[str]:
    """Ids of the nodes Ray is draining (none if Ray cannot say: logged)."""
    from adaptdl_ray.tune._ray_private import draining_nodes
    try:
        return set(draining_nodes())
    except Exception as exc:  # noqa: BLE001 - a node list without drains beats none
        LOG.warning("could not ask Ray which nodes are draining (%s)", exc)
        return set()


def lost_nodes_under(node_ids: Collection[str], actors: Collection[Any],
                     usable: Callable[[], Collection[str]],
                     wait_s: float = NODE_LOSS_WAIT_S) -> list[str]:
    """The nodes of ``node_ids`` (where a group's replicas ran) that are gone, asked after
    a replica failed.

    A replica on a lost node does not answer, or is "temporarily unavailable", until Ray
    declares its node dead (its health checks take some seconds): only then does this wait,
    up to ``wait_s`` seconds, for the node to leave ``usable()``. A replica that answers,
    or whose process is known dead on a healthy node, is no sign of a lost node: the
    answer is then at once.

    Args:
        node_ids: the replicas' nodes.
        actors: the replicas' actors (each answers ``node_address``).
        usable: the ids of the usable nodes now (e.g. ``cluster_nodes().keys()``); when it
            raises, nothing counts as lost (logged).
    """
    import ray
    nodes = list(dict.fromkeys(node_ids))

    def gone() -> list[str]:
        try:
            alive = set(usable())
        except Exception as exc:  # noqa: BLE001 - cannot tell: not a loss
            LOG.warning("could not read the cluster's nodes (%s)", exc)
            return []
        return [n for n in nodes if n not in alive]

    lost = gone()
    if lost or not actors:
        return lost
    probes = [actor.node_address.remote() for actor in actors]
    ready, pending = ray.wait(probes, num_returns=len(probes), timeout=5.0)
    unreachable = bool(pending)
    for ref in ready:
        try:
            ray.get(ref)
        except ray.exceptions.ActorUnavailableError:
            unreachable = True
        except ray.exceptions.RayError:
            pass
    if not unreachable:
        return gone()
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        lost = gone()
        if lost:
            return lost
        time.sleep(0.5)
    return []


def placed_bundles(placement_group: Any) -> list[int]:
    """Indices of ``placement_group``'s bundles that Ray has placed on a node now (after a
    node is lost, its bundles have none until Ray finds room for them again)."""
    from ray.util import placement_group_table
    table = placement_group_table(placement_group)
    return sorted(int(i) for i, node in table.get("bundles_to_node_id", {}).items() if node)


def wait_for_bundles(placement_group: Any, count: int, wait_s: float,
                     poll_s: float = 0.5) -> list[int]:
    """The placed bundles of ``placement_group`` once all ``count`` are placed, or after
    ``wait_s`` seconds, whichever comes first (Ray re-places a lost node's bundles at once
    when the other nodes have room)."""
    deadline = time.monotonic() + wait_s
    placed = placed_bundles(placement_group)
    while len(placed) < count and time.monotonic() < deadline:
        time.sleep(poll_s)
        placed = placed_bundles(placement_group)
    return placed
