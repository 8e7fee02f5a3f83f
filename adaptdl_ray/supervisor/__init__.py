"""One supervisor of a running elastic job, for every front-end that runs one.

:class:`Supervisor` (:mod:`.supervisor`) starts a job's replicas, resizes it keeping the
replicas that stay, moves it off draining nodes, continues it after lost nodes, checkpoints
it in place and stops it; what its launches and runs end in are types
(:mod:`.outcomes`). A submitted job's driver (:mod:`adaptdl_ray.cluster.elastic_job`) is a
thin front-end of it.

What a Tune trial (:mod:`adaptdl_ray.tune.trainable`) does alike is written here once and
shared with it: the schedule and the saves of in-place checkpoints (:mod:`.in_place`), the
verdict on a replica's failure over a lost node, the step toward a new size and the
hand-over of the replicas that stay (:mod:`.recovery`), and where stopped replicas ended
(:class:`~.outcomes.Boundary`).
"""

from adaptdl_ray.supervisor.outcomes import (Boundary, Change, Ending, LaunchEnd, Phase,
                                             RunResult)
from adaptdl_ray.supervisor.supervisor import (DEFAULT_CHECKPOINT_INTERVAL_S,
                                               DEFAULT_STOP_TIMEOUT_S, JobRunner,
                                               StatusUpdate, Supervisor)

__all__ = ["Supervisor", "JobRunner", "StatusUpdate", "Ending", "Change", "LaunchEnd",
           "Phase", "RunResult", "Boundary", "DEFAULT_STOP_TIMEOUT_S",
           "DEFAULT_CHECKPOINT_INTERVAL_S"]
