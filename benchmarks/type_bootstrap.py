"""How wrong a job's throughput model is on a GPU type it has not run on (the bootstrap of
``adaptdl_core.decision.type_models``), against the Sia artifact's measurements.

For each of the six models and each ordered pair of the five traced types (source ``s``,
target ``t``), the throughput model is fitted to the model's one-node measurements on ``s``
(what a job profiles while it runs there) and used to predict its measured step times on
one node of ``t``, in four ways:

* ``measured``: a fit to ``t``'s own measurements (the job, or its profile group, ran
  there): the floor, the model's own fit error;
* ``learnt``: ``s``'s fit projected by the ratio of the two types' compute speeds at the
  model's batch, learnt from the *other* models' fits (their median), as the decision
  core does once profile groups have run on both types;
* ``spec``: ``s``'s fit projected by the ratio of the types' published peak figures (what
  a type no job has run on, an L4 or an H100, gets);
* ``none``: ``s``'s fit unchanged (no bootstrap).

Prints, per way, the median and 90th percentile of the absolute relative error of the
predicted step time over all (model, source, target, measurement) points, the same per
target type for ``learnt``, and the error of the predicted one-GPU speed ratio, the number
that decides where a job runs. Writes ``benchmarks/results/type_bootstrap.json``.

Usage: ``python benchmarks/type_bootstrap.py`` (about a minute).
"""

from __future__ import annotations

import itertools
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from adaptdl_core.decision.type_models import (TypeSpeeds, compute_speed,  # noqa: E402
                                               project_hints, reference_batch,
                                               type_speed_prior)
from adaptdl_core.goodput import GoodputFunction, PerfParams, fit_perf_params  # noqa: E402
from adaptdl_core.sim.gpu_types import GPU_TYPES  # noqa: E402
from adaptdl_core.sim.job_model import APPLICATION_NAMES, get_application  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
MODELS = [m for m in APPLICATION_NAMES if m != "ncf"]  # ncf steps take microseconds


def fit(model: str, gpu_type: str) -> dict:
    """Hints of a fit to the model's one-node measurements on ``gpu_type``."""
    app = get_application(model, gpu_type=gpu_type)
    rows = app.measurements(max_nodes=1)
    params = fit_perf_params(rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3] - rows[:, 4],
                             rows[:, 3])
    return {"perf_params": params.to_dict(), "init_batch_size": app.init_batch_size,
            "local_bsz_bounds": [app.min_local_bsz, app.max_local_bsz],
            "max_profiled_replicas": int(rows[:, 1].max()), "max_profiled_nodes": 1}


def predict(hints: dict, rows: np.ndarray) -> np.ndarray:
    """Step times the hints' model predicts for measurement rows."""
    fn = GoodputFunction(PerfParams(**hints["perf_params"]), (1.0, 0.0),
                         hints["init_batch_size"])
    x = fn.throughput(rows[:, 0], rows[:, 1], rows[:, 2], 0)
    return rows[:, 1] * rows[:, 2] / x


def one_gpu_speed(model: str, gpu_type: str) -> float:
    """Measured samples per second of one GPU at the model's initial batch (clamped to
    the type's measured local batches): the truth the ratios are judged against."""
    app = get_application(model, gpu_type=gpu_type)
    rows = app.measurements(max_nodes=1)
    ones = rows[rows[:, 1] == 1]
    b = float(np.clip(app.init_batch_size, ones[:, 2].min(), ones[:, 2].max()))
    return b / float(np.interp(b, *zip(*sorted(zip(ones[:, 2], ones[:, 3])))))


def main() -> int:
    fits = {(m, t): fit(m, t) for m in MODELS for t in GPU_TYPES}
    errors = {way: [] for way in ("measured", "learnt", "spec", "none")}
    by_target: dict = {t: [] for t in GPU_TYPES}
    ratio_errors = {way: [] for way in ("learnt", "spec", "none")}
    for m in MODELS:
        others = TypeSpeeds({o: {t: fits[(o, t)] for t in GPU_TYPES}
                             for o in MODELS if o != m})
        for s, t in itertools.permutations(GPU_TYPES, 2):
            rows = get_application(m, gpu_type=t).measurements(max_nodes=1)
            truth = rows[:, 3]
            src = fits[(m, s)]
            prior = type_speed_prior(t) / type_speed_prior(s)
            learnt = others.ratio(s, t, reference_batch(src))
            ways = {"measured": fits[(m, t)],
                    "learnt": project_hints(src, learnt),
                    "spec": project_hints(src, prior),
                    "none": src}
            for way, hints in ways.items():
                err = np.abs(predict(hints, rows) / truth - 1.0)
                errors[way] += err.tolist()
                if way == "learnt":
                    by_target[t] += err.tolist()
            true_ratio = one_gpu_speed(m, t) / one_gpu_speed(m, s)
            for way, ratio in (("learnt", learnt), ("spec", prior),
                               ("none", 1.0)):
                ratio_errors[way].append(abs(ratio / true_ratio - 1.0))
    out = {"step_time_error": {}, "learnt_by_target": {}, "speed_ratio_error": {}}
    print("absolute relative error of the predicted step time on one node of the target "
          "type (all models, source/target pairs, measurements):")
    for way, errs in errors.items():
        med, p90 = float(np.median(errs)), float(np.percentile(errs, 90))
        out["step_time_error"][way] = {"median": med, "p90": p90, "points": len(errs)}
        print(f"  {way:9s} median {100 * med:5.1f}%  p90 {100 * p90:5.1f}%  ({len(errs)} points)")
    print("learnt, by target type:")
    for t, errs in by_target.items():
        med = float(np.median(errs))
        out["learnt_by_target"][t] = med
        print(f"  {t:5s} median {100 * med:5.1f}%")
    print("error of the one-GPU speed ratio between the two types (20 ordered pairs x 5 models):")
    for way, errs in ratio_errors.items():
        med, worst = statistics.median(errs), max(errs)
        out["speed_ratio_error"][way] = {"median": med, "max": worst}
        print(f"  {way:9s} median {100 * med:5.1f}%  max {100 * worst:5.1f}%")
    print("speed per GPU relative to t4 (one GPU, model's initial batch), measured / spec:")
    for t in GPU_TYPES:
        measured = [one_gpu_speed(m, t) / one_gpu_speed(m, "t4") for m in MODELS]
        print(f"  {t:5s} measured median {statistics.median(measured):5.2f} "
              f"(range {min(measured):.2f}-{max(measured):.2f}), spec "
              f"{type_speed_prior(t) / type_speed_prior('t4'):5.2f}")
    speeds = {t: compute_speed(fits[("cifar10", t)], 128) for t in GPU_TYPES}
    out["cifar10_compute_speed"] = speeds
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "type_bootstrap.json").write_text(json.dumps(out, indent=1))
    print(f"wrote {RESULTS / 'type_bootstrap.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
