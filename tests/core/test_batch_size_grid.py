"""The autoscaler's local batch sizes come from a grid of two sizes per octave (few
distinct input shapes) and lose little goodput to it (in-process, no process group)."""

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

import adaptdl_core.torch as adl
from adaptdl_core import context
from adaptdl_core.goodput import GradParams, PerfParams
from adaptdl_core.torch import _metrics, data


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


@pytest.fixture
def autoscaled_loader():
    context.reset()
    try:
        loader = adl.AdaptiveDataLoader(TensorDataset(torch.zeros(64, 1)), batch_size=16)
        loader.autoscale_batch_size(1000, local_bsz_bounds=(None, 600))
        yield loader
    finally:
        context.reset()


def test_loader_picks_the_better_grid_neighbour_of_the_optimum(autoscaled_loader):
    grid = data.preferred_local_sizes(1, 600, keep=(16,))
    rng = np.random.default_rng(0)
    m = _metrics.metrics()
    worst = 1.0
    for _ in range(200):
        # Step time alpha + beta * b and noise scales from 1x to 100x the initial batch.
        m.perf_params = PerfParams(rng.uniform(1e-3, 1e-1), rng.uniform(1e-5, 1e-3),
                                   0.0, 0.0, 0.0, 0.0, 1.0)
        m.grad_params = GradParams(sqr=1.0, var=float(10 ** rng.uniform(0, 2)))
        fn = _metrics.goodput_fn()
        best, bsz, _ = fn.optimize(1, 1, 1000, (None, 600))
        value, chosen = autoscaled_loader._on_grid(fn, float(best), int(bsz), 0)
        assert chosen in grid
        assert value == pytest.approx(float(fn(1, 1, chosen, 0)))
        # It is the better of the two grid sizes around the optimum.
        below = max(s for s in grid if s <= bsz)
        above = min(s for s in grid if s >= bsz)
        assert value >= max(float(fn(1, 1, below, 0)), float(fn(1, 1, above, 0))) - 1e-9
        worst = min(worst, value / float(best))
    # Goodput is flat near its optimum: the grid costs ~1% at worst.
    assert 0.98 <= worst <= 1.0


def test_goodput_decisions_land_on_the_grid(autoscaled_loader):
    m = _metrics.metrics()
    m.perf_params = PerfParams(0.02, 1e-4, 0.0, 0.0, 0.0, 0.0, 1.0)
    m.grad_params = GradParams(sqr=1.0, var=20.0)  # noise scale 320 samples
    fn = _metrics.goodput_fn()
    _, continuous, _ = fn.optimize(1, 1, 1000, (None, 600))
    grid = data.preferred_local_sizes(1, 600, keep=(16,))
    assert continuous not in grid  # (249)
    chosen, accum = autoscaled_loader._goodput_choice((16, 0), initial=False)
    assert accum == 0 and chosen in grid
    assert max(s for s in grid if s < continuous) <= chosen <= min(s for s in grid
                                                                    if s > continuous)
