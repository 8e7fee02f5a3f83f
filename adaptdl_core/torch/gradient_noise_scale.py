"""Gradient noise scale and AdaScale gain: the statistical-efficiency half of goodput.

Notation (see ``docs/algorithms.md``, "Gradient noise"): ``G`` is the true (expected)
gradient, ``Sigma`` the covariance of a single-sample gradient, ``M0`` the user's initial
total batch size and ``M`` the total batch of one optimizer step (``r = M / M0``).

A gradient averaged over ``b`` samples has ``E|g|^2 = |G|^2 + tr(Sigma) / b``. Given ``n``
independent gradients ``g_1..g_n`` of ``b = M / n`` samples each (replicas and/or
accumulation micro-batches) and their average ``g``, with ``local = mean_i |g_i|^2`` and
``total = |g|^2``, the two-batch estimators

* ``sqr = (n * total - local) / (n - 1)``  (unbiased for ``|G|^2``)
* ``var = (local - total) * (M / M0) / (n - 1)``  (unbiased for ``tr(Sigma) / M0``)

are computed on measured steps and smoothed by :class:`GradientNoiseScale`. Nothing here needs a
process group: the caller (``AdaptiveDataParallel``, through ``_gradient_probe``) measures the
two squared norms and hands them over as floats.

Also here: the Adam preconditioning helpers (:func:`preconditioned_sqr_norm`,
:func:`adam_preconditioner`, :func:`is_adam_family`) so that for Adam-type optimizers the
noise can be measured in the space the optimizer actually steps in.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Dict, Mapping


from adaptdl_core import goodput, validation
# (The Adam helpers live next door; they are part of this module's API too.)
from adaptdl_core.torch.adam_noise import (adam_preconditioner, is_adam_family,
                                           preconditioned_sqr_norm)

if TYPE_CHECKING:  # imported lazily at run time (see grad_params)
    from adaptdl_core.goodput import GradParams

__all__ = [
    "GradientNoiseScale",
    "preconditioned_sqr_norm",
    "adam_preconditioner",
    "is_adam_family",
]

# Shortest EMA memory, in M0-steps (see ``memory_fraction``): below it a young estimate is
# a plain (bias-corrected) mean of all its measurements.
_MIN_MEMORY = 10.0
# Smallest value reported by ``var_avg`` (and absolute floor of ``sqr_avg``).
_TINY = 1e-30
# ``sqr_avg`` never drops below this fraction of ``var_avg``: caps the noise scale at
# 1e6 * M0 samples. Only matters for degenerate streams (every raw |G|^2 exactly 0).
_MIN_SQR_TO_VAR = 1e-6
_STATE_VERSION = 1


def _as_float(name: str, value: Any) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    return out


class GradientNoiseScale:
    """Running estimates of ``|G|^2`` and ``tr(Sigma) / M0`` and what follows from them.

    Feed it one measurement per optimizer step with :meth:`update`; read the smoothed
    estimates with :meth:`sqr_avg` / :meth:`var_avg`, the AdaScale gain with :meth:`gain`,
    the noise scale with :meth:`noise_scale` and the statistical efficiency with
    :meth:`efficiency`. :attr:`progress` counts training progress in "M0-equivalent
    steps" (advanced by :meth:`accumulate_progress`).

    **Smoothing.** Each raw estimate goes into an exponential moving average whose decay
    for a step of total batch ``M`` is ``smoothing ** (M / M0)``: the forgetting rate is
    constant per *sample*, so a step at 4x the batch counts as much as 4 steps at ``M0``.
    The averages are bias-corrected like Adam's moments (divided by the total weight given
    so far), so the estimate after the first update equals the first raw estimate.

    **Short memory while young.** Early in training ``|G|^2`` falls by orders of magnitude
    within a few hundred steps, and an EMA over the last ``1 / (1 - smoothing)`` steps would
    stay dominated by the first steps' huge gradients (the noise scale estimate then
    freezes while the true one rises). So the memory is also limited to
    ``memory_fraction`` times the estimator's age (training seen so far, in ``M0``-steps),
    but never below 10 ``M0``-steps: ``memory = clip(memory_fraction * age, 10,
    1 / (1 - smoothing))`` and the per-update decay is ``(1 - 1 / memory) ** (M / M0)``.
    A measurement taken at age ``a`` then weighs about ``(a / age) ** (1 / f - 1)``
    (``f = memory_fraction``): ``f = 1`` is the plain running mean (no forgetting), the
    default 0.35 weighs by ``(a / age) ** 1.9``, i.e. follows roughly the last third of
    the training so far, until ``f * age`` reaches ``1 / (1 - smoothing)`` ``M0``-steps
    (after ~2900 ``M0``-steps by default), from where it is the plain EMA. (The default
    was chosen on the noisy quadratic of ``tests/core/test_scaling_rules.py``,
    ``train_noisy_quadratic``, where other values can be compared.)

    **Sampled measurements.** When not every step is measured, pass the training done
    since the previous measurement as ``elapsed`` to :meth:`update`: the decay (and the
    measurement's weight) then follows training samples, not measurements.

    **Floor on |G|^2 (against "perfect scaling").** With little signal, the raw ``sqr``
    estimates scatter around a value near (or below) zero, and a smoothed value that is
    clipped at zero would make ``gain(r) == r``: every step would count as ``r`` steps.
    Instead :meth:`sqr_avg` is floored at ``sqr_floor_fraction`` (default 0.25) times a
    bias-corrected EMA of ``|raw sqr|``, the typical size of one step's raw estimate. When
    there is real signal this EMA is about ``|G|^2`` itself and the floor never binds; in
    pure noise it is the per-step noise of the estimator, so the reported ``|G|^2`` is never
    smaller than what a single step could resolve. Consequence: the noise scale is capped
    at about ``M * sqrt(d_eff) / (1.5 * sqr_floor_fraction)`` samples (``M`` the batch
    measured at, ``d_eff = tr(Sigma)^2 / tr(Sigma^2)`` the effective dimension of the
    gradient noise), ``2.7 * M * sqrt(d_eff)`` by default: the efficiency reported at the
    measured batch is at least ~0.7 of what a perfect estimator would give, extrapolation
    to much larger batches is pessimistic (never optimistic), and the cap rises as the
    batch grows and the measurement sharpens. Example: pure noise (``|G|^2 = 0``) measured
    at ``M0`` with ``d_eff = 4`` gives ``gain(32)`` about 5-6 instead of 32. A second floor
    keeps ``sqr_avg >= 1e-6 * var_avg``.

    Args:
        init_batch_size: ``M0``, the user's initial total batch size (integer ``>= 1``).
        smoothing: per-``M0``-samples EMA decay in ``(0, 1)``; 0.999 averages over roughly
            the last ``1000 * M0`` samples.
        sqr_floor_fraction: the fraction (``>= 0``, keyword only) described above; 0 turns
            the relative floor off.
        memory_fraction: the age limit of the memory described above (``>= 0``, keyword
            only); 0 turns it off (plain EMA from the start).

    Raises:
        ValueError: for an out-of-range argument.
    """

    def __init__(self, init_batch_size: int, smoothing: float = 0.999, *,
                 sqr_floor_fraction: float = 0.25, memory_fraction: float = 0.35) -> None:
        init_batch_size = validation.integer("init_batch_size", init_batch_size, low=1)
        smoothing = validation.number("smoothing", smoothing, 0.0, 1.0, low_open=True,
                                      high_open=True)
        sqr_floor_fraction = validation.number("sqr_floor_fraction", sqr_floor_fraction, 0.0)
        memory_fraction = validation.number("memory_fraction", memory_fraction, 0.0)
        self._init_batch_size = init_batch_size
        self._memory_fraction = memory_fraction
        self._smoothing = smoothing
        self._floor_fraction = sqr_floor_fraction
        #: Training progress in M0-equivalent optimizer steps (see :meth:`accumulate_progress`).
        self.progress: float = 0.0
        self._reset_estimates()

    def _reset_estimates(self) -> None:
        # Biased EMAs (Adam's m without the bias correction) and the total weight ``_weight``
        # they carry (the bias correction); ``_weight_sq`` = sum of squared weights / M,
        # for the effective sample size.
        self._sqr_ema = 0.0
        self._var_ema = 0.0
        self._abs_sqr_ema = 0.0
        self._weight = 0.0
        self._weight_sq = 0.0
        self._age = 0.0  # training seen by the estimator, in M0-steps
        self._num_updates = 0
        self._num_skipped = 0

    # ------------------------------------------------------------------ properties

    @property
    def init_batch_size(self) -> int:
        """``M0``, the initial total batch size (samples)."""
        return self._init_batch_size

    @property
    def smoothing(self) -> float:
        """The per-``M0``-samples EMA decay."""
        return self._smoothing

    @property
    def num_updates(self) -> int:
        """Number of measurements accepted by :meth:`update`."""
        return self._num_updates

    @property
    def num_skipped(self) -> int:
        """Number of measurements rejected by :meth:`update` as non-finite."""
        return self._num_skipped

    @property
    def has_estimate(self) -> bool:
        """Whether at least one measurement has been accepted."""
        return self._weight > 0.0

    # ------------------------------------------------------------------ updates

    def update(self, local_sqr: float, total_sqr: float, num_grads: int,
               batch_size: int, elapsed: float | None = None) -> None:
        """Add one optimizer step's measurement.

        Args:
            local_sqr: ``mean_i |g_i|^2`` over the ``num_grads`` independent gradients
                (each the mean gradient of ``batch_size / num_grads`` samples).
            total_sqr: ``|mean_i g_i|^2``, the squared norm of their average (the gradient
                actually applied).
            num_grads: ``n >= 2``, the number of independent gradients. With a single
                gradient per step the caller must pair it with another one (e.g. the
                previous step's, passing ``num_grads=2`` and ``batch_size`` = the two
                steps' total): ``n == 1`` carries no information about the noise. (Pairs
                of consecutive steps are slightly biased, the parameters differ; updating
                with overlapping pairs every step counts each sample twice in the decay,
                i.e. halves the averaging window.)
            batch_size: ``M``, the total number of samples behind the ``n`` gradients
                (``>= num_grads``).
            elapsed: training since the previous measurement, in samples (default
                ``batch_size``: every step is measured). Sets the EMA decay, so that the
                memory is the same in samples whether every step or every tenth is
                measured.

        A measurement with a non-finite norm (AMP overflow, NaN) is skipped and counted in
        :attr:`num_skipped`; the estimates are left untouched.

        Raises:
            ValueError: if ``num_grads < 2``, ``batch_size < num_grads``, a norm is
                negative, or an argument is not a number.
        """
        try:
            n = int(num_grads)
            integral = not isinstance(num_grads, bool) and n == num_grads
        except (TypeError, ValueError, OverflowError):
            integral = False
        if not integral:
            raise ValueError(f"num_grads must be an integer, got {num_grads!r}")
        if n < 2:
            raise ValueError(
                f"num_grads must be >= 2 (got {num_grads!r}): one gradient cannot separate "
                "signal from noise; pair it with another independent gradient (e.g. the "
                "previous step's) and pass num_grads=2")
        m = _as_float("batch_size", batch_size)
        if not (math.isfinite(m) and m >= n):
            raise ValueError(f"batch_size must be >= num_grads ({n}), got {batch_size!r}")
        local = _as_float("local_sqr", local_sqr)
        total = _as_float("total_sqr", total_sqr)
        if not (math.isfinite(local) and math.isfinite(total)):
            self._num_skipped += 1
            return
        if local < 0.0 or total < 0.0:
            raise ValueError(f"squared norms must be >= 0, got local_sqr={local_sqr!r}, "
                             f"total_sqr={total_sqr!r}")
        step = m if elapsed is None else validation.number(
            "elapsed", elapsed, 0.0, low_open=True, what="a number of samples")
        scale = m / self._init_batch_size
        sqr = (n * total - local) / (n - 1)
        var = (local - total) * scale / (n - 1)
        if not (math.isfinite(sqr) and math.isfinite(var)):  # overflow of huge inputs
            self._num_skipped += 1
            return
        steps = step / self._init_batch_size
        self._age += steps
        longest = 1.0 / (1.0 - self._smoothing)
        memory = longest if self._memory_fraction == 0.0 else \
            min(longest, max(_MIN_MEMORY, self._memory_fraction * self._age))
        decay = self._smoothing ** steps if memory >= longest else (1.0 - 1.0 / memory) ** steps
        keep = 1.0 - decay
        self._sqr_ema = decay * self._sqr_ema + keep * sqr
        self._var_ema = decay * self._var_ema + keep * var
        self._abs_sqr_ema = decay * self._abs_sqr_ema + keep * abs(sqr)
        self._weight = decay * self._weight + keep
        self._weight_sq = decay * decay * self._weight_sq + keep * keep / m
        self._num_updates += 1

    # ------------------------------------------------------------------ estimates

    def sqr_avg(self) -> float:
        """Smoothed estimate of ``|G|^2`` (squared gradient units), always ``> 0``.

        It is the bias-corrected EMA of the raw estimates, floored at
        ``sqr_floor_fraction`` times the EMA of their absolute values and at
        ``1e-6 * var_avg()`` (see the class docstring). Returns 0.0 before any measurement.
        """
        if not self.has_estimate:
            return 0.0
        raw = self._sqr_ema / self._weight
        floor = self._floor_fraction * self._abs_sqr_ema / self._weight
        return max(raw, floor, _MIN_SQR_TO_VAR * self.var_avg(), _TINY)

    def raw_sqr_avg(self) -> float:
        """The bias-corrected EMA of the raw ``|G|^2`` estimates, without any floor (may be
        ``<= 0``); 0.0 before any measurement. For diagnostics only."""
        return self._sqr_ema / self._weight if self.has_estimate else 0.0

    def var_avg(self) -> float:
        """Smoothed estimate of ``tr(Sigma) / M0``: the variance (summed over coordinates) of
        a gradient averaged over ``M0`` samples. Floored at ``1e-30``; 0.0 before any
        measurement."""
        if not self.has_estimate:
            return 0.0
        return max(self._var_ema / self._weight, _TINY)

    def gain(self, scale: float) -> float:
        """AdaScale gain ``(var + sqr) / (var / scale + sqr)`` for batch scale ``scale =
        M / M0``: how many ``M0``-batch steps one step at batch ``M`` is worth.

        For ``scale >= 1`` the result lies in ``[1, scale]`` (for ``0 < scale < 1`` in
        ``[scale, 1]``). Before any measurement, or when no gradient noise has been measured
        (``var_avg()`` at its floor), returns 1.0: no evidence that a larger batch helps.

        Raises:
            ValueError: if ``scale`` is not a finite number ``> 0``.
        """
        # (Every optimizer step comes here with a plain float: that is checked inline;
        # anything else gets the full check, and its message.)
        r = scale if type(scale) is float and 0.0 < scale < math.inf \
            else validation.number("scale", scale, 0.0, low_open=True)
        # (r == 1: the initial batch, the bounds below meet; every step of a fixed batch.)
        if r == 1.0 or not self.has_estimate or self._var_ema / self._weight <= _TINY:
            return 1.0
        var = self.var_avg()
        sqr = self.sqr_avg()
        g = (var + sqr) / (var / r + sqr)
        lo, hi = min(1.0, r), max(1.0, r)
        return min(max(g, lo), hi)

    def noise_scale(self) -> float:
        """The gradient noise scale ``phi = M0 * var / sqr`` in samples (McCandlish's
        ``B_simple``): batches much smaller than ``phi`` scale almost perfectly, batches much
        larger are wasteful. 0.0 before any measurement."""
        if not self.has_estimate:
            return 0.0
        return self._init_batch_size * self.var_avg() / self.sqr_avg()

    def efficiency(self, batch_size: float) -> float:
        """Statistical efficiency ``E(M) = gain(M / M0) / (M / M0)`` in ``(0, 1]``: the value
        of one sample at total batch ``M`` in units of a sample at ``M0``. Batches at or
        below ``M0`` get 1 (as in :meth:`adaptdl_core.goodput.GoodputFunction.efficiency`).

        Raises:
            ValueError: if ``batch_size`` is not a finite number ``> 0``.
        """
        m = validation.number("batch_size", batch_size, 0.0, low_open=True)
        return float(goodput.efficiency(self.noise_scale(), self._init_batch_size, m))

    def confidence(self) -> float:
        """Effective number of samples behind the current estimates (0.0 before any).

        This is Kish's effective sample size of the EMA, with each step's measurement
        treated as carrying information in proportion to its batch ``M``:
        ``(sum_k w_k)^2 / sum_k (w_k^2 / M_k)`` with ``w_k`` the EMA weights. After the first
        update it equals that step's ``M``; at a steady batch it tends to
        ``M * (1 + d) / (1 - d)`` with ``d = smoothing ** (M / M0)``, about
        ``2 / (1 - smoothing) * M0`` (2000 ``M0`` for the default) whatever ``M``. It is a
        heuristic amount of evidence (the estimators' variance also depends on the number
        of gradients ``n``), useful to hold off decisions until it reaches a few ``M0``.
        """
        if self._weight_sq <= 0.0:
            return 0.0
        return self._weight * self._weight / self._weight_sq

    def grad_params(self) -> "GradParams":
        """The estimates as ``adaptdl_core.goodput.GradParams(sqr=sqr_avg(),
        var=var_avg())`` (``(0.0, 0.0)`` before any measurement, which the goodput model
        treats as "no benefit from larger batches")."""
        from adaptdl_core.goodput import GradParams  # lazy: keep this module light

        return GradParams(self.sqr_avg(), self.var_avg())

    # ------------------------------------------------------------------ progress

    def accumulate_progress(self, scale: float) -> float:
        """Advance :attr:`progress` by ``gain(scale)`` and return the increment.

        Call it once per optimizer step with that step's ``scale = M / M0``. (An epoch of
        adaptive training ends when ``progress`` reaches ``len(dataset) / M0`` times the
        number of epochs.)

        Raises:
            ValueError: as :meth:`gain`.
        """
        g = self.gain(scale)
        self.progress += g
        return g

    # ------------------------------------------------------------------ state

    def state_dict(self) -> Dict[str, Any]:
        """The full state as a dict of plain Python ``int``/``float`` (JSON- and
        ``torch.load(weights_only=True)``-safe)."""
        return {
            "version": _STATE_VERSION,
            "init_batch_size": int(self._init_batch_size),
            "progress": float(self.progress),
            "sqr_ema": float(self._sqr_ema),
            "var_ema": float(self._var_ema),
            "abs_sqr_ema": float(self._abs_sqr_ema),
            "weight": float(self._weight),
            "weight_sq": float(self._weight_sq),
            "age": float(self._age),
            "num_updates": int(self._num_updates),
            "num_skipped": int(self._num_skipped),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a state from :meth:`state_dict`.

        ``smoothing`` and ``sqr_floor_fraction`` stay those of this object. If the state was
        saved with a different ``init_batch_size``, the quantities measured in ``M0`` units
        (the variance and ``progress``) are converted to this object's ``M0``.

        Raises:
            ValueError: if the state is malformed (missing keys, non-finite values, unknown
                version); the object is then left unchanged.
        """
        try:
            version = int(state["version"])
            if version != _STATE_VERSION:
                raise ValueError(f"unknown GradientNoiseScale state version {version}")
            old_m0 = int(state["init_batch_size"])
            values = {key: float(state[key]) for key in
                      ("progress", "sqr_ema", "var_ema", "abs_sqr_ema", "weight",
                       "weight_sq")}
            counts = {key: int(state[key]) for key in ("num_updates", "num_skipped")}
            # States saved before the age existed: treat them as mature (the plain EMA).
            age = float(state.get("age", 2.0 / (1.0 - self._smoothing)))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed GradientNoiseScale state: {exc!r}") from None
        if old_m0 < 1 or not all(math.isfinite(v) for v in values.values()) \
                or values["weight"] < 0 or values["weight_sq"] < 0 \
                or not (math.isfinite(age) and age >= 0):
            raise ValueError("malformed GradientNoiseScale state: bad values")
        ratio = old_m0 / self._init_batch_size  # var and progress are per-M0 quantities
        self.progress = values["progress"] * ratio
        self._sqr_ema = values["sqr_ema"]
        self._var_ema = values["var_ema"] * ratio
        self._abs_sqr_ema = values["abs_sqr_ema"]
        self._weight = values["weight"]
        self._weight_sq = values["weight_sq"]
        self._age = age * ratio  # M0-steps
        self._num_updates = counts["num_updates"]
        self._num_skipped = counts["num_skipped"]

    def __repr__(self) -> str:
        return (f"GradientNoiseScale(init_batch_size={self._init_batch_size}, "
                f"sqr={self.sqr_avg():.4g}, var={self.var_avg():.4g}, "
                f"progress={self.progress:.4g}, updates={self._num_updates})")
