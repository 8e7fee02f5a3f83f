"""The autoscaler's local batch sizes come from a grid of two sizes per octave (few
distinct input shapes) and lose little goodput to it (in-process, no process group)."""

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

import adaptdl_core.torch as adl
from adaptdl_core import context
from adaptdl_core.goodput import GoodputFunction, GradParams, PerfParams
from adaptdl_core.torch import data
from adaptdl_core.torch.batch_control import (DECIDE_AT_LEAST_EVERY_STEPS, DECIDE_EVERY_STEPS,
                                              BatchSizeController)


def test_grid_is_powers_of_two_and_one_and_a_half_times_them():
    assert data.preferred_local_sizes(1, 100) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64,
                                                  96, 100]
    # The bounds and the sizes to keep (the initial batch) are always choosable.
    assert data.preferred_local_sizes(10, 70, keep=(50, 5, 80)) == [10, 12, 16, 24, 32, 48,
                                                                     50, 64, 70]
    assert data.preferred_local_sizes(7, 7) == [7]


def test_grid_halves_are_grid_sizes_and_neighbours_are_close():
    sizes = data.preferred_local_sizes(1, 4096)
    assert all(s // 2 in sizes for s in sizes if s >= 2)
    assert max(b / a for a, b in zip(sizes, sizes[1:]) if a >= 2) <= 1.5


@pytest.mark.parametrize("lo, hi", [(0, 4), (5, 4)])
def test_grid_rejects_bad_bounds(lo, hi):
    with pytest.raises(ValueError, match="1 <= lo <= hi"):
        data.preferred_local_sizes(lo, hi)


def controller() -> BatchSizeController:
    """One replica, initial batch 16, at most 1000, micro-batches of at most 600."""
    return BatchSizeController(16, 1, 1, max_batch_size=1000, local_bsz_bounds=(None, 600))


def test_controller_picks_the_better_grid_neighbour_of_the_optimum():
    grid = data.preferred_local_sizes(1, 600, keep=(16,))
    rng = np.random.default_rng(0)
    control = controller()
    worst = 1.0
    for _ in range(200):
        # Step time alpha + beta * b and noise scales from 1x to 100x the initial batch.
        fn = GoodputFunction(PerfParams(rng.uniform(1e-3, 1e-1), rng.uniform(1e-5, 1e-3),
                                        0.0, 0.0, 0.0, 0.0, 1.0),
                             GradParams(sqr=1.0, var=float(10 ** rng.uniform(0, 2))), 16)
        best, bsz, _ = fn.optimize(1, 1, 1000, (None, 600))
        value, chosen = control.on_grid(fn, float(best), int(bsz), 0)
        assert chosen in grid
        assert value == pytest.approx(float(fn(1, 1, chosen, 0)))
        # It is the better of the two grid sizes around the optimum.
        below = max(s for s in grid if s <= bsz)
        above = min(s for s in grid if s >= bsz)
        assert value >= max(float(fn(1, 1, below, 0)), float(fn(1, 1, above, 0))) - 1e-9
        worst = min(worst, value / float(best))
    # Goodput is flat near its optimum: the grid costs ~1% at worst.
    assert 0.98 <= worst <= 1.0


def noisy_fn() -> GoodputFunction:
    # (noise scale 320 samples)
    return GoodputFunction(PerfParams(0.02, 1e-4, 0.0, 0.0, 0.0, 0.0, 1.0),
                           GradParams(sqr=1.0, var=20.0), 16)


def test_goodput_decisions_land_on_the_grid():
    fn = noisy_fn()
    _, continuous, _ = fn.optimize(1, 1, 1000, (None, 600))
    grid = data.preferred_local_sizes(1, 600, keep=(16,))
    assert continuous not in grid  # (249)
    chosen, accum = controller().choose(fn, (16, 0), initial=False)
    assert accum == 0 and chosen in grid
    assert max(s for s in grid if s < continuous) <= chosen <= min(s for s in grid
                                                                    if s > continuous)


def test_controller_switches_only_for_a_clear_gain():
    fn = noisy_fn()
    best = controller().choose(fn, (16, 0), initial=False)
    # Near the best, within the switch threshold: stay.
    assert controller().choose(fn, best, initial=False) == best
    # No model yet: keep what there is.
    assert controller().choose(None, (16, 0), initial=False) == (16, 0)
    with pytest.raises(ValueError, match="max_batch_size"):
        BatchSizeController(16, 1, 1).choose(fn, (16, 0), initial=False)


def test_decision_cadence_waits_for_the_model_or_the_noise_to_move():
    control = controller()
    assert control.decision_due(0.5, fits=1)          # the first decision
    assert not control.decision_due(0.52, fits=1)     # moved by less than 10%
    assert control.decision_due(0.6, fits=1)          # moved by more
    assert control.decision_due(0.6, fits=2)          # a new throughput fit
    due = [control.decision_due(0.6, fits=2) for _ in range(DECIDE_AT_LEAST_EVERY_STEPS
                                                            // DECIDE_EVERY_STEPS)]
    assert due == [False] * (len(due) - 1) + [True]   # at least every 50 steps


@pytest.fixture
def autoscaled_loader():
    context.reset()
    try:
        loader = adl.AdaptiveDataLoader(TensorDataset(torch.zeros(64, 1)), batch_size=16)
        loader.autoscale_batch_size(1000, local_bsz_bounds=(None, 600))
        yield loader
    finally:
        context.reset()


def test_autoscaled_loader_starts_at_the_initial_batch(autoscaled_loader):
    assert (autoscaled_loader.current_local_bsz, autoscaled_loader.accumulation_steps) == (16, 0)
    assert autoscaled_loader.step_plan.micros == 1
