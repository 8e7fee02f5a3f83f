"""Accuracy and cost of the throughput-model fit on real Pollux measurements.

For each of the six trace models in the vendored traces (``adaptdl_core/sim/data/traces``) this fits
:func:`adaptdl_core.goodput.fit_perf_params` on ``placements.csv`` (up to 4 nodes,
16 replicas) and reports the relative error of the predicted optimizer-step time

* in-sample, on ``placements.csv`` itself, and
* extrapolated, on ``scalability.csv`` (6 to 16 nodes, up to 64 replicas), and on its
  64-replica rows alone (``64 mean``: what a policy at scale rests on; the target is
  at most 0.12 on every model),

as mean and median of ``|predicted / measured - 1|``, plus the wall time of one fit.

The traces give ``step_time`` (one optimizer step, no accumulation: the micro-batch that
ends the step, sync included, i.e. ``T_o``) and ``sync_time`` (time blocked on the
all-reduce); ``T_c = step_time - sync_time`` is the compute-only micro-batch time.

Usage: ``python benchmarks/fit_accuracy.py`` (a few seconds).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from adaptdl_core.goodput import GoodputFunction, GradParams, fit_perf_params  # noqa: E402

from adaptdl_core.sim.job_model import APPLICATION_NAMES  # noqa: E402
from tests.data.traces import load_placements, load_scalability  # noqa: E402


def predicted_step_time(params, nodes, replicas, bsz) -> np.ndarray:
    """Model ``T_o`` (seconds) from the throughput at ``s = 0``: ``T_o = K * b / X``."""
    fn = GoodputFunction(params, GradParams(1.0, 1.0), 1)
    return replicas * bsz / fn.throughput(nodes, replicas, bsz, 0)


def main() -> None:
    header = (f"{'model':<11} {'rows':>5} {'in mean':>8} {'in med':>7} "
              f"{'rows':>5} {'ext mean':>8} {'ext med':>7} {'64 mean':>8} {'fit ms':>7}")
    print("relative error of predicted step time; fit on placements.csv,")
    print("extrapolation (ext) to scalability.csv")
    print(header)
    print("-" * len(header))
    fitted = {}
    for model in APPLICATION_NAMES:
        data = load_placements(model)
        timings = []
        for _ in range(3):
            start = time.perf_counter()
            params = fit_perf_params(*data)
            timings.append(time.perf_counter() - start)
        fitted[model] = params
        err_in = np.abs(predicted_step_time(params, *data[:3]) / data[4] - 1)
        scal = load_scalability(model)
        err_out = np.abs(predicted_step_time(params, *scal[:3]) / scal[4] - 1)
        at64 = err_out[scal[1] == 64]
        print(f"{model:<11} {err_in.size:>5} {err_in.mean():>8.3f} {np.median(err_in):>7.3f} "
              f"{err_out.size:>5} {err_out.mean():>8.3f} {np.median(err_out):>7.3f} "
              f"{at64.mean() if at64.size else float('nan'):>8.3f} "
              f"{1000 * min(timings):>7.1f}")
    print()
    print("fitted parameters (seconds):")
    for model, params in fitted.items():
        print(f"  {model:<11} " + ", ".join(f"{k}={v:.4g}" for k, v in params._asdict().items()))


if __name__ == "__main__":
    main()
