"""Allocation policies: Pollux, speedup functions and the cluster allocator, and AdaptDL's
remaining-work-aware policy (no torch, no Ray)."""

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
from .remaining import (POLICY_NAMES, RemainingWorkPolicy, admission_order, policy_by_name,
                        remaining_weights)
from .resize import (MIN_COST_MULTIPLES, ResizeVerdict, amortised_resize_verdict,
                     move_verdict, resize_verdict)
from .typed import (TypedAllocator, common_type, knows_types, mixed_types, node_types,
                    nodes_off_type, placement_type,
                    type_unaware_note, typed_round_applies, warn_if_type_unaware)
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
    "POLICY_NAMES",
    "PolluxPolicy",
    "RemainingWorkPolicy",
    "ResizeVerdict",
    "SpeedupFunction",
    "TypedAllocator",
    "admission_order",
    "check_allocations",
    "effective_speedups",
    "mixed_types",
    "move_verdict",
    "node_types",
    "knows_types",
    "optimize",
    "placement_type",
    "common_type",
    "nodes_off_type",
    "policy_by_name",
    "power_mean",
    "remaining_weights",
    "resize_verdict",
    "amortised_resize_verdict",
    "restart_penalty",
    "type_unaware_note",
    "typed_round_applies",
    "warn_if_type_unaware",
]
