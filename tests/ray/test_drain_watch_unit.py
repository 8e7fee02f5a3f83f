"""DrainWatch: which jobs have a replica on a draining node, checked at most every check_s
(the Tune scheduler's and the job supervisor's one check)."""

from __future__ import annotations

import time

from adaptdl_ray.replicas.nodes import DrainWatch
from adaptdl_ray.tune.scheduler_args import ProfileGroups
from tests.fake_clock import Clock


def test_jobs_on_a_draining_node_are_named_with_the_node_and_its_deadline():
    clock, draining, asked = Clock(), {}, []
    watch = DrainWatch(2.0, lambda: draining, clock=clock)

    def nodes_of():
        asked.append(clock.now)
        return {"t1": ["node-a", "node-b"], "t2": ["node-c"]}

    assert watch.check(nodes_of) == [] and asked == []  # nothing drains: jobs not asked
    draining["node-b"] = time.time() + 60
    clock.now = 1.0
    assert watch.check(nodes_of) == []  # within check_s of the last check
    clock.now = 2.5
    [(job, hit, why)] = watch.check(nodes_of)
    assert (job, hit) == ("t1", ["node-b"]) and asked == [2.5]
    assert why.startswith("node(s) node-b draining (deadline in ") and why.endswith(" s)")
    watch.reset()  # a new launch: checked at once
    assert [m[0] for m in watch.check(nodes_of)] == ["t1"]
    draining["node-c"] = None
    clock.now = 10.0
    assert [(m[0], m[2]) for m in watch.check(nodes_of)][1] == \
        ("t2", "node(s) node-c draining (no deadline)")


def test_a_failed_check_is_logged_and_tried_again_at_the_next_check(caplog):
    clock = Clock()

    def broken():
        raise RuntimeError("GCS unreachable")

    watch = DrainWatch(2.0, broken, clock=clock)
    assert watch.check(lambda: {"t1": ["n"]}) == []
    assert "could not check for replicas on draining nodes (GCS unreachable)" in caplog.text
    watch.draining_fn = lambda: {"n": None}
    assert watch.check(lambda: {"t1": ["n"]}) == []  # not before check_s
    clock.now = 2.0
    assert [m[0] for m in watch.check(lambda: {"t1": ["n"]})] == ["t1"]


def test_profile_groups_name_the_first_trial_without_the_entry_once(caplog):
    groups = ProfileGroups("model/size")
    assert groups.of("t1", {"model": {"size": 3}}) == "model/size=3"
    assert groups.of("t2", {"lr": 1}) == "model/size: missing"
    assert groups.of("t3", {}) == "model/size: missing"
    assert caplog.text.count("has no config entry") == 1 and "trial t2" in caplog.text
    assert ProfileGroups(False).of("t", {"a": 1}) is None
    assert ProfileGroups(True).of("t", None) == "all-trials"
    assert ProfileGroups(lambda config: config.get("a")).of("t", {"a": 1}) == "key=1"
