"""Decision time of the goodput-based cluster-size rule (adaptdl_core.policy.ClusterSizeRule).

One decision runs the allocator once per candidate size in ``[min_nodes, max_nodes]``, so
its cost is what a driver pays per round when autoscaling is on. Measured for 8 / 32 jobs
on up to 16 / 64 nodes of 8 GPUs + 64 CPUs, every job asking ``{"GPU": 1, "CPU": 4}`` per
replica, with synthetic saturating speedups ``K / (1 + c (K - 1))`` (``c`` drawn uniformly
in [0.01, 0.3], fixed seed), current size 4 nodes. Prints a markdown table: median and
maximum seconds over ``--repeats`` decisions, the desired size and the utility there.

Usage: ``python benchmarks/cluster_size.py [--repeats N] [--seed N]``.
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

from adaptdl_core.policy import ClusterSizeRule, JobInfo  # noqa: E402

NODE = {"GPU": 8, "CPU": 64}


def saturating(c: float):
    """``f(N, K) = K / (1 + c (K - 1))``, 0.9x across nodes, 0 where invalid."""

    def fn(n, k):
        n, k = np.asarray(n), np.asarray(k)
        kk = np.maximum(k, 1).astype(np.float64)
        s = kk / (1.0 + c * (kk - 1.0)) * np.where(n > 1, 0.9, 1.0)
        return np.where((k > 0) & (n >= 1) & (n <= k), s, 0.0)

    return fn


def main() -> None:
    """Time the decisions and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    print("| jobs | max nodes | median s | max s | desired | utility |")
    print("|-----:|----------:|---------:|------:|--------:|--------:|")
    for num_jobs, max_nodes in ((8, 16), (32, 16), (32, 64)):
        jobs = {f"j{i}": JobInfo({"GPU": 1, "CPU": 4}, saturating(float(rng.uniform(0.01, 0.3))),
                                 creation_timestamp=0.0) for i in range(num_jobs)}
        rule = ClusterSizeRule(NODE, min_nodes=1, max_nodes=max_nodes)
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            decision = rule.decide(jobs, 4, now=3600.0)
            times.append(time.perf_counter() - start)
        print(f"| {num_jobs} | {max_nodes} | {statistics.median(times):.3f} | "
              f"{max(times):.3f} | {decision.desired_nodes} | "
              f"{decision.utilities[decision.desired_nodes]:.3f} |")


if __name__ == "__main__":
    main()
