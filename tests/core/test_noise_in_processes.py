"""The gradient noise estimate in real processes against the analytic truth of
``jobs/noise_job.py``: one replica (half-batch splits on sampled steps) and two replicas
(replica gradients compared on sampled steps, local norms summed with the side values)."""

import pytest

from adaptdl_core.torch._gradient_probe import SIDE_VALUES_MAX_EVERY
from adaptdl_core.torch.sampler import NOISE_DENSE_STEPS, NOISE_MULTI_INTERVAL
from tests.core.harness import JOBS, run_json_job


def _run(replicas, tmp_path, *args):
    return run_json_job(JOBS / "noise_job.py", replicas, tmp_path, *args)


def test_single_replica_estimate_within_25_percent_of_truth(tmp_path):
    [result] = _run(1, tmp_path)
    print(result)
    # Sampled steps came as two halves of 16, and each gave a measurement.
    assert result["halves"] == 2 * result["updates"] > 60
    assert abs(result["sqr"] / result["true_sqr"] - 1) < 0.25
    assert abs(result["var"] / result["true_var"] - 1) < 0.25


def test_single_replica_pairs_of_whole_batches_when_halves_are_below_the_bound(tmp_path):
    # A batch of 32 with local_bsz_bounds=(32, 32) cannot be split: sampled steps take two
    # whole batches (64 samples) instead, and the estimate is as good.
    [result] = _run(1, tmp_path, "pairs")
    print(result)
    assert result["halves"] == 0 and result["batch"] == 32
    assert result["pair_steps"] == result["updates"] > 60
    assert abs(result["sqr"] / result["true_sqr"] - 1) < 0.25
    assert abs(result["var"] / result["true_var"] - 1) < 0.25


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["", "bucket_view"])
def test_two_replica_estimate_on_sampled_steps_within_25_percent_of_truth(mode, tmp_path):
    # Local norms taken in one call after the backward pass (default), or per parameter
    # as each gradient completes when DDP reduces .grad in place (bucket_view).
    first, second = _run(2, tmp_path, *([mode] if mode else []))
    print(first)
    # Both replicas hold the same estimate (same sums, same schedule).
    assert first["sqr"] == second["sqr"] and first["var"] == second["var"]
    # Every step measured at first, then one in NOISE_MULTI_INTERVAL; each measurement is
    # recorded when the side values that carry its sums return (every few steps, at most
    # SIDE_VALUES_MAX_EVERY), so the last few of the run are never recorded.
    steps = first["steps"]
    sampled = NOISE_DENSE_STEPS + (steps - NOISE_DENSE_STEPS) // NOISE_MULTI_INTERVAL
    unsent = SIDE_VALUES_MAX_EVERY // NOISE_MULTI_INTERVAL + 1
    assert sampled - unsent <= first["updates"] <= sampled
    assert abs(first["sqr"] / first["true_sqr"] - 1) < 0.25
    assert abs(first["var"] / first["true_var"] - 1) < 0.25


@pytest.mark.parametrize("replicas", [1, 2])
def test_gradients_are_averaged_over_replicas_and_micro_batches(replicas, tmp_path):
    for out in run_json_job(JOBS / "accumulation_job.py", replicas, tmp_path):
        print(out)
        # 3 epochs of 512 samples at 8 per replica and step, nearly all full steps.
        assert out["checked"] >= 3 * 512 // (8 * replicas) - 3
        # The mean, not the sum: a sum would be off by the gradient itself.
        assert out["max_err"] < 1e-9
        assert out["updates"] > 10  # the noise is measured with accumulation too
