"""SharedSolve: one solve over the jobs of several front-ends (no Ray)."""

from __future__ import annotations

import pytest

from adaptdl_core.decision import (CoreDriver, DecisionCore, JobSpec, NodeInfo, SharedSolve,
                                   capacity_left)
from tests.decision.test_core import GOOD_4
from tests.fake_clock import Clock

GPU = JobSpec({"GPU": 1})
NODES = {"n0": NodeInfo({"GPU": 4}), "n1": NodeInfo({"GPU": 4})}


def front_end(shared, member, clock, jobs, *, label=None):
    """A front-end's core whose solves go to ``shared`` (as AllocatorSolver does)."""
    core = DecisionCore(clock=clock, interval_s=60.0)
    core.set_nodes(NODES)

    def solver(request):
        reply = shared.sync(member, request.to_plain(), label=label or member)
        request.accept(reply["allocations"], reply["unfit"])

    driver = CoreDriver(core, solve_wait_s=None, solver=solver)
    for name in jobs:
        core.add_job(name, GPU)
        core.update(name, hints=GOOD_4)
    return driver


def shares(driver):
    return {k: r.target for k, r in driver.core.state.jobs.items() if r.live}


def test_two_experiments_of_unequal_size_get_the_shares_of_one_objective():
    clock = Clock(1000.0)
    shared = SharedSolve(clock=clock)
    shared.set_nodes(NODES)
    a = front_end(shared, "A", clock, ["a1", "a2", "a3"])
    b = front_end(shared, "B", clock, ["b1"])
    a.step()
    b.step()
    a.core.state.last_allocation = -1e9  # A asks again: it learns of B
    a.step()
    # Alone, each experiment plans for the whole cluster: their plans overlap.
    alone_a = front_end(SharedSolve(clock=clock), "A", clock, ["a1", "a2", "a3"])
    alone_b = front_end(SharedSolve(clock=clock), "B", clock, ["b1"])
    for d in (alone_a, alone_b):
        d.solver = None
        d.step()
    assert sum(shares(alone_a).values()) + sum(shares(alone_b).values()) > 8
    # Shared: one Pollux solve over the four identical jobs (p = -1 over each job's
    # speedup at its fair share) gives each job the same share, so A gets 3x B's share,
    # exactly what one core over all four jobs decides.
    together = front_end(SharedSolve(clock=clock), "all", clock, ["a1", "a2", "a3", "b1"])
    together.solver = None
    together.step()
    expected = shares(together)
    got = dict(shares(a), **shares(b))
    assert got == expected
    assert sum(got.values()) <= 8
    assert sum(shares(a).values()) == 3 * sum(shares(b).values())


def test_a_member_that_leaves_or_expires_frees_its_share():
    clock = Clock(1000.0)
    shared = SharedSolve(clock=clock, interval_s=30.0)
    shared.set_nodes(NODES)
    a = front_end(shared, "A", clock, ["a1"])
    b = front_end(shared, "B", clock, ["b1"])
    a.step()
    b.step()
    before = shares(b)["b1"]
    assert shared.leave("A") is True and shared.leave("A") is False
    clock.now += 31
    b.core.state.last_allocation = -1e9
    b.step()
    assert shares(b)["b1"] > before
    # A member that stops syncing expires after its lease (3 intervals, at least 120 s).
    a.core.state.last_allocation = -1e9
    a.step()  # joins again at its next solve
    assert "A" in shared.members
    clock.now += 100
    b.core.state.last_allocation = -1e9
    b.step()  # B keeps syncing, A falls silent
    clock.now += 21
    assert shared.expire() == ["A"] and list(shared.members) == ["B"]


def test_state_survives_a_restart_of_the_solver():
    clock = Clock(1000.0)
    shared = SharedSolve(clock=clock)
    shared.set_nodes(NODES)
    a = front_end(shared, "A", clock, ["a1", "a2"], label="sweep-a")
    a.step()
    text = shared.to_json()
    clock.now += 500  # longer than a lease: a restart must not expire anyone
    again = SharedSolve(clock=clock)
    again.restore(text)
    again.set_nodes(NODES)
    assert again.expire() == []
    rows = {r["name"]: r for r in again.rows()}
    assert set(rows) == {"a1", "a2"} and rows["a1"]["experiment"] == "sweep-a"
    assert rows["a1"]["target"] == shares(a)["a1"]
    assert rows["a1"]["age_s"] == pytest.approx(500.0)  # its age counts on
    assert again.history == shared.history
    with pytest.raises(ValueError, match="malformed"):
        again.restore("{not json")


def test_capacity_held_by_other_work_is_not_divided():
    totals = {"n0": {"CPU": 8.0, "GPU": 2.0}, "n1": {"CPU": 8.0}}
    available = {"n0": {"CPU": 1.0, "GPU": 2.0}, "n1": {"CPU": 8.0}}
    held = {"n0": {"CPU": 4.0}}  # our jobs hold 4 of the 7 CPUs in use on n0
    nodes = capacity_left(totals, available, held)
    assert nodes["n0"].resources == {"CPU": 5.0, "GPU": 2.0}  # 3 CPUs held by others
    assert nodes["n1"].resources == {"CPU": 8.0}


def test_a_new_members_running_jobs_are_not_taken_for_other_work():
    # A sweep of short trials: eight one-CPU trials already hold every CPU when their experiment
    # first reports to the allocator, whose reading was taken just before. Their CPUs are
    # theirs, not other work's: the solve keeps one replica each (it divided nothing,
    # "1 -> 0" for all, before set_usage).
    clock = Clock(1000.0)
    shared = SharedSolve(clock=clock)
    totals = {"n0": {"CPU": 8.0}}
    shared.set_usage(totals, {"n0": {}})  # all eight CPUs in use
    assert shared.nodes["n0"].resources == {}
    core = DecisionCore(clock=clock, interval_s=60.0)
    core.set_nodes({"n0": NodeInfo({"CPU": 8})})
    cpu = JobSpec({"CPU": 1}, min_replicas=1, max_replicas=1)
    for i in range(8):
        core.add_job(f"t{i}", cpu)
        core.running(f"t{i}", ["n0"])
    reply = shared.sync("A", core.begin_solve().to_plain())
    assert shared.nodes["n0"].resources == {"CPU": 8.0}
    assert all(len(reply["allocations"][f"t{i}"]) == 1 for i in range(8))
    # Two trials end before the next reading: their CPUs, still shown in use, are not
    # other work's either.
    for i in (6, 7):
        core.remove(f"t{i}")
    shared.sync("A", core.begin_solve().to_plain())
    assert shared.nodes["n0"].resources == {"CPU": 8.0}
    # A later reading shows them free, and work outside AdaptDL holding one CPU.
    shared.set_usage(totals, {"n0": {"CPU": 1.0}})
    assert shared.nodes["n0"].resources == {"CPU": 7.0}


def test_rows_predict_batch_size_and_goodput_from_hints():
    clock = Clock(1000.0)
    shared = SharedSolve(clock=clock)
    shared.set_nodes(NODES)
    a = front_end(shared, "A", clock, ["a1"])
    a.step()
    a.core.running("a1", replicas=2)
    a.core.state.last_allocation = -1e9
    a.step()
    (row,) = shared.rows()
    assert row["status"] == "running" and row["replicas"] == 2
    assert row["batch_size"] >= GOOD_4["init_batch_size"] and row["goodput"] > 0


def test_bad_input_is_named():
    shared = SharedSolve()
    with pytest.raises(ValueError, match="member"):
        shared.sync("", {"jobs": {}})
    with pytest.raises(ValueError, match="to_plain"):
        shared.sync("A", {"nope": 1})
    with pytest.raises(TypeError, match="NodeInfo"):
        shared.set_nodes({"n0": {"GPU": 4}})
    with pytest.raises(ValueError, match="interval_s"):
        SharedSolve(interval_s=0)


def test_history_closes_the_share_of_an_ended_job():
    """A job its member no longer lists has its share ended in the history (so the sum of
    the shares at any time, rebuilt from the history, never exceeds the cluster)."""
    clock = Clock(1000.0)
    shared = SharedSolve(clock=clock)
    shared.set_nodes(NODES)
    a = front_end(shared, "A", clock, ["a1", "a2"])
    a.step()
    assert all(changes[-1][1] > 0 for changes in shared.history.values())
    a.core.remove("a1")
    clock.now += 1
    a.core.state.last_allocation = -1e9
    a.step()
    ended = [changes for key, changes in shared.history.items() if key.endswith("a1")]
    assert ended and ended[0][-1] == [clock.now, 0]


def test_a_job_other_work_leaves_no_room_for_waits_unannounced(caplog):
    """Only a job the whole cluster cannot hold is "unfit" (warned about): one that fits
    the cluster but not what other work leaves now (a trial's own reservation not reported
    yet, at a sweep's start) waits without a warning."""
    import logging
    clock = Clock(1000.0)
    shared = SharedSolve(clock=clock)
    totals = {"n0": {"CPU": 2.0}}
    shared.set_usage(totals, {"n0": {"CPU": 0.0}})  # all held by work it does not know
    core = DecisionCore(clock=clock, interval_s=60.0)
    core.set_nodes({"n0": NodeInfo({"CPU": 3})})  # (its own view: a node since gone smaller)

    def solver(request):
        reply = shared.sync("A", request.to_plain())
        request.accept(reply["allocations"], reply["unfit"])

    driver = CoreDriver(core, solve_wait_s=None, solver=solver)
    core.add_job("fits", JobSpec({"CPU": 1}, min_replicas=2))
    core.add_job("never", JobSpec({"CPU": 1}, min_replicas=3))
    with caplog.at_level(logging.WARNING):
        decisions = driver.decide()
    assert decisions["fits"].action == "wait"
    assert decisions["fits"].reason == "no room for it now"
    assert decisions["never"].reason == "the cluster cannot hold its minimum size"
    assert "job fits cannot run" not in caplog.text
    assert "job never cannot run on this cluster" in caplog.text


def test_a_job_reserving_its_share_before_it_reports_is_not_other_work():
    """A job starting into its share reserves it before its member reports it running
    there: a reading taken meanwhile shows those resources in use, and they are still the
    job's (else the others would be shrunk for work that is theirs)."""
    clock = Clock(1000.0)
    shared = SharedSolve(clock=clock)
    totals = {"n0": {"CPU": 4.0}}
    shared.set_usage(totals, {"n0": {"CPU": 4.0}})
    core = DecisionCore(clock=clock, interval_s=60.0)
    core.set_nodes({"n0": NodeInfo({"CPU": 4})})
    core.add_job("starting", JobSpec({"CPU": 1}, min_replicas=2, max_replicas=2))
    reply = shared.sync("A", core.begin_solve().to_plain())
    assert len(reply["allocations"]["starting"]) == 2
    # Its two bundles are reserved; it still reports 0 replicas.
    shared.set_usage(totals, {"n0": {"CPU": 2.0}})
    assert shared.nodes["n0"].resources == {"CPU": 4.0}
