"""A job whose epoch loop ran to its bound leaves its final state, in
one process with one replica; restarts are simulated with the ``restart`` fixture
(conftest.py). The command line, with real processes, is tested in test_launch.py."""

import json
import logging
import os

import pytest
import torch
from torch.utils.data import TensorDataset

import adaptdl_core.torch as adl
from adaptdl_core import checkpoint, launch

SIZE, BATCH = 24, 4  # 6 batches per epoch
FINISHED = "job already finished"


def _train(epochs, stop_at=None, **kwargs):
    """Build the job (restoring it from the newest checkpoint, if any) and run its epoch
    loop; returns (epochs run, final weights). ``stop_at=(epoch, batch)`` asks to
    checkpoint and exit there."""
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    ddp = adl.AdaptiveDataParallel(model, opt)
    loader = adl.AdaptiveDataLoader(
        TensorDataset(torch.arange(SIZE, dtype=torch.float32).unsqueeze(1)),
        batch_size=BATCH, shuffle=True)
    ran = []
    for epoch in adl.remaining_epochs_until(epochs, **kwargs):
        for i, (x,) in enumerate(loader):
            opt.zero_grad()
            ddp(x).pow(2).mean().backward()
            opt.step()
            if (epoch, i) == stop_at:
                adl.request_checkpoint_and_exit()
        ran.append(epoch)
    return ran, [p.detach().clone() for p in ddp.module.parameters()]


def _summary(ckpt):
    manifest = json.loads(open(os.path.join(ckpt, "MANIFEST.json")).read())
    return manifest["summary"]["adaptdl-epoch"]


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _finished_lines(caplog):
    return [r for r in caplog.records if FINISHED in r.getMessage()]


def test_the_newest_checkpoint_is_the_end_of_training_and_a_rerun_trains_nothing(
        process_group, ckpt_dir, restart, caplog):
    ran, final = _train(3)
    assert ran == [0, 1, 2] and adl.job_finished()
    newest = checkpoint.latest_checkpoint_dir()
    assert newest is not None
    assert _summary(newest) == {"finished_epochs": 3, "finished": True}
    assert json.loads(open(os.path.join(newest, "adaptdl-epoch")).read())["finished"] is True

    restart()
    with caplog.at_level(logging.WARNING, logger="adaptdl_core.torch.epoch"):
        again, weights = _train(3)
    assert again == []
    assert _same(weights, final), "the rerun did not restore the final weights"
    [line] = _finished_lines(caplog)
    assert line.levelno == logging.WARNING
    assert "job already finished (3 epochs); nothing to do" in line.getMessage()
    assert checkpoint.latest_checkpoint_dir() == newest  # nothing saved again
    assert adl.job_finished() and adl.finished_epochs() == 3


def test_an_interrupted_job_resumes_then_its_final_checkpoint_replaces_the_interrupted_one(
        process_group, ckpt_dir, restart):
    with pytest.raises(adl.CheckpointExit) as stopped:
        _train(3, stop_at=(1, 2))
    assert _summary(stopped.value.checkpoint_dir) == {"finished_epochs": 1, "finished": False}
    restart()
    ran, final = _train(3)
    assert ran == [1, 2]
    newest = checkpoint.latest_checkpoint_dir()
    assert newest != stopped.value.checkpoint_dir
    assert _summary(newest) == {"finished_epochs": 3, "finished": True}
    # The launcher reads the same from the manifest (without torch).
    point = launch.resume_point(ckpt_dir)
    assert (point.path, point.finished, point.finished_epochs) == (newest, True, 3)


def test_a_larger_bound_trains_on_from_a_finished_job(process_group, ckpt_dir, restart,
                                                       caplog):
    _train(2)
    restart()
    with caplog.at_level(logging.INFO, logger="adaptdl_core.torch.epoch"):
        ran, _ = _train(4)
    assert ran == [2, 3] and not _finished_lines(caplog)
    assert any("had finished 2 epochs; training on until epoch 4" in r.getMessage()
               for r in caplog.records)
    assert _summary(checkpoint.latest_checkpoint_dir()) == {"finished_epochs": 4,
                                                            "finished": True}


def test_leaving_the_loop_early_does_not_finish_the_job(process_group, ckpt_dir):
    for epoch in adl.remaining_epochs_until(3):
        if epoch == 1:
            break
    assert not adl.job_finished() and adl.finished_epochs() == 2
    assert checkpoint.latest_checkpoint_dir() is None


def test_final_checkpoint_false_saves_nothing(process_group, ckpt_dir):
    ran, _ = _train(2, final_checkpoint=False)
    assert ran == [0, 1] and adl.job_finished()
    assert checkpoint.latest_checkpoint_dir() is None


def test_without_a_checkpoint_path_the_job_finishes_without_saving(process_group, tmp_path):
    ran, _ = _train(1)
    assert ran == [0] and adl.job_finished()
    assert os.environ.get("ADAPTDL_CHECKPOINT_PATH") is None


def test_final_checkpoint_must_be_a_bool():
    with pytest.raises(ValueError, match=r"final_checkpoint='no'\): pass True"):
        adl.remaining_epochs_until(2, final_checkpoint="no")
