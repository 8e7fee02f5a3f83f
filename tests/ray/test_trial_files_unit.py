"""The pieces of an AdaptDL trial that need no Ray cluster: its result rows, its record,
its checkpoint files, the interrupt relay and the Ray-internals seam."""

from __future__ import annotations

import json
import os
import signal
import zlib

import pytest

pytest.importorskip("ray.tune")
import torch  # noqa: E402

from adaptdl_core import checkpoint  # noqa: E402
from adaptdl_ray.replicas import transfer  # noqa: E402
from adaptdl_ray.tune import checkpoint_files, model_state_dict  # noqa: E402
from adaptdl_ray.tune.interrupts import InterruptRelay, unsaved_trials  # noqa: E402
from adaptdl_ray.tune.results import (METRIC_PREFIX, RESIZE_PHASES, STATUS_KEYS,  # noqa: E402
                                      order_like, result_row)
from adaptdl_ray.tune.trial_progress import PendingReport, TrialProgress  # noqa: E402


# -- result rows --------------------------------------------------------------------------
def test_every_result_lists_every_adaptdl_key_in_the_same_order():
    first = result_row({"acc": 0.5}, {"replicas": 1}, launch_s=0.0, resize_s=0.0,
                       phases=None)
    later = result_row({"acc": 0.7}, {"replicas": 2, "restarts": 1}, launch_s=4.0,
                       resize_s=3.5, phases={"checkpoint_s": 0.5, "first_step_s": 1.0})
    assert list(first) == list(later)
    expected = ["acc"] + [METRIC_PREFIX + k for k in STATUS_KEYS] + \
        [METRIC_PREFIX + "launch_s", METRIC_PREFIX + "resize_s"] + \
        [f"{METRIC_PREFIX}resize/{p}" for p in RESIZE_PHASES]
    assert list(first) == expected
    assert later[METRIC_PREFIX + "resize/checkpoint_s"] == 0.5
    assert first[METRIC_PREFIX + "resize/checkpoint_s"] == 0.0
    assert "adaptdl/hints" not in first  # hints travel beside the results


def test_order_like_keeps_the_first_results_order():
    assert list(order_like({"b": 1, "a": 2, "new": 3}, ["a", "b"])) == ["a", "b", "new"]


# -- the trial's record -----------------------------------------------------------------
def test_trial_progress_round_trip_keeps_pending_reports_apart_from_their_files():
    progress = TrialProgress(seq=3, restarts=2, iteration=7, time_total_s=12.5,
                             schema=["acc", "adaptdl/replicas"],
                             pending=[PendingReport({"acc": 1.0}, 1, b"USERFILES"),
                                      PendingReport({"acc": 2.0}, 2)])
    text = progress.to_json()
    assert "USERFILES" not in text
    back = TrialProgress.from_json(text)
    assert (back.seq, back.restarts, back.iteration, back.time_total_s) == (3, 2, 7, 12.5)
    assert [p.metrics for p in back.pending] == [{"acc": 1.0}, {"acc": 2.0}]
    assert TrialProgress.pending_flags(text) == [True, False]
    with pytest.raises(ValueError, match="malformed"):
        TrialProgress.from_json(json.dumps({"pending": [{"tag": 1}]}))


# -- checkpoint files -------------------------------------------------------------------
def _core_checkpoint(tmp_path, weights):
    """A fake adaptdl_core checkpoint holding an AdaptiveDataParallel state."""
    root = tmp_path / "core"
    ckpt = root / "checkpoint-4"
    ckpt.mkdir(parents=True)
    torch.save({"model": weights, "optimizer": {}}, ckpt / "adaptdl-dataparallel")
    data = (ckpt / "adaptdl-dataparallel").read_bytes()
    # Every checkpoint carries a manifest (sizes and checksums: adaptdl_core.checkpoint).
    (ckpt / "MANIFEST.json").write_text(json.dumps({
        "states": ["adaptdl-dataparallel"],
        "files": {"adaptdl-dataparallel": {"size": len(data), "crc32": zlib.crc32(data)}}}))
    assert checkpoint.verify_checkpoint(str(ckpt)) is not None
    return transfer.pack_latest_checkpoint(str(root))


def test_checkpoint_layout_round_trip_and_model_state_dict(tmp_path):
    weights = {"w": torch.arange(4.0)}
    state = _core_checkpoint(tmp_path, weights)
    user_dir = tmp_path / "user"
    user_dir.mkdir()
    (user_dir / "model.pt").write_bytes(b"user bytes")
    user = transfer.pack_entries(str(user_dir), ["model.pt"])
    progress = TrialProgress(seq=1, pending=[PendingReport({"k": 1}, 0, user)])
    out = tmp_path / "ckpt"
    checkpoint_files.write(str(out), progress, state, user)
    assert (out / "model.pt").read_bytes() == b"user bytes"  # the user's files, as reported
    assert sorted(os.listdir(out)) == [".adaptdl", "model.pt"]
    back, state2, user2 = checkpoint_files.read(str(out))
    assert back.seq == 1 and back.pending[0].user_checkpoint == user
    assert state2 is not None and user2 is not None
    assert torch.equal(model_state_dict(str(out))["w"], weights["w"])
    with pytest.raises(ValueError, match="no AdaptiveDataParallel state named 'other'"):
        model_state_dict(str(out), name="other")
    with pytest.raises(ValueError, match="checkpoint_at_end"):
        model_state_dict(None)
    with pytest.raises(ValueError, match="not an AdaptDL trial checkpoint"):
        checkpoint_files.read(str(user_dir))


def test_interrupted_state_is_written_atomically_to_the_trial_storage(tmp_path):
    import pyarrow.fs

    from adaptdl_ray.replicas._ray_private import StorageInfo
    storage = StorageInfo(pyarrow.fs.LocalFileSystem(), str(tmp_path / "trial"), None, None)
    assert checkpoint_files.read_interrupted(storage) is None
    state = _core_checkpoint(tmp_path, {"w": torch.ones(2)})
    for seq in (1, 2):
        checkpoint_files.write_interrupted(storage, TrialProgress(seq=seq), state, None)
    assert sorted(os.listdir(tmp_path / "trial")) == [checkpoint_files.INTERRUPTED_FILE]
    progress, state2, user = checkpoint_files.read_interrupted(storage)
    assert progress.seq == 2 and state2 is not None and user is None


# -- the interrupt relay ----------------------------------------------------------------
def test_the_first_signal_is_held_until_release_and_the_second_goes_through():
    calls = []
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, lambda s, f: calls.append("tune"))
    try:
        now = [0.0]
        relay = InterruptRelay(clock=lambda: now[0])
        assert relay.install()
        signal.raise_signal(signal.SIGINT)
        assert relay.requested_at == 0.0 and calls == []  # held back
        signal.raise_signal(signal.SIGINT)  # a second one goes to Tune's handler
        assert calls == ["tune"]
        relay.release()
        assert calls == ["tune", "tune"]
        relay.release()  # once only
        assert calls == ["tune", "tune"]
        # A signal long after the run's last hook call is not held back.
        idle = InterruptRelay(clock=lambda: now[0])
        idle.install()
        now[0] += 60
        signal.raise_signal(signal.SIGINT)
        assert idle.requested_at is None and calls == ["tune"] * 3
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def test_sigterm_is_held_like_ctrl_c_and_handed_to_tunes_graceful_stop():
    calls = []
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, lambda s, f: calls.append(s))
    try:
        relay = InterruptRelay()
        relay.install()
        signal.raise_signal(signal.SIGTERM)
        assert relay.requested_at is not None and calls == []
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # a second one kills
        relay.release()
        assert calls == [signal.SIGINT]  # Tune's graceful stop
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def test_an_interrupt_waits_for_every_trial_inside_a_save_or_not_yet_acknowledged():
    """Once, a trial caught inside an ordinary Tune save (a user checkpoint) counted as
    saved, Tune stopped before that checkpoint was recorded, and the restore trained the
    epoch again. A save in flight always holds the stop; a running trial holds it until it
    acknowledged; a paused or finished trial with no save in flight does not."""
    trials = [("saving", "RUNNING", True), ("pausing", "PAUSED", True),
              ("training", "RUNNING", False), ("acked", "RUNNING", False),
              ("acked-saving", "RUNNING", True), ("paused", "PAUSED", False),
              ("done", "TERMINATED", False), ("pending", "PENDING", False)]
    assert unsaved_trials(trials, ["acked", "acked-saving"]) == {
        "saving", "pausing", "training", "acked-saving"}
    finished = [(t, "PAUSED" if s == "RUNNING" else s, False) for t, s, _ in trials]
    assert unsaved_trials(finished, []) == set()


# -- the Ray-internals seam -------------------------------------------------------------
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Ray's V2 migration notices
def test_replica_session_serves_tunes_public_context_api():
    from ray import tune

    from adaptdl_ray.replicas import _ray_private
    reports = []
    session = _ray_private.ReplicaSession(
        lambda m, c: reports.append((m, c)),
        {"trial_name": "t_0", "trial_id": "abc", "experiment_name": "exp",
         "trial_dir": "/tmp/t"},
        {"world_rank": 1, "world_size": 2, "local_rank": 1, "local_world_size": 2,
         "node_rank": 0})
    _ray_private.install_replica_session(session)
    try:
        ctx = tune.get_context()
        assert (ctx.get_trial_name(), ctx.get_trial_id(), ctx.get_trial_dir()) == \
            ("t_0", "abc", "/tmp/t")
        assert (ctx.get_world_rank(), ctx.get_world_size(), ctx.get_local_rank(),
                ctx.get_local_world_size(), ctx.get_node_rank()) == (1, 2, 1, 2, 0)
        tune.report({"x": 1})
        assert reports == [({"x": 1}, None)]
        assert tune.get_checkpoint() is None
        import ray.train
        train_ctx = ray.train.get_context()
        assert (train_ctx.get_world_rank(), train_ctx.get_world_size()) == (1, 2)
    finally:
        _ray_private.clear_replica_session()


def test_trainable_counters_are_set_and_checked():
    from adaptdl_ray.replicas import _ray_private

    class Fake:
        pass

    fake = Fake()
    _ray_private.set_trainable_counters(fake, iteration=5, time_total_s=2.5)
    assert (fake._iteration, fake._time_total) == (5, 2.5)
    with pytest.raises(ValueError):
        _ray_private.set_trainable_counters(fake, iteration=-1, time_total_s=0.0)
    assert _ray_private.trial_storage(fake) is None



def test_a_jobs_storage_directory_gives_its_weights(tmp_path):
    """A command-line job keeps its checkpoints where adaptdl_core.torch.model_state_dict
    looks (the storage directory itself is enough)."""
    from adaptdl_ray.cluster.job_files import JobFiles
    weights = {"w": torch.arange(5.0)}
    files = JobFiles("j", tmp_path / "storage")
    files.store_checkpoint(_core_checkpoint(tmp_path, weights))
    assert torch.equal(model_state_dict(str(files.root))["w"], weights["w"])


def test_tune_result_counts_orders_and_asks_for_the_final_state():
    """A trial's results: counted in its record, keys in the first result's order, a user
    checkpoint asks Tune to checkpoint, the last report of a trial that never checkpointed
    carries the final state, and after a failure no report asks for a checkpoint."""
    from ray.tune.result import DONE, SHOULD_CHECKPOINT, TIME_THIS_ITER_S

    from adaptdl_ray.tune.trial_progress import PendingReport, TrialProgress
    progress = TrialProgress()
    first = progress.tune_result(PendingReport({"b": 1, "a": 2, TIME_THIS_ITER_S: 0.5}),
                                 final=False, failed=False)
    assert list(first)[:2] == ["b", "a"] and first[SHOULD_CHECKPOINT] is False
    second = progress.tune_result(PendingReport({"a": 3, "b": 4, TIME_THIS_ITER_S: 0.25}),
                                  final=True, failed=False)
    assert list(second)[:2] == ["b", "a"]
    assert second[SHOULD_CHECKPOINT] is True and second[DONE] is True  # the final state
    assert (progress.iteration, progress.time_total_s) == (2, 0.75)
    user = progress.tune_result(PendingReport({"a": 5, "b": 6, TIME_THIS_ITER_S: 0.1},
                                              user_checkpoint=b"tar"),
                                final=False, failed=False)
    assert user[SHOULD_CHECKPOINT] is True and progress.user_checkpoints == 1
    after_user = progress.tune_result(PendingReport({"a": 7, "b": 8, TIME_THIS_ITER_S: 0.1}),
                                      final=True, failed=False)
    assert after_user[SHOULD_CHECKPOINT] is False  # the user's checkpoints are the trial's
    failed = progress.tune_result(PendingReport({"a": 9, "b": 0, TIME_THIS_ITER_S: 0.1},
                                                user_checkpoint=b"tar"),
                                  final=False, failed=True)
    assert failed[SHOULD_CHECKPOINT] is False
