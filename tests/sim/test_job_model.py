"""The trace-driven job model: interpolation, progress accounting, restarts, the agent."""

from __future__ import annotations

import pytest

from adaptdl_core.sim.job_model import (APPLICATION_NAMES, EPOCHS, SimJob, canonical_placement,
                                        fixed_batch_config, get_application)


def test_all_six_models_load_with_their_epochs():
    assert set(APPLICATION_NAMES) == {"bert", "cifar10", "deepspeech2", "imagenet", "ncf",
                                      "yolov3"}
    for name in APPLICATION_NAMES:
        app = get_application(name)
        assert app.max_epochs == EPOCHS[name]
        assert app.init_batch_size < app.max_batch_size
        assert app.epoch_progress(1) > 0
        assert app.epoch_progress(app.max_epochs) > app.epoch_progress(app.max_epochs - 1)


def test_measured_placement_is_exact_and_interpolated_between_batches():
    app = get_application("cifar10")
    # Rows of the trace: placement "1", local_bsz 32 and 45.
    st32, sy32 = app.step_time((1,), 32)
    st45, _ = app.step_time((1,), 45)
    assert st32 == pytest.approx(0.0427886962890625)
    assert sy32 == pytest.approx(0.0004995360016822816)
    mid, _ = app.step_time((1,), 38.5)
    assert mid == pytest.approx((st32 + st45) / 2)
    # A rotation of a measured placement is the same measurement.
    assert canonical_placement((2, 1)) == (1, 2)
    assert app.step_time((2, 1), 64) == app.step_time((1, 2), 64)


def test_unmeasured_placement_is_interpolated_between_scales():
    app = get_application("cifar10")
    st, sy = app.step_time((4, 4, 4, 4, 4, 4), 64)  # 6 nodes: only in scalability.csv
    lo, _ = app.step_time((4,), 64)
    assert 0 < sy < st
    assert st > lo  # multi-node sync makes the step slower than one node's


def test_grad_stats_interpolate_linearly_in_batch():
    app = get_application("cifar10")
    a = app.grad_stats(128, 3)
    b = app.grad_stats(256, 3)
    m = app.grad_stats(192, 3)
    assert m[0] == pytest.approx((a[0] + b[0]) / 2)
    assert m[1] == pytest.approx((a[1] + b[1]) / 2)
    with pytest.raises(ValueError, match="outside the validated range"):
        app.grad_stats(10_000, 0)


def test_tuned_batch_config_respects_micro_batch_limit():
    app = get_application("yolov3")  # at most 8 images per GPU
    atomic, accum = fixed_batch_config(app, 4, 64)
    assert atomic <= 8 and 4 * atomic * (accum + 1) >= 64
    # One replica above M0 accumulates at least once.
    assert fixed_batch_config(get_application("cifar10"), 1, 256)[1] >= 1


def _run(job: SimJob, placement, seconds: float) -> None:
    job.reallocate(placement)
    job.advance(seconds)


def test_more_gpus_progress_faster_per_second():
    app = get_application("cifar10")
    progress = []
    for placement in [(1,), (2,), (4,), (4, 4)]:
        job = SimJob("j", app, 0.0, target_batch_size=2048)
        _run(job, placement, 600)
        progress.append(job.progress)
    assert progress == sorted(progress) and len(set(progress)) == 4


def test_restart_costs_time_without_progress():
    app = get_application("cifar10")
    job = SimJob("j", app, 0.0, target_batch_size=512, restart_s=30)
    job.reallocate((1,))
    job.advance(30)
    assert job.progress == 0 and job.attained_service == 30
    job.advance(30)
    assert job.progress > 0
    assert job.num_restarts == 0
    job.reallocate((2,))
    assert job.num_restarts == 1 and job.rescale_left == 30


def test_job_ends_after_its_epochs_at_the_traced_progress():
    app = get_application("bert")
    job = SimJob("j", app, 0.0, target_batch_size=96)
    job.reallocate((4,))
    while not job.done:
        job.advance(60)
        assert job.now <= 10 * 24 * 3600
    assert job.epoch == EPOCHS["bert"]
    assert job.progress == pytest.approx(app.epoch_progress(EPOCHS["bert"]))
    assert job.completion_time <= job.now


def test_adaptive_agent_refits_and_grows_its_batch():
    app = get_application("cifar10")
    job = SimJob("j", app, 0.0)
    job.reallocate((4,))
    first = job.batch_size
    for _ in range(10):
        job.advance(60)
    assert job.perf_params is not None and job.num_fits >= 1
    assert job.batch_size > first  # goodput pays for a larger batch on 4 GPUs
    assert job.hints().max_profiled_replicas == 4


def test_jobs_with_the_same_history_share_fits_exactly():
    from adaptdl_core import goodput
    from adaptdl_core.sim import job_model

    app = get_application("bert")
    twins = [SimJob(f"twin{i}", app, 0.0) for i in range(2)]
    real_fit = goodput.fit_perf_params
    calls = []

    def counting_fit(*args, **kwargs):
        calls.append(1)
        return real_fit(*args, **kwargs)

    job_model._FIT_MEMO.clear()
    job_model.fit_perf_params = counting_fit
    try:
        for job in twins:
            for placement in ((1,), (2,), (2, 2)):
                job.reallocate(placement)
                job.advance(120)
    finally:
        job_model.fit_perf_params = real_fit
    a, b = twins
    assert a.num_fits == b.num_fits >= 3
    assert len(calls) == a.num_fits       # the second job refitted nothing
    assert a.perf_params == b.perf_params and a.profile == b.profile
    # A memo hit is the fit itself: refitting the profile in the same order, from the
    # same warm starts, gives the same parameters.
    job_model._FIT_MEMO.clear()
    c = SimJob("fresh", app, 0.0)
    for placement in ((1,), (2,), (2, 2)):
        c.reallocate(placement)
        c.advance(120)
    assert c.perf_params == a.perf_params


def test_bad_arguments_are_named():
    app = get_application("cifar10")
    with pytest.raises(ValueError, match="target_batch_size"):
        SimJob("j", app, 0.0, target_batch_size=10**9)
    with pytest.raises(ValueError, match="unknown application"):
        get_application("nope")
    with pytest.raises(ValueError, match="placement"):
        canonical_placement(())
