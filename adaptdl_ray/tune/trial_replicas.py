"""Where an AdaptDL trial's replicas run, so that it resizes without Tune relaunching it.

A trial's placement group from Tune holds its ``min_replicas`` ("base") bundles and never
changes, so that Tune admits a trial exactly when its minimum fits. Replicas beyond the
minimum each hold a one-bundle reservation of their own
(:class:`~adaptdl_ray.replicas.pool.ReplicaPool`). A resize therefore keeps the trial
actor and the replicas that stay: a grow reserves and starts only the new replicas while
the trial trains; a shrink stops replicas of its own reservations first (their resources go
back to Ray at once), then base ones (their bundles stay the trial's, as Tune holds them).

:class:`TrialReplicas` forms each launch's worker group from these and gives every
reservation back when the trial ends (:meth:`TrialReplicas.release_all`); a trial actor that
died without doing so leaves reservations named after its trial, which
:func:`remove_leftover_reservations` removes.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Mapping, Sequence

from adaptdl_ray.replicas.group import WorkerGroup, new_workers, stop_workers
from adaptdl_ray.replicas.in_process import InProcessReplica
from adaptdl_ray.replicas.pool import Grow, ReplicaPool

LOG = logging.getLogger(__name__)

__all__ = ["TrialReplicas", "reservation_prefix", "remove_leftover_reservations"]

# How long a launch waits for the replicas of its own reservations before it starts on the
# base bundles alone (the trial grows in place once they are placed).
_EXTRA_WAIT_S = 60.0


def reservation_prefix(trial_id: str) -> str:
    """The name every one-bundle reservation of the trial starts with."""
    return f"adaptdl-trial-{trial_id}"


def remove_leftover_reservations(trial_id: str) -> int:
    """Remove the reservations a trial left (its actor died before it could); returns how
    many were removed. Failures are logged, not raised."""
    from ray.util import placement_group_table
    from ray.util.placement_group import get_placement_group, remove_placement_group
    prefix = reservation_prefix(trial_id) + "-"
    removed = 0
    try:
        table = placement_group_table()
    except Exception as exc:  # noqa: BLE001 - nothing to do without the table
        LOG.debug("could not list placement groups: %s", exc)
        return 0
    for info in table.values():
        name = info.get("name") or ""
        if name.startswith(prefix) and info.get("state") != "REMOVED":
            try:
                remove_placement_group(get_placement_group(name))
                removed += 1
            except Exception as exc:  # noqa: BLE001 - gone meanwhile
                LOG.debug("could not remove %s: %s", name, exc)
    if removed:
        LOG.info("trial %s: removed %d reservation(s) it left", trial_id, removed)
    return removed


class TrialReplicas:
    """A trial's replicas: its placement group's base bundles and its own reservations.

    Args:
        resources: each replica's resources.
        trial_info: what each replica's ``tune.get_context()`` says.
        placement_group: the trial's placement group (``None`` outside Tune).
        base: bundles it holds (the trial's ``min_replicas``).
        trial_id: names its own reservations.
        in_process: whether a one-replica launch may run in the trial actor (it then does
            when the replica needs only CPUs, since the trial actor holds no GPU or custom
            resource, and no earlier in-process function still runs there).
        fits_fn: whether ``extra`` more replicas' resources are free now (default Ray's
            count of free resources).
        accelerator_type: the type the trial's placement group asks for (its replicas of
            own reservations go on it too; no replica then runs in the trial actor, which
            may be elsewhere); ``None``: any node.
    """

    def __init__(self, resources: Mapping[str, float], trial_info: dict[str, Any],
                 placement_group: Any, base: int, trial_id: str, *,
                 in_process: bool,
                 fits_fn: Callable[[int], bool] | None = None,
                 accelerator_type: str | None = None) -> None:
        self.resources = dict(resources)
        self.accelerator_type = accelerator_type
        self.trial_info = trial_info
        self.placement_group = placement_group
        self.base = base if placement_group is not None else 0
        self.in_process = in_process
        self._pool = ReplicaPool(self.resources, trial_info, reservation_prefix(trial_id))
        self._grow = Grow(self._pool, fits_fn, name=f"trial {trial_id}")
        self._bundle_of: dict[Any, int] = {}  # base actor -> its bundle

    def _in_process_allowed(self) -> bool:
        only_cpu = all(v == 0 for k, v in self.resources.items() if k not in ("CPU", "memory"))
        return self.in_process and only_cpu and self.accelerator_type is None and \
            not InProcessReplica.busy()

    def adopt(self, previous: "TrialReplicas") -> None:
        """Take over the base replicas of the trial actor's previous trial (Tune reuses
        the actor and its warm replicas; their reservations stayed with the old one)."""
        self._bundle_of = dict(previous._bundle_of)

    # -- launches ---------------------------------------------------------------------------
    def group(self, replicas: int, *, keep: Sequence[Any] = ()) -> WorkerGroup | InProcessReplica:
        """A worker group of ``replicas`` replicas: the idle actors ``keep`` first (rank 0
        stays rank 0), then new ones in the free base bundles, then the trial's own
        reservations: the grow started while it trained, else reserved now, waited for at
        most ``_EXTRA_WAIT_S`` (then it starts on fewer: it grows in place once they are
        placed). One replica with nothing kept runs in the trial actor when allowed.

        Raises:
            TimeoutError: the base actors did not start.
        """
        if replicas == 1 and not keep and self._in_process_allowed():
            return InProcessReplica(self.resources, self.trial_info)
        actors = list(keep)
        used = set(self._bundle_of.values())  # (the kept ones', and any not released)
        free = [i for i in range(self.base) if i not in used]
        starting = free[:max(replicas - len(actors), 0)]
        if self.placement_group is not None and starting:
            new = new_workers(self.resources, self.trial_info,
                              [(self.placement_group, i) for i in starting])
            self._bundle_of.update(zip(new, starting))
            actors += new
        elif self.placement_group is None and replicas > len(actors):
            actors += new_workers(self.resources, self.trial_info,
                                  [None] * (replicas - len(actors)))
        need = replicas - len(actors)
        if need > 0:
            actors += self._extra(need)
        return WorkerGroup(len(actors), self.resources, None, self.trial_info, actors=actors)

    def _extra(self, need: int) -> list[Any]:
        """``need`` replicas of the trial's own reservations (the grow's, if it brings as
        many, else reserved now and waited for), or fewer (none) if they are not up in
        time."""
        grow = self._grow.take(need, self.accelerator_type) or \
            self._pool.reserve(need, accelerator_type=self.accelerator_type)
        deadline = time.monotonic() + _EXTRA_WAIT_S
        while not grow.up(wait_s=1.0):
            if time.monotonic() > deadline:
                LOG.warning("no room for %d more replica(s) of %s within %.0f s; starting "
                            "without them", need, self.resources, _EXTRA_WAIT_S)
                grow.cancel()
                return []
        return self._pool.take(grow)

    # -- growing while the trial trains -------------------------------------------------------
    def grow_ready(self, group: Any, extra: int) -> bool:
        """Whether ``extra`` new replicas are up for a grow: reserves and starts them when
        their resources are free, warmed with rank 0's modules (an in-process replica's
        trial grows with fresh processes, warmed by nothing), and gives them back if they
        are not up in time (see :class:`~adaptdl_ray.replicas.pool.Grow`)."""
        free_base = self.base - len(self._bundle_of) if isinstance(group, WorkerGroup) \
            else max(self.base - 1, 0)
        extra -= min(free_base, extra)  # (free base bundles need no reservation)
        if extra <= 0:
            return True
        return self._grow.ready(extra, lambda: (
            group.imported_modules() if isinstance(group, WorkerGroup) else [], []),
            self.accelerator_type)

    def cancel_grow(self) -> None:
        """Give back the replicas started for a grow that is no longer wanted."""
        self._grow.cancel()

    # -- shrinking ----------------------------------------------------------------------------
    def survivors(self, group: Any, target: int) -> list[Any]:
        """The replicas of ``group`` that stay in a launch of ``target`` replicas, in rank
        order (rank 0 first): base ones, then own reservations', the lowest ranks first
        (a shrink gives the trial's own reservations back first); none for an in-process
        replica (its trial continues on replica processes)."""
        if not isinstance(group, WorkerGroup):
            return []
        ranked = list(group.actors)
        base = [a for a in ranked if a in self._bundle_of]
        own = [a for a in ranked if a not in self._bundle_of]
        keep = set((base + own)[:target])
        return [a for a in ranked if a in keep]

    def release(self, actors: Sequence[Any]) -> None:
        """Stop ``actors``: those of the trial's own reservations give them back; base ones
        leave their bundle free for a later launch."""
        own = [a for a in actors if a not in self._bundle_of]
        base = [a for a in actors if a in self._bundle_of]
        if own:
            self._pool.release(own)
        if base:
            stop_workers(base)
            for actor in base:
                self._bundle_of.pop(actor, None)

    def release_all(self, group: Any = None) -> None:
        """Stop every replica (``group``'s too) and give every own reservation back."""
        self.cancel_grow()
        if group is not None:
            group.shutdown()
        self._bundle_of.clear()
        self._pool.release_all()
