"""The supervisor of a running elastic job, with fake replicas, reservations and sizers
(no Ray): moves off draining nodes, lost nodes, in-place checkpoints, grows that start
their replicas while the job trains, relaunches that keep the replicas that stay, the
reasons a job gives for running below its maximum, and the run's typed ending."""

from __future__ import annotations

import logging
import time

import pytest

from adaptdl_core.decision import Decision, JobSpec, NodeInfo
from adaptdl_ray.supervisor import Change, Ending, JobRunner, LaunchEnd, Phase, Supervisor
from adaptdl_ray.replicas import pool as pool_module
from adaptdl_ray.supervisor import supervisor as supervisor_module
from adaptdl_ray.supervisor.recovery import FailureVerdict, Verdict, judge_failure
from adaptdl_ray.supervisor.supervisor import _Launch


def make(spec=None, *, sizer=None, draining_fn=dict, nodes_fn=dict, pool=None,
         checkpoint_interval_s=None, kept=None, statuses=None, import_paths=()):
    """A supervisor of fakes; ``kept`` collects the checkpoints it keeps, ``statuses`` its
    status updates."""
    kept = [] if kept is None else kept
    statuses = [] if statuses is None else statuses
    return Supervisor(
        "j", spec or JobSpec({"CPU": 1}, min_replicas=1, max_replicas=4),
        JobRunner(lambda config: None, {}, import_paths=tuple(import_paths)),
        sizer=sizer or KeepSizer(), pool=pool or FakePool(),
        trial_info={"trial_id": "j"},
        keep_checkpoint=lambda archive: kept.append(archive) or "kept",
        on_status=statuses.append, draining_fn=draining_fn, nodes_fn=nodes_fn,
        checkpoint_interval_s=checkpoint_interval_s)


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
        return Decision("j", "keep", 2, (), "test")

    def observe(self, *args, **kwargs):
        pass


@pytest.mark.parametrize("room, target", [(4, 2), (1, 1), (0, 1)])
def test_a_draining_node_under_a_replica_moves_the_job(tmp_path, room, target):
    """The job checkpoints (stop at a batch boundary) and relaunches on the other nodes:
    at its size if they hold it, else as many as they hold, at least min_replicas."""
    nodes = {f"n{i}": NodeInfo({"CPU": 1}) for i in range(room)}
    statuses = []
    sup = make(draining_fn=lambda: {"b": 0}, nodes_fn=lambda: nodes, statuses=statuses)
    group = FakeGroup(["a", "b"])
    launch = _Launch(2, group, 0.0)
    assert sup._watch(launch) == LaunchEnd(Change.MOVE, target)
    assert group.stops == 1
    assert statuses[-1].phase is Phase.MOVING


def test_a_drain_elsewhere_or_a_failed_read_moves_nothing(caplog, monkeypatch):
    reads = []

    def draining():
        reads.append(1)
        if len(reads) == 1:
            return {"c": 1e12}
        if len(reads) == 2:
            raise RuntimeError("GCS unreachable")
        sup.request_stop()  # then the test ends the run
        return {}

    monkeypatch.setattr(supervisor_module, "_DRAIN_CHECK_S", 0.0)
    sup = make(draining_fn=draining)
    group = FakeGroup(["a", "b"])
    assert sup._watch(_Launch(2, group, 0.0)) == LaunchEnd(Ending.STOPPED)
    assert len(reads) == 3 and group.stops == 1
    assert "could not check for replicas on draining nodes (GCS unreachable)" in caplog.text



class SavingGroup(FakeGroup):
    """FakeGroup whose in-place saves are counted (none is taken: the script ended)."""

    def __init__(self, node_ids):
        super().__init__(node_ids)
        self.saves = 0

    def save(self, timeout):
        self.saves += 1
        return {"taken": False, "path": None, "index": self.saves}


@pytest.mark.parametrize("interval, some", [(0.02, True), (None, False)])
def test_in_place_checkpoints_come_every_interval(monkeypatch, interval, some):
    until = time.monotonic() + (10.0 if some else 0.3)

    def draining():
        if group.saves >= 3 or time.monotonic() > until:
            sup.request_stop()
        return {}

    monkeypatch.setattr(supervisor_module, "_DRAIN_CHECK_S", 0.0)
    sup = make(draining_fn=draining, checkpoint_interval_s=interval)
    group = SavingGroup(["a", "b"])
    started = time.monotonic()
    assert sup._watch(_Launch(2, group, 0.0)) == LaunchEnd(Ending.STOPPED)
    if some:  # (three saves at least 2 intervals apart, well before the 10 s limit)
        assert group.saves >= 3 and time.monotonic() - started < 9.0
    else:
        assert group.saves == 0


class TakingGroup(SavingGroup):
    """SavingGroup whose in-place saves are taken; rank 0's checkpoints are numbered."""

    def save(self, timeout):
        self.saves += 1
        return {"taken": True, "path": f"ckpt-{self.saves}", "index": self.saves}

    def checkpoint_archive(self, path=None):
        return path.encode() if path else b"newest"


def test_an_in_place_checkpoint_is_kept_counted_and_is_where_a_lost_node_resumes(
        monkeypatch):
    kept = []
    monkeypatch.setattr(supervisor_module, "_DRAIN_CHECK_S", 0.0)
    sup = make(draining_fn=lambda: (sup.request_stop() or {}) if group.saves >= 2 else {},
               checkpoint_interval_s=0.01, kept=kept)
    group = TakingGroup(["a", "b"])
    assert sup._watch(_Launch(2, group, 0.0)) == LaunchEnd(Ending.STOPPED)
    assert kept == [b"ckpt-1", b"ckpt-2"]
    assert sup.facts["checkpoints"] == 2 and sup.facts["checkpoint_s"] >= 0.0
    assert sup._newest_kept(b"older") == b"ckpt-2"


def test_a_lost_node_is_named_and_the_job_continues_on_what_is_left():
    """A replica's node missing from the cluster is a lost node (no wait: it is gone
    already); the job continues at its size if the rest holds it, else smaller."""
    nodes = {"a": NodeInfo({"CPU": 1})}
    sup = make(nodes_fn=lambda: nodes)
    launch = _Launch(2, FakeGroup(["a", "b"]), 0.0)
    verdict = judge_failure(RuntimeError("gone"), launch.group, lambda: nodes.keys(),
                            name=sup.name)
    assert verdict == FailureVerdict(Verdict.CONTINUE, ("b",), "gone")
    assert sup._room_elsewhere(launch) == 1
    nodes["c"] = NodeInfo({"CPU": 2})
    assert sup._room_elsewhere(launch) == 2


class FakeReservation:
    """New replicas that are up after ``polls`` calls of up()."""

    def __init__(self, count, polls, warm_up, accelerator_type=None):
        self.count, self.polls, self.warm_up = count, polls, warm_up
        self.accelerator_type = accelerator_type
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

    def reserve(self, count, *, warm_up=None, accelerator_type=None):
        self.reserved.append(FakeReservation(count, self.polls, warm_up, accelerator_type))
        return self.reserved[-1]

    def release(self, actors, *, pgs=()):
        self.released.extend(actors)

    def release_all(self):
        self.released_all = getattr(self, "released_all", 0) + 1

    def take(self, reservation):
        return list(reservation.actors)


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
        target = self.targets[min(self.calls, len(self.targets) - 1)]
        self.calls += 1
        return Decision("j", "resize" if target else "keep", target or 2, (), "test")

    def begin_resize(self, decision):
        self.begun.append(decision.replicas)


def test_a_grow_starts_its_new_replicas_while_the_job_trains_then_checkpoints():
    pool = FakePool(polls=3)
    sup = make(sizer=ScriptSizer([3]), pool=pool, import_paths=["/the/script/dir"])
    sup._grow.fits_fn = lambda extra: True
    group = ActorGroup(["a", "a"])
    assert sup._watch(_Launch(2, group, 0.0)) == LaunchEnd(Change.RESIZE, 3)
    # One reservation of one replica, warmed with rank 0's modules, polled until up; the
    # replicas were stopped (checkpoint) only then, once.
    (grow,) = pool.reserved
    assert grow.count == 1 and grow.polls == 0 and not grow.cancelled
    assert grow.warm_up == (["json"], ["/the/script/dir"])
    assert group.stops == 1 and sup.sizer.begun == [3]
    assert sup._grow.take(1) is grow  # the relaunch takes it


def watch_a_grow_that_never_comes_up(monkeypatch, targets):
    """Follow a 2-replica launch whose sizer decides ``targets`` while the new replicas
    never come up, until its 4th decision (then the job is asked to stop); the pool."""
    monkeypatch.setattr(supervisor_module, "_DRAIN_CHECK_S", 0.0)
    pool = FakePool(polls=100)
    sizer = ScriptSizer(targets)
    sup = make(sizer=sizer, pool=pool,
               draining_fn=lambda: (sup.request_stop() or {}) if sizer.calls > 3 else {})
    sup._grow.fits_fn = lambda extra: True
    assert sup._watch(_Launch(2, ActorGroup(["a", "a"]), 0.0)) == LaunchEnd(Ending.STOPPED)
    assert sizer.begun == []
    return pool


def test_a_grow_no_longer_wanted_gives_its_replicas_back(monkeypatch):
    pool = watch_a_grow_that_never_comes_up(monkeypatch, [3, 3, None])
    (grow,) = pool.reserved
    assert grow.cancelled


def test_a_grow_not_up_in_time_gives_its_replicas_back_and_tries_again(monkeypatch, caplog):
    monkeypatch.setattr(pool_module, "GROW_WAIT_S", 0.0)
    pool = watch_a_grow_that_never_comes_up(monkeypatch, [3])
    assert len(pool.reserved) >= 2 and all(r.cancelled for r in pool.reserved)
    assert "not up within 0 s; giving their resources back" in caplog.text


@pytest.mark.parametrize("target, avoid, recycled, stay, released", [
    (2, set(), True, ["r0", "r1"], ["r2"]),          # a shrink keeps the lowest ranks
    (3, set(), True, ["r0", "r1", "r2"], []),        # a relaunch at the same size keeps all
    (2, {"a"}, True, ["r2"], ["r0", "r1"]),          # a move keeps those off the drained node
    (2, set(), False, [], ["r0", "r1", "r2"]),       # survivors not idle: all replaced
])
def test_a_relaunch_keeps_the_replicas_that_stay(monkeypatch, target, avoid, recycled, stay,
                                                 released):
    from adaptdl_ray.replicas import group as worker_group
    recycles = []
    monkeypatch.setattr(worker_group, "recycle_workers",
                        lambda actors, info: recycles.append(list(actors)) or recycled)
    pool = FakePool()
    sup = make(pool=pool)
    sup._avoid_nodes = set(avoid)
    launches = []
    sup._launch = lambda replicas, archive, restarts, keep: launches.append(
        (replicas, list(keep)))
    sup._relaunch(_Launch(3, ActorGroup(["a", "a", "b"]), 0.0), target, None, 1)
    assert recycles == [["r0", "r1", "r2"]]  # every replica leaves the process group at once
    assert launches == [(target, stay)] and pool.released == released
    assert sup._avoid_nodes == set()


def test_a_job_kept_below_its_maximum_says_why_once(monkeypatch, caplog):
    """A kept job's reason goes to its log once per change and to its status (what
    `adaptdl-ray ls` shows); "no change" (at its maximum, or nothing to say) clears it."""
    reasons = ["exploring step by step", "exploring step by step",
               "a resize does not pay yet", "no change"]
    seen = []

    class ReasonSizer(KeepSizer):
        calls = 0

        def decision(self):
            reason = reasons[min(self.calls, len(reasons) - 1)]
            self.calls += 1
            seen.append(statuses[-1].facts.get("reason"))
            return Decision("j", "keep", 2, (), reason)

    monkeypatch.setattr(supervisor_module, "_DRAIN_CHECK_S", 0.0)
    sizer, statuses = ReasonSizer(), []
    sup = make(sizer=sizer, statuses=statuses,
               draining_fn=lambda: (sup.request_stop() or {}) if sizer.calls > len(reasons)
               else {})
    with caplog.at_level(logging.INFO, logger=supervisor_module.__name__):
        assert sup._watch(_Launch(2, FakeGroup(["a", "a"]), 0.0)) == LaunchEnd(Ending.STOPPED)
    # (each decision sees the status the previous one left)
    assert seen[1:5] == ["exploring step by step", "exploring step by step",
                         "a resize does not pay yet", None]
    assert caplog.text.count("on 2 replica(s) of up to 4: exploring step by step") == 1
    assert caplog.text.count("a resize does not pay yet") == 1


class RunGroup:
    """A launch's worker group whose replicas end as ``script`` says: ``finished``,
    ``fail`` (a replica failed), after ``polls`` looks at them."""

    def __init__(self, actors, script, node_ids, polls=2):
        self.actors, self.script, self.node_ids = actors, script, node_ids
        self.num_nodes = len(set(node_ids))
        self.polls = polls
        self.started_with = None

    def start(self, fn, config, *, fn_kwargs, archive, user_files, num_restarts, job_id,
              timeout_s):
        self.started_with = (archive, num_restarts)

    def finished(self, timeout):
        self.polls -= 1
        if self.polls > 0:
            return None
        if self.script == "fail":
            raise RuntimeError("replica 1 of 2 failed: ValueError: bad batch")
        return [{"status": "finished"} for _ in self.node_ids]

    def snapshot(self):
        return None

    def checkpoint_archive(self, path=None):
        return f"ckpt-{self.started_with[1]}".encode()


def run_supervisor(scripts, nodes, *, room_polls=1):
    """Run a supervisor whose successive launches end as ``scripts`` say (each group's
    replicas on nodes "a" and "b"); its result, groups, kept checkpoints, statuses, pool."""
    groups, kept, statuses = [], [], []
    pool = FakePool(polls=room_polls)

    def make_group(actors, resources, trial_info):
        groups.append(RunGroup(actors, scripts[len(groups)], ["a", "b"]))
        return groups[-1]

    sup = make(pool=pool, kept=kept, statuses=statuses, nodes_fn=lambda: nodes)
    sup._make_group = make_group
    result = sup.run(2, b"from-before", 3)
    return result, groups, kept, statuses, pool, sup


def test_a_run_that_finishes_keeps_its_final_checkpoint_and_frees_everything():
    result, groups, kept, statuses, pool, _ = run_supervisor(
        ["finished"], {"a": NodeInfo({"CPU": 2}), "b": NodeInfo({"CPU": 2})})
    assert (result.ending, result.restarts, result.error) == (Ending.FINISHED, 3, None)
    assert groups[0].started_with == (b"from-before", 3)
    assert kept == [b"ckpt-3"]
    assert [u.phase for u in statuses][:2] == [Phase.PENDING, Phase.RUNNING]
    assert pool.released_all == 1


def test_a_lost_node_is_no_failure_the_run_continues_from_the_newest_checkpoint():
    # Node "b" is gone when the replica fails: the run continues on what is left (one
    # replica: the node left holds one) from the newest checkpoint it kept.
    nodes = {"a": NodeInfo({"CPU": 1})}
    result, groups, kept, _, _, sup = run_supervisor(["fail", "finished"], nodes)
    assert (result.ending, result.restarts) == (Ending.FINISHED, 4)
    assert groups[1].started_with == (b"from-before", 4)  # (none kept before the loss)
    assert sup.facts["nodes_lost"] == 1
    assert kept == [b"ckpt-4"]


def test_a_replicas_failure_ends_the_run_failed_with_its_first_line_kept():
    nodes = {"a": NodeInfo({"CPU": 2}), "b": NodeInfo({"CPU": 2})}
    groups = []

    def make_group(actors, resources, trial_info):
        groups.append(RunGroup([], "fail", ["a", "b"]))  # (no actor to ask: no loss)
        return groups[-1]

    kept, pool = [], FakePool(polls=1)
    sup = make(pool=pool, kept=kept, nodes_fn=lambda: nodes)
    sup._make_group = make_group
    result = sup.run(2, None, 0)
    assert result.ending is Ending.FAILED
    assert result.error == "replica 1 of 2 failed: ValueError: bad batch"
    assert kept == [b"ckpt-0"] and pool.released_all == 1


def test_a_stop_while_waiting_for_room_ends_the_run_stopped():
    class NoRoomPool(FakePool):
        """Its reservations never come up; the job is asked to stop while it waits."""

        def reserve(self, count, *, warm_up=None, accelerator_type=None):
            reservation = super().reserve(count, warm_up=warm_up,
                                          accelerator_type=accelerator_type)

            def up(wait_s=0.0):
                sup.request_stop()
                return False
            reservation.up = up
            return reservation

    pool = NoRoomPool()
    sup = make(pool=pool)
    result = sup.run(2, None, 0)
    assert result.ending is Ending.STOPPED
    assert pool.reserved[0].cancelled and pool.released_all == 1


TYPED = {"a": NodeInfo({"CPU": 2}, accelerator_type="T4"),
         "b": NodeInfo({"CPU": 2}, accelerator_type="A100")}


class TypeSizer(KeepSizer):
    """Decides ``decision`` (replicas, type) each time; records the resizes begun."""

    def __init__(self, replicas, kind):
        self.replicas, self.kind, self.begun = replicas, kind, []

    def decision(self):
        return Decision("j", "resize", self.replicas, (), "test", accelerator_type=self.kind)

    def begin_resize(self, decision):
        self.begun.append((decision.replicas, decision.accelerator_type))


def test_nodes_off_a_type_are_those_of_another_type_or_unknown():
    from adaptdl_core.policy import nodes_off_type
    assert nodes_off_type(TYPED, ["a", "b", "gone"], "A100") == {"a", "gone"}
    assert nodes_off_type(TYPED, ["a", "b"], None) == set()


def test_a_move_to_another_type_at_the_same_size_is_a_resize():
    """The decision keeps 2 replicas but names A100 while they run on T4: the job
    checkpoints and relaunches (no grow is started first), and later replicas go on A100."""
    pool = FakePool()
    sizer = TypeSizer(2, "A100")
    sup = make(sizer=sizer, pool=pool, nodes_fn=lambda: TYPED)
    sup._type = "T4"
    group = ActorGroup(["a", "a"])
    assert sup._watch(_Launch(2, group, 0.0, "T4")) == LaunchEnd(Change.RESIZE, 2)
    assert group.stops == 1 and sizer.begun == [(2, "A100")] and pool.reserved == []
    assert sup._type == "A100"


def test_a_resize_on_the_type_it_runs_on_is_as_before():
    pool = FakePool(polls=1)
    sizer = TypeSizer(3, "T4")
    sup = make(sizer=sizer, pool=pool, nodes_fn=lambda: TYPED)
    sup._grow.fits_fn = lambda extra: True
    sup._type = "T4"
    group = ActorGroup(["a", "a"])
    # A grow on T4: its new replica starts on T4 while the job trains, then it resizes.
    assert sup._watch(_Launch(2, group, 0.0, "T4")) == LaunchEnd(Change.RESIZE, 3)
    (grow,) = pool.reserved
    assert grow.count == 1 and grow.accelerator_type == "T4"


def test_a_same_size_decision_on_the_type_it_runs_on_changes_nothing(monkeypatch):
    monkeypatch.setattr(supervisor_module, "_DRAIN_CHECK_S", 0.0)
    sizer = TypeSizer(2, "T4")
    calls = []
    sup = make(sizer=sizer, nodes_fn=lambda: TYPED,
               draining_fn=lambda: (sup.request_stop() or {}) if len(calls.append(1) or
                                                                       calls) > 3 else {})
    assert sup._watch(_Launch(2, ActorGroup(["a", "a"]), 0.0, "T4")) == \
        LaunchEnd(Ending.STOPPED)
    assert sizer.begun == []


def test_a_relaunch_on_another_type_keeps_only_the_replicas_on_it(monkeypatch):
    from adaptdl_ray.replicas import group as worker_group
    monkeypatch.setattr(worker_group, "recycle_workers", lambda actors, info: True)
    pool = FakePool()
    sup = make(pool=pool, nodes_fn=lambda: TYPED)
    sup._type = "A100"
    launches = []
    sup._launch = lambda replicas, archive, restarts, keep: launches.append(
        (replicas, list(keep)))
    sup._relaunch(_Launch(3, ActorGroup(["a", "a", "b"]), 0.0), 2, None, 1)
    assert launches == [(2, ["r2"])] and pool.released == ["r0", "r1"]


def test_a_launch_reserves_its_replicas_on_the_type_asked_for():
    pool = FakePool(polls=1)
    made = []

    class Group(ActorGroup):
        def start(self, *args, **kwargs):
            pass

    sup = Supervisor(
        "j", JobSpec({"CPU": 1}, 1, 4), JobRunner(lambda config: None, {}),
        sizer=KeepSizer(), pool=pool, trial_info={}, keep_checkpoint=lambda a: None,
        draining_fn=dict, nodes_fn=lambda: TYPED,
        make_group=lambda actors, res, info: made.append(Group(["b"] * len(actors)))
        or made[-1])
    sup._type = "A100"
    launch = sup._launch(2, None, 0)
    assert launch.accelerator_type == "A100"
    assert [(r.count, r.accelerator_type) for r in pool.reserved] == [(2, "A100")]
