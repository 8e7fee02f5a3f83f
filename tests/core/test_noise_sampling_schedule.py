"""Which steps a single replica samples for its gradient-noise estimate, and how the
cost of those steps spaces them out (in-process, no process group)."""

import pytest
import torch
from torch.utils.data import TensorDataset

import adaptdl_core.torch as adl
from adaptdl_core.torch import sampler as schedules
from adaptdl_core.torch.sampler import LocalBatchSampler, NoiseSampling


def sampled_steps(cost_floor, steps=300, bsz=4):
    """Steps whose batch the sampler hands out as two halves."""
    sampler = adl.ElasticSampler(list(range(steps * bsz)), shuffle=False)
    batches = LocalBatchSampler(sampler, bsz, drop_last=False)
    batches.measure_from = 0
    batches.schedule = NoiseSampling(cost_floor)
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
    assert max(gaps(steps)) == schedules.NOISE_MAX_INTERVAL


def test_costly_sampled_steps_are_spaced_after_a_quick_first_estimate():
    steps = sampled_steps(cost_floor=9)
    quick = schedules.NOISE_QUICK_SAMPLES
    assert steps[:quick] == sampled_steps(cost_floor=2)[:quick]
    assert all(g >= 9 for g in gaps(steps)[quick - 1:])
    assert len(steps) < len(sampled_steps(cost_floor=2))


@pytest.mark.parametrize("extra, floor", [(0.0, 2), (0.05, 2), (0.2, 4), (0.45, 9), (3.0, 60)])
def test_cost_floor_keeps_sampled_steps_within_the_time_share(extra, floor):
    assert schedules.cost_floor(extra) == floor
    # One sampled step in `floor` costs at most the share of the training time.
    assert extra / floor <= schedules.NOISE_COST_SHARE + 1e-12


def test_measured_step_times_set_the_interval():
    schedule = NoiseSampling()
    for _ in range(5):
        schedule.note_step_cost(0.010, 8, sampled=False)  # 1.25 ms per sample
    assert schedule.cost_floor == 2  # nothing sampled yet
    schedule.note_step_cost(0.015, 8, sampled=True)      # 50% more per sample
    assert schedule.cost_floor == 10
    schedule.note_step_cost(0.010, 8, sampled=True)      # as cheap as the others now
    assert schedule.cost_floor == 5  # (averaged: 25% more)


def test_a_new_local_batch_forgets_the_plain_step_cost():
    schedule = NoiseSampling()
    schedule.note_step_cost(0.010, 8, sampled=False)
    schedule.forget_costs()
    schedule.note_step_cost(0.015, 8, sampled=True)  # nothing to compare with
    assert schedule.cost_floor == 2


def test_the_loader_feeds_its_sampler_schedule():
    loader = adl.AdaptiveDataLoader(TensorDataset(torch.zeros(64, 1)), batch_size=8)
    assert isinstance(loader.batch_sampler, LocalBatchSampler)
    assert isinstance(loader.batch_sampler.schedule, NoiseSampling)
