"""Every documented ValueError / RuntimeError / TypeError of the torch API, in-process and
without a process group; each message must name the offending argument.

(AdaptiveDataParallel with a non-optimizer after a real init_process_group, and a second
init_process_group, are also checked in a child process by
tests/core/test_checkpoint.py::test_everything_the_library_writes_is_json_or_weights_only_loadable.)
"""

import os
import signal

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset, SequentialSampler, TensorDataset

import adaptdl_core.torch as adl
from adaptdl_core import checkpoint
from adaptdl_core.torch import parallel


def dataset(n=8):
    return TensorDataset(torch.arange(n, dtype=torch.float32))


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(4))


# -- AdaptiveDataLoader ----------------------------------------------------------------------

@pytest.mark.parametrize("key", ["sampler", "batch_sampler"])
def test_loader_rejects_custom_samplers(key):
    ds = dataset()
    value = SequentialSampler(ds) if key == "sampler" else [[0, 1], [2, 3]]
    with pytest.raises(ValueError) as info:
        adl.AdaptiveDataLoader(ds, batch_size=2, **{key: value})
    assert f"{key}=" in str(info.value)
    assert checkpoint.state_names() == []  # nothing registered by the failed construction


def test_loader_accepts_explicit_none_samplers():
    loader = adl.AdaptiveDataLoader(dataset(), batch_size=2, sampler=None, batch_sampler=None)
    assert loader.current_local_bsz == 2


@pytest.mark.parametrize("bad", [0, -4, 2.0, "8", None, True, False])
def test_loader_rejects_bad_batch_size(bad):
    with pytest.raises(ValueError) as info:
        adl.AdaptiveDataLoader(dataset(), batch_size=bad)
    assert "batch_size" in str(info.value)
    assert repr(bad) in str(info.value)
    assert checkpoint.state_names() == []


def test_loader_rejects_iterable_dataset():
    with pytest.raises(ValueError, match=r"dataset=.*iterable"):
        adl.AdaptiveDataLoader(Stream(), batch_size=2)
    assert checkpoint.state_names() == []


def test_loader_rejects_empty_dataset():
    with pytest.raises(ValueError, match=r"dataset=.*empty"):
        adl.AdaptiveDataLoader(dataset(0), batch_size=2)
    assert checkpoint.state_names() == []


def test_overlapping_loader_loops_raise():
    outer = adl.AdaptiveDataLoader(dataset(), batch_size=2)
    inner = adl.AdaptiveDataLoader(dataset(), batch_size=2)
    with pytest.raises(RuntimeError, match="overlapping AdaptiveDataLoader"):
        for _ in outer:
            for _ in inner:
                pass
    assert adl.current_dataloader() is None


# -- ElasticSampler --------------------------------------------------------------------------

def test_sampler_rejects_empty_dataset():
    with pytest.raises(ValueError, match=r"dataset=.*empty"):
        adl.ElasticSampler([])


def test_sampler_rejects_unsized_dataset():
    with pytest.raises(ValueError, match=r"dataset=.*__len__"):
        adl.ElasticSampler(iter(range(3)))


@pytest.mark.parametrize("epoch,index,word", [(-1, 0, "epoch=-1"), (0, -3, "index=-3"),
                                              (-2, -2, "epoch=-2")])
def test_sampler_set_epoch_rejects_negative(epoch, index, word):
    sampler = adl.ElasticSampler(list(range(5)))
    with pytest.raises(ValueError) as info:
        sampler.set_epoch(epoch, index)
    assert word in str(info.value)
    assert (sampler.epoch, sampler.index) == (0, 0)  # unchanged


# -- epochs ----------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [-1, 2.0, "3", None, True])
def test_remaining_epochs_until_rejects_bad_epoch(bad):
    with pytest.raises(ValueError) as info:
        adl.remaining_epochs_until(bad)
    assert f"epoch={bad!r}" in str(info.value)
    assert adl.finished_epochs() == 0


def test_nested_epoch_loops_raise():
    seen = []
    for epoch in adl.remaining_epochs_until(2):
        seen.append(epoch)
        with pytest.raises(RuntimeError, match=f"inside epoch {epoch}"):
            adl.remaining_epochs_until(5)
    assert seen == [0, 1]
    assert list(adl.remaining_epochs_until(3)) == [2]  # not overlapping any more


# -- AdaptiveDataParallel --------------------------------------------------------------------

def test_data_parallel_without_process_group_raises(no_process_group):
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(RuntimeError, match="init_process_group"):
        adl.AdaptiveDataParallel(model, opt)
    assert checkpoint.state_names() == []


@pytest.mark.parametrize("bad", ["sgd", None, torch.nn.Linear(1, 1), {"lr": 0.1}])
def test_data_parallel_rejects_non_optimizer(monkeypatch, no_process_group, bad):
    # The argument is checked before DistributedDataParallel needs the group, so pretending
    # that one exists is enough here (the child job in test_checkpoint.py uses a real one).
    monkeypatch.setattr(parallel.dist, "is_initialized", lambda: True)
    with pytest.raises(ValueError) as info:
        adl.AdaptiveDataParallel(torch.nn.Linear(2, 1), bad)
    assert "optimizer" in str(info.value)
    assert type(bad).__name__ in str(info.value)
    assert checkpoint.state_names() == []


@pytest.mark.parametrize("bad", ["x", 0.1, object()])
def test_data_parallel_rejects_a_non_scheduler_at_construction(monkeypatch, no_process_group,
                                                               bad):
    monkeypatch.setattr(parallel.dist, "is_initialized", lambda: True)
    model = torch.nn.Linear(2, 1)
    with pytest.raises(ValueError) as info:
        adl.AdaptiveDataParallel(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                 lr_scheduler=bad)
    assert "lr_scheduler=" in str(info.value) and type(bad).__name__ in str(info.value)
    assert checkpoint.state_names() == []


# -- collective.initialize and latest_checkpoint_dir -----------------------------------------

@pytest.mark.parametrize("bad", [123, "", None.__class__])
def test_collective_initialize_rejects_a_bad_master_addr(bad):
    from adaptdl_core import collective
    with pytest.raises(ValueError, match="master_addr="):
        collective.initialize(master_addr=bad, master_port=0, replica_rank=0, num_replicas=1)


@pytest.mark.parametrize("bad", [0, 1.5, ["/tmp"]])
def test_latest_checkpoint_dir_rejects_a_non_path(bad):
    with pytest.raises(TypeError) as info:
        checkpoint.latest_checkpoint_dir(bad)
    assert "root=" in str(info.value) and "str or os.PathLike" in str(info.value)


# -- init_process_group ----------------------------------------------------------------------

BAD_INIT = [
    (dict(backend=""), "backend"),
    (dict(backend=None), "backend"),
    (dict(backend=3), "backend"),
    (dict(backend="gloo", init_method="http://127.0.0.1:1234"), "init_method"),
    (dict(backend="gloo", init_method="tcp://127.0.0.1"), "init_method"),
    (dict(backend="gloo", init_method="file:///tmp/x"), "init_method"),
    (dict(backend="gloo", init_method="tcp://:1234"), "init_method"),
    (dict(backend="gloo", world_size=0), "world_size"),
    (dict(backend="gloo", world_size=-2, rank=0), "world_size"),
    (dict(backend="gloo", world_size="2", rank=0), "world_size"),
    (dict(backend="gloo", world_size=True, rank=0), "world_size"),
    (dict(backend="gloo", world_size=2.0, rank=0), "world_size"),
    (dict(backend="gloo", rank=-1), "rank"),
    (dict(backend="gloo", rank=1), "rank"),  # world size 1 from the environment
    (dict(backend="gloo", world_size=3, rank=3), "rank"),
    (dict(backend="gloo", world_size=2, rank=True), "rank"),
    (dict(backend="gloo", world_size=2, rank="0"), "rank"),
]


@pytest.mark.parametrize("kwargs,word", BAD_INIT,
                         ids=[f"{w}-{i}" for i, (_, w) in enumerate(BAD_INIT)])
def test_init_process_group_rejects_bad_arguments(no_process_group, kwargs, word):
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with pytest.raises(ValueError) as info:
        adl.init_process_group(**kwargs)
    assert f"{word}=" in str(info.value)
    # Rejected before any side effect.
    assert not dist.is_initialized()
    assert [k for k in os.environ if k.startswith("ADAPTDL_")] == []
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers


def test_init_process_group_reports_invalid_environment(no_process_group, monkeypatch):
    monkeypatch.setenv("ADAPTDL_NUM_REPLICAS", "none")
    with pytest.raises(ValueError, match="ADAPTDL_NUM_REPLICAS"):
        adl.init_process_group("gloo")
    assert not dist.is_initialized()


# -- Accumulator -----------------------------------------------------------------------------

def test_accumulator_created_inside_a_loader_loop_raises():
    loader = adl.AdaptiveDataLoader(dataset(4), batch_size=2)
    batches = 0
    for _ in loader:
        batches += 1
        with pytest.raises(RuntimeError, match="outside data loader loops"):
            adl.Accumulator()
    assert batches == 2
    assert not [n for n in checkpoint.state_names() if "accumulator" in n]  # nothing registered
    adl.Accumulator()  # fine outside the loop


@pytest.mark.parametrize("assign", [
    lambda acc: acc.__setitem__("a", 1),
    lambda acc: acc.__setitem__("a", acc["b"] + 1),  # another key's pending update
    lambda acc: acc.__setitem__("a", adl.Accumulator()["a"] + 1),  # another accumulator's
    lambda acc: acc.__setitem__("a", None),
])
def test_accumulator_plain_assignment_in_accumulation_mode_raises(assign):
    acc = adl.Accumulator()
    with pytest.raises(TypeError, match="accumulation mode"):
        assign(acc)
    with acc.synchronized():
        assert dict(acc) == {}  # nothing was recorded


def test_accumulator_adding_two_entries_raises():
    acc = adl.Accumulator()
    with pytest.raises(TypeError, match="accumulation mode"):
        acc["a"] += acc["b"]
    with pytest.raises(TypeError, match="accumulation mode"):
        acc["a"] -= acc["b"]
