"""request_checkpoint() and its PendingCheckpoint, in-process with one replica (whose
requests are checked locally at every batch boundary; several replicas are tested with
real processes in test_inplace_checkpoint.py). Restarts are simulated with the
``restart`` fixture (conftest.py)."""

import json
import threading
from pathlib import Path

import pytest
import torch
from torch.utils.data import TensorDataset

import adaptdl_core.torch as adl
from adaptdl_core import checkpoint, context
from adaptdl_core.torch import _interrupt
from tests.exactly_once import assert_exactly_once

SIZE, BATCH = 40, 4  # 10 batches per epoch


# -- the handle ----------------------------------------------------------------------------

def test_a_new_request_is_pending():
    request = adl.request_checkpoint()
    assert isinstance(request, adl.PendingCheckpoint)
    assert (request.done, request.taken, request.path) == (False, False, None)
    assert request.wait(0) is False and request.wait(0.01) is False
    assert _interrupt.checkpoint_requested() and "pending" in repr(request)


def test_cancel_resolves_once_as_not_taken():
    request = adl.request_checkpoint()
    assert request.cancel() is True
    assert (request.done, request.taken, request.path) == (True, False, None)
    assert request.wait() is True and request.wait(0) is True
    assert request.cancel() is False  # already resolved
    assert not _interrupt.checkpoint_requested()  # nothing left to ask for
    assert "cancelled" in repr(request)


def test_resolution_wakes_waiters_in_other_threads_and_first_resolution_wins():
    request = adl.request_checkpoint()
    woke = []
    waiter = threading.Thread(target=lambda: woke.append(request.wait(10)))
    waiter.start()
    taken = _interrupt.take_checkpoint_requests()
    assert taken == [request] and not _interrupt.checkpoint_requested()
    later = adl.request_checkpoint()  # after the snapshot: waits for the next checkpoint
    _interrupt.resolve_checkpoint_requests(taken, True, "/ckpt/checkpoint-3")
    waiter.join(10)
    assert woke == [True]
    assert (request.done, request.taken, request.path) == (True, True, "/ckpt/checkpoint-3")
    assert request.cancel() is False and request.taken  # (a late cancel changes nothing)
    _interrupt.resolve_checkpoint_requests([request], False)
    assert request.taken and request.path == "/ckpt/checkpoint-3"
    assert not later.done and _interrupt.checkpoint_requested()


def test_requests_from_many_threads_are_all_kept():
    requests = []
    lock = threading.Lock()

    def ask():
        for _ in range(50):
            request = adl.request_checkpoint()
            with lock:
                requests.append(request)

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    taken = _interrupt.take_checkpoint_requests()
    assert len(taken) == 400 and set(map(id, taken)) == set(map(id, requests))


def test_requests_agree_by_or():
    R = _interrupt.Requests
    assert R() == (False, False)
    assert R(True, False) | R(False, True) == R(True, True)
    assert R() | R() == R()
    assert _interrupt.local_requests() == R()
    adl.request_checkpoint()
    assert _interrupt.local_requests() == R(False, True)
    adl.request_checkpoint_and_exit()
    assert _interrupt.local_requests() == R(True, True)


def test_reset_cancels_pending_requests():
    request = adl.request_checkpoint()
    adl.request_checkpoint_and_exit()
    context.reset()
    assert request.done and not request.taken
    assert _interrupt.local_requests() == _interrupt.Requests()


# -- one replica, in a training loop ---------------------------------------------------------


@pytest.fixture
def training(process_group):
    """A tiny job: (AdaptiveDataParallel, optimizer, shuffled loader of SIZE numbers)."""
    return _job()


def _job():
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ddp = adl.AdaptiveDataParallel(model, opt)
    data = TensorDataset(torch.arange(SIZE, dtype=torch.float32).unsqueeze(1))
    loader = adl.AdaptiveDataLoader(data, batch_size=BATCH, shuffle=True)
    return ddp, opt, loader


def _step(ddp, opt, x):
    opt.zero_grad()
    ddp(x).pow(2).mean().backward()
    opt.step()


def _loader_state(ckpt):
    return json.loads((Path(ckpt) / "adaptdl-dataloader-0").read_text())


def test_checkpoint_at_the_next_boundary_then_training_goes_on(training, ckpt_dir, caplog):
    ddp, opt, loader = training
    seen, requests = [], []
    with caplog.at_level("INFO", logger="adaptdl_core.torch"):
        for epoch in adl.remaining_epochs_until(2):
            for i, (x,) in enumerate(loader):
                _step(ddp, opt, x)
                seen.append((epoch, x.squeeze(1).int().tolist()))
                if epoch == 0 and i == 3:
                    # Two requests before the next boundary, one from another thread.
                    requests.append(adl.request_checkpoint())
                    t = threading.Thread(target=lambda: requests.append(adl.request_checkpoint()))
                    t.start()
                    t.join()
                    assert not any(r.done for r in requests)
                if epoch == 0 and i == 4:
                    # The boundary before this batch took the checkpoint.
                    assert all(r.done and r.taken for r in requests)
    paths = {r.path for r in requests}
    assert paths == {str(ckpt_dir / "checkpoint-0")}  # one checkpoint for both
    # ...and the end of training, saved when the epoch loop ran to its bound.
    assert sorted(p.name for p in ckpt_dir.iterdir()) == ["checkpoint-0", "checkpoint-1"]
    state = _loader_state(paths.pop())
    assert state["current_index"] == 16  # after the 4 batches handed out before it
    epoch_state = json.loads((ckpt_dir / "checkpoint-0" / "adaptdl-epoch").read_text())
    assert (epoch_state["finished_epochs"], epoch_state["finished"]) == (0, False)
    # Every sample of every epoch exactly once: nothing skipped or repeated (one replica:
    # no padding).
    assert_exactly_once([{"event": "batch", "epoch": e, "idx": batch, "rank": 0}
                         for e, batch in seen], SIZE, 2)
    lines = [r for r in caplog.records if "in-place checkpoint" in r.getMessage()]
    assert len(lines) == 1 and "position 16" in lines[0].getMessage()
    assert not _interrupt.checkpoint_requested()


def test_restart_from_the_in_place_checkpoint_resumes_at_its_position(training, ckpt_dir,
                                                                       restart):
    ddp, opt, loader = training
    first = []
    # (No final checkpoint: the restart below resumes from the in-place one.)
    for epoch in adl.remaining_epochs_until(2, final_checkpoint=False):
        for i, (x,) in enumerate(loader):
            _step(ddp, opt, x)
            first.append((epoch, x.squeeze(1).int().tolist()))
            if epoch == 0 and i == 6:
                request = adl.request_checkpoint()
    assert request.taken
    final = [p.detach().clone() for p in ddp.module.parameters()]
    restart()
    ddp, opt, loader = _job()
    second = []
    for epoch in adl.remaining_epochs_until(2, final_checkpoint=False):
        for (x,) in loader:
            _step(ddp, opt, x)
            second.append((epoch, x.squeeze(1).int().tolist()))
    assert second == first[7:]  # exactly the batches after the checkpoint, in order
    for a, b in zip(final, ddp.module.parameters()):
        assert torch.equal(a, b)


def test_without_a_checkpoint_path_the_request_is_taken_without_a_path(training):
    _, _, loader = training
    for _ in adl.remaining_epochs_until(1):
        for i, _batch in enumerate(loader):
            if i == 0:
                request = adl.request_checkpoint()
    assert request.taken and request.path is None


def test_exit_and_checkpoint_at_the_same_boundary_take_one_checkpoint(training, ckpt_dir):
    ddp, opt, loader = training
    with pytest.raises(adl.CheckpointExit) as info:
        for _ in adl.remaining_epochs_until(2):
            for i, (x,) in enumerate(loader):
                _step(ddp, opt, x)
                if i == 2:
                    request = adl.request_checkpoint()
                    adl.request_checkpoint_and_exit()
    assert info.value.checkpoint_dir == str(ckpt_dir / "checkpoint-0")
    assert sorted(p.name for p in ckpt_dir.iterdir()) == ["checkpoint-0"]
    assert request.taken and request.path == info.value.checkpoint_dir
    assert _loader_state(request.path)["current_index"] == 3 * BATCH


def test_a_request_after_the_last_boundary_stays_pending_until_cancelled(training, ckpt_dir):
    _, _, loader = training
    for _ in adl.remaining_epochs_until(1, final_checkpoint=False):
        for _batch in loader:
            pass
    request = adl.request_checkpoint()
    assert not request.wait(0.05) and not request.done
    assert request.cancel() and request.done and not request.taken
    assert not any(ckpt_dir.iterdir())


def test_a_validation_loop_boundary_also_takes_it(training, ckpt_dir):
    _, _, loader = training
    with torch.no_grad():
        for _ in adl.remaining_epochs_until(1, final_checkpoint=False):
            for i, _batch in enumerate(loader):
                if i == 1:
                    request = adl.request_checkpoint()
                if i == 2:
                    assert request.taken
    assert _loader_state(request.path)["current_index"] == 2 * BATCH
    assert checkpoint.latest_checkpoint_dir() == request.path
