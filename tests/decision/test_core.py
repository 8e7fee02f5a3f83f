"""The decision core with a fake clock: no Ray, no Tune."""

from __future__ import annotations

import pytest

from adaptdl_core.decision import (CoreState, Decision, DecisionCore, JobProgress, JobSpec,
                                   NodeInfo)
from adaptdl_core.policy import ResizeVerdict
from tests.decision.stubs import CountingPolicy, FixedSizePolicy
from tests.fake_clock import Clock

GPU = JobSpec({"GPU": 1})
PROFILED_1 = {"init_batch_size": 32, "max_profiled_replicas": 1, "max_profiled_nodes": 1}
PROFILED_2 = {"init_batch_size": 32, "max_profiled_replicas": 2, "max_profiled_nodes": 1}
# A fitted model that scales poorly: 4 replicas are predicted about 1.25x one replica.
POOR = {"init_batch_size": 64, "max_batch_size": 1024,
        "perf_params": [0.01, 0.001, 0.05, 0.0001, 0.5, 0.0002, 1.2],
        "grad_params": [1.0, 50.0], "max_profiled_replicas": 2,
        "max_profiled_nodes": 1, "local_bsz_bounds": [16, 256]}


def make(gpus=4, nodes=1, interval=60.0, **kwargs):
    clock, policy = Clock(1000.0), CountingPolicy()
    core = DecisionCore(policy=policy, clock=clock, interval_s=interval, **kwargs)
    core.set_nodes({f"n{i}": NodeInfo({"GPU": gpus}) for i in range(nodes)})
    return core, clock, policy


def test_arrival_gets_a_start_decision_and_running_keeps_it():
    core, clock, _ = make()
    core.add_job("a", GPU)
    d = core.decide()["a"]
    assert isinstance(d, Decision)
    assert (d.action, d.replicas, d.nodes) == ("start", 1, ("n0",))
    core.running("a", nodes=list(d.nodes))
    assert core.decide()["a"].action == "keep"
    assert core.decision_for("a").action == "keep"


def test_a_burst_of_adds_is_one_solve():
    core, clock, policy = make()
    for i in range(10):
        core.add_job(f"j{i}", GPU)
    assert policy.calls == 0
    decisions = core.decide()
    assert policy.calls == 1
    assert sorted(d.action for d in decisions.values()) == ["start"] * 4 + ["wait"] * 6
    core.decide()
    assert policy.calls == 1


def test_event_solves_are_spaced_by_the_gap():
    core, clock, policy = make(min_event_gap_s=1.0)
    core.add_job("a", GPU)
    core.decide()
    core.add_job("b", GPU)
    assert not core.due() and core.decide()["b"].action == "wait"
    clock.now += 1.0
    assert core.decide()["b"].action == "start" and policy.calls == 2


def test_solves_take_at_most_their_share_of_the_time():
    # A sweep of 100 short trials re-solved on every trial's start and end, each
    # solve 0.3-1.9 s of the policy's time on the machine that ran the trials.
    import dataclasses

    clock = Clock(1000.0)

    class SlowPolicy(CountingPolicy):
        def allocate(self, *args, **kwargs):
            result = super().allocate(*args, **kwargs)
            clock.now += 2.0  # the solve takes 2 s, as the core's clock sees it too
            return dataclasses.replace(result, solve_time_s=2.0)

    core = DecisionCore(policy=SlowPolicy(), clock=clock, interval_s=30.0,
                        min_event_gap_s=1.0, max_solve_share=0.1)
    core.set_nodes({"n0": NodeInfo({"GPU": 4})})
    core.add_job("a", GPU)
    core.decide()
    core.add_job("b", GPU)
    clock.now += 17.9  # past the event gap, but a 2 s solve buys 20 s from its start
    assert not core.due() and core.decide()["b"].action == "wait"
    clock.now += 0.1
    assert core.due() and core.decide()["b"].action == "start"
    assert core.policy.calls == 2
    with pytest.raises(ValueError, match="max_solve_share"):
        DecisionCore(clock=clock, max_solve_share=0.0)
    # A clock that does not move during a solve (a simulation) imposes no rest.
    frozen = Clock(1000.0)
    core = DecisionCore(policy=CountingPolicy(), clock=frozen, min_event_gap_s=1.0,
                        max_solve_share=0.1)
    core.set_nodes({"n0": NodeInfo({"GPU": 4})})
    core.add_job("a", GPU)
    core.decide()
    core.add_job("b", GPU)
    frozen.now += 1.0
    assert core.due()


def test_interval_cadence():
    core, clock, policy = make(interval=30.0)
    core.add_job("a", GPU)
    core.decide()
    clock.now += 29
    core.decide()
    assert policy.calls == 1
    clock.now += 1
    assert core.due()
    core.decide()
    assert policy.calls == 2 and core.state.num_allocations == 2


def test_nodes_added_and_removed_trigger_a_solve():
    core, clock, policy = make(gpus=1)
    core.add_job("a", GPU)
    core.add_job("b", GPU)
    assert sorted(d.action for d in core.decide().values()) == ["start", "wait"]
    core.set_nodes({"n0": NodeInfo({"GPU": 1})})  # unchanged: no solve
    core.decide()
    assert policy.calls == 1
    core.set_nodes({"n0": NodeInfo({"GPU": 1}), "n1": NodeInfo({"GPU": 1})})
    assert {d.action for d in core.decide().values()} == {"start"}
    assert policy.calls == 2
    core.set_nodes({"n1": NodeInfo({"GPU": 1})})
    assert sorted(d.action for d in core.decide().values()) == ["start", "wait"]


def test_a_profiled_job_grows_and_the_resize_is_logged_with_its_measured_cost():
    core, clock, _ = make(interval=30.0)
    core.add_job("a", GPU)
    core.running("a", nodes=list(core.decide()["a"].nodes))
    core.update("a", hints=PROFILED_1)
    clock.now += 600
    d = core.decide()["a"]
    # Not resized while its remaining training is unknown...
    assert d.action == "hold" and "remaining training not known" in d.reason
    core.update("a", progress=JobProgress(remaining_s=3600.0))
    d = core.decide()["a"]  # ...and resized once known and paying
    assert d.action == "resize" and d.replicas == 2 and "saves" in d.reason
    core.begin_resize("a", d)
    record = core.state.jobs["a"]
    assert record.resizes == 1 and record.resize_pending
    entry = record.resize_log[-1]
    assert (entry["from"], entry["to"], entry["cost_s"]) == (1, 2, 30.0)
    assert "prior" in entry["cost_basis"] and "measured_s" not in entry
    core.running("a", nodes=list(d.nodes))
    assert core.update("a", progress=JobProgress(restarts=1, resize_cost_s=12.5))
    # Predicted and measured side by side.
    assert record.resize_s == 12.5 and entry["measured_s"] == 12.5 and entry["cost_s"] == 30.0
    assert core.resize_cost("a") == 12.5 and not record.resize_pending
    assert core.decide()["a"].action == "keep"


def test_restart_cost_comes_from_measurements():
    core, clock, _ = make()
    core.add_job("a", GPU)
    assert core.resize_cost("a") == 30.0  # the policy's prior
    # A quick start-up (3.4 s, one replica in the trial's own process) once predicted
    # a resize that took 28.3 s; a start-up only raises the prior, never lowers it.
    core.update("a", progress=JobProgress(launch_s=7.0))
    assert core.resize_cost("a") == 30.0
    core.update("a", progress=JobProgress(launch_s=41.0))
    assert core.resize_cost("a") == 41.0
    # A relaunch after a failure (no resize begun) is not a resize cost.
    core.update("a", progress=JobProgress(restarts=1, resize_cost_s=99.0))
    assert core.resize_cost("a") == 41.0
    core.running("a", replicas=1)
    core.begin_resize("a", to=2)
    core.update("a", progress=JobProgress(restarts=2, resize_cost_s=11.0))
    assert core.resize_cost("a") == 11.0


def test_a_finishing_job_is_left_alone():
    core, clock, _ = make(interval=30.0)
    core.add_job("a", GPU)
    core.running("a", nodes=list(core.decide()["a"].nodes))
    core.update("a", hints=PROFILED_2, progress=JobProgress(remaining_s=1.0))
    core.state.jobs["a"].resize_s = 22.9
    clock.now += 31
    assert core.finishing("a")
    assert core.decide()["a"].action == "keep"  # pinned: the policy keeps it at 1
    # With most of its training ahead it grows.
    core.update("a", progress=JobProgress(remaining_s=200.0))
    clock.now += 31
    d = core.decide()["a"]
    assert d.action == "resize" and d.replicas == 4 and "saves" in d.reason


def test_a_growth_that_does_not_pay_is_held_with_the_reason():
    core, clock, _ = make(interval=30.0)
    core.add_job("a", GPU)
    core.running("a", nodes=list(core.decide()["a"].nodes))
    core.update("a", hints=POOR, progress=JobProgress(remaining_s=100.0))
    core.state.jobs["a"].resize_s = 30.0
    clock.now += 600
    d = core.decide()["a"]
    assert d.action == "hold" and d.replicas == 1 and d.proposed > 1
    assert "not more than the resize cost" in d.reason
    assert d.saved_s is not None and d.saved_s < 30.0
    assert core.state.jobs["a"].last_veto == d.reason


def test_a_shrink_for_a_newcomer():
    core, clock, _ = make(interval=30.0)
    core.add_job("a", GPU)
    core.running("a", nodes=list(core.decide()["a"].nodes))
    core.update("a", hints=PROFILED_2, progress=JobProgress(remaining_s=1000.0))
    clock.now += 600
    d = core.decide()["a"]
    assert d.action == "resize" and d.replicas == 4
    core.begin_resize("a", d)
    core.running("a", nodes=list(d.nodes))
    clock.now += 600
    core.add_job("b", GPU)
    decisions = core.decide()
    assert decisions["b"].action == "start"
    assert decisions["a"].action == "resize" and decisions["a"].replicas < 4
    assert "shrink" in decisions["a"].reason


def test_min_and_max_replicas_are_respected():
    core, clock, _ = make(gpus=8, interval=30.0)
    core.add_job("small", JobSpec({"GPU": 1}, min_replicas=1, max_replicas=2))
    core.add_job("big", JobSpec({"GPU": 1}, min_replicas=3))
    decisions = core.decide()
    assert decisions["big"].replicas >= 3
    for job in ("small", "big"):
        core.running(job, nodes=list(decisions[job].nodes))
        core.update(job, hints={**PROFILED_2, "max_profiled_replicas": 4})
    clock.now += 600
    decisions = core.decide()
    assert decisions["small"].replicas <= 2
    with pytest.raises(ValueError, match="min_replicas=9.*holds 8"):
        core.add_job("huge", JobSpec({"GPU": 1}, min_replicas=9))


def test_a_removed_job_frees_its_replicas():
    core, clock, _ = make(gpus=1)
    core.add_job("a", GPU)
    core.add_job("b", GPU)
    first = core.decide()
    running = next(k for k, d in first.items() if d.action == "start")
    core.running(running, nodes=list(first[running].nodes))
    core.remove(running)
    other = "b" if running == "a" else "a"
    assert set(core.decide()) == {other}
    assert core.decide()[other].action == "start"
    with pytest.raises(KeyError, match="removed"):
        core.decision_for(running)


def test_a_custom_resize_rule_decides():
    calls = []

    def three_or_nothing(**kwargs):
        calls.append(kwargs)
        return ResizeVerdict(kwargs["target"] == 3, "three or nothing")

    clock, policy = Clock(1000.0), FixedSizePolicy(1)
    core = DecisionCore(policy=policy, clock=clock, interval_s=30.0,
                        resize_rule=three_or_nothing)
    core.set_nodes({"n0": NodeInfo({"GPU": 4})})
    core.add_job("a", GPU)
    assert core.decide()["a"].action == "start" and calls == []  # a start is no resize
    core.running("a", nodes=["n0"])
    core.update("a", hints=POOR, progress=JobProgress(remaining_s=100.0))
    # The policy proposes 2 replicas: the rule is asked, says no, and the job holds.
    policy.replicas = 2
    clock.now += 600
    d = core.decide()["a"]
    assert (d.action, d.replicas, d.proposed, d.reason) == ("hold", 1, 2, "three or nothing")
    assert calls and {(c["current"], c["target"], c["remaining_s"]) for c in calls} == \
        {(1, 2, 100.0)}
    # 3 replicas: the rule says yes, and the job resizes.
    policy.replicas = 3
    clock.now += 600
    d = core.decide()["a"]
    assert (d.action, d.replicas, d.reason) == ("resize", 3, "three or nothing")
    assert (calls[-1]["current"], calls[-1]["target"]) == (1, 3)


def test_state_round_trip_and_restore():
    core, clock, _ = make(interval=30.0)
    core.add_job("a", GPU)
    core.running("a", nodes=list(core.decide()["a"].nodes))
    core.update("a", hints=PROFILED_2, progress=JobProgress(restarts=3, remaining_s=50.0))
    text = core.state.to_json()
    again = DecisionCore(clock=clock, state=CoreState.from_json(text))
    record = again.state.jobs["a"]
    assert record.hints == PROFILED_2 and record.restarts == 3 and not record.live
    assert again.decide() == {}
    clock.now += 5
    again.set_nodes(core.nodes)
    again.add_job("a", GPU)
    assert again.state.jobs["a"].created == 1000.0
    assert again.decide()["a"].action == "start"
    # A state file written before the core existed (no spec/live/current fields) loads.
    old = ('{"trials": {"t1": {"created": 5.0, "restarts": 2, "target": 1, "nodes": ["n0"],'
           ' "unknown_field": 1}}, "last_allocation": 7.0, "num_allocations": 3}')
    state = CoreState.from_json(old)
    assert state.jobs["t1"].restarts == 2 and state.num_allocations == 3
    # Written under the key "jobs" now; the old attribute name warns and is the same dict.
    assert '"jobs":' in state.to_json() and '"trials"' not in state.to_json()
    assert CoreState.from_json(state.to_json()).jobs["t1"].restarts == 2
    with pytest.warns(DeprecationWarning, match="CoreState.jobs"):
        assert state.trials is state.jobs
    with pytest.raises(ValueError):
        CoreState.from_json("[1, 2]")


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="interval_s"):
        DecisionCore(interval_s=0)
    with pytest.raises(TypeError, match="policy"):
        DecisionCore(policy=object())
    core, clock, _ = make()
    with pytest.raises(KeyError, match="add_job"):
        core.update("nope", hints={})
    core.add_job("a", GPU)
    with pytest.raises(ValueError, match="remaining_s"):
        core.update("a", progress=JobProgress(remaining_s=float("nan")))
    with pytest.raises(ValueError, match="exactly one"):
        core.running("a")
    with pytest.raises(TypeError, match="JobSpec"):
        core.add_job("b", {"GPU": 1})


def test_running_jobs_known_only_by_count_are_placed_apart_and_finishing_ones_pinned():
    """Front-ends that know only replica counts (Tune): the core's placement guesses must
    not stack every job on the first node, or pinning the finishing ones is infeasible."""
    core, clock, _ = make(gpus=2, nodes=4, interval=30.0)
    for i in range(4):
        core.add_job(f"j{i}", GPU)
        core.running(f"j{i}", replicas=2)
        core.update(f"j{i}", progress=JobProgress(remaining_s=1.0))  # all finishing
    core.state.jobs["j0"].nodes = []
    clock.now += 31
    decisions = core.decide()
    assert {d.action for d in decisions.values()} == {"keep"}
    placed = sorted(n for d in decisions.values() for n in d.nodes)
    assert placed == sorted(["n0", "n1", "n2", "n3"] * 2)


def test_a_solve_run_elsewhere_applies_only_to_jobs_still_live():
    """begin_solve/run/finish_solve (a worker thread runs the middle part): jobs removed
    meanwhile are not revived, jobs added meanwhile wait for the next solve."""
    core, clock, policy = make(gpus=2)
    core.add_job("a", GPU)
    core.add_job("b", GPU)
    request = core.begin_solve()
    assert not core.due()
    core.remove("a")
    core.add_job("c", GPU)
    request.run()
    assert policy.calls == 1 and request.error is None
    core.finish_solve(request)
    assert core.state.jobs["a"].target == 0 and not core.state.jobs["a"].live
    assert core.decision_for("b").action == "start"
    assert core.decision_for("c").action == "wait"
    assert core.due()  # c arrived after the snapshot
    assert core.decide()["c"].action == "start"


def test_submission_time_dates_the_job_for_the_policy():
    seen = {}

    class Recording(CountingPolicy):
        def allocate(self, jobs, *args, **kwargs):
            seen.update({k: j.creation_timestamp for k, j in jobs.items()})
            return super().allocate(jobs, *args, **kwargs)

    clock = Clock(1000.0)
    core = DecisionCore(policy=Recording(), clock=clock)
    core.set_nodes({"n0": NodeInfo({"GPU": 4})})
    core.add_job("early", GPU, submitted=955.0)
    core.add_job("now", GPU)
    core.decide()
    assert seen == {"early": 955.0, "now": 1000.0}
    # Added again later, a job keeps its first date.
    core.remove("early")
    clock.now += 30
    core.add_job("early", GPU, submitted=1020.0)
    assert core.state.jobs["early"].created == 955.0
    with pytest.raises(ValueError, match="submitted"):
        core.add_job("late", GPU, submitted=clock.now + 1)
    with pytest.raises(ValueError, match="submitted"):
        core.add_job("bad", GPU, submitted=float("nan"))


# -- profile groups ----------------------------------------------------------------------
# A fitted model that scales well, profiled up to 4 replicas on one node.
GOOD_4 = {"init_batch_size": 64, "max_batch_size": 2048,
          "perf_params": [0.02, 0.002, 0.01, 0.0001, 0.005, 0.00005, 1.5],
          "grad_params": [1.0, 200.0], "local_bsz_bounds": [16, 512],
          "max_profiled_replicas": 4, "max_profiled_nodes": 1}
# A new trial's first fit: one replica, its own (early, small) gradient noise.
OWN_1 = dict(GOOD_4, perf_params=[0.03, 0.003, 0.0, 0.0, 0.0, 0.0, 1.0],
             grad_params=[1.0, 5.0], max_profiled_replicas=1)


def test_a_new_job_of_a_group_starts_from_the_groups_profile():
    """A job with no profile of its own starts where the group's best profile says it
    pays (here: the whole idle cluster), not at one replica; outside a group it explores
    from one replica."""
    outcomes = {}
    for group in ("sweep", None):
        core, clock, _ = make(gpus=8)
        spec = JobSpec({"GPU": 1}, profile_group=group)
        core.add_job("a", spec)
        core.running("a", nodes=["n0"] * 4)
        core.update("a", hints=GOOD_4)
        clock.now += 600
        core.remove("a")  # the donor ended: its profile stays the group's
        core.add_job("b", spec)
        outcomes[group] = core.decide()["b"]
        if group:
            assert core.group_profile("sweep")[0] == "a"
            seen = core.hints_for("b")
            assert seen["perf_params"] == GOOD_4["perf_params"]
            assert seen["max_profiled_replicas"] == 4
    assert outcomes["sweep"].action == "start" and outcomes["sweep"].replicas == 8
    assert outcomes[None].action == "start" and outcomes[None].replicas == 1


def test_a_grouped_job_keeps_its_own_gradient_statistics_and_outgrows_the_donor():
    core, clock, _ = make(gpus=8, profile_group="sweep")  # the default group
    core.add_job("a", GPU)
    core.update("a", hints=GOOD_4)
    core.add_job("b", GPU)
    core.update("b", hints=OWN_1)
    seen = core.hints_for("b")
    assert seen["perf_params"] == GOOD_4["perf_params"]
    assert seen["max_profiled_replicas"] == 4 and seen["grad_params"] == OWN_1["grad_params"]
    assert core.hints_for("a") is core.state.jobs["a"].hints  # the donor: its own
    assert core.hints_for("b") is seen  # cached while nothing changed
    # Once b's own profile covers as many replicas, b is modelled by its own hints.
    own_4 = dict(OWN_1, max_profiled_replicas=4)
    core.update("b", hints=own_4)
    assert core.hints_for("b") == own_4
    # A job of another group, or with a group of its own, borrows nothing from "sweep".
    core.add_job("c", JobSpec({"GPU": 1}, profile_group="other"))
    assert core.hints_for("c") is None
    # A newer fit of the group's best job replaces the group's profile; another job at
    # the same extent does not.
    newer = dict(GOOD_4, perf_params=[0.02, 0.002, 0.01, 0.0001, 0.004, 0.00005, 1.5])
    core.update("a", hints=newer)
    assert core.group_profile("sweep") == ("a", newer)


def test_profile_groups_survive_a_restore():
    core, clock, _ = make(gpus=8)
    spec = JobSpec({"GPU": 1}, profile_group="sweep")
    core.add_job("a", spec)
    core.update("a", hints=GOOD_4)
    core.add_job("b", spec)
    saved = CoreState.from_json(core.state.to_json())
    again, _, _ = make(gpus=8, state=saved)
    assert again.group_profile("sweep")[0] == "a"
    again.add_job("b", JobSpec({"GPU": 1}, profile_group="sweep"))
    assert again.hints_for("b")["max_profiled_replicas"] == 4


def test_group_hints_and_job_spec_groups_are_checked():
    from adaptdl_core.decision import group_hints

    assert group_hints(None, GOOD_4) is GOOD_4
    assert group_hints(GOOD_4, OWN_1) is GOOD_4  # its own covers more
    assert group_hints(OWN_1, {"init_batch_size": 64, "max_profiled_replicas": 8}) is OWN_1
    spec = JobSpec({"GPU": 1}, profile_group="sweep")
    assert JobSpec.from_dict(spec.to_dict()) == spec
    assert JobSpec.from_dict({"resources": {"GPU": 1}}).profile_group is None  # old files
    for bad in ("", 5):
        with pytest.raises(ValueError, match="profile_group"):
            JobSpec({"GPU": 1}, profile_group=bad)
        with pytest.raises(ValueError, match="profile_group"):
            DecisionCore(profile_group=bad)


def test_a_resize_cost_that_comes_after_the_relaunch_is_still_measured():
    """A front-end may see a resize's relaunch (its restarts grow) before its first step:
    the cost it reports later is the resize's, and an older resize's is never taken for
    a newer one's."""
    core, clock, _ = make()
    core.add_job("a", GPU)
    core.running("a", nodes=list(core.decide()["a"].nodes))
    core.begin_resize("a", to=2)
    core.update("a", progress=JobProgress(restarts=1))  # relaunched, no first step yet
    record = core.record("a")
    assert record.resize_s is None and record.cost_pending
    core.update("a", progress=JobProgress(restarts=1, resize_cost_s=0.4))
    assert record.resize_s == 0.4 and record.resize_log[-1]["measured_s"] == 0.4
    assert not record.cost_pending
    # A later report repeating it measures nothing new; the next resize waits for its own.
    core.update("a", progress=JobProgress(restarts=1, resize_cost_s=9.0))
    assert record.resize_s == 0.4
    core.begin_resize("a", to=1)
    core.update("a", progress=JobProgress(restarts=2, resize_cost_s=0.7))
    assert record.resize_s == 0.7 and record.resize_log[-1]["measured_s"] == 0.7


def test_a_job_resized_in_place_waits_for_its_last_resize_to_be_amortised():
    """The rule for jobs that resize in place: not again before the last resize is
    measured, then not before it is amortised (10x its cost, at least 10 s); the default
    rule (the simulator's, Pollux's) has no such wait."""
    from adaptdl_core.policy import amortised_resize_verdict
    core, clock, _ = make(interval=5.0, resize_rule=amortised_resize_verdict,
                          resize_cost_prior_s=1.0)
    core.add_job("a", GPU)
    core.running("a", nodes=list(core.decide()["a"].nodes))
    core.update("a", hints=GOOD_4, progress=JobProgress(remaining_s=10_000.0))
    clock.now += 600
    grow = core.decide(force=True)["a"]
    assert grow.action == "resize" and grow.replicas > 1
    core.begin_resize("a", grow)
    core.running("a", replicas=grow.replicas)  # (the front-end resized it)
    clock.now += 6
    # The policy wants another size right away: held until the resize is measured...
    core.record("a").target = 1
    held = core.decision_for("a")
    assert held.action == "hold" and "not measured yet" in held.reason
    core.update("a", progress=JobProgress(restarts=1, resize_cost_s=2.0))
    # ...and then until it has trained 20 s (10x its 2.0 s) at its size.
    held = core.decision_for("a")
    assert held.action == "hold" and "amortised after 20 s" in held.reason
    clock.now += 15
    assert core.decision_for("a").action == "resize"


def test_the_amortisation_rule_alone():
    from adaptdl_core.policy import amortised_resize_verdict
    args = dict(current=1, target=2, remaining_s=1000.0, cost_s=1.0, speedup_now=1.0,
                speedup_new=2.0)
    assert amortised_resize_verdict(**args).pays  # never resized
    assert not amortised_resize_verdict(since_last_s=100.0, last_cost_s=None, **args).pays
    assert not amortised_resize_verdict(since_last_s=9.0, last_cost_s=0.3, **args).pays
    assert amortised_resize_verdict(since_last_s=10.0, last_cost_s=0.3, **args).pays
    assert not amortised_resize_verdict(since_last_s=29.0, last_cost_s=3.0, **args).pays
    assert amortised_resize_verdict(since_last_s=30.0, last_cost_s=3.0, **args).pays
    with pytest.raises(ValueError, match="since_last_s"):
        amortised_resize_verdict(since_last_s=-1.0, last_cost_s=1.0, **args)
