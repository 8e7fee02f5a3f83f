"""Tests for adaptdl_core.policy.speedup (SpeedupFunction, LinearSpeedup)."""

from __future__ import annotations

import numpy as np
import pytest

from adaptdl_core import goodput
from adaptdl_core.policy import LinearSpeedup, SpeedupFunction


class FakeGoodput:
    """Goodput model stub: goodput = 100 * K / (1 + 0.1 (K - 1)), x0.8 when spread over
    nodes; records every ``optimize`` call."""

    def __init__(self, base: float = 100.0) -> None:
        self.base = base
        self.calls: list = []

    def optimize(self, num_nodes, num_replicas, max_batch_size=None, atomic_bsz_range=None,
                 accumulation=False):
        n = np.asarray(num_nodes, dtype=float)
        k = np.asarray(num_replicas, dtype=float)
        self.calls.append((n.copy(), k.copy(), max_batch_size, atomic_bsz_range, accumulation))
        good = self.base * k / (1 + 0.1 * (k - 1)) * np.where(n > 1, 0.8, 1.0)
        good = np.where((k >= 1) & (n >= 1) & (n <= k), good, 0.0)
        zeros = np.zeros(np.shape(good), dtype=np.int64)
        return good, zeros + 32, zeros


def expected(n, k):
    n, k = np.asarray(n, float), np.asarray(k, float)
    s = k / (1 + 0.1 * (k - 1)) * np.where(n > 1, 0.8, 1.0)
    return np.where((k >= 1) & (n >= 1) & (n <= k), s, 0.0)


def test_speedup_is_goodput_relative_to_one_replica():
    fn = SpeedupFunction(FakeGoodput())
    assert fn(1, 1) == pytest.approx(1.0)
    assert fn.base_goodput == pytest.approx(100.0)
    nodes = np.array([1, 1, 2, 2, 4])
    replicas = np.array([2, 4, 2, 8, 16])
    np.testing.assert_allclose(fn(nodes, replicas), expected(nodes, replicas))


def test_zero_replicas_and_invalid_shapes_give_zero():
    fn = SpeedupFunction(FakeGoodput())
    assert fn(0, 0) == 0.0
    assert fn(1, 0) == 0.0
    assert fn(3, 2) == 0.0        # more nodes than replicas
    assert fn(0, 2) == 0.0


def test_broadcasting_and_shapes():
    fn = SpeedupFunction(FakeGoodput())
    out = fn(np.array([[1], [2]]), np.array([1, 2, 3]))
    assert out.shape == (2, 3)
    np.testing.assert_allclose(out, expected(np.array([[1], [2]]), np.array([1, 2, 3])))
    assert np.ndim(fn(1, 3)) == 0
    assert fn([1, 1], [1, 2]).shape == (2,)
    # Float arrays holding whole numbers are accepted.
    assert fn(np.array([1.0]), np.array([2.0]))[0] == pytest.approx(expected(1, 2))


def test_memoised_per_shape():
    model = FakeGoodput()
    fn = SpeedupFunction(model)
    assert len(model.calls) == 1                     # the base shape
    fn(np.array([1, 1, 2]), np.array([2, 4, 4]))
    assert len(model.calls) == 2
    fn(np.array([1, 2, 1]), np.array([4, 4, 2]))     # all cached
    fn(1, 2)
    assert len(model.calls) == 2
    fn(np.array([1, 1, 3]), np.array([2, 8, 9]))     # only the two new shapes evaluated
    assert len(model.calls) == 3
    n, k = model.calls[-1][:2]
    assert sorted(zip(n.tolist(), k.tolist())) == [(1.0, 8.0), (3.0, 9.0)]
    # Growing the cache far beyond its initial size keeps old values.
    big = fn(np.array([1, 40]), np.array([1, 200]))
    np.testing.assert_allclose(big, expected([1, 40], [1, 200]))
    np.testing.assert_allclose(fn(1, 2), expected(1, 2))


def test_collapse_nodes():
    model = FakeGoodput()
    fn = SpeedupFunction(model)                      # unknown model: every N evaluated
    fn(3, 5)
    assert model.calls[-1][0].tolist() == [3.0]
    model = FakeGoodput()
    fn = SpeedupFunction(model, collapse_nodes=True)
    assert fn(3, 5) == pytest.approx(expected(2, 5))
    assert model.calls[-1][0].tolist() == [2.0]
    n_calls = len(model.calls)
    fn(np.array([2, 4, 5]), np.array([5, 5, 5]))     # all the same (N >= 2) shape
    assert len(model.calls) == n_calls
    assert fn(1, 5) == pytest.approx(expected(1, 5))


def test_limits_are_passed_to_optimize():
    model = FakeGoodput()
    fn = SpeedupFunction(model, max_batch_size=1024, atomic_bsz_range=(8, 64),
                         accumulation=True)
    fn(2, 4)
    for _, _, mbs, rng, acc in model.calls:
        assert (mbs, rng, acc) == (1024, (8, 64), True)


def test_base_replicas():
    fn = SpeedupFunction(FakeGoodput(), base_replicas=2)
    assert fn(1, 2) == pytest.approx(1.0)
    assert fn(1, 1) == pytest.approx(1 / expected(1, 2))


def test_bad_arguments():
    with pytest.raises(ValueError, match="goodput_fn"):
        SpeedupFunction(object())
    with pytest.raises(ValueError, match="goodput_fn"):
        SpeedupFunction(FakeGoodput(base=0.0))          # undefined normalisation
    with pytest.raises(ValueError, match="base_replicas"):
        SpeedupFunction(FakeGoodput(), base_replicas=0)
    fn = SpeedupFunction(FakeGoodput())
    with pytest.raises(ValueError, match="num_replicas"):
        fn(1, -1)
    with pytest.raises(ValueError, match="num_nodes"):
        fn(-1, 2)
    with pytest.raises(ValueError, match="num_replicas"):
        fn(1, 1.5)
    with pytest.raises(ValueError, match="num_nodes"):
        fn(np.array([True]), 1)
    with pytest.raises(ValueError, match="broadcast"):
        fn(np.array([1, 1]), np.array([1, 2, 3]))


def test_nan_goodput_reads_as_zero():
    class NanGoodput(FakeGoodput):
        def optimize(self, num_nodes, num_replicas, *args, **kwargs):
            good, b, s = super().optimize(num_nodes, num_replicas, *args, **kwargs)
            return np.where(np.asarray(num_replicas) == 3, np.nan, good), b, s

    fn = SpeedupFunction(NanGoodput())
    assert fn(1, 3) == 0.0


def test_linear_prior():
    prior = LinearSpeedup(3)
    assert prior.cap == 6
    np.testing.assert_array_equal(prior(np.array([1, 1, 2, 2, 3]), np.array([0, 1, 4, 6, 9])),
                                  [0, 1, 4, 6, 6])
    assert prior(2, 1) == 0.0                      # N > K
    assert LinearSpeedup(0).cap == 1               # a job that never ran starts alone
    assert LinearSpeedup(0)(1, 5) == 1.0
    assert LinearSpeedup(1).cap == 2               # ...and may try 2 once measured at 1
    for bad in (-1, 1.5, True, None):
        with pytest.raises(ValueError, match="max_profiled_replicas"):
            LinearSpeedup(bad)
    with pytest.raises(ValueError, match="num_replicas"):
        prior(1, -2)


@pytest.mark.parametrize("seed", range(4))
def test_real_goodput_model(seed):
    """With the real model: speedup(1, 1) = 1, non-negative, growing at first for a
    scalable job, and dependent on the node count only through N == 1 vs N > 1 (what the
    allocator's relaxation bound relies on)."""
    rng = np.random.default_rng(seed)
    alpha_r = rng.uniform(0.005, 0.05)
    alpha_n = alpha_r * rng.uniform(1.1, 5.0)
    perf = goodput.PerfParams(rng.uniform(0.01, 0.1), rng.uniform(1e-4, 1e-3), alpha_n,
                              alpha_n * 0.02, alpha_r, alpha_r * 0.1, rng.uniform(1, 3))
    m0 = 128
    grad = goodput.GradParams(1.0, rng.uniform(1.0, 50.0))
    model = goodput.GoodputFunction(perf, grad, m0)
    fn = SpeedupFunction(model, max_batch_size=m0 * 32, atomic_bsz_range=(16, 256),
                         accumulation=True)
    assert fn(1, 1) == pytest.approx(1.0)
    k = np.arange(1, 33)
    single = fn(np.ones_like(k), k)
    assert np.all(single >= 0)
    assert single[1] > 1.0                       # two replicas help a scalable model
    k4 = np.arange(4, 33)
    two, three, four = (fn(np.full_like(k4, n), k4) for n in (2, 3, 4))
    np.testing.assert_allclose(two, three)
    np.testing.assert_allclose(two, four)
    # At a node-sized replica count, crossing nodes (slower sync here) does not help.
    assert fn(2, 4) <= fn(1, 4)
    # The memoised values equal a fresh evaluation.
    fresh = SpeedupFunction(model, max_batch_size=m0 * 32, atomic_bsz_range=(16, 256),
                            accumulation=True)
    np.testing.assert_allclose(fresh(np.ones_like(k), k), single)
