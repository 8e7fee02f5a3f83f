"""The single-replica noise estimate (half-batch splits on sampled steps) in a real
process, against the analytic truth of ``jobs/noise_job.py``."""

import json

from tests.core.harness import JOBS, run_replicas


def test_single_replica_estimate_within_25_percent_of_truth(tmp_path):
    [(status, out)] = run_replicas(JOBS / "noise_job.py", 1, tmp_path / "ckpt", 0, timeout=300)
    assert status == 0, out[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    print(result)
    # Sampled steps came as two halves of 16, and each gave a measurement.
    assert result["halves"] == 2 * result["updates"] > 60
    assert abs(result["sqr"] / result["true_sqr"] - 1) < 0.25
    assert abs(result["var"] / result["true_var"] - 1) < 0.25
