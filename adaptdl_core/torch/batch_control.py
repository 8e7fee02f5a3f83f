"""The loader's batch size rules, as a plain object: which batch size, within which limits.

:class:`BatchSizeController` chooses the (local batch, accumulation steps) of an
autoscaled loader from a goodput model: the best configuration on the preferred grid of
local sizes (:func:`preferred_local_sizes`), switched to only for a clear gain, and
re-decided only when what it depends on moved (the cadence). It is the one place that
holds the loader's batch size limits.

It is pure: no torch, no collectives, no clock; the data loader feeds it numbers and
applies its answers (replica 0 decides, the choice is agreed at a batch boundary). Which
steps measure the gradient noise is the samplers' schedule
(:class:`~adaptdl_core.torch.sampler.NoiseSampling`).
"""

from __future__ import annotations

import bisect
import math
from typing import Any

import numpy as np

__all__ = ["preferred_local_sizes", "BatchSizeController", "SWITCH_THRESHOLD",
           "DECIDE_EVERY_STEPS", "DECIDE_AT_LEAST_EVERY_STEPS", "DECIDE_NOISE_CHANGE"]

# Switch batch size only when the predicted goodput improves by more than this factor.
SWITCH_THRESHOLD = 1.05
# Re-decide the batch size every this many optimizer steps (same count on all replicas),
# when the noise estimate or the throughput model moved since the last decision.
DECIDE_EVERY_STEPS = 5
# ...and at least this often, whatever moved.
DECIDE_AT_LEAST_EVERY_STEPS = 50
# Relative change of the noise scale that counts as "moved".
DECIDE_NOISE_CHANGE = 0.1


def preferred_local_sizes(lo: int, hi: int, keep: tuple[int, ...] = ()) -> list[int]:
    """The local batch sizes an autoscaled loader chooses among, ascending: powers of two
    and 1.5 x powers of two (1, 2, 3, 4, 6, 8, 12, 16, 24, ...) within ``[lo, hi]``, plus
    ``lo``, ``hi`` and the sizes in ``keep`` that lie within (the initial batch).

    Why a grid: every new input shape costs a one-off set-up -- oneDNN primitives on CPU
    (``benchmarks/new_shape_cost.py`` measures it), cuDNN autotuning under
    ``cudnn.benchmark``, a recompile under ``torch.compile`` -- while goodput is flat near
    its optimum, so two sizes per octave lose little (``tests/core/test_batch_size_grid.py``
    checks at least 98% of the predicted optimum over random one-replica models). Halving
    a grid size gives a grid size again, so the halves of sampled steps add few shapes.

    Raises:
        ValueError: if ``lo < 1`` or ``hi < lo``.
    """
    if lo < 1 or hi < lo:
        raise ValueError(f"preferred_local_sizes(lo={lo}, hi={hi}): need 1 <= lo <= hi")
    sizes = {lo, hi}
    sizes.update(v for v in keep if lo <= v <= hi)
    for k in range(hi.bit_length()):
        sizes.update(v for v in (1 << k, (3 << k) >> 1) if lo <= v <= hi)
    return sorted(sizes)


class BatchSizeController:
    """Chooses ``(local batch, accumulation steps)`` for one loader on one job shape.

    Arguments:
        init_batch_size: the loader's target (initial) global batch ``M0``.
        nodes, replicas: the job's shape.
        max_batch_size: the largest global batch (``None``: the batch size is fixed).
        local_bsz_bounds: ``(min, max)`` micro-batch bounds, either ``None``; or ``None``.
        gradient_accumulation: whether several micro-batches per step are allowed.
    """

    def __init__(self, init_batch_size: int, nodes: int, replicas: int,
                 max_batch_size: int | None = None,
                 local_bsz_bounds: tuple[int | None, int | None] | None = None,
                 gradient_accumulation: bool = False):
        self.init_batch_size = init_batch_size
        self.nodes, self.replicas = nodes, replicas
        self.max_batch_size = max_batch_size
        self.local_bsz_bounds = local_bsz_bounds
        self.gradient_accumulation = gradient_accumulation
        # What the last decision was based on (noise-to-signal ratio, throughput fits),
        # and the steps since it: the cadence.
        self._decided_on: tuple[float, int] | None = None
        self._steps_since_decision = 0

    def autoscale(self, max_batch_size: int,
                  local_bsz_bounds: tuple[int | None, int | None] | None,
                  gradient_accumulation: bool) -> None:
        """Make the batch size adaptive within these limits (the loader's
        ``autoscale_batch_size``, which checked them); the decision cadence restarts."""
        self.max_batch_size = max_batch_size
        self.local_bsz_bounds = local_bsz_bounds
        self.gradient_accumulation = gradient_accumulation
        self._decided_on = None
        self._steps_since_decision = 0

    @property
    def adaptive(self) -> bool:
        """True when the batch size is chosen by goodput (a ``max_batch_size`` is set)."""
        return self.max_batch_size is not None

    def initial_local_bsz(self, micros: int = 1) -> int:
        """The local batch that makes the initial batch size with ``micros`` micro-batches
        per step on this job's replicas (rounded up; before the bounds)."""
        return math.ceil(self.init_batch_size / (self.replicas * micros))

    def bounded(self, local_bsz: int) -> int:
        """``local_bsz`` clipped to the micro-batch bounds (at least 1)."""
        lo, hi = self.local_bsz_bounds or (None, None)
        return max(local_bsz if hi is None else min(local_bsz, hi), lo or 1)

    def initial_choice(self) -> tuple[int, int]:
        """The configuration of the initial batch size: ``(local batch, accumulation
        steps)`` within the micro-batch bounds: ``(local batch, 0)``, or, when the upper
        bound is below the local batch and accumulation is allowed, the fewest
        micro-batches within the bound that make at least the initial batch."""
        local = self.initial_local_bsz()
        hi = (self.local_bsz_bounds or (None, None))[1]
        if hi is not None and local > hi and self.gradient_accumulation:
            micros = math.ceil(local / hi)
            return self.bounded(math.ceil(local / micros)), micros - 1
        return self.bounded(local), 0

    def fits(self, local_bsz: int | None, accum_steps: int) -> bool:
        """Whether ``(local_bsz, accum_steps)`` is a configuration this controller may
        use: a local batch within the bounds, accumulation only where it is allowed."""
        if local_bsz is None:
            return False
        lo, hi = self.local_bsz_bounds or (None, None)
        return (lo is None or local_bsz >= lo) and (hi is None or local_bsz <= hi) \
            and (accum_steps == 0 or self.gradient_accumulation)

    def decision_due(self, noise_ratio: float, fits: int) -> bool:
        """Called every ``DECIDE_EVERY_STEPS`` steps: whether a goodput decision could
        change anything, i.e. the noise-to-signal ratio ``var / sqr`` moved by more than
        ``DECIDE_NOISE_CHANGE`` or the throughput model was refitted (``fits`` grew) since
        the last decision, or ``DECIDE_AT_LEAST_EVERY_STEPS`` passed."""
        self._steps_since_decision += DECIDE_EVERY_STEPS
        basis = (noise_ratio, fits)
        last = self._decided_on
        if last is not None and self._steps_since_decision < DECIDE_AT_LEAST_EVERY_STEPS \
                and basis[1] == last[1] \
                and abs(noise_ratio - last[0]) <= DECIDE_NOISE_CHANGE * max(abs(last[0]), 1e-300):
            return False
        self._decided_on = basis
        self._steps_since_decision = 0
        return True

    def choose(self, goodput_fn: Any, current: tuple[int, int], initial: bool) -> tuple[int, int]:
        """The configuration to use next, given the goodput model ``goodput_fn`` (a
        :class:`~adaptdl_core.goodput.GoodputFunction`, or ``None``: keep ``current``).

        The best configuration on the grid replaces ``current`` only if it predicts more
        than ``SWITCH_THRESHOLD`` times the goodput (so the batch size does not
        oscillate), or outright at an ``initial`` decision when ``current`` predicts none
        (a new job shape).

        Raises:
            ValueError: if the batch size is not adaptive (no ``max_batch_size``).
        """
        if self.max_batch_size is None:
            raise ValueError("BatchSizeController.choose: no max_batch_size, the batch size "
                             "is fixed (use initial_choice())")
        if goodput_fn is None:
            return current
        best, bsz, accum = goodput_fn.optimize(self.nodes, self.replicas, self.max_batch_size,
                                               self.local_bsz_bounds or (None, None),
                                               self.gradient_accumulation)
        best, bsz = self.on_grid(goodput_fn, float(best), int(bsz), int(accum))
        now = float(goodput_fn(self.nodes, self.replicas, current[0], current[1]))
        if float(best) > SWITCH_THRESHOLD * now or (initial and now <= 0):
            return int(bsz), int(accum)
        return current

    def on_grid(self, goodput_fn: Any, best: float, bsz: int, accum: int) -> tuple[float, int]:
        """The better of the two :func:`preferred_local_sizes` around the optimal local
        batch ``bsz`` (same accumulation steps), and its goodput. A ``bsz`` outside the
        bounds (forced: the initial batch over more replicas than the bounds allow) stays."""
        lo, hi = self.local_bsz_bounds or (None, None)
        lo = lo or 1
        # (the total batch K * b * (s + 1) stays within max_batch_size)
        hi = min(hi or self.max_batch_size,
                 self.max_batch_size // (self.replicas * (accum + 1)))
        if not lo <= bsz <= hi:
            return best, bsz
        sizes = preferred_local_sizes(lo, hi, (self.initial_local_bsz(accum + 1),))
        i = bisect.bisect_left(sizes, bsz)
        near = [bsz] if sizes[i] == bsz else sizes[i - 1:i + 1]
        values = goodput_fn(self.nodes, self.replicas, np.array(near), accum)
        j = int(np.argmax(values))
        return float(values[j]), int(near[j])
