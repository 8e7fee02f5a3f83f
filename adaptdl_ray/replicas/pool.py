"""The replica actors of one submitted job, each in a placement group of its own.

A placement group's bundles are fixed, so a job whose replicas share one group must give
every replica back to change its size and start them all again: new processes, torch
imported again, the script's modules loaded again. Here each replica has a one-bundle
group, so a resize keeps the replicas that stay:

* a grow reserves and starts only the new replicas (:meth:`ReplicaPool.reserve`), while
  the job still trains; the job checkpoints only once they are up;
* a shrink stops only the extra replicas (:meth:`ReplicaPool.release`);
* the survivors keep their process and take the job's state from its checkpoint.

:class:`Grow` starts a grow's new replicas while the job trains, for the job supervisor and
the Tune trial alike. Each job (a submitted job, a Tune trial's replicas beyond its
minimum) owns one pool.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Mapping, Sequence

from adaptdl_ray.replicas.bundles import replica_bundle, type_resource

LOG = logging.getLogger(__name__)

__all__ = ["ReplicaPool", "Reservation", "Grow", "GROW_WAIT_S"]

#: How long a grow's new replicas may take to start (the job trains meanwhile) before their
#: resources are given back and the grow is tried again.
GROW_WAIT_S = 120.0


class Reservation:
    """``count`` new replicas on their way: their placement groups are reserved first, and
    once all are placed, their actors start in them. Poll :meth:`up`; once it says True,
    :meth:`ReplicaPool.take` the actors, or :meth:`cancel`.

    Made by :meth:`ReplicaPool.reserve`.

    Attributes:
        accelerator_type: the type its replicas are placed on (``None``: any node).
    """

    def __init__(self, pool: "ReplicaPool", pgs: list[Any], created: float,
                 warm_up: tuple[list[str], list[str]] | None = None,
                 accelerator_type: str | None = None) -> None:
        self._pool = pool
        self.pgs = pgs
        self.created = created
        self.accelerator_type = accelerator_type
        self.actors: list[Any] = []
        self._warm_up = warm_up
        self._probes: list[Any] = []
        self._placed = 0  # placement groups seen placed (in order)
        self.cancelled = False

    @property
    def count(self) -> int:
        """How many replicas this reservation brings."""
        return len(self.pgs)

    def up(self, wait_s: float = 0.0) -> bool:
        """Whether every new replica has started (torch imported), waiting up to
        ``wait_s`` seconds; starts the actors as soon as every placement group is placed.

        Raises:
            ray.exceptions.RayError: a new replica died while starting.
        """
        import ray
        if self.cancelled:
            return False
        if not self.actors:
            # (PlacementGroup.wait asks the GCS; ready() would start a task per call)
            while self._placed < len(self.pgs) and \
                    self.pgs[self._placed].wait(timeout_seconds=wait_s):
                self._placed += 1
            if self._placed < len(self.pgs):
                return False
            self.actors = self._pool.start_actors(self.pgs)
            # Up once each has started (torch imported) and imported the warm-up modules.
            self._probes = [a.node_address.remote() for a in self.actors] if \
                self._warm_up is None else \
                [a.warm_up.remote(*self._warm_up) for a in self.actors]
            wait_s = 0.0
        done, _ = ray.wait(self._probes, num_returns=len(self._probes), timeout=wait_s)
        if len(done) < len(self._probes):
            return False
        ray.get(self._probes)  # (raises if one died)
        return True

    def cancel(self) -> None:
        """Give the reserved resources back and stop the actors started in them."""
        if not self.cancelled:
            self.cancelled = True
            self._pool.release(self.actors, pgs=self.pgs)
            self.actors = []


class ReplicaPool:
    """The replica actors of one job and the one-bundle placement groups they run in.

    Args:
        resources_per_replica: each replica's bundle, e.g. ``{"CPU": 1}``.
        trial_info: what each replica's ``tune.get_context()`` says (name, directory).
        name: the placement groups' name prefix (Ray's dashboard shows ``NAME-1``,
            ``NAME-2``, ...; a placement group's name must be unique on the cluster).
        clock: seconds, for :attr:`Reservation.created` (default ``time.monotonic``).
    """

    def __init__(self, resources_per_replica: Mapping[str, float], trial_info: dict[str, Any],
                 name: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.resources = dict(resources_per_replica)
        self.trial_info = trial_info
        self.name = name
        self._clock = clock
        self._pg_of: dict[Any, Any] = {}     # actor -> its placement group
        self._reserved: list[Reservation] = []
        self._made = 0                       # placement groups made (their names' numbers)

    def reserve(self, count: int, *, warm_up: tuple[list[str], list[str]] | None = None,
                accelerator_type: str | None = None) -> Reservation:
        """Ask Ray for ``count`` more replicas' resources (returns at once; see
        :class:`Reservation`).

        Args:
            warm_up: ``(modules, paths)`` each new replica imports before it counts as up
                (see ``ReplicaWorker.warm_up``): the modules of a replica running the job,
                so that joining it costs what staying costs.
            accelerator_type: place them on nodes of this type only (each bundle asks
                for it, see :func:`~adaptdl_ray.replicas.bundles.replica_bundle`, or by
                its label where its nodes carry only that,
                :func:`~adaptdl_ray.replicas.nodes.type_request`); ``None``: on any node.

        Raises:
            ValueError: ``count`` < 1.
        """
        from ray.util.placement_group import placement_group

        from adaptdl_ray.replicas.nodes import type_request
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        bundle, select = type_request(self.resources, accelerator_type, 1)
        pgs = []
        for _ in range(count):
            self._made += 1
            pgs.append(placement_group([dict(bundle)], strategy="PACK",
                                       name=f"{self.name}-{self._made}", **select))
        reservation = Reservation(self, pgs, self._clock(), warm_up, accelerator_type)
        self._reserved.append(reservation)
        return reservation

    def start_actors(self, pgs: Sequence[Any]) -> list[Any]:
        """Start one replica actor in each (placed) placement group of ``pgs``."""
        from adaptdl_ray.replicas.group import new_workers
        actors = new_workers(self.resources, self.trial_info, [(pg, 0) for pg in pgs])
        self._pg_of.update(zip(actors, pgs))
        return actors

    def take(self, reservation: Reservation) -> list[Any]:
        """The actors of a reservation that is :meth:`~Reservation.up`, now the job's
        replicas (released with :meth:`release` or :meth:`release_all`).

        Raises:
            ValueError: the reservation is not up (or was cancelled).
        """
        if reservation.cancelled or not reservation.up():
            raise ValueError("take: the reservation's replicas are not up")
        self._reserved = [r for r in self._reserved if r is not reservation]
        return list(reservation.actors)

    def release(self, actors: Sequence[Any], *, pgs: Sequence[Any] = ()) -> None:
        """Stop ``actors`` and give back their placement groups (and ``pgs``, reserved
        for actors that never started)."""
        from ray.util.placement_group import remove_placement_group

        from adaptdl_ray.replicas.group import stop_workers
        stop_workers(list(actors))
        groups = [self._pg_of.pop(a) for a in actors if a in self._pg_of]
        for pg in dict.fromkeys([*groups, *pgs]):
            try:
                remove_placement_group(pg)
            except Exception:  # noqa: BLE001 - already removed (or its node is gone)
                LOG.debug("placement group already removed", exc_info=True)

    def release_all(self) -> None:
        """Stop every replica of the job and cancel every reservation (idempotent)."""
        for reservation in self._reserved:
            reservation.cancel()
        self._reserved = []
        self.release(list(self._pg_of))


class Grow:
    """The new replicas of a grow, started while the job trains: reserved and started once
    their resources are free (the jobs that shrink free them first), taken by the launch
    after the checkpoint, or given back when no longer wanted or not up within
    :data:`GROW_WAIT_S` (the cluster changed meanwhile; the grow is tried again).

    Args:
        pool: the job's pool (its reservations).
        fits_fn: whether ``extra`` more replicas' resources are free now (default: Ray's
            count of free resources).
        name: how log lines name the job.
    """

    def __init__(self, pool: ReplicaPool, fits_fn: Callable[[int], bool] | None = None,
                 name: str = "job") -> None:
        self.pool = pool
        self.fits_fn = fits_fn or self._ray_fits
        self.name = name
        self.reservation: Reservation | None = None
        self._type: str | None = None  # the type of the grow being asked for
        self._label_typed: set[str] = set()  # types found asked for by their label

    def ready(self, extra: int, warm_up: Callable[[], tuple[list[str], list[str]]],
              accelerator_type: str | None = None) -> bool:
        """Whether ``extra`` new replicas are up: reserves and starts them (each importing
        ``warm_up()``'s ``(modules, paths)``: rank 0's, so that joining costs what staying
        costs) once their resources are free, on nodes of ``accelerator_type`` if given; a
        grow of another size or type is given back."""
        grow = self.reservation
        if grow is not None and (grow.count != extra or
                                 grow.accelerator_type != accelerator_type):
            self.cancel()
            grow = None
        self._type = accelerator_type
        try:
            if grow is None:
                if not self.fits_fn(extra):
                    return False
                LOG.info("%s: starting %d new replica(s) while it trains", self.name, extra)
                self.reservation = grow = self.pool.reserve(
                    extra, warm_up=warm_up(), accelerator_type=accelerator_type)
            if grow.up():
                return True
        except Exception as exc:  # noqa: BLE001 - the job trains on; the grow is retried
            LOG.warning("%s: new replicas for a grow could not start (%s); trying again",
                        self.name, str(exc).splitlines()[0] if str(exc) else exc)
            self.cancel()
            return False
        if time.monotonic() - grow.created > GROW_WAIT_S:
            LOG.warning("%s: %d new replica(s) not up within %.0f s; giving their resources "
                        "back", self.name, extra, GROW_WAIT_S)
            self.cancel()
        return False

    def take(self, need: int, accelerator_type: str | None = None) -> Reservation | None:
        """The grow's reservation if it brings ``need`` replicas on ``accelerator_type``
        and was not cancelled (``None`` otherwise; a grow that does not match is given
        back)."""
        grow, self.reservation = self.reservation, None
        if grow is not None and grow.count == need and not grow.cancelled and \
                grow.accelerator_type == accelerator_type:
            return grow
        if grow is not None:
            grow.cancel()
        return None

    def cancel(self) -> None:
        """Give back the replicas started for a grow that is no longer wanted."""
        if self.reservation is not None:
            LOG.info("%s: grow by %d replica(s) cancelled", self.name, self.reservation.count)
            self.reservation.cancel()
            self.reservation = None

    def _ray_fits(self, extra: int) -> bool:
        from adaptdl_ray.replicas.nodes import asked_by_label, free_resources
        free = free_resources()
        bundle = replica_bundle(self.pool.resources, self._type)
        if self._type is not None and type_resource(self._type) not in free and \
                (self._type in self._label_typed or asked_by_label(self._type)):
            # No resource names the type: its replicas' own resources are counted over
            # the whole cluster. (Remembered, so that this check, made at every hook while
            # a grow waits, asks Ray for its nodes once per type.)
            self._label_typed.add(self._type)
            bundle = replica_bundle(self.pool.resources)
        return all(free.get(k, 0.0) + 1e-9 >= v * extra for k, v in bundle.items())
