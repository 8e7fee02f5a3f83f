"""The pure pieces every front-end shares: the room free for a grow, the relaunch queue, a
size not from a solve (JobSpec.fitted), a job's progress from its status, and restoring a
saved core."""

from __future__ import annotations

import json
import math

import pytest

from adaptdl_core.decision import (CoreDriver, CoreState, DecisionCore, JobSpec, NodeInfo,
                                   progress_from_status)
from adaptdl_core.decision.room import RelaunchQueue, fits, free_room

NODES = {"a": NodeInfo({"CPU": 4.0, "GPU": 2.0}), "b": NodeInfo({"CPU": 4.0})}


def test_free_room_is_the_cluster_less_what_the_jobs_hold():
    free = free_room(NODES, [({"CPU": 1.0}, 3, False), ({"CPU": 2.0, "GPU": 1.0}, 1, True)])
    assert free == {"CPU": 3.0, "GPU": 1.0}


def test_on_a_shared_cluster_what_others_hold_is_not_free_nor_what_starting_jobs_will():
    holdings = [({"CPU": 1.0}, 2, False), ({"CPU": 1.0}, 1, True)]
    # Ray counts 4 CPUs free: others hold 1, and the starting job's CPU is not taken yet.
    free = free_room(NODES, holdings, cluster_free={"CPU": 4.0, "GPU": 2.0})
    assert free == {"CPU": 3.0, "GPU": 2.0}
    # Alone (no cluster count), only this experiment's jobs count.
    assert free_room(NODES, holdings)["CPU"] == 5.0


def test_the_room_on_one_type_counts_its_nodes_and_what_may_be_on_them():
    nodes = {"a1": NodeInfo({"CPU": 4.0}, accelerator_type="A"),
             "a2": NodeInfo({"CPU": 2.0}, accelerator_type="A"),
             "b1": NodeInfo({"CPU": 8.0}, accelerator_type="B")}
    holdings = [({"CPU": 1.0}, 2, False, "A"), ({"CPU": 1.0}, 3, False, "B"),
                ({"CPU": 1.0}, 1, False, None),  # placed anywhere: counts on every type
                ({"CPU": 1.0}, 1, True)]          # (no type given: the same)
    assert free_room(nodes, holdings, accelerator_type="A") == {"CPU": 2.0}
    assert free_room(nodes, holdings, accelerator_type="B") == {"CPU": 3.0}
    assert free_room(nodes, holdings) == {"CPU": 7.0}  # every node, every holding
    # A type no node has: no room at all.
    assert not fits(free_room(nodes, holdings, accelerator_type="C"), {"CPU": 1.0}, 0, 1)
    # The shared cluster's own count, over every type, still bounds it; the starting
    # job on another type is still not shown as taken there.
    starting_b = [({"CPU": 1.0}, 2, True, "B")]
    assert free_room(nodes, starting_b, accelerator_type="A",
                     cluster_free={"CPU": 4.0}) == {"CPU": 2.0}
    assert free_room(nodes, starting_b, accelerator_type="A",
                     cluster_free={"CPU": 9.0}) == {"CPU": 6.0}


def test_a_job_fits_in_the_free_room_plus_what_it_holds():
    free = {"CPU": 1.0, "GPU": 0.0}
    assert fits(free, {"CPU": 1.0}, held=2, replicas=3)
    assert not fits(free, {"CPU": 1.0}, held=2, replicas=4)
    assert not fits(free, {"CPU": 1.0, "GPU": 1.0}, held=0, replicas=1)


def test_the_relaunch_queue_is_first_come_first_served_and_skips_jobs_without_room():
    queue = RelaunchQueue()
    queue.add("a")
    queue.add("b", 3)
    queue.add("c")
    queue.add("a", 2)  # a move fixes a's size; it keeps its place
    asked = []

    def ready(job_id, size):
        asked.append((job_id, size))
        return {"a": False, "b": None, "c": True}[job_id]

    assert queue.next(ready) == "c"
    assert asked == [("a", 2), ("b", 3), ("c", None)]
    assert "a" in queue and "b" not in queue and "c" not in queue and len(queue) == 1
    assert queue.next(lambda job_id, size: False) is None and len(queue) == 1
    queue.drop("a")
    assert len(queue) == 0 and queue.next(ready) is None


@pytest.mark.parametrize("wanted, spec, expected", [
    (3, JobSpec({"CPU": 1.0}), 3),                               # fits: as wanted
    (12, JobSpec({"CPU": 1.0}), 8),                              # as many as the nodes hold
    (1, JobSpec({"CPU": 1.0}, min_replicas=2), 2),               # never below the minimum
    (12, JobSpec({"CPU": 1.0}, max_replicas=5), 5),              # nor above the maximum
    (4, JobSpec({"GPU": 1.0}, min_replicas=3), 3),               # min beyond the room: waits
])
def test_a_size_not_from_a_solve_is_bounded_in_one_place(wanted, spec, expected):
    assert spec.fitted(wanted, NODES) == expected


def test_progress_from_status_estimates_the_time_left_and_ignores_malformed_values():
    progress = progress_from_status({"epochs_done": 2, "epochs": 10, "restarts": 3},
                                    trained_s=100.0, resize_cost_s=4.5, launch_s=2.0)
    assert progress.remaining_s == pytest.approx(400.0)
    assert (progress.restarts, progress.resize_cost_s, progress.launch_s) == (3, 4.5, 2.0)
    bad = progress_from_status({"epochs_done": "2", "epochs": math.nan, "restarts": True},
                               trained_s=-1, resize_cost_s=math.inf, launch_s=-2.0)
    assert bad.remaining_s is None and bad.restarts is None
    assert bad.resize_cost_s is None and bad.launch_s is None
    assert progress_from_status({}, trained_s=None).remaining_s is None


def test_a_driver_restores_the_saved_core_and_ignores_a_broken_file(tmp_path, caplog):
    core = DecisionCore(clock=lambda: 100.0)
    core.add_job("j", JobSpec({"CPU": 1.0}))
    CoreDriver(core, solve_wait_s=None, state_dir=str(tmp_path)).save()
    again = DecisionCore(clock=lambda: 200.0)
    driver = CoreDriver(again, solve_wait_s=None, state_dir=str(tmp_path))
    assert driver.restore_saved() == 1
    assert "j" in again.state.jobs and not again.state.jobs["j"].live
    assert CoreDriver(DecisionCore(), solve_wait_s=None).restore_saved() is None  # no dir
    (tmp_path / CoreState.FILE).write_text(json.dumps({"jobs": "not a dict"}))
    fresh = DecisionCore()
    assert CoreDriver(fresh, solve_wait_s=None, state_dir=str(tmp_path)).restore_saved() \
        is None
    assert not fresh.state.jobs and "starting afresh" in caplog.text
