"""An elastic torchrun job gaining a node: checkpoint, resume on the larger world, timings.

Runs ``tests/core/jobs/elastic_job.py`` (unchanged adaptdl_core script) under torchrun with
``--nnodes=1:2 --rdzv-backend=c10d`` on this machine: agent A starts alone with one process;
once it trains, agent B joins. torchrun stops A's worker with SIGTERM (a membership
change), the worker checkpoints at the next batch boundary, and both agents start a round
of two processes that resume from the checkpoint. Per run it reports the seconds from B's
start to the checkpoint on disk and to the first step of the two-process round, and checks
that every epoch trained on every sample exactly once. Prints a markdown table and the
medians.

torch 2.13's agents hang in the second rendezvous round when they share their store with
the workers (the default); ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` is set for both
unless ``--shared-store`` is given (see docs/torchrun.md).

Usage: ``python benchmarks/torchrun_elastic.py [--repeats N] [--sleep S] [--shared-store]``
(one run takes 30-90 s on a busy 2-core machine).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "tests" / "core" / "jobs" / "elastic_job.py"
SIZE, EPOCHS = 96, 3


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the rendezvous endpoint)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def agent(record: Path, port: int, sleep: float, env: dict, log: Path) -> subprocess.Popen:
    """Start one torchrun agent (one process) of the elastic job, output into ``log``."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1:2",
           "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
           "--rdzv-id=bench", "--rdzv-conf=last_call_timeout=1,join_timeout=60",
           "--max-restarts=0", str(JOB), "--record", str(record), "--size", str(SIZE),
           "--epochs", str(EPOCHS), "--sleep", str(sleep), "--signal-file",
           str(record / "started")]
    return subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)


def first_batch(path: Path) -> bool:
    """True once the record file ``path`` holds a training batch."""
    if not path.exists():
        return False
    return any(json.loads(line).get("event") == "batch"
               for line in path.read_text().splitlines() if line.strip())


def exactly_once(record: Path) -> bool:
    """Every epoch trained on every sample exactly once, over all record files."""
    seen = collections.defaultdict(collections.Counter)
    for path in record.glob("r*-rank*.jsonl"):
        for line in path.read_text().splitlines():
            event = json.loads(line)
            if event["event"] == "batch":
                seen[event["epoch"]].update(event["idx"])
    return (sorted(seen) == list(range(EPOCHS))
            and all(set(c) == set(range(SIZE)) and set(c.values()) == {1}
                    for c in seen.values()))


def one_run(sleep: float, shared: bool, timeout: float = 300) -> dict:
    """One join: agent A alone, then agent B; returns exit statuses, seconds from B's start
    to the checkpoint and to the first two-process step, and the exactly-once verdict.

    Raises:
        RuntimeError: when A's job never starts or the agents outlive ``timeout`` seconds.
    """
    with tempfile.TemporaryDirectory(prefix="torchrun-elastic-") as tmp:
        record = Path(tmp)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("ADAPTDL_", "TORCHELASTIC_"))}
        env.update(ADAPTDL_CHECKPOINT_PATH=str(record / "ckpt"), OMP_NUM_THREADS="1",
                   PYTHONUNBUFFERED="1",
                   PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
        if not shared:
            env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        port = free_port()
        a = agent(record, port, sleep, env, record / "a.log")
        deadline = time.monotonic() + timeout
        while not (record / "started").exists():
            if time.monotonic() > deadline or a.poll() is not None:
                a.kill()
                raise RuntimeError("agent A's job did not start:\n"
                                   + (record / "a.log").read_text()[-3000:])
            time.sleep(0.05)
        joined = time.monotonic()
        b = agent(record, port, sleep, env, record / "b.log")
        saved = resumed = None
        while a.poll() is None or b.poll() is None:
            now = time.monotonic()
            if saved is None and (record / "ckpt").exists() and any(
                    p.name.startswith("checkpoint-") for p in (record / "ckpt").iterdir()):
                saved = now - joined
            if resumed is None and first_batch(record / "r0-rank1.jsonl"):
                resumed = now - joined
            if now > deadline:
                a.kill(), b.kill()
                raise RuntimeError("the agents did not finish within the timeout:\n"
                                   + (record / "a.log").read_text()[-2000:]
                                   + (record / "b.log").read_text()[-2000:])
            time.sleep(0.05)
        return {"status": (a.returncode, b.returncode), "checkpoint_s": saved,
                "first_step_s": resumed, "exactly_once": exactly_once(record)}


def main() -> None:
    """Parse the options, run the joins and print the table and medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sleep", type=float, default=0.3,
                        help="seconds per batch, so that B joins while A trains")
    parser.add_argument("--shared-store", action="store_true",
                        help="leave torch's shared agent store on (hangs in torch 2.13)")
    args = parser.parse_args()
    print("| run | exit A, B | B start -> checkpoint s | B start -> 2-process step s "
          "| exactly once |")
    print("|----:|----------|------------------------:|---------------------------:"
          "|:------------:|")
    runs = []
    for i in range(args.repeats):
        r = one_run(args.sleep, args.shared_store)
        runs.append(r)
        fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
        print(f"| {i} | {r['status']} | {fmt(r['checkpoint_s'])} | "
              f"{fmt(r['first_step_s'])} | {r['exactly_once']} |", flush=True)
    for key in ("checkpoint_s", "first_step_s"):
        values = [r[key] for r in runs if r[key] is not None]
        if values:
            print(f"median {key}: {statistics.median(values):.1f} ({len(values)} runs)")


if __name__ == "__main__":
    main()
