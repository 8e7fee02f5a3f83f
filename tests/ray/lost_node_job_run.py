"""A submitted job's driver on a two-node cluster of its own whose worker node vanishes
without notice while the job trains there: the job must continue on the other node from
its newest in-place checkpoint, repeating only the work since it, and finish.

Run as ``python -m tests.ray.lost_node_job_run STORAGE RECORD_DIR [INTERVAL_S]`` (its own
process: a test process already connected to the session's Ray cannot join another
cluster). Prints one JSON line: the job's exit status, the replicas of each launch, the
batches trained before the loss, the seconds from the node's removal to the first step of
the next launch, and the checkpoint interval.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from tests.ray.drain_job_run import run_on_two_nodes

EPOCHS, SIZE, BATCH, SLEEP_S = 2, 192, 8, 0.2
# Training before the loss: longer than three checkpoint intervals, so that without
# in-place checkpoints the repeated work would exceed one interval's.
BATCHES_BEFORE_LOSS = 30


def main(storage: str, record_dir: str, interval_s: float = 2.0) -> int:
    def lose(cluster: Any, worker: Any) -> dict:
        cluster.remove_node(worker, allow_graceful=False)
        return {"at": time.time()}

    seen = run_on_two_nodes(storage, record_dir, "lost",
                            ["--epochs", str(EPOCHS), "--size", str(SIZE), "--batch-size",
                             str(BATCH), "--sleep", str(SLEEP_S)],
                            BATCHES_BEFORE_LOSS, lose, checkpoint_interval_s=interval_s)
    final = seen.pop("job_status")
    seen["loss_to_first_step_s"] = seen.pop("to_first_step_s")
    print(json.dumps({
        **seen,
        "checkpoints": final.get("checkpoints"), "checkpoint_s": final.get("checkpoint_s"),
        "nodes_lost": final.get("nodes_lost"), "interval_s": interval_s}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], *(float(a) for a in sys.argv[3:4])))
