"""Why a job runs below its maximum while the cluster has room: each reason on a
hand-made case, and the reason reaching the job's decision and a shared cluster's rows."""

from __future__ import annotations

import dataclasses

import numpy as np

from adaptdl_core.decision import (CoreDriver, DecisionCore, JobProgress, JobSpec, NodeInfo,
                                   SharedSolve)
from adaptdl_core.decision.held import held_reason, held_reasons, spare_replicas
from adaptdl_core.policy import JobInfo, PolluxPolicy
from tests.decision.test_core import GOOD_4
from tests.fake_clock import Clock

CPU = {"CPU": 1.0}


def job(speedup, *, age=3600.0, restarts=0, cost=1.0, upper=8, pinned=False):
    return JobInfo(resources=CPU, speedup_fn=speedup, creation_timestamp=0.0,
                   min_replicas=1, max_replicas=upper, num_restarts=restarts,
                   restart_cost_s=cost, preemptible=not pinned)


def linear(nodes, replicas):
    return np.asarray(replicas, dtype=float)


def flat(nodes, replicas):
    return np.minimum(np.asarray(replicas, dtype=float), 1.0)


def test_spare_counts_whole_replicas_left_on_each_node():
    nodes = {"a": NodeInfo({"CPU": 4}), "b": NodeInfo({"CPU": 2.5})}
    assert spare_replicas(CPU, nodes, {"a": {"CPU": 3}}) == 1 + 2
    assert spare_replicas({"CPU": 2}, nodes, {}) == 2 + 1


def test_nothing_to_say_at_the_maximum_or_without_room():
    info = job(linear)
    assert held_reason(info, replicas=3, num_nodes=1, spare=2, allowed=3, now=3600) is None
    assert held_reason(info, replicas=1, num_nodes=1, spare=0, allowed=None, now=3600) is None


def test_each_reason_on_its_case():
    def why(info, **kw):
        args = dict(replicas=1, num_nodes=1, spare=3, allowed=4, now=3600.0)
        args.update(kw)
        return held_reason(info, **args)

    assert why(job(linear, pinned=True)).startswith("nearly finished")
    exploring = why(job(linear, upper=1), profiled=1, exploration_factor=2)
    assert "throughput model covers up to 1 replica(s), so it may try up to 2" in exploring
    assert "not fitted yet" in why(job(linear, upper=1))
    assert why(job(flat)).startswith("its throughput model predicts no gain")
    # x4 at 4 replicas, but 100 s old with 3 restarts of 30 s: (100-90)/130 of it is kept.
    young = why(job(linear, restarts=3, cost=30.0), now=100.0)
    assert young.startswith("a resize does not pay yet: x4.00 predicted at 4 replicas")
    assert "keep 8% of that" in young
    # Old, cheap to restart, and it gains: only the policy's choice over all jobs is left.
    assert why(job(linear)).startswith("the policy gave the room to other jobs (x4.00")


def test_held_reasons_of_a_solve_count_the_room_its_allocation_left():
    nodes = {"n0": NodeInfo({"CPU": 6})}
    infos = {"flat": job(flat), "full": job(linear)}
    allocations = {"flat": ["n0"], "full": ["n0", "n0", "n0"]}
    reasons = held_reasons(infos, nodes, allocations, 3600.0,
                           allowed={"flat": 3, "full": 3}, profiled={})
    assert set(reasons) == {"flat"}  # "full" is at its maximum
    assert "no gain" in reasons["flat"]
    # With no room left, nothing is explained.
    assert held_reasons(infos, {"n0": NodeInfo({"CPU": 4})},
                        {"flat": ["n0", "n0"], "full": ["n0", "n0"]}, 3600.0,
                        allowed={"flat": 3, "full": 3}, profiled={}) == {}


class OneReplica(PolluxPolicy):
    """Pollux, but every job gets one replica (as a policy weighing other jobs might)."""

    def allocate(self, jobs, nodes, base=None, now=None):
        result = super().allocate(jobs, nodes, base, now=now)
        return dataclasses.replace(result, allocations={
            k: list(v[:1]) for k, v in result.allocations.items()})


def test_the_reason_is_the_keep_decisions_and_leaves_with_the_job():
    clock = Clock(now=10_000.0)
    core = DecisionCore(policy=OneReplica(), clock=clock, interval_s=60.0)
    core.set_nodes({"n0": NodeInfo({"CPU": 4})})
    core.add_job("a", JobSpec(CPU, max_replicas=4))
    core.update("a", hints=GOOD_4, progress=JobProgress(remaining_s=10_000.0))
    core.running("a", nodes=["n0"])
    clock.now += 600
    decision = core.decide(force=True)["a"]
    assert (decision.action, decision.replicas) == ("keep", 1)
    assert decision.reason.startswith("the policy gave the room to other jobs")
    assert core.record("a").held == decision.reason
    core.remove("a")
    assert core.record("a").held is None


def test_a_job_shrunk_for_another_grows_back_when_that_one_fails():
    """Two front-ends share 4 CPUs; B's job takes 2 of them from A's, then fails: A's
    next solve gives A its room back (within one allocation round)."""
    clock = Clock(now=10_000.0)
    nodes = {"n0": NodeInfo({"CPU": 4})}
    shared = SharedSolve(clock=clock, interval_s=30.0)
    shared.set_nodes(nodes)

    def front_end(member, name, spec):
        core = DecisionCore(clock=clock, interval_s=30.0)
        core.set_nodes(nodes)

        def solver(request):
            reply = shared.sync(member, request.to_plain(), label=name, kind="job",
                                owner="ada@host")
            request.accept(reply["allocations"], reply["unfit"], reasons=reply["reasons"])

        driver = CoreDriver(core, solve_wait_s=None, solver=solver)
        core.add_job(name, spec, name=name)
        core.update(name, hints=GOOD_4, progress=JobProgress(remaining_s=5000.0))
        return driver

    big = front_end("A", "big", JobSpec(CPU, max_replicas=4))
    big.step()
    target = big.core.record("big").target
    assert target == 4
    big.core.running("big", replicas=target)
    clock.now += 31
    bad = front_end("B", "bad", JobSpec(CPU, min_replicas=2, max_replicas=2))
    bad.step()
    assert bad.core.record("bad").target == 2
    clock.now += 31
    big.step()
    assert big.core.record("big").target == 2  # shrunk for the newcomer
    big.core.running("big", replicas=2)
    # The newcomer fails at once: its front-end leaves, saying so.
    bad.core.remove("bad", "failed")
    shared.leave("B", {"bad": "failed"})
    clock.now += 31
    big.step()
    assert big.core.record("big").target == 4  # its room, back within one round
    rows = {r["name"]: r for r in shared.rows()}
    assert rows["bad"]["status"] == "failed" and rows["bad"]["owner"] == "ada@host"
    assert rows["big"]["status"] == "running" and rows["big"].get("ended") is None
