"""The pieces of a submitted job that need no cluster: its files under the storage path,
the local sizer, the replicas' script runner and the job options."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import zlib
from pathlib import Path

import pytest

from adaptdl_core.checkpoint import CheckpointError
from adaptdl_core.decision import JobSpec, NodeInfo
from adaptdl_ray.cluster import elastic_job
from adaptdl_ray.cluster.job_files import JobFiles, check_name
from adaptdl_ray.cluster.sizing import LocalSizer
from adaptdl_ray.tune import transfer


def make_checkpoint(root: Path, seq: int, *, finished: bool = False, damaged: bool = False
                    ) -> Path:
    """An intact (or damaged) checkpoint ``root/checkpoint-<seq>`` with one state."""
    path = root / f"checkpoint-{seq}"
    path.mkdir(parents=True)
    data = json.dumps(seq).encode()
    (path / "s").write_bytes(data + (b"x" if damaged else b""))
    (path / "MANIFEST.json").write_text(json.dumps({
        "format": 2, "states": ["s"], "num_restarts": seq,
        "files": {"s": {"size": len(data), "crc32": zlib.crc32(data)}},
        "summary": {"adaptdl-epoch": {"finished_epochs": seq, "finished": finished}}}))
    return path


def test_store_checkpoint_keeps_the_newest_and_one_fallback(tmp_path):
    files = JobFiles("j", tmp_path / "store")
    src = tmp_path / "src"
    for seq in range(4):
        path = make_checkpoint(src, seq)
        files.store_checkpoint(transfer.pack_dir(str(path), path.name))
    assert sorted(p.name for p in files.checkpoint_path.iterdir()) == \
        ["checkpoint-2", "checkpoint-3"]
    point = files.resume_point()
    assert point.restarts == 3 and point.finished_epochs == 3 and not point.finished
    assert files.latest_checkpoint().endswith("checkpoint-3")


def test_store_checkpoint_refuses_damage_and_foreign_archives(tmp_path):
    files = JobFiles("j", tmp_path / "store")
    bad = make_checkpoint(tmp_path / "src", 0, damaged=True)
    with pytest.raises(CheckpointError):
        files.store_checkpoint(transfer.pack_dir(str(bad), bad.name))
    (tmp_path / "other").mkdir()
    with pytest.raises(ValueError, match="one checkpoint-<seq> directory"):
        files.store_checkpoint(transfer.pack_dir(str(tmp_path / "other"), "other"))
    assert files.latest_checkpoint() is None  # nothing half-stored


def test_records_and_names(tmp_path):
    files = JobFiles("j", tmp_path)
    assert files.read_status() is None and not files.exists()
    files.write_status({"status": "running"})
    assert files.read_status()["status"] == "running" and "updated" in files.read_status()
    for bad in ("", "-x", "a/b", "a" * 64, None):
        with pytest.raises(ValueError, match="not valid"):
            check_name(bad)


def test_local_sizer_starts_within_bounds_and_keeps_the_jobs_record(tmp_path):
    nodes = {"n0": NodeInfo({"CPU": 3.0})}
    spec = JobSpec({"CPU": 1.0}, min_replicas=2, max_replicas=8)
    clock = iter(range(1000, 2000, 10)).__next__
    sizer = LocalSizer("j", spec, state_dir=str(tmp_path), nodes_fn=lambda: nodes,
                       clock=lambda: float(clock()))
    # A job nobody has profiled starts at its min_replicas, and keeps that size until it
    # reports a profile.
    assert sizer.start() == 2
    created = sizer.core.record("j").created
    sizer.observe(2)
    decision = sizer.decision()
    assert (decision.action, decision.replicas, decision.nodes) == ("keep", 2, ("n0", "n0"))
    sizer.end()
    again = LocalSizer("j", spec, state_dir=str(tmp_path), nodes_fn=lambda: nodes,
                       clock=lambda: float(clock()))
    again.start()
    assert again.core.record("j").created == created  # its age survives a new submission


def test_local_sizer_refuses_a_cluster_too_small(tmp_path):
    sizer = LocalSizer("j", JobSpec({"CPU": 1.0}, min_replicas=4), nodes_fn=lambda: {
        "n0": NodeInfo({"CPU": 2.0})})
    with pytest.raises(ValueError):
        sizer.start()


def test_run_script_runs_it_as_main_with_its_arguments(tmp_path, monkeypatch):
    out = tmp_path / "out.json"
    script = tmp_path / "s.py"
    script.write_text("import sys, json, helper\n"
                      "if __name__ == '__main__':\n"
                      f"    json.dump(sys.argv, open({str(out)!r}, 'w'))\n"
                      "    sys.exit(int(sys.argv[1]))\n")
    (tmp_path / "helper.py").write_text("")  # imported from the script's own directory
    argv = list(sys.argv)
    elastic_job.run_script({"script": str(script), "args": ["0", "--x"]})
    assert json.loads(out.read_text()) == [str(script), "0", "--x"]
    assert sys.argv == argv
    monkeypatch.delitem(sys.modules, "helper", raising=False)
    with pytest.raises(RuntimeError, match="exited with status 3"):
        elastic_job.run_script({"script": str(script), "args": ["3"]})


def test_job_spec_from_options():
    parser = argparse.ArgumentParser()
    elastic_job.add_job_arguments(parser)
    spec = elastic_job.job_spec(parser.parse_args(
        ["--name", "j", "--min-replicas", "2", "--max-replicas", "4", "--gpus-per-replica",
         "1", "--cpus-per-replica", "2"]))
    assert spec == JobSpec({"CPU": 2.0, "GPU": 1.0}, 2, 4)


class FakeGroup:
    """Replicas on two nodes that train until stopped (then checkpoint)."""

    def __init__(self, node_ids):
        self.node_ids = list(node_ids)
        self.num_nodes = len(set(node_ids))
        self.actors = []
        self.stops = 0

    def finished(self, timeout):
        return None

    def stop(self, timeout):
        self.stops += 1
        return [{"status": "checkpointed"} for _ in self.node_ids]

    def snapshot(self):
        return None


class KeepSizer:
    """Never resizes."""

    def decision(self):
        from adaptdl_core.decision import Decision
        return Decision("j", "keep", 2, (), "test")

    def observe(self, *args, **kwargs):
        pass


@pytest.mark.parametrize("room, target", [(4, 2), (1, 1), (0, 1)])
def test_a_draining_node_under_a_replica_moves_the_job(tmp_path, room, target):
    """The job checkpoints (stop at a batch boundary) and relaunches on the other nodes:
    at its size if they hold it, else as many as they hold, at least min_replicas."""
    spec = JobSpec({"CPU": 1}, min_replicas=1, max_replicas=4)
    nodes = {f"n{i}": NodeInfo({"CPU": 1}) for i in range(room)}
    job = elastic_job.ElasticJob(JobFiles("j", str(tmp_path)), "train.py", [], spec,
                                 sizer=KeepSizer(), draining_fn=lambda: {"b": 0},
                                 nodes_fn=lambda: nodes)
    group = FakeGroup(["a", "b"])
    launch = elastic_job._Launch(2, group, 0.0)
    assert job._watch(launch) == ("move", target)
    assert group.stops == 1
    assert job.files.read_status()["status"] == "moving"


def test_a_drain_elsewhere_or_a_failed_read_moves_nothing(tmp_path, caplog, monkeypatch):
    spec = JobSpec({"CPU": 1}, min_replicas=1, max_replicas=4)
    reads = []

    def draining():
        reads.append(1)
        if len(reads) == 1:
            return {"c": 1e12}
        if len(reads) == 2:
            raise RuntimeError("GCS unreachable")
        job.request_stop()  # then the test ends the run
        return {}

    job = elastic_job.ElasticJob(JobFiles("j", str(tmp_path)), "train.py", [], spec,
                                 sizer=KeepSizer(), draining_fn=draining,
                                 nodes_fn=lambda: {})
    group = FakeGroup(["a", "b"])
    monkeypatch.setattr(elastic_job, "_DRAIN_CHECK_S", 0.0)
    assert job._watch(elastic_job._Launch(2, group, 0.0)) == ("stopped", 0)
    assert len(reads) == 3 and group.stops == 1
    assert "could not ask which nodes are draining (GCS unreachable)" in caplog.text



class SavingGroup(FakeGroup):
    """FakeGroup whose in-place saves are counted (none is taken: the script ended)."""

    def __init__(self, node_ids):
        super().__init__(node_ids)
        self.saves = 0

    def save(self, timeout):
        self.saves += 1
        return {"taken": False, "path": None, "index": self.saves}


@pytest.mark.parametrize("interval, some", [(0.02, True), (None, False)])
def test_in_place_checkpoints_come_every_interval(tmp_path, monkeypatch, interval, some):
    spec = JobSpec({"CPU": 1}, min_replicas=1, max_replicas=4)
    until = time.monotonic() + (10.0 if some else 0.3)

    def draining():
        if group.saves >= 3 or time.monotonic() > until:
            job.request_stop()
        return {}

    job = elastic_job.ElasticJob(JobFiles("j", str(tmp_path)), "train.py", [], spec,
                                 sizer=KeepSizer(), draining_fn=draining, nodes_fn=lambda: {},
                                 checkpoint_interval_s=interval)
    monkeypatch.setattr(elastic_job, "_DRAIN_CHECK_S", 0.0)
    group = SavingGroup(["a", "b"])
    started = time.monotonic()
    assert job._watch(elastic_job._Launch(2, group, 0.0)) == ("stopped", 0)
    if some:  # (three saves at least 2 intervals apart, well before the 10 s limit)
        assert group.saves >= 3 and time.monotonic() - started < 9.0
    else:
        assert group.saves == 0


def test_a_lost_node_is_named_and_the_job_continues_on_what_is_left(tmp_path):
    """A replica's node missing from the cluster is a lost node (no wait: it is gone
    already); the job continues at its size if the rest holds it, else smaller."""
    spec = JobSpec({"CPU": 1}, min_replicas=1, max_replicas=4)
    nodes = {"a": NodeInfo({"CPU": 1})}
    job = elastic_job.ElasticJob(JobFiles("j", str(tmp_path)), "train.py", [], spec,
                                 sizer=KeepSizer(), nodes_fn=lambda: nodes)
    launch = elastic_job._Launch(2, FakeGroup(["a", "b"]), 0.0)
    assert job._lost_nodes(launch) == ["b"]
    assert job._room_elsewhere(launch) == 1
    nodes["c"] = NodeInfo({"CPU": 2})
    assert job._room_elsewhere(launch) == 2


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), True, "300"])
def test_a_bad_checkpoint_interval_is_named(tmp_path, bad):
    with pytest.raises(ValueError, match="checkpoint_interval_s"):
        elastic_job.ElasticJob(JobFiles("j", str(tmp_path)), "train.py", [],
                               JobSpec({"CPU": 1}, 1, 2), sizer=KeepSizer(),
                               checkpoint_interval_s=bad)


class FakeReservation:
    """New replicas that are up after ``polls`` calls of up()."""

    def __init__(self, count, polls, warm_up):
        self.count, self.polls, self.warm_up = count, polls, warm_up
        self.cancelled = False
        self.actors = [f"new{i}" for i in range(count)]
        self.created = time.monotonic()

    def up(self, wait_s=0.0):
        self.polls -= 1
        return self.polls <= 0 and not self.cancelled

    def cancel(self):
        self.cancelled = True


class FakePool:
    def __init__(self, polls=3):
        self.polls = polls
        self.reserved, self.released = [], []

    def reserve(self, count, *, warm_up=None):
        self.reserved.append(FakeReservation(count, self.polls, warm_up))
        return self.reserved[-1]

    def release(self, actors, *, pgs=()):
        self.released.extend(actors)

    def release_all(self):
        pass


class ActorGroup(FakeGroup):
    """FakeGroup with actor handles (strings) in rank order and rank 0's modules."""

    def __init__(self, node_ids):
        super().__init__(node_ids)
        self.actors = [f"r{i}" for i in range(len(node_ids))]

    def imported_modules(self):
        return ["json"]


class ScriptSizer(KeepSizer):
    """Resizes to ``targets[i]`` on its i-th decision (the last one repeats)."""

    def __init__(self, targets):
        self.targets, self.calls, self.begun = list(targets), 0, []

    def decision(self):
        from adaptdl_core.decision import Decision
        target = self.targets[min(self.calls, len(self.targets) - 1)]
        self.calls += 1
        return Decision("j", "resize" if target else "keep", target or 2, (), "test")

    def begin_resize(self, decision):
        self.begun.append(decision.replicas)


def test_a_grow_starts_its_new_replicas_while_the_job_trains_then_checkpoints(tmp_path):
    pool = FakePool(polls=3)
    job = elastic_job.ElasticJob(JobFiles("j", str(tmp_path)), "dir/train.py", [],
                                 JobSpec({"CPU": 1}, 1, 4), sizer=ScriptSizer([3]),
                                 draining_fn=dict, nodes_fn=dict, pool=pool,
                                 checkpoint_interval_s=None)
    job._fits = lambda extra: True
    group = ActorGroup(["a", "a"])
    assert job._watch(elastic_job._Launch(2, group, 0.0)) == ("resize", 3)
    # One reservation of one replica, warmed with rank 0's modules, polled until up; the
    # replicas were stopped (checkpoint) only then, once.
    (grow,) = pool.reserved
    assert grow.count == 1 and grow.polls == 0 and not grow.cancelled
    assert grow.warm_up == (["json"], [os.path.abspath("dir")])
    assert group.stops == 1 and job.sizer.begun == [3]
    assert job._take_grow(1) is grow  # the relaunch takes it


def watch_a_grow_that_never_comes_up(tmp_path, monkeypatch, targets):
    """Follow a 2-replica launch whose sizer decides ``targets`` while the new replicas
    never come up, until its 4th decision (then the job is asked to stop); the pool."""
    monkeypatch.setattr(elastic_job, "_DRAIN_CHECK_S", 0.0)
    pool = FakePool(polls=100)
    sizer = ScriptSizer(targets)
    job = elastic_job.ElasticJob(JobFiles("j", str(tmp_path)), "train.py", [],
                                 JobSpec({"CPU": 1}, 1, 4), sizer=sizer,
                                 draining_fn=lambda: (job.request_stop() or {}) if sizer.calls > 3
                                 else {}, nodes_fn=dict, pool=pool, checkpoint_interval_s=None)
    job._fits = lambda extra: True
    assert job._watch(elastic_job._Launch(2, ActorGroup(["a", "a"]), 0.0)) == ("stopped", 0)
    assert sizer.begun == []
    return pool


def test_a_grow_no_longer_wanted_gives_its_replicas_back(tmp_path, monkeypatch):
    pool = watch_a_grow_that_never_comes_up(tmp_path, monkeypatch, [3, 3, None])
    (grow,) = pool.reserved
    assert grow.cancelled


def test_a_grow_not_up_in_time_gives_its_replicas_back_and_tries_again(tmp_path, monkeypatch,
                                                                      caplog):
    monkeypatch.setattr(elastic_job, "_GROW_WAIT_S", 0.0)
    pool = watch_a_grow_that_never_comes_up(tmp_path, monkeypatch, [3])
    assert len(pool.reserved) >= 2 and all(r.cancelled for r in pool.reserved)
    assert "not up within 0 s; giving their resources back" in caplog.text


@pytest.mark.parametrize("target, avoid, recycled, stay, released", [
    (2, set(), True, ["r0", "r1"], ["r2"]),          # a shrink keeps the lowest ranks
    (3, set(), True, ["r0", "r1", "r2"], []),        # a relaunch at the same size keeps all
    (2, {"a"}, True, ["r2"], ["r0", "r1"]),          # a move keeps those off the drained node
    (2, set(), False, [], ["r0", "r1", "r2"]),       # survivors not idle: all replaced
])
def test_a_relaunch_keeps_the_replicas_that_stay(tmp_path, monkeypatch, target, avoid,
                                                 recycled, stay, released):
    from adaptdl_ray.tune import worker_group
    recycles = []
    monkeypatch.setattr(worker_group, "recycle_workers",
                        lambda actors, info: recycles.append(list(actors)) or recycled)
    pool = FakePool()
    job = elastic_job.ElasticJob(JobFiles("j", str(tmp_path)), "train.py", [],
                                 JobSpec({"CPU": 1}, 1, 4), sizer=KeepSizer(), pool=pool)
    job._avoid_nodes = set(avoid)
    launches = []
    job._launch = lambda replicas, archive, restarts, keep: launches.append(
        (replicas, list(keep)))
    job._relaunch(elastic_job._Launch(3, ActorGroup(["a", "a", "b"]), 0.0), target, None, 1)
    assert recycles == [["r0", "r1", "r2"]]  # every replica leaves the process group at once
    assert launches == [(target, stay)] and pool.released == released
    assert job._avoid_nodes == set()
