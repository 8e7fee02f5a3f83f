"""AdaptDLScheduler against stub trials and a stub controller: no Ray cluster needed."""

from __future__ import annotations

import types

import pytest

pytest.importorskip("ray.tune")
from ray.tune.experiment import Trial  # noqa: E402
from ray.tune.schedulers import FIFOScheduler, TrialScheduler  # noqa: E402

from adaptdl_core.policy import NodeInfo, ResizeVerdict, resize_verdict  # noqa: E402
from tests.decision.stubs import CountingPolicy  # noqa: E402
from adaptdl_ray.tune import AdaptDLScheduler, AdaptDLTrainableCreator  # noqa: E402
from adaptdl_core.decision import CoreState, JobSpec, job_info, speedup_from_hints  # noqa: E402
STATE_FILE = CoreState.FILE
from adaptdl_ray.tune.resources import (num_replicas_of,  # noqa: E402
                                        placement_group_factory)
from adaptdl_ray.tune.creator import replica_spec_of  # noqa: E402


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
        self.checkpoint = None  # no Tune checkpoint, no local directory yet
        self.local_path = self.path = None
        self.is_saving = False

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
        """What it runs on: what the scheduler told it (it resizes itself in place), else
        its placement group's bundles."""
        told = self.scheduler.target_of(self.trial_id) if self.scheduler else None
        return told or num_replicas_of(self.placement_group_factory)

    scheduler = None

    def result(self, **metrics):
        """A result as the trial reports it: its replicas now, and ``metrics``."""
        return {"adaptdl/replicas": self.replicas, **metrics}


class StubController:
    """Tune's controller as the scheduler sees it: a PENDING trial starts when the
    cluster (``cpus``) has room for it, as Tune's resource manager does."""

    def __init__(self, cpus=float("inf")):
        self.trials = []
        self.cpus = cpus

    def get_trials(self):
        return list(self.trials)

    def add(self, scheduler, trial):
        self.trials.append(trial)
        trial.scheduler = scheduler
        scheduler.on_trial_add(self, trial)
        return trial

    def start_pending(self, scheduler=None):
        """What Tune does: resume the paused trials the scheduler chooses (once its settle
        and throttle delays have passed), then start every PENDING trial."""
        while scheduler is not None:
            scheduler._last_check = float("-inf")
            trial = scheduler.choose_trial_to_run(self)
            if trial is None or trial.status == Trial.PENDING:  # Tune starts those anyway
                break
            assert trial.status == Trial.PAUSED
            trial.status = Trial.PENDING
        for t in self.trials:
            if t.status == Trial.PENDING and used_cpus(self, Trial.RUNNING) + \
                    t.placement_group_factory.required_resources.get("CPU", 0) <= self.cpus:
                t.status = Trial.RUNNING


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


class Hints:
    """A stand-in for what trials post to the control actor: ``hints[trial_id] = {...}``."""

    def __init__(self):
        self.hints = {}

    def __call__(self, trial_ids):
        return {t: self.hints[t] for t in trial_ids if t in self.hints}


def start_trial(sched, name):
    """A stub controller with one trial added and started by ``sched``."""
    tc = StubController()
    trial = tc.add(sched, StubTrial(name))
    tc.start_pending(sched)
    return tc, trial


def used_cpus(controller, *statuses):
    statuses = statuses or (Trial.RUNNING, Trial.PENDING)
    return sum(t.placement_group_factory.required_resources.get("CPU", 0.0)
               for t in controller.trials if t.status in statuses)


PROFILED_2 = {"init_batch_size": 32, "max_profiled_replicas": 2, "max_profiled_nodes": 1}
# A result of a trial with hours of training left (1 of 1000 epochs in 60 s): a trial whose
# remaining training is unknown is never grown (whether a growth pays cannot be told).
LONG = {"adaptdl/epochs_done": 1, "adaptdl/epochs": 1000, "time_total_s": 60.0}


# -- admission: Tune's own --------------------------------------------------------------
def test_new_trials_stay_pending_so_tune_and_searchers_count_them():
    """Tune's pending-trial limit (and so a searcher's feedback) counts PENDING trials: the
    scheduler never parks a new trial in another state, and starts it at min_replicas."""
    sched = AdaptDLScheduler(solve_wait_s=None, nodes_fn=cluster(4), allocation_interval_s=3600)
    tc = StubController(cpus=4)
    trials = [tc.add(sched, StubTrial(f"t{i}")) for i in range(6)]
    assert all(t.status == Trial.PENDING and t.replicas == 1 for t in trials)
    tc.start_pending(sched)
    assert used_cpus(tc, Trial.RUNNING) == 4
    assert [t.status for t in trials] == [Trial.RUNNING] * 4 + [Trial.PENDING] * 2
    # A burst of additions is divided once, when Tune next asks for a trial to run.
    policy = CountingPolicy()
    sched2 = AdaptDLScheduler(solve_wait_s=None, nodes_fn=cluster(4), policy=policy)
    tc2 = StubController(cpus=4)
    for i in range(10):
        tc2.add(sched2, StubTrial(f"b{i}"))
    assert policy.calls == 0
    tc2.start_pending(sched2)
    assert policy.calls == 1


def test_a_retried_trial_is_added_again_and_keeps_a_size_that_fits():
    sched = AdaptDLScheduler(solve_wait_s=None, nodes_fn=cluster(4), allocation_interval_s=3600)
    tc, a = start_trial(sched, "a")
    sched._sizes.tell("a", 3)  # (it runs on 3 replicas, grown in place)
    # What Tune does on a failure with retries left: on_trial_error, PENDING, on_trial_add.
    sched.on_trial_error(tc, a)
    a.status = Trial.PENDING
    sched.on_trial_add(tc, a)
    # Tune admits it at its minimum; it grows back to 3 in place once started.
    assert a.status == Trial.PENDING and num_replicas_of(a.placement_group_factory) == 1
    assert sched.target_of("a") == 3
    # A size the cluster could never hold again (a node was lost) restarts smaller.
    sched._sizes.tell("a", 6)
    sched.on_trial_error(tc, a)
    sched.on_trial_add(tc, a)
    assert sched.target_of("a") == 4


def test_a_lone_trial_starts_at_one_replica_and_grows_once_profiled(clock):
    hints = Hints()
    sched = AdaptDLScheduler(solve_wait_s=None, nodes_fn=cluster(8), allocation_interval_s=30,
                             hints_fn=hints)
    tc, trial = start_trial(sched, "solo")
    # Bounded exploration: nothing measured yet -> one replica, not a blind guess at two.
    assert trial.status == Trial.RUNNING and trial.replicas == 1
    # Measured at one replica (no model fitted yet): the prior now allows two, and the
    # trial is old enough for a restart to pay off.
    hints.hints["solo"] = {"init_batch_size": 32, "max_profiled_replicas": 1,
                           "max_profiled_nodes": 1}
    clock[0] += 600
    # Not while its remaining training is unknown...
    assert sched.on_trial_result(tc, trial, {}) == TrialScheduler.CONTINUE
    assert "remaining training not known" in sched.state.jobs["solo"].last_veto
    # ...and once it is known, and a growth pays: the trial is told to grow in place (Tune
    # does not pause it).
    assert sched.on_trial_result(tc, trial, LONG) == TrialScheduler.CONTINUE
    record = sched.state.jobs["solo"]
    assert record.target == 2 and record.resize_pending and sched.target_of("solo") == 2
    assert record.resize_log[-1]["from"] == 1 and record.resize_log[-1]["to"] == 2
    assert "saves" in record.resize_log[-1]["reason"]


def test_each_resize_is_one_visible_line_with_its_predicted_and_measured_cost(clock):
    """Why a trial resized must be visible at Tune's default verbosity: one line
    per resize, on a logger Ray shows at INFO by default, once its cost is measured."""
    import logging

    lines = []

    class Keep(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    logger = logging.getLogger("ray.tune.adaptdl")
    handler = Keep()
    logger.addHandler(handler)
    try:
        assert logger.isEnabledFor(logging.INFO)  # Ray's default for its logger tree
        hints = Hints()
        sched = AdaptDLScheduler(solve_wait_s=None, nodes_fn=cluster(8),
                                 allocation_interval_s=30, hints_fn=hints)
        tc, trial = start_trial(sched, "solo")
        hints.hints["solo"] = {"init_batch_size": 32, "max_profiled_replicas": 1,
                               "max_profiled_nodes": 1}
        clock[0] += 600
        assert sched.on_trial_result(tc, trial, LONG) == TrialScheduler.CONTINUE
        assert lines == []  # the line waits for the measured cost
        assert trial.replicas == 2  # (it resized in place)
        sched.on_trial_result(tc, trial, trial.result(**LONG, **{"adaptdl/restarts": 1,
                                                                 "adaptdl/resize_s": 0.4}))
        sched.on_trial_result(tc, trial, trial.result(**LONG, **{"adaptdl/restarts": 1}))
    finally:
        logger.removeHandler(handler)
    assert len(lines) == 1, lines
    line = lines[0]
    assert line.startswith("trial solo resized 1 -> 2 replicas (predicted speedup")
    assert "predicted saving" in line and "predicted cost 5.0 s" in line
    assert line.endswith("measured cost 0.4 s")
    entry = sched.state.jobs["solo"].resize_log[-1]
    assert (entry["cost_s"], entry["measured_s"]) == (5.0, 0.4)


def test_a_resize_whose_first_result_is_the_last_is_measured(clock):
    """Tune hands a trial's final result to on_trial_complete only: a resize it closes is
    measured all the same (its predicted and measured cost side by side)."""
    hints = Hints()
    sched = AdaptDLScheduler(solve_wait_s=None, nodes_fn=cluster(8), allocation_interval_s=30,
                             hints_fn=hints)
    tc, trial = start_trial(sched, "solo")
    hints.hints["solo"] = {"init_batch_size": 32, "max_profiled_replicas": 1,
                           "max_profiled_nodes": 1}
    clock[0] += 600
    assert sched.on_trial_result(tc, trial, LONG) == TrialScheduler.CONTINUE
    sched.on_trial_complete(tc, trial, trial.result(**LONG, **{
        "adaptdl/restarts": 1, "adaptdl/resize_s": 12.5, "done": True}))
    entry = sched.state.jobs["solo"].resize_log[-1]
    assert entry["measured_s"] == 12.5 and not sched.state.jobs["solo"].live


def test_results_do_not_trigger_allocations_within_the_interval():
    policy = CountingPolicy()
    sched = AdaptDLScheduler(solve_wait_s=None, nodes_fn=cluster(4), allocation_interval_s=3600,
                             policy=policy)
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


def test_interval_elapsed_reallocates_and_resizes_trials_in_place(clock):
    policy = CountingPolicy()
    hints = Hints()
    sched = AdaptDLScheduler(solve_wait_s=None, nodes_fn=cluster(4), allocation_interval_s=30,
                             policy=policy,
                             hints_fn=hints)
    tc, a = start_trial(sched, "a")
    assert a.replicas == 1
    # Profiled at 2 replicas with a perfectly scaling prior: exploration allows 4.
    hints.hints["a"] = PROFILED_2
    assert sched.on_trial_result(tc, a, LONG) == TrialScheduler.CONTINUE  # within the interval
    clock[0] += 31
    calls = policy.calls
    # The trial is told its new size and resizes itself; Tune does not pause it, and its
    # placement group keeps its minimum.
    assert sched.on_trial_result(tc, a, LONG) == TrialScheduler.CONTINUE
    assert policy.calls == calls + 1
    assert sched.state.jobs["a"].target == 4 and sched.target_of("a") == 4
    assert a.status == Trial.RUNNING and num_replicas_of(a.placement_group_factory) == 1
    assert sched.state.jobs["a"].resizes == 1
    # Until it reports the new size, it is not told again.
    assert sched.on_trial_result(tc, a, LONG) == TrialScheduler.CONTINUE
    assert sched.state.jobs["a"].resizes == 1


def test_growth_waits_until_the_room_is_free():
    sched = AdaptDLScheduler(solve_wait_s=None, nodes_fn=cluster(4), allocation_interval_s=3600,
                             resize_rule=lambda **kw: ResizeVerdict(True, "paying"))
    tc, a = start_trial(sched, "a")
    b = StubTrial("b")
    b.status = Trial.RUNNING
    b.placement_group_factory = placement_group_factory(JobSpec({"CPU": 1}), 3)
    tc.trials.append(b)  # a trial holding 3 CPUs that the scheduler wants to shrink
    sched.state.jobs["a"].target = 3
    assert sched.on_trial_result(tc, a, a.result(**LONG)) == TrialScheduler.CONTINUE
    assert sched.target_of("a") == 1  # no room yet: not told to grow
    b.status = Trial.PAUSED
    assert sched.on_trial_result(tc, a, a.result(**LONG)) == TrialScheduler.CONTINUE
    assert sched.target_of("a") == 3


def test_a_resized_trial_is_not_resumed_by_the_base_scheduler_before_it_fits():
    sched = AdaptDLScheduler(solve_wait_s=None, nodes_fn=cluster(4), allocation_interval_s=3600)
    tc, a = start_trial(sched, "a")
    b = StubTrial("b")
    b.status = Trial.RUNNING
    b.placement_group_factory = placement_group_factory(JobSpec({"CPU": 1}), 3)
    tc.trials.append(b)
    sched.state.jobs["a"].target = 4  # paused to grow to 4 while b still holds 3 CPUs
    sched._relaunches.add("a")
    a.status = Trial.PAUSED
    for _ in range(3):
        sched._last_check = float("-inf")
        assert sched.choose_trial_to_run(tc) is None
    b.status = Trial.TERMINATED
    sched._last_check = float("-inf")
    sched.state.jobs["a"].target = 4
    assert sched.choose_trial_to_run(tc) is a and a.replicas == 4


def test_a_slow_solve_runs_in_the_background_without_blocking_tune():
    """Tune's event loop never waits for the policy longer than solve_wait_s: the hook
    answers with the standing decisions and the new ones apply at a later hook."""
    import pickle
    import threading
    import time

    release = threading.Event()

    class SlowPolicy(CountingPolicy):
        def allocate(self, *args, **kwargs):
            release.wait(10)
            return super().allocate(*args, **kwargs)

    policy = SlowPolicy()
    sched = AdaptDLScheduler(nodes_fn=cluster(4), allocation_interval_s=3600, policy=policy,
                             solve_wait_s=0.01)
    tc = StubController(cpus=4)
    a = tc.add(sched, StubTrial("a"))
    assert sched.choose_trial_to_run(tc) is a  # the base's choice, not the solve's
    # The hook returned while the policy is still blocked (a hook that waited for the
    # solve would return only once the policy gave up waiting, with the solve applied).
    assert not release.is_set() and sched.driver.solving
    assert sched.state.num_allocations == 0
    # Tune pickles its configuration: the worker thread and the solve in flight stay behind.
    assert sched.driver.solving
    assert sched.driver.__getstate__()["_inflight"] is None
    assert sched.driver.__getstate__()["_executor"] is None
    pickle.dumps(AdaptDLScheduler(nodes_fn=None))
    release.set()
    deadline = time.monotonic() + 10
    while sched.state.num_allocations == 0 and time.monotonic() < deadline:
        sched._last_check = float("-inf")
        sched.choose_trial_to_run(tc)
        time.sleep(0.01)
    assert sched.state.num_allocations == 1 and policy.calls == 1
    assert sched.state.jobs["a"].target == 1


def test_once_interrupted_no_trial_starts_and_a_pickled_copy_starts_uninterrupted():
    """After the driver's Ctrl-C no trial starts or resumes (it would only be stopped
    again); the scheduler Tune pickles for a restore carries no interrupt."""
    import signal

    from ray import cloudpickle

    calls = []
    previous = signal.getsignal(signal.SIGINT)
    # Tune's handler, in place before the first hook: under Ray (an earlier test started
    # it) that hook installs the relay in front of whatever handler is there.
    signal.signal(signal.SIGINT, lambda s, f: calls.append(s))
    sched = AdaptDLScheduler(solve_wait_s=None, nodes_fn=cluster(4), allocation_interval_s=3600)
    tc = StubController(cpus=4)
    try:
        a = tc.add(sched, StubTrial("a"))
        assert sched._link.interrupts.relay.install()
        signal.raise_signal(signal.SIGINT)  # held back by the relay
        assert calls == []
        sched._last_check = float("-inf")
        assert sched.choose_trial_to_run(tc) is None and a.status == Trial.PENDING
        assert calls == [signal.SIGINT]  # nothing was running: handed to Tune at once
        copy = cloudpickle.loads(cloudpickle.dumps(sched))
        copy._last_check = float("-inf")
        assert copy.choose_trial_to_run(tc) is a
    finally:
        sched._link.interrupts.relay.uninstall()
        signal.signal(signal.SIGINT, previous)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def test_base_scheduler_decides_stopping():
    class StopAfterTwo(FIFOScheduler):
        def on_trial_result(self, tc, trial, result):
            return TrialScheduler.STOP if result["training_iteration"] >= 2 else \
                TrialScheduler.CONTINUE

    sched = AdaptDLScheduler(StopAfterTwo(), solve_wait_s=None, nodes_fn=cluster(4))
    tc, a = start_trial(sched, "a")
    assert sched.on_trial_result(tc, a, {"training_iteration": 1}) == TrialScheduler.CONTINUE
    assert sched.on_trial_result(tc, a, {"training_iteration": 2}) == TrialScheduler.STOP


def test_state_survives_a_new_scheduler_instance(tmp_path, clock):
    hints = Hints()
    sched = AdaptDLScheduler(solve_wait_s=None, nodes_fn=cluster(4), hints_fn=hints)
    tc = StubController()
    a = tc.add(sched, StubTrial("a", state_dir=str(tmp_path)))
    tc.start_pending(sched)
    hints.hints["a"] = PROFILED_2
    clock[0] += 31  # the next result re-solves, reading the hints
    sched.on_trial_result(tc, a, {"adaptdl/restarts": 3, "adaptdl/resize_s": 4.5})
    assert (tmp_path / STATE_FILE).exists()
    # Tuner.restore: a fresh scheduler sees the same trial again.
    again = AdaptDLScheduler(solve_wait_s=None, nodes_fn=cluster(4))
    tc2 = StubController()
    a2 = StubTrial("a", state_dir=str(tmp_path))
    tc2.add(again, a2)
    record = again.state.jobs["a"]
    assert record.created == sched.state.jobs["a"].created
    assert record.restarts == 3 and record.hints == PROFILED_2
    assert a2.status == Trial.PENDING


def test_state_file_round_trip_and_bad_json(tmp_path):
    state = CoreState()
    state.save(str(tmp_path))
    assert CoreState.load(str(tmp_path)).jobs == {}
    (tmp_path / STATE_FILE).write_text("{not json")
    with pytest.raises(ValueError):
        CoreState.load(str(tmp_path))


# -- no resize that cannot pay ----------------------------------------------------------
def test_a_trial_one_short_epoch_from_its_end_is_not_grown(clock):
    """The case that cost 22.9 s for ~1 s of training left: never again."""
    hints = Hints()
    sched = AdaptDLScheduler(solve_wait_s=None, nodes_fn=cluster(4), allocation_interval_s=30,
                             hints_fn=hints)
    tc, a = start_trial(sched, "a")
    hints.hints["a"] = PROFILED_2
    # 9 of 10 one-second epochs done; its last resize cost 22.9 s.
    record = sched.state.jobs["a"]
    record.resize_s = 22.9
    result = {"adaptdl/epochs_done": 9, "adaptdl/epochs": 10, "time_total_s": 9.0}
    clock[0] += 31
    assert sched.on_trial_result(tc, a, result) == TrialScheduler.CONTINUE
    assert record.remaining_s == pytest.approx(1.0)
    assert a.replicas == 1 and record.resizes == 0
    # The same trial with most of its training ahead grows.
    clock[0] += 31
    result.update({"adaptdl/epochs_done": 1, "time_total_s": 200.0})
    assert sched.on_trial_result(tc, a, result) == TrialScheduler.CONTINUE
    assert record.target == 4 and "saves" in record.resize_log[-1]["reason"]
    assert sched.target_of("a") == 4


def test_a_growth_whose_gain_is_below_its_cost_is_not_made(clock):
    hints = Hints()
    sched = AdaptDLScheduler(solve_wait_s=None, nodes_fn=cluster(4), allocation_interval_s=30,
                             hints_fn=hints, resize_cost_prior_s=30.0)
    tc, a = start_trial(sched, "a")
    # A fitted model that scales poorly: 4 replicas are predicted 1.25x one replica.
    hints.hints["a"] = {"init_batch_size": 64, "max_batch_size": 1024,
                        "perf_params": [0.01, 0.001, 0.05, 0.0001, 0.5, 0.0002, 1.2],
                        "grad_params": [1.0, 50.0], "max_profiled_replicas": 2,
                        "max_profiled_nodes": 1, "local_bsz_bounds": [16, 256]}
    record = sched.state.jobs["a"]
    record.resize_s = 30.0
    # 100 s left (more than two resize costs), but growing saves ~20 s < 30 s.
    result = {"adaptdl/epochs_done": 1, "adaptdl/epochs": 2, "time_total_s": 100.0}
    clock[0] += 600
    assert sched.on_trial_result(tc, a, result) == TrialScheduler.CONTINUE
    assert record.target > 1, "the policy proposed a growth"
    assert "not more than the resize cost" in record.last_veto
    assert a.replicas == 1 and record.resizes == 0


def test_resize_verdict_rules():
    assert not resize_verdict(current=1, target=2, remaining_s=10, cost_s=8).pays
    shrink = resize_verdict(current=4, target=2, remaining_s=100, cost_s=8)
    assert shrink.pays and shrink.saved_s is None
    grow = resize_verdict(current=1, target=2, remaining_s=100, cost_s=8, speedup_now=1.0,
                          speedup_new=1.9)
    assert grow.pays and grow.saved_s == pytest.approx(100 * (1 - 1 / 1.9))
    assert not resize_verdict(current=1, target=2, remaining_s=100, cost_s=8,
                              speedup_now=1.0, speedup_new=1.05).pays
    # A trial whose remaining training is unknown is not grown until known (the reason
    # says how a script makes it known); a shrink serves other jobs (a new arrival does
    # not wait for the others' first epoch).
    unknown = resize_verdict(current=1, target=2, remaining_s=None, cost_s=8)
    assert not unknown.pays and "remaining training not known" in unknown.reason
    assert "remaining_epochs_until(N)" in unknown.reason
    shrink = resize_verdict(current=2, target=1, remaining_s=None, cost_s=8)
    assert shrink.pays and "not known yet" in shrink.reason
    # A shrink the job's own model favours says so rather than blaming other jobs.
    faster = resize_verdict(current=3, target=1, remaining_s=300, cost_s=8, speedup_now=0.9,
                            speedup_new=1.0)
    assert faster.pays and "fewer replicas are predicted as fast: x1.11 at 1" in faster.reason
    others = resize_verdict(current=3, target=1, remaining_s=300, cost_s=8, speedup_now=2.0,
                            speedup_new=1.0)
    assert others.pays and others.reason.startswith("shrink for other jobs")
    with pytest.raises(ValueError, match="cost_s"):
        resize_verdict(current=1, target=2, remaining_s=1, cost_s=float("nan"))


# -- clear errors ---------------------------------------------------------------------
def test_rejects_a_trainable_not_made_by_the_creator():
    from ray import tune

    class Plain(tune.Trainable):
        pass

    sched = AdaptDLScheduler(solve_wait_s=None, nodes_fn=cluster(4))
    with pytest.raises(TypeError, match="AdaptDLTrainableCreator"):
        StubController().add(sched, StubTrial("x", trainable=Plain))


def test_a_ray_train_trainer_is_told_how_to_run_under_adaptdl():
    from ray import tune

    class TorchTrainer(tune.Trainable):  # what Tune runs for a Ray Train TorchTrainer
        pass

    sched = AdaptDLScheduler(solve_wait_s=None, nodes_fn=cluster(4))
    with pytest.raises(TypeError, match="train_loop_per_worker.*Coming from Ray Train"):
        StubController().add(sched, StubTrial("x", trainable=TorchTrainer))


def test_rejects_more_replicas_than_the_cluster_has():
    big = AdaptDLTrainableCreator(train_fn, min_replicas=5)
    sched = AdaptDLScheduler(solve_wait_s=None, nodes_fn=cluster(4))
    with pytest.raises(ValueError, match="min_replicas=5.*holds 4"):
        StubController().add(sched, StubTrial("x", trainable=big))


@pytest.mark.parametrize("kwargs, match", [
    ({"min_replicas": 3, "max_replicas": 2}, "min_replicas .3. must be <= max_replicas"),
    ({"min_replicas": 0}, "min_replicas must be an integer >= 1"),
    ({"num_cpus_per_worker": -1}, "num_cpus_per_worker"),
    ({"num_cpus_per_worker": float("nan")}, "num_cpus_per_worker"),
    ({"num_cpus_per_worker": 0}, "must request some resource"),
    ({"stop_timeout_s": 0}, "stop_timeout_s"),
    ({"stop_timeout_s": float("nan")}, "stop_timeout_s"),
    ({"stop_timeout_s": float("inf")}, "stop_timeout_s"),
    ({"collective_timeout_s": -1}, "collective_timeout_s"),
    ({"checkpoint_interval_s": 0}, "checkpoint_interval_s"),
    ({"checkpoint_interval_s": float("inf")}, "checkpoint_interval_s"),
    ({"name": ""}, "name"),
])
def test_creator_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AdaptDLTrainableCreator(train_fn, **kwargs)


def test_creator_sets_the_in_place_checkpoint_interval():
    assert AdaptDLTrainableCreator(train_fn).adaptdl_checkpoint_interval_s == 300.0
    assert AdaptDLTrainableCreator(train_fn, checkpoint_interval_s=None
                                   ).adaptdl_checkpoint_interval_s is None


def test_creator_rejects_a_function_without_a_config_argument():
    with pytest.raises(ValueError, match="must accept one argument"):
        AdaptDLTrainableCreator(lambda: None)


def test_with_resources_names_the_creator_arguments():
    from ray import tune
    with pytest.raises(TypeError, match="num_cpus_per_worker.*AdaptDLTrainableCreator"):
        tune.with_resources(TRAINABLE, {"cpu": 2})


@pytest.mark.parametrize("kwargs, error, match", [
    ({"allocation_interval_s": 0}, ValueError, "allocation_interval_s"),
    ({"allocation_interval_s": -1}, ValueError, "allocation_interval_s"),
    ({"allocation_interval_s": "30"}, ValueError, "allocation_interval_s"),
    ({"allocation_interval_s": True}, ValueError, "allocation_interval_s"),
    ({"allocation_interval_s": float("nan")}, ValueError, "allocation_interval_s"),
    ({"base_scheduler": "asha"}, TypeError, "base_scheduler.*ASHAScheduler"),
    ({"policy": "x"}, ValueError, "policy"),  # an unknown policy name
    ({"nodes_fn": 42}, TypeError, "nodes_fn"),
    ({"hints_fn": 42}, TypeError, "hints_fn"),
    ({"resize_rule": 42}, TypeError, "resize_rule"),
    ({"p": float("nan")}, ValueError, "p must be"),
    ({"solve_wait_s": -1}, ValueError, "solve_wait_s"),
])
def test_scheduler_rejects_bad_arguments_at_construction(kwargs, error, match):
    if "base_scheduler" in kwargs:
        with pytest.raises(error, match=match):
            AdaptDLScheduler(kwargs["base_scheduler"])
        return
    with pytest.raises(error, match=match):
        AdaptDLScheduler(**kwargs)


def test_metric_missing_from_results_is_named():
    sched = AdaptDLScheduler(solve_wait_s=None, nodes_fn=cluster(4))
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
    job = job_info(JobSpec({"CPU": 1}), cluster(16)(), created=0.0, hints=hints)
    assert job.max_replicas == 4  # explores at most twice the profiled count


def test_malformed_hints_fall_back_to_the_linear_prior():
    assert type(speedup_from_hints({"init_batch_size": -3})).__name__ == "LinearSpeedup"
    assert type(speedup_from_hints(None)).__name__ == "LinearSpeedup"


def test_a_hook_never_waits_for_the_disk(tmp_path):
    """State snapshots are taken in the hook and written by a writer thread: a write stuck
    on the disk does not hold up the hooks, and the file ends at the newest snapshot."""
    import threading
    import time

    from adaptdl_core.decision import state as state_module

    release = threading.Event()
    real = state_module.write_atomic

    def stuck_write(directory, name, text):
        release.wait(20)
        return real(directory, name, text)

    sched = AdaptDLScheduler(nodes_fn=cluster(4), allocation_interval_s=3600,
                             solve_wait_s=0.01)
    tc = StubController(cpus=4)
    try:
        state_module.write_atomic = stuck_write
        a = tc.add(sched, StubTrial("a", state_dir=str(tmp_path)))  # first write: stuck
        tc.start_pending(sched)
        t0 = time.perf_counter()
        # A relaunch with its measured cost is written at once, i.e. queued behind the
        # stuck write, not waited for.
        sched.on_trial_result(tc, a, {"adaptdl/restarts": 1, "adaptdl/resize_s": 4.5})
        assert time.perf_counter() - t0 < 5.0
        assert not sched.flush_state(timeout=0.05)
    finally:
        release.set()
        state_module.write_atomic = real
    assert sched.flush_state(timeout=10)
    assert CoreState.load(str(tmp_path)).jobs["a"].restarts == 1


def test_a_hook_stops_waiting_for_solves_once_they_are_slower_than_the_wait(clock):
    """A hook waits up to solve_wait_s for the solve it starts only while the previous
    solve took no longer; a slow policy's next solve is not waited for at all."""
    import threading
    import time

    gate = threading.Event()
    wait_s = 5.0

    def slow_round_trips(request):
        # The first solve reports a round trip slower than the wait (as a remote solver
        # does, in the request); the second blocks until the gate opens.
        if sched.state.num_allocations == 0:
            request.run()
            request.seconds = 2 * wait_s
        else:
            gate.wait(30)
            request.run()

    sched = AdaptDLScheduler(nodes_fn=cluster(4), allocation_interval_s=3600,
                             policy=CountingPolicy(), solve_wait_s=wait_s)
    sched.driver.solver = slow_round_trips
    tc = StubController(cpus=4)
    tc.add(sched, StubTrial("a"))
    sched.choose_trial_to_run(tc)  # the first solve: waited for (none was slow yet)
    assert sched.state.num_allocations == 1
    assert sched.driver.last_solve_s == 2 * wait_s
    tc.add(sched, StubTrial("b"))
    clock[0] += 2  # past the gap between event-driven solves
    sched._last_check = float("-inf")
    t0 = time.monotonic()
    sched.choose_trial_to_run(tc)  # starts the second (blocked) solve
    elapsed = time.monotonic() - t0
    assert sched.driver.solving and not gate.is_set()
    gate.set()
    deadline = time.monotonic() + 10
    while sched.state.num_allocations == 1 and time.monotonic() < deadline:
        sched._last_check = float("-inf")
        sched.choose_trial_to_run(tc)
        time.sleep(0.01)
    assert sched.state.num_allocations == 2
    # A hook that waited would have taken the whole wait_s (the solve stays blocked
    # meanwhile); half of it leaves the hook's own work room on a loaded machine.
    assert elapsed < wait_s / 2


GOOD_4 = {"init_batch_size": 64, "max_batch_size": 2048,
          "perf_params": [0.02, 0.002, 0.01, 0.0001, 0.005, 0.00005, 1.5],
          "grad_params": [1.0, 200.0], "local_bsz_bounds": [16, 512],
          "max_profiled_replicas": 4, "max_profiled_nodes": 1}


@pytest.mark.parametrize("share, configs, shared", [
    (True, [{}, {}], True),
    (False, [{}, {}], False),
    ("model/size", [{"model": {"size": 1}}, {"model": {"size": 1}}], True),
    ("model/size", [{"model": {"size": 1}}, {"model": {"size": 2}}], False),
    (lambda config: config.get("width"), [{"width": 8}, {"width": 8}], True),
    (lambda config: config.get("width"), [{"width": 8}, {"width": 16}], False),
])
def test_trials_share_a_throughput_profile_as_share_profiles_says(share, configs, shared):
    """By default a new trial is modelled with the best-profiled earlier trial's profile;
    share_profiles turns that off or keys it by a config entry."""
    hints = Hints()
    sched = AdaptDLScheduler(solve_wait_s=None, nodes_fn=cluster(8), hints_fn=hints,
                             share_profiles=share)
    tc = StubController()
    a, b = StubTrial("a"), StubTrial("b")
    a.config, b.config = configs
    tc.add(sched, a)
    tc.start_pending(sched)
    hints.hints["a"] = GOOD_4
    sched.core.update("a", hints=GOOD_4)
    tc.add(sched, b)
    seen = sched.core.hints_for("b")
    assert (seen is not None and seen["max_profiled_replicas"] == 4) == shared


def test_share_profiles_is_checked():
    with pytest.raises(TypeError, match="share_profiles"):
        AdaptDLScheduler(share_profiles=3)
    with pytest.raises(ValueError, match="share_profiles"):
        AdaptDLScheduler(share_profiles="/")


@pytest.mark.parametrize("share", [True, False])
def test_a_new_trial_grows_in_one_resize_to_what_the_shared_profile_supports(clock, share):
    """Tune starts every trial at min_replicas; with shared profiles the first resize of a
    new trial goes straight to the size the earlier trial's profile supports (one restart
    instead of a 1 -> 2 -> 4 ramp); alone it waits for a profile of its own."""
    hints = Hints()
    sched = AdaptDLScheduler(solve_wait_s=None, nodes_fn=cluster(8), allocation_interval_s=30,
                             hints_fn=hints, share_profiles=share)
    tc, a = start_trial(sched, "a")
    hints.hints["a"] = GOOD_4
    clock[0] += 31
    sched.on_trial_result(tc, a, {})  # the solve reads a's profile
    a.status = Trial.TERMINATED
    sched.on_trial_complete(tc, a, {})
    b = tc.add(sched, StubTrial("b"))
    tc.start_pending(sched)
    assert b.status == Trial.RUNNING and b.replicas == 1
    clock[0] += 2  # past the gap between event-driven solves
    assert sched.on_trial_result(tc, b, LONG) == TrialScheduler.CONTINUE
    target = sched.state.jobs["b"].target
    if share:
        assert target == 8 and sched.target_of("b") == 8
    else:
        assert target == 1 and sched.target_of("b") == 1
