"""Where the test suite's CPU goes: its wall time, how busy the machine was, and the CPU
seconds of each kind of process it started.

Runs a test command (by default the README's, the one CI runs) while ``/proc`` is sampled
(``_processes.py``), then prints one table: processes grouped by what they are (the job
scripts of the multi-process tests, Ray's replica and trial actors, Ray's own daemons, the
pytest workers, ...), with their CPU seconds and share. The suite's time on a 2-core
machine is bounded below by its CPU seconds over 2; the table says which processes those
seconds buy. Linux only; run it with nothing else heavy on the machine.

    python benchmarks/suite_cpu.py                       # the README's test command
    python benchmarks/suite_cpu.py -- python -m pytest -q -n 2 tests/ray/test_lost_nodes.py
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

from _common import machine_description, markdown_table
from _processes import ProcessSampler, busy_cpu_seconds, kinds_table, ray_titles

ROOT = Path(__file__).resolve().parents[1]

# Ray's daemons, by command line or title.
_DAEMONS = ("raylet", "gcs_server", "log_monitor", "monitor.py", "dashboard",
            "ray::DashboardAgent", "ray::RuntimeEnvAgent")


def readme_test_command() -> str:
    """The pytest part of the README's test command (the line after the
    ``<!-- test-command -->`` marker, as ``.ci/run`` reads it), without its install.

    Raises:
        SystemExit: the README has no such line."""
    lines = (ROOT / "README.md").read_text().splitlines()
    for i, line in enumerate(lines):
        if "<!-- test-command -->" in line and i + 2 < len(lines):
            return lines[i + 2].split("&&")[-1].strip()
    raise SystemExit("README.md has no test command after <!-- test-command -->")


def kind_of(names: list[str]) -> str:
    """A process's kind, from the command lines (and Ray titles) it showed."""
    titles = ray_titles(names)
    text = " ".join(names)
    if any(t.startswith("ray::ReplicaWorker") for t in titles):
        return "replica actors (ray::ReplicaWorker)"
    if any(t.startswith("ray::AdaptDL_") for t in titles):
        return "trial actors (ray::AdaptDL_*)"
    if any(d in text for d in _DAEMONS):  # ("dashboard": its modules' processes too)
        return "Ray daemons (raylet, GCS, agents, log monitor, dashboard)"
    if titles and set(titles) != {"ray::IDLE"}:
        return "other Ray actors (control, allocator, job supervisor, ...)"
    if titles:
        return "idle Ray workers"
    if re.search(r"tests[/.]core[/.]jobs", text):
        return "job scripts of the multi-process tests and CLI jobs"
    if "adaptdl_ray" in text or "ray.scripts.scripts" in text:
        return "CLI processes (adaptdl-ray, ray start/drain-node)"
    if "pytest" in text or "import sys;exec" in text:
        return "pytest and its workers (in-process tests)"
    if re.search(r"tests[/.]ray[/.]\w+_run", text):
        return "scenario drivers (tests/ray/*_run.py)"
    if "examples/" in text:
        return "examples"
    return "other (" + (names[0].split()[0].rsplit("/", 1)[-1] if names else "?") + ")"


def main(argv: list[str] | None = None) -> int:
    """Run the command under the sampler; print its time and the table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="the test command after `--` (default: the README's)")
    args = p.parse_args(argv)
    if not os.path.isdir("/proc"):
        p.error("needs Linux's /proc")
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    command = command or shlex.split(readme_test_command())
    busy0, all0 = busy_cpu_seconds()
    started = time.monotonic()
    with ProcessSampler(interval_s=0.2) as sampler:
        status = subprocess.run(command, cwd=ROOT).returncode
    wall = time.monotonic() - started
    busy1, all1 = busy_cpu_seconds()
    rows = kinds_table(sampler.seen, kind_of)
    total = sum(cpu for _, _, cpu in rows)
    print(f"\nMachine: {machine_description()}")
    print(f"Command: {shlex.join(command)} (exit status {status})")
    print(f"Wall {wall:.0f} s; the machine was {100 * (busy1 - busy0) / (all1 - all0):.0f}% "
          f"busy; the processes sampled used {total:.0f} CPU s "
          f"({total / wall:.2f} cores on average)\n")
    print(markdown_table(["kind", "processes", "CPU s", "share"],
                         [(k, n, f"{c:.0f}", f"{100 * c / total:.0f}%") for k, n, c in rows
                          if c >= 0.5]))
    return status


if __name__ == "__main__":
    sys.exit(main())
