"""A metric over the whole validation set equals the single replica's on two replicas
(the recipe of adaptdl_core.torch.whole_set), in real processes."""

import pytest

from tests.core.harness import JOBS, run_json_job


def test_whole_set_metric_on_two_replicas_equals_one_replica(tmp_path):
    one = run_json_job(JOBS / "whole_set_job.py", 1, tmp_path / "one", timeout=120)
    two = run_json_job(JOBS / "whole_set_job.py", 2, tmp_path / "two", timeout=120)
    size = 101
    for epoch in range(2):
        single = one[0]["epochs"][epoch]
        assert single["total"] == size and single["padding"] == 0
        assert single["seen"] == [1] * size
        for rank in range(2):
            got = two[rank]["epochs"][epoch]
            # Every replica reads the same whole-set values: each sample counted once.
            assert got["total"] == size and got["seen"] == [1] * size
            assert got["accuracy"] == single["accuracy"]  # (integer counts: exact)
            # (float32 sums of other batches: equal to float32 precision)
            assert got["mse"] == pytest.approx(single["mse"], rel=1e-6)
            # What the recipe corrects: a replica alone sees only its shard, and the
            # shards with their padding count one sample twice.
            assert got["shard"] == 51
        assert sum(two[rank]["epochs"][epoch]["padding"] for rank in range(2)) == 1
