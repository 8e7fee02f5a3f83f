"""Speedup functions: how much faster a job trains on ``(num_nodes, num_replicas)``.

A speedup function is any callable ``f(num_nodes, num_replicas) -> speedups`` that accepts
broadcastable integer arrays and returns a float array of the broadcast shape. The
allocator (:mod:`adaptdl_core.policy.allocator`) only relies on that contract, plus two
conventions both classes here follow:

* ``num_replicas == 0`` gives speedup 0 (the job does not run);
* speedup is non-increasing in ``num_nodes`` for a fixed ``num_replicas`` (spreading the
  same replicas over more nodes never helps). The allocator's optimality bound assumes it;
* an optional ``max_useful_replicas`` attribute (an integer, or ``None`` for unknown) says
  beyond which replica count the speedup no longer grows. The allocator caps the job there,
  so its work does not grow with the nodes' capacity; a callable without it is capped at
  :data:`adaptdl_core.policy.records.UNBOUNDED_REPLICA_CAP` unless ``max_replicas`` is set.

:class:`SpeedupFunction` derives the speedup from a fitted goodput model (Pollux:
``SPEEDUP(N, K) = max goodput at (N, K) / max goodput at the base shape``).
:class:`LinearSpeedup` is the prior for a job without a fitted model: linear in ``K`` up to
twice the largest replica count the job has been profiled at (bounded exploration).
"""

from __future__ import annotations

import math
from typing import Any, Optional, Protocol, Tuple, Union

import numpy as np

from adaptdl_core import validation

from .records import MAX_REPLICAS_PER_JOB

# Node counts the dense cache of a SpeedupFunction covers (with collapse_nodes only 1 and
# 2 are ever used): 257 x 32768 float64 entries at most, 64 MiB.
_MAX_CACHED_NODES = 256

__all__ = ["SpeedupFunction", "LinearSpeedup", "GoodputOptimizer"]

ArrayLike = Union[int, float, np.ndarray, "list[int]"]


class GoodputOptimizer(Protocol):
    """What :class:`SpeedupFunction` needs from a goodput model (e.g.
    :class:`adaptdl_core.goodput.GoodputFunction`)."""

    def optimize(self, num_nodes: Any, num_replicas: Any, max_batch_size: Optional[int] = None,
                 atomic_bsz_range: Optional[Tuple[Optional[int], Optional[int]]] = None,
                 accumulation: bool = False) -> Tuple[Any, Any, Any]:
        """Best ``(goodput, atomic_bsz, accum_steps)`` per shape, vectorised; infeasible
        shapes give goodput 0."""
        ...


def _as_shapes(num_nodes: ArrayLike, num_replicas: ArrayLike) -> Tuple[np.ndarray, np.ndarray]:
    """Broadcast and validate ``(num_nodes, num_replicas)`` as int64 arrays.

    Raises:
        ValueError: for non-integral, non-finite or negative entries (the message names the
            argument).
    """
    out = []
    for name, value in (("num_nodes", num_nodes), ("num_replicas", num_replicas)):
        arr = np.asarray(value)
        if arr.dtype == bool or not (np.issubdtype(arr.dtype, np.integer)
                                     or np.issubdtype(arr.dtype, np.floating)):
            raise ValueError(f"{name} must be an integer array, got dtype {arr.dtype}")
        if np.issubdtype(arr.dtype, np.floating):
            if not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr)):
                raise ValueError(f"{name} must hold whole numbers, got {value!r}")
        arr = arr.astype(np.int64)
        if np.any(arr < 0):
            raise ValueError(f"{name} must be >= 0, got {value!r}")
        out.append(arr)
    try:
        nodes, replicas = np.broadcast_arrays(out[0], out[1])
    except ValueError:
        raise ValueError(f"num_nodes {out[0].shape} and num_replicas {out[1].shape} "
                         "do not broadcast") from None
    return nodes, replicas


def _is_pollux_model(goodput_fn: Any) -> bool:
    try:
        from adaptdl_core.goodput import GoodputFunction
    except ImportError:  # pragma: no cover - partial checkout
        return False
    return isinstance(goodput_fn, GoodputFunction)


class SpeedupFunction:
    """Speedup of a job from its goodput model, memoised per ``(num_nodes, num_replicas)``.

    ``speedup(N, K) = best goodput at (N, K) / best goodput at the base shape``, where
    "best" is over the batch configuration (atomic batch, accumulation steps) the goodput
    model's ``optimize`` chooses under the given limits, and the base shape is one node with
    ``base_replicas`` replicas (default 1; Pollux normalises by the job's fair share, for a
    single-replica job that is one replica on one node). A shape with ``K == 0``, ``N == 0``
    or ``N > K`` has speedup 0.

    Each distinct shape is evaluated once and cached (a dense table grown on demand), so
    repeated calls within and across allocation rounds cost a numpy gather. Shapes beyond
    what an allocator gives a job (more than
    :data:`~adaptdl_core.policy.records.MAX_REPLICAS_PER_JOB` replicas, or more than 256
    nodes) are computed at every call instead, so the table stays small. The goodput
    model is treated as immutable: build a new ``SpeedupFunction`` when the model is refitted.

    Args:
        goodput_fn: an object with the ``optimize`` method of
            :class:`adaptdl_core.goodput.GoodputFunction`.
        max_batch_size: largest total batch (samples) the job accepts, passed to ``optimize``;
            ``None`` keeps the initial batch size.
        atomic_bsz_range: ``(lo, hi)`` bounds on the per-replica batch, passed on.
        accumulation: whether gradient accumulation may be used, passed on.
        base_replicas: replicas of the base shape (on one node), ``>= 1``.
        collapse_nodes: evaluate every ``N >= 2`` as ``N = 2`` (exact when the model
            depends on the node count only through ``N == 1`` vs ``N > 1``, as
            :class:`adaptdl_core.goodput.GoodputFunction` does). ``None``: on for that
            class, off for any other model.

    Raises:
        ValueError: if ``goodput_fn`` has no ``optimize`` method, ``base_replicas`` is not a
            positive integer, or the goodput at the base shape is not a positive finite number
            (the speedup would be undefined).
    """

    def __init__(self, goodput_fn: GoodputOptimizer, max_batch_size: Optional[int] = None,
                 atomic_bsz_range: Optional[Tuple[Optional[int], Optional[int]]] = None,
                 accumulation: bool = False, *, base_replicas: int = 1,
                 collapse_nodes: Optional[bool] = None) -> None:
        if not callable(getattr(goodput_fn, "optimize", None)):
            raise ValueError("goodput_fn must have an optimize(num_nodes, num_replicas, ...) "
                             f"method, got {type(goodput_fn).__name__}")
        base_replicas = validation.integer("base_replicas", base_replicas, 1)
        if collapse_nodes is None:
            collapse_nodes = _is_pollux_model(goodput_fn)
        # The Pollux throughput model only distinguishes N == 1 from N > 1, so every N >= 2
        # can share one evaluation (halves the work of a first allocation round).
        self._collapse = bool(collapse_nodes)
        self._goodput_fn = goodput_fn
        self._max_batch_size = max_batch_size
        self._atomic_bsz_range = atomic_bsz_range
        self._accumulation = bool(accumulation)
        self._base_replicas = int(base_replicas)
        base = float(np.asarray(self._goodput(np.array([1]), np.array([self._base_replicas])))[0])
        if not math.isfinite(base) or base <= 0.0:
            raise ValueError(
                f"goodput_fn: the goodput at the base shape (1 node, {self._base_replicas} "
                f"replica(s)) must be positive and finite, got {base!r}; check max_batch_size "
                "and atomic_bsz_range, or raise base_replicas")
        self._base_goodput = base
        # Dense cache: _table[N, K] is the speedup, NaN where not computed yet.
        self._table = np.full((2, 2), np.nan)
        self._table[:, 0] = 0.0

    @property
    def max_useful_replicas(self) -> Optional[int]:
        """Most replicas that can run the job at all, or ``None`` if unknown.

        For :class:`adaptdl_core.goodput.GoodputFunction` models this is
        ``max_batch_size // lo`` (``M0 // lo`` without a ``max_batch_size``; ``lo`` the atomic
        batch's lower bound, default 1): with more replicas even one micro-batch of ``lo``
        samples each exceeds the job's largest batch. The allocator bounds the job's replica
        count by it, so its cost does not grow with a node's capacity."""
        if not _is_pollux_model(self._goodput_fn):
            return None
        limit = self._max_batch_size or self._goodput_fn.init_batch_size
        lo = (self._atomic_bsz_range or (None, None))[0] or 1
        return max(int(limit) // int(lo), 1)

    @property
    def base_goodput(self) -> float:
        """Best goodput (samples/s) at the base shape; speedups are relative to it."""
        return self._base_goodput

    def _goodput(self, nodes: np.ndarray, replicas: np.ndarray) -> np.ndarray:
        goodput = self._goodput_fn.optimize(nodes, replicas, max_batch_size=self._max_batch_size,
                                            atomic_bsz_range=self._atomic_bsz_range,
                                            accumulation=self._accumulation)[0]
        goodput = np.asarray(goodput, dtype=np.float64).reshape(nodes.shape)
        # Infeasible shapes must read as "no progress", never as NaN/negative.
        return np.where(np.isfinite(goodput) & (goodput > 0), goodput, 0.0)

    def _grow(self, max_nodes: int, max_replicas: int) -> None:
        rows, cols = self._table.shape
        if max_nodes < rows and max_replicas < cols:
            return
        # Grow at least geometrically so that re-allocations stay logarithmic in the size.
        new_cols = max(max_replicas + 1, 2 * cols) if max_replicas >= cols else cols
        new_rows = (max(max_nodes + 1, min(2 * rows, new_cols)) if max_nodes >= rows
                    else rows)
        table = np.full((new_rows, new_cols), np.nan)
        table[:, 0] = 0.0
        table[:rows, :cols] = self._table
        self._table = table

    def __call__(self, num_nodes: ArrayLike, num_replicas: ArrayLike) -> np.ndarray:
        """Speedup at each ``(num_nodes, num_replicas)`` (broadcast), as a float array.

        Raises:
            ValueError: for negative or non-integral inputs.
        """
        nodes, replicas = _as_shapes(num_nodes, num_replicas)
        out = np.zeros(nodes.shape, dtype=np.float64)
        ok = (replicas > 0) & (nodes >= 1) & (nodes <= replicas)
        if not np.any(ok):
            return out[()]
        n_ok, k_ok = nodes[ok], replicas[ok]
        if self._collapse:
            n_ok = np.minimum(n_ok, 2)
        # The dense cache covers what an allocator can give a job, on up to
        # _MAX_CACHED_NODES nodes (its size is their product); other shapes (asked
        # directly) are computed each time, so memory never grows with the numbers asked.
        big = (k_ok > MAX_REPLICAS_PER_JOB) | (n_ok > _MAX_CACHED_NODES)
        if np.any(big):
            values = np.empty(k_ok.shape)
            values[big] = self._goodput(n_ok[big], k_ok[big]) / self._base_goodput
            values[~big] = self._cached(n_ok[~big], k_ok[~big])
        else:
            values = self._cached(n_ok, k_ok)
        out[ok] = values
        return out[()]

    def _cached(self, n_ok: np.ndarray, k_ok: np.ndarray) -> np.ndarray:
        """Speedups at valid shapes within the table's bounds, through the table."""
        if k_ok.size == 0:
            return np.zeros(0)
        self._grow(int(n_ok.max()), int(k_ok.max()))
        values = self._table[n_ok, k_ok]
        missing = np.isnan(values)
        if np.any(missing):
            # Distinct missing shapes, deduplicated through a 1-D key (fast np.unique).
            key = np.unique(n_ok[missing] * (int(k_ok.max()) + 1) + k_ok[missing])
            n_new, k_new = np.divmod(key, int(k_ok.max()) + 1)
            self._table[n_new, k_new] = self._goodput(n_new, k_new) / self._base_goodput
            values = self._table[n_ok, k_ok]
        return values

    def __repr__(self) -> str:
        return (f"SpeedupFunction(base_goodput={self._base_goodput:.4g}, "
                f"max_batch_size={self._max_batch_size!r}, "
                f"atomic_bsz_range={self._atomic_bsz_range!r}, "
                f"accumulation={self._accumulation!r})")


class LinearSpeedup:
    """Prior speedup for a job without a fitted model: ``min(K, cap)``, independent of ``N``.

    ``cap = max(2 * max_profiled_replicas, 1)``: the job may be given up to twice the largest
    replica count it has been seen at (Pollux's bounded exploration), and a job that has not
    run yet one replica: with nothing measured, a second replica may as well slow it down
    (a small model on CPUs ran 3x slower on 2 replicas than on 1). Beyond the cap the
    speedup is flat, so an optimiser gives it no extra replicas; once the job is profiled at
    the larger count its fitted model (or a new prior with a larger cap) takes over. A shape
    with ``K == 0``, ``N == 0`` or ``N > K`` has speedup 0.

    Args:
        max_profiled_replicas: the largest replica count the job has run at (``>= 0``; 0 for
            a job that has not run yet).

    Raises:
        ValueError: if ``max_profiled_replicas`` is not an integer ``>= 0``.
    """

    def __init__(self, max_profiled_replicas: int) -> None:
        self._max_profiled = validation.integer("max_profiled_replicas", max_profiled_replicas, 0)
        self._cap = max(2 * self._max_profiled, 1)

    @property
    def cap(self) -> int:
        """The replica count beyond which the prior gives no further speedup."""
        return self._cap

    @property
    def max_useful_replicas(self) -> int:
        """Same as :attr:`cap`: the allocator never gives the job more replicas than this."""
        return self._cap

    def __call__(self, num_nodes: ArrayLike, num_replicas: ArrayLike) -> np.ndarray:
        """Speedup ``min(K, cap)`` at each shape (0 for invalid shapes), as a float array.

        Raises:
            ValueError: for negative or non-integral inputs.
        """
        nodes, replicas = _as_shapes(num_nodes, num_replicas)
        ok = (replicas > 0) & (nodes >= 1) & (nodes <= replicas)
        return np.where(ok, np.minimum(replicas, self._cap), 0).astype(np.float64)[()]

    def __repr__(self) -> str:
        return f"LinearSpeedup(max_profiled_replicas={self._max_profiled})"
