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

from adaptdl_core.policy import NodeInfo
from adaptdl_ray.replicas.bundles import ACCELERATOR_LABEL, label_selectors, replica_bundle
from adaptdl_ray.replicas.bundles import ACCELERATOR_RESOURCE_PREFIX as _ACCELERATOR_RESOURCE

LOG = logging.getLogger(__name__)

__all__ = ["Cached", "DrainWatch", "cluster_nodes", "node_accelerator_type", "ACCELERATOR_LABEL",
           "asked_by_label", "type_request",
           "free_resources", "draining_under", "lost_nodes_under",
           "NODE_LOSS_WAIT_S"]

#: After a replica failed, the longest wait (seconds) for Ray to declare a node dead while
#: a replica does not answer (Ray's health checks take some seconds to notice a lost node).
NODE_LOSS_WAIT_S = 45.0


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


def asked_by_label(accelerator_type: str | None,
                   nodes: list[dict[str, Any]] | None = None) -> bool:
    """Whether replicas placed on ``accelerator_type`` must ask for it by its label (see
    :func:`~adaptdl_ray.replicas.bundles.label_selectors`) rather than by its
    ``accelerator_type:<T>`` resource: no alive node of the type, as
    :func:`node_accelerator_type` types them, carries that resource. False for no type.

    Args:
        nodes: ``ray.nodes()`` output (fetched when ``None``; no nodes when this process
            is not connected to Ray).
    """
    if accelerator_type is None:
        return False
    if nodes is None:
        import ray
        nodes = ray.nodes() if ray.is_initialized() else []
    resource = _ACCELERATOR_RESOURCE + accelerator_type
    typed = [n for n in nodes
             if n.get("Alive", False) and node_accelerator_type(n) == accelerator_type]
    return bool(typed) and not any(n.get("Resources", {}).get(resource, 0) > 0 for n in typed)


def type_request(resources: Mapping[str, float], accelerator_type: str | None, count: int,
                 *, by_label: bool | None = None) -> tuple[dict[str, float], dict[str, Any]]:
    """How ``count`` replicas ask Ray for nodes of ``accelerator_type``: one replica's
    bundle (:func:`~adaptdl_ray.replicas.bundles.replica_bundle`) and the keyword
    arguments that name the type to ``placement_group`` (a label selector per bundle when
    the type is asked for by its label, else none). The one rule of a job's reservations
    and a Tune trial's request.

    Args:
        by_label: ask by the type's label (``None``: as :func:`asked_by_label` says).
    """
    if by_label is None:
        by_label = asked_by_label(accelerator_type)
    by_label = bool(by_label) and accelerator_type is not None
    bundle = replica_bundle(resources, accelerator_type, by_label=by_label)
    kwargs = {"bundle_label_selector": label_selectors(accelerator_type, count)} \
        if by_label else {}
    return bundle, kwargs


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


class Cached:
    """The value of ``read()``, read again at most every ``ttl_s`` seconds (each read is a
    Ray RPC; a front-end's hook may ask many times a second).

    Args:
        read: returns the value.
        ttl_s: how long a value is reused (seconds).
        clock: monotonic seconds (injectable for tests).
    """

    def __init__(self, read: Callable[[], Any], ttl_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.read = read
        self.ttl_s = ttl_s
        self._clock = clock
        self._value: Any = None
        self._at = -float("inf")

    def get(self, refresh: bool = False) -> Any:
        """The value, read now if ``refresh`` or if it is older than ``ttl_s``."""
        now = self._clock()
        if refresh or now - self._at > self.ttl_s:
            self._value, self._at = self.read(), now
        return self._value


def free_resources() -> dict[str, float]:
    """What Ray counts as free on the cluster (resource -> amount; empty, logged, if Ray
    cannot say)."""
    import ray
    try:
        return {k: float(v) for k, v in ray.available_resources().items()}
    except Exception as exc:  # noqa: BLE001 - the caller falls back to its own view
        LOG.debug("could not read Ray's free resources: %s", exc)
        return {}


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


class DrainWatch:
    """At most every ``check_s`` seconds: which jobs have a replica on a node Ray is
    draining (a spot node's notice, ``ray drain-node``, the autoscaler removing it), and
    why, in words. The Tune scheduler and the job supervisor both move off such nodes.

    Args:
        check_s: seconds between checks (a preemption notice gives 30-120 s: a move must
            begin within a few seconds of it).
        draining_fn: the nodes being drained now (node id -> deadline or ``None``);
            default: asked of Ray.
        clock: monotonic seconds (injectable for tests).
    """

    def __init__(self, check_s: float = 2.0,
                 draining_fn: Callable[[], Mapping[str, float | None]] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.check_s = check_s
        self.draining_fn = draining_fn
        self._clock = clock
        self._next = 0.0

    def reset(self) -> None:
        """Check at the next call (a new launch)."""
        self._next = 0.0

    def check(self, nodes_of: Callable[[], Mapping[str, Collection[str]]]
              ) -> list[tuple[str, list[str], str]]:
        """``(job id, its draining nodes, why in words)`` of each job with a replica on a
        draining node, of the jobs ``nodes_of()`` returns (job id -> its replicas' node
        ids; asked only when a node drains). Nothing when the last check was under
        ``check_s`` ago or when Ray cannot say (logged: the next check asks again)."""
        now = self._clock()
        if now < self._next:
            return []
        self._next = now + self.check_s
        try:
            if self.draining_fn is None:
                from adaptdl_ray.replicas._ray_private import draining_nodes
                draining = draining_nodes()
            else:
                draining = self.draining_fn()
            jobs = nodes_of() if draining else {}
        except Exception as exc:  # noqa: BLE001 - keep scheduling; say why at each check
            LOG.warning("could not check for replicas on draining nodes (%s)", exc)
            return []
        out = []
        for job_id, node_ids in jobs.items():
            under = draining_under(node_ids, draining)
            if under is not None:
                hit, when = under
                out.append((job_id, hit, f"node(s) {', '.join(n[:12] for n in hit)} "
                                         f"draining ({when})"))
        return out


def _draining() -> set[str]:
    """Ids of the nodes Ray is draining (none if Ray cannot say: logged)."""
    from adaptdl_ray.replicas._ray_private import draining_nodes
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
