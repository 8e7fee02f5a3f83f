"""Tests for adaptdl_core.policy.cluster_size: Pollux's goodput-based cluster-size rule on
synthetic speedup curves (flat never grows, linear grows to the maximum, saturating stops
where goodput per GPU falls below U), its hysteresis, and input validation."""

from __future__ import annotations

import numpy as np
import pytest

from adaptdl_core.policy import ClusterSizeRule, JobInfo

NOW = 1_000.0
NODE = {"CPU": 16, "GPU": 4}


def curve(per_k):
    """A speedup function ``f(N, K) = per_k(K)`` (independent of N), 0 where invalid."""

    def fn(n, k):
        n, k = np.asarray(n), np.asarray(k)
        kk = np.maximum(k, 1).astype(np.float64)
        return np.where((k > 0) & (n >= 1) & (n <= k), per_k(kk), 0.0)

    return fn


def flat(k):
    return np.ones_like(k)


def linear(k):
    return k


def saturating(c):
    return lambda k: k / (1.0 + c * (k - 1.0))


def job(speedup, gpus=1, **kw):
    return JobInfo({"GPU": gpus, "CPU": 1}, curve(speedup), creation_timestamp=0.0, **kw)


def rule(**kw):
    args = dict(node_template=NODE, min_nodes=1, max_nodes=8)
    args.update(kw)
    return ClusterSizeRule(**args)


def test_flat_speedup_never_grows():
    r = rule()
    for current in range(1, 9):
        d = r.decide({"a": job(flat)}, current, now=NOW)
        # One replica is all it can use: 1 of 4 GPUs on one node is already below L.
        assert d.desired_nodes == 1, (current, d)
    assert r.decide({"a": job(flat), "b": job(flat)}, 1, now=NOW).desired_nodes == 1


def test_linear_speedup_grows_to_the_maximum():
    d = rule().decide({"a": job(linear)}, 1, now=NOW)
    assert d.desired_nodes == 8 and d.action == "grow"
    assert d.utilities[8] == pytest.approx(1.0)
    # Two linear jobs: still the maximum, and never beyond it.
    d = rule(max_nodes=5).decide({"a": job(linear), "b": job(linear)}, 3, now=NOW)
    assert d.desired_nodes == 5


@pytest.mark.parametrize("c", [0.02, 0.05, 0.1])
def test_saturating_stops_where_goodput_per_gpu_falls_below_upper(c):
    # Utility at n nodes (one job, all 4n GPUs): S(4n) / 4n = 1 / (1 + c (4n - 1)).
    util = {n: 1.0 / (1.0 + c * (4 * n - 1)) for n in range(1, 9)}
    expected = max([n for n, u in util.items() if u >= 2 / 3], default=1)
    d = rule().decide({"a": job(saturating(c))}, 1, now=NOW)
    assert d.desired_nodes == expected
    assert d.utilities[expected] >= 2 / 3
    if expected < 8:
        assert d.utilities[expected + 1] < 2 / 3
    for n, u in d.utilities.items():
        assert u == pytest.approx(util[n])


def test_holds_inside_the_band_and_shrinks_below_lower_towards_it():
    c = 0.05  # utilities: 1: .87, 2: .74, 3: .65, 4: .57, 5: .51, 6: .47, 7: .43, 8: .40
    jobs = {"a": job(saturating(c))}
    r = rule()
    assert r.decide(jobs, 4, now=NOW).action == "hold"      # .57 in [1/2, 2/3)
    assert r.decide(jobs, 5, now=NOW).desired_nodes == 5
    d = r.decide(jobs, 7, now=NOW)                          # .43 < 1/2
    assert (d.desired_nodes, d.action) == (5, "shrink")     # largest size reaching 1/2
    assert r.decide(jobs, 1, now=NOW).desired_nodes == 2    # grows while >= 2/3


def test_no_jobs_goes_to_min_nodes_and_bounds_hold():
    assert rule(min_nodes=2).decide({}, 6, now=NOW).desired_nodes == 2
    assert rule(min_nodes=0).decide({}, 3, now=NOW).desired_nodes == 0
    # Below the minimum: brought up to it even with nothing to run.
    d = rule(min_nodes=3).decide({}, 1, now=NOW)
    assert (d.desired_nodes, d.action) == (3, "grow")


def test_waiting_job_that_needs_two_nodes_gets_them():
    # 8 replicas minimum on 4-GPU nodes: nothing runs on one node, linear on two.
    jobs = {"a": job(linear, min_replicas=8, max_replicas=8)}
    r = rule(max_nodes=4)
    assert r.utility(jobs, 1, now=NOW) == 0.0
    d = r.decide(jobs, 1, now=NOW)
    # 3 nodes keep the utility at 8/12 = U, but the third adds no goodput: not wanted.
    assert d.desired_nodes == 2 and d.utilities[3] == pytest.approx(2 / 3)


def test_grow_looks_past_sizes_where_a_job_cannot_run_yet():
    # 12 replicas minimum: idle on 1 and 2 nodes, linear on 3.
    jobs = {"a": job(linear, min_replicas=12, max_replicas=12)}
    d = rule(max_nodes=6).decide(jobs, 1, now=NOW)
    assert d.utilities[2] == 0.0 and d.desired_nodes == 3


def test_grow_stops_trying_sizes_once_all_jobs_run_below_upper():
    # Saturating, c = 0.05: utility falls below U at 3 nodes with the job running, so
    # larger sizes are not evaluated (each costs an allocation).
    d = rule().decide({"a": job(saturating(0.05))}, 1, now=NOW)
    assert d.desired_nodes == 2 and max(d.utilities) == 3


def test_utility_counts_gpus_per_replica():
    # Two GPUs per replica, linear: every GPU is used ideally.
    r = rule(max_nodes=2)
    assert r.utility({"a": job(linear, gpus=2)}, 2, now=NOW) == pytest.approx(1.0)
    assert r.utility({"a": job(flat, gpus=2)}, 2, now=NOW) == pytest.approx(2 / 8)
    assert r.utility({"a": job(linear)}, 0, now=NOW) == 0.0


def test_cpu_template_measures_per_cpu():
    r = ClusterSizeRule({"CPU": 4}, 1, 3)
    assert r.resource == "CPU"
    cpu_job = JobInfo({"CPU": 1}, curve(linear), creation_timestamp=0.0)
    assert r.decide({"a": cpu_job}, 1, now=NOW).desired_nodes == 3


@pytest.mark.parametrize("kwargs, word", [
    (dict(min_nodes=-1), "min_nodes"),
    (dict(min_nodes=4, max_nodes=3), "max_nodes"),
    (dict(max_nodes=0, min_nodes=0), "max_nodes"),
    (dict(upper=1.5), "upper"),
    (dict(lower=0.0), "lower"),
    (dict(lower=0.8, upper=0.7), "lower"),
    (dict(resource="TPU"), "resource"),
    (dict(node_template={"GPU": -1}), "resources"),
    (dict(policy=object()), "policy"),
])
def test_bad_arguments_are_named(kwargs, word):
    with pytest.raises(ValueError, match=word):
        rule(**kwargs)


def test_bad_decide_arguments_are_named():
    with pytest.raises(ValueError, match="current_nodes"):
        rule().decide({}, -1, now=NOW)
    with pytest.raises(ValueError, match="now"):
        rule().decide({}, 1, now=float("nan"))
