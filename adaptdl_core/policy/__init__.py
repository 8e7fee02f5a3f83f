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
from .cluster_size import ClusterSizeDecision, ClusterSizeRule
from .resize import MIN_COST_MULTIPLES, ResizeVerdict, resize_verdict
from .speedup import GoodputOptimizer, LinearSpeedup, SpeedupFunction

__all__ = [
    "DEFAULT_RESTART_COST_S",
    "AllocationResult",
    "ClusterSizeDecision",
    "ClusterSizeRule",
    "GoodputOptimizer",
    "JobInfo",
    "LinearSpeedup",
    "MIN_COST_MULTIPLES",
    "NodeInfo",
    "PolluxPolicy",
    "ResizeVerdict",
    "SpeedupFunction",
    "check_allocations",
    "effective_speedups",
    "optimize",
    "power_mean",
    "resize_verdict",
    "restart_penalty",
]
