"""The DataLoader attributes of AdaptiveDataLoader that AdaptDL scripts read:
``batch_size`` is the global target batch size, ``sampler`` the ElasticSampler, ``len()``
counts this replica's batches at the current local batch size; all survive worker
processes and pickling. In-process, without a process group (other replica counts are
simulated by the ADAPTDL_* variables, as in test_epoch_accumulator_unit.py)."""

import math
import pickle

import pytest
import torch
from torch.utils.data import TensorDataset

import adaptdl_core.torch as adl
from tests.exactly_once import assert_exactly_once

DATA = TensorDataset(torch.arange(100))


def test_batch_size_and_sampler_are_the_adaptive_ones():
    loader = adl.AdaptiveDataLoader(DATA, batch_size=64, shuffle=True)
    assert loader.batch_size == 64
    assert isinstance(loader.sampler, adl.ElasticSampler) and loader.sampler.shuffle
    assert loader.sampler.dataset is DATA
    # The attributes are not stored (one source of truth), and torch still forbids
    # assigning them.
    assert not {"batch_size", "sampler"} & set(vars(loader))
    for name, value in (("batch_size", 32), ("sampler", None)):
        with pytest.raises(ValueError, match=f"{name} attribute should not be set"):
            setattr(loader, name, value)
    assert loader.batch_size == 64


def test_batch_size_stays_the_target_when_the_batch_in_use_differs(monkeypatch):
    # Three replicas load ceil(64 / 3) = 22 each: the batch in use is 66.
    monkeypatch.setenv("ADAPTDL_NUM_REPLICAS", "3")
    monkeypatch.setenv("ADAPTDL_REPLICA_RANK", "2")
    loader = adl.AdaptiveDataLoader(DATA, batch_size=64)
    assert loader.batch_size == 64 and loader.current_batch_size == 66
    assert (loader.sampler.num_replicas, loader.sampler.rank) == (3, 2)
    assert len(loader) == math.ceil(math.ceil(100 / 3) / 22) == 2


def test_autoscaled_loader_keeps_the_target_batch_size():
    loader = adl.AdaptiveDataLoader(DATA, batch_size=8)
    loader.autoscale_batch_size(64)
    assert loader.batch_size == 8 and loader.max_batch_size == 64


@pytest.mark.parametrize("drop_last,expected", [(False, 13), (True, 12)])
def test_len_counts_batches_before_during_and_after_iteration(drop_last, expected):
    loader = adl.AdaptiveDataLoader(DATA, batch_size=8, drop_last=drop_last)
    assert len(loader) == expected  # (before: one "batch" per sample)
    lengths, batches = [], 0
    for _ in adl.remaining_epochs_until(1):
        for _batch in loader:
            lengths.append(len(loader))
            batches += 1
    assert batches == expected and set(lengths) == {expected}
    assert len(loader) == expected


@pytest.mark.parametrize("persistent", [False, True])
def test_worker_processes_see_every_sample_once(persistent):
    # forkserver: workers forked from a clean server process. Forking pytest itself can
    # deadlock a worker on a lock some other thread of the test session held (seen once
    # in a full suite run: a worker stuck for 10 minutes in torch's manual_seed).
    loader = adl.AdaptiveDataLoader(DATA, batch_size=16, shuffle=True, num_workers=2,
                                    persistent_workers=persistent,
                                    multiprocessing_context="forkserver", timeout=60)
    events = []
    for epoch in adl.remaining_epochs_until(2):
        events += [{"event": "batch", "epoch": epoch, "idx": x.tolist(), "rank": 0}
                   for (x,) in loader]
    assert_exactly_once(events, 100, 2)
    assert loader.batch_size == 16 and isinstance(loader.sampler, adl.ElasticSampler)


def test_a_dropped_loader_is_freed_at_once_and_a_temporary_one_iterates():
    # No reference cycle keeps a loader (and its persistent workers) until a later
    # garbage collection, whose wait for the workers once stalled another test for 10 s.
    import gc
    import weakref

    loader = adl.AdaptiveDataLoader(DATA, batch_size=10, shuffle=True)
    assert sum(len(x) for (x,) in loader) == 100
    gone = weakref.ref(loader)
    gc.disable()
    try:
        del loader
        assert gone() is None
    finally:
        gc.enable()
    # A loop holds its loader: a loader nobody else holds iterates to its end.
    assert sum(len(x) for (x,) in adl.AdaptiveDataLoader(DATA, batch_size=10)) == 100


def test_pickled_loader_keeps_its_attributes():
    loader = adl.AdaptiveDataLoader(DATA, batch_size=10, shuffle=True, drop_last=True)
    copy = pickle.loads(pickle.dumps(loader))
    assert copy.batch_size == 10 and len(copy) == len(loader) == 10
    assert isinstance(copy.sampler, adl.ElasticSampler) and copy.sampler.shuffle
    assert copy.sampler is not loader.sampler
    assert copy.batch_sampler.sampler is copy.sampler  # (the copy's own, consistently)


def test_a_pickled_copy_becomes_the_training_loader_when_trained_on(process_group):
    copy = pickle.loads(pickle.dumps(adl.AdaptiveDataLoader(DATA, batch_size=10)))
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ddp = adl.AdaptiveDataParallel(model, opt)
    seen = []
    for (x,) in copy:
        opt.zero_grad()
        ddp(x.float().unsqueeze(1)).pow(2).mean().backward()
        opt.step()
        seen.append(copy.training)
    assert seen[1:] and all(seen[1:])  # (from the first optimizer step on its batches)
