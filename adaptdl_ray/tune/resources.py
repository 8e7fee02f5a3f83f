"""What a trial asks for, in the shapes Ray Tune and the policy each understand.

A trial with ``n`` replicas requests ``PlacementGroupFactory([{}] + [per_replica] * n)``
(strategy PACK). Tune drops the empty head bundle from the real placement group (the trial
actor runs there with no resources), so bundle ``i`` holds replica ``i``. The policy sees
the same request as ``JobInfo.resources = per_replica``. A trial placed on an accelerator
type asks for it in every replica's bundle
(:func:`~adaptdl_ray.replicas.bundles.replica_bundle`), or by a label selector per bundle
where the type's nodes carry only its label (Tune passes ``bundle_label_selector`` on to
Ray's ``placement_group``).
"""

from __future__ import annotations


from ray.tune.execution.placement_groups import PlacementGroupFactory

from adaptdl_core.decision.jobs import JobSpec
from adaptdl_ray.replicas.bundles import bundles_type
from adaptdl_ray.replicas.nodes import type_request

__all__ = ["ReplicaRequest", "placement_group_factory", "num_replicas_of", "request_type"]


class ReplicaRequest(PlacementGroupFactory):
    """A trial's placement group request (Tune's own class) that names, when printed,
    where an AdaptDL trial's resources are set.

    Ray Tune rejects ``tune.run(..., resources_per_trial=...)`` for a trainable with its
    own resource request by printing that request (which left the user with Ray's
    error and no pointer to the creator's arguments); printed, this one says how to set
    them instead.

    Attributes:
        accelerator_type: the type its replicas are placed on (``None``: any node).
    """

    accelerator_type: str | None = None

    def __str__(self) -> str:
        bundles = [b for b in self.bundles if b]
        per = bundles[-1] if bundles else {}
        return (f"{len(bundles)} AdaptDL replica(s) of {per} each, set by "
                "AdaptDLTrainableCreator(num_cpus_per_worker=..., num_gpus_per_worker=..., "
                "resources_per_worker={...}, min_replicas=..., max_replicas=...) and "
                "resized by AdaptDLScheduler (resources_per_trial and tune.with_resources do "
                "not apply to AdaptDL trainables)")


def placement_group_factory(spec: JobSpec, num_replicas: int,
                            accelerator_type: str | None = None, *,
                            by_label: bool | None = None) -> PlacementGroupFactory:
    """The placement group request of a trial with ``num_replicas`` replicas, on nodes of
    ``accelerator_type`` if given (``None``: any).

    Args:
        by_label: ask for the type by its label, not its resource (``None``: as the
            cluster's nodes say, :func:`~adaptdl_ray.replicas.nodes.asked_by_label`).
    """
    if num_replicas < 1:
        raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
    # (Tune drops the empty head bundle, so the selectors are the replicas' only.)
    bundle, select = type_request(spec.resources, accelerator_type, num_replicas,
                                  by_label=by_label)
    request = ReplicaRequest([{}] + [dict(bundle) for _ in range(num_replicas)],
                             strategy="PACK", **select)
    request.accelerator_type = accelerator_type
    return request


def request_type(pgf: PlacementGroupFactory | None) -> str | None:
    """The accelerator type a trial's placement group request asks for (``None``: none):
    the one it was made for, or (a request made elsewhere) the one its bundles name."""
    if isinstance(pgf, ReplicaRequest):
        return pgf.accelerator_type
    return None if pgf is None else bundles_type(pgf.bundles)


def num_replicas_of(pgf: PlacementGroupFactory | None) -> int:
    """Replicas in a trial's placement group request (its bundles besides a non-empty head
    bundle; Tune already drops an empty one from ``bundles``)."""
    if pgf is None:
        return 0
    return len(pgf.bundles) - (0 if pgf.head_bundle_is_empty else 1)
