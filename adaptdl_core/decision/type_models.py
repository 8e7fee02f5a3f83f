"""A job's throughput model on every accelerator type of a mixed cluster (pure functions).

A job measures its step times only where it runs, and runs on one type at a time. The
decision core keeps the hints it reported on each type (``hints_by_type``) and those of its
profile group's best-profiled job on each type; :func:`typed_hints` gives, per type of the
cluster, the hints the policy models the job with:

1. **Measured**: the job's own fit on that type (with its latest gradient statistics), or
   its group's when the group's covers more replicas (as :func:`.jobs.group_hints`).
2. **Borrowed**: the group's fit on that type, when the job has none there: another job of
   the same model ran there.
3. **Projected**: from the job's own fit on another type (the most widely profiled), else
   its group's, every time of the throughput model divided by the speed ratio of the two
   types at the job's batch (:class:`TypeSpeeds`): the median ratio over the profile
   groups measured on both, else the ratio of the types' published peak figures
   (:data:`ACCELERATOR_SPECS`), else 1.
   The projected fit keeps the source's profiled extent, so the job may explore there as
   far as it has elsewhere.
4. **Unknown**: no fit on any type and none in its group: ``None`` (the linear prior,
   scaled by the type's speed: :func:`type_speed_prior`).

A fit whose type is not known (hints from a job whose nodes the front-end did not report)
stands for the job on every type its group has not measured, unscaled.

So a new job needs no profiling on every type: a job that has run on one type, or whose
model has run on others, is modelled everywhere, including on a type no trace covers (an
L4, an H100) through the spec ratio. ``benchmarks/type_bootstrap.py`` measures how wrong
each step is against the Sia artifact's measurements of six models on five types.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Dict, Iterable, Mapping, Optional, Sequence, Tuple

import numpy as np

from adaptdl_core.goodput import PerfParams

from .jobs import EXPLORATION_FACTOR, exploration_cap, group_hints, profiled_extent, \
    speedup_from_hints

__all__ = ["ACCELERATOR_SPECS", "TypeSpeeds", "type_speed_prior", "project_hints",
           "typed_hints", "compute_speed", "reference_batch", "ScaledSpeedup",
           "typed_speedups"]

#: Public peak figures of common accelerators: (dense FP16 tensor TFLOPS, memory GB/s),
#: from the vendors' data sheets. Keys are lower case; Ray's ``accelerator_type`` names
#: (``"T4"``, ``"A100"``, ``"H100"``...) and the simulator's (``"rtx"``, ``"quad"``) map here
#: through :func:`_spec_key`.
ACCELERATOR_SPECS: Dict[str, Tuple[float, float]] = {
    "t4": (65.0, 320.0),
    "l4": (121.0, 300.0),
    "a10": (125.0, 600.0),
    "a10g": (125.0, 600.0),
    "v100": (125.0, 900.0),
    "a100": (312.0, 1555.0),
    "a100-80g": (312.0, 2039.0),
    "h100": (989.0, 3350.0),
    "rtx2080ti": (108.0, 616.0),
    "quadrortx6000": (130.0, 672.0),
    "p100": (19.0, 732.0),
    "k80": (8.7, 480.0),
}

_ALIASES = {"rtx": "rtx2080ti", "quad": "quadrortx6000", "a100-40g": "a100",
            "a100-40gb": "a100", "a100-80gb": "a100-80g", "h100-80g": "h100",
            "tesla-t4": "t4", "tesla-v100": "v100"}


def _spec_key(accelerator_type: Optional[str]) -> Optional[str]:
    if accelerator_type is None:
        return None
    key = accelerator_type.strip().lower().replace("nvidia-", "").replace(" ", "")
    return _ALIASES.get(key, key)


def type_speed_prior(accelerator_type: Optional[str]) -> Optional[float]:
    """Rough training speed of one accelerator relative to a T4: the geometric mean of the
    ratios of peak tensor FLOPS and memory bandwidth (``None`` for an unknown name)."""
    spec = ACCELERATOR_SPECS.get(_spec_key(accelerator_type) or "")
    if spec is None:
        return None
    t4 = ACCELERATOR_SPECS["t4"]
    return math.sqrt(spec[0] / t4[0] * spec[1] / t4[1])


def compute_speed(hints: Mapping[str, Any], batch: float) -> Optional[float]:
    """Samples per second of one replica's compute at ``batch`` samples, from hints' fit
    (``None`` without a fit)."""
    perf = (hints or {}).get("perf_params")
    if not perf:
        return None
    p = PerfParams(**perf) if isinstance(perf, Mapping) else PerfParams(*perf)
    t = p.alpha_c + p.beta_c * batch
    return batch / t if t > 0 else None


def reference_batch(hints: Mapping[str, Any]) -> float:
    """The per-replica batch at which a job's types are compared: its initial batch size,
    within its hints' local batch bounds."""
    batch = float(hints.get("init_batch_size") or 1)
    lo, hi = (hints.get("local_bsz_bounds") or (None, None))
    if hi:
        batch = min(batch, float(hi))
    if lo:
        batch = max(batch, float(lo))
    return batch


class TypeSpeeds:
    """How much faster one accelerator type trains than another for a given per-replica
    batch, learnt from the profile groups measured on both (the median over groups of
    their compute speeds' ratio at that batch), else from :func:`type_speed_prior`.

    Args:
        fits: per profile group, its hints per type (``{group: {type: hints}}``).
    """

    def __init__(self, fits: Mapping[Any, Mapping[Optional[str], Mapping[str, Any]]]) -> None:
        self._fits = [{t: h for t, h in by_type.items() if profiled_extent(h)}
                      for by_type in fits.values()]
        self._cache: Dict[Tuple[Optional[str], Optional[str], float], Optional[float]] = {}

    def _learnt(self, source: Optional[str], target: Optional[str],
                batch: float) -> Optional[float]:
        key = (source, target, float(batch))
        if key not in self._cache:
            ratios = []
            for by_type in self._fits:
                if source in by_type and target in by_type:
                    sa = compute_speed(by_type[source], batch)
                    sb = compute_speed(by_type[target], batch)
                    if sa and sb:
                        ratios.append(sb / sa)
            self._cache[key] = statistics.median(ratios) if ratios else None
        return self._cache[key]

    def ratio(self, source: Optional[str], target: Optional[str], batch: float) -> float:
        """Speed on ``target`` over speed on ``source`` at ``batch`` samples per replica
        (1 when nothing says)."""
        if source == target:
            return 1.0
        learnt = self._learnt(source, target, batch)
        if learnt is not None:
            return learnt
        a, b = type_speed_prior(source), type_speed_prior(target)
        return b / a if a and b else 1.0

    def learnt(self, source: Optional[str], target: Optional[str], batch: float) -> bool:
        """Whether :meth:`ratio` of the pair comes from measurements."""
        return self._learnt(source, target, batch) is not None


def project_hints(hints: Mapping[str, Any], ratio: float) -> Dict[str, Any]:
    """``hints`` with every time of their throughput fit divided by ``ratio`` (a type
    ``ratio`` times as fast)."""
    perf = hints["perf_params"]
    p = PerfParams(**perf) if isinstance(perf, Mapping) else PerfParams(*perf)
    r = float(ratio)
    scaled = PerfParams(p.alpha_c / r, p.beta_c / r, p.alpha_n / r, p.beta_n / r,
                        p.alpha_r / r, p.beta_r / r, p.gamma)
    out = dict(hints)
    out["perf_params"] = scaled.to_dict()
    return out


def _with_latest(fit: Mapping[str, Any], latest: Optional[Mapping[str, Any]]
                 ) -> Dict[str, Any]:
    """``fit``'s throughput model and extent with the latest gradient statistics and
    batch limits of the job."""
    out = dict(latest or fit)
    for key in ("perf_params", "max_profiled_replicas", "max_profiled_nodes",
                "local_bsz_bounds"):
        if key in fit:
            out[key] = fit[key]
    if not out.get("grad_params"):
        out["grad_params"] = fit.get("grad_params")
    out.pop("accelerator_type", None)
    return out


def typed_hints(types: Iterable[Optional[str]], own: Mapping[Optional[str], Mapping[str, Any]],
                group: Mapping[Optional[str], Mapping[str, Any]],
                latest: Optional[Mapping[str, Any]], speeds: TypeSpeeds
                ) -> Dict[Optional[str], Optional[Dict[str, Any]]]:
    """The hints a job is modelled with on each of ``types`` (the module doc's rules).

    Args:
        own: the job's hints on each type it has measured.
        group: its profile group's best hints on each type (may be empty).
        latest: the job's latest hints (their gradient statistics are the newest).
        speeds: the type speed ratios.

    Returns:
        type -> hints (``None``: no fit anywhere).
    """
    own = {t: h for t, h in own.items() if profiled_extent(h)}
    group = {t: h for t, h in group.items() if profiled_extent(h)}
    mine = sorted(own.items(), key=lambda kv: -profiled_extent(kv[1]))
    if not mine and profiled_extent(latest):
        # A fit of no known type (the front-end could not say where it ran): taken as is
        # on every type the group has not measured.
        mine = [(None, latest)]
    sources: Sequence[Tuple[Optional[str], Mapping[str, Any]]] = \
        mine + sorted(group.items(), key=lambda kv: -profiled_extent(kv[1]))
    out: Dict[Optional[str], Optional[Dict[str, Any]]] = {}
    for t in types:
        if t in own:
            merged = group_hints(_with_latest(own[t], latest), group.get(t))
            out[t] = _with_latest(merged, latest)
        elif t in group:
            out[t] = _with_latest(group[t], latest)
        elif sources:
            src_type, src = sources[0]
            base = _with_latest(src, latest)
            out[t] = project_hints(base, speeds.ratio(src_type, t, reference_batch(base)))
        else:
            out[t] = None
    return out


class ScaledSpeedup:
    """A speedup function times a constant, flat beyond ``cap`` replicas: one type's
    speedup in the unit common to the job's types, within its exploration bound.

    Args:
        fn: the type's own speedup function.
        factor: its value of one replica in the common unit (> 0).
        cap: replicas beyond which the speedup does not grow (>= 1).
    """

    def __init__(self, fn: Any, factor: float, cap: int) -> None:
        self.fn = fn
        self.factor = float(factor)
        self.cap = max(int(cap), 1)
        useful = getattr(fn, "max_useful_replicas", None)
        self.max_useful_replicas = self.cap if useful is None else max(min(self.cap,
                                                                            int(useful)), 1)

    def __call__(self, num_nodes: Any, num_replicas: Any) -> np.ndarray:
        """``factor`` times ``fn`` at ``min(num_replicas, cap)`` (0 for no replicas)."""
        nodes, replicas = np.broadcast_arrays(np.asarray(num_nodes), np.asarray(num_replicas))
        capped = np.minimum(replicas, self.cap)
        return self.factor * np.asarray(self.fn(np.minimum(nodes, capped), capped),
                                        dtype=np.float64)

    def __repr__(self) -> str:
        return f"ScaledSpeedup({self.fn!r}, factor={self.factor:.4g}, cap={self.cap})"


def typed_speedups(type_hints: Mapping[Optional[str], Optional[Mapping[str, Any]]],
                   speeds: TypeSpeeds, *, factor: int = EXPLORATION_FACTOR,
                   current_type: Optional[str] = None, current_replicas: int = 0,
                   build: Any = None) -> Dict[Optional[str], ScaledSpeedup]:
    """Per type, the job's speedup function in one unit across types (pure).

    The unit is the best goodput of one replica on the first type with a goodput model
    (or, with none, a replica of the first type): a type with a model is scaled by its own
    one-replica goodput over the unit; one without by the speed ratio of the two types.
    Each is flat beyond the type's exploration bound (``factor`` times the replicas its
    hints were profiled at; on the job's current type at least its current count).

    Args:
        type_hints: :func:`typed_hints` output.
        build: ``(type, hints) -> speedup function`` (default: :func:`.jobs.speedup_from_hints`
            of the hints; a cache may be passed).
    """
    fns = {t: build(t, h) if build is not None else speedup_from_hints(h)
           for t, h in type_hints.items()}
    ref = next((t for t, fn in fns.items() if hasattr(fn, "base_goodput")), None)
    if ref is None:
        ref = next(iter(fns), None)
    out: Dict[Optional[str], ScaledSpeedup] = {}
    for t, fn in fns.items():
        if hasattr(fn, "base_goodput") and ref is not None and hasattr(fns[ref], "base_goodput"):
            scale = fn.base_goodput / fns[ref].base_goodput
        else:
            hints = type_hints[ref] or type_hints[t] or {}
            scale = speeds.ratio(ref, t, reference_batch(hints))
        cap = exploration_cap(type_hints[t], factor)
        if t == current_type:
            cap = max(cap, int(current_replicas))
        out[t] = ScaledSpeedup(fn, scale, cap)
    return out
