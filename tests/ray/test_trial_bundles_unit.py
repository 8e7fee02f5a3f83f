"""A trial on lost nodes, its side with fakes for Ray's placement group table, the replicas
and the storage: without room for a lost node's bundles it continues on the bundles Ray
still holds and grows back onto all of them when Ray places the rest again (the end-to-end
run is ``python benchmarks/node_loss.py --only trial-short``); its in-place checkpoints are
kept on the run's storage, where a new actor of the trial resumes from them."""

from __future__ import annotations

import pytest

pytest.importorskip("ray")

import ray  # noqa: E402

from tests.fake_clock import Clock  # noqa: E402

from adaptdl_ray.replicas import nodes  # noqa: E402
from adaptdl_ray.supervisor.in_place import InPlaceCheckpoints  # noqa: E402
from adaptdl_ray.tune import AdaptDLTrainableCreator  # noqa: E402
from adaptdl_ray.tune import trainable as trainable_mod  # noqa: E402


def train_fn(config):
    pass


class FakeTable:
    """``ray.util.placement_group_table`` of one group whose placed bundles a test sets."""

    def __init__(self, count, placed):
        self.count, self.placed, self.calls = count, list(placed), 0

    def __call__(self, pg):
        self.calls += 1
        return {"state": "CREATED" if len(self.placed) == self.count else "RESCHEDULING",
                "bundles_to_node_id": {i: ("node-a" if i in self.placed else "")
                                       for i in range(self.count)}}


class FakeGroup:
    """A started replica group of ``num_replicas`` that stops at a checkpoint."""

    def __init__(self, num_replicas, status="checkpointed"):
        self.num_replicas, self.status = num_replicas, status
        self.started, self.shut = True, False

    def stop(self, timeout_s):
        return [{"status": self.status}] * self.num_replicas

    def next_results(self, timeout_s):
        return [], True

    def checkpoint_archive(self, path=None):
        return b"newest"

    def shutdown(self):
        self.shut = True


@pytest.fixture
def table(monkeypatch):
    fake = FakeTable(3, [0, 1])
    monkeypatch.setattr(ray.util, "placement_group_table", fake)
    monkeypatch.setattr(ray.util, "get_current_placement_group", lambda: object())
    return fake


def make_trial(monkeypatch, min_replicas):
    """A trainable instance outside Tune, in a placement group of 3 bundles."""
    cls = AdaptDLTrainableCreator(train_fn, min_replicas=min_replicas, max_replicas=3)
    trial = object.__new__(cls)
    trial._trial_info = None  # trial_id "default"
    trial._control = None
    trial._new_trial({})
    monkeypatch.setattr(cls, "_replicas_wanted", lambda self: 3)
    started = []
    monkeypatch.setattr(cls, "_ensure_started",
                        lambda self, bundles=None: started.append(bundles))
    return trial, started


# -- in-place checkpoints kept on the run's storage ------------------------------------------
class SavingGroup(FakeGroup):
    """A group whose in-place save is taken at the boundary after report tag 1."""

    def __init__(self):
        super().__init__(1)
        self.saves = 0

    def save(self, timeout_s):
        self.saves += 1
        return {"taken": True, "path": "ckpt", "index": 2}

    def next_results(self, timeout_s):
        return [], False

    def checkpoint_archive(self, path=None):
        return None  # (what the replicas wrote is the worker's business)


def test_an_in_place_checkpoint_is_kept_on_the_storage_and_a_new_actor_resumes_there(
        tmp_path, monkeypatch):
    """Every interval the trial writes its in-place state beside Tune's checkpoints, with
    the reports made before it and not yet returned; a new trial actor of the same trial
    (Tune's retry after its node was lost) takes it, being newer than Tune's checkpoint."""
    import pyarrow.fs

    from adaptdl_ray.replicas import _ray_private
    from adaptdl_ray.tune import checkpoint_files
    from adaptdl_ray.tune.trial_progress import PendingReport
    storage = _ray_private.StorageInfo(pyarrow.fs.LocalFileSystem(), str(tmp_path / "trial"),
                                       None, "exp")
    trial, _ = make_trial(monkeypatch, min_replicas=1)
    trial._storage_info = storage
    trial._group = group = SavingGroup()
    trial._queue.extend([PendingReport({"acc": 1}, 1), PendingReport({"acc": 2}, 2)])
    trial._progress.iteration = 5
    clock = Clock()
    trial._in_place = InPlaceCheckpoints(10.0, 1.0, name="trial default", clock=clock)
    trial._in_place.restart()
    trial._save_in_place_if_due()
    assert group.saves == 0  # not due yet
    clock.now = 10.0  # due
    trial._save_in_place_if_due()
    assert group.saves == 1
    progress, _, _ = checkpoint_files.read_interrupted(storage)
    assert progress.seq == 1 and progress.iteration == 5
    assert [r.metrics for r in progress.pending] == [{"acc": 1}]  # made before the save
    assert len(trial._queue) == 2  # still returned to Tune as usual
    clock.now = 19.0
    trial._save_in_place_if_due()
    assert group.saves == 1  # not due again before the interval

    again, _ = make_trial(monkeypatch, min_replicas=1)
    again._storage_info = storage
    monkeypatch.setattr(_ray_private, "set_trainable_counters", lambda *a, **k: None)
    again._adopt_interrupted_state()
    assert again._progress.seq == 1
    assert [r.metrics for r in again._queue] == [{"acc": 1}]
