"""The side values' schedule (``_gradient_probe``): when the small extra all-reduce of
several replicas goes, and how far apart each replica proposes the next one. Pure
bookkeeping, checked without processes."""


import torch

from adaptdl_core.torch import _gradient_probe
from adaptdl_core.torch._gradient_probe import (SIDE_VALUES_FIRST_EVERY, SIDE_VALUES_INTERVAL_S,
                                                SIDE_VALUES_MAX_EVERY, GradientProbe)


def _probe() -> GradientProbe:
    param = torch.nn.Parameter(torch.zeros(2))
    # (replicas=1 builds no process group; the schedule is the same for any count)
    return GradientProbe([param], torch.optim.SGD([param], lr=0.1), 1, False)


def test_due_at_the_agreed_step_and_restarted_by_a_new_loader():
    probe = _probe()
    assert probe._side_values_due(1)  # the first step
    probe.side_next = 10
    assert not probe._side_values_due(5)
    assert probe._side_values_due(10)
    assert probe._side_values_due(12)  # (a step was missed)
    # A loader created later counts from its own start: no waiting hundreds of steps.
    probe.side_next = 500
    assert probe._side_values_due(1)


def test_proposed_interval_is_about_the_target_time_within_bounds(monkeypatch):
    probe = _probe()
    now = [100.0]
    monkeypatch.setattr(_gradient_probe.time, "perf_counter", lambda: now[0])
    assert probe._propose_interval(1) == SIDE_VALUES_FIRST_EVERY  # no step time yet
    for step_s, expected in [(0.005, int(SIDE_VALUES_INTERVAL_S / 0.005)),  # 5 ms steps
                             (0.0001, SIDE_VALUES_MAX_EVERY),               # very fast
                             (1.0, 1)]:                                     # slow: every step
        step = probe.side_clock[1]
        now[0] += 4 * step_s
        assert probe._propose_interval(step + 4) == expected
