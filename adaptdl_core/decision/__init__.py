"""The decision core: Tune-free scheduling decisions with an injected clock.

Front-ends (the Ray Tune scheduler, the trace-driven simulator, a cluster service) feed
:class:`DecisionCore` plain events (jobs arrive, report hints and progress, run, end;
nodes come and go) and act on its :class:`Decision` per job. See :mod:`.core`.
"""

from adaptdl_core.policy import NodeInfo

from .core import ACTIONS, Action, Decision, DecisionCore, JobProgress, SolveRequest
from .estimate import estimate_remaining_s
from .jobs import (JobSpec, cluster_capacity, exploration_cap, group_hints, job_info,
                   pack_guess, profiled_extent, replicas_fitting, speedup_from_hints)
from .state import CoreState, JobRecord, StateWriter, write_atomic

__all__ = ["ACTIONS", "Action", "CoreState", "Decision", "DecisionCore", "JobProgress", "JobRecord",
           "JobSpec", "NodeInfo", "SolveRequest", "StateWriter", "cluster_capacity",
           "estimate_remaining_s", "exploration_cap", "group_hints", "job_info", "pack_guess",
           "profiled_extent", "replicas_fitting", "speedup_from_hints", "write_atomic"]
