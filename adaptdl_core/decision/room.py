"""Room for a resize: the resources free beside the running jobs, and the paused jobs
waiting for theirs.

A front-end carries out a grow only once its replicas' resources are free (shrinking jobs
free them first), and relaunches a paused job (one moved off a draining node) first come,
first served once its size fits. Plain data in, plain data out: the front-end says what
the cluster holds and what each job holds; nothing here asks Ray.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Optional, Union

from adaptdl_core.policy import NodeInfo

__all__ = ["Holding", "free_room", "fits", "RelaunchQueue"]

# Resource amounts are floats: a fit within this is a fit.
_EPSILON = 1e-9

#: What one job holds: its replicas' shape, how many it holds, whether they may be only
#: requested so far (a job still starting, whose resources Ray may not show as taken), and
#: optionally the accelerator type of the nodes they are on (``None`` or left out: not
#: known, they may be on any node).
Holding = Union[tuple[Mapping[str, float], int, bool],
                tuple[Mapping[str, float], int, bool, Optional[str]]]


def free_room(nodes: Mapping[Any, NodeInfo], holdings: Iterable[Holding], *,
              cluster_free: Mapping[str, float] | None = None,
              accelerator_type: str | None = None) -> dict[str, float]:
    """The resources (summed over ``nodes``) that the jobs' ``holdings`` leave free.

    Args:
        nodes: the cluster.
        holdings: what each job holds (:data:`Holding`).
        cluster_free: on a shared cluster, the resources the cluster itself counts as free
            (what other experiments, jobs and other work hold is not free either): it bounds
            the result, less what starting jobs hold that it may not show yet.
        accelerator_type: the room on the nodes of this type only (for replicas that must
            go there): what those nodes hold, less the holdings on that type and those
            whose type is not known (they may be there). ``cluster_free``, a count over
            every type, still bounds it. ``None``: every node, every holding.
    """
    free: dict[str, float] = {}
    for node in nodes.values():
        if accelerator_type is not None and node.accelerator_type != accelerator_type:
            continue
        for key, amount in node.resources.items():
            free[key] = free.get(key, 0.0) + amount
    starting: dict[str, float] = {}
    for resources, count, is_starting, *kind in holdings:
        elsewhere = accelerator_type is not None and kind and kind[0] is not None and \
            kind[0] != accelerator_type
        for key, amount in resources.items():
            if not elsewhere:
                free[key] = free.get(key, 0.0) - amount * count
            if is_starting:  # (cluster_free counts every type)
                starting[key] = starting.get(key, 0.0) + amount * count
    for key, amount in (cluster_free or {}).items():
        free[key] = min(free.get(key, 0.0), amount - starting.get(key, 0.0))
    return free


def fits(free: Mapping[str, float], resources: Mapping[str, float], held: int,
         replicas: int) -> bool:
    """Whether a job of replicas shaped ``resources`` that holds ``held`` of them could
    hold ``replicas`` given ``free`` (from :func:`free_room`; what it holds counts as
    available to it)."""
    return all(free.get(key, 0.0) + amount * held + _EPSILON >= amount * replicas
               for key, amount in resources.items())


class RelaunchQueue:
    """Paused jobs waiting to relaunch, first come, first served, each with the size a move
    fixed for it (or none: the core's target then)."""

    def __init__(self) -> None:
        self._sizes: dict[str, int | None] = {}  # insertion order is the queue's order

    def add(self, job_id: str, size: int | None = None) -> None:
        """Queue ``job_id`` (again: it keeps its place); ``size``: the replicas a move fixed."""
        if job_id not in self._sizes or size is not None:
            self._sizes[job_id] = size

    def drop(self, job_id: str) -> None:
        """Forget ``job_id`` (it ended, or it relaunched)."""
        self._sizes.pop(job_id, None)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._sizes

    def __len__(self) -> int:
        return len(self._sizes)

    def next(self, ready: Callable[[str, int | None], bool | None]) -> str | None:
        """The first queued job that ``ready(job_id, fixed size)`` takes (``True``): it
        leaves the queue. ``False``: it waits (its room is not free yet); ``None``: it is
        gone and leaves the queue. Returns ``None`` when no job was taken."""
        for job_id, size in list(self._sizes.items()):
            answer = ready(job_id, size)
            if answer is None or answer:
                self.drop(job_id)
            if answer:
                return job_id
        return None
