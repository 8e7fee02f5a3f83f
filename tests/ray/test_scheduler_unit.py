"""AdaptDLScheduler against stub trials and a stub controller: no Ray cluster needed."""

from __future__ import annotations

import json
import types

import pytest

pytest.importorskip("ray.tune")
from ray.tune.experiment import Trial  # noqa: E402
from ray.tune.schedulers import FIFOScheduler, TrialScheduler  # noqa: E402

from adaptdl_core.policy import NodeInfo, PolluxPolicy  # noqa: E402
from adaptdl_ray.tune import AdaptDLScheduler, AdaptDLTrainableCreator  # noqa: E402
from adaptdl_ray.tune.allocation import job_info, speedup_from_hints  # noqa: E402
from adaptdl_ray.tune.resources import (ReplicaSpec, num_replicas_of,  # noqa: E402
                                        placement_group_factory)
from adaptdl_ray.tune.scheduler_state import STATE_FILE, SchedulerState  # noqa: E402
from adaptdl_ray.tune.worker import HINTS_KEY  # noqa: E402


def train_fn(config):
    pass


TRAINABLE = AdaptDLTrainableCreator(train_fn)


class StubTrial:
    """The parts of a Tune Trial the scheduler uses."""

    def __init__(self, trial_id, trainable=TRAINABLE, state_dir=None):
        self.trial_id = trial_id
        self.status = Trial.PENDING
        self._cls = trainable
        self.placement_group_factory = trainable.default_resource_request({})
        self.storage = types.SimpleNamespace(experiment_driver_staging_path=state_dir)

    def get_trainable_cls(self):
        return self._cls

    def set_status(self, status):
        self.status = status

    def init_local_path(self):
        self.local_path_ready = True

    def update_resources(self, pgf):
        if self.status == Trial.RUNNING:
            raise ValueError("Cannot update resources while Trial is running.")
        self.placement_group_factory = pgf

    @property
    def replicas(self):
        return num_replicas_of(self.placement_group_factory)


class StubController:
    def __init__(self):
        self.trials = []

    def get_trials(self):
        return list(self.trials)

    def add(self, scheduler, trial):
        self.trials.append(trial)
        scheduler.on_trial_add(self, trial)
        return trial

    def start_pending(self, scheduler=None):
        """What Tune does: resume the paused trials the scheduler chooses (once its settle
        and throttle delays have passed), then start every PENDING trial."""
        while scheduler is not None:
            scheduler._last_add = scheduler._last_check = float("-inf")
            trial = scheduler.choose_trial_to_run(self)
            if trial is None or trial.status == Trial.PENDING:  # Tune starts those anyway
                break
            assert trial.status == Trial.PAUSED
            trial.status = Trial.PENDING
        for t in self.trials:
            if t.status == Trial.PENDING:
                t.status = Trial.RUNNING


class CountingPolicy(PolluxPolicy):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def allocate(self, *args, **kwargs):
        self.calls += 1
        return super().allocate(*args, **kwargs)


def cluster(cpus):
    nodes = {"n0": NodeInfo({"CPU": float(cpus)})}
    return lambda: nodes


@pytest.fixture
def clock(monkeypatch):
    """The scheduler's wall clock, frozen at 1000 s; tests advance ``clock[0]``."""
    import adaptdl_ray.tune.scheduler as mod
    now = [1000.0]
    monkeypatch.setattr(mod.time, "time", lambda: now[0])
    return now


def start_trial(sched, name):
    """A stub controller with one trial added and started by ``sched``."""
    tc = StubController()
    trial = tc.add(sched, StubTrial(name))
    tc.start_pending(sched)
    return tc, trial


def used_cpus(controller):
    return sum(t.placement_group_factory.required_resources.get("CPU", 0.0)
               for t in controller.trials if t.status in (Trial.RUNNING, Trial.PENDING))


def test_admission_never_exceeds_the_cluster_and_releases_waiting_trials_in_order():
    sched = AdaptDLScheduler(nodes_fn=cluster(4), allocation_interval_s=3600)
    tc = StubController()
    trials = [tc.add(sched, StubTrial(f"t{i}")) for i in range(6)]
    tc.start_pending(sched)
    assert used_cpus(tc) <= 4
    waiting = [t for t in trials if t.status == Trial.PAUSED]
    assert len(waiting) >= 2  # 6 trials, 4 CPUs, 1 CPU per replica
    assert sum(sched.state.trials[t.trial_id].target for t in trials) <= 4
    # A trial ends: the scheduler re-divides and releases the first waiting trial that fits.
    finished = next(t for t in trials if t.status == Trial.RUNNING)
    finished.status = Trial.TERMINATED
    sched.on_trial_complete(tc, finished, {})
    sched._last_check = float("-inf")
    released = sched.choose_trial_to_run(tc)
    assert released is waiting[0]  # first come, first served
    released.status = Trial.PENDING
    tc.start_pending(sched)
    assert used_cpus(tc) <= 4
    assert all(t.local_path_ready for t in trials)  # reporters may read their directories


def test_a_lone_trial_starts_at_one_replica_and_grows_once_profiled(clock):
    sched = AdaptDLScheduler(nodes_fn=cluster(8), allocation_interval_s=30)
    tc = StubController()
    trial = tc.add(sched, StubTrial("solo"))
    assert trial.status == Trial.PAUSED  # released once additions settle
    tc.start_pending(sched)
    # Bounded exploration: nothing measured yet -> one replica, not a blind guess at two.
    assert trial.status == Trial.RUNNING and trial.replicas == 1
    # Measured at one replica (no model fitted yet): the prior now allows two, and the
    # trial is old enough for a restart to pay off.
    hints = {"init_batch_size": 32, "max_profiled_replicas": 1, "max_profiled_nodes": 1}
    clock[0] += 600
    assert sched.on_trial_result(tc, trial, {HINTS_KEY: json.dumps(hints)}) == \
        TrialScheduler.PAUSE
    assert sched.state.trials["solo"].target == 2


def test_a_burst_of_trials_is_divided_once_without_stale_requests():
    sched = AdaptDLScheduler(nodes_fn=cluster(2))
    tc = StubController()
    a, b = tc.add(sched, StubTrial("a")), tc.add(sched, StubTrial("b"))
    tc.start_pending(sched)
    # Both start, at one replica each.
    assert (a.status, a.replicas, b.status, b.replicas) == (Trial.RUNNING, 1, Trial.RUNNING, 1)
    assert sched.on_trial_result(tc, a, {}) == TrialScheduler.CONTINUE


def test_results_do_not_trigger_allocations_within_the_interval():
    policy = CountingPolicy()
    sched = AdaptDLScheduler(nodes_fn=cluster(4), allocation_interval_s=3600, policy=policy)
    tc = StubController()
    a, b = tc.add(sched, StubTrial("a")), tc.add(sched, StubTrial("b"))
    tc.start_pending(sched)
    calls = policy.calls
    for _ in range(50):
        for t in (a, b):
            assert sched.on_trial_result(tc, t, {"loss": 1.0}) in (TrialScheduler.CONTINUE,
                                                                   TrialScheduler.PAUSE)
        for _ in range(20):
            sched.choose_trial_to_run(tc)
    assert policy.calls == calls


def test_interval_elapsed_reallocates_and_pauses_trials_whose_count_changes(clock):
    policy = CountingPolicy()
    sched = AdaptDLScheduler(nodes_fn=cluster(4), allocation_interval_s=30, policy=policy)
    tc, a = start_trial(sched, "a")
    assert a.replicas == 1
    # Profiled at 2 replicas with a perfectly scaling prior: exploration allows 4.
    hints = {"init_batch_size": 32, "max_profiled_replicas": 2, "max_profiled_nodes": 1}
    assert sched.on_trial_result(tc, a, {HINTS_KEY: json.dumps(hints)}) == \
        TrialScheduler.CONTINUE  # within the interval: no new decision
    clock[0] += 31
    calls = policy.calls
    assert sched.on_trial_result(tc, a, {HINTS_KEY: json.dumps(hints)}) == TrialScheduler.PAUSE
    assert policy.calls == calls + 1
    assert sched.state.trials["a"].target == 4
    # Tune pauses it; the scheduler then resumes it with 4 replicas.
    a.status = Trial.PAUSED
    sched._last_check = float("-inf")  # past the throttle delay
    assert sched.choose_trial_to_run(tc) is a
    assert a.replicas == 4
    assert sched.state.trials["a"].resizes == 1


def test_growth_waits_until_the_room_is_free():
    sched = AdaptDLScheduler(nodes_fn=cluster(4), allocation_interval_s=3600)
    tc, a = start_trial(sched, "a")
    b = StubTrial("b")
    b.status = Trial.RUNNING
    b.placement_group_factory = placement_group_factory(ReplicaSpec({"CPU": 1}), 3)
    tc.trials.append(b)  # a trial holding 3 CPUs that the scheduler wants to shrink
    sched.state.trials["a"].target = 3
    assert sched.on_trial_result(tc, a, {}) == TrialScheduler.CONTINUE  # no room yet
    b.status = Trial.PAUSED
    assert sched.on_trial_result(tc, a, {}) == TrialScheduler.PAUSE


def test_base_scheduler_decides_stopping():
    class StopAfterTwo(FIFOScheduler):
        def on_trial_result(self, tc, trial, result):
            return TrialScheduler.STOP if result["training_iteration"] >= 2 else \
                TrialScheduler.CONTINUE

    sched = AdaptDLScheduler(StopAfterTwo(), nodes_fn=cluster(4))
    tc, a = start_trial(sched, "a")
    assert sched.on_trial_result(tc, a, {"training_iteration": 1}) == TrialScheduler.CONTINUE
    assert sched.on_trial_result(tc, a, {"training_iteration": 2}) == TrialScheduler.STOP


def test_state_survives_a_new_scheduler_instance(tmp_path):
    sched = AdaptDLScheduler(nodes_fn=cluster(4))
    tc = StubController()
    a = tc.add(sched, StubTrial("a", state_dir=str(tmp_path)))
    tc.start_pending(sched)
    hints = {"init_batch_size": 32, "max_profiled_replicas": 2, "max_profiled_nodes": 1}
    sched.on_trial_result(tc, a, {HINTS_KEY: json.dumps(hints), "adaptdl/restarts": 3,
                                  "adaptdl/resize_s": 4.5})
    assert (tmp_path / STATE_FILE).exists()
    # Tuner.restore: a fresh scheduler sees the same trial again.
    again = AdaptDLScheduler(nodes_fn=cluster(4))
    tc2 = StubController()
    a2 = StubTrial("a", state_dir=str(tmp_path))
    a2.status = Trial.PAUSED
    tc2.add(again, a2)
    record = again.state.trials["a"]
    assert record.created == sched.state.trials["a"].created
    assert record.restarts == 3 and record.resize_s == 4.5 and record.hints == hints
    again._last_add = float("-inf")  # past the settle delay
    assert again.choose_trial_to_run(tc2) is a2


def test_state_file_round_trip_and_bad_json(tmp_path):
    state = SchedulerState()
    state.save(str(tmp_path))
    assert SchedulerState.load(str(tmp_path)).trials == {}
    (tmp_path / STATE_FILE).write_text("{not json")
    with pytest.raises(ValueError):
        SchedulerState.load(str(tmp_path))


# -- clear errors ---------------------------------------------------------------------
def test_rejects_a_trainable_not_made_by_the_creator():
    from ray import tune

    class Plain(tune.Trainable):
        pass

    sched = AdaptDLScheduler(nodes_fn=cluster(4))
    with pytest.raises(TypeError, match="AdaptDLTrainableCreator"):
        StubController().add(sched, StubTrial("x", trainable=Plain))


def test_rejects_more_replicas_than_the_cluster_has():
    big = AdaptDLTrainableCreator(train_fn, min_replicas=5)
    sched = AdaptDLScheduler(nodes_fn=cluster(4))
    with pytest.raises(ValueError, match="min_replicas=5.*holds 4"):
        StubController().add(sched, StubTrial("x", trainable=big))


@pytest.mark.parametrize("kwargs, match", [
    ({"min_replicas": 3, "max_replicas": 2}, "min_replicas .3. must be <= max_replicas"),
    ({"min_replicas": 0}, "min_replicas must be an integer >= 1"),
    ({"num_cpus_per_worker": -1}, "num_cpus_per_worker"),
    ({"num_cpus_per_worker": 0}, "must request some resource"),
    ({"stop_timeout_s": 0}, "stop_timeout_s"),
])
def test_creator_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AdaptDLTrainableCreator(train_fn, **kwargs)


def test_creator_rejects_a_function_without_a_config_argument():
    with pytest.raises(ValueError, match="must accept one argument"):
        AdaptDLTrainableCreator(lambda: None)


@pytest.mark.parametrize("interval", [0, -1, "30", True])
def test_scheduler_rejects_bad_interval(interval):
    with pytest.raises(ValueError, match="allocation_interval_s"):
        AdaptDLScheduler(allocation_interval_s=interval)


def test_metric_missing_from_results_is_named():
    sched = AdaptDLScheduler(nodes_fn=cluster(4))
    sched.set_search_properties("mean_accuracy", "max")
    tc, a = start_trial(sched, "a")
    with pytest.raises(ValueError, match="mean_accuracy.*loss"):
        sched.on_trial_result(tc, a, {"loss": 0.5})


# -- hints to policy jobs -------------------------------------------------------------
def test_hints_with_a_fitted_model_give_a_goodput_speedup():
    hints = {"init_batch_size": 64, "max_batch_size": 1024,
             "perf_params": [0.01, 0.001, 0.05, 0.0001, 0.02, 0.0002, 1.2],
             "grad_params": [1.0, 50.0], "max_profiled_replicas": 2,
             "max_profiled_nodes": 1, "local_bsz_bounds": [16, 256]}
    fn = speedup_from_hints(hints)
    assert type(fn).__name__ == "SpeedupFunction"
    s = fn([1, 1, 1], [1, 2, 4])
    assert s[0] == pytest.approx(1.0) and s[2] > s[1] > 1.0
    job = job_info(ReplicaSpec({"CPU": 1}), cluster(16)(), created=0.0, hints=hints)
    assert job.max_replicas == 4  # explores at most twice the profiled count


def test_malformed_hints_fall_back_to_the_linear_prior():
    assert type(speedup_from_hints({"init_batch_size": -3})).__name__ == "LinearSpeedup"
    assert type(speedup_from_hints(None)).__name__ == "LinearSpeedup"


def test_fifo_base_does_not_resume_trials_held_back():
    sched = AdaptDLScheduler(nodes_fn=cluster(2), allocation_interval_s=3600)
    tc = StubController()
    trials = [tc.add(sched, StubTrial(f"t{i}")) for i in range(4)]
    tc.start_pending(sched)
    held = [t for t in trials if t.status == Trial.PAUSED]
    assert held  # 4 trials, 2 CPUs
    for _ in range(3):
        sched._last_check = 0.0  # as if the throttle interval had passed
        assert sched.choose_trial_to_run(tc) is None
    assert all(t.status == Trial.PAUSED for t in held)


def test_a_trial_about_to_finish_is_not_resized(clock):
    sched = AdaptDLScheduler(nodes_fn=cluster(4), allocation_interval_s=30)
    tc, a = start_trial(sched, "a")
    assert a.replicas == 1
    hints = json.dumps({"init_batch_size": 32, "max_profiled_replicas": 2,
                        "max_profiled_nodes": 1})
    # 9 of 10 epochs done in 90 s: ~10 s left, less than two resizes of 8 s.
    result = {HINTS_KEY: hints, "adaptdl/epochs_done": 9, "adaptdl/epochs": 10,
              "time_total_s": 90.0, "adaptdl/resize_s": 8.0}
    clock[0] += 31
    assert sched.on_trial_result(tc, a, result) == TrialScheduler.CONTINUE
    assert sched.state.trials["a"].remaining_s == pytest.approx(10.0)
    # The same trial with most of its training ahead grows to 4.
    clock[0] += 31
    result.update({"adaptdl/epochs_done": 1, "time_total_s": 10.0})
    assert sched.on_trial_result(tc, a, result) == TrialScheduler.PAUSE
    assert sched.state.trials["a"].target == 4
