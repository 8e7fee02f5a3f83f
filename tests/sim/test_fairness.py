"""Finish-time fairness: the contention, the ratios on a hand-checked case, the yardstick."""

from __future__ import annotations

import pytest

from adaptdl_core.sim.cluster import WorkloadJob, simulate
from adaptdl_core.sim.fairness import contention, finish_time_fairness, of_run
from adaptdl_core.sim.ideal import alone_seconds, epoch_seconds
from adaptdl_core.sim.job_model import get_application

# A runs 0-100, B 50-350, C 200-300 (seconds).
SPANS = {"A": (0.0, 100.0), "B": (50.0, 350.0), "C": (200.0, 300.0)}


def test_contention_is_the_average_number_of_jobs_over_each_lifetime():
    n = contention(SPANS)
    # A: itself 100 s + B's 50 s over 100 s. B: 300 + 50 (A) + 100 (C) over 300 s.
    # C: 100 + 100 (B) over 100 s.
    assert n == pytest.approx({"A": 1.5, "B": 1.5, "C": 2.0})
    with pytest.raises(ValueError, match="spans"):
        contention({"X": (10.0, 5.0)})


def test_ratios_are_jct_over_jct_alone_at_an_equal_share():
    # Alone, a job takes 400 GPU-seconds spread perfectly over its share.
    out = finish_time_fairness(SPANS, lambda name, share: 400.0 / share, gpus=4)
    # Shares 4/1.5, 4/1.5, 4/2 GPUs -> alone 150, 150, 200 s; JCTs 100, 300, 100 s.
    assert out["shares"] == pytest.approx({"A": 8 / 3, "B": 8 / 3, "C": 2.0})
    assert out["ratios"] == pytest.approx({"A": 100 / 150, "B": 2.0, "C": 0.5})
    assert out["max"] == pytest.approx(2.0) and out["worst"] == "B"
    assert out["mean"] == pytest.approx((100 / 150 + 2.0 + 0.5) / 3)
    assert finish_time_fairness({}, lambda n, s: 1.0, gpus=4)["max"] is None
    with pytest.raises(ValueError, match="alone"):
        finish_time_fairness(SPANS, lambda name, share: 0.0, gpus=4)
    with pytest.raises(ValueError, match="gpus"):
        finish_time_fairness(SPANS, lambda name, share: 1.0, gpus=0)


def test_alone_time_is_the_fastest_training_on_at_most_the_share():
    app = get_application("bert")
    one, two, three = (alone_seconds(app, g, 4) for g in (1, 2, 3))
    assert one == pytest.approx(float(epoch_seconds(app, 1, 4).sum()))
    assert one > two > three
    assert alone_seconds(app, 0.5, 4) == pytest.approx(2 * one)  # a time-sliced GPU
    assert alone_seconds(app, 2.25, 4) == pytest.approx(0.75 * two + 0.25 * three)
    with pytest.raises(ValueError, match="gpus"):
        alone_seconds(app, 0.0, 4)


def test_no_simulated_job_beats_its_yardstick_alone():
    # One job alone on the cluster: its share is the whole cluster, and neither the
    # adaptive nor the fixed-size schedule finishes it faster than the yardstick.
    rows = [WorkloadJob("bert-0", 30.0, "bert", 4, 96)]
    for policy in ("pollux", "tiresias"):
        result = simulate(rows, policy, nodes=1)
        out = of_run(result, rows)
        assert out["shares"] == {"bert-0": 4.0}
        assert out["max"] >= 0.99, policy
    with pytest.raises(ValueError, match="rows lack"):
        of_run(result, [])
