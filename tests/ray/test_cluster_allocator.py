"""The cluster allocator on a real (local) Ray: shared solves, listings, restarts, and a
front-end that decides alone while the allocator cannot be reached."""

from __future__ import annotations

import logging
import time
import uuid

import pytest

from adaptdl_core.decision import CoreDriver, DecisionCore, JobSpec, NodeInfo
from adaptdl_ray.cluster import client
from adaptdl_ray.cluster.allocator import STATE_FILE
from tests.decision.test_core import GOOD_4

CPU = JobSpec({"CPU": 1})


def front_end(solver, jobs, nodes):
    core = DecisionCore(interval_s=60.0)
    core.set_nodes(nodes)
    driver = CoreDriver(core, solve_wait_s=None, solver=solver)
    for name in jobs:
        core.add_job(name, CPU)
        core.update(name, hints=GOOD_4)
    return driver


def wait_until(predicate, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if predicate():
                return True
        except Exception:  # noqa: BLE001 - the actor is restarting
            pass
        time.sleep(0.5)
    return False


def test_two_front_ends_share_the_cluster_and_the_allocator_survives_a_restart(
        ray_session, tmp_path):
    ray = ray_session
    ns = f"test-{uuid.uuid4().hex[:8]}"
    handle = client.start_allocator(ns, state_dir=str(tmp_path), interval_s=30.0)
    assert client.get_allocator(ns) is not None
    from adaptdl_ray.replicas.nodes import cluster_nodes
    nodes = cluster_nodes()
    capacity = sum(n.resources.get("CPU", 0) for n in nodes.values())
    a = front_end(client.AllocatorSolver("A", "sweep-a", interval_s=60, namespace_name=ns),
                  ["a1", "a2", "a3"], nodes)
    b = front_end(client.AllocatorSolver("B", "sweep-b", interval_s=60, namespace_name=ns),
                  ["b1"], nodes)
    a.step()
    b.step()
    a.core.state.last_allocation = -1e9
    a.step()
    targets = {k: r.target for d in (a, b) for k, r in d.core.state.jobs.items()}
    assert 0 < sum(targets.values()) <= capacity
    assert sum(targets[k] for k in ("a1", "a2", "a3")) == 3 * targets["b1"]
    rows = {r["name"]: r for r in ray.get(handle.jobs.remote())}
    assert set(rows) == {"a1", "a2", "a3", "b1"}
    assert rows["b1"]["experiment"] == "sweep-b" and rows["b1"]["target"] == targets["b1"]
    status = ray.get(handle.status.remote())
    assert status["members"] == 2 and status["jobs"] == 4 and status["solves"] >= 1
    assert (tmp_path / STATE_FILE).exists()

    # Killed, Ray restarts it (max_restarts=-1); it continues from its state file.
    pid = status["pid"]
    ray.kill(handle, no_restart=False)
    assert wait_until(lambda: ray.get(handle.status.remote(), timeout=5)["pid"] != pid)
    again = {r["name"]: r for r in ray.get(handle.jobs.remote())}
    assert set(again) == set(rows)
    assert again["a1"]["target"] == rows["a1"]["target"]
    assert again["a1"]["age_s"] >= rows["a1"]["age_s"]
    # A front-end that syncs after the restart keeps its share.
    b.core.state.last_allocation = -1e9
    b.step()
    assert b.core.state.jobs["b1"].target == targets["b1"]
    assert ray.get(handle.leave.remote("A", {"a1": "finished"})) is True
    rows = {r["name"]: r for r in ray.get(handle.jobs.remote())}
    assert {n for n, r in rows.items() if r.get("ended") is None} == {"b1"}
    # The ended front-end's jobs stay listed, with how they ended where it said.
    assert {n: r["status"] for n, r in rows.items() if r.get("ended") is not None} == \
        {"a1": "finished", "a2": "ended", "a3": "ended"}
    ray.kill(handle, no_restart=True)


def test_a_front_end_decides_alone_while_the_allocator_is_unreachable(monkeypatch, caplog):
    def unreachable(*args, **kwargs):
        raise ConnectionError("no allocator here")

    monkeypatch.setattr(client, "get_allocator", unreachable)
    solver = client.AllocatorSolver("A", "sweep-a", interval_s=60)
    driver = front_end(solver, ["a1"], {"n0": NodeInfo({"CPU": 4})})
    with caplog.at_level(logging.WARNING):
        driver.step()
    assert solver.alone and driver.core.state.jobs["a1"].target >= 1
    assert "decides for its own jobs alone" in caplog.text
    assert caplog.text.count("could not reach the cluster allocator") == 1
    # Within the retry delay the allocator is not asked again (and nothing more is said).
    driver.core.state.last_allocation = -1e9
    driver.step()
    assert caplog.text.count("could not reach the cluster allocator") == 1


def test_a_request_made_stale_by_the_allocators_start_is_solved_here(monkeypatch):
    # Seen under load: the allocator took 13 s to start; the first request,
    # built before, showed no trial running, and the allocator took the trials since
    # started for other work ("the whole cluster holds 0"). Such a request is solved
    # here, and the next one goes to the allocator.
    class Handle:
        class sync:  # noqa: N801 - stands in for an actor method
            calls = 0

            @classmethod
            def remote(cls, *args, **kwargs):
                cls.calls += 1
                raise ConnectionError("stand-in allocator")

    starts = []

    def slow_start(*args, **kwargs):
        starts.append(1)
        time.sleep(client._STALE_AFTER_S + 0.1)
        return Handle()

    monkeypatch.setattr(client, "get_allocator", slow_start)
    solver = client.AllocatorSolver("A", "sweep-a", interval_s=60)
    driver = front_end(solver, ["a1"], {"n0": NodeInfo({"CPU": 4})})
    driver.step()
    assert driver.core.state.jobs["a1"].target >= 1  # solved here
    assert Handle.sync.calls == 0 and not solver.alone
    # The next solve asks the started allocator (this stand-in fails it: solved alone).
    driver.core.state.last_allocation = -1e9
    driver.step()
    assert len(starts) == 1 and Handle.sync.calls == 1


def test_namespace_and_policy_errors_are_named(monkeypatch):
    monkeypatch.setenv(client.NAMESPACE_ENV, "team-a")
    assert client.namespace() == "team-a"
    assert client.namespace("other") == "other"
    with pytest.raises(ValueError, match="namespace"):
        client.namespace("  ")
    with pytest.raises(ValueError, match="policy must be one of"):
        client.start_allocator("x", policy="fifo")
