"""Tests of adaptdl_core.sched_hints: JSON round trip, validation, goodput_function()."""

import json

import numpy as np
import pytest

from adaptdl_core.goodput import GoodputFunction, GradParams, PerfParams
from adaptdl_core.sched_hints import SchedHints

PERF = PerfParams(0.017, 0.0007, 0.12, 0.0024, 0.03, 0.0034, 2.06)
GRAD = GradParams(0.5, 3.0)


def full_hints(**overrides):
    values = dict(perf_params=PERF, grad_params=GRAD, init_batch_size=128,
                  max_batch_size=4096, local_bsz_bounds=(32, 512),
                  gradient_accumulation=True, max_profiled_replicas=8,
                  max_profiled_nodes=2, restart_cost_s=31.5)
    values.update(overrides)
    return SchedHints(**values)


def test_json_round_trip():
    hints = full_hints()
    text = hints.to_json()
    assert isinstance(text, str)
    back = SchedHints.from_json(text)
    assert back == hints
    assert isinstance(back.perf_params, PerfParams) and isinstance(back.grad_params, GradParams)
    assert back.local_bsz_bounds == (32, 512)
    # The dict form is plain JSON data with named fields.
    d = json.loads(text)
    assert d["perf_params"]["gamma"] == pytest.approx(2.06)
    assert d["grad_params"] == {"sqr": 0.5, "var": 3.0}
    assert SchedHints.from_dict(hints.to_dict()) == hints


def test_round_trip_minimal_and_partial_bounds():
    hints = SchedHints(perf_params=None, grad_params=None, init_batch_size=64)
    assert hints.max_profiled_replicas == 0 and hints.max_profiled_nodes == 0
    assert hints.gradient_accumulation is False and hints.restart_cost_s is None
    assert SchedHints.from_json(hints.to_json()) == hints
    partial = full_hints(local_bsz_bounds=(None, 256))
    assert SchedHints.from_json(partial.to_json()).local_bsz_bounds == (None, 256)


def test_from_dict_defaults_lists_and_unknown_keys():
    hints = SchedHints.from_dict({
        "init_batch_size": 256,
        "perf_params": list(PERF),
        "grad_params": [1.0, 2.0],
        "local_bsz_bounds": [16, None],
        "some_future_field": {"anything": 1},
    })
    assert hints.perf_params == PERF
    assert hints.grad_params == GradParams(1.0, 2.0)
    assert hints.local_bsz_bounds == (16, None)
    assert hints.max_batch_size is None and hints.gradient_accumulation is False


def test_numpy_scalars_are_accepted():
    hints = full_hints(init_batch_size=np.int64(128), restart_cost_s=np.float32(2.5),
                       perf_params=PerfParams(*[np.float64(v) for v in PERF]))
    assert type(hints.init_batch_size) is int and type(hints.restart_cost_s) is float
    json.loads(hints.to_json())


@pytest.mark.parametrize("field, value", [
    ("init_batch_size", 0),
    ("init_batch_size", 12.5),
    ("init_batch_size", "128"),
    ("init_batch_size", True),
    ("max_batch_size", 64),          # below init_batch_size
    ("local_bsz_bounds", (0, 8)),
    ("local_bsz_bounds", (64, 8)),
    ("local_bsz_bounds", (8,)),
    ("gradient_accumulation", 1),
    ("max_profiled_replicas", -1),
    ("max_profiled_nodes", 9),       # above max_profiled_replicas
    ("restart_cost_s", -1.0),
    ("restart_cost_s", float("nan")),
    ("perf_params", [1.0, 2.0]),
    ("perf_params", {"alpha_c": 1.0}),
    ("perf_params", list(PERF[:6]) + [float("inf")]),
    ("perf_params", PERF._replace(beta_n=-0.1)),
    ("grad_params", [1.0, float("nan")]),
    ("grad_params", "fast"),
])
def test_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        full_hints(**{field: value})
    d = full_hints().to_dict()
    d[field] = list(value) if isinstance(value, tuple) else value
    with pytest.raises(ValueError, match=field):
        SchedHints.from_dict(d)


def test_from_dict_rejects_bad_documents():
    with pytest.raises(ValueError, match="init_batch_size"):
        SchedHints.from_dict({"max_batch_size": 10})
    with pytest.raises(ValueError):
        SchedHints.from_dict([1, 2, 3])
    with pytest.raises(ValueError):
        SchedHints.from_json("{not json")
    with pytest.raises(ValueError, match="max_profiled_replicas"):
        SchedHints.from_dict({"init_batch_size": 8, "max_profiled_replicas": None})
    with pytest.raises(ValueError, match="gradient_accumulation"):
        SchedHints.from_dict({"init_batch_size": 8, "gradient_accumulation": None})


def test_goodput_function():
    hints = full_hints()
    fn = hints.goodput_function()
    assert isinstance(fn, GoodputFunction)
    assert fn.perf_params == PERF and fn.grad_params == GRAD and fn.init_batch_size == 128
    # A scheduler can optimise with the hinted limits.
    goodput, bsz, accum = fn.optimize(
        [1, 2], [4, 8], hints.max_batch_size, hints.local_bsz_bounds,
        hints.gradient_accumulation)
    assert np.all(goodput > 0) and np.all((bsz >= 32) & (bsz <= 512))
    # After a JSON trip the model is the same.
    again = SchedHints.from_json(hints.to_json()).goodput_function()
    assert again(2, 8, 64, 1) == fn(2, 8, 64, 1)
    assert full_hints(perf_params=None).goodput_function() is None
    assert full_hints(grad_params=None).goodput_function() is None
