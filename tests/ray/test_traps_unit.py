"""The silent traps of a sweep (traps.py), each named once with its fix (no Ray cluster needed)."""

from __future__ import annotations

import logging
import pickle

import pytest

pytest.importorskip("ray.tune")
from ray.tune.execution.placement_groups import PlacementGroupFactory  # noqa: E402

from adaptdl_ray.tune import AdaptDLTrainableCreator  # noqa: E402
from adaptdl_core.decision import JobSpec  # noqa: E402
from adaptdl_ray.tune.resources import placement_group_factory  # noqa: E402
from adaptdl_ray.tune import traps  # noqa: E402
from adaptdl_ray.tune.traps import SILENT_AFTER_S, TrapWatch, warn_unscheduled  # noqa: E402
from tests.fake_clock import Clock


def test_a_trial_without_a_planned_number_of_epochs_is_named_once():
    watch = TrapWatch(30.0, clock=Clock())
    assert watch.result("a", {"adaptdl/epochs": 10}, resizable=True) is None
    # A fixed-size trial is never resized anyway: nothing to say.
    assert watch.result("b", {"adaptdl/epochs": 0}, resizable=False) is None
    message = watch.result("c", {"adaptdl/epochs": 0}, resizable=True)
    assert "trial c" in message and "remaining_epochs_until(N)" in message
    assert watch.result("d", {}, resizable=True) is None  # once per run


def test_a_silent_trial_the_policy_would_resize_is_named_once():
    clock = Clock()
    watch = TrapWatch(30.0, clock=clock)
    watch.result("quiet", {"adaptdl/epochs": 5}, resizable=True)
    # Kept at its size by the policy: silence is fine.
    clock.now = 1000.0
    assert watch.check([("quiet", 1, 1), ("new", 1, 1)]) is None
    # The policy wants it bigger, but it is silent for less than the threshold.
    clock.now = 1000.0 + SILENT_AFTER_S - 1
    assert watch.check([("new", 2, 1)]) is None
    clock.now = 1000.0 + SILENT_AFTER_S + 1
    message = watch.check([("new", 2, 1)])
    assert "trial new" in message and "from 1 to 2" in message and "tune.report" in message
    assert watch.check([("quiet", 4, 1)]) is None  # once per run


def test_a_result_or_a_pause_resets_the_silence():
    clock = Clock()
    watch = TrapWatch(90.0, clock=clock)
    watch.check([("a", 2, 1)])
    clock.now = 80.0
    watch.result("a", {"adaptdl/epochs": 5}, resizable=True)
    clock.now = 160.0
    assert watch.check([("a", 2, 1)]) is None  # 80 s since its result, under 90 s
    watch.forget("a")  # paused for a resize: starts afresh when it runs again
    clock.now = 240.0
    assert watch.check([("a", 2, 1)]) is None


def test_no_adaptdl_scheduler_is_named_with_the_fix(caplog):
    with caplog.at_level(logging.WARNING, logger=traps.__name__):
        warn_unscheduled(JobSpec({"CPU": 1}, min_replicas=1))
        warn_unscheduled(
            JobSpec({"CPU": 1}, min_replicas=2, max_replicas=2))  # fixed: no word
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1
    assert "fixed min_replicas=1" in messages[0]
    assert "AdaptDLScheduler(base_scheduler=ASHAScheduler(...))" in messages[0]


def test_resources_per_trial_error_points_to_the_creators_arguments():
    """Ray rejects resources_per_trial for a trainable with its own request by printing
    that request: printed, it names the creator's arguments (checked against Ray 2.60's
    message by hand: tune.run(trainable, resources_per_trial={"cpu": 2}))."""
    request = AdaptDLTrainableCreator(lambda config: None).default_resource_request({})
    text = str(request)
    assert "AdaptDLTrainableCreator(num_cpus_per_worker=" in text
    assert "resources_per_trial" in text and "{'CPU': 1.0}" in text
    # Still Tune's own request, equal to a plain one and picklable.
    plain = PlacementGroupFactory([{}, {"CPU": 1.0}], strategy="PACK")
    assert isinstance(request, PlacementGroupFactory) and request == plain
    assert pickle.loads(pickle.dumps(request)) == request
    assert "2 AdaptDL replica(s)" in str(placement_group_factory(JobSpec({"CPU": 1}), 2))
