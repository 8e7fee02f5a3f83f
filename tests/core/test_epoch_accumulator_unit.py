"""Unit semantics of ElasticSampler, the epoch loop and Accumulator, in-process and without
a process group (a single replica's collectives are local; other replica counts are
simulated by setting ADAPTDL_NUM_REPLICAS / ADAPTDL_REPLICA_RANK before creating a
sampler or loader). Restarts are simulated with ``context.reset()``."""

import math

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

import adaptdl_core.torch as adl
from adaptdl_core import checkpoint, context


def sampler_for(monkeypatch, data, replicas, rank, **kwargs):
    monkeypatch.setenv("ADAPTDL_NUM_REPLICAS", str(replicas))
    monkeypatch.setenv("ADAPTDL_REPLICA_RANK", str(rank))
    return adl.ElasticSampler(data, **kwargs)


def all_ranks(monkeypatch, data, replicas, epoch=0, index=0, **kwargs):
    shares = []
    for rank in range(replicas):
        s = sampler_for(monkeypatch, data, replicas, rank, **kwargs)
        s.set_epoch(epoch, index)
        shares.append(list(s))
        assert len(s) == len(shares[-1])
    return shares


def interleave(shares):
    return [x for group in zip(*shares) for x in group]


# -- ElasticSampler --------------------------------------------------------------------------

def test_sampler_deals_positions_round_robin_and_pads(monkeypatch):
    shares = all_ranks(monkeypatch, list(range(10)), 3, shuffle=False)
    assert shares == [[0, 3, 6, 9], [1, 4, 7, 0], [2, 5, 8, 1]]


@pytest.mark.parametrize("n,replicas", [(10, 1), (10, 2), (10, 3), (7, 4), (3, 5), (16, 4)])
def test_sampler_covers_every_sample_once_plus_padding(monkeypatch, n, replicas):
    shares = all_ranks(monkeypatch, list(range(n)), replicas, epoch=3, shuffle=True, seed=7)
    per_rank = math.ceil(n / replicas)
    assert [len(s) for s in shares] == [per_rank] * replicas  # even shares
    order = interleave(shares)
    assert sorted(order[:n]) == list(range(n))  # the first n positions: each sample once
    assert order[n:] == order[:len(order) - n]  # padding repeats the start of the order


def test_sampler_single_replica_is_the_whole_order(monkeypatch):
    shares = all_ranks(monkeypatch, list(range(9)), 1, shuffle=False)
    assert shares == [list(range(9))]


def test_shuffle_is_deterministic_per_epoch_and_pass(monkeypatch):
    data = list(range(50))

    def order(epoch, index=0, seed=0):
        return all_ranks(monkeypatch, data, 1, epoch=epoch, index=index, seed=seed)[0]

    e0 = order(0)
    assert sorted(e0) == data and e0 != data
    assert order(0) == e0  # same (seed, epoch, pass): same order
    assert order(1) != e0  # another epoch
    assert order(0, seed=1) != e0  # another seed
    second_pass = order(0, index=50)
    assert sorted(second_pass) == data and second_pass != e0
    assert order(0, index=53) == second_pass[3:]
    assert order(0, index=100) != second_pass  # third pass


def test_set_epoch_index_resumes_on_another_replica_count(monkeypatch):
    data = list(range(23))
    full = all_ranks(monkeypatch, data, 1, epoch=4)[0]
    # Two replicas consume three global batches of 2 x 2 samples ...
    before = interleave(all_ranks(monkeypatch, data, 2, epoch=4))[:12]
    assert before == full[:12]
    # ... then three replicas continue at global position 12.
    after = all_ranks(monkeypatch, data, 3, epoch=4, index=12)
    assert [len(s) for s in after] == [4, 4, 4]  # ceil(11 / 3)
    rest = interleave(after)
    assert rest[:11] == full[12:]
    assert sorted(before + rest[:11]) == data


def test_sampler_length_follows_the_index(monkeypatch):
    s = sampler_for(monkeypatch, list(range(10)), 4, 1)
    assert len(s) == 3
    s.set_epoch(0, 7)
    assert len(s) == 1 and len(list(s)) == 1
    s.set_epoch(2, 10)  # start of the second pass
    assert len(s) == 3


def test_loader_batches_are_the_sampler_shares(monkeypatch):
    """The loader gives each replica ceil(batch_size / replicas) samples per batch from its
    share, and advances the global position by a whole global batch."""
    data = TensorDataset(torch.arange(10))
    batches, positions = [], []
    for rank in range(3):
        monkeypatch.setenv("ADAPTDL_NUM_REPLICAS", "3")
        monkeypatch.setenv("ADAPTDL_REPLICA_RANK", str(rank))
        context.reset()
        loader = adl.AdaptiveDataLoader(data, batch_size=6)
        assert loader.current_local_bsz == 2 and loader.current_batch_size == 6
        mine = []
        for (x,) in loader:
            mine.append(x.tolist())
            positions.append(loader.current_index)
        batches.append(mine)
    assert batches == [[[0, 3], [6, 9]], [[1, 4], [7, 0]], [[2, 5], [8, 1]]]
    assert positions == [0, 6] * 3  # before each batch is consumed
    assert loader.current_index == 0  # reset once the loop finished


# -- epochs ----------------------------------------------------------------------------------

def test_epoch_loops_continue_each_other():
    assert adl.current_epoch() is None and adl.finished_epochs() == 0
    seen = []
    for epoch in adl.remaining_epochs_until(3):
        assert adl.current_epoch() == epoch == adl.finished_epochs()
        seen.append(epoch)
    assert seen == [0, 1, 2]
    assert adl.current_epoch() is None and adl.finished_epochs() == 3
    assert list(adl.remaining_epochs_until(5)) == [3, 4]
    assert list(adl.remaining_epochs_until(4)) == []
    assert list(adl.remaining_epochs_until(0)) == []
    assert adl.finished_epochs() == 5


def test_leaving_the_body_counts_the_epoch_as_finished():
    for epoch in adl.remaining_epochs_until(10):
        if epoch == 1:
            break
    assert adl.finished_epochs() == 2 and adl.current_epoch() is None
    with pytest.raises(KeyError):
        for epoch in adl.remaining_epochs_until(10):
            raise KeyError(epoch)
    assert adl.finished_epochs() == 3 and adl.current_epoch() is None
    assert next(iter(adl.remaining_epochs_until(10))) == 3


def test_epoch_loop_is_lazy():
    loop = adl.remaining_epochs_until(2)
    assert adl.current_epoch() is None
    assert list(adl.remaining_epochs_until(1)) == [0]  # not nested: loop has not started
    assert list(loop) == [1]


def test_restart_replays_the_interrupted_epoch(ckpt_dir, restart):
    loop = adl.remaining_epochs_until(5)
    assert [next(loop), next(loop), next(loop)] == [0, 1, 2]
    checkpoint.save_all_states()  # interrupted inside epoch 2
    restart()
    loop.close()  # the old run's loop ends; it must not affect the restarted one
    assert adl.finished_epochs() == 2 and adl.current_epoch() is None
    assert list(adl.remaining_epochs_until(5)) == [2, 3, 4]


# -- Accumulator -----------------------------------------------------------------------------

def test_accumulator_update_forms():
    acc = adl.Accumulator()
    acc["a"] += 1
    acc["a"] += 2
    acc["b"] -= 5
    acc.update(c=1.5)
    acc.update({"a": 10})
    acc.subtract({"c": 0.5})
    acc.subtract(e=4)
    acc += {"d": 1}
    acc -= {"d": 3}
    with acc.synchronized() as same:
        assert same is acc
        assert dict(acc) == {"a": 13, "b": -5, "c": 1.0, "d": -2, "e": -4}


def test_accumulator_initial_contents_and_persistence():
    acc = adl.Accumulator({"a": 1}, b=2)
    acc["a"] += 1
    with acc.synchronized():
        assert dict(acc) == {"a": 2, "b": 2}
        acc["c"] = 10  # plain dict inside synchronized()
        acc["b"] += 1
        del acc["a"]
    acc["c"] += 5
    with acc.synchronized():
        assert dict(acc) == {"b": 3, "c": 15}
        acc.clear()
    with acc.synchronized():
        assert dict(acc) == {}


def test_accumulator_reads_in_accumulation_mode_are_empty():
    acc = adl.Accumulator({"a": 1})
    acc["b"] += 1
    assert len(acc) == 0
    assert list(acc) == [] and list(acc.keys()) == [] and list(acc.items()) == []
    assert "a" not in acc and "b" not in acc
    assert acc == {}
    assert repr(acc) == "Accumulator({})"
    with pytest.raises(KeyError):
        del acc["a"]
    with acc.synchronized():
        assert len(acc) == 2 and "a" in acc and acc == {"a": 1, "b": 1}
        assert acc.get("zzz") is None
        with pytest.raises(KeyError):
            acc["zzz"]
    assert len(acc) == 0


def test_accumulator_get_and_pop_in_accumulation_mode_behave_as_empty_dict():
    acc = adl.Accumulator({"a": 1})
    assert acc.get("a") is None
    assert acc.get("a", 7) == 7
    assert acc.pop("a", 7) == 7


def test_accumulator_setdefault_and_pop_by_mode():
    acc = adl.Accumulator({"a": 1})
    with pytest.raises(TypeError, match="synchronized"):
        acc.setdefault("a", 0)  # accumulation mode has only += and -=
    with pytest.raises(KeyError):
        acc.pop("a")
    with acc.synchronized():
        assert acc.setdefault("b", 5) == 5 and acc.setdefault("a", 0) == 1
        assert acc.pop("a") == 1 and acc.pop("a", None) is None
    with acc.synchronized():
        assert dict(acc) == {"b": 5}


def test_accumulator_nested_synchronized():
    acc = adl.Accumulator()
    acc["x"] += 1
    with acc.synchronized():
        with acc.synchronized() as inner:
            assert inner["x"] == 1
        assert acc["x"] == 1  # still synchronized after the inner block
    assert len(acc) == 0


def test_accumulator_numpy_and_tensor_values():
    acc = adl.Accumulator()
    for _ in range(3):
        acc["t"] += torch.ones(2)
        acc["arr"] += np.arange(3)
        acc["np"] += np.float32(0.5)
    with acc.synchronized():
        assert torch.equal(acc["t"], torch.full((2,), 3.0))
        assert acc["arr"].tolist() == [0, 3, 6]
        assert acc["np"] == pytest.approx(1.5)


def test_accumulators_are_restored_after_a_restart(ckpt_dir, restart):
    acc = adl.Accumulator()
    acc["n"] += 4
    other = adl.Accumulator()
    other["m"] += 1
    checkpoint.save_all_states()  # pending updates are summed into the checkpoint
    restart()
    acc, other = adl.Accumulator(), adl.Accumulator()  # matched by creation order
    acc["n"] += 1
    with acc.synchronized(), other.synchronized():
        assert dict(acc) == {"n": 5}
        assert dict(other) == {"m": 1}


def _run_until_interrupted_after_sync(seen, valid):
    """One run of a program: an epoch whose metrics block runs, then a later loop that is
    interrupted (checkpointed) before the epoch ends."""
    acc = adl.Accumulator()
    loop = adl.remaining_epochs_until(2)
    assert next(loop) == 0
    if not seen:  # the training loop runs only before the first restart
        acc["loss"] += 3
        acc["n"] += 2
    with acc.synchronized():
        seen.append(dict(acc))
        acc.clear()
    acc["valid"] += valid
    checkpoint.save_all_states()
    return loop


def test_synchronized_block_replays_after_a_restart(ckpt_dir, restart):
    seen = []
    loop = _run_until_interrupted_after_sync(seen, valid=1)
    restart()
    loop.close()
    acc = adl.Accumulator()
    loop = adl.remaining_epochs_until(2)
    assert next(loop) == 0  # epoch 0 again
    assert adl.current_epoch() == 0
    with acc.synchronized():  # already ran before the restart: sees the same values
        seen.append(dict(acc))
        acc.clear()
    acc["valid"] += 2
    with acc.synchronized():  # new: the updates before and after the restart
        assert dict(acc) == {"valid": 3}
    assert seen == [{"loss": 3, "n": 2}] * 2
    assert list(loop) == [1]


def test_synchronized_block_replays_after_two_restarts(ckpt_dir, restart):
    seen = []
    loops = [_run_until_interrupted_after_sync(seen, valid=1)]
    for _ in range(2):
        restart()
        loops.append(_run_until_interrupted_after_sync(seen, valid=1))
    assert seen == [{"loss": 3, "n": 2}] * 3
