"""When the throughput model is refitted (``_metrics.maybe_refit``): first after a few
profiled steps, then only when the profile's step times moved since the last fit.
In-process, one replica, a fake clock; no process group."""

import pytest

from adaptdl_core import context
from adaptdl_core.torch import _metrics

WORLD = (1, 1, 0)  # nodes, replicas, rank


@pytest.fixture
def clock(monkeypatch):
    context.reset()
    now = [1000.0]

    class Clock:
        @staticmethod
        def monotonic():
            return now[0]

        @staticmethod
        def time():
            return now[0]

    monkeypatch.setattr(_metrics, "time", Clock)
    yield now
    context.reset()


def _steps(count, seconds, local_bsz=32):
    for _ in range(count):
        _metrics.profile_micro_batch(seconds, local_bsz, optimizer_step=True, world=WORLD)


def test_refit_only_when_the_profile_moved(clock):
    _steps(_metrics.FIRST_FIT_STEPS, 0.010)
    m = _metrics.metrics()
    assert m.fits == 1 and m.perf_params is not None  # the first fit comes early

    # Same step times for many more steps and seconds: nothing to learn, no fit.
    for _ in range(5):
        clock[0] += 2 * _metrics.REFIT_MIN_INTERVAL_S
        _steps(_metrics.REFIT_EVERY_STEPS, 0.010)
    assert m.fits == 1

    # The steps got 50% slower: the running mean moves past REFIT_MIN_CHANGE, and the
    # refit happens at the next due check (not before REFIT_MIN_INTERVAL_S).
    _steps(_metrics.REFIT_EVERY_STEPS, 0.015)
    assert m.fits == 1
    clock[0] += _metrics.REFIT_MIN_INTERVAL_S
    _steps(_metrics.REFIT_EVERY_STEPS, 0.015)
    assert m.fits == 2

    # A new configuration (another local batch size) is always worth a fit.
    clock[0] += _metrics.REFIT_MIN_INTERVAL_S
    _steps(_metrics.REFIT_EVERY_STEPS, 0.030, local_bsz=64)
    assert m.fits == 3 and set(m.fitted_times) == {"1,1,32", "1,1,64"}


def test_moved_compares_every_time_of_every_configuration():
    fitted = {"1,1,32": (0.010, 0.012)}
    assert not _metrics._moved({"1,1,32": (0.0101, 0.0119)}, fitted)
    assert _metrics._moved({"1,1,32": (0.010, 0.0125)}, fitted)   # optimizer step +4%
    assert _metrics._moved({"1,1,32": (0.010, 0.012), "1,1,64": (0.02, 0.02)}, fitted)
    assert _metrics._moved({"1,1,32": (0.010, 0.012)}, None)
