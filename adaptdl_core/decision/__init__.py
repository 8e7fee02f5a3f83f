"""The decision core: Tune-free scheduling decisions with an injected clock.

Front-ends (the Ray Tune scheduler, the trace-driven simulator, a cluster service) feed
:class:`DecisionCore` plain events (jobs arrive, report hints and progress, run, end;
nodes come and go) and act on its :class:`Decision` per job (see :mod:`.core`), driving
it through a :class:`CoreDriver` (when and where it solves, its state on disk; see
:mod:`.driver`).
"""

from adaptdl_core.policy import NodeInfo

from .core import ACTIONS, Action, Decision, DecisionCore, JobProgress
from .driver import CoreDriver
from .estimate import estimate_remaining_s, progress_from_status
from .jobs import (EXPLORATION_FACTOR, JobSpec, cluster_capacity, exploration_cap,
                   group_hints, job_info, pack_guess, profiled_extent, replicas_fitting,
                   speedup_from_hints)
from .shared import SharedSolve, capacity_left
from .solve_request import SolveEntry, SolveRequest
from .state import CoreState, JobRecord, StateWriter, write_atomic

__all__ = ["ACTIONS", "EXPLORATION_FACTOR", "Action", "CoreDriver", "CoreState", "Decision",
           "DecisionCore", "JobProgress", "JobRecord", "JobSpec", "NodeInfo", "SharedSolve",
           "SolveEntry", "SolveRequest", "StateWriter", "capacity_left", "cluster_capacity", "estimate_remaining_s",
           "exploration_cap", "group_hints", "job_info", "pack_guess", "profiled_extent",
           "progress_from_status", "replicas_fitting", "speedup_from_hints", "write_atomic"]
