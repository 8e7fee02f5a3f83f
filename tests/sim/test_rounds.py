"""The shared round loop: admission, rounds and events, stopping, max_time, policy objects."""

from __future__ import annotations

import pytest

from adaptdl_core.sim.baselines import FixedSharePolicy
from adaptdl_core.sim.cluster import WorkloadJob, simulate
from adaptdl_core.sim.job_model import SimJob, get_application
from adaptdl_core.sim.rounds import (ArrivalAdmission, Observer, QueueAdmission, Schedule,
                                     placement_of, run_rounds)


def _job(name, t=0.0, batch=None):
    return SimJob(name, get_application("cifar10"), t, target_batch_size=batch)


class _Log(Observer):
    def __init__(self):
        self.events = []

    def admitted(self, job, now):
        self.events.append(("admit", job.name, now))

    def allocated(self, now, jobs, allocations, decided):
        if decided:
            self.events.append(("decide", now, {k: len(v) for k, v in allocations.items()}))

    def ended(self, job, status, at):
        self.events.append(("end", job.name, status, at))


class _Counting(FixedSharePolicy):
    def __init__(self, gpus):
        super().__init__(gpus)
        self.calls = []

    def decide(self, now, jobs, allocations, nodes):
        self.calls.append((now, sorted(jobs)))
        return super().decide(now, jobs, allocations, nodes)


def test_arrival_admission_releases_jobs_in_arrival_order():
    late, early = _job("late", 100.0), _job("early", 10.0)
    adm = ArrivalAdmission([late, early])
    assert adm.admit(5.0, {}) == [] and adm.pending()
    assert [j.name for j in adm.admit(100.0, {})] == ["early", "late"]
    assert not adm.pending()


def test_queue_admission_keeps_at_most_concurrent_active():
    adm = QueueAdmission(["a", "b", "c"], lambda name, now: _job(name, now), concurrent=2)
    first = adm.admit(0.0, {})
    assert [j.name for j in first] == ["a", "b"] and first[0].submission_time == 0.0
    assert adm.admit(5.0, {j.name: j for j in first}) == []
    assert [j.name for j in adm.admit(9.0, {"b": first[1]})] == ["c"]
    assert not adm.pending()
    with pytest.raises(ValueError, match="concurrent"):
        QueueAdmission(["a"], lambda name, now: _job(name, now), concurrent=0)


def test_rounds_fall_on_the_interval_and_new_jobs_wait_for_the_next_one():
    # Cluster-style: the first round at the interval, decisions only at rounds. A job
    # submitted at 30 s is admitted at the 60-s step and placed at that round.
    pol = _Counting(2)
    jobs = [_job("a", 0.0, batch=512), _job("b", 30.0, batch=512)]
    log = _Log()
    run_rounds(pol, ArrivalAdmission(jobs), nodes={0: 4},
               schedule=Schedule(tick=60.0, interval=60.0, first_round=60.0),
               observer=log, max_time=180.0)
    assert [c[0] for c in pol.calls] == [60.0, 120.0, 180.0]
    assert pol.calls[0][1] == ["a", "b"]
    assert log.events[:3] == [("admit", "a", 0.0), ("admit", "b", 60.0),
                              ("decide", 60.0, {"a": 2, "b": 2})]
    # Their clocks follow the loop's: both have trained since the 60-s round.
    assert jobs[0].now == jobs[1].now == 180.0


def test_events_trigger_decisions_between_rounds_and_free_gpus_at_the_step_end():
    # Two 4-GPU shares on 4 GPUs: the second job waits until the first ends, and gets the
    # GPUs at the end of the tick the first ended in (an event, no round needed).
    pol = _Counting(4)
    a, b = _job("a", batch=512), _job("b", batch=512)
    log = _Log()
    out = run_rounds(pol, ArrivalAdmission([a, b]), nodes={0: 4},
                     schedule=Schedule(tick=5.0, on_events=True), observer=log)
    assert a.done and b.done and out.max_held == 4 and out.admitted == [a, b]
    end_a = next(e for e in log.events if e[:2] == ("end", "a"))
    decided = [e for e in log.events if e[0] == "decide"]
    assert decided[0] == ("decide", 0.0, {"a": 4})
    t = decided[1][1]
    assert decided[1][2] == {"b": 4} and end_a[3] <= t < end_a[3] + 5.0 and t % 5.0 == 0
    assert len(pol.calls) == 2  # at the admissions and at a's end; none once b ended


def test_a_stopping_rule_ends_a_job_at_the_step_end():
    class StopAtEpoch2:
        def stop(self, name, job, epochs_before):
            return job.epoch >= 2

    a = _job("a", batch=512)
    log = _Log()
    out = run_rounds(FixedSharePolicy(4), ArrivalAdmission([a]), nodes={0: 4},
                     schedule=Schedule(tick=5.0, on_events=True), stopping=StopAtEpoch2(),
                     observer=log)
    end = log.events[-1]
    assert end[:3] == ("end", "a", "stopped") and a.epoch == 2 and not a.done
    assert end[3] == out.now and out.now % 5.0 == 0 and not out.active


def test_over_allocation_is_an_error():
    class Greedy:
        def decide(self, now, jobs, allocations, nodes):
            return {k: [0] * 5 for k in jobs}

    with pytest.raises(RuntimeError, match="over-allocated node 0"):
        run_rounds(Greedy(), ArrivalAdmission([_job("a")]), nodes={0: 4},
                   schedule=Schedule(tick=5.0, on_events=True))


def test_schedule_and_placement_helpers():
    assert placement_of([3, 3, 1, 1, 1, 0]) == (2, 3, 1)
    assert placement_of([]) == ()
    with pytest.raises(ValueError, match="tick"):
        Schedule(tick=0.0)
    with pytest.raises(ValueError, match="interval"):
        Schedule(tick=1.0, interval=float("nan"))


def test_simulate_takes_a_policy_object():
    rows = [WorkloadJob(f"cifar10-{i}", 60.0 * i, "cifar10", 2, 512) for i in range(3)]
    pol = FixedSharePolicy(2)
    pol.tuned = ("batch_size",)  # its jobs keep the workload's batch
    out = simulate(rows, pol, nodes=1)
    assert out["policy"] == "static" and out["completed"] == 3
    # Only two 2-GPU shares fit: the third job waits for the first to end.
    assert out["jcts"]["cifar10-2"] > out["jcts"]["cifar10-0"]
    with pytest.raises(ValueError, match="policy object"):
        simulate(rows, pol, nodes=1, policy_options={"alpha": 1.0})
    with pytest.raises(ValueError, match="decide"):
        simulate(rows, object(), nodes=1)
