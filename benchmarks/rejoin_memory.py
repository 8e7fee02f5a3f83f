"""A replica that stays through resizes rejoins its job's process group in the same process:
does it hang, or leak memory, open files or threads?

A resize that keeps its survivors (a submitted job's, a Tune trial's) has each survivor
leave its process group and join the next one without a new process. On ``nccl`` a
process group holds device memory and communicator threads; this runs one replica
(``ReplicaWorker``, as a replica actor does, but in this process) through ``--rejoins``
launches, each joining the group, all-reducing a tensor on the device and reporting, and
prints the process's device memory, open files and threads after each launch.

    python benchmarks/rejoin_memory.py                       # gloo on CPU (what CI can run)
    python benchmarks/rejoin_memory.py --backend nccl --rejoins 10   # on a machine with a GPU

Pass: every launch finishes, and nothing grows after the first launches (the first one
initialises CUDA and the allocator's caches).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _job(config):
    """Joins the job's process group, all-reduces a tensor on the device, reports."""
    import torch
    import torch.distributed as dist
    from ray import tune

    import adaptdl_core.torch as adl
    adl.init_process_group(config["backend"])
    device = "cuda" if config["backend"] == "nccl" else "cpu"
    value = torch.ones(1 << 20, device=device)
    dist.all_reduce(value)
    tune.report({"sum": float(value.sum())})


def _device_mb() -> float | None:
    import torch
    if not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2**20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument("--rejoins", type=int, default=8, help="launches in one process")
    parser.add_argument("--out", help="write the rows as JSON here")
    args = parser.parse_args(argv)

    from adaptdl_ray.replicas import _ray_private
    from adaptdl_ray.replicas.worker import ReplicaWorker
    world = {"world_rank": 0, "world_size": 1, "local_rank": 0, "local_world_size": 1,
             "node_rank": 0}
    worker = ReplicaWorker(0, {"trial_id": "rejoin"})
    rows = []
    try:
        for i in range(args.rejoins):
            env = {"ADAPTDL_REPLICA_RANK": "0", "ADAPTDL_NUM_REPLICAS": "1",
                   "ADAPTDL_NUM_NODES": "1", "ADAPTDL_MASTER_ADDR": "127.0.0.1",
                   "ADAPTDL_MASTER_PORT": str(worker.free_port()), "ADAPTDL_NUM_RESTARTS": str(i),
                   "ADAPTDL_JOB_ID": "rejoin"}
            started = time.perf_counter()
            outcome = worker.run(_job, {"backend": args.backend}, {}, env, None, None, 1, world)
            worker.next_results(5.0)
            worker.recycle({"trial_id": "rejoin"})
            rows.append({"launch": i + 1, "status": outcome["status"],
                         "s": round(time.perf_counter() - started, 3),
                         "device_mb": _device_mb(),
                         "open_files": len(os.listdir("/proc/self/fd")),
                         "threads": threading.active_count()})
            print(json.dumps(rows[-1]), flush=True)
    finally:
        worker.recycle({})
        _ray_private.clear_replica_session()
    settled, last = rows[min(2, len(rows) - 1)], rows[-1]
    grew = {k: last[k] - settled[k] for k in ("open_files", "threads", "device_mb")
            if settled[k] is not None}
    ok = all(r["status"] == "finished" for r in rows) and \
        grew.get("open_files", 0) <= 2 and grew.get("threads", 0) <= 1 and \
        grew.get("device_mb", 0.0) <= 64.0
    print(f"backend {args.backend}: {len(rows)} launches, growth after launch "
          f"{settled['launch']}: {grew}; {'PASS' if ok else 'FAIL'}")
    if args.out:
        Path(args.out).write_text(json.dumps({"backend": args.backend, "rows": rows,
                                              "growth": grew, "pass": ok}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
