"""Which processes a sweep of many short trials starts, and the CPU each kind uses.

Runs one arm of ``benchmarks/many_trials.py`` (after its unmeasured warm-up) on a private
local Ray while a thread samples ``/proc`` every 0.1 s: every process that appears is
grouped by the sequence of Ray titles it showed (``ray::IDLE > ray::ImplicitFunc.__init__
> ...``), with its CPU seconds (user + system, the last reading before it exited). Linux
only. The figures say how much of a sweep's CPU goes to Ray worker processes that are
started and discarded around the trials (in both arms alike) rather than to the trials.

    python benchmarks/process_churn.py --arm adaptdl --trials 40
    python benchmarks/process_churn.py --arm fifo-reuse --trials 40
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import _tune_common as tc
import many_trials
from _common import machine_description
from _processes import ProcessSampler, kinds_table


def main(argv: list[str] | None = None) -> int:
    """Run the arm under the monitor and print its wall time and the process table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--arm", default="adaptdl", choices=("fifo", "fifo-reuse", "adaptdl",
                                                        "adaptdl-noreuse"))
    p.add_argument("--trials", type=int, default=40, help="trials (default 40)")
    p.add_argument("--cpus", type=int, default=8, help="Ray CPUs (default 8)")
    args = p.parse_args(argv)
    if not os.path.isdir("/proc"):
        p.error("needs Linux's /proc")
    import ray
    tc.init_ray(args.cpus)
    storage = tempfile.mkdtemp(prefix="process-churn-")
    many_trials.warm_up(args.cpus, storage)
    with ProcessSampler() as sampler:
        result = many_trials.run_arm(args.arm, args.trials, storage)
    ray.shutdown()
    print(f"Machine: {machine_description()}")
    print(f"arm {args.arm}: {args.trials} trials in {result['wall_s']:.1f} s, "
          f"{args.cpus} Ray CPUs\n")
    print("| processes | CPU s | Ray titles seen, in order |\n|---:|---:|---|")
    for kind, count, cpu in kinds_table(sampler.seen)[:15]:
        print(f"| {count} | {cpu:.1f} | {kind} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
