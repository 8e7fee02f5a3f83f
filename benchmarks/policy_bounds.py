"""Time and memory of one allocation round when a job's ``max_replicas`` and the nodes'
capacity are huge: bounded by ``MAX_REPLICAS_PER_JOB``, not by the numbers.

Each case runs in a child process under a 4 GiB address-space limit (before the bound,
``max_replicas=10**9`` on a node of 1e12 CPUs ran out of memory), and reports the
round's wall time (``allocate``, median of ``--repeats``), the child's peak resident memory
and the replicas given. Speedup functions: linear in the replica count (the worst case: every
extra replica pays) for every job.

    python benchmarks/policy_bounds.py            # ~1 min on 2 shared cores
    python benchmarks/policy_bounds.py --repeats 1
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CASES = [
    # (label, jobs, max_replicas, CPUs of the one node)
    ("1 job, max 4096, 1e6 CPUs (the unbounded-callable cap)", 1, 4096, 1e6),
    ("1 job, max 16384 (= the bound), 1e6 CPUs", 1, 16384, 1e6),
    ("1 job, max 10**5, 1e6 CPUs (unbounded: 6.3 s)", 1, 10 ** 5, 1e6),
    ("1 job, max 10**9, 1e12 CPUs (unbounded: out of memory)", 1, 10 ** 9, 1e12),
    ("4 jobs, max 10**9 each, 1e12 CPUs", 4, 10 ** 9, 1e12),
]

_CHILD = r"""
import json, logging, resource, statistics, sys, time
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
logging.disable(logging.WARNING)   # the bound's warning, once per JobInfo
import numpy as np
from adaptdl_core.policy import JobInfo, NodeInfo, PolluxPolicy
jobs_n, max_r, repeats = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[4])
cpus = float(sys.argv[3])
def linear(n, k):
    return np.asarray(k, dtype=np.float64) * np.ones(np.shape(n))
times = []
for _ in range(repeats):
    jobs = {f"j{i}": JobInfo({"CPU": 1}, linear, float(i), max_replicas=max_r)
            for i in range(jobs_n)}
    t = time.perf_counter()
    result = PolluxPolicy().allocate(jobs, {"n": NodeInfo({"CPU": cpus})}, now=100.0)
    times.append(time.perf_counter() - t)
print(json.dumps({"s": statistics.median(times),
                  "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "replicas": sorted(len(v) for v in result.allocations.values())}))
"""


def main() -> int:
    """Run every case and print a markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print("| case | round (s, median) | peak RSS (MiB) | replicas given |")
    print("|---|---|---|---|")
    for label, jobs, max_r, cpus in CASES:
        proc = subprocess.run([sys.executable, "-c", _CHILD, str(jobs), str(max_r), str(cpus),
                               str(args.repeats)], capture_output=True, text=True,
                              timeout=600)
        if proc.returncode != 0:
            print(f"| {label} | failed: {proc.stderr.strip().splitlines()[-1:]} | | |")
            continue
        r = json.loads(proc.stdout)
        print(f"| {label} | {r['s']:.2f} | {r['rss_mib']:.0f} | {r['replicas']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
