"""Tests for adaptdl_core.policy.remaining: the remaining-work weights, their clip and
ageing, admission by weight, and the policy on small hand-checked cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from adaptdl_core.policy import (JobInfo, NodeInfo, PolluxPolicy, RemainingWorkPolicy,
                                 admission_order, policy_by_name, remaining_weights)

NOW = 100_000.0


def concave(n, k):
    """A job that scales sub-linearly: ``k / (1 + 0.05 (k - 1))`` on one node."""
    n, k = np.asarray(n), np.asarray(k)
    s = k / (1.0 + 0.05 * (k - 1.0))
    return np.where((k > 0) & (n >= 1) & (n <= k), s, 0.0)


def job(remaining, created=NOW - 600.0, **kw):
    return JobInfo({"GPU": 1}, concave, created, remaining_s=remaining, **kw)


def test_weights_by_hand():
    jobs = {"a": job(100.0), "b": job(300.0), "c": job(1000.0), "d": job(None)}
    # Median of the known estimates is 300 s: 300/100, 1, 300/1000; unknown weighs 1.
    w = remaining_weights(jobs, NOW, alpha=1.0, max_weight=4.0)
    assert w == pytest.approx({"a": 3.0, "b": 1.0, "c": 0.3, "d": 1.0})
    # Clipped to [1/2, 2], and alpha 0 is Pollux.
    assert remaining_weights(jobs, NOW, max_weight=2.0) == pytest.approx(
        {"a": 2.0, "b": 1.0, "c": 0.5, "d": 1.0})
    assert set(remaining_weights(jobs, NOW, alpha=0.0).values()) == {1.0}
    # Rounded to powers of two.
    assert remaining_weights(jobs, NOW, quantize=True) == {"a": 4.0, "b": 1.0, "c": 0.25,
                                                            "d": 1.0}
    # Nothing known: all 1.
    assert set(remaining_weights({"x": job(None), "y": job(None)}, NOW).values()) == {1.0}


def test_ageing_lifts_a_long_jobs_weight_back_to_one():
    jobs = {"short": job(10.0, created=NOW), "long": job(1e5, created=NOW - 1800.0)}
    plain = remaining_weights(jobs, NOW, max_weight=8.0)
    assert plain["long"] == pytest.approx(((10.0 + 1e5) / 2) / 1e5)  # about 1/2
    half = remaining_weights(jobs, NOW, max_weight=8.0, patience_s=3000.0)
    assert half["long"] == pytest.approx(max(plain["long"], 1800.0 / 3000.0))
    full = remaining_weights(jobs, NOW, max_weight=8.0, patience_s=1800.0)
    assert full["long"] == 1.0 and full["short"] == plain["short"]


def test_with_an_ageing_cap_an_old_jobs_weight_grows_past_one_up_to_the_cap():
    jobs = {"short": job(10.0, created=NOW), "long": job(1e5, created=NOW - 7200.0),
            "young": job(4e5, created=NOW - 600.0)}
    plain = remaining_weights(jobs, NOW, patience_s=1800.0)
    assert plain["long"] == 1.0
    aged = remaining_weights(jobs, NOW, patience_s=1800.0, ageing_cap=3.0)
    assert aged["long"] == 3.0                                  # 7200 / 1800 = 4, capped
    assert aged["young"] == plain["young"] == pytest.approx(600.0 / 1800.0)
    assert aged["short"] == plain["short"] == 4.0               # (at max_weight already)
    assert remaining_weights(jobs, NOW, patience_s=3600.0, ageing_cap=4.0)["long"] == 2.0
    assert RemainingWorkPolicy(patience_s=1800.0, ageing_cap=3.0).weights(jobs, NOW) == aged


def test_on_a_mixed_cluster_the_weights_take_the_mixed_settings():
    jobs = {"short": job(10.0), "long": job(1e5), "old": job(1e5, created=NOW - 4 * 7200.0)}
    one_type = {"a": NodeInfo({"GPU": 4}, accelerator_type="t4"),
                "b": NodeInfo({"GPU": 4}, accelerator_type="t4")}
    mixed = {"a": NodeInfo({"GPU": 4}, accelerator_type="t4"),
             "b": NodeInfo({"GPU": 4}, accelerator_type="a100")}
    policy = RemainingWorkPolicy()
    same = policy.allocate(jobs, one_type, now=NOW).details["weights"]
    assert same == remaining_weights(jobs, NOW, patience_s=7200.0)
    assert same["short"] > same["long"] and same["old"] == 1.0
    # Mixed: no tilt by remaining work (mixed_alpha=0), ageing up to 4 (mixed_ageing_cap).
    weights = policy.allocate(jobs, mixed, now=NOW).details["weights"]
    assert weights == {"short": 1.0, "long": 1.0, "old": 4.0}
    tilted = RemainingWorkPolicy(mixed_alpha=1.0, mixed_ageing_cap=1.0)
    assert tilted.allocate(jobs, mixed, now=NOW).details["weights"] == same


@pytest.mark.parametrize("kwargs", [{"alpha": -1.0}, {"alpha": math.nan}, {"max_weight": 0.5},
                                    {"patience_s": 0.0}, {"patience_s": -5.0},
                                    {"ageing_cap": 0.5}, {"ageing_cap": 5.0}])
def test_weight_arguments_are_checked(kwargs):
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=name):
        remaining_weights({}, NOW, **kwargs)
    with pytest.raises(ValueError, match=name):
        RemainingWorkPolicy(**kwargs)


def test_policy_arguments_are_checked():
    with pytest.raises(ValueError, match="p must be < 0"):
        RemainingWorkPolicy(p=1.0)
    with pytest.raises(ValueError, match="mixed_alpha"):
        RemainingWorkPolicy(mixed_alpha=-0.5)
    with pytest.raises(ValueError, match="mixed_ageing_cap"):
        RemainingWorkPolicy(mixed_ageing_cap=8.0)
    with pytest.raises(ValueError, match="running_bonus"):
        RemainingWorkPolicy(running_bonus=0.5)
    with pytest.raises(ValueError, match="pollux, adaptdl"):
        policy_by_name("srtf")
    assert isinstance(policy_by_name("adaptdl"), RemainingWorkPolicy)
    assert isinstance(policy_by_name("pollux"), PolluxPolicy)
    assert policy_by_name("pollux").fair_share


def test_jobinfo_checks_remaining_and_weight():
    with pytest.raises(ValueError, match="remaining_s"):
        job(-1.0)
    with pytest.raises(ValueError, match="remaining_s"):
        job(math.inf)
    with pytest.raises(ValueError, match="weight"):
        job(1.0, weight=0.0)
    with pytest.raises(ValueError, match="p != 0"):
        PolluxPolicy(p=0.0).allocate({"a": job(1.0, weight=2.0), "b": job(1.0)},
                                     {0: NodeInfo({"GPU": 4})}, now=NOW)


def test_a_heavier_job_gets_more_replicas_from_pollux():
    nodes = {0: NodeInfo({"GPU": 8})}
    even = PolluxPolicy(fair_share=True).optimize({"a": job(None), "b": job(None)}, nodes,
                                                  now=NOW)
    assert len(even["a"]) == len(even["b"]) == 4
    tilted = PolluxPolicy(fair_share=True).optimize(
        {"a": job(None, weight=4.0), "b": job(None)}, nodes, now=NOW)
    assert len(tilted["a"]) > len(tilted["b"]) >= 1
    # Reported speedups stay in the speedup function's units.
    res = PolluxPolicy(fair_share=True).allocate(
        {"a": job(None, weight=4.0), "b": job(None)}, nodes, now=NOW)
    assert res.speedups["a"] == pytest.approx(float(concave(1, len(tilted["a"]))))


def test_without_estimates_it_is_pollux():
    nodes = {n: NodeInfo({"GPU": 4}) for n in range(2)}
    jobs = {f"j{i}": job(None, created=NOW - 100.0 * i) for i in range(3)}
    ours = RemainingWorkPolicy().optimize(jobs, nodes, now=NOW)
    theirs = PolluxPolicy(fair_share=True).optimize(jobs, nodes, now=NOW)
    assert {k: len(v) for k, v in ours.items()} == {k: len(v) for k, v in theirs.items()}


def test_the_nearly_done_job_gets_the_gpus():
    nodes = {0: NodeInfo({"GPU": 8})}
    jobs = {"done-soon": job(120.0), "long": job(36_000.0)}
    pollux = PolluxPolicy(fair_share=True).optimize(jobs, nodes, now=NOW)
    ours = RemainingWorkPolicy().optimize(jobs, nodes, now=NOW)
    assert len(pollux["done-soon"]) == len(pollux["long"]) == 4  # blind to remaining work
    assert len(ours["done-soon"]) > len(ours["long"]) >= 1        # tilted, nobody starved
    assert len(ours["done-soon"]) + len(ours["long"]) == 8


@pytest.mark.parametrize("quantize", [False, True])
def test_the_long_jobs_share_stops_shrinking_at_the_clip(quantize):
    """As the other job nears its end, the long job's share shrinks, then stops: once the
    short job's weight is at ``max_weight`` nothing changes any more."""
    nodes = {0: NodeInfo({"GPU": 16})}
    policy = RemainingWorkPolicy(max_weight=4.0, patience_s=math.inf, quantize=quantize)
    long_s = 36_000.0
    shares = []
    for short_s in (36_000.0, 18_000.0, 9_000.0, 3_000.0, 600.0, 60.0, 1.0):
        alloc = policy.optimize({"short": job(short_s), "long": job(long_s)}, nodes, now=NOW)
        shares.append(len(alloc["long"]))
    assert shares[0] == 8                                   # equal work: equal split
    assert all(a >= b for a, b in zip(shares, shares[1:]))  # never grows back
    assert shares[-1] < shares[0] and shares[-1] >= 1       # shrank, never to nothing
    # 3000 s and less: the short job's weight is clipped at 4, the long one's at about 1/2.
    assert shares[3] == shares[4] == shares[5] == shares[6]


def test_admission_order_and_a_short_job_is_not_the_one_left_waiting():
    jobs = {"old-long": job(50_000.0, created=NOW - 5000.0),
            "mid": job(5_000.0, created=NOW - 4000.0),
            "new-short": job(100.0, created=NOW - 60.0)}
    w = remaining_weights(jobs, NOW)
    order = admission_order(jobs, w, running=["old-long", "mid"], running_bonus=2.0)
    assert order == ["new-short", "mid", "old-long"]
    # Two GPUs, three jobs of one replica each: the longest waits (Pollux's lexicographic
    # objective alone would idle the heaviest-weighted job, the short one).
    nodes = {0: NodeInfo({"GPU": 2})}
    base = {"old-long": [0], "mid": [0]}
    res = RemainingWorkPolicy(patience_s=math.inf).allocate(jobs, nodes, base, now=NOW)
    assert res.allocations["old-long"] == []
    assert len(res.allocations["new-short"]) == 1 and len(res.allocations["mid"]) == 1
    assert res.details["admitted"] == 2 and res.num_idle == 1
    # A running job keeps its place against a waiting one of less than twice its weight.
    order = admission_order({"a": job(1.0), "b": job(1.0)}, {"a": 1.5, "b": 1.0},
                            running=["b"])
    assert order == ["b", "a"]


def test_pinned_jobs_are_admitted_first():
    jobs = {"pinned": job(90_000.0, preemptible=False), "short": job(10.0),
            "other": job(20.0)}
    order = admission_order(jobs, remaining_weights(jobs, NOW), running=["pinned"])
    assert order[0] == "pinned"
    res = RemainingWorkPolicy().allocate(jobs, {0: NodeInfo({"GPU": 2})}, {"pinned": [0]},
                                         now=NOW)
    assert res.allocations["pinned"] == [0] and len(res.allocations["short"]) == 1
    assert res.allocations["other"] == []
