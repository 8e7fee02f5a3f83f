"""Latency of each ``adaptdl-ray`` verb on an idle local cluster, as a user sees it.

Starts a private one-node cluster (``ray start --head``, 4 logical CPUs, free ports; see
``tests/ray/local_cluster.py``), then ``--rounds`` times: ``submit`` a 2-replica job of
``tests/core/jobs/elastic_job.py`` (slowed to 0.2 s per batch), wait for its first batch,
``ls``, ``ls --json``, ``logs``, ``stop`` (checkpoint at the next batch, wait for the
end), ``cp``; the next round's ``submit`` resumes the same job. Each verb is timed as a
fresh ``python -m adaptdl_ray ...`` process, wall clock, from start to exit. Beside them:
the floor of a Python process that only imports Ray's job client
(``python -c "import ray.job_submission"``) and Ray's own ``ray job list``.

    python benchmarks/cli_latency.py [--rounds 3]

Prints a markdown table (median and range per verb, seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.core.harness import read_events  # noqa: E402
from tests.ray.local_cluster import LocalCluster  # noqa: E402


def timed(env, cwd, command) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    out = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True,
                         timeout=600)
    return time.perf_counter() - t0, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    opts = parser.parse_args()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("ADAPTDL_") and k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if
                                                         env.get("PYTHONPATH") else [])),
               RAY_AUTH_MODE="disabled", OMP_NUM_THREADS="1")
    work = Path(tempfile.mkdtemp(prefix="cli-latency-"))
    shutil.copy(ROOT / "tests" / "core" / "jobs" / "elastic_job.py", work / "job.py")
    record, storage = work / "record", work / "storage"
    record.mkdir()
    times: dict[str, list[float]] = {}

    def note(verb: str, seconds: float, out: subprocess.CompletedProcess | None = None):
        if out is not None and out.returncode != 0:
            raise SystemExit(f"{verb} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
        times.setdefault(verb, []).append(seconds)

    t0 = time.perf_counter()
    cluster = LocalCluster(num_cpus=4, env=env)
    note("(cluster start: ray start --head, dashboard up)", time.perf_counter() - t0)
    cli = [sys.executable, "-m", "adaptdl_ray"]
    address = ["--address", cluster.address]
    try:
        for round_ in range(opts.rounds):
            note("floor: python -c 'import ray.job_submission'", *timed(
                env, work, [sys.executable, "-c", "import ray.job_submission"]))
            note("ray job list (Ray's own CLI)", *timed(
                env, work, [sys.executable, "-m", "ray.scripts.scripts", "job", "list",
                            *address]))
            seen = sum(1 for e in read_events(record) if e["event"] == "batch")
            start = time.perf_counter()
            note("submit", *timed(env, work, [
                *cli, "submit", *address, "--name", "bench", "--min-replicas", "2",
                "--max-replicas", "2", "--storage-path", str(storage), "job.py",
                "--record", str(record), "--epochs", "50", "--size", "96",
                "--sleep", "0.2"]))
            while sum(1 for e in read_events(record) if e["event"] == "batch") <= seen:
                if time.perf_counter() - start > 300:
                    raise SystemExit("the job did not train within 300 s")
                time.sleep(0.1)
            note("(submit to first batch)", time.perf_counter() - start)
            note("ls", *timed(env, work, [*cli, "ls", *address]))
            note("ls --json", *timed(env, work, [*cli, "ls", "--json", *address]))
            note("logs", *timed(env, work, [*cli, "logs", "bench", *address]))
            note("stop (to the job's end)", *timed(env, work, [*cli, "stop", "bench",
                                                               *address]))
            note("cp", *timed(env, work, [*cli, "cp", "bench", str(work / f"copy{round_}"),
                                          *address]))
        seconds, out = timed(env, work, [*cli, "status", *address])
        status_note = out.stderr.strip() if out.returncode else "ok"
        note("status (allocator)", seconds)
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"rounds: {opts.rounds}; status verb: {status_note}\n")
    print("| verb | median s | min-max s |\n|---|---|---|")
    for verb, values in times.items():
        print(f"| {verb} | {statistics.median(values):.2f} | "
              f"{min(values):.2f}-{max(values):.2f} |")
    print("\n" + json.dumps(times))


if __name__ == "__main__":
    main()
