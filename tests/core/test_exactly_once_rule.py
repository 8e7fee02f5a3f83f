"""The padding rule of ``tests/exactly_once.py`` against the library's own sampler and
loader, in-process (each replica's shard iterated one rank after the other): 3 replicas
and sample counts that 3 does not divide, so that the padding is there."""

import pytest
import torch
from torch.utils.data import TensorDataset

import adaptdl_core.torch as adl
from adaptdl_core import context
from tests.exactly_once import assert_exactly_once, padding_allowance


def _shard(monkeypatch, replicas, rank, size, epoch, index):
    """Replica ``rank``'s sample indices of ``epoch`` from global position ``index``."""
    monkeypatch.setenv("ADAPTDL_NUM_REPLICAS", str(replicas))
    monkeypatch.setenv("ADAPTDL_REPLICA_RANK", str(rank))
    sampler = adl.ElasticSampler(list(range(size)), shuffle=True, seed=3)
    sampler.set_epoch(epoch, index)
    return list(sampler)


def _launch(monkeypatch, restart, replicas, size, epoch, index, positions=None):
    """Batch records of one launch: every rank's shard from ``index`` (its first
    ``positions // replicas`` samples when given: the launch stopped there)."""
    events = [{"event": "start", "restart": restart, "rank": rank, "replicas": replicas}
              for rank in range(replicas)]
    for rank in range(replicas):
        shard = _shard(monkeypatch, replicas, rank, size, epoch, index)
        if positions is not None:
            shard = shard[:positions // replicas]
        events.append({"event": "batch", "restart": restart, "rank": rank, "epoch": epoch,
                       "idx": shard})
    return events


def test_a_launch_of_3_replicas_pads_and_the_rule_allows_exactly_that(monkeypatch):
    size = 101
    # Epoch 0: 2 replicas train 40 positions, then 3 replicas the remaining 61, padded
    # to 63 (two repeats); epoch 1: 3 replicas from the start, padded to 102 (one).
    events = (_launch(monkeypatch, 0, 2, size, 0, 0, positions=40)
              + _launch(monkeypatch, 1, 3, size, 0, 40)
              + _launch(monkeypatch, 1, 3, size, 1, 0))
    repeats = {epoch: sum(len(e["idx"]) for e in events
                          if e["event"] == "batch" and e["epoch"] == epoch) - size
               for epoch in (0, 1)}
    assert repeats == {0: 2, 1: 1}
    assert padding_allowance(events) == {(0, 0): 1 + 2, (1, 0): 2}
    assert_exactly_once(events, size, 2)

    # More repeats than the rule allows, a missing sample, or the same padding counted
    # against 2 replicas instead of 3: each fails.
    extra = [e for e in events if e["event"] == "batch" and e["epoch"] == 1]
    extra[0] = dict(extra[0], idx=extra[0]["idx"] + extra[1]["idx"][:2])
    with pytest.raises(AssertionError, match="3 repeated samples, the padding rule allows 2"):
        assert_exactly_once([e for e in events if e.get("epoch") != 1] + extra, size, 2)
    short = [dict(e, idx=e["idx"][1:]) if e["event"] == "batch" and e["rank"] == 1
             and e["restart"] == 1 and e["epoch"] == 1 else e for e in events]
    with pytest.raises(AssertionError, match="epoch 1: samples missing"):
        assert_exactly_once(short, size, 2)
    # 100 samples on 3 replicas: two repeats, more than a 2-replica launch may pad.
    alone = _launch(monkeypatch, 0, 3, 100, 0, 0)
    assert_exactly_once(alone, 100, 1)
    as_two = [dict(e, replicas=2) for e in alone if e["rank"] < 2]
    as_two[-1] = dict(as_two[-1], idx=as_two[-1]["idx"] + alone[-1]["idx"])  # rank 2's
    with pytest.raises(AssertionError, match="2 repeated samples, the padding rule allows 1"):
        assert_exactly_once(as_two, 100, 1)


def test_the_loader_on_3_replicas_repeats_only_the_padding(monkeypatch):
    """The adaptive loader itself (8,192 samples, batch 8 per replica): one repeat per
    epoch, allowed; with the padding dropped, none."""
    size, events, dropped = 8192, [], []
    dataset = TensorDataset(torch.arange(size))
    monkeypatch.setenv("ADAPTDL_NUM_REPLICAS", "3")
    for rank in range(3):
        monkeypatch.setenv("ADAPTDL_REPLICA_RANK", str(rank))
        context.reset()
        loader = adl.AdaptiveDataLoader(dataset, batch_size=24, shuffle=True)
        for epoch in range(2):
            for (x,) in loader:
                events.append({"event": "batch", "epoch": epoch, "rank": rank,
                               "idx": x.tolist()})
                dropped.append({"event": "batch", "epoch": epoch, "rank": rank,
                                "idx": adl.drop_padding(x).tolist()})
    trained = sum(len(e["idx"]) for e in events)
    assert trained == 2 * (size + 1)  # 8,192 = 3 * 2,730 + 2: one repeat per epoch
    assert_exactly_once(events, size, 2)
    assert_exactly_once(dropped, size, 2, padded=False)
    with pytest.raises(AssertionError, match="padding rule allows 0"):
        assert_exactly_once(events, size, 2, padded=False)
