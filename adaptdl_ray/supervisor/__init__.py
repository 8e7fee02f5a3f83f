"""One supervisor of a running elastic job, for every front-end that runs one.

:class:`Supervisor` (:mod:`.supervisor`) starts a job's replicas, resizes it keeping the
replicas that stay, moves it off draining nodes, continues it after lost nodes, checkpoints
it in place and stops it; what its launches and runs end in are types
(:mod:`.outcomes`). A submitted job's driver (:mod:`adaptdl_ray.cluster.elastic_job`) is a
thin front-end of it.
"""

from adaptdl_ray.supervisor.outcomes import Change, Ending, LaunchEnd, Phase, RunResult
from adaptdl_ray.supervisor.supervisor import (DEFAULT_CHECKPOINT_INTERVAL_S,
                                               DEFAULT_STOP_TIMEOUT_S, JobRunner,
                                               StatusUpdate, Supervisor)

__all__ = ["Supervisor", "JobRunner", "StatusUpdate", "Ending", "Change", "LaunchEnd",
           "Phase", "RunResult", "DEFAULT_STOP_TIMEOUT_S", "DEFAULT_CHECKPOINT_INTERVAL_S"]
