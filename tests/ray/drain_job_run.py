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
from typing import Any, Mapping

from adaptdl_core.decision import Decision, JobProgress, JobSpec
from tests.core.harness import read_events
from tests.ray.cluster_resize_job import JOB_SCRIPT


class KeepSizer:
    """Starts the job with 2 replicas and never resizes it (only a drain moves it)."""

    def __init__(self) -> None:
        self.current = 2

    def start(self) -> int:
        return 2

    def observe(self, replicas: int, *, hints: Mapping[str, Any] | None = None,
                progress: JobProgress | None = None) -> None:
        self.current = replicas

    def decision(self) -> Decision:
        return Decision("job", "keep", self.current, (), "fixed")

    def begin_resize(self, decision: Decision) -> None:
        raise AssertionError("nothing but a drain may move this job")

    def end(self) -> None:
        pass


def batches(record: Path, restart: int) -> int:
    return sum(1 for e in read_events(record) if e["event"] == "batch" and e["restart"] == restart)


def main(storage: str, record_dir: str, deadline_s: float = 60.0) -> int:
    import ray
    from ray.cluster_utils import Cluster

    from adaptdl_ray.cluster.elastic_job import ElasticJob
    from adaptdl_ray.cluster.job_files import JobFiles

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    record = Path(record_dir)
    # The head holds one replica; the worker two, so the 2-replica job starts there.
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        worker = cluster.add_node(num_cpus=2)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=True)
        job = ElasticJob(JobFiles("drained", storage), JOB_SCRIPT,
                         ["--record", record_dir, "--epochs", "2", "--size", "96",
                          "--sleep", "0.2"],
                         JobSpec({"CPU": 1}, 1, 2), sizer=KeepSizer(), status_every_s=0.5)
        status: list[int] = []
        runner = threading.Thread(target=lambda: status.append(job.run()), daemon=True)
        runner.start()
        until = time.time() + 120
        while batches(record, 0) < 4 and time.time() < until and runner.is_alive():
            time.sleep(0.1)
        asked_at = time.time()
        drain = subprocess.run(
            [sys.executable, "-m", "ray.scripts.scripts", "drain-node", "--address",
             cluster.address, "--node-id", worker.node_id, "--reason",
             "DRAIN_NODE_REASON_PREEMPTION", "--reason-message", "spot notice",
             "--deadline-remaining-seconds", str(int(deadline_s))],
            capture_output=True, text=True, timeout=60)
        drained_at = time.time()  # (the drain is in effect once `ray drain-node` returns)
        first_step = None
        while runner.is_alive() and time.time() < drained_at + 180:
            if first_step is None and batches(record, 1):
                first_step = time.time()
            time.sleep(0.1)
        runner.join(timeout=60)
        events = read_events(record)
        print(json.dumps({
            "status": status[0] if status else None, "drain_rc": drain.returncode,
            "drain_err": drain.stderr[-2000:],
            "sizes": {str(e["restart"]): e["replicas"] for e in events
                      if e["event"] == "start"},
            "batches_before_drain": batches(record, 0),
            "drain_to_first_step_s": None if first_step is None else first_step - drained_at,
            "drain_command_s": drained_at - asked_at,
            "deadline_s": deadline_s}), flush=True)
        return 0
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], *(float(a) for a in sys.argv[3:4])))
