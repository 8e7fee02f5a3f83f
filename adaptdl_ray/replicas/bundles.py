"""The resource bundle of one replica placed on an accelerator type (no Ray needed).

On a cluster of several accelerator types, a decision names the type a job's replicas go
on (:attr:`~adaptdl_core.decision.Decision.accelerator_type`). Each replica's bundle then
asks, besides its own resources, for a sliver of that type's resource
``accelerator_type:<T>`` (Ray's convention: Ray sets it on the nodes of the GPUs it
knows, and ``ray start --resources='{"accelerator_type:A100": 1}'`` sets it on others),
so Ray places the replica on a node of that type only. A type whose nodes are named only
by Ray's ``ray.io/accelerator-type`` label (a label set by hand, or one overriding the type
Ray detected) has no such resource to ask for: its replicas ask by a label selector instead
(:func:`label_selectors`, Ray's ``bundle_label_selector``), and their bundles hold their
own resources only. Without a type the bundle is the replica's resources as they are.

One rule for every placement: the one-bundle reservations of
:class:`~adaptdl_ray.replicas.pool.ReplicaPool` and a Tune trial's placement group
request alike.
"""

from __future__ import annotations

from typing import Iterable, Mapping

__all__ = ["ACCELERATOR_RESOURCE_PREFIX", "ACCELERATOR_LABEL", "TYPE_SHARE", "type_resource",
           "replica_bundle", "label_selectors", "bundles_type"]

#: Prefix of the resource that names a node's accelerator type (``accelerator_type:T4``).
ACCELERATOR_RESOURCE_PREFIX = "accelerator_type:"
#: Ray's node label naming a node's accelerator type; it overrides the resource.
ACCELERATOR_LABEL = "ray.io/accelerator-type"
#: How much of its type's resource each replica asks for: a sliver, so that a node holds
#: as many replicas as its other resources allow (a node has 1 of its type's resource).
TYPE_SHARE = 0.001


def type_resource(accelerator_type: str) -> str:
    """The name of the resource of nodes of ``accelerator_type`` (``accelerator_type:T``).

    Raises:
        ValueError: an empty or non-string type."""
    if not isinstance(accelerator_type, str) or not accelerator_type:
        raise ValueError(f"accelerator_type must be a non-empty string, got "
                         f"{accelerator_type!r}")
    return ACCELERATOR_RESOURCE_PREFIX + accelerator_type


def replica_bundle(resources: Mapping[str, float], accelerator_type: str | None = None,
                   *, by_label: bool = False) -> dict[str, float]:
    """One replica's bundle: ``resources``, plus :data:`TYPE_SHARE` of
    ``accelerator_type``'s resource when a type is given and not asked for ``by_label``
    (``None``: ``resources`` as they are, a copy)."""
    bundle = {k: float(v) for k, v in resources.items()}
    if accelerator_type is not None and not by_label:
        bundle[type_resource(accelerator_type)] = TYPE_SHARE
    return bundle


def label_selectors(accelerator_type: str, count: int) -> list[dict[str, str]]:
    """Ray's ``bundle_label_selector`` for ``count`` bundles on nodes labelled
    ``accelerator_type`` (one selector per bundle).

    Raises:
        ValueError: an empty or non-string type."""
    type_resource(accelerator_type)  # (the same check)
    return [{ACCELERATOR_LABEL: accelerator_type} for _ in range(count)]


def bundles_type(bundles: Iterable[Mapping[str, float]]) -> str | None:
    """The accelerator type a request's bundles ask for (the inverse of
    :func:`replica_bundle`): the one type every non-empty bundle names, else ``None``
    (none, or several)."""
    kinds = set()
    for bundle in bundles:
        if not bundle:
            continue  # (a Tune trial's empty head bundle)
        named = [k[len(ACCELERATOR_RESOURCE_PREFIX):] for k in bundle
                 if k.startswith(ACCELERATOR_RESOURCE_PREFIX)]
        kinds.add(named[0] if len(named) == 1 else None)
    return kinds.pop() if len(kinds) == 1 else None
