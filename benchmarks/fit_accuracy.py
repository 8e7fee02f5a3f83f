"""Accuracy and cost of the throughput-model fit on real Pollux measurements.

For each of the four trace models in ``tests/data/pollux_traces`` this fits
:func:`adaptdl_core.goodput.fit_perf_params` on ``placements.csv`` (up to 4 nodes,
16 replicas) and reports the relative error of the predicted optimizer-step time

* in-sample, on ``placements.csv`` itself, and
* extrapolated, on ``scalability.csv`` (6 to 16 nodes, up to 64 replicas),

as mean and median of ``|predicted / measured - 1|``, plus the wall time of one fit.

The traces give ``step_time`` (one optimizer step, no accumulation: the micro-batch that
ends the step, sync included, i.e. ``T_o``) and ``sync_time`` (time blocked on the
all-reduce); ``T_c = step_time - sync_time`` is the compute-only micro-batch time.

Usage: ``python benchmarks/fit_accuracy.py`` (a few seconds).
"""

from __future__ import annotations

import csv
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from adaptdl_core.goodput import GoodputFunction, GradParams, fit_perf_params  # noqa: E402

TRACES = ROOT / "tests" / "data" / "pollux_traces"
MODELS = ("bert", "cifar10", "imagenet", "ncf")


def _read(path: Path) -> list:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def load_placements(model: str):
    """(nodes, replicas, local_bsz, T_c, T_o) arrays from ``placements.csv``."""
    rows = _read(TRACES / model / "placements.csv")
    placement = [r["placement"].strip() for r in rows]
    nodes = np.array([len(p) for p in placement], dtype=float)
    replicas = np.array([sum(int(c) for c in p) for p in placement], dtype=float)
    bsz = np.array([float(r["local_bsz"]) for r in rows])
    step = np.array([float(r["step_time"]) for r in rows])
    sync = np.array([float(r["sync_time"]) for r in rows])
    return nodes, replicas, bsz, step - sync, step


def load_scalability(model: str):
    """(nodes, replicas, local_bsz, T_c, T_o) arrays from ``scalability.csv``."""
    rows = _read(TRACES / model / "scalability.csv")

    def col(name):
        return np.array([float(r[name]) for r in rows])

    step = col("step_time")
    return col("num_nodes"), col("num_replicas"), col("local_bsz"), step - col("sync_time"), step


def predicted_step_time(params, nodes, replicas, bsz) -> np.ndarray:
    """Model ``T_o`` (seconds) from the throughput at ``s = 0``: ``T_o = K * b / X``."""
    fn = GoodputFunction(params, GradParams(1.0, 1.0), 1)
    return replicas * bsz / fn.throughput(nodes, replicas, bsz, 0)


def main() -> None:
    header = (f"{'model':<9} {'rows':>5} {'in mean':>8} {'in med':>7} "
              f"{'rows':>5} {'ext mean':>8} {'ext med':>7} {'fit ms':>7}")
    print("relative error of predicted step time; fit on placements.csv,")
    print("extrapolation (ext) to scalability.csv")
    print(header)
    print("-" * len(header))
    fitted = {}
    for model in MODELS:
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
        print(f"{model:<9} {err_in.size:>5} {err_in.mean():>8.3f} {np.median(err_in):>7.3f} "
              f"{err_out.size:>5} {err_out.mean():>8.3f} {np.median(err_out):>7.3f} "
              f"{1000 * min(timings):>7.1f}")
    print()
    print("fitted parameters (seconds):")
    for model, params in fitted.items():
        print(f"  {model:<9} " + ", ".join(f"{k}={v:.4g}" for k, v in params._asdict().items()))


if __name__ == "__main__":
    main()
