"""Tests of adaptdl_core.torch.gradient_noise_scale: the two-batch estimators against a
problem with analytically known |G|^2 and tr(Sigma), EMA details, the |G|^2 floor, gain,
state round trips and the Adam preconditioning helpers."""

import io
import json
import math

import pytest
import torch

from adaptdl_core import goodput
from adaptdl_core.torch.gradient_noise_scale import (GradientNoiseScale, adam_preconditioner,
                                                     is_adam_family,
                                                     preconditioned_sqr_norm)

M0 = 32


# --------------------------------------------------------------------------- helpers

class LinearRegression:
    """y = x.w* + e, x ~ N(0, I_d), e ~ N(0, noise_var); loss 0.5 (x.w - y)^2 at fixed w.

    With delta = w - w*, the per-sample gradient is g = x (x.delta - e), so
    G = E[x x^T] delta = delta and, x being Gaussian (E[x_i^2 x_j^2] = 1 + 2[i == j]),
    E|g|^2 = (d + 2)|delta|^2 + d * noise_var, hence
    tr(Sigma) = E|g|^2 - |G|^2 = (d + 1)|delta|^2 + d * noise_var.
    """

    def __init__(self, d=10, delta_sqr=1.0, noise_var=10.0):
        self.d = d
        self.noise_var = noise_var
        self.delta = torch.full((d,), math.sqrt(delta_sqr / d), dtype=torch.float64)
        self.sqr = delta_sqr
        self.tr_sigma = (d + 1) * delta_sqr + d * noise_var

    def batch_grads(self, gen, steps, n, b):
        """(steps, n, d): n independent mean gradients over b samples, for each step."""
        x = torch.randn(steps, n, b, self.d, generator=gen, dtype=torch.float64)
        e = torch.randn(steps, n, b, generator=gen, dtype=torch.float64)
        residual = x @ self.delta - e * math.sqrt(self.noise_var)
        return (x * residual.unsqueeze(-1)).mean(2)


def norms(g):
    """local = mean_i |g_i|^2 and total = |mean_i g_i|^2 for each step of (steps, n, d)."""
    return g.pow(2).sum(-1).mean(-1), g.mean(1).pow(2).sum(-1)


def feed(gns, local, total, n, batch_size):
    for loc, tot in zip(local.tolist(), total.tolist()):
        gns.update(loc, tot, n, batch_size)


# --------------------------------------------------------------------------- accuracy

def test_monte_carlo_reference_matches_analytic_moments():
    """Check the analytic |G|^2 and tr(Sigma) of the test problem itself."""
    prob = LinearRegression()
    gen = torch.Generator().manual_seed(123)
    g = prob.batch_grads(gen, 1, 1, 200_000)[0, 0]  # mean over 200k samples ~ G
    assert float(g.pow(2).sum()) == pytest.approx(prob.sqr, rel=0.05)
    per_sample = prob.batch_grads(gen, 1, 100_000, 1)[0]  # 100k single-sample gradients
    tr_sigma = float(per_sample.var(0).sum())
    assert tr_sigma == pytest.approx(prob.tr_sigma, rel=0.02)


# mode "pairs": one gradient per step (n = 1) paired with another independent one of the
# same batch M, as the caller does with consecutive steps: num_grads=2, batch_size=2M.
@pytest.mark.parametrize("mode,n,batch", [("pairs", 1, 32), ("pairs", 1, 128),
                                          ("replicas", 2, 32), ("replicas", 4, 32),
                                          ("replicas", 4, 128)])
def test_estimates_within_25_percent_of_truth(mode, n, batch):
    prob = LinearRegression()
    gen = torch.Generator().manual_seed(7 + n + batch)
    gns = GradientNoiseScale(M0)
    steps = 3000
    if mode == "pairs":
        local, total = norms(prob.batch_grads(gen, steps, 2, batch))
        feed(gns, local, total, 2, 2 * batch)
    else:
        local, total = norms(prob.batch_grads(gen, steps, n, batch // n))
        feed(gns, local, total, n, batch)
    true_var = prob.tr_sigma / M0
    sqr_err = gns.sqr_avg() / prob.sqr - 1
    var_err = gns.var_avg() / true_var - 1
    print(f"{mode} n={n} M={batch}: sqr err {sqr_err:+.3f}, var err {var_err:+.3f}, "
          f"confidence {gns.confidence():.0f} samples")
    assert abs(sqr_err) < 0.25
    assert abs(var_err) < 0.25
    # the floor does not bias a signal that is there
    assert gns.sqr_avg() == gns.raw_sqr_avg()
    true_phi = prob.tr_sigma / prob.sqr
    assert gns.noise_scale() == pytest.approx(true_phi, rel=0.4)
    r = 8.0
    true_gain = (true_var + prob.sqr) / (true_var / r + prob.sqr)
    assert gns.gain(r) == pytest.approx(true_gain, rel=0.15)


# --------------------------------------------------------------------------- EMA details

def test_first_update_equals_raw_estimate():
    for n, m in [(2, 32), (4, 128), (3, 30)]:
        gns = GradientNoiseScale(M0)
        local, total = 5.0, 2.0
        gns.update(local, total, n, m)
        assert gns.raw_sqr_avg() == pytest.approx((n * total - local) / (n - 1))
        assert gns.var_avg() == pytest.approx((local - total) * (m / M0) / (n - 1))
        assert gns.confidence() == pytest.approx(m)
        gns = GradientNoiseScale(M0)
        gns.update(3.0, 2.5, n, m)  # positive raw |G|^2: no floor involved
        assert gns.sqr_avg() == pytest.approx((n * 2.5 - 3.0) / (n - 1))


def test_ema_decay_is_per_sample():
    """Two steps at M0 weigh like one step at 2*M0: same final average."""
    a, b = GradientNoiseScale(M0, smoothing=0.9), GradientNoiseScale(M0, smoothing=0.9)
    a.update(10.0, 4.0, 2, M0)          # sqr -2, var 6
    a.update(5.0, 4.0, 2, M0)           # sqr 3,  var 1
    b.update(10.0, 4.0, 2, M0)
    b.update(6.0, 4.0, 2, 2 * M0)       # sqr 2, var 2 * 2 = 4
    # manual bias-corrected EMA
    d1, d2 = 0.9, 0.9 ** 2
    expect_a = (d1 * (1 - d1) * -2 + (1 - d1) * 3) / (d1 * (1 - d1) + (1 - d1))
    expect_b = (d2 * (1 - d1) * -2 + (1 - d2) * 2) / (d2 * (1 - d1) + (1 - d2))
    assert a.raw_sqr_avg() == pytest.approx(expect_a)
    assert b.raw_sqr_avg() == pytest.approx(expect_b)
    # steady state confidence ~ 2 / (1 - smoothing) * M0 whatever the batch
    for m in (M0, 8 * M0):
        gns = GradientNoiseScale(M0)
        for _ in range(20000 * M0 // m):
            gns.update(3.0, 2.0, 2, m)
        assert gns.confidence() == pytest.approx(2 / (1 - 0.999) * M0, rel=0.02)


def test_non_finite_measurements_are_skipped():
    gns = GradientNoiseScale(M0)
    gns.update(5.0, 2.0, 2, 64)
    before = gns.state_dict()
    for local, total in [(math.inf, 1.0), (1.0, math.nan), (math.nan, math.nan),
                         (1e308, 1e308)]:  # the last overflows n * total
        gns.update(local, total, 2, 64)
    assert gns.num_skipped == 4
    after = gns.state_dict()
    after.pop("num_skipped")
    before.pop("num_skipped")
    assert after == before
    assert gns.num_updates == 1


def test_invalid_arguments():
    with pytest.raises(ValueError, match="num_grads"):
        GradientNoiseScale(M0).update(1.0, 0.5, 1, 32)
    with pytest.raises(ValueError, match="num_grads"):
        GradientNoiseScale(M0).update(1.0, 0.5, 2.5, 32)
    with pytest.raises(ValueError, match="batch_size"):
        GradientNoiseScale(M0).update(1.0, 0.5, 4, 2)
    with pytest.raises(ValueError, match=">= 0"):
        GradientNoiseScale(M0).update(-1.0, 0.5, 2, 32)
    for bad in (0, -3, 2.0, True):
        with pytest.raises(ValueError):
            GradientNoiseScale(bad)
    for bad in (0.0, 1.0, math.nan):
        with pytest.raises(ValueError):
            GradientNoiseScale(M0, smoothing=bad)
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError):
            GradientNoiseScale(M0).gain(bad)


# --------------------------------------------------------------------------- floor, gain

@pytest.mark.parametrize("n,batch,d", [(2, M0, 4), (4, M0, 4), (2, M0, 16)])
def test_pure_noise_does_not_report_perfect_scaling(n, batch, d):
    """|G|^2 = 0: the raw EMA hovers around 0 (the plain formula would give gain(32) ~ 32,
    clipped-at-0 exactly 32); the floored estimate keeps gain(32) far below 32."""
    gen = torch.Generator().manual_seed(n * 100 + d)
    g = torch.randn(3000, n, d, generator=gen, dtype=torch.float64) / math.sqrt(batch / n)
    local, total = norms(g)
    gns = GradientNoiseScale(M0)
    feed(gns, local, total, n, batch)
    var = gns.var_avg()
    assert var == pytest.approx(d / M0, rel=0.1)
    clipped = max(gns.raw_sqr_avg(), 0.0)  # the original's estimate, clipped at 0
    clipped_gain = (var + clipped) / (var / 32 + clipped)
    print(f"pure noise n={n} d={d}: gain(32) = {gns.gain(32):.2f}, "
          f"with |G|^2 clipped at 0: {clipped_gain:.2f}")
    assert abs(gns.raw_sqr_avg()) < 0.05 * var  # the unfloored estimate is ~0
    assert gns.gain(32) < 12.0
    assert clipped_gain > 1.5 * gns.gain(32)
    assert gns.sqr_avg() > 0


def test_floor_keeps_negative_estimates_positive():
    gns = GradientNoiseScale(M0)
    gns.update(10.0, 1.0, 2, M0)  # raw sqr = -8
    assert gns.raw_sqr_avg() == pytest.approx(-8.0)
    assert gns.sqr_avg() == pytest.approx(0.25 * 8.0)
    assert 1.0 <= gns.gain(32) < 32


def test_gain_bounds_and_related_quantities():
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        gns = GradientNoiseScale(M0)
        for _ in range(int(torch.randint(1, 5, (1,), generator=gen))):
            local = float(torch.rand(1, generator=gen)) * 10
            total = local * float(torch.rand(1, generator=gen))
            gns.update(local, total, int(torch.randint(2, 9, (1,), generator=gen)), 256)
        previous = 1.0
        for scale in (1.0, 1.5, 2.0, 4.0, 32.0, 1000.0):
            gain = gns.gain(scale)
            assert 1.0 <= gain <= scale
            assert gain >= previous - 1e-12  # non-decreasing in the scale
            previous = gain
            eff = gns.efficiency(scale * M0)
            assert 0 < eff <= 1
            assert eff == pytest.approx(gain / scale)
        assert 0.5 <= gns.gain(0.5) <= 1.0
        assert gns.efficiency(M0 / 2) == 1.0
        phi = gns.noise_scale()
        assert phi == pytest.approx(M0 * gns.var_avg() / gns.sqr_avg())
        # E(M) = (phi + M0) / (phi + M)
        assert gns.efficiency(4 * M0) == pytest.approx((phi + M0) / (phi + 4 * M0))


def test_no_data_and_no_noise():
    gns = GradientNoiseScale(M0)
    assert not gns.has_estimate
    assert gns.gain(16) == 1.0 and gns.noise_scale() == 0.0 and gns.confidence() == 0.0
    assert gns.sqr_avg() == 0.0 and gns.var_avg() == 0.0
    gns.update(4.0, 4.0, 2, 64)  # identical gradients: no noise measured
    assert gns.var_avg() > 0 and gns.var_avg() < 1e-20
    assert gns.gain(16) == 1.0


def test_progress_accumulates_gain():
    gns = GradientNoiseScale(M0)
    assert gns.progress == 0.0
    assert gns.accumulate_progress(4) == 1.0  # no data yet: conservative
    gns.update(5.0, 2.0, 2, 4 * M0)
    expected = 1.0 + gns.gain(4)
    assert gns.accumulate_progress(4) == pytest.approx(gns.gain(4))
    assert gns.progress == pytest.approx(expected)


def test_grad_params():
    gns = GradientNoiseScale(M0)
    gns.update(5.0, 2.0, 2, 64)
    params = gns.grad_params()
    assert isinstance(params, goodput.GradParams)
    assert params == (gns.sqr_avg(), gns.var_avg())
    # consistent with the goodput model's efficiency
    fn = goodput.GoodputFunction([0.1, 0.01, 0, 0, 0, 0, 1], params, M0)
    assert float(fn.efficiency(8 * M0)) == pytest.approx(gns.efficiency(8 * M0))


# --------------------------------------------------------------------------- state

def test_state_round_trip_json_and_weights_only():
    gns = GradientNoiseScale(M0)
    for i in range(10):
        gns.update(5.0 + i, 2.0, 2 + i % 3, 64 * (1 + i % 2))
    gns.update(math.nan, 1.0, 2, 64)
    gns.accumulate_progress(2)
    state = gns.state_dict()
    assert all(type(v) in (int, float) for v in state.values())
    via_json = json.loads(json.dumps(state, allow_nan=False))
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    via_torch = torch.load(buf, weights_only=True)
    for loaded in (via_json, via_torch):
        other = GradientNoiseScale(M0)
        other.load_state_dict(loaded)
        assert other.state_dict() == state
        assert other.sqr_avg() == gns.sqr_avg() and other.var_avg() == gns.var_avg()
        assert other.gain(8) == gns.gain(8) and other.progress == gns.progress
        assert other.confidence() == gns.confidence() and other.num_skipped == 1


def test_load_state_with_other_init_batch_size_converts_units():
    gns = GradientNoiseScale(32)
    gns.update(5.0, 2.0, 2, 64)
    gns.accumulate_progress(2)
    other = GradientNoiseScale(64)
    other.load_state_dict(gns.state_dict())
    assert other.var_avg() == pytest.approx(gns.var_avg() / 2)  # tr(Sigma) / M0
    assert other.noise_scale() == pytest.approx(gns.noise_scale())  # in samples
    assert other.progress == pytest.approx(gns.progress / 2)
    # efficiency of a given batch (in samples) is unchanged
    assert other.efficiency(256) * 256 / 64 == pytest.approx(other.gain(4))


def test_load_malformed_state_leaves_object_unchanged():
    gns = GradientNoiseScale(M0)
    gns.update(5.0, 2.0, 2, 64)
    before = gns.state_dict()
    for bad in ({}, {**before, "version": 99}, {**before, "sqr_ema": math.nan},
                {**before, "weight": None}):
        with pytest.raises(ValueError):
            gns.load_state_dict(bad)
    assert gns.state_dict() == before


# --------------------------------------------------------------------------- Adam helpers

def test_preconditioned_sqr_norm():
    gen = torch.Generator().manual_seed(1)
    g = torch.randn(5, 3, generator=gen)
    v = torch.rand(5, 3, generator=gen) + 0.1
    eps, bc2 = 1e-3, 0.25
    expected = ((g.double() / ((v.double() / bc2).sqrt() + eps)) ** 2).sum().item()
    assert preconditioned_sqr_norm(g, v, eps, bc2) == pytest.approx(expected, rel=1e-6)
    assert preconditioned_sqr_norm(g.double(), v.double(), eps, bc2) == pytest.approx(
        expected, rel=1e-12)
    assert preconditioned_sqr_norm(g, None, eps, bc2) == pytest.approx(
        float(g.double().pow(2).sum()), rel=1e-6)
    assert preconditioned_sqr_norm(g.bfloat16(), v.bfloat16(), eps, bc2) == pytest.approx(
        expected, rel=0.05)
    assert preconditioned_sqr_norm(torch.zeros(0), torch.zeros(0), eps, bc2) == 0.0
    with pytest.raises(ValueError):
        preconditioned_sqr_norm(g, v[:2], eps, bc2)
    with pytest.raises(ValueError):
        preconditioned_sqr_norm(g, v, eps, 0.0)


def test_is_adam_family():
    p = [torch.nn.Parameter(torch.zeros(2))]

    class MyAdam(torch.optim.Adam):
        pass

    for cls in (torch.optim.Adam, torch.optim.AdamW, MyAdam, torch.optim.NAdam,
                torch.optim.RAdam):
        assert is_adam_family(cls(p)), cls
    for cls in (torch.optim.SGD, torch.optim.Adamax, torch.optim.Adagrad,
                torch.optim.RMSprop):
        assert not is_adam_family(cls(p, lr=0.1)), cls
    assert not is_adam_family(object())


@pytest.mark.parametrize("amsgrad", [False, True])
def test_adam_preconditioner_matches_adam_state(amsgrad):
    p = torch.nn.Parameter(torch.ones(4))
    q = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.Adam([p, q], lr=0.0, betas=(0.9, 0.99), eps=1e-6, amsgrad=amsgrad)
    assert adam_preconditioner(opt, p) == (None, 1e-6, 1.0)
    for i in range(3):
        p.grad = torch.full((4,), 3.0 - i)
        opt.step()
    v, eps, bc2 = adam_preconditioner(opt, p)
    key = "max_exp_avg_sq" if amsgrad else "exp_avg_sq"
    assert v is opt.state[p][key]
    assert eps == 1e-6 and bc2 == pytest.approx(1 - 0.99 ** 3)
    with pytest.raises(ValueError):
        adam_preconditioner(opt, torch.nn.Parameter(torch.ones(1)))
    with pytest.raises(ValueError):
        adam_preconditioner(torch.optim.SGD([p], lr=0.1), p)


# --------------------------------------------------------------------------- memory, elapsed

def test_young_estimate_follows_a_falling_signal():
    """|G|^2 falls 100x after 200 steps: the age-limited memory follows within a few
    hundred steps, where the plain 0.999 EMA stays dominated by the early values."""
    young, plain = GradientNoiseScale(M0), GradientNoiseScale(M0, memory_fraction=0.0)
    for step in range(600):
        sqr = 100.0 if step < 200 else 1.0
        local, total = sqr + 10.0, sqr + 5.0  # var = 5, |G|^2 = sqr exactly
        for gns in (young, plain):
            gns.update(local, total, 2, M0)
    print(f"|G|^2 estimate 400 steps after a 100x drop: age-limited {young.sqr_avg():.2f}, "
          f"plain EMA {plain.sqr_avg():.2f} (truth 1)")
    assert young.sqr_avg() < 8.0  # the memory is about a third of the age (~200 steps)
    assert plain.sqr_avg() > 20.0  # still near the old 100: noise scale 20x too low
    assert young.sqr_avg() < 0.25 * plain.sqr_avg()
    assert young.var_avg() == pytest.approx(5.0)


def test_elapsed_sets_the_decay_of_sampled_measurements():
    """One measurement every 4 steps decays like 4 steps: same weights as measuring each
    step with the same values."""
    sparse = GradientNoiseScale(M0, smoothing=0.9, memory_fraction=0.0)
    dense = GradientNoiseScale(M0, smoothing=0.9, memory_fraction=0.0)
    for local, total in [(10.0, 4.0), (5.0, 4.0), (8.0, 3.0)]:
        sparse.update(local, total, 2, M0, elapsed=4 * M0)
        for _ in range(4):
            dense.update(local, total, 2, M0)
    assert sparse.raw_sqr_avg() == pytest.approx(dense.raw_sqr_avg())
    assert sparse.var_avg() == pytest.approx(dense.var_avg())
    with pytest.raises(ValueError, match="elapsed"):
        sparse.update(1.0, 0.5, 2, M0, elapsed=0)


def test_state_without_age_loads_as_mature():
    gns = GradientNoiseScale(M0)
    gns.update(5.0, 2.0, 2, 64)
    state = gns.state_dict()
    assert state["age"] == pytest.approx(2.0)
    del state["age"]  # saved before the age existed
    other = GradientNoiseScale(M0)
    other.load_state_dict(state)
    assert other.state_dict()["age"] == pytest.approx(2 / (1 - 0.999))
    with pytest.raises(ValueError):
        other.load_state_dict({**gns.state_dict(), "age": math.nan})
