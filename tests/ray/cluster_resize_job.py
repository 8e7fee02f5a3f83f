"""A Ray job's driver that runs tests/core/jobs/elastic_job.py as an ElasticJob whose sizer
follows a script: 1 replica, then 2 (after two status reads at 1), then 1 again (after
two reads at 2), so that a test can check a grow and a shrink on a real cluster.

Run as ``python -m tests.ray.cluster_resize_job STORAGE RECORD_DIR`` (the entrypoint of a
submitted Ray job); exits with the job's status.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, Mapping

from adaptdl_core.decision import Decision, JobProgress, JobSpec

JOB_SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "core",
                          "jobs", "elastic_job.py")
PLAN = (1, 2, 1)
# Long enough for both resizes on a loaded 2-core machine (a grow starts its new replica
# while the job trains, a few seconds).
SIZE, EPOCHS = 64, 16


class ScriptedSizer:
    """Sizes the job by :data:`PLAN`; records every resize it saw begun."""

    def __init__(self) -> None:
        self.step = 0
        self.reads = 0
        self.current = PLAN[0]
        self.begun: list[int] = []

    def start(self) -> int:
        return PLAN[0]

    def observe(self, replicas: int, *, nodes: Any = None,
                hints: Mapping[str, Any] | None = None,
                progress: JobProgress | None = None) -> None:
        if replicas != self.current:
            self.current, self.reads = replicas, 0
        self.reads += 1

    def decision(self) -> Decision:
        if self.reads >= 2 and self.step + 1 < len(PLAN) and self.current == PLAN[self.step]:
            return Decision("job", "resize", PLAN[self.step + 1], (), "scripted")
        return Decision("job", "keep", self.current, (), "scripted")

    def begin_resize(self, decision: Decision) -> None:
        self.step += 1
        self.begun.append(decision.replicas)

    def end(self, outcome: str = "ended") -> None:
        pass


def main() -> int:
    import ray

    from adaptdl_ray.cluster.elastic_job import ElasticJob
    from adaptdl_ray.cluster.job_files import JobFiles

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    storage, record = sys.argv[1], sys.argv[2]
    ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=True)  # the job's cluster
    sizer = ScriptedSizer()
    job = ElasticJob(JobFiles("resized", storage), JOB_SCRIPT,
                     ["--record", record, "--epochs", str(EPOCHS), "--size", str(SIZE),
                      "--sleep", "0.1"],
                     JobSpec({"CPU": 1}, 1, 2), sizer=sizer, status_every_s=0.5)
    status = job.run()
    print(f"resizes begun: {sizer.begun}", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
