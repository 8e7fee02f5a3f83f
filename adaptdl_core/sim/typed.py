"""The simulator on clusters of several GPU types: jobs, and Pollux as the Sia paper ran it.

On a typed cluster (:class:`~adaptdl_core.sim.gpu_types.ClusterSpec`) every job knows its
model's step times on each type present (:func:`make_typed_jobs`), restarts in its model's
own checkpoint-restore delay, and trains at the traced speed divided by the model's
calibration slowdown (the Sia simulator's constants, ``data/README.md``). A job runs on one
type at a time.

:class:`TypeUnawarePollux` runs a type-blind scheduler the way the Sia paper ran Pollux:
8-GPU nodes shown as two 4-GPU nodes, a job's replicas capped at the GPUs of the smallest
type, each job's agent keeping one profile of everything it measured on any type, and a
job whose allocation spans types keeping only the GPUs of the type with most of them (ties:
:data:`~adaptdl_core.sim.gpu_types.TYPE_PREFERENCE`); the GPUs it drops stay idle that
round.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence

from .gpu_types import CALIBRATION_SLOWDOWN, RESTART_DELAY_S, ClusterSpec, preferred_type
from .job_model import SimJob, get_application

__all__ = ["make_typed_jobs", "TypeUnawarePollux", "virtual_nodes"]


def make_typed_jobs(rows: Sequence, spec: ClusterSpec, *, type_aware: bool,
                    restart_s: Optional[float] = None, calibrate: bool = True,
                    fixed_batch: Optional[Mapping[str, int]] = None,
                    traces=None) -> List[SimJob]:
    """One adaptive :class:`SimJob` per workload row, with its model's application on each
    GPU type of ``spec``.

    Args:
        rows: workload rows (``name``, ``time``, ``application``).
        type_aware: whether each job's agent keeps a profile per type (see
            :class:`SimJob`).
        restart_s: seconds per start or change of allocation (``None``: the model's own
            delay, :data:`~adaptdl_core.sim.gpu_types.RESTART_DELAY_S`).
        calibrate: divide training speed by the model's calibration slowdown.
        fixed_batch: application -> a fixed total batch (ncf's, as in both papers).

    Raises:
        ValueError: an application without traces.
    """
    jobs = []
    for r in rows:
        apps = {t: get_application(r.application, traces, t) for t in spec.types}
        delay = RESTART_DELAY_S.get(r.application, 30.0) if restart_s is None else restart_s
        slowdown = CALIBRATION_SLOWDOWN.get(r.application, 1.0) if calibrate else 1.0
        jobs.append(SimJob(r.name, apps[spec.types[0]], r.time,
                           target_batch_size=(fixed_batch or {}).get(r.application),
                           restart_s=delay, apps_by_type=apps, type_aware=type_aware,
                           slowdown=slowdown))
    return jobs


def virtual_nodes(spec: ClusterSpec, size: int = 4) -> Dict[int, tuple]:
    """The cluster as nodes of ``size`` GPUs: virtual node id -> ``(real node id, GPUs)``.
    A node whose GPUs are a multiple of ``size`` becomes that many virtual nodes; any
    other stays whole."""
    out: Dict[int, tuple] = {}
    v = 0
    for real, gpus in spec.node_gpus().items():
        parts = gpus // size if gpus % size == 0 and gpus > size else 1
        for _ in range(parts):
            out[v] = (real, gpus // parts)
            v += 1
    return out


class TypeUnawarePollux:
    """A type-blind policy on a typed cluster, as the Sia paper ran Pollux (module doc).

    Args:
        inner: the policy (``decide(now, jobs, allocations, nodes)``) that sees only
            virtual nodes, e.g. :class:`~adaptdl_core.sim.pollux.CorePollux`.
        spec: the real cluster.
    """

    type_aware = False

    def __init__(self, inner, spec: ClusterSpec) -> None:
        self.inner = inner
        self.name = getattr(inner, "name", "pollux")
        self.path = getattr(inner, "path", None)
        self._vnodes = virtual_nodes(spec)
        self._types = spec.node_types()
        self._held: Dict[str, List[int]] = {}
        #: GPUs dropped from mixed allocations, summed over rounds.
        self.dropped_gpus = 0

    def decide(self, now: float, jobs: Mapping[str, SimJob],
               allocations: Mapping[str, List[int]], nodes: Mapping[int, int]
               ) -> Dict[str, List[int]]:
        """New allocations on real nodes (each on one GPU type)."""
        self._held = {k: v for k, v in self._held.items() if k in jobs and allocations.get(k)}
        vnodes = {v: gpus for v, (_, gpus) in self._vnodes.items()}
        proposed = self.inner.decide(now, jobs, dict(self._held), vnodes)
        out: Dict[str, List[int]] = {}
        for name, valloc in proposed.items():
            if not valloc:
                continue
            counts: Dict[str, int] = {}
            for v in valloc:
                t = self._types[self._vnodes[v][0]]
                counts[t] = counts.get(t, 0) + 1
            keep = preferred_type(counts)
            kept = [v for v in valloc if self._types[self._vnodes[v][0]] == keep]
            self.dropped_gpus += len(valloc) - len(kept)
            self._held[name] = kept
            out[name] = sorted(self._vnodes[v][0] for v in kept)
        return out
