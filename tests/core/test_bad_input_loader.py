"""Bad input to the adaptive data loader: each case fails at the call with an
error naming the argument, the value and the fix, or is a documented behaviour; none
hangs or silently loses samples. In-process, without a process group.
"""

import logging
import threading

import pytest
import torch
from torch.utils.data import IterableDataset, TensorDataset

import adaptdl_core.torch as adl
from adaptdl_core import checkpoint, collective
from adaptdl_core.torch.batch_control import BatchSizeController
from tests.exactly_once import assert_exactly_once


def dataset(n):
    return TensorDataset(torch.arange(n, dtype=torch.float32))


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(4))


def run_with_deadline(fn, seconds=20):
    """Run ``fn`` in a thread; fail (instead of hanging the suite) if it spins."""
    outcome = {}

    def target():
        try:
            outcome["value"] = fn()
        except BaseException as exc:  # (reported to the test below)
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s: it hangs"
    return outcome


# -- drop_last smaller than one batch ----------------------------------------------------

def test_drop_last_with_fewer_samples_than_a_batch_is_refused_at_construction():
    # 10 samples, batch_size=16, drop_last=True, autoscale_batch_size(64)
    # once spun for ever; a fixed batch ran epochs of 0 steps. Both stop at the loader.
    with pytest.raises(ValueError) as info:
        adl.AdaptiveDataLoader(dataset(10), batch_size=16, drop_last=True)
    text = str(info.value)
    assert "batch_size=16" in text and "drop_last=True" in text and "only 10 samples" in text
    assert "batch_size <= 10" in text and "drop_last=False" in text
    assert checkpoint.state_names() == []


def test_drop_last_with_exactly_one_batch_of_samples_is_fine():
    loader = adl.AdaptiveDataLoader(dataset(16), batch_size=16, drop_last=True)
    assert [len(x) for (x,) in loader] == [16]


def test_autoscale_past_the_dataset_with_drop_last_is_refused():
    loader = adl.AdaptiveDataLoader(dataset(10), batch_size=4, drop_last=True)
    with pytest.raises(ValueError) as info:
        loader.autoscale_batch_size(64)
    text = str(info.value)
    assert "max_batch_size=64" in text and "10 samples" in text and "<= 10" in text
    assert loader.max_batch_size is None  # nothing changed
    loader.autoscale_batch_size(10)  # within the dataset: accepted


def test_autoscale_past_the_dataset_without_drop_last_is_accepted():
    # (The last batch of a pass is then partial, but every pass makes progress.)
    loader = adl.AdaptiveDataLoader(dataset(10), batch_size=4)
    loader.autoscale_batch_size(64)
    assert loader.max_batch_size == 64


def test_a_pass_whose_every_batch_is_dropped_raises_instead_of_spinning(monkeypatch):
    # Two replicas get 5 of 10 samples per pass; a micro-batch lower bound of 6 makes
    # every batch too large for the share. Once an endless loop of empty passes.
    monkeypatch.setenv("ADAPTDL_NUM_REPLICAS", "2")
    monkeypatch.setenv("ADAPTDL_REPLICA_RANK", "0")
    monkeypatch.setattr(collective, "broadcast", lambda value: value)  # (no group here)
    loader = adl.AdaptiveDataLoader(dataset(10), batch_size=4, drop_last=True)
    loader.autoscale_batch_size(8, local_bsz_bounds=(6, None))
    assert loader.current_local_bsz == 6

    outcome = run_with_deadline(lambda: [b for b in loader])
    error = outcome.get("error")
    assert isinstance(error, RuntimeError), outcome
    text = str(error)
    assert "drop_last=True drops every batch" in text
    assert "2 replicas gets 5 of the 10 samples" in text and "local batch of 6" in text
    assert "drop_last=False" in text


# -- shuffle and drop_last must be bools -------------------------------------------------

@pytest.mark.parametrize("key", ["shuffle", "drop_last"])
@pytest.mark.parametrize("bad", ["no", "False", 1, 0, None])
def test_shuffle_and_drop_last_must_be_bools(key, bad):
    with pytest.raises(ValueError) as info:
        adl.AdaptiveDataLoader(dataset(8), batch_size=2, **{key: bad})
    assert f"{key}={bad!r}" in str(info.value) and "True or False" in str(info.value)
    assert checkpoint.state_names() == []


def test_shuffle_no_once_shuffled():
    loader = adl.AdaptiveDataLoader(dataset(8), batch_size=8, shuffle=False)
    assert [x.tolist() for (x,) in loader] == [list(map(float, range(8)))]


@pytest.mark.parametrize("bad", ["no", 1])
def test_elastic_sampler_shuffle_must_be_a_bool(bad):
    with pytest.raises(ValueError, match=r"ElasticSampler\(shuffle="):
        adl.ElasticSampler(list(range(4)), shuffle=bad)


# -- local_bsz_bounds honoured or refused ------------------------------------------------

def test_bounds_that_cannot_make_the_batch_without_accumulation_are_refused():
    # local_bsz_bounds=(1, 2) with batch 32 once handed out local batches of 16 and 32.
    loader = adl.AdaptiveDataLoader(dataset(256), batch_size=32)
    with pytest.raises(ValueError) as info:
        loader.autoscale_batch_size(64, local_bsz_bounds=(1, 2))
    text = str(info.value)
    assert "local_bsz_bounds=(1, 2)" in text and "batch_size 32" in text
    assert "local batches of 32" in text and "gradient_accumulation=True" in text
    assert loader.max_batch_size is None


def test_bounds_with_accumulation_are_honoured_from_the_first_batch():
    loader = adl.AdaptiveDataLoader(dataset(256), batch_size=32)
    loader.autoscale_batch_size(64, local_bsz_bounds=(1, 2), gradient_accumulation=True)
    assert (loader.current_local_bsz, loader.accumulation_steps) == (2, 15)
    assert loader.current_batch_size == 32
    sizes = {len(x) for i, (x,) in zip(range(40), loader)}
    assert sizes == {2}


def test_bounds_above_the_initial_batch_raise_the_local_batch():
    loader = adl.AdaptiveDataLoader(dataset(256), batch_size=4)
    loader.autoscale_batch_size(64, local_bsz_bounds=(8, 16))
    assert loader.current_local_bsz == 8  # the lower bound is honoured (not 4)


@pytest.mark.parametrize("batch,replicas,hi,expected", [
    (32, 1, 2, (2, 15)),    # 16 micro-batches of 2
    (32, 1, 12, (11, 2)),   # 3 of 11 (33): the fewest micro-batches, the least excess
    (32, 2, 8, (8, 1)),     # 16 per replica: 2 of 8
    (32, 4, 8, (8, 0)),     # fits without accumulation
])
def test_initial_choice_within_the_upper_bound_accumulates(batch, replicas, hi, expected):
    control = BatchSizeController(batch, 1, replicas, max_batch_size=64,
                                  local_bsz_bounds=(None, hi), gradient_accumulation=True)
    assert control.initial_choice() == expected
    assert control.fits(*expected)
    local, accum = expected
    assert local <= hi and local * (accum + 1) * replicas >= batch


def test_fits_checks_bounds_and_accumulation():
    control = BatchSizeController(32, 1, 1, max_batch_size=64, local_bsz_bounds=(4, 16))
    assert control.fits(4, 0) and control.fits(16, 0)
    assert not control.fits(2, 0) and not control.fits(32, 0) and not control.fits(None, 0)
    assert not control.fits(8, 1)  # no gradient accumulation allowed


# -- iterable datasets point at ElasticLoop ----------------------------------------------

def test_iterable_dataset_error_names_elastic_loop():
    with pytest.raises(ValueError) as info:
        adl.AdaptiveDataLoader(Stream(), batch_size=2)
    assert "iterable" in str(info.value) and "ElasticLoop" in str(info.value)


# -- a checkpoint resumed with another dataset length ------------------------------------

def interrupted_loop(n, stop_after):
    """Consume ``stop_after`` batches of 8 of a fresh loader over ``n`` samples and
    checkpoint there (the position of an interrupted loop)."""
    loader = adl.AdaptiveDataLoader(dataset(n), batch_size=8)
    for i, _ in enumerate(loader):
        if i == stop_after:  # (the batch handed out now is not consumed yet)
            checkpoint.save_all_states()
            break
    return loader


@pytest.mark.parametrize("new_n", [16, 128])
def test_resume_mid_loop_with_another_dataset_length_is_refused(ckpt_dir, restart, new_n):
    interrupted_loop(64, stop_after=5)  # 40 of 64 samples done
    restart()
    with pytest.raises(checkpoint.CheckpointError) as info:
        adl.AdaptiveDataLoader(dataset(new_n), batch_size=8)
    text = str(info.value)
    assert "40 samples into a loop" in text and "dataset of 64 samples" in text
    assert f"this run's dataset has {new_n}" in text
    assert "same dataset" in text and "empty checkpoint directory" in text


def test_resume_mid_loop_with_the_same_dataset_continues(ckpt_dir, restart):
    interrupted_loop(64, stop_after=5)
    restart()
    loader = adl.AdaptiveDataLoader(dataset(64), batch_size=8)
    assert [int(x[0]) for (x,) in loader] == [40, 48, 56]


def test_resume_between_loops_with_another_dataset_length_uses_it(ckpt_dir, restart,
                                                                   caplog):
    # The stated rule: with no loop in progress no sample can be skipped or repeated.
    loader = adl.AdaptiveDataLoader(dataset(64), batch_size=8)
    for _ in loader:
        pass
    checkpoint.save_all_states()
    restart()
    with caplog.at_level(logging.WARNING, logger="adaptdl_core.torch.data"):
        loader = adl.AdaptiveDataLoader(dataset(16), batch_size=8)
    assert "the dataset has 16 samples, the checkpoint's had 64" in caplog.text
    assert sum(len(x) for (x,) in loader) == 0  # (the replayed loop finished before)
    assert sum(len(x) for (x,) in loader) == 16


# -- padding of the last batch (whole-set metrics) ----------------------------------------

@pytest.mark.parametrize("replicas", [1, 2, 3, 4])
@pytest.mark.parametrize("n,batch", [(10, 4), (13, 6), (16, 8), (7, 1)])
def test_drop_padding_leaves_each_sample_exactly_once(monkeypatch, replicas, n, batch):
    # Each replica's shard, iterated here one rank after the other: without the padding
    # the shards are the dataset, each sample once.
    monkeypatch.setenv("ADAPTDL_NUM_REPLICAS", str(replicas))
    events, padded = [], 0
    for rank in range(replicas):
        monkeypatch.setenv("ADAPTDL_REPLICA_RANK", str(rank))
        restart_context()
        loader = adl.AdaptiveDataLoader(dataset(n), batch_size=batch, shuffle=True)
        for batch_ in loader:
            (x,) = adl.drop_padding(batch_)
            padded += loader.batch_padding
            events.append({"event": "batch", "epoch": 0, "rank": rank,
                           "idx": [int(i) for i in x.tolist()]})
    assert_exactly_once(events, n, 1, padded=False)
    shares = -(-n // replicas) * replicas
    assert padded == shares - n  # (the padding exists when n does not divide evenly)


def restart_context():
    from adaptdl_core import context
    context.reset()


def test_drop_padding_cuts_fields_of_every_kind(monkeypatch):
    monkeypatch.setenv("ADAPTDL_NUM_REPLICAS", "2")
    monkeypatch.setenv("ADAPTDL_REPLICA_RANK", "1")
    loader = adl.AdaptiveDataLoader(dataset(3), batch_size=4)  # rank 1: [1, pad]
    for batch in loader:
        x = batch[0]
        assert loader.batch_padding == 1
        assert adl.drop_padding(x).tolist() == [1.0]
        assert adl.drop_padding({"x": x, "y": [x]})["y"][0].tolist() == [1.0]
        assert adl.drop_padding((x.numpy(),))[0].tolist() == [1.0]
        with pytest.raises(TypeError, match="cannot cut the 1 padded samples from a str"):
            adl.drop_padding("abc")
    assert loader.batch_padding == 0  # outside its loop


def test_drop_padding_outside_a_loop_raises():
    with pytest.raises(RuntimeError, match="inside a loop over an AdaptiveDataLoader"):
        adl.drop_padding(torch.zeros(2))
