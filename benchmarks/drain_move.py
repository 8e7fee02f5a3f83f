"""How long a submitted job takes to leave a draining node, over repeated
runs.

Each run is the scenario of ``tests/ray/test_draining_nodes.py``
(``tests/ray/drain_job_run.py``): a two-node ``ray.cluster_utils.Cluster`` of its own (a
head of 1 CPU, a worker of 2), a 2-replica job (``tests/core/jobs/elastic_job.py``, driven
by ``ElasticJob``) training on the worker; the worker is drained as a spot node's notice
would drain it (``ray drain-node --reason DRAIN_NODE_REASON_PREEMPTION
--deadline-remaining-seconds 60``). Measured: from ``ray drain-node`` returning to the
first training step on the head (the driver notices within its check interval, the
replicas checkpoint at their next batch boundary, one replica starts on the head and
restores), and whether every sample of every epoch was trained exactly once.

    python benchmarks/drain_move.py --runs 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import ROOT, machine_description  # noqa: F401  (puts the repository on sys.path)
from tests.core.harness import read_events  # noqa: E402
from tests.exactly_once import assert_exactly_once  # noqa: E402


def one_run(deadline_s: float) -> dict:
    """One drained job, in its own process (its own cluster)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    env.pop("RAY_ADDRESS", None)
    with tempfile.TemporaryDirectory(prefix="drain-move-") as d:
        record = Path(d) / "record"
        record.mkdir()
        proc = subprocess.run([sys.executable, "-m", "tests.ray.drain_job_run",
                               str(Path(d) / "storage"), str(record), str(deadline_s)],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            return {"ok": False, "problem": proc.stderr[-2000:]}
        seen = json.loads(proc.stdout.strip().splitlines()[-1])
        try:
            assert_exactly_once(read_events(record), 96, 2)
            exact = True
        except AssertionError as exc:
            exact, seen["problem"] = False, str(exc)[-1000:]
    return {"ok": seen["status"] == 0 and seen["drain_rc"] == 0, "exact": exact, **seen}


def main(argv: list[str] | None = None) -> int:
    """Run the drains and print each run and the median; exit 1 unless every run moved
    and trained every sample exactly once."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=5, help="runs (default 5)")
    p.add_argument("--deadline", type=float, default=60.0,
                   help="the drain's deadline in seconds (default 60)")
    p.add_argument("--json", default=None, help="also write the raw rows here")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error(f"--runs must be at least 1, got {args.runs}")
    rows = []
    for i in range(args.runs):
        row = one_run(args.deadline)
        rows.append(row)
        print(f"run {i + 1}: " + (
            f"drain to first step on the other node {row['drain_to_first_step_s']:.1f} s "
            f"(ray drain-node took {row['drain_command_s']:.1f} s), launches {row['sizes']}, "
            f"{'exactly once' if row['exact'] else 'NOT exactly once'}"
            if row["ok"] and row.get("drain_to_first_step_s") is not None
            else f"failed: {row.get('problem', row)}"), flush=True)
    moved = [r["drain_to_first_step_s"] for r in rows
             if r["ok"] and r.get("drain_to_first_step_s") is not None]
    print(f"Machine: {machine_description()}")
    print(f"{len(moved)} of {len(rows)} runs moved; "
          f"{sum(bool(r.get('exact')) for r in rows)} exactly once; deadline {args.deadline:g} s")
    if moved:
        print(f"drain to first step on the other node: median {statistics.median(moved):.1f} s "
              f"(min {min(moved):.1f}, max {max(moved):.1f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine_description(), "rows": rows}, f)
    return 0 if len(moved) == len(rows) and all(r.get("exact") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
