"""What an epoch consumed: samples seen in the epoch and in total, and
passes over the training data, counted with and without autoscale_batch_size, across
restarts and replicas. In-process with one replica, then real processes."""

import collections
import math

import pytest
import torch
from torch.utils.data import TensorDataset

import adaptdl_core.torch as adl
from adaptdl_core.torch import status
from adaptdl_ray.tune.results import METRIC_PREFIX, PROGRESS_COLUMNS, STATUS_KEYS
from tests.core.harness import JOBS, read_events, run_replicas


def _job(size, batch, drop_last=False):
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ddp = adl.AdaptiveDataParallel(model, opt)
    data = TensorDataset(torch.arange(size, dtype=torch.float32).unsqueeze(1))
    train = adl.AdaptiveDataLoader(data, batch_size=batch, shuffle=True, drop_last=drop_last)
    valid = adl.AdaptiveDataLoader(data, batch_size=batch)
    return ddp, opt, train, valid


def _step(ddp, opt, x):
    opt.zero_grad()
    ddp(x).pow(2).mean().backward()
    opt.step()


@pytest.mark.parametrize("size,drop_last,per_epoch", [(24, False, 24), (26, True, 24)],
                         ids=["whole-pass", "drop-last"])
def test_a_fixed_batch_epoch_is_one_pass(process_group, size, drop_last, per_epoch):
    ddp, opt, train, valid = _job(size, 4, drop_last)
    assert adl.data_progress() == adl.DataProgress(0, 0, 0.0)
    for epoch in adl.remaining_epochs_until(3):
        for (x,) in train:
            _step(ddp, opt, x)
        with torch.no_grad():  # (validation batches are not training samples)
            for (x,) in valid:
                ddp(x)
        seen = adl.data_progress()
        assert seen.epoch_samples == per_epoch
        assert seen.samples_seen == per_epoch * (epoch + 1)
        assert math.isclose(seen.data_passes, per_epoch * (epoch + 1) / size)
    row = status.training_status()
    assert (row["samples_seen"], row["epoch_samples"]) == (3 * per_epoch, per_epoch)
    assert math.isclose(row["data_passes"], 3 * per_epoch / size)


def test_counts_survive_a_restart_in_the_middle_of_an_epoch(process_group, ckpt_dir,
                                                            restart):
    ddp, opt, train, _ = _job(24, 4)
    with pytest.raises(adl.CheckpointExit):
        for epoch in adl.remaining_epochs_until(2):
            for i, (x,) in enumerate(train):
                _step(ddp, opt, x)
                if (epoch, i) == (1, 2):
                    adl.request_checkpoint_and_exit()
    # Three batches of epoch 1 were consumed before the checkpoint (the one handed out
    # at the boundary that took it was not).
    assert adl.data_progress() == adl.DataProgress(24 + 12, 12, 1.5)
    restart()
    ddp, opt, train, _ = _job(24, 4)
    assert adl.data_progress() == adl.DataProgress(36, 12, 1.5)
    for _ in adl.remaining_epochs_until(2):
        for (x,) in train:
            _step(ddp, opt, x)
    assert adl.data_progress() == adl.DataProgress(48, 24, 2.0)


def test_autoscaled_epochs_count_exactly_what_they_consumed(process_group):
    ddp, opt, train, _ = _job(40, 4)
    train.autoscale_batch_size(32, local_bsz_bounds=(2, 32))
    consumed = collections.Counter()
    for epoch in adl.remaining_epochs_until(3):
        for (x,) in train:
            _step(ddp, opt, x)
            consumed[epoch] += len(x)
        assert adl.data_progress().epoch_samples == consumed[epoch]
    total = sum(consumed.values())
    seen = adl.data_progress()
    assert (seen.samples_seen, seen.epoch_samples) == (total, consumed[2])
    assert math.isclose(seen.data_passes, total / 40)


def test_results_and_the_progress_table_carry_the_counts():
    for key in ("samples_seen", "epoch_samples", "data_passes"):
        assert key in STATUS_KEYS and key in status.training_status()
    # Beside the epochs in the progress table.
    columns = list(PROGRESS_COLUMNS)
    at = columns.index(METRIC_PREFIX + "epochs_done")
    assert columns[at + 1:at + 3] == [METRIC_PREFIX + "samples_seen",
                                      METRIC_PREFIX + "data_passes"]


def _epoch_ends(events):
    return {e["epoch"]: e["progress"] for e in events if e["event"] == "epoch_end"
            and e["rank"] == 0}


def _run(tmp_path, replicas, restart, *args, expect):
    results = run_replicas(JOBS / "elastic_job.py", replicas, tmp_path / "ckpt", restart,
                           ["--record", str(tmp_path), *args], timeout=180)
    for rank, (code, out) in enumerate(results):
        assert code == expect, f"rank {rank} exited {code}:\n{out[-4000:]}"


@pytest.mark.slow
def test_replicas_and_restarts_count_each_sample_once(tmp_path):
    # 2 replicas, batch 9 of 50: the last batch of a pass is padded, not counted twice;
    # interrupted in epoch 1 and finished on 1 replica.
    args = ["--size", "50", "--batch-size", "9"]
    _run(tmp_path, 2, 0, *args, "--stop-after", "9", expect=143)
    _run(tmp_path, 1, 1, *args, expect=0)
    ends = _epoch_ends(read_events(tmp_path))
    assert sorted(ends) == [0, 1, 2]
    for epoch, seen in ends.items():
        assert (seen["samples_seen"], seen["epoch_samples"]) == (50 * (epoch + 1), 50)
        assert math.isclose(seen["data_passes"], epoch + 1)


def test_an_autoscaled_epoch_may_consume_more_than_a_pass_and_says_so(tmp_path):
    # The noisy problem of test_autoscale.py, on which the batch size grows from 8.
    _run(tmp_path, 1, 0, "--autoscale", "64", "--noise", "5", "--size", "512",
         "--epochs", "3", expect=0)
    events = read_events(tmp_path)
    consumed = collections.Counter()
    for e in events:
        if e["event"] == "batch":
            consumed[e["epoch"]] += len(e["idx"])
    ends = _epoch_ends(events)
    total = 0
    for epoch in range(3):
        total += consumed[epoch]
        assert ends[epoch]["epoch_samples"] == consumed[epoch]
        assert ends[epoch]["samples_seen"] == total
        assert math.isclose(ends[epoch]["data_passes"], total / 512)
    # Larger batches make less progress per sample: an epoch takes at least a pass.
    assert all(n >= 512 for n in consumed.values()), consumed
    assert max(e["batch_size"] for e in events if e["event"] == "batch") > 8
