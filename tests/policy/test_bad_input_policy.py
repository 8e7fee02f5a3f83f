"""Bad input to the goodput model and the allocation policy: each case fails at
the call with a message naming the argument, or is bounded with a warning; nothing returns
NaN, -inf or a negative efficiency, and nothing allocates memory by the nodes' capacity."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest

from adaptdl_core.goodput import GoodputFunction, GradParams, PerfParams, efficiency
from adaptdl_core.policy import JobInfo, NodeInfo, PolluxPolicy, resize_verdict
from adaptdl_core.policy.records import MAX_REPLICAS_PER_JOB

NAN = float("nan")
INF = float("inf")
PERF = PerfParams(0.017, 0.0007, 0.12, 0.0024, 0.03, 0.0034, 2.0)


def model():
    return GoodputFunction(PERF, GradParams(0.01, 0.1), 32)


# -- goodput ---------------------------------------------------------------------------------

@pytest.mark.parametrize("args, name", [
    ((1, 1, -32, 0), "atomic_bsz"),
    ((1, 1, 0, 0), "atomic_bsz"),
    ((1, NAN, 32, 0), "num_replicas"),
    ((1, -1, 32, 0), "num_replicas"),
    ((INF, 1, 32, 0), "num_nodes"),
    ((1, 1, 32, -1), "accum_steps"),
    ((1, 1, 32, NAN), "accum_steps"),
    (("x", 1, 32, 0), "num_nodes"),
])
@pytest.mark.parametrize("method", ["evaluate", "throughput", "__call__"])
def test_goodput_rejects_bad_configurations(args, name, method):
    with pytest.raises(ValueError, match=rf"^{name} must"):
        getattr(model(), method)(*args)


def test_goodput_names_the_bad_entry_of_an_array():
    with pytest.raises(ValueError, match=r"num_replicas .* got nan \(entry 2\)"):
        model().evaluate(1, [1, 2, NAN], 32, 0)


def test_goodput_still_evaluates_valid_configurations():
    fn = model()
    values = fn.evaluate(1, np.array([0, 1, 2]), 32, 0)
    assert values[0] == 0.0 and np.all(np.isfinite(values)) and np.all(values[1:] > 0)
    assert float(fn.evaluate(1, 1, 32, 0)) == pytest.approx(
        float(fn.throughput(1, 1, 32, 0)) * float(fn.efficiency(32)))


@pytest.mark.parametrize("args, name", [
    ((-40, 32, 64), "noise_scale"),
    ((NAN, 32, 64), "noise_scale"),
    ((INF, 32, 64), "noise_scale"),
    ((0, 0, 64), "init_batch_size"),
    ((0, -32, 64), "init_batch_size"),
    ((0, 32, NAN), "batch_size"),
    ((0, 32, -1), "batch_size"),
    ((0, 32, [64, INF]), "batch_size"),
])
def test_efficiency_rejects_bad_arguments(args, name):
    with pytest.raises(ValueError, match=rf"^{name} must"):
        efficiency(*args)


def test_efficiency_of_valid_arguments_is_in_0_1():
    e = efficiency(40.0, 32, np.array([0.0, 32.0, 64.0, 1e12]))
    assert np.all((e > 0) & (e <= 1)) and e[0] == e[1] == 1.0
    with pytest.raises(ValueError, match="batch_size"):
        model().efficiency(-1)


# -- resize_verdict --------------------------------------------------------------------------

GROW = dict(current=1, target=2, remaining_s=100.0, cost_s=1.0, speedup_now=1.0,
            speedup_new=2.0)


@pytest.mark.parametrize("field, bad", [
    ("remaining_s", NAN), ("remaining_s", -1.0), ("remaining_s", INF),
    ("cost_s", NAN), ("cost_s", -1.0),
    ("speedup_now", NAN), ("speedup_new", INF), ("speedup_new", -1.0),
    ("current", 0), ("target", 0), ("current", True), ("target", 1.5),
    ("min_cost_multiples", NAN), ("min_cost_multiples", -2.0),
])
def test_resize_verdict_rejects_bad_arguments(field, bad):
    with pytest.raises(ValueError, match=rf"^{field} must") as info:
        resize_verdict(**{**GROW, field: bad})
    assert repr(bad) in str(info.value)


def test_resize_verdict_accepts_numpy_counts_and_decides_as_before():
    verdict = resize_verdict(**{**GROW, "current": np.int64(1), "target": np.int32(2)})
    assert verdict.pays and verdict.saved_s == pytest.approx(50.0)
    assert "nan" not in verdict.reason


# -- the allocator ---------------------------------------------------------------------------

def _raise_zero_division(n, k):
    return 1 / 0


def _raise_type_error(n, k):
    return np.asarray(k) + "x"


def _wrong_shape(n, k):
    return np.ones(3) * np.ones((2, 1))


@pytest.mark.parametrize("fn, cause", [(_raise_zero_division, "ZeroDivisionError"),
                                       (_raise_type_error, "UFuncTypeError|TypeError"),
                                       (_wrong_shape, "ValueError")])
@pytest.mark.parametrize("fair_share", [False, True])
def test_a_failing_speedup_function_is_named(fn, cause, fair_share):
    jobs = {"bad": JobInfo({"CPU": 1}, fn, 0.0)}
    with pytest.raises(ValueError, match=rf"jobs\['bad'\]\.speedup_fn failed .*({cause})") \
            as info:
        PolluxPolicy(fair_share=fair_share).allocate(jobs, {"n": NodeInfo({"CPU": 4})},
                                                     now=1.0)
    assert info.value.__cause__ is not None


def _linear(n, k):
    return np.asarray(k, dtype=np.float64) * np.ones(np.shape(n))


def test_a_huge_max_replicas_is_lowered_to_the_bound_with_a_warning(caplog):
    huge = 10 ** 9 + 17    # a value no other test uses: the warning is once per value
    with caplog.at_level(logging.WARNING, logger="adaptdl_core.policy.records"):
        job = JobInfo({"CPU": 1}, _linear, 0.0, max_replicas=huge)
    assert job.max_replicas == MAX_REPLICAS_PER_JOB
    assert f"max_replicas={huge}" in caplog.text and "MAX_REPLICAS_PER_JOB" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="adaptdl_core.policy.records"):
        again = JobInfo({"CPU": 1}, _linear, 0.0, max_replicas=huge)
    assert again.max_replicas == MAX_REPLICAS_PER_JOB and caplog.text == ""
    # What once allocated a billion-entry array: now as much as the bound allows.
    result = PolluxPolicy().allocate({"a": job}, {"n": NodeInfo({"CPU": 1e12})}, now=1.0)
    assert len(result.allocations["a"]) == MAX_REPLICAS_PER_JOB


def test_a_max_replicas_within_the_bound_is_kept(caplog):
    with caplog.at_level(logging.WARNING, logger="adaptdl_core.policy.records"):
        job = JobInfo({"CPU": 1}, _linear, 0.0, max_replicas=MAX_REPLICAS_PER_JOB)
    assert job.max_replicas == MAX_REPLICAS_PER_JOB and caplog.text == ""
    result = PolluxPolicy().allocate({"a": JobInfo({"CPU": 1}, _linear, 0.0, max_replicas=6)},
                                     {"n": NodeInfo({"CPU": 1e6})}, now=1.0)
    assert len(result.allocations["a"]) == 6


@pytest.mark.parametrize("bad", [MAX_REPLICAS_PER_JOB + 1, 10 ** 9])
def test_a_min_replicas_above_the_bound_is_refused(bad):
    with pytest.raises(ValueError, match=rf"min_replicas must be an integer in \[0, "
                                         rf"{MAX_REPLICAS_PER_JOB}\].*got {bad}"):
        JobInfo({"CPU": 1}, _linear, 0.0, min_replicas=bad)


def test_goodput_values_stay_finite_through_the_policy():
    from adaptdl_core.policy import SpeedupFunction

    fn = SpeedupFunction(model(), 1024, (8, 256))
    values = fn(np.array([1, 1, 2, 3]), np.array([1, 4, 8, 64]))
    assert np.all(np.isfinite(values)) and math.isclose(values[0], 1.0)


_HUGE_SHAPES_SCRIPT = r"""
import resource
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))   # a regression fails, not OOMs
import numpy as np
from adaptdl_core.goodput import GoodputFunction, GradParams, PerfParams
from adaptdl_core.policy import SpeedupFunction
model = GoodputFunction(PerfParams(0.017, 0.0007, 0.12, 0.0024, 0.03, 0.0034, 2.0),
                        GradParams(0.01, 0.1), 32)
fn = SpeedupFunction(model, 4096, (8, 256))
plain = SpeedupFunction(model, 10 ** 6, (8, 256), collapse_nodes=False)
far = plain(np.array([300, 20000]), np.array([600, 20000]))
direct = model.optimize(np.array([300, 20000]), np.array([600, 20000]), 10 ** 6,
                        (8, 256))[0] / plain.base_goodput
print(repr((float(fn(1, 10 ** 9)), far.tolist(), direct.tolist())))
"""


def test_a_speedup_function_asked_for_huge_shapes_allocates_nothing_by_them():
    """SpeedupFunction(1, 10**9) once allocated a 15 GiB cache table; under a 2 GiB
    address-space limit it now answers, and shapes outside its cache are computed exactly."""
    import ast
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _HUGE_SHAPES_SCRIPT], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    huge, far, direct = ast.literal_eval(proc.stdout.strip())
    assert huge == 0.0           # beyond 4096 / 8 replicas the job cannot run
    assert np.allclose(far, direct) and far[0] > 0
