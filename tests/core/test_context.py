"""The job context: one object holds the job's process-wide state, and one reset forgets
it (in-process, no process group)."""

import threading

import pytest

from adaptdl_core import checkpoint, context
from adaptdl_core.torch import _interrupt, request_checkpoint, request_checkpoint_and_exit
from adaptdl_core.torch.step_cycle import NoiseMode, StepPlan


class Dummy(checkpoint.State):
    def save(self, fileobj):
        fileobj.write(b"x")

    def load(self, fileobj):
        pass


def test_world_comes_from_the_environment_until_the_job_starts(monkeypatch):
    monkeypatch.setenv("ADAPTDL_NUM_REPLICAS", "4")
    monkeypatch.setenv("ADAPTDL_REPLICA_RANK", "3")
    ctx = context.current()
    assert ctx.world == context.World(nodes=4, replicas=4, rank=3, restarts=0)
    monkeypatch.setenv("ADAPTDL_REPLICA_RANK", "1")
    assert ctx.world.rank == 1  # not cached before start()
    started = context.start(context.World(1, 2, 0, 5))
    assert started is ctx and ctx.world == context.World(1, 2, 0, 5)


def test_reset_forgets_states_requests_and_bookkeeping():
    ctx = context.current()
    Dummy("a")
    ctx.epoch_target = 7
    pending = request_checkpoint()
    request_checkpoint_and_exit()
    assert checkpoint.state_names() == ["a"] and _interrupt.exit_requested()
    context.reset()
    fresh = context.current()
    assert fresh is not ctx
    assert checkpoint.state_names() == [] and fresh.epoch_target is None
    assert not _interrupt.exit_requested() and not _interrupt.checkpoint_requested()
    assert pending.done and not pending.taken  # cancelled with the old context
    Dummy("a")  # the name is free again


def test_registry_counts_names_by_prefix_in_registration_order():
    for name in ("x-0", "y-0", "x-1"):
        Dummy(name)
    states = context.current().states
    assert states.names() == ["x-0", "y-0", "x-1"]
    assert states.count_prefix("x-") == 2 and states.get("y-0").name == "y-0"
    with pytest.raises(ValueError, match="already exists"):
        Dummy("x-1")


def test_one_context_for_every_thread():
    seen = []
    threads = [threading.Thread(target=lambda: seen.append(context.current()))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(c) for c in seen}) == 1 and seen[0] is context.current()


def test_step_plan_says_how_the_noise_is_measured():
    assert StepPlan(3, 2, 8, NoiseMode.HALVES).measures_first_micro_batch
    assert not StepPlan(3, 2, 8, NoiseMode.HALVES).measures_replicas
    assert StepPlan(3, 1, 8, NoiseMode.REPLICAS).measures_replicas
    assert not StepPlan(3, 1, 8, NoiseMode.NONE).measures_first_micro_batch
    assert StepPlan(1, 1, 1, NoiseMode.NONE) == StepPlan(1, 1, 1, NoiseMode.NONE)
    with pytest.raises(ValueError, match="micros"):
        StepPlan(1, 0, 8, NoiseMode.NONE)
