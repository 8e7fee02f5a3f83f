"""How often an interrupted Tune sweep resumes exactly, over repeated runs.

Each run is the scenario of ``tests/ray/test_interrupt_points.py``
(``tests/ray/interrupt_scenario.py``): two trials on 4 logical CPUs, each short epoch
trains with ``autoscale_batch_size``, validates over a second ``AdaptiveDataLoader`` and
reports a ``model.pt`` checkpoint, with (``validating``) or without
(``validating-nopause``) a 0.5 s pause after the report. The driver gets SIGINT right at a
report (a trial inside Tune's save), held in the pause after one and mid-epoch, is restored with
``Tuner.restore`` after each, and runs to the end. A run resumed exactly when no epoch was
trained or reported twice or never and ``progress.csv`` holds each epoch once; a run whose
harness could not interrupt as planned (a point not reached, no state saved) counts as not
exact too, with its reason.

    python benchmarks/interrupt_resume.py --runs 5            # 5 runs of each job
    python benchmarks/interrupt_resume.py --runs 3 --jobs validating
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from _common import ROOT, machine_description  # noqa: F401  (puts the repository on sys.path)
from tests.ray.interrupt_run import JOBS  # noqa: E402
from tests.ray.interrupt_scenario import POINTS, interrupted_sweep  # noqa: E402


def run(runs: int, jobs: list[str]) -> dict:
    """``runs`` rounds, each running every job of ``jobs`` once (interleaved)."""
    rows = []
    for i in range(runs):
        for job in jobs:
            with tempfile.TemporaryDirectory(prefix="interrupt-resume-") as d:
                try:
                    result = interrupted_sweep(Path(d), job)
                    row = {"job": job, "exact": not result["problems"],
                           "problems": result["problems"], "seconds": result["seconds"],
                           "launches": result["launches"]}
                except AssertionError as exc:
                    row = {"job": job, "exact": False, "seconds": None,
                           "problems": [f"harness: {str(exc)[-2000:]}"]}
            rows.append({"run": i + 1, **row})
            print(f"run {i + 1} {job}: {'exact' if row['exact'] else 'NOT exact'}"
                  + (f" ({row['seconds']:.0f} s; launches began at finished epochs "
                     f"{row['launches']})" if row["seconds"] else "")
                  + "".join(f"\n    {p}" for p in row["problems"]), flush=True)
    return {"machine": machine_description(), "points": [list(p) for p in POINTS],
            "rows": rows}


def report(data: dict) -> str:
    lines = [f"Machine: {data['machine']}",
             f"interrupt points (event, epoch, delay s): {data['points']}"]
    for job in dict.fromkeys(r["job"] for r in data["rows"]):
        rows = [r for r in data["rows"] if r["job"] == job]
        lines.append(f"{job}: {sum(r['exact'] for r in rows)} of {len(rows)} runs resumed "
                     f"exactly ({len(data['points'])} interrupts each)")
    rows = data["rows"]
    lines.append(f"all: {sum(r['exact'] for r in rows)} of {len(rows)} exact")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=5, help="rounds (each runs every job once)")
    p.add_argument("--jobs", nargs="+", default=["validating", "validating-nopause"],
                   choices=sorted(k for k in JOBS if k.startswith("validating")),
                   help="which sweeps (default both)")
    p.add_argument("--json", default=None, help="also write the raw rows here")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error(f"--runs must be at least 1, got {args.runs}")
    data = run(args.runs, args.jobs)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(data, f)
    print(report(data))
    return 0 if all(r["exact"] for r in data["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
