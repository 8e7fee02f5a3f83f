"""In-place checkpoints (``request_checkpoint``) across real processes: the job saves at
one batch boundary agreed by all replicas and trains on to the end, seeing every sample
of every epoch exactly once; a copy of that checkpoint, restarted from, resumes exactly
at its position (same batches after it, same final model bitwise).

Each test runs ``jobs/elastic_job.py`` as K gloo replicas (see test_elastic.py).
"""

import json
import shutil

import pytest
import torch

from tests.core.harness import JOBS, read_events, run_replicas
from tests.exactly_once import assert_exactly_once

JOB = JOBS / "elastic_job.py"
SIZE, EPOCHS, BATCH = 96, 3, 8


def run(replicas, record, ckpt, restart, *extra, expect=0):
    """Run the job; returns each rank's output (asserting its exit status)."""
    record.mkdir(exist_ok=True)
    results = run_replicas(JOB, replicas, ckpt, restart,
                           ["--record", str(record), "--size", str(SIZE),
                            "--epochs", str(EPOCHS), "--batch-size", str(BATCH), *extra])
    for rank, (status, out) in enumerate(results):
        assert status == expect, f"rank {rank} exited {status}, expected {expect}:\n{out[-4000:]}"
    return [out for _, out in results]


def position(ckpt_dir):
    """(epoch, global position in it) of the training loader in a checkpoint."""
    epoch = json.loads((ckpt_dir / "adaptdl-epoch").read_text())["finished_epochs"]
    return epoch, json.loads((ckpt_dir / "adaptdl-dataloader-0").read_text())["current_index"]


def batches(events, rank=None):
    return [e for e in events if e["event"] == "batch" and rank in (None, e["rank"])]


def checkpoints(root):
    return sorted(p.name for p in root.iterdir() if p.name.startswith("checkpoint-"))


@pytest.mark.slow
@pytest.mark.parametrize("replicas,save_rank,requests,thread", [
    (1, 0, 1, True),    # from a side thread while training goes on
    (2, 0, 1, True),
    (2, 1, 1, True),    # only rank 1 asks: rank 0 learns it through the agreement
    (2, -1, 2, False),  # every rank asks twice at the same batch: one checkpoint for all
], ids=["1-replica", "2-replicas-rank0", "2-replicas-rank1-only", "2-replicas-all-twice"])
def test_in_place_checkpoint_mid_training_then_resume_from_a_copy(tmp_path, replicas,
                                                                   save_rank, requests,
                                                                   thread):
    first, ckpt = tmp_path / "first", tmp_path / "ckpt"
    outs = run(replicas, first, ckpt, 0, "--save-after", "3", "--save-rank", str(save_rank),
               "--save-requests", str(requests), "--sleep", "0.005", "--late-save",
               *(["--save-from-thread"] if thread else []))
    events = read_events(first)
    # Trained to the end, every sample of every epoch exactly once.
    assert_exactly_once(events, SIZE, EPOCHS)
    assert sorted(e["rank"] for e in events if e["event"] == "done") == list(range(replicas))
    # One in-place checkpoint, mid-training, logged once by every replica; and the end
    # of training (saved when the epoch loop ran to its bound).
    assert checkpoints(ckpt) == ["checkpoint-0", "checkpoint-1"]
    saved = ckpt / "checkpoint-0"
    epoch, index = position(saved)
    assert (0, 3 * BATCH) <= (epoch, index) and epoch < EPOCHS, (epoch, index)
    for out in outs:
        assert out.count("in-place checkpoint") == 1, out[-3000:]
    # Every request resolved by it, the path on replica 0 only.
    askers = range(replicas) if save_rank == -1 else [save_rank]
    saves = [e for e in events if e["event"] == "save"]
    assert sorted(e["rank"] for e in saves) == sorted(list(askers) * requests)
    for e in saves:
        assert e["done"] and e["taken"], e
        assert e["path"] == (str(saved) if e["rank"] == 0 else None), e
    # A request after the last boundary stays pending until cancelled.
    late = [e for e in events if e["event"] == "late_save"]
    assert len(late) == replicas
    for e in late:
        assert (e["waited"], e["done_before_cancel"], e["cancelled"]) == (False, False, True)
        assert (e["done"], e["taken"], e["cancel_again"]) == (True, False, False)

    # Restart from a copy of the checkpoint: it resumes exactly at its position.
    second, copy = tmp_path / "second", tmp_path / "copy"
    shutil.copytree(saved, copy / saved.name)
    run(replicas, second, copy, 1)
    resumed = read_events(second)
    before = [e for e in batches(events) if (e["epoch"], e["index"]) < (epoch, index)]
    assert_exactly_once(before + batches(resumed), SIZE, EPOCHS)
    for rank in range(replicas):
        after = [(e["epoch"], e["idx"]) for e in batches(events, rank)
                 if (e["epoch"], e["index"]) >= (epoch, index)]
        assert [(e["epoch"], e["idx"]) for e in batches(resumed, rank)] == after
    a = torch.load(first / "final.pt", weights_only=True)
    b = torch.load(second / "final.pt", weights_only=True)
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs after resuming"


@pytest.mark.slow
@pytest.mark.parametrize("replicas", [1, 2])
def test_exit_and_in_place_requests_agreed_together_take_one_checkpoint(tmp_path, replicas):
    """Rank 0 asks to stop and the last rank to checkpoint, at the same batch: one
    checkpoint, the save request resolved by it before CheckpointExit; then the job
    resumes from it exactly once."""
    ckpt, save_rank = tmp_path / "ckpt", replicas - 1
    outs = run(replicas, tmp_path, ckpt, 0, "--save-after", "5", "--save-rank", str(save_rank),
               "--stop-after", "5", "--stop-rank", "0", expect=143)
    assert checkpoints(ckpt) == ["checkpoint-0"]
    for out in outs:
        assert "in-place checkpoint" not in out and "exiting with status 143" in out
    saves = [e for e in read_events(tmp_path) if e["event"] == "save"]
    assert len(saves) == 1 and saves[0]["rank"] == save_rank
    assert saves[0]["taken"] and saves[0]["done"]
    assert saves[0]["path"] == (str(ckpt / "checkpoint-0") if save_rank == 0 else None)
    run(replicas, tmp_path, ckpt, 1)
    assert_exactly_once(read_events(tmp_path), SIZE, EPOCHS)


@pytest.mark.slow
def test_request_during_validation_waits_for_the_next_epoch(tmp_path):
    """Validation batches take no AdaptiveDataParallel step, so the replicas agree through
    the store (every few boundaries); only rank 1 asks, on its 2nd validation batch of
    epoch 0, after the epoch's training loop. The checkpoint waits for the next epoch's
    first training boundaries (a resumption never lands in an epoch whose training is
    spent), training goes on, and a copy restarted from it resumes in epoch 1 there and
    trains the same model."""
    first, ckpt = tmp_path / "first", tmp_path / "ckpt"
    outs = run(2, first, ckpt, 0, "--save-after", "2", "--save-rank", "1", "--save-in-valid")
    events = read_events(first)
    assert_exactly_once(events, SIZE, EPOCHS)
    # The in-place checkpoint, and the end of training (saved when the epoch loop
    # ran to its bound).
    assert checkpoints(ckpt) == ["checkpoint-0", "checkpoint-1"]
    saved = ckpt / "checkpoint-0"
    train_epoch, train_index = position(saved)
    # Epoch 0 ended (validation included); the save came at epoch 1's first boundary or
    # with the first step's agreement.
    assert train_epoch == 1 and train_index <= BATCH, (train_epoch, train_index)
    valid = json.loads((saved / "adaptdl-dataloader-1").read_text())
    assert valid["current_index"] == 0 and valid["last_position"] == {"0": 1}, valid
    for out in outs:
        assert out.count("in-place checkpoint") == 1, out[-3000:]
    saves = [e for e in events if e["event"] == "save"]
    assert [(e["rank"], e["taken"], e["path"]) for e in saves] == [(1, True, None)]
    # Epoch 0's metrics were complete in the first run (its validation ran to its end).
    ends = [e for e in events if e["event"] == "epoch_end" and e["epoch"] == 0]
    assert [e["results"]["valid_n"] for e in ends] == [SIZE, SIZE]

    second, copy = tmp_path / "second", tmp_path / "copy"
    shutil.copytree(saved, copy / saved.name)
    run(2, second, copy, 1)
    resumed = read_events(second)
    assert {e["epoch"] for e in batches(resumed)} == set(range(1, EPOCHS))
    before = [e for e in batches(events) if (e["epoch"], e["index"]) < (1, train_index)]
    assert_exactly_once(before + batches(resumed), SIZE, EPOCHS)
    a = torch.load(first / "final.pt", weights_only=True)
    b = torch.load(second / "final.pt", weights_only=True)
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs after resuming"
