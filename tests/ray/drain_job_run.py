"""A submitted job's driver on a two-node cluster of its own whose worker node is drained
(a spot node's preemption notice) while the job trains there: the job must checkpoint and
move to the other node before the deadline, every sample trained exactly once.

Run as ``python -m tests.ray.drain_job_run STORAGE RECORD_DIR [DEADLINE_S]`` (its own
process: a test process already connected to the session's Ray cannot join another
cluster). Prints one JSON line: the job's exit status, the replicas of each launch, the
seconds from the drain (``ray drain-node`` returned) to the first step on the other node,
and the seconds the ``ray drain-node`` command itself took.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from adaptdl_core.decision import Decision, JobProgress, JobSpec
from tests.core.harness import read_events
from tests.ray.cluster_resize_job import JOB_SCRIPT
from tests.ray.two_nodes import two_nodes


class KeepSizer:
    """Starts the job with 2 replicas and never resizes it (only a drain moves it)."""

    def __init__(self) -> None:
        self.current = 2

    def start(self) -> int:
        return 2

    def observe(self, replicas: int, *, nodes: Any = None,
                hints: Mapping[str, Any] | None = None,
                progress: JobProgress | None = None) -> None:
        self.current = replicas

    def decision(self) -> Decision:
        return Decision("job", "keep", self.current, (), "fixed")

    def begin_resize(self, decision: Decision) -> None:
        raise AssertionError("nothing but a drain may move this job")

    def end(self, outcome: str = "ended") -> None:
        pass


def batches(record: Path, restart: int) -> int:
    return sum(1 for e in read_events(record) if e["event"] == "batch" and e["restart"] == restart)


def run_on_two_nodes(storage: str, record_dir: str, name: str, job_args: list[str],
                     batches_before: int, act: Callable[[Any, Any], dict], **job_options
                     ) -> dict:
    """Run the test job (2 replicas, :class:`KeepSizer`) as an ElasticJob on a cluster of a
    head of 1 CPU and a worker of 2 (so the job starts on the worker); once launch 0 has
    trained ``batches_before`` batches, call ``act(cluster, worker)`` (it returns what it
    saw, with ``"at"``: when its action took effect) and follow the job to its end. The
    job's batches sleep until launch 1 has trained one, then go as fast as they can.

    Returns:
        ``act``'s dict (without ``at``) plus the job's exit ``status``, the replicas of each
        launch (``sizes``), ``batches_before`` (launch 0's when ``act`` was called),
        ``to_first_step_s`` (from ``at`` to launch 1's first batch) and the job's final
        ``status.json`` (``job_status``)."""
    from adaptdl_ray.cluster.elastic_job import ElasticJob
    from adaptdl_ray.cluster.job_files import JobFiles

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    record = Path(record_dir)
    with two_nodes(1, 2, log_to_driver=True) as (cluster, worker):
        files = JobFiles(name, storage)
        fast = record.parent / f"{record.name}-moved"  # (beside the records: not one)
        job = ElasticJob(files, JOB_SCRIPT, ["--record", record_dir, *job_args,
                                             "--slow-until", str(fast)],
                         JobSpec({"CPU": 1}, 1, 2), sizer=KeepSizer(), status_every_s=0.5,
                         **job_options)
        status: list[int] = []
        runner = threading.Thread(target=lambda: status.append(job.run()), daemon=True)
        runner.start()
        until = time.time() + 120
        while batches(record, 0) < batches_before and time.time() < until and \
                runner.is_alive():
            time.sleep(0.05)
        before = batches(record, 0)
        seen = act(cluster, worker)
        at = seen.pop("at")
        first_step = None
        while runner.is_alive() and time.time() < at + 240:
            if first_step is None and batches(record, 1):
                first_step = time.time()
                fast.touch()
            time.sleep(0.1)
        runner.join(timeout=60)
        return {**seen, "status": status[0] if status else None,
                "sizes": {str(e["restart"]): e["replicas"] for e in read_events(record)
                          if e["event"] == "start"},
                "batches_before": before,
                "to_first_step_s": None if first_step is None else first_step - at,
                "job_status": files.read_status() or {}}


def main(storage: str, record_dir: str, deadline_s: float = 60.0) -> int:
    def drain(cluster: Any, worker: Any) -> dict:
        asked_at = time.time()
        done = subprocess.run(
            [sys.executable, "-m", "ray.scripts.scripts", "drain-node", "--address",
             cluster.address, "--node-id", worker.node_id, "--reason",
             "DRAIN_NODE_REASON_PREEMPTION", "--reason-message", "spot notice",
             "--deadline-remaining-seconds", str(int(deadline_s))],
            capture_output=True, text=True, timeout=60)
        at = time.time()  # (the drain is in effect once `ray drain-node` returns)
        return {"at": at, "drain_rc": done.returncode, "drain_err": done.stderr[-2000:],
                "drain_command_s": at - asked_at}

    seen = run_on_two_nodes(storage, record_dir, "drained",
                            ["--epochs", "2", "--size", "96", "--sleep", "0.2"], 4, drain)
    seen["drain_to_first_step_s"] = seen.pop("to_first_step_s")
    seen["batches_before_drain"] = seen.pop("batches_before")
    del seen["job_status"]
    print(json.dumps({**seen, "deadline_s": deadline_s}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], *(float(a) for a in sys.argv[3:4])))
