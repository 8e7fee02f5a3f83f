"""Where a Tune trial runs by accelerator type, in pure rules (no Ray, no Tune objects).

On a cluster of several accelerator types a decision names the one type a trial's replicas
go on (:attr:`~adaptdl_core.decision.Decision.accelerator_type`). A trial's base bundles
come from Tune's placement group, which cannot change in place, so a decision that moves
the trial to another type is carried out as a pause and a relaunch with a request for the
new type (:mod:`adaptdl_ray.tune.scheduler`); its own reservations follow the request's
type (:class:`~adaptdl_ray.tune.trial_replicas.TrialReplicas`). These rules say when a
decision is such a move and which node ids the core is told the trial runs on.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from adaptdl_core.policy import NodeInfo
from adaptdl_core.policy.typed import mixed_types, nodes_off_type

__all__ = ["is_type_move", "needs_typed_relaunch", "nodes_to_report"]


def is_type_move(kind: str | None, request_kind: str | None, placed: Sequence[Any] | None,
                 nodes: Mapping[Any, NodeInfo]) -> bool:
    """Whether a decision naming ``kind`` moves a trial to another accelerator type.

    Args:
        kind: the decision's type (``None``: any node; never a move).
        request_kind: the type the trial's placement group request names (``None``: none).
            A request naming ``kind`` holds every replica on it (its base bundles and its
            own reservations alike): no move, whatever the core last heard.
        placed: the node ids of the trial's replicas as last reported (``None``: not
            known; the trial then moves, since its untyped request may be anywhere).
        nodes: the cluster (each node's type).
    """
    if kind is None or request_kind == kind:
        return False
    if placed is None:
        return True
    return bool(nodes_off_type(nodes, placed, kind))


def needs_typed_relaunch(kind: str | None, request_kind: str | None,
                         placed: Sequence[Any] | None, nodes: Mapping[Any, NodeInfo], *,
                         grows: bool) -> bool:
    """Whether a resize decision naming ``kind`` is carried out by a relaunch with a
    request for ``kind`` instead of in place: a move to another type
    (:func:`is_type_move`), or a grow of a trial whose request names another type or none
    (its own new reservations follow its request's type, and would go anywhere)."""
    if is_type_move(kind, request_kind, placed, nodes):
        return True
    return grows and kind is not None and request_kind != kind


def nodes_to_report(launch: tuple[Sequence[Any], int | None] | None, replicas: int,
                    restarts: Any, nodes: Mapping[Any, NodeInfo]) -> list | None:
    """The node ids to tell the core a trial runs on, from its current launch as it
    posted it (``(node ids, restart count)``), or ``None`` when there is nothing to tell:
    the cluster has one type (the core needs no placement then), the launch is not the
    one the result came from (its ``restarts`` differ), its count is not ``replicas``,
    or a node is not in ``nodes`` (gone: the core is told the count only)."""
    if launch is None or not mixed_types(nodes):
        return None
    node_ids, launch_restarts = launch
    if isinstance(restarts, int) and launch_restarts is not None and \
            launch_restarts != restarts:
        return None
    if len(node_ids) != replicas or any(n not in nodes for n in node_ids):
        return None
    return list(node_ids)
