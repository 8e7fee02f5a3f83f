"""Speed of ``GoodputFunction.optimize`` over many placements in one call, beside one call
per placement.

The policy asks for the best batch of every placement a job could get (up to thousands per
round), so ``optimize`` is vectorised over its ``(num_nodes, num_replicas)`` arrays. This
times one call over 1,000 placements (1-10 nodes, up to 1,000 replicas; a fitted model,
accumulation allowed, batch up to 4,096) against 1,000 scalar calls giving the same answers,
arms interleaved and repeated; it prints the median seconds of each arm and their ratio
(the ratio is the figure to compare between machines: absolute times move with the load).

Usage: ``python benchmarks/goodput_optimize.py [--repeats N]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from adaptdl_core.goodput import GoodputFunction, GradParams, PerfParams  # noqa: E402


def placements() -> tuple[np.ndarray, np.ndarray]:
    """1,000 ``(num_nodes, num_replicas)`` pairs: 1-10 nodes, 100 replica counts each."""
    n = np.repeat(np.arange(1, 11), 100)
    k = n * np.tile(np.arange(1, 101), 10) // 10 + n
    return n, k


def main() -> None:
    """Time both arms and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    fn = GoodputFunction(PerfParams(0.017, 0.0007, 0.12, 0.0024, 0.03, 0.0034, 2.0),
                         GradParams(1.0, 10.0), 128)
    n, k = placements()
    options = (4096, (32, 1024), True)

    def vectorised():
        return fn.optimize(n, k, *options)

    def one_by_one():
        return [fn.optimize(int(a), int(b), *options) for a, b in zip(n, k)]

    whole = vectorised()
    singles = one_by_one()  # (also the warm-up of both arms)
    for i, (goodput, bsz, accum) in enumerate(singles):
        assert (goodput, bsz, accum) == (whole[0][i], whole[1][i], whole[2][i]), i
    times: dict[str, list[float]] = {"vectorised": [], "one_by_one": []}
    for _ in range(args.repeats):
        for name, arm in (("vectorised", vectorised), ("one_by_one", one_by_one)):
            start = time.perf_counter()
            arm()
            times[name].append(time.perf_counter() - start)
    vec, loop = (statistics.median(times[name]) for name in ("vectorised", "one_by_one"))
    print("| placements | one call, median s | one call each, median s | ratio |")
    print("|-----------:|-------------------:|------------------------:|------:|")
    print(f"| {len(n)} | {vec:.4f} | {loop:.4f} | {loop / vec:.1f}x |")


if __name__ == "__main__":
    main()
