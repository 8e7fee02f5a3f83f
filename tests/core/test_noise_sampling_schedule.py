"""Which steps a single replica samples for its gradient-noise estimate, and how the
cost of those steps spaces them out (in-process, no process group)."""

import pytest
import torch
from torch.utils.data import TensorDataset

import adaptdl_core.torch as adl
from adaptdl_core import context
from adaptdl_core.torch import data


def sampled_steps(cost_floor, steps=300, bsz=4):
    """Steps whose batch the sampler hands out as two halves."""
    sampler = adl.ElasticSampler(list(range(steps * bsz)), shuffle=False)
    batches = data._LocalBatchSampler(sampler, bsz, drop_last=False)
    batches.measure_from = 0
    batches.cost_floor = cost_floor
    found, step, second_half = [], 0, False
    for batch in batches:
        opens, size = batches.kinds.popleft()
        assert size == len(batch)
        if second_half:
            second_half = False
            continue
        if opens:
            found.append(step)
            second_half = True
        step += 1
    return found


def gaps(steps):
    """Steps between consecutive sampled steps."""
    return [b - a for a, b in zip(steps, steps[1:])]


def test_sampling_is_dense_first_then_sparser_up_to_the_maximum():
    steps = sampled_steps(cost_floor=2)
    assert steps[:5] == [0, 2, 4, 6, 9]
    assert gaps(steps) == sorted(gaps(steps))
    assert max(gaps(steps)) == data.NOISE_MAX_INTERVAL


def test_costly_sampled_steps_are_spaced_after_a_quick_first_estimate():
    steps = sampled_steps(cost_floor=9)
    quick = data.NOISE_QUICK_SAMPLES
    assert steps[:quick] == sampled_steps(cost_floor=2)[:quick]
    assert all(g >= 9 for g in gaps(steps)[quick - 1:])
    assert len(steps) < len(sampled_steps(cost_floor=2))


@pytest.mark.parametrize("extra, floor", [(0.0, 2), (0.05, 2), (0.2, 4), (0.45, 9), (3.0, 60)])
def test_cost_floor_keeps_sampled_steps_within_the_time_share(extra, floor):
    assert data._cost_floor(extra) == floor
    # One sampled step in `floor` costs at most the share of the training time.
    assert extra / floor <= data.NOISE_COST_SHARE + 1e-12


def test_loader_sets_the_interval_from_measured_step_times():
    context.reset()
    try:
        loader = adl.AdaptiveDataLoader(TensorDataset(torch.zeros(64, 1)), batch_size=8)
        for _ in range(5):
            loader._note_step_cost(0.010, 8, sampled=False)  # 1.25 ms per sample
        assert loader._local_batch_sampler.cost_floor == 2  # nothing sampled yet
        loader._note_step_cost(0.015, 8, sampled=True)      # 50% more per sample
        assert loader._local_batch_sampler.cost_floor == 10
        loader._note_step_cost(0.010, 8, sampled=True)      # as cheap as the others now
        assert loader._local_batch_sampler.cost_floor == 5  # (averaged: 25% more)
    finally:
        context.reset()
