"""Pollux allocation policy: speedup functions and the cluster allocator (no torch, no Ray)."""

from .allocator import (
    DEFAULT_RESTART_COST_S,
    AllocationResult,
    JobInfo,
    NodeInfo,
    PolluxPolicy,
    check_allocations,
    effective_speedups,
    optimize,
    power_mean,
    restart_penalty,
)
from .speedup import GoodputOptimizer, LinearSpeedup, SpeedupFunction

__all__ = [
    "DEFAULT_RESTART_COST_S",
    "AllocationResult",
    "GoodputOptimizer",
    "JobInfo",
    "LinearSpeedup",
    "NodeInfo",
    "PolluxPolicy",
    "SpeedupFunction",
    "check_allocations",
    "effective_speedups",
    "optimize",
    "power_mean",
    "restart_penalty",
]
