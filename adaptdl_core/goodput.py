"""Goodput model of a data-parallel training job: throughput x statistical efficiency.

Notation (as in ``docs/algorithms.md``, which derives the formulas): ``N`` nodes, ``K`` replicas
(``1 <= N <= K``), ``b`` the atomic (per-replica micro) batch, ``s`` the number of *extra* gradient
accumulation micro-batches (each replica runs ``s + 1`` micro-batches per optimizer step),
``M = K * b * (s + 1)`` the total batch of one optimizer step and ``M0`` the user's initial
batch size. Times are in seconds, throughputs and goodputs in samples per second.

Throughput model (7 parameters, :class:`PerfParams`):

* compute time of one micro-batch: ``T_c(b) = alpha_c + beta_c * b``;
* gradient synchronisation: ``T_n = 0`` when ``K == 1``;
  ``alpha_r + beta_r * max(K - 2, 0)`` when all replicas share one node (``N == 1``);
  ``alpha_n + beta_n * max(K - 2, 0)`` when ``N > 1``;
* the last micro-batch overlaps its compute with the synchronisation:
  ``T_o = (T_c ** gamma + T_n ** gamma) ** (1 / gamma)``, ``gamma`` in ``[1, 10]``
  (1: no overlap, the times add; large: the longer of the two hides the other);
* one optimizer step takes ``T_iter = s * T_c + T_o`` and the throughput is
  ``X = M / T_iter``.

Statistical efficiency (:class:`GradParams`): with ``sqr`` an estimate of ``|G|^2`` and
``var`` of ``tr(Sigma) / M0``, the gradient noise scale is ``phi = M0 * var / sqr`` and one
sample at total batch ``M`` is worth ``E(M) = (phi + M0) / (phi + M)`` samples at ``M0``
(``E = 1`` for ``M <= M0``). Goodput is ``X * E(M)``.

:func:`fit_perf_params` fits the 7 throughput parameters to profiled step times.
The module depends on numpy and scipy only.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from adaptdl_core import validation

__all__ = ["PerfParams", "GradParams", "GoodputFunction", "fit_perf_params",
           "check_perf_params", "efficiency"]

ArrayLike = Union[float, int, Sequence[float], np.ndarray]


class PerfParams(NamedTuple):
    """Parameters of the throughput model, all times in seconds.

    ``alpha_c`` / ``beta_c``: fixed and per-sample compute time of one micro-batch;
    ``alpha_n`` / ``beta_n``: fixed and per-extra-replica gradient sync time across nodes;
    ``alpha_r`` / ``beta_r``: the same within a single node; ``gamma`` (dimensionless,
    ``[1, 10]``): how well the last micro-batch's compute overlaps the sync.
    """

    alpha_c: float
    beta_c: float
    alpha_n: float
    beta_n: float
    alpha_r: float
    beta_r: float
    gamma: float

    def to_dict(self) -> dict:
        """The parameters by name, in field order (JSON-ready)."""
        return self._asdict()


class GradParams(NamedTuple):
    """Gradient statistics: ``sqr`` estimates ``|G|^2`` (squared norm of the true gradient),
    ``var`` estimates ``tr(Sigma) / M0``, the variance of a gradient averaged over a batch of
    the initial size ``M0``."""

    sqr: float
    var: float

    def to_dict(self) -> dict:
        """``{"sqr": ..., "var": ...}`` (JSON-ready)."""
        return self._asdict()


# Number of candidate total batch sizes per (N, K) pair examined by ``optimize``.
_GRID_POINTS = 96


def _as_float_array(x: ArrayLike) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def sync_growth(num_nodes: np.ndarray, num_replicas: np.ndarray) -> np.ndarray:
    """How the gradient sync time grows with the placement: the multiplier of ``beta_n`` /
    ``beta_r`` in ``T_n`` (Pollux's ring all-reduce form, ``max(K - 2, 0)``). The model and
    its fit both take it from here (``benchmarks/fit_sync_forms.py`` swaps it to compare
    other forms' extrapolation)."""
    return np.maximum(num_replicas - 2.0, 0.0)


def _sync_time(params: PerfParams, num_nodes: np.ndarray, num_replicas: np.ndarray) -> np.ndarray:
    """Gradient synchronisation time ``T_n`` (seconds) for the given placement(s)."""
    extra = sync_growth(num_nodes, num_replicas)
    intra = params.alpha_r + params.beta_r * extra
    inter = params.alpha_n + params.beta_n * extra
    t_n = np.where(num_nodes > 1, inter, intra)
    return np.where(num_replicas > 1, t_n, 0.0)


def _overlap(t_c: np.ndarray, t_n: np.ndarray, gamma: float) -> np.ndarray:
    """``(t_c**gamma + t_n**gamma) ** (1/gamma)`` computed without overflow/underflow."""
    top = np.maximum(t_c, t_n)
    safe = np.where(top > 0, top, 1.0)
    ratio_sum = (t_c / safe) ** gamma + (t_n / safe) ** gamma
    return np.where(top > 0, top * ratio_sum ** (1.0 / gamma), 0.0)


def check_perf_params(perf: PerfParams) -> PerfParams:
    """Check that ``perf`` describes a usable throughput model and return it.

    Raises:
        ValueError: unless every entry is finite, alphas and betas are ``>= 0``,
            ``gamma > 0`` and ``alpha_c + beta_c > 0`` (the message names the field).
    """
    for name, value in perf.to_dict().items():
        validation.number(f"perf_params.{name}", value, 0.0, low_open=(name == "gamma"))
    if perf.alpha_c + perf.beta_c <= 0:
        raise ValueError("perf_params: alpha_c + beta_c must be > 0")
    return perf


def _checked_array(name: str, value: ArrayLike, minimum: float, *,
                   strict: bool = False) -> np.ndarray:
    """``value`` as a float array whose entries are all finite and ``>= minimum`` (``>``
    with ``strict``).

    Raises:
        ValueError: naming ``name``, the first offending entry and what is needed.
    """
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number or an array of numbers, "
                         f"got {value!r}") from None
    ok = np.isfinite(arr) & ((arr > minimum) if strict else (arr >= minimum))
    if not np.all(ok):
        where = "" if arr.ndim == 0 else f" (entry {int(np.flatnonzero(~ok)[0])})"
        raise ValueError(f"{name} must hold finite numbers {'>' if strict else '>='} "
                         f"{minimum:g}, got {float(arr[~ok].flat[0])!r}{where}")
    return arr


def efficiency(noise_scale: float, init_batch_size: float, batch_size: ArrayLike) -> np.ndarray:
    """Statistical efficiency ``E(M) = (phi + M0) / (phi + max(M, M0))`` in ``(0, 1]``: what
    one sample at total batch ``M`` is worth in samples at ``M0``, for the gradient noise
    scale ``phi`` (in samples; pass 0 when it is unknown or unusable: then ``E = M0 / M``,
    no benefit from larger batches). The one formula of the library (the AdaScale gain
    ``E(M) * M / M0`` follows from it).

    Arguments broadcast (numpy).

    Raises:
        ValueError: for a ``noise_scale`` that is not a finite number ``>= 0``, an
            ``init_batch_size`` that is not a finite number ``> 0``, or a ``batch_size``
            with an entry that is not a finite number ``>= 0`` (the message names it).
    """
    phi = validation.number("noise_scale", noise_scale, 0.0, what="a finite number of samples")
    m0 = validation.number("init_batch_size", init_batch_size, 0.0, low_open=True,
                           what="a finite number of samples")
    m = np.maximum(_checked_array("batch_size", batch_size, 0.0), m0)
    return (phi + m0) / (phi + m)


def _checked_config(num_nodes: ArrayLike, num_replicas: ArrayLike, atomic_bsz: ArrayLike,
                    accum_steps: ArrayLike) -> Tuple[np.ndarray, ...]:
    """The four configuration arguments as float arrays, checked (see ``throughput``)."""
    return (_checked_array("num_nodes", num_nodes, 0.0),
            _checked_array("num_replicas", num_replicas, 0.0),
            _checked_array("atomic_bsz", atomic_bsz, 0.0, strict=True),
            _checked_array("accum_steps", accum_steps, 0.0))


class GoodputFunction:
    """Goodput (useful samples per second) of a job as a function of its configuration.

    Args:
        perf_params: fitted :class:`PerfParams` (or any 7-sequence in that order). All
            entries must be finite, alphas and betas ``>= 0``, ``gamma > 0`` and
            ``alpha_c + beta_c > 0``.
        grad_params: :class:`GradParams` ``(sqr, var)`` (or a 2-sequence). Any values are
            accepted, see :meth:`efficiency` for how unusable estimates are treated.
        init_batch_size: the user's initial total batch size ``M0`` (integer ``>= 1``).

    Raises:
        ValueError: if an argument is malformed (the message names it).
    """

    def __init__(self, perf_params: Sequence[float], grad_params: Sequence[float],
                 init_batch_size: int) -> None:
        try:
            perf = PerfParams(*[float(v) for v in perf_params])
        except (TypeError, ValueError):
            raise ValueError(f"perf_params must be 7 numbers, got {perf_params!r}") from None
        check_perf_params(perf)
        try:
            grad = GradParams(*[float(v) for v in grad_params])
        except (TypeError, ValueError):
            raise ValueError(f"grad_params must be 2 numbers, got {grad_params!r}") from None
        self._perf_params = perf
        self._grad_params = grad
        self._init_batch_size = validation.integer("init_batch_size", init_batch_size, 1,
                                                   integral_floats=True)
        self._noise_scale = self._safe_noise_scale(grad, self._init_batch_size)

    @staticmethod
    def _safe_noise_scale(grad: GradParams, init_batch_size: int) -> float:
        # Unusable estimates (non-finite, |G|^2 <= 0, negative variance) fall back to
        # phi = 0, i.e. E(M) = M0 / M: a larger batch is assumed to buy nothing. This is the
        # pessimistic choice; the opposite (phi -> inf, "perfect scaling") over-counts progress.
        sqr, var = grad.sqr, grad.var
        if not (math.isfinite(sqr) and math.isfinite(var)) or sqr <= 0 or var <= 0:
            return 0.0
        phi = init_batch_size * var / sqr
        # A huge but valid ratio may overflow; cap it (E is then 1.0 to double precision).
        return min(phi, 1e300) if math.isfinite(phi) else 1e300

    def __repr__(self) -> str:
        return (f"GoodputFunction(perf_params={self._perf_params!r}, "
                f"grad_params={self._grad_params!r}, init_batch_size={self._init_batch_size})")

    @property
    def perf_params(self) -> PerfParams:
        """The throughput model parameters."""
        return self._perf_params

    @property
    def grad_params(self) -> GradParams:
        """The gradient statistics as given."""
        return self._grad_params

    @property
    def init_batch_size(self) -> int:
        """The initial total batch size ``M0``."""
        return self._init_batch_size

    @property
    def noise_scale(self) -> float:
        """The gradient noise scale ``phi = M0 * var / sqr`` actually used (0 if unusable)."""
        return self._noise_scale

    def __call__(self, num_nodes: ArrayLike, num_replicas: ArrayLike, atomic_bsz: ArrayLike,
                 accum_steps: ArrayLike) -> np.ndarray:
        """Same as :meth:`evaluate`."""
        return self.evaluate(num_nodes, num_replicas, atomic_bsz, accum_steps)

    def evaluate(self, num_nodes: ArrayLike, num_replicas: ArrayLike, atomic_bsz: ArrayLike,
                 accum_steps: ArrayLike) -> np.ndarray:
        """Goodput in samples/s: ``throughput(...) * efficiency(K * b * (s + 1))``.

        All arguments broadcast against each other (numpy rules); ``accum_steps`` is the
        number of *extra* micro-batches ``s`` per optimizer step.

        Raises:
            ValueError: see :meth:`throughput`.
        """
        n, k, b, s = _checked_config(num_nodes, num_replicas, atomic_bsz, accum_steps)
        return self._evaluate(n, k, b, s)

    def _evaluate(self, n: np.ndarray, k: np.ndarray, b: np.ndarray,
                  s: np.ndarray) -> np.ndarray:
        # Unchecked: optimize() passes only configurations it has made valid.
        return self._throughput(n, k, b, s) * efficiency(self._noise_scale,
                                                         self._init_batch_size,
                                                         k * b * (s + 1.0))

    def throughput(self, num_nodes: ArrayLike, num_replicas: ArrayLike, atomic_bsz: ArrayLike,
                   accum_steps: ArrayLike) -> np.ndarray:
        """Predicted training throughput ``X = K * b * (s + 1) / T_iter`` in samples/s.

        Arguments broadcast against each other; see the module docstring for the model.

        Raises:
            ValueError: unless every entry is finite, ``num_nodes >= 0``,
                ``num_replicas >= 0``, ``atomic_bsz > 0`` and ``accum_steps >= 0`` (the
                message names the argument and the entry).
        """
        return self._throughput(*_checked_config(num_nodes, num_replicas, atomic_bsz,
                                                 accum_steps))

    def _throughput(self, n: np.ndarray, k: np.ndarray, b: np.ndarray,
                    s: np.ndarray) -> np.ndarray:
        p = self._perf_params
        t_c = p.alpha_c + p.beta_c * b
        t_o = _overlap(t_c, _sync_time(p, n, k), p.gamma)
        t_iter = s * t_c + t_o
        return k * b * (s + 1.0) / t_iter

    def efficiency(self, batch_size: ArrayLike) -> np.ndarray:
        """Statistical efficiency ``E(M) = (phi + M0) / (phi + max(M, M0))`` in ``(0, 1]``.

        Batches at or below ``M0`` get 1; the value is non-increasing in ``M``. If the
        gradient statistics are unusable (non-finite, ``sqr <= 0`` or ``var <= 0``) then
        ``phi = 0`` is used, i.e. ``E = M0 / M`` (pessimistic: no benefit from larger batches,
        never above 1, never NaN for finite batch sizes).

        Raises:
            ValueError: for a ``batch_size`` entry that is not a finite number ``>= 0``.
        """
        return efficiency(self._noise_scale, self._init_batch_size, batch_size)

    def optimize(self, num_nodes: ArrayLike, num_replicas: ArrayLike,
                 max_batch_size: Optional[int] = None,
                 atomic_bsz_range: Optional[Tuple[Optional[int], Optional[int]]] = None,
                 accumulation: bool = False) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Best ``(goodput, atomic_bsz, accum_steps)`` for each ``(num_nodes, num_replicas)``.

        Args:
            num_nodes, num_replicas: broadcastable arrays (or scalars) of placements.
            max_batch_size: the largest total batch allowed; ``None`` means no scaling:
                the total batch stays at ``M0`` (rounded up to a multiple of ``K``, or of
                ``K * (s + 1)`` if accumulation is needed to respect the atomic bound).
            atomic_bsz_range: ``(lo, hi)`` bounds on the per-replica micro-batch; either may
                be ``None`` (``lo`` defaults to 1, ``hi`` to ``max_batch_size`` or ``M0``).
            accumulation: whether gradient accumulation (``s > 0``) may be used; it is used
                only when ``b`` would exceed ``hi``. A single replica grows its batch by
                increasing ``b`` first (its gradient noise is measured from consecutive
                steps, so it needs no accumulation for that, unlike the original AdaptDL).

        Returns:
            Three arrays with the broadcast shape of the inputs (numpy scalars for scalar
            inputs): goodput (float, samples/s), atomic batch ``b`` (int) and extra
            accumulation steps ``s`` (int).

        The search evaluates a geometric grid of total batch sizes in
        ``[max(M0, lo * K), max_batch_size]``; for each, ``s`` is the fewest accumulation
        steps that keep ``b = ceil(M / (K * (s + 1)))`` within ``hi`` (0 without
        accumulation) and ``b`` is clamped to ``[lo, hi]``. The chosen total batch never exceeds
        ``max(max_batch_size, M0 rounded up to a multiple of K * (s + 1))``; without
        accumulation and with ``K * hi < M0`` it may fall below ``M0`` (then ``b = hi``).

        Infeasible entries get goodput 0, ``atomic_bsz = lo`` and ``accum_steps = 0``: these
        are placements with ``K < 1``, ``N < 1`` or ``N > K``, and shapes where even
        ``b = lo`` exceeds the batch limit (e.g. ``K * lo > max_batch_size``) or ``lo > hi``.

        Raises:
            ValueError: for a malformed ``max_batch_size`` (not an integer or below ``M0``) or
                ``atomic_bsz_range`` (bounds below 1, or not a pair).
        """
        m0 = self._init_batch_size
        if max_batch_size is None:
            limit = m0
        else:
            limit = validation.integer("max_batch_size", max_batch_size, 1, integral_floats=True)
            if limit < m0:
                raise ValueError(
                    f"max_batch_size ({limit}) must be >= init_batch_size ({m0})")
        if atomic_bsz_range is None:
            atomic_bsz_range = (None, None)
        try:
            lo_arg, hi_arg = atomic_bsz_range
        except (TypeError, ValueError):
            raise ValueError(
                f"atomic_bsz_range must be a pair (lo, hi), got {atomic_bsz_range!r}") from None
        lo = 1 if lo_arg is None else validation.integer("atomic_bsz_range[0]", lo_arg, 1,
                                                         integral_floats=True)
        hi = limit if hi_arg is None else validation.integer("atomic_bsz_range[1]", hi_arg, 1,
                                                             integral_floats=True)

        n_in = _as_float_array(num_nodes)
        k_in = _as_float_array(num_replicas)
        shape = np.broadcast_shapes(n_in.shape, k_in.shape)
        n = np.broadcast_to(n_in, shape).reshape(-1, 1)
        k = np.broadcast_to(k_in, shape).reshape(-1, 1)
        valid = np.isfinite(n) & np.isfinite(k) & (n >= 1) & (k >= 1) & (n <= k)
        n = np.where(valid, n, 1.0)
        k = np.where(valid, k, 1.0)

        # Candidate total batch sizes: geometric grid from the smallest allowed batch to the
        # limit (a single point when there is no room to scale).
        start = np.minimum(np.maximum(float(m0), lo * k), float(limit))
        frac = np.linspace(0.0, 1.0, _GRID_POINTS if limit > m0 else 1)
        batch = np.exp(np.log(start) + frac * (np.log(float(limit)) - np.log(start)))
        batch = np.maximum(np.round(batch, 6), start)  # guard the endpoints against rounding

        if accumulation:
            accum = np.maximum(np.ceil(batch / (k * hi) - 1e-9) - 1.0, 0.0)
        else:
            accum = np.zeros_like(batch)
        granule = k * (accum + 1.0)
        # Allowed total: max_batch_size, or M0 rounded up to the step granularity if larger.
        cap = np.maximum(float(limit), granule * np.ceil(m0 / granule - 1e-9))
        bsz = np.minimum(np.ceil(batch / granule - 1e-9), np.floor(cap / granule + 1e-9))
        bsz = np.minimum(bsz, float(hi))
        feasible = valid & (bsz >= lo)
        bsz = np.maximum(bsz, float(lo))

        goodput = self._evaluate(n, k, bsz, accum)
        goodput = np.where(feasible & np.isfinite(goodput), goodput, -np.inf)
        best = np.argmax(goodput, axis=1)
        rows = np.arange(goodput.shape[0])
        best_goodput = goodput[rows, best]
        ok = np.isfinite(best_goodput)
        out_goodput = np.where(ok, best_goodput, 0.0).reshape(shape)
        out_bsz = np.where(ok, bsz[rows, best], float(lo)).astype(np.int64).reshape(shape)
        out_accum = np.where(ok, accum[rows, best], 0.0).astype(np.int64).reshape(shape)
        return out_goodput[()], out_bsz[()], out_accum[()]


# ---------------------------------------------------------------------------------------
# Fitting the throughput model.

# Index of each parameter in the 7-vector.
_AC, _BC, _AN, _BN, _AR, _BR, _GAMMA = range(7)
_FLOOR = 1e-8          # lower bound on alphas/betas, in normalised units (see below)
# The two regularisers' weights are the Pollux artifact's. With them, the simulated Pollux
# path's mean JCT moved closer to the published runs at both loads while the fit's error on
# the traces stayed the same (benchmarks/sim_cluster.py, benchmarks/fit_accuracy.py).
_GAMMA_REG = 1e-3      # weight of (gamma - 1)^2
_RETRO_REG = 1e-2      # weight of (beta / alpha)^2 for the two sync terms
_INTER_PRIOR = 1.1     # unobserved inter-node costs = 1.1 x intra-node costs
_RMS_EPS = 1e-8        # smoothing of the RMS at zero error (log-error scale 1e-4)
_BETA_PRIOR = 0.1      # unobserved beta = 0.1 x its alpha (sync grows 10% per extra replica)


def _validated_profile(num_nodes, num_replicas, atomic_bsz, accum_step_time, optim_step_time):
    named = {
        "num_nodes": num_nodes,
        "num_replicas": num_replicas,
        "atomic_bsz": atomic_bsz,
        "accum_step_time": accum_step_time,
        "optim_step_time": optim_step_time,
    }
    arrays = {}
    for name, value in named.items():
        try:
            arr = np.asarray(value, dtype=np.float64).ravel()
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be an array of numbers") from None
        if arr.size == 0:
            raise ValueError(f"{name} must not be empty")
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{name} must be finite")
        arrays[name] = arr
    size = arrays["num_nodes"].size
    for name, arr in arrays.items():
        if arr.size != size:
            raise ValueError(f"{name} has {arr.size} entries, expected {size} (as num_nodes)")
    n, k = arrays["num_nodes"], arrays["num_replicas"]
    if np.any(n < 1) or np.any(n != np.round(n)):
        raise ValueError("num_nodes must be integers >= 1")
    if np.any(k != np.round(k)) or np.any(k < n):
        raise ValueError("num_replicas must be integers >= num_nodes")
    if np.any(arrays["atomic_bsz"] <= 0):
        raise ValueError("atomic_bsz must be > 0")
    for name in ("accum_step_time", "optim_step_time"):
        if np.any(arrays[name] <= 0):
            raise ValueError(f"{name} must be > 0")
    return [arrays[name] for name in named]


class _FitProblem:
    """Loss and analytic gradient of the throughput fit in normalised units.

    Times are divided by ``t_scale`` and batch sizes by ``b_scale`` so that every parameter
    is of order one whatever the model; the log-error loss is unchanged by this scaling.
    The predictions are linear in the six alphas/betas, so they are two small
    matrix-vector products (``comp`` for ``T_c``, ``sync`` for ``T_n``); this keeps a loss
    evaluation to a few dozen numpy calls, which is what a refit costs.
    """

    def __init__(self, n, k, b, t_c, t_o):
        self.log_tc = np.log(t_c)
        self.log_to = np.log(t_o)
        self.b = b
        self.extra = sync_growth(n, k)
        self.multi = k > 1
        self.inter = self.multi & (n > 1)
        self.intra = self.multi & (n == 1)
        self.count = self.log_tc.size
        # Columns: (alpha_c, beta_c) and (alpha_n, beta_n, alpha_r, beta_r), the order of
        # the parameter vector, so x[_AC:_AN] and x[_AN:_GAMMA] multiply them directly.
        self.comp = np.stack([np.ones_like(b), b], axis=1)
        inter, intra = self.inter.astype(np.float64), self.intra.astype(np.float64)
        self.sync = np.stack([inter, inter * self.extra, intra, intra * self.extra], axis=1)

    def predict(self, x):
        return self.comp @ x[_AC:_AN], self.sync @ x[_AN:_GAMMA]

    def loss_and_grad(self, x):
        t_c, t_n = self.predict(x)
        gamma = x[_GAMMA]
        # T_o = (T_c^g + T_n^g)^(1/g) through ratios to the larger term (no overflow); the
        # weights of T_c and T_n in it are w_c = (T_c/T_o)^g and w_n = (T_n/T_o)^g.
        top = np.maximum(t_c, t_n)
        pow_c = (t_c / top) ** gamma
        pow_n = (t_n / top) ** gamma
        total = pow_c + pow_n
        w_c = pow_c / total
        w_n = pow_n / total
        log_tc = np.log(t_c)
        log_to = np.log(top) + np.log(total) / gamma
        err_c = log_tc - self.log_tc
        err_o = log_to - self.log_to
        count = self.count
        # RMS smoothed by a tiny epsilon: without it the loss has a kink at zero error
        # (exact, noise-free data), where L-BFGS-B's line search fails.
        rms_c = math.sqrt(float(err_c @ err_c) / count + _RMS_EPS)
        rms_o = math.sqrt(float(err_o @ err_o) / count + _RMS_EPS)
        positive = t_n > 0
        safe_tn = np.where(positive, t_n, 1.0)
        # w_n is 0 where T_n is 0, so the log of the placeholder 1 adds nothing there.
        dlogto_dgamma = (w_c * log_tc + w_n * np.log(safe_tn) - log_to) / gamma

        # d loss / d log-prediction, per row.
        gc = err_c / (count * rms_c)
        go = err_o / (count * rms_o)
        d_tc = (gc + go * w_c) / t_c               # d loss / d T_c
        d_tn = go * w_n / safe_tn                  # d loss / d T_n (0 where T_n is 0)
        grad = np.empty(7)
        grad[_AC:_AN] = d_tc @ self.comp
        grad[_AN:_GAMMA] = d_tn @ self.sync
        grad[_GAMMA] = float(go @ dlogto_dgamma)

        loss = rms_c + rms_o + _GAMMA_REG * (gamma - 1.0) ** 2
        grad[_GAMMA] += 2.0 * _GAMMA_REG * (gamma - 1.0)
        for a, bt in ((_AN, _BN), (_AR, _BR)):
            ratio = x[bt] / x[a]
            loss += _RETRO_REG * ratio ** 2
            grad[bt] += 2.0 * _RETRO_REG * ratio / x[a]
            grad[a] -= 2.0 * _RETRO_REG * ratio * ratio / x[a]
        return loss, grad


def fit_perf_params(num_nodes: ArrayLike, num_replicas: ArrayLike, atomic_bsz: ArrayLike,
                    accum_step_time: ArrayLike, optim_step_time: ArrayLike,
                    initial: PerfParams | None = None) -> PerfParams:
    """Fit :class:`PerfParams` to profiled step times (one entry per configuration).

    Args:
        num_nodes: nodes used by each profiled configuration (integers >= 1).
        num_replicas: replicas (integers >= num_nodes).
        atomic_bsz: per-replica micro-batch size (> 0).
        accum_step_time: measured seconds of one compute-only micro-batch (``T_c``, > 0).
        optim_step_time: measured seconds of the micro-batch that ends an optimizer step,
            including the gradient synchronisation (``T_o``, > 0).
        initial: a previous fit of (nearly) the same profile to start from: one local
            search from it instead of several starts (a refit as step times accumulate
            then costs one search instead of several).

    Returns:
        The parameters minimising ``rms(log T_c error) + rms(log T_o error)`` plus small
        regularisers (``gamma`` pulled towards 1, ``(beta/alpha)^2`` of the two sync terms
        penalised against retrogression), by L-BFGS-B with analytic gradients and bounds
        ``alphas, betas >= ~0`` and ``gamma in [1, 10]``. Deterministic.

    Parameters the data cannot identify are frozen instead of fitted:

    * a single distinct ``atomic_bsz``: ``alpha_c = mean(T_c) / 2`` (``beta_c`` is fitted);
    * no replica ever shares a gradient sync (all ``K == 1``): ``gamma = 1`` (no overlap)
      and the intra-node sync is assumed to cost ``alpha_r = mean(T_c) / 2``;
    * multi-node data but no single-node multi-replica data: the intra-node sync is taken
      as free (``alpha_r = beta_r = ~0``). It never costs more than the inter-node one, and
      the Pollux and Sia artifacts' fits take every sync they have not measured as free:
      a job measured only across nodes then looks worth packing onto fewer nodes, where
      it measures what packing costs (``benchmarks/README.md``, ``sim_hetero.py``, measures
      this rule against taking the inter-node values);
    * no multi-node data: ``alpha_n, beta_n`` = 1.1 x the intra-node values. This is the
      design's "pessimistic" prior; note that on the Pollux traces (4 x T4 nodes) the fitted
      inter-node ``alpha_n`` is 4-5 x ``alpha_r``, so it is optimistic there;
    * otherwise a ``beta`` without ``K > 2`` data of its kind = 0.1 x its ``alpha`` (the
      Pollux traces fit ``beta_r / alpha_r`` = 0.06-0.3 and ``beta_n / alpha_n`` = 0.01-0.03).

    Raises:
        ValueError: if the arrays differ in length, are empty or non-finite, times or batch
            sizes are not positive, or ``num_replicas >= num_nodes >= 1`` (integers) fails.
            The message names the offending argument.
    """
    n, k, b, t_c, t_o = _validated_profile(
        num_nodes, num_replicas, atomic_bsz, accum_step_time, optim_step_time)

    t_scale = float(np.exp(np.mean(np.log(t_c))))
    b_scale = float(np.exp(np.mean(np.log(b))))
    tc_s, to_s, b_s = t_c / t_scale, t_o / t_scale, b / b_scale
    problem = _FitProblem(n, k, b_s, tc_s, to_s)

    multi_b = np.unique(b).size > 1
    has_intra = bool(np.any(problem.intra))
    has_inter = bool(np.any(problem.inter))
    has_intra_beta = bool(np.any(problem.intra & (k > 2)))
    has_inter_beta = bool(np.any(problem.inter & (k > 2)))

    # Initial guess: weighted linear fit of T_c; sync from the observed step-time excess.
    x0 = np.empty(7)
    if multi_b:
        slope, intercept = np.polyfit(b_s, tc_s, 1, w=1.0 / tc_s)
        x0[_BC] = max(slope, 0.1 * float(np.mean(tc_s / b_s)))
        x0[_AC] = max(intercept, 0.1 * float(np.mean(tc_s)))
    else:
        x0[_AC] = 0.5 * float(np.mean(tc_s))
        x0[_BC] = max(float(np.mean((tc_s - x0[_AC]) / b_s)), _FLOOR)
    excess = np.maximum(to_s - tc_s, 0.05 * tc_s)
    x0[_AR] = float(np.median(excess[problem.intra])) if has_intra else 0.5 * float(np.mean(tc_s))
    x0[_AN] = float(np.median(excess[problem.inter])) if has_inter else _INTER_PRIOR * x0[_AR]
    if not has_intra:
        x0[_AR] = x0[_AN]
    x0[_BR] = 0.01 * x0[_AR]
    x0[_BN] = 0.01 * x0[_AN]
    x0[:_GAMMA] = np.maximum(x0[:_GAMMA], 1e-6)
    x0[_GAMMA] = 1.0

    free = np.ones(7, dtype=bool)
    free[_AC] = multi_b
    free[_AR] = has_intra
    free[_BR] = has_intra_beta
    free[_AN] = has_inter
    free[_BN] = has_inter_beta
    free[_GAMMA] = has_intra or has_inter

    if free.sum() == 1 and free[_BC]:
        # One replica, one batch size (a fixed-batch single-replica job): every step is
        # predicted the same time, so the fit is one convex search, done without
        # scipy.optimize (whose import costs about half a CPU-second per process; see
        # benchmarks/many_trials.py for what a short trial costs).
        x0[_BC] = _one_step_time_fit(tc_s, to_s, x0[_AC], float(b_s[0]))
        return _with_priors(x0, tc_s, has_intra, has_intra_beta, has_inter, has_inter_beta,
                            t_scale, b_scale)

    bounds_all = [(_FLOOR, None)] * 6 + [(1.0, 10.0)]
    bounds = [bd for bd, f in zip(bounds_all, free) if f]

    def objective(z):
        x = x0.copy()
        x[free] = z
        loss, grad = problem.loss_and_grad(x)
        return loss, grad[free]

    best_x, best_loss = x0.copy(), objective(x0[free])[0]
    if initial is not None:
        previous = np.array([initial.alpha_c, initial.beta_c * b_scale, initial.alpha_n,
                             initial.beta_n, initial.alpha_r, initial.beta_r, 0.0]) / t_scale
        previous[_GAMMA] = initial.gamma
        lower = np.array([lo for lo, _ in bounds_all])
        upper = np.array([np.inf if hi is None else hi for _, hi in bounds_all])
        starts = [np.where(free & np.isfinite(previous), np.clip(previous, lower, upper), x0)]
    else:
        # A few deterministic starts for gamma (the loss is not convex in it).
        starts = []
        for gamma0 in ((1.0, 2.0, 5.0) if free[_GAMMA] else (1.0,)):
            starts.append(x0.copy())
            starts[-1][_GAMMA] = gamma0
    # Imported here, not at the top: a replica imports this module before its first step but
    # fits only after it has measured a few steps, and scipy.optimize is slow to import (it
    # would add to every restart: see benchmarks/resize_cost.py for what a restart costs).
    import scipy.optimize

    for start in starts:
        result = scipy.optimize.minimize(
            objective, start[free], jac=True, method="L-BFGS-B", bounds=bounds,
            options={"maxiter": 500})
        if np.all(np.isfinite(result.x)) and result.fun < best_loss:
            best_loss = float(result.fun)
            best_x = x0.copy()
            best_x[free] = result.x
    return _with_priors(best_x, tc_s, has_intra, has_intra_beta, has_inter, has_inter_beta,
                        t_scale, b_scale)


def _with_priors(x: np.ndarray, tc_s: np.ndarray, has_intra: bool, has_intra_beta: bool,
                 has_inter: bool, has_inter_beta: bool, t_scale: float,
                 b_scale: float) -> PerfParams:
    """The fitted normalised vector ``x`` with the priors for what the data cannot
    identify (see :func:`fit_perf_params`), in seconds and samples."""
    x = x.copy()
    if not has_intra:
        # Measured across nodes only: packing is free until measured. Not measured at all:
        # half a micro-batch (the decision core's exploring_params frees it for a policy).
        x[_AR] = _FLOOR if has_inter else 0.5 * float(np.mean(tc_s))
        x[_BR] = _FLOOR if has_inter else _BETA_PRIOR * x[_AR]
    elif not has_intra_beta:
        x[_BR] = x[_BN] if has_inter_beta else _BETA_PRIOR * x[_AR]
    if not has_inter:
        x[_AN] = _INTER_PRIOR * x[_AR]
        x[_BN] = _INTER_PRIOR * x[_BR]
    elif not has_inter_beta:
        x[_BN] = _BETA_PRIOR * x[_AN]

    return PerfParams(
        alpha_c=float(x[_AC] * t_scale),
        beta_c=float(x[_BC] * t_scale / b_scale),
        alpha_n=float(x[_AN] * t_scale),
        beta_n=float(x[_BN] * t_scale),
        alpha_r=float(x[_AR] * t_scale),
        beta_r=float(x[_BR] * t_scale),
        gamma=float(x[_GAMMA]),
    )


def _one_step_time_fit(tc_s: np.ndarray, to_s: np.ndarray, alpha_c: float,
                       b: float) -> float:
    """``beta_c`` (normalised) of a profile with one replica and one batch size ``b``.

    Every row is then predicted the same step time ``p = alpha_c + beta_c b`` (no sync:
    ``T_o = T_c``), and the loss ``rms(log p - log T_c) + rms(log p - log T_o)`` is a
    convex function of ``log p`` whose minimum lies within the measured logs: a golden-
    section search finds it to machine precision. ``beta_c`` is then bounded below by
    the floor, as the general fit bounds it."""
    log_c, log_o = np.log(tc_s), np.log(to_s)

    def loss(level: float) -> float:
        err_c, err_o = level - log_c, level - log_o
        return math.sqrt(float(err_c @ err_c) / err_c.size + _RMS_EPS) + \
            math.sqrt(float(err_o @ err_o) / err_o.size + _RMS_EPS)

    lo = float(min(log_c.min(), log_o.min()))
    hi = float(max(log_c.max(), log_o.max()))
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    a, c = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    fa, fc = loss(a), loss(c)
    for _ in range(200):
        if hi - lo <= 1e-13 * max(1.0, abs(hi)):
            break
        if fa <= fc:
            hi, c, fc = c, a, fa
            a = hi - ratio * (hi - lo)
            fa = loss(a)
        else:
            lo, a, fa = a, c, fc
            c = lo + ratio * (hi - lo)
            fc = loss(c)
    level = 0.5 * (lo + hi)
    return max((math.exp(level) - alpha_c) / b, _FLOOR)
